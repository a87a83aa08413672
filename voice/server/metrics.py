"""Prometheus metrics of this process (prometheus-client, default registry), served at /metrics."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import Counter, Gauge, Histogram

from pipeline.records import STAGES, TurnRecord
from pipeline.scheduling import UrgentFirst

ACTIVE_CALLS = Gauge("hotline_active_calls", "Calls in progress on this worker.")
DRAINING = Gauge("hotline_draining", "1 while this worker drains (admits no new calls).")
ADMITTED = Counter("hotline_calls_admitted_total", "Calls admitted.", ["transport"])
REFUSED = Counter("hotline_calls_refused_total", "Calls refused.", ["transport", "reason"])
TURNS = Counter(
    "hotline_turns_total",
    "Finished turns, by effort and the service tier the provider served.",
    ["effort", "service_tier_served"],
)
INTERRUPTED = Counter("hotline_turns_interrupted_total", "Turns the caller talked over.")
SPECULATIONS = Counter(
    "hotline_speculative_replies_discarded_total",
    "Replies begun at a caller's pause and thrown away when the caller spoke on (LLM requests "
    "paid for, never heard).",
)
DECISIONS = Counter(
    "hotline_turn_decisions_total",
    "How each turn's LLM request went: planned, fallback, hedge, failed (or none: cut off).",
    ["taken"],
)
BUDGET = Counter(
    "hotline_turns_budgeted_total",
    "Turns with a voice-to-voice budget, by whether first audio came within it.",
    ["within"],
)
TURN_LATENCY = Histogram(
    "hotline_turn_latency_seconds",
    "Time from the end of the caller's speech to each stage of the reply.",
    ["part"],
    buckets=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.2, 1.5, 2.0, 3.0, 5.0, 10.0),
)
TOOL_CALLS = Counter(
    "hotline_tool_calls_total", "Tool calls the LLM made, by tool and outcome.", ["tool", "ok"]
)
TOOL_LATENCY = Histogram(
    "hotline_tool_seconds",
    "Time from a tool call's start to its result.",
    ["tool"],
    buckets=(0.05, 0.1, 0.2, 0.4, 0.8, 1.5, 3.0, 5.0, 10.0),
)
STT_WAITING = Gauge(
    "hotline_stt_waiting", "Transcriptions waiting for a free recognizer thread (all models)."
)
TTS_WAITING = Gauge(
    "hotline_tts_waiting", "Sentences waiting for a free synthesis thread (all voices)."
)
TRANSFERS = Counter(
    "hotline_transfers_total", "Calls the agent put through to a person.", ["transport"]
)


def watch_queues(recognizers: Sequence[UrgentFirst], voices: Sequence[UrgentFirst]) -> None:
    """Report the models' waiting lines at each scrape (each line once, however many models
    share it)."""
    stt = list({id(line): line for line in recognizers}.values())
    tts = list({id(line): line for line in voices}.values())
    STT_WAITING.set_function(lambda: sum(line.waiting for line in stt))
    TTS_WAITING.set_function(lambda: sum(line.waiting for line in tts))


def observe_turn(record: TurnRecord) -> None:
    """Count a finished turn and its latency parts."""
    served = record.service_tier_served or "none"
    TURNS.labels(effort=record.effort or "none", service_tier_served=served).inc()
    if record.interrupted:
        INTERRUPTED.inc()
    for part in STAGES:
        ms = record.timings_ms.get(part)
        if ms is not None:
            TURN_LATENCY.labels(part=part).observe(ms / 1e3)
    if record.decision is not None:
        DECISIONS.labels(taken=record.decision.taken).inc()
    first_audio = record.timings_ms.get("first_audio")
    if record.budget_ms and first_audio is not None:
        BUDGET.labels(within=str(first_audio <= record.budget_ms).lower()).inc()
    for call in record.tools:
        name = str(call.get("name"))
        TOOL_CALLS.labels(tool=name, ok=str(bool(call.get("ok"))).lower()).inc()
        took = call.get("ms")
        if isinstance(took, int | float):
            TOOL_LATENCY.labels(tool=name).observe(took / 1e3)

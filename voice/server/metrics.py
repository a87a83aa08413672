"""Prometheus metrics of this process (prometheus-client, default registry), served at /metrics."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from prometheus_client import Counter, Gauge, Histogram

from pipeline.records import STAGES, TurnRecord
from pipeline.scheduling import UrgentFirst
from voice.cluster.webhook_http import OUTCOMES as WEBHOOK_OUTCOMES
from voice.server.end_reasons import CATEGORIES, end_category

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
REPLY_GAPS = Histogram(
    "hotline_reply_gaps_seconds",
    "Replies going silent between two of their sentences (100 ms or more), by what the late "
    "sentence waited on: synthesis (the voice's line under load), text (the LLM or a tool), "
    "loop (ready, queued late).",
    ["waited_on"],
    buckets=(0.1, 0.2, 0.3, 0.5, 0.8, 1.2, 2.0, 5.0),
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
CALLS_ENDED = Counter(
    "hotline_calls_ended_total",
    "Calls ended, by why (voice.server.end_reasons: a fixed set, never the free text).",
    ["reason"],
)
CALL_DURATION = Histogram(
    "hotline_call_duration_seconds",
    "How long calls lasted, from the conversation's start to its end.",
    ["transport"],
    buckets=(1, 5, 10, 20, 30, 60, 90, 120, 180, 300, 450, 600, 900, 1200, 1800, 2700, 3600),
)
WEBHOOKS = Counter(
    "hotline_webhook_deliveries_total",
    "Post-call webhook attempts by what they came to: delivered, retried, rejected (a status "
    "not retried), given_up (retried until the deadline), superseded (another worker took it "
    "again meanwhile), dropped (never queued).",
    ["outcome"],
)
RECORDINGS = Counter(
    "hotline_recordings_total",
    "Call recordings closed: written, empty (no audio came), failed.",
    ["outcome"],
)
RECORDING_UPLOADS = Counter(
    "hotline_recording_uploads_total",
    "Recordings copied to the bucket (uploaded) or not (failed, after retries).",
    ["outcome"],
)
ANSWERING = Counter(
    "hotline_answering_total",
    "Placed calls with machine detection, by who answered (human, machine, unknown) and the "
    "rule that decided it (shape, beep, transcript, timeout).",
    ["result", "basis"],
)
for _reason in CATEGORIES:  # every series from the start, so that rate() sees the first one
    CALLS_ENDED.labels(reason=_reason)
for _outcome in (*WEBHOOK_OUTCOMES, "dropped"):
    WEBHOOKS.labels(outcome=_outcome)
for _outcome in ("written", "empty", "failed"):
    RECORDINGS.labels(outcome=_outcome)
for _outcome in ("uploaded", "failed"):
    RECORDING_UPLOADS.labels(outcome=_outcome)


def observe_call_end(transport: str, end_reason: str | None, duration_s: float) -> None:
    """Count an ended call by its end category and observe how long it lasted."""
    CALLS_ENDED.labels(reason=end_category(end_reason)).inc()
    CALL_DURATION.labels(transport=transport).observe(max(0.0, duration_s))


def observe_answering(answered_by: Mapping[str, object] | None) -> None:
    """Count who answered a placed call with machine detection (None: it had none)."""
    if answered_by is not None:
        ANSWERING.labels(result=str(answered_by["result"]), basis=str(answered_by["basis"])).inc()


def count_webhook(outcome: str) -> None:
    """Count one post-call webhook attempt's outcome (`WebhookOutbox`'s `on_outcome`)."""
    WEBHOOKS.labels(outcome=outcome).inc()


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
    for gap in record.reply_gaps:
        gap_ms = gap.get("ms")
        if isinstance(gap_ms, int | float):
            REPLY_GAPS.labels(waited_on=str(gap.get("waited_on"))).observe(gap_ms / 1e3)
    for call in record.tools:
        name = str(call.get("name"))
        TOOL_CALLS.labels(tool=name, ok=str(bool(call.get("ok"))).lower()).inc()
        took = call.get("ms")
        if isinstance(took, int | float):
            TOOL_LATENCY.labels(tool=name).observe(took / 1e3)

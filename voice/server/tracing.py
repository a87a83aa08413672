"""OpenTelemetry spans for finished turns and ended calls, built after the fact from their
records (`TurnRecord`, `CallRecord`).

Nothing in the pipeline is instrumented: each turn already leaves one record behind, with the
wall clock at the end of the caller's speech (`started_at`, the zero of the turn) and each
stage's moment in milliseconds since that zero (`timings_ms`). `TurnTracer.record` turns that
into spans with explicit start and end times and hands them to an OTLP/HTTP exporter in a
background thread (BatchSpanProcessor), so a turn costs a few span objects on the event loop and
no I/O. Off (`otlp_endpoint` None, the default) the tracer builds nothing at all.

One trace per call, one `turn` span per turn (a root span of the call's trace)::

    turn         zero -> the last stage marked (first audio, normally): the voice-to-voice
                 latency; one event per stage marked (first_sentence included), at its moment
      endpoint   zero -> endpoint                 VAD + end-of-turn decision
      stt        endpoint -> stt                  transcript ready
      llm        stt -> llm_first_token           request to first visible token
      tts        first_sentence -> tts_first_chunk    the first sentence synthesized
      first_audio  tts_first_chunk -> first_audio     queued and sent to the caller
      tool <name>  one per tool call: start of the tool window -> + its `ms` (see below)

A span whose end stage is missing is left out. A span whose start stage is missing starts at
the latest stage marked before it (else the zero); a start after its end (a speculative reply
can have its first token before the transcript) is moved back to the end.

The record keeps how long each tool call took, not when it began, and keeps the calls of all
rounds in one list. Tool spans therefore start together when the turn could first have asked
for them (the `stt` mark, else the latest mark before it, else the zero) and last their own `ms`:
exact for the calls of a first round, early for those of later rounds. The `turn` span carries
`hotline.tools_ms`, the time the turn actually waited on tools.

Trace ids are derived from the call id (the first 16 bytes of its SHA-256), not kept in a
per-call table: a table would have to guess when to forget; any worker (or a restarted one)
that records a turn of the call puts it in the same trace; and whoever holds a call id (the
calls API, logs, Redis records) can open its trace without a lookup. A call's turns are
therefore sibling root spans of one trace, which Jaeger and Tempo show as one trace, a span a
turn, as LiveKit and Pipecat users expect.

When the call ends, `record_call` adds one more root span to the trace::

    call         admitted -> ended: transport, agent, why it ended, how many turns were
                 recorded, whether the caller wanted a person, where it was put through

so a call that ended before any turn was recorded (the caller hung up during the greeting)
still leaves a trace. Turns are not its children: they are exported as they finish, before
the call span exists, and a worker that dies mid-call would leave them waiting on a parent
that never comes. A turn cut short by the hang-up is recorded by the conversation (what was
heard, `interrupted`) before the call ends, and traced like any other.

Texts stay out of spans unless `include_text` (the caller's words and the tool arguments can be
personal data); the length of the caller's text is always there.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.trace import Span, Status, StatusCode
from opentelemetry.util.types import AttributeValue
from pydantic import BaseModel, Field

from pipeline.records import STAGES, TurnRecord
from voice.server.end_reasons import end_category

if TYPE_CHECKING:  # the spans only read the record; call_records imports the pipeline
    from voice.server.call_records import CallRecord

log = logging.getLogger(__name__)

TRACES_PATH = "/v1/traces"

# Child spans of a turn: name, the stage it starts at, the stage it ends at.
SPANS: tuple[tuple[str, str | None, str], ...] = (
    ("endpoint", None, "endpoint"),
    ("stt", "endpoint", "stt"),
    ("llm", "stt", "llm_first_token"),
    ("tts", "first_sentence", "tts_first_chunk"),
    ("first_audio", "tts_first_chunk", "first_audio"),
)


class TracingSettings(BaseModel):
    """Where per-turn spans go (OTLP over HTTP, protobuf); off by default."""

    otlp_endpoint: str | None = Field(
        default=None,
        description="The collector's OTLP/HTTP URL: its base (http://localhost:4318, "
        f"{TRACES_PATH} is added) or the full traces URL. None: no tracing, no cost.",
    )
    service_name: str = Field(default="hotline", description="service.name of the spans.")
    include_text: bool = Field(
        default=False,
        description="Put what the caller said, the reply heard and tool arguments in spans.",
    )
    headers: dict[str, str] = Field(
        default_factory=dict,
        repr=False,  # often a credential: kept out of every repr and log line
        description='Sent with each export, e.g. {"Authorization": "Bearer …"}.',
    )
    export_timeout_s: float = Field(
        default=5.0, gt=0, description="Longest one export (and `shutdown`'s flush) may take."
    )


def trace_id_of(call_id: str) -> int:
    """The trace id of a call: the first 16 bytes of the SHA-256 of its id (never 0)."""
    value = int.from_bytes(hashlib.sha256(call_id.encode()).digest()[:16], "big")
    return value or 1


class _CallTraceIds(IdGenerator):
    """Random span ids; the trace id of the call whose turn is being started (`of_call`)."""

    def __init__(self) -> None:
        self._random = RandomIdGenerator()
        self._local = threading.local()

    def of_call(self, call_id: str | None) -> None:
        self._local.trace_id = trace_id_of(call_id) if call_id is not None else None

    def generate_span_id(self) -> int:
        return self._random.generate_span_id()

    def generate_trace_id(self) -> int:
        trace_id: int | None = getattr(self._local, "trace_id", None)
        return trace_id if trace_id is not None else self._random.generate_trace_id()


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL of a collector given by its base URL or its traces URL."""
    stripped = endpoint.rstrip("/")
    return stripped if stripped.endswith(TRACES_PATH) else stripped + TRACES_PATH


def _shown(url: str) -> str:
    """`url` fit for a log line: no user info, query or fragment."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


class TurnTracer:
    """Spans of finished turns, one trace per call (module docstring: layout and mapping).

    `exporter` None: OTLP/HTTP to `settings.otlp_endpoint` through a BatchSpanProcessor (export
    in a background thread), or nothing at all when that is None. An exporter passed in (tests:
    `InMemorySpanExporter`) is used as is, through a SimpleSpanProcessor. The tracer keeps its
    own TracerProvider and never sets the global one.
    """

    def __init__(self, settings: TracingSettings, exporter: SpanExporter | None = None) -> None:
        self.settings = settings
        self.provider: TracerProvider | None = None
        if exporter is None and settings.otlp_endpoint is None:
            return
        processor: SpanProcessor
        if exporter is None:
            assert settings.otlp_endpoint is not None
            url = traces_url(settings.otlp_endpoint)
            exporter = OTLPSpanExporter(
                endpoint=url, headers=dict(settings.headers), timeout=settings.export_timeout_s
            )
            processor = BatchSpanProcessor(
                exporter, export_timeout_millis=settings.export_timeout_s * 1e3
            )
            log.info("tracing: turn spans go to %s", _shown(url))
        else:
            processor = SimpleSpanProcessor(exporter)
        self._ids = _CallTraceIds()
        self.provider = TracerProvider(
            resource=Resource.create({SERVICE_NAME: settings.service_name}),
            id_generator=self._ids,
        )
        self.provider.add_span_processor(processor)
        self._tracer = self.provider.get_tracer("hotline.turns")

    @property
    def enabled(self) -> bool:
        return self.provider is not None

    def record(self, call_id: str, record: TurnRecord, agent: str | None = None) -> None:
        """Spans of one finished turn of call `call_id`; never raises (a failure is logged)."""
        if self.provider is None:
            return
        try:
            self._record(call_id, record, agent)
        except Exception:
            log.warning(
                "tracing: no spans for call %s turn %s", call_id, record.turn, exc_info=True
            )

    def record_call(self, call: CallRecord) -> None:
        """The `call` span of a call that has ended (module docstring); never raises."""
        if self.provider is None or call.ended_at is None:
            return
        try:
            self._ids.of_call(call.call_id)  # this thread's next trace id: the call's
            try:
                span = self._tracer.start_span(
                    "call",
                    context=Context(),  # a root span, like the turns
                    start_time=round(call.started_at * 1e9),
                    attributes=_call_attributes(call),
                )
            finally:
                self._ids.of_call(None)
            span.end(end_time=round(max(call.ended_at, call.started_at) * 1e9))
        except Exception:
            log.warning("tracing: no call span for call %s", call.call_id, exc_info=True)

    def force_flush(self, timeout_s: float = 5.0) -> bool:
        """Export every span ended so far; False when that did not finish in time."""
        if self.provider is None:
            return True
        return self.provider.force_flush(timeout_millis=int(timeout_s * 1e3))

    def shutdown(self) -> None:
        """Flush what is pending and stop (blocks up to `export_timeout_s`: call it from a
        thread when the event loop must go on)."""
        if self.provider is None:
            return
        try:
            self.provider.shutdown()
        except Exception:
            log.warning("tracing: shutdown failed", exc_info=True)
        finally:  # the provider's exit hook (kept for a process that never calls this)
            atexit.unregister(self.provider.shutdown)

    def _record(self, call_id: str, record: TurnRecord, agent: str | None) -> None:
        zero = round(record.started_at * 1e9)
        marks = record.timings_ms

        def at(ms: float) -> int:
            return zero + round(ms * 1e6)

        tool_start = marks.get("stt", _start_of("stt", marks))
        tool_ends = [tool_start + _ms(row.get("ms")) for row in record.tools]
        end_ms = max([*marks.values(), *tool_ends, 0.0])

        self._ids.of_call(call_id)  # this thread's next trace id: the call's
        try:
            turn = self._tracer.start_span(
                "turn",
                context=Context(),  # a root span, whatever span is current
                start_time=zero,
                attributes=_turn_attributes(call_id, record, agent, self.settings),
            )
        finally:
            self._ids.of_call(None)
        if record.decision is not None and record.decision.taken == "failed":
            turn.set_status(Status(StatusCode.ERROR, "no LLM request could answer"))
        for stage in STAGES:
            if stage in marks:
                turn.add_event(stage, {"hotline.ms": marks[stage]}, timestamp=at(marks[stage]))
        parent = trace.set_span_in_context(turn)
        for name, start_stage, end_stage in SPANS:
            if end_stage not in marks:
                continue
            end = marks[end_stage]
            start = marks[start_stage] if start_stage in marks else _start_of(end_stage, marks)
            span = self._tracer.start_span(
                name,
                context=parent,
                start_time=at(min(start, end)),
                attributes=_stage_attributes(name, record),
            )
            span.end(end_time=at(end))
        for row, tool_end in zip(record.tools, tool_ends, strict=True):
            self._tool_span(row, parent, at(tool_start), at(tool_end))
        turn.end(end_time=at(end_ms))

    def _tool_span(self, row: Mapping[str, object], parent: Context, start: int, end: int) -> None:
        name = str(row.get("name"))
        attributes: dict[str, AttributeValue] = {
            "hotline.tool.name": name,
            "hotline.tool.ok": bool(row.get("ok")),
        }
        if isinstance(row.get("ms"), int | float):
            attributes["hotline.tool.ms"] = float(_ms(row.get("ms")))
        if row.get("action"):
            attributes["hotline.tool.action"] = str(row.get("action"))
        if self.settings.include_text:
            for key in ("arguments", "output"):
                if row.get(key) is not None:
                    attributes[f"hotline.tool.{key}"] = str(row.get(key))
        span: Span = self._tracer.start_span(
            f"tool {name}", context=parent, start_time=start, attributes=attributes
        )
        if not row.get("ok"):
            span.set_status(Status(StatusCode.ERROR))
        span.end(end_time=end)


def _ms(value: object) -> float:
    return float(value) if isinstance(value, int | float) and value > 0 else 0.0


def _start_of(stage: str, marks: Mapping[str, float]) -> float:
    """The latest moment marked before `stage` in pipeline order (0: the zero)."""
    earlier: Sequence[str] = STAGES[: STAGES.index(stage)]
    return next((marks[s] for s in reversed(earlier) if s in marks), 0.0)


def _turn_attributes(
    call_id: str, record: TurnRecord, agent: str | None, settings: TracingSettings
) -> dict[str, AttributeValue]:
    first_audio = record.timings_ms.get("first_audio")
    within = (
        first_audio <= record.budget_ms if record.budget_ms and first_audio is not None else None
    )
    decision = record.decision
    values: dict[str, AttributeValue | None] = {
        "hotline.call_id": call_id,
        "hotline.turn": record.turn,
        "hotline.agent": agent,
        "hotline.effort": record.effort,
        "hotline.service_tier.requested": record.service_tier_requested,
        "hotline.service_tier.served": record.service_tier_served,
        "hotline.budget_ms": record.budget_ms,
        "hotline.within_budget": within,
        "hotline.speculative": record.speculative,
        "hotline.speculations_discarded": record.speculations_discarded,
        "hotline.turn_score": record.turn_score,
        "hotline.turn_delay_ms": record.turn_delay_ms,
        "hotline.interrupted": record.interrupted,
        "hotline.caller_text.length": len(record.caller_text),
        "hotline.reason": record.reason or None,
        "hotline.experiment": record.experiment,
        "hotline.arm": record.arm,
        "hotline.tools": len(record.tools) or None,
        "hotline.tools_ms": record.tools_ms,
        "hotline.reply.gaps": len(record.reply_gaps) or None,  # the record says how long, why
        "hotline.decision.taken": decision.taken if decision else None,
        "hotline.decision.tier": decision.tier if decision else None,
        "hotline.decision.planned_tier": decision.planned_tier if decision else None,
        "hotline.decision.planned_effort": decision.planned_effort if decision else None,
        "hotline.decision.predicted_first_audio_ms": (
            decision.predicted_first_audio_ms if decision else None
        ),
    }
    if settings.include_text:
        values["hotline.caller_text"] = record.caller_text
        values["hotline.reply_text"] = record.reply_text
    return {key: value for key, value in values.items() if value is not None}


def _call_attributes(call: CallRecord) -> dict[str, AttributeValue]:
    transfer, answered = call.transfer or {}, call.answered_by
    values: dict[str, AttributeValue | None] = {
        "hotline.call_id": call.call_id,
        "hotline.transport": call.transport,
        "hotline.agent": call.agent,
        "hotline.end_reason": call.end_reason,
        "hotline.end_category": end_category(call.end_reason),  # the metrics' label
        "hotline.turns": len(call.records),
        "hotline.wants_human": call.wants_human,
        "hotline.transfer.to": transfer.get("to"),
        "hotline.transfer.outcome": transfer.get("outcome"),
        "hotline.experiment": call.experiment,
        "hotline.arm": call.arm,
        "hotline.answered_by": str(answered["result"]) if answered else None,
        "hotline.answered_by.basis": str(answered["basis"]) if answered else None,
    }
    return {key: value for key, value in values.items() if value is not None}


def _stage_attributes(name: str, record: TurnRecord) -> dict[str, AttributeValue]:
    values: dict[str, AttributeValue | None] = {}
    if name == "stt":
        values["hotline.stt.inference_ms"] = record.stt_inference_ms
        values["hotline.stt.earlier_s"] = record.stt_earlier_s or None
        values["hotline.stt.early_skipped"] = record.stt_early_skipped or None
    elif name == "llm":
        values = {
            "hotline.llm.ttft_ms": record.llm_ttft_ms,
            "hotline.llm.effort": record.effort,
            "hotline.llm.service_tier.served": record.service_tier_served,
            "hotline.llm.reasoning_tokens": record.reasoning_tokens,
            "hotline.llm.output_tokens": record.output_tokens,
        }
    return {key: value for key, value in values.items() if value is not None}

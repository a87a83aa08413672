"""Per-turn spans (voice/server/tracing.py): layout and times from a turn record, one trace per
call, texts only when asked, nothing at all when off, and a real OTLP/HTTP export to a local
receiver."""

from __future__ import annotations

import gzip
import socket
import threading
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import pytest
import uvicorn
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

import voice.server.tracing as tracing
from pipeline.records import TurnRecord
from voice.server.call_records import CallRecord
from voice.server.tracing import TracingSettings, TurnTracer, trace_id_of, traces_url

STARTED_AT = 1_700_000_000.25
ALL_STAGES = {
    "endpoint": 180.0,
    "stt": 260.5,
    "llm_first_token": 410.0,
    "first_sentence": 520.0,
    "tts_first_chunk": 600.0,
    "first_audio": 640.0,
}


def turn_record(turn: int = 1, **changes: object) -> TurnRecord:
    values: dict[str, object] = {
        "turn": turn,
        "caller_text": "my card number is 4111",
        "reply_text": "Thanks, one moment.",
        "generated_text": "Thanks, one moment.",
        "interrupted": False,
        "effort": "low",
        "service_tier_requested": "priority",
        "service_tier_served": "default",
        "reason": "short question",
        "timings_ms": dict(ALL_STAGES),
        "stt_inference_ms": 70.0,
        "llm_ttft_ms": 140.0,
        "started_at": STARTED_AT,
        "budget_ms": 700.0,
        **changes,
    }
    return TurnRecord(**values)  # type: ignore[arg-type]


@pytest.fixture
def exported() -> InMemorySpanExporter:
    return InMemorySpanExporter()


def traced(
    exporter: SpanExporter, *records: TurnRecord, call_id: str = "call-1", **settings: object
) -> None:
    tracer = TurnTracer(TracingSettings(**settings), exporter=exporter)  # type: ignore[arg-type]
    for record in records:
        tracer.record(call_id, record, agent="front-desk")
    tracer.shutdown()


def by_name(spans: Sequence[ReadableSpan]) -> dict[str, ReadableSpan]:
    named = {span.name: span for span in spans}
    assert len(named) == len(spans), [span.name for span in spans]
    return named


def ns(ms: float) -> int:
    """A moment of the turn as span time: the zero in ns since the epoch, plus `ms`."""
    return round(STARTED_AT * 1e9) + round(ms * 1e6)


def test_a_turn_with_every_stage_has_a_turn_span_and_one_child_per_stage(
    exported: InMemorySpanExporter,
) -> None:
    traced(exported, turn_record())
    spans = by_name(exported.get_finished_spans())
    assert set(spans) == {"turn", "endpoint", "stt", "llm", "tts", "first_audio"}

    turn = spans["turn"]
    assert turn.parent is None
    assert (turn.start_time, turn.end_time) == (ns(0), ns(640.0))
    expected = {
        "endpoint": (0.0, 180.0),
        "stt": (180.0, 260.5),
        "llm": (260.5, 410.0),
        "tts": (520.0, 600.0),
        "first_audio": (600.0, 640.0),
    }
    assert turn.context is not None
    for name, (start, end) in expected.items():
        span = spans[name]
        assert (span.start_time, span.end_time) == (ns(start), ns(end)), name
        assert span.parent is not None and span.parent.span_id == turn.context.span_id
        assert span.context is not None and span.context.trace_id == turn.context.trace_id

    attributes = dict(turn.attributes or {})
    assert attributes["hotline.call_id"] == "call-1"
    assert attributes["hotline.turn"] == 1
    assert attributes["hotline.agent"] == "front-desk"
    assert attributes["hotline.effort"] == "low"
    assert attributes["hotline.service_tier.requested"] == "priority"
    assert attributes["hotline.service_tier.served"] == "default"
    assert attributes["hotline.budget_ms"] == 700.0
    assert attributes["hotline.within_budget"] is True
    assert attributes["hotline.speculative"] is False
    assert attributes["hotline.interrupted"] is False
    assert attributes["hotline.caller_text.length"] == len("my card number is 4111")
    assert dict(spans["stt"].attributes or {})["hotline.stt.inference_ms"] == 70.0
    assert dict(spans["llm"].attributes or {})["hotline.llm.ttft_ms"] == 140.0
    # Each stage, first_sentence included, is an event of the turn at its moment.
    assert [(event.name, event.timestamp) for event in turn.events] == [
        (stage, ns(ms)) for stage, ms in ALL_STAGES.items()
    ]
    resource = dict(turn.resource.attributes)
    assert resource["service.name"] == "hotline"


def test_missing_stages_are_skipped_and_the_next_starts_at_the_last_mark(
    exported: InMemorySpanExporter,
) -> None:
    # Cut off after the first token: no sentence, no audio; no endpoint mark either.
    marks = {"stt": 300.0, "llm_first_token": 450.0}
    traced(exported, turn_record(timings_ms=marks, interrupted=True, budget_ms=None))
    spans = by_name(exported.get_finished_spans())
    assert set(spans) == {"turn", "stt", "llm"}
    assert (spans["stt"].start_time, spans["stt"].end_time) == (ns(0), ns(300.0))
    assert (spans["llm"].start_time, spans["llm"].end_time) == (ns(300.0), ns(450.0))
    assert spans["turn"].end_time == ns(450.0)
    attributes = dict(spans["turn"].attributes or {})
    assert attributes["hotline.interrupted"] is True
    assert "hotline.budget_ms" not in attributes
    assert "hotline.within_budget" not in attributes


def test_a_turn_with_no_marks_is_a_lone_span_of_no_length(
    exported: InMemorySpanExporter,
) -> None:
    traced(exported, turn_record(timings_ms={}))
    (turn,) = exported.get_finished_spans()
    assert turn.name == "turn"
    assert turn.start_time == turn.end_time == ns(0)


def test_turns_of_one_call_share_a_trace_and_calls_do_not(
    exported: InMemorySpanExporter,
) -> None:
    tracer = TurnTracer(TracingSettings(), exporter=exported)
    tracer.record("call-a", turn_record(1))
    tracer.record("call-a", turn_record(2))
    tracer.record("call-b", turn_record(1))
    turns = [span for span in exported.get_finished_spans() if span.name == "turn"]
    traces = [span.context.trace_id for span in turns if span.context is not None]
    assert traces[0] == traces[1] != traces[2]
    assert traces[0] == trace_id_of("call-a")
    assert traces[2] == trace_id_of("call-b")
    # Every span of a turn is in its call's trace; span ids are all different.
    spans = exported.get_finished_spans()
    assert {span.context.trace_id for span in spans if span.context} == set(traces)
    assert len({span.context.span_id for span in spans if span.context}) == len(spans)
    # Turns are roots: no invented parent the collector would wait for.
    assert all(span.parent is None for span in turns)


def call_record(*records: TurnRecord, **changes: object) -> CallRecord:
    values: dict[str, object] = {
        "call_id": "call-1",
        "transport": "twilio",
        "caller": "+15550001111",
        "callee": "+15551230000",
        "started_at": STARTED_AT,
        "ended_at": STARTED_AT + 2.5,
        "wants_human": False,
        "experiment": None,
        "arm": None,
        "end_reason": "stop: the caller hung up",
        "records": records,
        "history": (),
        "agent": "front-desk",
        **changes,
    }
    return CallRecord(**values)  # type: ignore[arg-type]


def test_a_call_that_ended_before_any_turn_still_has_its_call_span(
    exported: InMemorySpanExporter,
) -> None:
    """The caller hung up during the greeting: no turn was recorded, and the trace has the
    call from admission to hang-up, with why it ended."""
    tracer = TurnTracer(TracingSettings(), exporter=exported)
    tracer.record_call(call_record(call_id="call-a"))
    tracer.record_call(call_record(call_id="still-on", ended_at=None))  # not over: no span
    (call,) = exported.get_finished_spans()
    assert call.name == "call" and call.parent is None
    assert call.context is not None and call.context.trace_id == trace_id_of("call-a")
    assert (call.start_time, call.end_time) == (ns(0), round((STARTED_AT + 2.5) * 1e9))
    assert dict(call.attributes or {}) == {
        "hotline.call_id": "call-a",
        "hotline.transport": "twilio",
        "hotline.agent": "front-desk",
        "hotline.end_reason": "stop: the caller hung up",
        "hotline.end_category": "caller_hung_up",  # the label hotline_calls_ended_total uses
        "hotline.turns": 0,
        "hotline.wants_human": False,
    }


def test_the_call_span_joins_its_turns_trace_and_says_where_it_went(
    exported: InMemorySpanExporter,
) -> None:
    tracer = TurnTracer(TracingSettings(), exporter=exported)
    cut_short = turn_record(1, timings_ms={"endpoint": 180.0, "stt": 260.5}, interrupted=True)
    tracer.record("call-1", cut_short)
    transfer = {"to": "+15551230001", "reason": "asked", "summary": "Reason: asked"}
    tracer.record_call(call_record(cut_short, wants_human=True, transfer=transfer))
    spans = exported.get_finished_spans()
    turn = next(span for span in spans if span.name == "turn")
    call = next(span for span in spans if span.name == "call")
    assert turn.context is not None and call.context is not None
    assert call.context.trace_id == turn.context.trace_id == trace_id_of("call-1")
    assert turn.end_time == ns(260.5)  # the half-done turn ends at its last mark
    attributes = dict(call.attributes or {})
    assert attributes["hotline.turns"] == 1
    assert attributes["hotline.wants_human"] is True
    assert attributes["hotline.transfer.to"] == "+15551230001"
    assert not any("Reason" in str(value) for value in attributes.values())  # no summary text


def test_the_trace_id_does_not_leak_into_other_spans_of_the_tracer(
    exported: InMemorySpanExporter,
) -> None:
    tracer = TurnTracer(TracingSettings(), exporter=exported)
    tracer.record("call-a", turn_record())
    assert tracer.provider is not None
    with tracer.provider.get_tracer("other").start_as_current_span("elsewhere") as span:
        assert span.get_span_context().trace_id != trace_id_of("call-a")


def test_tool_calls_are_spans_from_the_transcript_lasting_their_time(
    exported: InMemorySpanExporter,
) -> None:
    tools: list[dict[str, object]] = [
        {
            "name": "lookup_order",
            "arguments": '{"order": "A-77"}',
            "ok": True,
            "ms": 120.0,
            "output": '{"status": "shipped"}',
            "action": None,
        },
        {
            "name": "transfer_to_human",
            "arguments": "{}",
            "ok": False,
            "ms": 30.0,
            "output": "failed",
            "action": "Transfer",
        },
    ]
    traced(exported, turn_record(tools=tools, tools_ms=120.0))
    spans = by_name(exported.get_finished_spans())
    lookup, transfer = spans["tool lookup_order"], spans["tool transfer_to_human"]
    assert (lookup.start_time, lookup.end_time) == (ns(260.5), ns(380.5))
    assert (transfer.start_time, transfer.end_time) == (ns(260.5), ns(290.5))
    turn = spans["turn"]
    assert turn.context is not None
    assert lookup.parent is not None and lookup.parent.span_id == turn.context.span_id
    assert dict(lookup.attributes or {}) == {
        "hotline.tool.name": "lookup_order",
        "hotline.tool.ok": True,
        "hotline.tool.ms": 120.0,
    }
    assert lookup.status.status_code is StatusCode.UNSET
    assert transfer.status.status_code is StatusCode.ERROR
    assert dict(transfer.attributes or {})["hotline.tool.action"] == "Transfer"
    assert dict(turn.attributes or {})["hotline.tools_ms"] == 120.0


def test_texts_are_left_out_unless_asked_for(exported: InMemorySpanExporter) -> None:
    tools: list[dict[str, object]] = [
        {"name": "lookup", "arguments": '{"card": "4111"}', "ok": True, "ms": 5.0, "output": "x"}
    ]
    record = turn_record(tools=tools)
    traced(exported, record)
    for span in exported.get_finished_spans():
        values = [str(value) for value in (span.attributes or {}).values()]
        assert not any("4111" in value for value in values), span.name
        assert not any("Thanks" in value for value in values), span.name

    with_text = InMemorySpanExporter()
    traced(with_text, record, include_text=True)
    spans = by_name(with_text.get_finished_spans())
    turn = dict(spans["turn"].attributes or {})
    assert turn["hotline.caller_text"] == "my card number is 4111"
    assert turn["hotline.reply_text"] == "Thanks, one moment."
    assert dict(spans["tool lookup"].attributes or {})["hotline.tool.arguments"] == (
        '{"card": "4111"}'
    )


def test_off_builds_no_provider_and_no_exporter(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[str] = []

    def refuse(what: str) -> object:
        def build(*args: object, **kwargs: object) -> object:
            built.append(what)
            raise AssertionError(f"{what} built while tracing is off")

        return build

    for name in ("TracerProvider", "OTLPSpanExporter", "BatchSpanProcessor"):
        monkeypatch.setattr(tracing, name, refuse(name))
    tracer = TurnTracer(TracingSettings(otlp_endpoint=None))
    assert tracer.provider is None and not tracer.enabled
    tracer.record("call-1", turn_record())
    assert tracer.force_flush()
    tracer.shutdown()
    assert built == []


class BrokenExporter(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        raise RuntimeError("collector on fire")

    def shutdown(self) -> None:
        raise RuntimeError("still on fire")


def test_a_broken_exporter_never_reaches_the_caller() -> None:
    tracer = TurnTracer(TracingSettings(), exporter=BrokenExporter())
    tracer.record("call-1", turn_record())
    tracer.record("call-1", turn_record(2, tools=[{"name": None, "ms": "soon"}]))
    tracer.shutdown()


def test_a_malformed_record_is_logged_not_raised(
    exported: InMemorySpanExporter, caplog: pytest.LogCaptureFixture
) -> None:
    tracer = TurnTracer(TracingSettings(), exporter=exported)
    broken = turn_record(timings_ms={"endpoint": "late"})
    tracer.record("call-1", broken)
    assert "no spans for call call-1 turn 1" in caplog.text
    tracer.record("call-1", turn_record(2))  # and the next turn is traced
    assert any(span.name == "turn" for span in exported.get_finished_spans())


def test_a_collector_is_given_by_its_base_url_or_its_traces_url() -> None:
    assert traces_url("http://collector:4318") == "http://collector:4318/v1/traces"
    assert traces_url("http://collector:4318/") == "http://collector:4318/v1/traces"
    assert traces_url("https://otel.example/v1/traces") == "https://otel.example/v1/traces"


def test_headers_stay_out_of_the_settings_repr() -> None:
    settings = TracingSettings(otlp_endpoint="http://x:4318", headers={"Authorization": "s3cret"})
    assert "s3cret" not in repr(settings)
    assert "s3cret" not in str(settings)


# -- a real export over OTLP/HTTP ----------------------------------------------------------


@dataclass
class Receiver:
    url: str
    requests: list[ExportTraceServiceRequest] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)


def _receiver_app(receiver: Receiver) -> Starlette:
    async def traces(request: Request) -> Response:
        body = await request.body()
        encoding = request.headers.get("content-encoding", "")
        if encoding == "gzip":
            body = gzip.decompress(body)
        elif encoding == "deflate":
            body = zlib.decompress(body)
        export = ExportTraceServiceRequest()
        export.ParseFromString(body)
        receiver.requests.append(export)
        receiver.headers.append(dict(request.headers))
        reply = ExportTraceServiceResponse().SerializeToString()
        return Response(reply, media_type="application/x-protobuf")

    return Starlette(routes=[Route("/v1/traces", traces, methods=["POST"])])


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """An OTLP/HTTP trace receiver on a loopback port, in a thread of its own (the exporter
    posts synchronously). The socket listens before the server starts, so a request made at
    once waits in the backlog: nothing needs to wait for the server to be up."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    port = sock.getsockname()[1]
    state = Receiver(url=f"http://127.0.0.1:{port}")
    config = uvicorn.Config(
        _receiver_app(state), lifespan="off", log_level="warning", access_log=False
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def test_spans_reach_an_otlp_http_collector(receiver: Receiver) -> None:
    settings = TracingSettings(
        otlp_endpoint=receiver.url,
        service_name="hotline-test",
        headers={"Authorization": "Bearer collector-token"},
    )
    tracer = TurnTracer(settings)
    try:
        tracer.record("call-otlp", turn_record(), agent="front-desk")
        assert tracer.force_flush(timeout_s=10)
    finally:
        tracer.shutdown()

    assert receiver.requests, "the collector got nothing"
    assert receiver.headers[0]["authorization"] == "Bearer collector-token"
    spans = [
        (resource_spans, span)
        for export in receiver.requests
        for resource_spans in export.resource_spans
        for scope_spans in resource_spans.scope_spans
        for span in scope_spans.spans
    ]
    names = {span.name for _, span in spans}
    assert {"turn", "endpoint", "stt", "llm", "tts", "first_audio"} <= names
    resource_spans, turn = next((rs, span) for rs, span in spans if span.name == "turn")
    assert int.from_bytes(turn.trace_id, "big") == trace_id_of("call-otlp")
    service = {
        attribute.key: attribute.value.string_value
        for attribute in resource_spans.resource.attributes
    }
    assert service["service.name"] == "hotline-test"
    assert turn.start_time_unix_nano == ns(0)
    assert turn.end_time_unix_nano == ns(640.0)


def test_the_call_span_says_who_answered_a_placed_call(exported: InMemorySpanExporter) -> None:
    tracer = TurnTracer(TracingSettings(), exporter=exported)
    answered = {"result": "machine", "basis": "beep", "ms": 5120, "beep_ms": 5480}
    tracer.record_call(call_record(end_reason="voicemail: message left", answered_by=answered))
    (call,) = exported.get_finished_spans()
    attributes = dict(call.attributes or {})
    assert attributes["hotline.answered_by"] == "machine"
    assert attributes["hotline.answered_by.basis"] == "beep"
    assert attributes["hotline.end_category"] == "agent_ended"

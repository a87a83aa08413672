"""Agents on live phone calls: a real `hotline serve` with agent files, the faithful Twilio
caller speaking real speech, the tier simulator calling tools, and the operator's order service
as a real signed HTTP endpoint on loopback."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.support.metrics import Samples, scrape
from tests.support.poll import until, wait_until
from tests.support.server import Server, free_port, logged, start_server, stop_server
from tests.support.speech import heard, utterance
from voice.agents.http_tools import SIGNATURE_HEADER, verify
from voice.audio import write_wav
from voice.devtools.phone_caller import twilio_sid
from voice.devtools.twilio_call import place_twilio_call
from voice.devtools.webrtc_caller import place_call
from voice.server.tracing import trace_id_of

pytestmark = pytest.mark.slow

SECRET = "agents-live-signing-secret-5f2a"
HOOK_SECRET = "post-call-webhook-secret-91c4"
RECEPTIONIST = "+15551230000"  # deploy/agents/receptionist.yaml
FRONT_DESK = "+15551230001"
# Longer than the whole call takes: a caller that waited it out never noticed the hang-up.
QUIET_AFTER_HANG_UP_S = 60.0
ORDERS = "+15559870001"  # the order line below, served by the endpoint
SLOW_ORDERS = "+15559870002"  # the same tool, from a service that never answers
SIP_PORT = free_port()
GREETING = "Acme Dental, how can I help?"  # deploy/agents/receptionist.yaml


@dataclass
class OrderService:
    """The operator's order-status service: checks Hotline's signature, answers per path."""

    port: int = field(default_factory=free_port)
    received: list[dict[str, Any]] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    # The same server is the OTLP collector: the turn spans it was sent, by trace id.
    spans: dict[str, list[str]] = field(default_factory=dict)
    calls: dict[str, dict[str, Any]] = field(default_factory=dict)  # `call` spans' attributes
    # ... and the post-call webhook's receiver: it refuses each delivery's first attempt (503).
    hooks: list[tuple[dict[str, str], dict[str, Any]]] = field(default_factory=list)
    hook_attempts: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)  # the server's thread writes

    def app(self) -> Starlette:
        async def status(request: Request) -> Response:
            raw = await request.body()
            if not verify(
                SECRET.encode(), request.headers.get(SIGNATURE_HEADER, ""), raw, time.time()
            ):
                self.refused.append(request.url.path)
                return JSONResponse({"error": "bad signature"}, status_code=401)
            body = json.loads(raw)
            self.received.append(body)
            if request.url.path == "/slow":  # never answers: Hotline's timeout ends it, and
                while (await request.receive())["type"] != "http.disconnect":  # then this
                    pass
            number = body["arguments"].get("order_number", "")
            return JSONResponse({"order": number, "status": "shipped", "eta": "Friday"})

        async def traces(request: Request) -> Response:
            export = ExportTraceServiceRequest()
            export.ParseFromString(await request.body())
            with self.lock:
                for resource in export.resource_spans:
                    for scope in resource.scope_spans:
                        for span in scope.spans:
                            self.spans.setdefault(span.trace_id.hex(), []).append(span.name)
                            if span.name == "call":
                                self.calls[span.trace_id.hex()] = {
                                    a.key: getattr(a.value, a.value.WhichOneof("value") or "")
                                    for a in span.attributes
                                }
            reply = ExportTraceServiceResponse().SerializeToString()
            return Response(reply, media_type="application/x-protobuf")

        async def hook(request: Request) -> Response:
            raw = await request.body()
            signature = request.headers.get(SIGNATURE_HEADER, "")
            if not verify(HOOK_SECRET.encode(), signature, raw, time.time()):
                return JSONResponse({"error": "bad signature"}, status_code=401)
            delivery = request.headers["x-hotline-delivery"]
            with self.lock:
                self.hook_attempts[delivery] = self.hook_attempts.get(delivery, 0) + 1
                if self.hook_attempts[delivery] == 1:
                    return JSONResponse({"error": "try later"}, status_code=503)
                self.hooks.append((dict(request.headers), json.loads(raw)))
            return JSONResponse({"ok": True})

        return Starlette(
            routes=[
                Route("/v1/traces", traces, methods=["POST"]),
                Route("/hooks/call-ended", hook, methods=["POST"]),
                Route("/{path}", status, methods=["POST"]),
            ]
        )

    def hook_for(self, call_id: str, within_s: float) -> dict[str, Any]:
        """The post-call document of `call_id`, once delivered (fails with the attempts seen)."""

        def found() -> dict[str, Any] | None:
            with self.lock:
                return next((b for _, b in self.hooks if b["call"]["call_id"] == call_id), None)

        what = f"the webhook document of {call_id}"
        return wait_until(found, what, within_s, describe=lambda: self.hook_attempts)

    def spans_of(self, trace_id: str, within_s: float) -> list[str]:
        """The span names of a trace, once its turn span has arrived (the exporter batches)."""

        def names() -> list[str] | None:
            with self.lock:
                got = list(self.spans.get(trace_id, []))
            return got if "turn" in got else None

        what = f"the turn span of trace {trace_id}"
        return wait_until(names, what, within_s, describe=lambda: self.spans.get(trace_id))

    def call_span_of(self, trace_id: str, within_s: float) -> dict[str, Any]:
        """The attributes of a trace's `call` span, once it has arrived."""

        def found() -> dict[str, Any] | None:
            with self.lock:
                return self.calls.get(trace_id)

        what = f"the call span of trace {trace_id}"
        return wait_until(found, what, within_s, describe=lambda: self.spans.get(trace_id))

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path}"


def order_agent(name: str, number: str, url: str, timeout_s: float) -> str:
    return f"""
name: {name}
numbers: ["{number}"]
instructions: You answer questions about orders.
builtin_tools: [end_call]
tools:
  - name: order_status
    description: Look up an order by its number
    parameters:
      type: object
      properties: {{order_number: {{type: string}}}}
      required: [order_number]
    url: {url}
    timeout_s: {timeout_s}
holding: {{phrase: "One moment, please.", after_ms: 400}}
"""


@pytest.fixture(scope="module")
def orders() -> Iterator[OrderService]:
    service = OrderService()
    config = uvicorn.Config(service.app(), host="127.0.0.1", port=service.port, log_config=None)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, "the order service to start")
    yield service
    server.should_exit = True
    thread.join(10)
    assert not thread.is_alive(), "the order service did not stop"


@pytest.fixture(scope="module")
def agents_server(
    orders: OrderService, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    directory = tmp_path_factory.mktemp("agents")
    shutil.copy(Path("deploy/agents/receptionist.yaml"), directory)
    (directory / "orders.yaml").write_text(
        order_agent("orders", ORDERS, orders.url("status"), 5.0), encoding="utf-8"
    )
    (directory / "slow-orders.yaml").write_text(
        order_agent("slow-orders", SLOW_ORDERS, orders.url("slow"), 0.5), encoding="utf-8"
    )
    running = start_server(
        {
            "HOTLINE_SIP__ENABLED": "true",  # the caller tool's SIP calls, by number
            "HOTLINE_SIP__PORT": str(SIP_PORT),
            "HOTLINE_SIP__ALLOW": '["127.0.0.1/32"]',
            "HOTLINE_AGENTS__DIR": str(directory),
            "HOTLINE_AGENTS__SIGNING_SECRET": SECRET,
            "HOTLINE_TRACING__OTLP_ENDPOINT": f"http://127.0.0.1:{orders.port}",
            "HOTLINE_WEBHOOK__URL": orders.url("hooks/call-ended"),
            "HOTLINE_WEBHOOK__SECRET": HOOK_SECRET,
            "HOTLINE_WEBHOOK__FIRST_RETRY_S": "0.2",
        }
    )
    yield running
    assert stop_server(running) == 0, "\n".join(running.log[-40:])


def detail(server: Server, call_id: str) -> dict[str, Any]:
    response = httpx.get(f"{server.url}/calls/{call_id}", timeout=10)
    response.raise_for_status()
    found: dict[str, Any] = response.json()
    return found


def test_the_caller_tool_dials_a_number_and_hears_the_greeting_out(
    agents_server: Server, tmp_path: Path
) -> None:
    """`hotline call --to/--from` reaches the agent of the number called, as Twilio, Telnyx and
    Vonage and over SIP, and speaks only once the greeting has played: the greeting is in the
    history in full and the turn is not an interruption (the tool spoke 200 ms in before, so
    every call began by cutting the greeting). The order line has no greeting: the tool speaks
    anyway."""
    wav = tmp_path / "hello.wav"
    write_wav(wav, utterance("Hello, are you open today?"))
    runs = {  # transport: (how, the agent called, the caller's number)
        "twilio": (("--twilio", agents_server.url), "receptionist", "+15555550111"),
        "telnyx": (("--telnyx",), "receptionist", "+15555550112"),
        "sip": (("--sip", f"127.0.0.1:{SIP_PORT}"), "orders", "+15555550122"),
        "vonage": (("--vonage",), "orders", "+15555550123"),
    }
    numbers = {"receptionist": RECEPTIONIST, "orders": ORDERS}
    environment = {k: v for k, v in os.environ.items() if k != "HOTLINE_API_TOKEN"}
    callers = {}  # the four at once, each its own `hotline call` process
    for transport, (how, agent, caller) in runs.items():
        out = str(tmp_path / f"reply-{transport}.wav")
        command = ["call", "--wav", str(wav), "--out", out, "--url", agents_server.url, *how]
        command += ["--to", numbers[agent], "--from", caller]
        callers[transport] = subprocess.Popen(
            [sys.executable, "-m", "voice", *command],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=environment,
        )
    for transport, (_, agent, caller) in runs.items():
        output, _ = callers[transport].communicate(timeout=120)
        assert callers[transport].returncode == 0, output
        found = re.search(r"call (\S+) \(1/1\)", output)
        assert found, output
        call = detail(agents_server, found.group(1))
        assert (call["transport"], call["agent"], call["caller"]) == (transport, agent, caller)
        if agent == "receptionist":
            opening = call["history"][0]
            assert (opening["role"], opening["content"]) == ("assistant", GREETING), transport
        [record] = call["records"]
        said = record["caller_text"].lower()
        assert "open" in said and not record["interrupted"], (transport, said)


async def test_asking_for_a_person_puts_the_caller_through(agents_server: Server) -> None:
    result = await place_twilio_call(
        agents_server.url,
        [utterance("Can you transfer me to a person, please?")],
        parameters={"to": RECEPTIONIST},
        quiet_s=2.0,
    )
    assert result.rejected is None and not result.violations
    # The bot said so, the stream ended, and Twilio's <Connect action> was told to dial.
    assert result.after_stream == "Dial"
    assert result.transferred_to == FRONT_DESK
    call = detail(agents_server, result.call_id)
    assert call["agent"] == "receptionist"
    assert call["transfer"]["to"] == FRONT_DESK
    assert call["wants_human"] is True  # put through to a person: the record says so
    [record] = call["records"]
    assert [tool["name"] for tool in record["tools"]] == ["transfer_to_human"]
    # Said, played to its end (the record keeps what the caller heard), heard by the phone.
    # (tiny.en on the 8 kHz line once heard this reply as "actually": the words are checked
    # on the server's side.)
    assert record["reply_text"] == "I'm putting you through to a person now."
    assert result.turns[0].voice_to_voice_ms is not None


async def test_a_transfer_through_the_calls_api_is_as_warm_as_the_agents_own(
    agents_server: Server,
) -> None:
    """The receptionist's transfers are warm: one asked through the calls API (the console's
    button) hands the person the same summary, of the call so far, and the record, here and in
    the registry (any worker's list of ended calls), says the caller went to a person."""
    call_id = twilio_sid("CA")
    mark = agents_server.log_mark()
    phone = asyncio.create_task(
        place_twilio_call(
            agents_server.url,
            [utterance("Hello, I have a question about my bill.")],
            parameters={"to": RECEPTIONIST},
            call_sid=call_id,
            linger_s=60.0,  # on the line until the bot has said so and leaves
        )
    )
    await logged(agents_server, f"call {call_id} turn 1", since=mark, within_s=60)
    async with httpx.AsyncClient(base_url=agents_server.url, timeout=20) as client:
        asked = await client.post(f"/calls/{call_id}/transfer", json={"reason": "billing"})
        assert asked.status_code == 200, asked.text
        result = await asyncio.wait_for(phone, 60)

        async def ended() -> dict[str, Any] | None:
            listed = (await client.get("/calls/ended")).json()["calls"]
            return next((c for c in listed if c["call_id"] == call_id), None)

        registered = await until(ended, f"call {call_id} among the ended calls", 30)
    assert result.transferred_to == FRONT_DESK
    call = detail(agents_server, call_id)
    assert call["transfer"]["to"] == FRONT_DESK
    summary = call["transfer"]["summary"]
    assert summary.startswith("Reason: billing\n"), summary
    [asked_about] = [m["content"] for m in call["history"] if m["role"] == "user"]
    assert f"Caller: {asked_about}" in summary.splitlines(), summary
    assert call["wants_human"] is True and registered["wants_human"] is True


async def test_a_call_that_ends_during_the_greeting_still_leaves_its_trace(
    agents_server: Server, orders: OrderService
) -> None:
    """The caller hangs up before the greeting is over, before any turn: the call's trace
    still comes, one `call` span saying why it ended and that no turn was recorded."""
    result = await place_twilio_call(agents_server.url, [], parameters={"to": RECEPTIONIST})
    assert result.rejected is None
    trace = f"{trace_id_of(result.call_id):032x}"
    call = await asyncio.to_thread(orders.call_span_of, trace, 30.0)
    assert call["hotline.call_id"] == result.call_id
    assert call["hotline.agent"] == "receptionist" and call["hotline.transport"] == "twilio"
    assert call["hotline.end_reason"].startswith("stop"), call
    assert call["hotline.turns"] == 0 and call["hotline.wants_human"] is False
    assert orders.spans[trace] == ["call"]


WEBHOOKS = "hotline_webhook_deliveries_total"
WEBHOOK_OUTCOMES = ("delivered", "retried", "rejected", "given_up", "superseded", "dropped")
ENDED = "hotline_calls_ended_total"


def settled_metrics(server: Server) -> Samples:
    """/metrics once no call is in progress and every ended call's webhook has its final
    outcome, so that what the next call moves is all its own."""

    def check() -> Samples | None:
        now = scrape(server.url)
        finals = sum(now.get(WEBHOOKS, outcome=o) for o in ("delivered", "rejected", "given_up"))
        settled = finals + now.get(WEBHOOKS, outcome="dropped") == now.total(ENDED)
        return now if settled and now.get("hotline_active_calls") == 0 else None

    return wait_until(check, "no call in progress and every webhook settled", 30.0)


async def test_an_order_question_calls_the_order_service_and_speaks_its_answer(
    agents_server: Server, orders: OrderService
) -> None:
    before = len(orders.received)
    began = time.monotonic()
    metrics_before = await asyncio.to_thread(settled_metrics, agents_server)
    result = await place_twilio_call(
        agents_server.url,
        [utterance("Where is my order, number four five one two?")],
        parameters={"to": ORDERS},
        # The caller stays for 4 s of quiet: between "Let me look that up." and the answer
        # the tool, a second LLM round and the answer's synthesis run, which a loaded runner
        # once stretched past 2 s (the phone had hung up and heard no order number).
        quiet_s=4.0,
    )
    assert result.rejected is None and result.transferred_to is None
    [request] = orders.received[before:]
    assert request["tool"] == "order_status" and request["call_id"] == result.call_id
    assert request["arguments"] == {"order_number": "4512"}
    assert not orders.refused
    said = heard(result.reply_audio)
    # The tool's answer was spoken: the phone heard its order number (tiny.en on the 8 kHz
    # line hears "status shipped, eta Friday" as "statorshiped, edefriety"), and the server
    # played the whole sentence (its record keeps what the caller heard).
    assert "4512" in re.sub(r"\D", "", said), said
    [record] = detail(agents_server, result.call_id)["records"]
    assert record["tools"][0]["ok"] is True
    assert "status shipped, eta Friday" in record["reply_text"]
    print(f"\norder turn (ms): {record['timings_ms']}, tools {record['tools_ms']}")
    # The turn went out as a trace of the call: a turn span, its stages and the tool call.
    trace = f"{trace_id_of(result.call_id):032x}"
    names = await asyncio.to_thread(orders.spans_of, trace, 30.0)
    assert {"turn", "endpoint", "stt", "llm", "tool order_status"} <= set(names), names
    # When the call ended, its document went to the post-call webhook, signed; the receiver
    # refused the first attempt, the outbox tried again.
    document = await asyncio.to_thread(orders.hook_for, result.call_id, 30.0)
    assert document["event"] == "call.ended"
    call = document["call"]
    assert call["agent"] == "orders" and call["records"][0]["tools"][0]["name"] == "order_status"
    assert [m["role"] for m in call["history"]] == ["user", "assistant", "tool", "assistant"]
    # ... with the link to the call's recording (recorded by default), which plays
    recording = document["recording"]
    assert recording["url"] == f"/calls/{result.call_id}/recording" and recording["bytes"] > 0
    assert call["recording"]["duration_s"] == recording["duration_s"] > 1.0
    audio = await asyncio.to_thread(httpx.get, agents_server.url + recording["url"], timeout=10)
    assert audio.headers["content-type"] == "audio/ogg" and len(audio.content) == recording["bytes"]
    webhook = detail(agents_server, result.call_id)["webhook"]
    assert webhook["state"] == "delivered" and webhook["attempts"] == 2
    print(f"at the caller: {[turn.voice_to_voice_ms for turn in result.turns]}")
    # /metrics moved by this call alone: a retried attempt and a delivered one, one call ended
    # by the caller (the category the document has too), its duration once, its recording.
    moved = (await asyncio.to_thread(settled_metrics, agents_server)).since(metrics_before)
    took_s = time.monotonic() - began
    assert call["end_category"] == "caller_hung_up", call["end_reason"]
    outcomes = {o: moved.get(WEBHOOKS, outcome=o) for o in WEBHOOK_OUTCOMES}
    assert outcomes == {**dict.fromkeys(WEBHOOK_OUTCOMES, 0), "retried": 1, "delivered": 1}
    assert moved.get(ENDED, reason="caller_hung_up") == moved.total(ENDED) == 1
    assert moved.get("hotline_call_duration_seconds_count", transport="twilio") == 1
    assert 0 < moved.get("hotline_call_duration_seconds_sum", transport="twilio") < took_s
    assert moved.get("hotline_recordings_total", outcome="written") == 1
    assert moved.total("hotline_recordings_total") == 1


async def test_a_tool_that_times_out_gets_an_apology_not_a_dead_call(
    agents_server: Server, orders: OrderService
) -> None:
    result = await place_twilio_call(
        agents_server.url,
        [utterance("Where is my order, number four five one two?")],
        parameters={"to": SLOW_ORDERS},
        quiet_s=2.0,
    )
    assert result.rejected is None
    assert result.turns[0].voice_to_voice_ms is not None  # the caller heard a reply
    [record] = detail(agents_server, result.call_id)["records"]
    assert record["tools"][0]["ok"] is False
    assert "did not answer" in record["tools"][0]["output"]
    # What was played: "Let me look that up." (and the holding phrase), then the apology.
    assert record["reply_text"].startswith("Let me look that up.")
    assert "Sorry, I couldn't order status" in record["reply_text"]


async def test_the_person_key_puts_the_caller_through_the_same_way(agents_server: Server) -> None:
    result = await place_twilio_call(
        agents_server.url,
        [utterance("Hello, I have a question.")],
        parameters={"to": RECEPTIONIST},
        dtmf="0",
        quiet_s=2.0,
        linger_s=20.0,  # on the line until the bot has said so and leaves
    )
    assert result.transferred_to == FRONT_DESK
    call = detail(agents_server, result.call_id)
    assert call["wants_human"] is True
    assert call["transfer"]["reason"] == "the caller pressed the person key"


async def test_a_softphone_caller_sees_where_the_call_went(agents_server: Server) -> None:
    """WebRTC reaches the agent with `webrtc: true` (the receptionist); a transfer is shown to
    the softphone as an event and kept in the call record."""
    # After the reply the caller waits for `quiet_s` of silence before it would speak again;
    # once the server has hung up, no frames come to be silent. A caller that does not notice
    # the hang-up waits out the whole `quiet_s` (it did: 28 s with the defaults).
    started = time.monotonic()
    result = await place_call(
        agents_server.url,
        [utterance("Can you transfer me to a person, please?"), utterance("Hello?")],
        quiet_s=QUIET_AFTER_HANG_UP_S,
        reply_timeout_s=QUIET_AFTER_HANG_UP_S,
    )
    assert time.monotonic() - started < QUIET_AFTER_HANG_UP_S  # it stopped when the call ended
    assert len(result.turns) == 1  # and said nothing into the closed line
    transfers = [e for e in result.events if e.get("type") == "transfer"]
    assert [e["to"] for e in transfers] == [FRONT_DESK]
    call = detail(agents_server, result.call_id)
    assert call["transport"] == "webrtc" and call["agent"] == "receptionist"
    assert call["transfer"]["to"] == FRONT_DESK
    assert call["transfer"]["summary"]  # a warm transfer: the person gets the gist

"""The tools an agent runs during a call: HTTP tools against a real signed endpoint on loopback,
the built-ins and the per-call toolbox that dispatches them."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from pipeline.tools import (
    EndCall,
    SendDigits,
    ToolCall,
    ToolContext,
    ToolResult,
    ToolSpec,
    Transfer,
)
from voice.agents.builtin import (
    SUMMARY_CHARS,
    EndCallTool,
    SendDtmf,
    TransferToHuman,
    builtin_tools,
    warm_summary,
)
from voice.agents.http_tools import (
    MAX_OUTPUT_CHARS,
    MAX_RESPONSE_BYTES,
    HttpTool,
    HttpToolConfig,
    model_output,
    sign,
    verify,
)
from voice.agents.toolbox import CallToolbox

SECRET = b"whsec-7c1d0f-hotline-test-signing-key"
TOKEN = "Bearer orders-token-31f9e2d8"  # an operator's header value: never logged
BODY_KEYS = {"call_id", "tool", "tool_call_id", "arguments", "caller", "callee"}
CHUNK = 64 * 1024
STREAM_CHUNKS = 1024  # /big-stream would send 64 MiB if it were read to the end
CONTEXT = ToolContext("call-81", caller="+15551230000", callee="+15559870000")


# -- the operator's endpoint -------------------------------------------------------------------


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    raw: bytes
    body: dict[str, Any]


@dataclass
class Endpoint:
    """A real HTTP server on 127.0.0.1 that checks what Hotline sends, as an operator's would."""

    port: int = 0
    received: list[Received] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)  # a /slow request came in
    release: asyncio.Event = field(default_factory=asyncio.Event)  # never set: /slow never answers
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)  # a /slow client left
    chunks_sent: int = 0  # by /big-stream

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


def _endpoint_app(state: Endpoint) -> Starlette:
    async def checked(request: Request) -> Received | Response:
        raw = await request.body()
        signature = request.headers.get("x-hotline-signature", "")
        if not verify(SECRET, signature, raw, now=time.time()):
            state.problems.append("bad signature")
            return PlainTextResponse("bad signature", status_code=401)
        body = json.loads(raw)
        problems = []
        if set(body) != BODY_KEYS:
            problems.append(f"body keys {sorted(body)}")
        if raw != json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode():
            problems.append("body is not compact UTF-8 JSON")
        if request.headers.get("content-type") != "application/json":
            problems.append(f"content-type {request.headers.get('content-type')}")
        if not request.headers.get("user-agent", "").startswith("Hotline/"):
            problems.append(f"user-agent {request.headers.get('user-agent')}")
        if request.headers.get("x-hotline-call-id") != body.get("call_id"):
            problems.append("X-Hotline-Call-Id is not the body's call_id")
        if problems:
            state.problems.extend(problems)
            return PlainTextResponse("; ".join(problems), status_code=400)
        received = Received(request.url.path, dict(request.headers), raw, body)
        state.received.append(received)
        return received

    async def ok(request: Request) -> Response:
        got = await checked(request)
        if isinstance(got, Response):
            return got
        return JSONResponse({"order": "4512", "status": "shipped"})

    async def slow(request: Request) -> Response:
        got = await checked(request)
        if isinstance(got, Response):
            return got
        state.arrived.set()
        released = asyncio.ensure_future(state.release.wait())
        gone = asyncio.ensure_future(request.receive())  # http.disconnect when the client leaves
        await asyncio.wait({released, gone}, return_when=asyncio.FIRST_COMPLETED)
        released.cancel()
        if gone.done() and gone.result()["type"] == "http.disconnect":
            state.disconnected.set()
        gone.cancel()
        return JSONResponse({"late": True})

    async def fail(request: Request) -> Response:
        got = await checked(request)
        if isinstance(got, Response):
            return got
        return PlainTextResponse("orders database is down " + "x" * 1000, status_code=503)

    async def text(request: Request) -> Response:
        got = await checked(request)
        if isinstance(got, Response):
            return got
        return PlainTextResponse('Order 4512 shipped "today"')

    async def long(request: Request) -> Response:
        got = await checked(request)
        if isinstance(got, Response):
            return got
        return JSONResponse({"lines": [f"line {i} of the order history" for i in range(500)]})

    async def big(request: Request) -> Response:
        got = await checked(request)
        if isinstance(got, Response):
            return got
        return Response(b"x" * (2 * MAX_RESPONSE_BYTES), media_type="text/plain")

    async def big_stream(request: Request) -> Response:
        got = await checked(request)
        if isinstance(got, Response):
            return got

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(STREAM_CHUNKS):
                state.chunks_sent += 1
                yield b"y" * CHUNK

        return StreamingResponse(chunks(), media_type="text/plain")  # no Content-Length

    async def redirect(request: Request) -> Response:
        got = await checked(request)
        if isinstance(got, Response):
            return got
        return Response(status_code=307, headers={"Location": state.url("/ok")})

    routes = {
        "/ok": ok,
        "/slow": slow,
        "/fail": fail,
        "/text": text,
        "/long": long,
        "/big": big,
        "/big-stream": big_stream,
        "/redirect": redirect,
    }
    return Starlette(
        routes=[Route(path, handler, methods=["POST"]) for path, handler in routes.items()]
    )


@pytest.fixture
async def endpoint() -> AsyncIterator[Endpoint]:
    state = Endpoint()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    state.port = sock.getsockname()[1]
    config = uvicorn.Config(
        _endpoint_app(state),
        lifespan="off",
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=5,
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if serving.done():
            serving.result()  # raises why it did not start
        await asyncio.sleep(0.005)
    try:
        yield state
    finally:
        server.should_exit = True
        await serving
        sock.close()


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as shared:
        yield shared


def _tool(
    endpoint: Endpoint,
    client: httpx.AsyncClient,
    path: str,
    *,
    timeout_s: float = 5.0,
    secret: bytes = SECRET,
    headers: dict[str, str] | None = None,
) -> HttpTool:
    config = HttpToolConfig(
        name="lookup_order",
        description="Look up an order by its number.",
        parameters={
            "type": "object",
            "properties": {"order": {"type": "string"}},
            "required": ["order"],
        },
        url=endpoint.url(path),  # type: ignore[arg-type]  # pydantic validates the string
        timeout_s=timeout_s,
        headers=headers if headers is not None else {"Authorization": TOKEN},
    )
    return HttpTool(config, secret, client)


def _call(arguments: str = '{"order": "4512"}', name: str = "lookup_order") -> ToolCall:
    return ToolCall("toolcall-7", name, arguments)


def _error(result: ToolResult) -> str:
    assert not result.ok
    assert result.action is None
    assert result.started_at <= result.ended_at
    message = json.loads(result.output)["error"]
    assert isinstance(message, str)
    return message


# -- signatures --------------------------------------------------------------------------------


def test_a_signature_verifies_only_the_same_body_secret_and_recent_time() -> None:
    body = b'{"call_id":"call-81","tool":"lookup_order"}'
    signed_at = 1_700_000_000
    header = sign(SECRET, body, signed_at)
    assert header.startswith(f"t={signed_at},v1=")

    assert verify(SECRET, header, body, now=signed_at + 10)
    assert not verify(SECRET, header, body.replace(b"81", b"82"), now=signed_at)  # tampered
    assert not verify(b"another secret", header, body, now=signed_at)
    assert not verify(SECRET, header, body, now=signed_at + 301)  # stale: a replay
    assert not verify(SECRET, header, body, now=signed_at - 301)  # from the future
    assert verify(SECRET, header, body, now=signed_at + 600, tolerance_s=900)
    # the timestamp is signed: moving it breaks the signature
    moved = header.replace(f"t={signed_at}", f"t={signed_at + 100}")
    assert not verify(SECRET, moved, body, now=signed_at + 100)
    # a receiver rotating secrets may get several v1 values
    old = sign(b"old secret", body, signed_at).split(",")[1]
    assert verify(SECRET, f"{header},{old}", body, now=signed_at)
    for malformed in (
        "",
        "t=abc,v1=00",
        "t=\u00b2,v1=00",
        f"v1={header.split('v1=')[1]}",
        f"t={signed_at}",
        "x",
    ):
        assert not verify(SECRET, malformed, body, now=signed_at)


# -- HTTP tools --------------------------------------------------------------------------------


async def test_a_signed_request_arrives_and_its_json_answer_is_the_output(
    endpoint: Endpoint, client: httpx.AsyncClient
) -> None:
    tool = _tool(endpoint, client, "/ok", headers={"Authorization": TOKEN, "X-Shop": "north"})
    assert tool.spec == ToolSpec(
        "lookup_order", "Look up an order by its number.", tool.config.parameters
    )

    result = await tool.run(_call('{"order": "4512", "note": "café"}'), CONTEXT)

    assert endpoint.problems == []
    assert result.ok, result.output
    assert result.output == '{"order":"4512","status":"shipped"}'
    assert result.action is None
    assert result.call == _call('{"order": "4512", "note": "café"}')
    assert result.started_at <= result.ended_at
    [received] = endpoint.received
    assert received.body == {
        "call_id": "call-81",
        "tool": "lookup_order",
        "tool_call_id": "toolcall-7",
        "arguments": {"order": "4512", "note": "café"},
        "caller": "+15551230000",
        "callee": "+15559870000",
    }
    assert "café".encode() in received.raw  # UTF-8, not \u escapes
    assert received.headers["authorization"] == TOKEN
    assert received.headers["x-shop"] == "north"
    assert received.headers["x-hotline-call-id"] == "call-81"
    assert received.headers["user-agent"].startswith("Hotline/")


async def test_configured_headers_cannot_replace_the_signature_or_content_type(
    endpoint: Endpoint, client: httpx.AsyncClient
) -> None:
    forged = {"x-hotline-signature": "t=1,v1=00", "content-type": "text/plain"}
    result = await _tool(endpoint, client, "/ok", headers=forged).run(_call(), CONTEXT)
    assert result.ok, result.output
    assert endpoint.problems == []


async def test_plain_text_answers_are_wrapped_and_long_ones_cut(
    endpoint: Endpoint, client: httpx.AsyncClient
) -> None:
    text = await _tool(endpoint, client, "/text").run(_call(), CONTEXT)
    assert text.ok
    assert json.loads(text.output) == {"result": 'Order 4512 shipped "today"'}

    long = await _tool(endpoint, client, "/long").run(_call(), CONTEXT)
    assert long.ok
    assert len(long.output) <= MAX_OUTPUT_CHARS
    cut = json.loads(long.output)
    assert "characters" in cut["truncated"]
    assert cut["result"].startswith('{"lines":["line 0 of the order history"')


def test_model_output_is_compact_json_that_encodes_as_utf8() -> None:
    assert model_output('{ "a" : [1, 2] }') == '{"a":[1,2]}'
    assert model_output("\u00e9t\u00e9") == '{"result":"\u00e9t\u00e9"}'
    lone = model_output('"\\ud800"')  # JSON may hold a lone surrogate; UTF-8 cannot
    lone.encode()
    assert json.loads(lone) == "\ud800"


async def test_a_wrong_secret_is_refused_by_the_endpoint(
    endpoint: Endpoint, client: httpx.AsyncClient
) -> None:
    result = await _tool(endpoint, client, "/ok", secret=b"not the secret").run(_call(), CONTEXT)
    assert "401" in _error(result)
    assert endpoint.problems == ["bad signature"]


async def test_a_slow_service_times_out_and_the_request_is_dropped(
    endpoint: Endpoint, client: httpx.AsyncClient
) -> None:
    result = await _tool(endpoint, client, "/slow", timeout_s=0.3).run(_call(), CONTEXT)
    assert _error(result) == "the lookup_order service did not answer within 0.3 s"
    await asyncio.wait_for(endpoint.disconnected.wait(), 10)


async def test_an_error_status_is_named_with_a_little_of_the_body(
    endpoint: Endpoint, client: httpx.AsyncClient
) -> None:
    message = _error(await _tool(endpoint, client, "/fail").run(_call(), CONTEXT))
    assert "503" in message
    assert "orders database is down" in message
    assert message.count("x") <= 200


async def test_redirects_are_not_followed(endpoint: Endpoint, client: httpx.AsyncClient) -> None:
    message = _error(await _tool(endpoint, client, "/redirect").run(_call(), CONTEXT))
    assert "307" in message
    assert [r.path for r in endpoint.received] == ["/redirect"]


async def test_an_unreachable_service_is_an_error(client: httpx.AsyncClient) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = HttpToolConfig(
        name="lookup_order",
        description="Look up an order.",
        url=f"http://127.0.0.1:{port}/ok",  # type: ignore[arg-type]
    )
    result = await HttpTool(config, SECRET, client).run(_call(), CONTEXT)
    assert _error(result) == "the lookup_order service could not be reached"


async def test_bad_arguments_are_an_error_and_nothing_is_sent(
    endpoint: Endpoint, client: httpx.AsyncClient
) -> None:
    tool = _tool(endpoint, client, "/ok")
    for arguments in ('{"order": ', "[1, 2]", '"4512"'):
        message = _error(await tool.run(_call(arguments), CONTEXT))
        assert message.startswith("the arguments for lookup_order are not valid")
    assert endpoint.received == []
    assert endpoint.problems == []


async def test_an_answer_over_the_limit_is_refused_without_reading_it_all(
    endpoint: Endpoint, client: httpx.AsyncClient
) -> None:
    declared = await _tool(endpoint, client, "/big").run(_call(), CONTEXT)
    assert "larger than 1 MB" in _error(declared)

    streamed = await _tool(endpoint, client, "/big-stream").run(_call(), CONTEXT)
    assert "larger than 1 MB" in _error(streamed)
    # what was sent is bounded by the socket buffers, far from the whole 64 MiB
    assert endpoint.chunks_sent < STREAM_CHUNKS // 2


async def test_cancelling_a_run_drops_the_request(
    endpoint: Endpoint, client: httpx.AsyncClient
) -> None:
    tool = _tool(endpoint, client, "/slow", timeout_s=30)
    running = asyncio.create_task(tool.run(_call(), CONTEXT))
    await asyncio.wait_for(endpoint.arrived.wait(), 10)

    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    await asyncio.wait_for(endpoint.disconnected.wait(), 10)


async def test_failures_log_one_line_without_secrets_or_header_values(
    endpoint: Endpoint, client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    headers = {"Authorization": TOKEN}
    for path, timeout_s in (("/ok", 5.0), ("/fail", 5.0), ("/slow", 0.3), ("/big", 5.0)):
        caplog.clear()
        tool = _tool(endpoint, client, path, timeout_s=timeout_s, headers=headers)
        result = await tool.run(_call(), CONTEXT)
        ours = [r for r in caplog.records if r.name == "voice.agents.http_tools"]
        if result.ok:
            assert ours == []
        else:
            [line] = ours
            assert line.levelno == logging.WARNING
            for part in ("call-81", "lookup_order", "toolcall-7"):
                assert part in line.getMessage()
        assert SECRET.decode() not in caplog.text
        assert TOKEN not in caplog.text
        assert "orders-token" not in caplog.text

    caplog.clear()
    await _tool(endpoint, client, "/ok", headers=headers).run(_call("nope"), CONTEXT)
    [line] = [r for r in caplog.records if r.name == "voice.agents.http_tools"]
    assert "bad arguments" in line.getMessage()
    assert TOKEN not in repr(_tool(endpoint, client, "/ok"))
    assert SECRET.decode() not in repr(_tool(endpoint, client, "/ok"))


# -- built-ins ---------------------------------------------------------------------------------

TARGETS = {
    "support": ("+15550001111", "the support desk, for problems with an order"),
    "billing": ("sip:billing@pbx.example.com", "billing, for refunds and invoices"),
}
TRANSCRIPT = (
    ("caller", "Hi, I ordered a lamp last week."),
    ("bot", "I can help with that. What is the order number?"),
    ("caller", "It's 4512, and it arrived broken."),
    ("tool", '{"order":"4512"}'),
    ("bot", "I'm sorry to hear that."),
    ("caller", "I want my money back, please put me through to someone."),
)


async def test_transfer_puts_the_caller_through_with_a_warm_summary() -> None:
    tool = TransferToHuman(TARGETS, default_target="support", warm=True)
    context = ToolContext("call-81", transcript=TRANSCRIPT)
    call = ToolCall("t1", "transfer_to_human", '{"reason": "refund", "target": "billing"}')

    result = await tool.run(call, context)

    assert result.ok
    assert json.loads(result.output) == {"status": "transferring", "to": "billing"}
    assert isinstance(result.action, Transfer)
    assert result.action.target == "sip:billing@pbx.example.com"
    assert result.action.reason == "refund"
    summary = result.action.summary
    assert summary.startswith("Reason: refund\n")
    assert "Caller: I want my money back" in summary
    assert "Agent: I'm sorry to hear that." in summary
    assert '"order"' not in summary  # tool lines are not part of it
    assert len(summary) <= SUMMARY_CHARS

    default = await tool.run(ToolCall("t2", "transfer_to_human", '{"reason": "x"}'), context)
    assert isinstance(default.action, Transfer)
    assert default.action.target == "+15550001111"
    assert json.loads(default.output)["to"] == "support"

    cold = TransferToHuman(TARGETS, default_target="support", warm=False)
    cold_result = await cold.run(call, context)
    assert isinstance(cold_result.action, Transfer)
    assert cold_result.action.summary == ""


def test_the_warm_summary_keeps_the_newest_lines_within_its_size() -> None:
    chatty = [("caller", f"line {i} " + "words " * 30) for i in range(20)]
    summary = warm_summary("the caller asked " * 50, chatty)
    assert len(summary) <= SUMMARY_CHARS
    assert "line 19" in summary
    assert "line 0 " not in summary
    one_long = warm_summary("refund", [("user", "start " + "blah " * 400 + "the end")])
    assert len(one_long) <= SUMMARY_CHARS
    assert one_long.endswith("the end")
    assert warm_summary("", []) == "Reason: not given"


async def test_transfer_errors_name_what_is_possible() -> None:
    tool = TransferToHuman(TARGETS)
    assert tool.spec.parameters["properties"]["target"]["enum"] == ["support", "billing"]
    assert tool.spec.parameters["required"] == ["reason", "target"]

    unknown = await tool.run(
        ToolCall("t1", "transfer_to_human", '{"reason": "x", "target": "sales"}'), CONTEXT
    )
    message = _error(unknown)
    assert "sales" in message and "support, billing" in message

    unnamed = await tool.run(ToolCall("t2", "transfer_to_human", '{"reason": "x"}'), CONTEXT)
    assert "support, billing" in _error(unnamed)

    nobody = TransferToHuman({})
    result = await nobody.run(ToolCall("t3", "transfer_to_human", '{"reason": "x"}'), CONTEXT)
    assert _error(result) == "no one to transfer to is configured"
    assert "target" not in nobody.spec.parameters["properties"]

    only = TransferToHuman({"desk": ("+15550002222", "")})
    alone = await only.run(ToolCall("t4", "transfer_to_human", '{"reason": "x"}'), CONTEXT)
    assert alone.action == Transfer(target="+15550002222", reason="x", summary="")

    with pytest.raises(ValueError, match="not one of the targets"):
        TransferToHuman(TARGETS, default_target="sales")


async def test_end_call_and_send_dtmf() -> None:
    ended = await EndCallTool().run(ToolCall("e", "end_call", '{"reason": "goodbye"}'), CONTEXT)
    assert ended.ok
    assert json.loads(ended.output) == {"status": "ending"}
    assert ended.action == EndCall("goodbye")

    dtmf = SendDtmf()
    sent = await dtmf.run(ToolCall("d", "send_dtmf", '{"digits": "1w2W#*"}'), CONTEXT)
    assert sent.ok
    assert json.loads(sent.output) == {"status": "sent", "digits": "1w2W#*"}
    assert sent.action == SendDigits("1w2W#*")

    for bad in ('{"digits": "12a"}', '{"digits": ""}', '{"digits": "1\\n"}', '{"digits": 5}', "{}"):
        assert "digits" in _error(await dtmf.run(ToolCall("d", "send_dtmf", bad), CONTEXT))
    too_long = json.dumps({"digits": "1" * 33})
    _error(await dtmf.run(ToolCall("d", "send_dtmf", too_long), CONTEXT))
    _error(await dtmf.run(ToolCall("d", "send_dtmf", "not json"), CONTEXT))


def test_builtin_tools_are_made_by_name() -> None:
    tools = builtin_tools(["send_dtmf", "transfer_to_human", "end_call"], TARGETS, None, True)
    assert [tool.spec.name for tool in tools] == ["send_dtmf", "transfer_to_human", "end_call"]
    for tool in tools:
        schema = tool.spec.chat()["function"]
        assert schema["description"]
        assert schema["parameters"]["type"] == "object"
    with pytest.raises(ValueError, match="hold_music"):
        builtin_tools(["end_call", "hold_music"])
    with pytest.raises(ValueError, match="more than once"):
        builtin_tools(["end_call", "end_call"])


# -- the toolbox -------------------------------------------------------------------------------


class _Broken:
    """A tool with a bug in it."""

    spec = ToolSpec("broken", "Always raises.")

    async def run(self, call: ToolCall, context: ToolContext) -> ToolResult:
        raise RuntimeError("a bug")


class _Waiting:
    """A tool that waits until it is cancelled."""

    spec = ToolSpec("waiting", "Never finishes.")

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = False

    async def run(self, call: ToolCall, context: ToolContext) -> ToolResult:
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        raise AssertionError("not reached")


async def test_the_toolbox_dispatches_by_name(
    endpoint: Endpoint, client: httpx.AsyncClient
) -> None:
    toolbox = CallToolbox([_tool(endpoint, client, "/ok"), *builtin_tools(["end_call"])])
    assert [spec.name for spec in toolbox.specs()] == ["lookup_order", "end_call"]

    looked_up = await toolbox.run(_call(), CONTEXT)
    assert looked_up.output == '{"order":"4512","status":"shipped"}'
    ended = await toolbox.run(ToolCall("e", "end_call", '{"reason": "done"}'), CONTEXT)
    assert ended.action == EndCall("done")

    unknown = await toolbox.run(ToolCall("u", "refund_order", "{}"), CONTEXT)
    assert _error(unknown) == "no tool named 'refund_order'; the tools are: lookup_order, end_call"


async def test_the_toolbox_reports_a_broken_tool_and_lets_cancellation_through(
    caplog: pytest.LogCaptureFixture,
) -> None:
    waiting = _Waiting()
    toolbox = CallToolbox([_Broken(), waiting])

    broken = await toolbox.run(ToolCall("b", "broken", "{}"), CONTEXT)
    assert _error(broken) == "the broken tool failed unexpectedly"
    [record] = [r for r in caplog.records if r.name == "voice.agents.toolbox"]
    assert record.levelno == logging.ERROR
    assert record.exc_info is not None

    running = asyncio.create_task(toolbox.run(ToolCall("w", "waiting", "{}"), CONTEXT))
    await waiting.started.wait()
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert waiting.cancelled


def test_the_toolbox_refuses_two_tools_of_one_name() -> None:
    with pytest.raises(ValueError, match="end_call"):
        CallToolbox([*builtin_tools(["end_call"]), EndCallTool()])

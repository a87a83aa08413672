"""No secret reaches a log line: the redaction of every formatted line (voice.cli.logs), and a
real `hotline serve` driven through every path that carries a token (bearer header, the live
websocket's `?token=`, stream tokens for Twilio, Telnyx and Vonage, console sign-in and its
cookie), whose whole log, uvicorn's access log included, is then searched for every secret."""

from __future__ import annotations

import json
import logging
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from urllib.parse import quote

import httpx
import numpy as np
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.support.poll import until
from tests.support.providers import Message, TelnyxWire, TwilioWire, VonageWire, Wire
from tests.support.server import WHOLE_LOG, Server, logged, start_server, stop_server
from voice.cli import logs
from voice.transports.phone.twilio import twilio_signature

API_TOKEN = "log-secrets-api-token-" + uuid.uuid4().hex
STREAM_SECRET = "log-secrets-stream-secret-" + uuid.uuid4().hex
TWILIO_TOKEN = "log-secrets-twilio-token-" + uuid.uuid4().hex
WRONG_TOKEN = "log-secrets-wrong-guess-" + uuid.uuid4().hex  # a near miss is a secret too
AUTH = {"Authorization": f"Bearer {API_TOKEN}"}


CASES = [
    (
        '127.0.0.1:5 - "WebSocket /calls/CA1/live?token=abc.DEF-_~%2F" [accepted]',
        '127.0.0.1:5 - "WebSocket /calls/CA1/live?token=[redacted]" [accepted]',
    ),
    ("GET /x?a=1&access_token=zz&b=2 HTTP/1.1", "GET /x?a=1&access_token=[redacted]&b=2 HTTP/1.1"),
    ("wss://h/telnyx/stream?Token=eyJh.c2ln", "wss://h/telnyx/stream?Token=[redacted]"),
    ("next=https%3A%2F%2Fh%2Fs%3Ftoken%3Dsecret", "next=https%3A%2F%2Fh%2Fs%3Ftoken%3D[redacted]"),
    (
        "X-Amz-Signature=ab12&X-Amz-Credential=AK",
        "X-Amz-Signature=[redacted]&X-Amz-Credential=[redacted]",
    ),
    (
        "client_secret=s3 password=p4 api_key=k5",
        "client_secret=[redacted] password=[redacted] api_key=[redacted]",
    ),
    ("Authorization: Bearer abcdefgh.123", "Authorization: Bearer [redacted]"),
    # prose and harmless parameters stay as they are
    ("missing or wrong bearer token", "missing or wrong bearer token"),
    ("max_tokens=20 tokens=5 tier=fast", "max_tokens=20 tokens=5 tier=fast"),
]


@pytest.mark.parametrize(("line", "expected"), CASES)
def test_secret_parameters_are_redacted_from_a_line(line: str, expected: str) -> None:
    assert logs.redact(line) == expected


def test_the_formatter_redacts_message_arguments_and_tracebacks() -> None:
    formatter = logs.OneLineFormatter("%(levelname)s %(name)s: %(message)s")
    arguments = ("127.0.0.1:1", "/calls/x/live?token=in-an-argument\nforged")
    record = logging.LogRecord(
        "uvicorn.error", logging.INFO, __file__, 1, '%s - "WebSocket %s" 403', arguments, None
    )
    try:
        raise ValueError("could not open wss://h/vonage/stream?token=in-the-traceback")
    except ValueError:
        record.exc_info = sys.exc_info()
    line = formatter.format(record)
    assert "in-an-argument" not in line and "in-the-traceback" not in line
    assert line.startswith('INFO uvicorn.error: 127.0.0.1:1 - "WebSocket /calls/x/live?token=')
    assert "\nforged" not in line  # the message stays one line; the traceback keeps its lines
    assert "Traceback (most recent call last):\n" in line


def _cost(make: Callable[[int], str], n: int) -> float:
    """The best of three runs of `logs.redact` on `make(n)`, in seconds of process time."""
    line, best = make(n), float("inf")
    for _ in range(3):
        start = time.process_time()
        logs.redact(line)
        best = min(best, time.process_time() - start)
    return best


@pytest.mark.parametrize(
    "make",
    [
        lambda n: "a" * n,  # one long word: a name may start only at its beginning
        lambda n: "token" * (n // 5),  # a long word ending in a secret's name, no "="
        lambda n: "token&" * (n // 6),  # many names, none followed by "="
        lambda n: "x.token-" * (n // 8),
        lambda n: "token=" * (n // 6),  # one parameter whose value runs to the end
        lambda n: "%3" * (n // 2),
        lambda n: "bearer " * (n // 7),
        lambda n: "Bearer " + "a" * n,
    ],
)
def test_redaction_is_linear_in_the_line(make: Callable[[int], str]) -> None:
    """Ten times the line costs about ten times as much (quadratic would be a hundred)."""
    small, large = _cost(make, 20_000), _cost(make, 200_000)
    assert large < 30 * max(small, 2e-4), (small, large)


# -- a real server, every token path -----------------------------------------------------------


def _silence(wire: Wire) -> Message:
    return wire.media(np.zeros(wire.frame_samples * 16_000 // wire.wire_rate, np.int16))


async def _state(http: httpx.AsyncClient, call_id: str) -> str | None:
    response = await http.get(f"/calls/{quote(call_id, safe='')}", headers=AUTH)
    return str(response.json()["state"]) if response.status_code == 200 else None


async def _call(
    server: Server,
    url: str,
    wire: Wire,
    opening: Sequence[Message],
    while_live: Callable[[], Awaitable[None]] | None = None,
) -> str:
    """Open a provider stream at `url` with `opening`; once the server lists the call, run
    `while_live`, hang up and wait for the call to end: "ended", or how the socket closed."""
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
        try:
            async with connect(url, compression=None, open_timeout=10) as socket:
                for message in opening:
                    await socket.send(message)

                async def admitted() -> bool:  # or the server closes the socket: raised
                    if await _state(http, wire.call_id) == "active":
                        return True
                    await socket.send(_silence(wire))
                    return False

                live: bool = await until(admitted, f"call {wire.call_id} admitted or refused")
                assert live
                if while_live is not None:
                    await while_live()
                stop = wire.hang_up()
                if stop is not None:
                    await socket.send(stop)
        except ConnectionClosed as closed:
            return f"closed {closed.rcvd.code if closed.rcvd else None}"

        async def ended() -> bool:
            return await _state(http, wire.call_id) == "ended"

        over: bool = await until(ended, f"call {wire.call_id} ended once its stream closed")
        assert over
        return "ended"


async def _live(server: Server, call_id: str, query: str = "", cookie: str | None = None) -> str:
    """Open the call's live-events websocket: "accepted", or the handshake's status."""
    url = server.url.replace("http://", "ws://") + f"/calls/{call_id}/live{query}"
    headers = {"Cookie": f"hotline_console={cookie}"} if cookie else {}
    try:
        async with connect(url, additional_headers=headers, open_timeout=10) as socket:
            await socket.recv()  # its first event: the socket is open
            return "accepted"
    except InvalidStatus as refused:
        return f"refused {refused.response.status_code}"


async def _stream_token(http: httpx.AsyncClient, wire: Wire) -> tuple[str, str]:
    asked = {"provider": wire.transport, "call_id": wire.call_id}
    response = await http.post("/phone/stream-token", json=asked, headers=AUTH)
    assert response.status_code == 200, response.text
    return str(response.json()["token"]), str(response.json()["stream_url"])


def _twilio_token(server: Server, wire: TwilioWire) -> str:
    form = {"CallSid": wire.call_id, "AccountSid": "AC" + uuid.uuid4().hex, "From": "+15550100001"}
    signature = twilio_signature(TWILIO_TOKEN, f"{server.url}/twilio/voice", form)
    answer = httpx.post(
        f"{server.url}/twilio/voice", data=form, headers={"X-Twilio-Signature": signature}
    )
    assert answer.status_code == 200, answer.text
    marker = '<Parameter name="token" value="'
    return answer.text.split(marker, 1)[1].split('"', 1)[0]


def _with(message: Message, path: tuple[str, ...], value: str) -> str:
    """`message` (JSON) with `value` set at `path`."""
    data = json.loads(message)
    inner = data
    for key in path[:-1]:
        inner = inner.setdefault(key, {})
    inner[path[-1]] = value
    return json.dumps(data)


@pytest.mark.slow
async def test_no_token_reaches_the_servers_log_on_any_path() -> None:
    server = start_server(
        {
            "HOTLINE_API_TOKEN": API_TOKEN,
            "HOTLINE_TELEPHONY__STREAM_SECRET": STREAM_SECRET,
            "HOTLINE_TELEPHONY__TWILIO_AUTH_TOKEN": TWILIO_TOKEN,
            "HOTLINE_DRAIN_TIMEOUT_S": "5",
        }
    )
    secrets = [API_TOKEN, STREAM_SECRET, TWILIO_TOKEN, WRONG_TOKEN]
    base = server.url.replace("http://", "ws://")
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
            # the bearer header, right and wrong; the token in an HTTP URL (not accepted there)
            assert (await http.get("/calls", headers=AUTH)).status_code == 200
            wrong = {"Authorization": f"Bearer {WRONG_TOKEN}"}
            assert (await http.get("/calls", headers=wrong)).status_code == 401
            assert (await http.get(f"/calls?token={API_TOKEN}")).status_code == 401
            # console sign-in, wrong then right: the cookie is a credential too
            refused = await http.post("/console/login", data={"token": WRONG_TOKEN})
            assert refused.status_code == 401
            signed_in = await http.post("/console/login", data={"token": API_TOKEN})
            assert signed_in.status_code == 303
            cookie = signed_in.cookies["hotline_console"]
            secrets.append(cookie)
            session = {"Cookie": f"hotline_console={cookie}"}
            http.cookies.clear()  # the session goes only where the test sends it
            console = await http.get("/console", headers=session)
            assert console.status_code == 200 and "Hotline console" in console.text

            # Telnyx: a stream token in the stream URL; while the call is live, its events
            # watched with ?token= (right and wrong) and with the console's cookie
            telnyx = TelnyxWire()
            token, url = await _stream_token(http, telnyx)
            secrets.append(token)

            async def watch() -> None:
                assert await _live(server, telnyx.call_id, f"?token={API_TOKEN}") == "accepted"
                assert await _live(server, telnyx.call_id, f"?token={WRONG_TOKEN}") == "refused 403"
                assert await _live(server, telnyx.call_id, cookie=cookie) == "accepted"

            assert await _call(server, url, telnyx, telnyx.opening(), watch) == "ended"
            assert await _call(server, url, telnyx, telnyx.opening()) == "closed 1008"  # used

            # Vonage: a token in the URL, and another in the `token` header (its first message)
            vonage = VonageWire()
            token, url = await _stream_token(http, vonage)
            secrets.append(token)
            assert await _call(server, url, vonage, vonage.opening()) == "ended"
            by_header = VonageWire()
            token, _ = await _stream_token(http, by_header)
            secrets.append(token)
            opening: list[Message] = [_with(by_header.opening()[0], ("token",), token)]
            assert await _call(server, base + "/vonage/stream", by_header, opening) == "ended"

            # Twilio: the signed webhook's <Parameter name="token">, given back at `start`
            twilio = TwilioWire()
            token = _twilio_token(server, twilio)
            secrets.append(token)
            connected, start = twilio.opening()
            opening = [connected, _with(start, ("start", "customParameters", "token"), token)]
            assert await _call(server, base + "/twilio/stream", twilio, opening) == "ended"

            signed_out = await http.post("/console/logout", headers=session)
            assert signed_out.status_code == 303
    finally:
        stop_server(server)
    await logged(server, "Finished server process", since=WHOLE_LOG)  # the whole log was read
    log = "\n".join(server.log)
    leaked = [secret for secret in secrets if secret in log]
    assert not leaked, f"{len(leaked)} of {len(secrets)} secrets in the log: {leaked}"
    # the log shows every path, with the tokens redacted; the access log is on
    for line in (
        '"GET /calls HTTP/1.1" 200',
        '"GET /calls?token=[redacted] HTTP/1.1" 401',
        '"WebSocket /telnyx/stream?token=[redacted]" [accepted]',
        '"WebSocket /vonage/stream?token=[redacted]" [accepted]',
        "refused: stream token already used",
        "console: wrong token from 127.0.0.1",
        "console: signed out from",
    ):
        assert line in log, line
    # the live socket's path as the client sent it: the call id raw or percent-encoded (':'),
    # as websockets' version has it
    for outcome in ("[accepted]", "403"):
        lines = [
            f'"WebSocket /calls/{form}/live?token=[redacted]" {outcome}'
            for form in (telnyx.call_id, quote(telnyx.call_id))
        ]
        assert any(line in log for line in lines), lines
    assert "uvicorn.access" in log

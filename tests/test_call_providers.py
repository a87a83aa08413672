"""Whole phone calls through the Telnyx and Vonage routes, and bad input on every phone route.

A small scripted test phone plays the provider's part: the start message(s), one 20 ms frame of
caller audio every 20 ms of the absolute clock (the phone's own timeline), every mark (Vonage:
notify) echoed as soon as it arrives, and the provider's hang-up. What differs between providers
is only the shape of the messages, which a `Wire` per provider builds and reads (sample shapes
as in tests/test_protocols.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from pipeline.sentences import SentenceSplitter
from tests.support.marks import assert_heard
from tests.support.poll import PollTimeout, until
from tests.support.provider_phone import TestPhone
from tests.support.providers import TelnyxWire, TwilioWire, VonageWire, Wire
from tests.support.server import Server
from tests.support.speech import utterance, words

pytestmark = pytest.mark.slow

FIRST = "Please book a table for two people tonight."
SECOND = "Wait, actually I want a table for four."
SHORT = "Hello, is anyone there?"
# The caller: espeak-ng's en-us voice at 150 wpm, as since these calls were written.
VOICE, WPM = "en-us", 150


def pieces(text: str) -> list[str]:
    """A reply's text as the server speaks it: one piece per TTS call, each followed by a mark
    (the server's sentence splitter, default settings, as the test server runs it)."""
    splitter = SentenceSplitter()
    return splitter.push(text) + splitter.flush()


# The providers' wires (tests/support/providers.py) by name, for the parametrized tests.
WIRES: dict[str, Callable[[], Wire]] = {
    "twilio": TwilioWire,
    "telnyx": TelnyxWire,
    "vonage": VonageWire,
}


# -- the server's side -----------------------------------------------------------------------


def ws_url(server: Server, wire: Wire) -> str:
    return server.url.replace("http://", "ws://") + wire.route


async def call_detail(server: Server, call_id: str) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=10) as http:
        response = await http.get(f"{server.url}/calls/{quote(call_id, safe='')}")
    response.raise_for_status()
    detail: dict[str, Any] = response.json()
    return detail


async def call_when(
    server: Server,
    call_id: str,
    what: str,
    test: Callable[[dict[str, Any]], bool],
    within_s: float = 30.0,
) -> dict[str, Any]:
    """GET /calls/{id} once `test` holds (a 404 while the call is not registered yet is waited
    out); fails after `within_s` with the last detail seen."""
    seen: list[dict[str, Any]] = [{}]

    async def check() -> dict[str, Any]:
        seen[0] = await call_detail(server, call_id)
        return seen[0] if test(seen[0]) else {}

    try:
        return await until(
            check, f"call {call_id}: {what}", within_s, 0.25, ignoring=(httpx.HTTPStatusError,)
        )
    except PollTimeout as timeout:
        raise AssertionError(f"{timeout}; its detail: {seen[0]}") from None


async def log_mentions(
    server: Server, since: int, route: str, fragments: list[str], within_s: float = 10.0
) -> None:
    """Wait until the server's log, from line `since`, has a bad-message line for `route` with
    each fragment in it; fails with the fragments still missing."""

    def missing() -> list[str]:
        lines = [line for line in server.log[since:] if f"{route}: bad message #" in line]
        return [f for f in fragments if not any(f in line for line in lines)]

    try:
        await until(lambda: not missing(), f"{route}: bad messages logged", within_s)
    except PollTimeout:
        raise AssertionError(f"the server log never mentioned {missing()}") from None


def assert_no_errors_logged(server: Server, since: int) -> None:
    failures = [
        line
        for line in server.log[since:]
        if "Traceback" in line or " ERROR " in line or "Exception in ASGI" in line
    ]
    assert not failures, failures[:5]


def open_socket(server: Server, wire: Wire) -> Any:
    return connect(ws_url(server, wire), compression=None, open_timeout=10, max_size=None)


# -- 1. barge-in through the Telnyx and Vonage routes ----------------------------------------


@pytest.mark.parametrize("provider", ["telnyx", "vonage"])
async def test_a_call_with_barge_in_through_the_provider_route(
    server: Server, provider: str
) -> None:
    since = len(server.log)
    wire = WIRES[provider]()
    async with open_socket(server, wire) as socket, TestPhone(socket, wire).call() as phone:
        first = await asyncio.wait_for(phone.say(utterance(FIRST, VOICE, WPM)), 30)
        reply = await phone.wait("reply", lambda h: h.kind == "media" and h.at > first.end, 30)
        # Cut in while the reply plays: once its first sentence was echoed, 1.5 s or more in.
        mark = await phone.wait("first mark", lambda h: h.kind == "mark" and h.at > reply.at, 15)
        cut_in = max(mark.at, reply.at + 1.5)
        if cut_in > time.monotonic():
            await asyncio.sleep(cut_in - time.monotonic())  # the script's timing, not a sync
        assert not phone.after("clear", 0), "clear before the caller cut in"
        # The caller cuts in: the marks echoed until now are what it heard of the reply (each
        # echo reached the server before anything the caller says next); none after it is.
        phone.hold_echoes()
        heard_marks = [name for _, name in phone.echoed]
        saying = phone.say(utterance(SECOND, VOICE, WPM))
        clear = await phone.wait("clear", lambda h: h.kind == "clear", 10)
        second = await asyncio.wait_for(saying, 30)
        new_reply = await phone.wait(
            "second reply", lambda h: h.kind == "media" and h.at > clear.at, 30
        )
        # Nothing of the old reply after the clear: the next audio (or mark) answers the second
        # utterance, so it cannot come before the caller finished saying it.
        after_clear = phone.after("media", clear.at) + phone.after("mark", clear.at)
        first_after_clear = min(after_clear, key=lambda h: h.at)
        assert first_after_clear.at > second.end, "old reply after the clear"
        assert first_after_clear is new_reply
        await call_when(
            server, wire.call_id, "two turns", lambda d: len(d["records"]) >= 2, within_s=40
        )
    assert not phone.after("other", 0), [h.raw for h in phone.after("other", 0)][:3]
    assert phone.echoed, "the server sent marks"

    detail = await call_when(server, wire.call_id, "ended", lambda d: d["state"] == "ended")
    assert detail["transport"] == provider
    records = detail["records"]
    for record in records:
        print(record["caller_text"], "|", record["reply_text"], "|", record["interrupted"])
    assert len(records) == 2
    first_turn, second_turn = records
    assert first_turn["interrupted"]
    # The history holds exactly the pieces whose marks the caller echoed before it cut in: not
    # one more (a mark sent but not echoed was not heard), not one fewer.
    first_marks = [h.name for h in phone.heard if h.kind == "mark" and h.at < clear.at]
    assert heard_marks and heard_marks == first_marks[: len(heard_marks)], (
        heard_marks,
        first_marks,
    )
    fillers = int(first_turn["reply_fillers"])  # a loaded voice's "Um,": an end mark, no piece
    spoken = pieces(first_turn["generated_text"])
    assert_heard(heard_marks, spoken, first_turn["reply_text"], fillers)
    assert words(second_turn["caller_text"]) & {"four", "4", "table"}
    assert not second_turn["interrupted"]
    assert_no_errors_logged(server, since)


# -- 2. bad input on every phone route -------------------------------------------------------


@pytest.mark.parametrize("provider", ["twilio", "telnyx", "vonage"])
async def test_bad_input_is_logged_and_the_route_keeps_serving(
    server: Server, provider: str
) -> None:
    began = since = len(server.log)
    route = WIRES[provider]().route

    # Junk before the start message: each one logged and ignored; a flood closes with 1008.
    wire = WIRES[provider]()
    async with open_socket(server, wire) as socket:
        junk = wire.bad_before_start()
        for message in junk.values():
            await socket.send(message)
        await log_mentions(server, since, route, list(junk))
        with contextlib.suppress(ConnectionClosed):
            for _ in range(250):
                await socket.send("not JSON at all")
        await asyncio.wait_for(socket.wait_closed(), 10)
        assert socket.close_code == 1008
    await log_mentions(server, since, route, ["#200 ignored: not JSON"])

    # A call with junk in it: ignored, the turn is recorded; an oversized frame closes it (1009)
    # and the call ends with its turn kept.
    since = len(server.log)
    wire = WIRES[provider]()
    async with open_socket(server, wire) as socket, TestPhone(socket, wire).call() as phone:
        junk = wire.bad_in_call()
        for message in junk.values():
            await phone.send(lambda message=message: message)
        await log_mentions(server, since, route, list(junk))
        await asyncio.wait_for(phone.say(utterance(SHORT, VOICE, WPM)), 30)
        await call_when(server, wire.call_id, "one turn", lambda d: len(d["records"]) == 1)
        # The phone sends nothing after the oversized frame: uvicorn answers it with its close
        # frame and shuts the socket at once, the rest of the frame unread, which resets the
        # connection; a write of ours after the reset (the next 20 ms of audio) would drop the
        # close frame unread (the 1006 once seen in CI).
        await phone.send_last(wire.oversized)
        await asyncio.wait_for(phone.closed.wait(), 10)
        assert socket.close_code == 1009, (socket.close_code, socket.close_reason)
    detail = await call_when(server, wire.call_id, "ended", lambda d: d["state"] == "ended")
    assert detail["transport"] == provider
    assert len(detail["records"]) == 1 and detail["records"][0]["reply_text"]
    assert words(detail["records"][0]["caller_text"]) & {"hello", "anyone", "there"}

    # The route still serves: a normal call gets a reply; the socket then closes without stop.
    async with httpx.AsyncClient(timeout=10) as http:
        health = await http.get(f"{server.url}/healthz")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    wire = WIRES[provider]()
    async with open_socket(server, wire) as socket, TestPhone(socket, wire).call(False) as phone:
        spoken = await asyncio.wait_for(phone.say(utterance(SHORT, VOICE, WPM)), 30)
        await phone.wait("reply", lambda h: h.kind == "media" and h.at > spoken.end, 30)
    detail = await call_when(server, wire.call_id, "ended", lambda d: d["state"] == "ended")
    assert detail["transport"] == provider
    assert_no_errors_logged(server, began)

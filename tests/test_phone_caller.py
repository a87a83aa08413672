"""The faithful Twilio caller against scripted servers: real websockets on loopback.

Each server plays Hotline's part by script, parsing the phone's messages with `TwilioProtocol`.
Times are never asserted; the phone's own 20 ms media messages serve as the clock when an order
has to be checked ("the echo came after N more frames").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

import httpx
import numpy as np
import pytest
import uvicorn
from fastapi import FastAPI, Request, Response
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from tests.support.speech import concat, silence
from voice.audio import rms
from voice.devtools.twilio_call import place_twilio_call
from voice.transports.phone.twilio import (
    TwilioProtocol,
    reject_twiml,
    signature_is_valid,
    stream_twiml,
)
from voice.transports.phone.wire import Media, Start, WireEvent

AUDIBLE = 300.0


def tone(ms: int, rate: int = 16_000, level: int = 6000) -> np.ndarray:
    t = np.arange(rate * ms // 1000) / rate
    return np.round(level * np.sin(2 * np.pi * 440 * t)).astype(np.int16)


def tone_turn(ms: int = 400) -> np.ndarray:
    """A caller's turn that is no speech: `ms` of 440 Hz tone between 100 ms silences (these
    scripted servers only need something audible, of a known length)."""
    return concat(silence(100), tone(ms), silence(100))


class Line:
    """The server's end of one stream: parses what the phone sends, sends by script."""

    def __init__(self, websocket: ServerConnection) -> None:
        self.websocket = websocket
        self.protocol = TwilioProtocol()
        self.messages: list[dict[str, Any]] = []
        self.start: Start | None = None
        self.frames_received = 0  # the phone's media messages: its 20 ms clock
        self.notes: dict[str, Any] = {}

    async def receive(self) -> tuple[dict[str, Any], list[WireEvent]]:
        raw = await self.websocket.recv()
        events = self.protocol.parse(raw)
        message = json.loads(raw)
        self.messages.append(message)
        for event in events:
            if isinstance(event, Start):
                self.start = event
            if isinstance(event, Media):
                self.frames_received += 1
        return message, events

    async def next_event(self, name: str, within_s: float = 10.0) -> dict[str, Any]:
        """The next message of event `name` the phone sends (a read, not a poll: each message
        is read once, in order); fails after `within_s` with the events read meanwhile."""
        read: list[str] = []
        try:
            async with asyncio.timeout(within_s):
                while True:
                    message, _ = await self.receive()
                    if message["event"] == name:
                        return message
                    read.append(str(message["event"]))
        except TimeoutError:
            raise AssertionError(
                f"no {name!r} from the phone within {within_s:g} s; it sent {Counter(read)}"
            ) from None

    async def until_frames(self, count: int) -> None:
        target = self.frames_received + count
        while self.frames_received < target:
            await self.receive()

    async def speech_end(self, quiet_frames: int = 3) -> None:
        """Receive until the phone has spoken and then sent `quiet_frames` silent frames."""
        voiced, quiet = False, 0
        while not (voiced and quiet >= quiet_frames):
            _, events = await self.receive()
            for event in events:
                if isinstance(event, Media):
                    loud = rms(event.pcm) > AUDIBLE
                    voiced, quiet = voiced or loud, 0 if loud else quiet + 1

    async def speech_start(self) -> None:
        while True:
            _, events = await self.receive()
            if any(isinstance(e, Media) and rms(e.pcm) > AUDIBLE for e in events):
                return

    async def play(self, frames: int) -> None:
        """Send `frames` 20 ms frames of tone at once, as a server with audio ready does."""
        audio = tone(20 * frames, rate=8000)
        for i in range(frames):
            await self.websocket.send(self.protocol.media(audio[i * 160 : (i + 1) * 160]))

    async def mark(self, name: str) -> None:
        await self.websocket.send(self.protocol.mark(name))

    async def clear(self) -> None:
        await self.websocket.send(self.protocol.clear())


Script = Callable[[Line], Awaitable[None]]


@dataclass
class Switch:
    url: str
    lines: list[Line] = field(default_factory=list)


@contextlib.asynccontextmanager
async def scripted_server(script: Script) -> AsyncIterator[Switch]:
    """A websocket server on a free loopback port running `script` for each connection, then
    reading whatever else the phone sends until it hangs up."""
    failures: list[BaseException] = []
    switch = Switch("")

    async def answer(websocket: ServerConnection) -> None:
        line = Line(websocket)
        switch.lines.append(line)
        try:
            await script(line)
            while True:
                await line.receive()
        except ConnectionClosed:
            pass
        except BaseException as failure:  # reported by the test, not lost in the server
            failures.append(failure)
            await websocket.close()

    async with serve(answer, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        switch.url = f"ws://127.0.0.1:{port}/twilio/stream"
        yield switch
    if failures:
        raise failures[0]


def audible_frames(playback: list[tuple[float, bool]], after: float = float("-inf")) -> int:
    return sum(1 for at, audible in playback if audible and at > after)


async def test_a_mark_comes_back_only_once_the_audio_before_it_has_played() -> None:
    async def script(line: Line) -> None:
        await line.speech_end()
        await line.play(25)  # 500 ms, all at once
        await line.mark("reply-1")
        before = line.frames_received
        line.notes["echo"] = await line.next_event("mark")
        line.notes["frames_until_echo"] = line.frames_received - before

    async with scripted_server(script) as switch:
        result = await place_twilio_call(switch.url, [tone_turn()], reply_timeout_s=5, quiet_s=0.3)

    line = switch.lines[0]
    print(f"\nvoice-to-voice at the phone (ms): {result.turns[0].voice_to_voice_ms}")
    print(f"phone frames between the mark and its echo: {line.notes['frames_until_echo']}")
    echo = line.notes["echo"]
    assert echo["mark"] == {"name": "reply-1"} and echo["streamSid"] == result.stream_sid
    assert isinstance(echo["sequenceNumber"], str)
    assert line.notes["frames_until_echo"] >= 24  # the phone spent ~25 frames playing first
    (echoed_at, name) = result.marks_echoed[0]
    assert name == "reply-1"
    assert audible_frames(result.playback) == 25
    assert audible_frames(result.playback, after=echoed_at) == 0
    assert result.turns[0].reply_start is not None
    assert [m.event for m in result.received] == ["media"] * 25 + ["mark"]
    assert not result.violations


async def test_clear_stops_playback_and_sends_every_pending_mark_back_at_once() -> None:
    async def script(line: Line) -> None:
        await line.speech_end()
        await line.play(100)
        await line.mark("a")
        await line.play(50)
        await line.mark("b")
        await line.until_frames(10)  # about 200 ms into the reply
        await line.clear()
        before = line.frames_received
        names = [(await line.next_event("mark"))["mark"]["name"] for _ in range(2)]
        line.notes["names"] = names
        line.notes["frames_until_echoes"] = line.frames_received - before

    async with scripted_server(script) as switch:
        result = await place_twilio_call(switch.url, [tone_turn()], reply_timeout_s=5, quiet_s=0.3)

    line = switch.lines[0]
    (cleared,) = result.events_named("clear")
    played = audible_frames(result.playback)
    print(f"\nframes played before the clear: {played} of 150")
    assert line.notes["names"] == ["a", "b"]
    assert line.notes["frames_until_echoes"] <= 5  # at once, not after 140 more frames
    assert [name for _, name in result.marks_echoed] == ["a", "b"]
    assert all(at >= cleared.at for at, _ in result.marks_echoed)
    assert audible_frames(result.playback, after=cleared.at) == 0
    assert 5 <= played < 100
    assert not result.violations


async def test_barging_in_is_measured_from_speech_onset_to_silence() -> None:
    async def script(line: Line) -> None:
        await line.speech_end()
        await line.play(150)  # a 3 s reply, interrupted
        await line.mark("long")
        await line.speech_start()
        await line.clear()
        await line.speech_end()
        await line.play(10)
        await line.mark("short")

    async with scripted_server(script) as switch:
        result = await place_twilio_call(
            switch.url,
            [tone_turn(), tone_turn()],
            barge_in_after_ms=300,
            reply_timeout_s=5,
            quiet_s=0.3,
        )

    print(f"\nbarge-in: reply stopped {result.barge_in_stop_ms} ms after the caller's onset")
    print(f"voice-to-voice (ms): {[turn.voice_to_voice_ms for turn in result.turns]}")
    assert len(result.turns) == 2
    assert result.barge_in_stop_ms is not None
    assert result.turns[0].reply_stop is not None and result.turns[1].reply_start is not None
    assert [name for _, name in result.marks_echoed] == ["long", "short"]
    assert 10 < audible_frames(result.playback) < 150
    assert not result.violations


async def test_the_phone_speaks_twilios_messages_in_twilios_order() -> None:
    async def script(line: Line) -> None:
        await line.speech_end()
        await line.play(5)
        await line.mark("end")

    async with scripted_server(script) as switch:
        result = await place_twilio_call(
            switch.url,
            [tone_turn(200)],
            dtmf="12#",
            reply_timeout_s=5,
            quiet_s=0.2,
            parameters={"campaign": "spring"},
        )

    messages = switch.lines[0].messages
    assert messages[0] == {"event": "connected", "protocol": "Call", "version": "1.0.0"}
    start = messages[1]
    assert start["event"] == "start" and start["sequenceNumber"] == "1"
    body = start["start"]
    assert body["callSid"] == result.call_id and body["callSid"].startswith("CA")
    assert body["streamSid"] == start["streamSid"] == result.stream_sid
    assert body["accountSid"].startswith("AC") and len(body["accountSid"]) == 34
    assert body["tracks"] == ["inbound"]
    assert body["mediaFormat"] == {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}
    assert body["customParameters"]["campaign"] == "spring"
    assert {"from", "to"} <= set(body["customParameters"])
    numbered = messages[1:]
    assert [m["sequenceNumber"] for m in numbered] == [str(i) for i in range(1, len(numbered) + 1)]
    assert all(m["streamSid"] == result.stream_sid for m in numbered)
    media = [m["media"] for m in numbered if m["event"] == "media"]
    assert [m["chunk"] for m in media] == [str(i) for i in range(1, len(media) + 1)]
    assert all(m["track"] == "inbound" and len(m["payload"]) == 216 for m in media)  # 160 bytes
    stamps = [int(m["timestamp"]) for m in media]
    assert stamps == sorted(stamps)
    keys = [m for m in numbered if m["event"] == "dtmf"]
    assert [k["dtmf"] for k in keys] == [{"track": "inbound_track", "digit": d} for d in "12#"]
    first_reply_mark = next(i for i, m in enumerate(numbered) if m["event"] == "mark")
    assert numbered.index(keys[0]) > first_reply_mark  # keys pressed after the reply
    assert numbered[-1]["event"] == "stop"
    assert numbered[-1]["stop"] == {"accountSid": body["accountSid"], "callSid": result.call_id}


async def test_the_phone_leaves_when_the_server_hangs_up() -> None:
    async def script(line: Line) -> None:
        await line.until_frames(5)
        await line.websocket.close()

    async with scripted_server(script) as switch:
        result = await place_twilio_call(switch.url, [tone_turn(2000)], reply_timeout_s=30)
    assert switch.lines[0].frames_received >= 5
    assert result.turns == [] and result.events_named("media") == []


# -- the incoming-call webhook, as Twilio asks it ------------------------------------------

TOKEN = "twilio-auth-token"


@contextlib.asynccontextmanager
async def webhook_server(stream_url: str, busy: bool = False) -> AsyncIterator[str]:
    """A tiny webhook answering with our own TwiML, checking Twilio's signature."""
    app = FastAPI()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    base = f"http://127.0.0.1:{listener.getsockname()[1]}"

    @app.post("/twilio/voice")
    async def voice(request: Request) -> Response:
        form = dict(parse_qsl((await request.body()).decode(), keep_blank_values=True))
        signature = request.headers.get("x-twilio-signature")
        if not signature_is_valid(TOKEN, f"{base}/twilio/voice", form, signature):
            return Response("<Response/>", 403, media_type="application/xml")
        if busy:
            return Response(
                reject_twiml("Sorry, all lines are busy."), media_type="application/xml"
            )
        parameters = {"from": form["From"], "to": form["To"], "call_sid": form["CallSid"]}
        return Response(stream_twiml(stream_url, parameters), media_type="application/xml")

    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    serving = asyncio.create_task(server.serve(sockets=[listener]))
    try:
        yield base
    finally:
        server.should_exit = True
        await serving
        listener.close()


async def test_a_call_through_the_webhook_follows_its_twiml() -> None:
    async def script(line: Line) -> None:
        await line.speech_end()
        await line.play(5)

    async with scripted_server(script) as switch:
        secure = switch.url.replace("ws://", "wss://")  # what a public server would answer
        async with webhook_server(secure) as base:
            result = await place_twilio_call(
                base, [tone_turn(200)], auth_token=TOKEN, reply_timeout_s=5, quiet_s=0.2
            )
    start = switch.lines[0].start
    assert start is not None and start.call_id == result.call_id
    assert start.parameters["call_sid"] == result.call_id
    assert start.caller == start.parameters["from"] and start.callee == start.parameters["to"]
    assert result.turns[0].reply_start is not None and result.rejected is None


async def test_a_busy_webhook_turns_the_call_away_and_a_bad_signature_is_refused() -> None:
    async with webhook_server("ws://127.0.0.1:9/unused", busy=True) as base:
        result = await place_twilio_call(base, [tone_turn()], auth_token=TOKEN)
        assert result.rejected == "Sorry, all lines are busy." and not result.turns
        with pytest.raises(httpx.HTTPStatusError) as refused:
            await place_twilio_call(base, [tone_turn()], auth_token="not-the-token")
        assert refused.value.response.status_code == 403

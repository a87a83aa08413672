"""The phone transport: against a client that stops reading, and what it sends.

A real socket only blocks a sender once the kernel's buffers on both sides are full, which on
loopback takes minutes of audio; the socket here is a stand-in whose sends never complete,
which is what the server sees at that point.
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any, cast

import numpy as np
from starlette.websockets import WebSocket

from pipeline.transport import HangUp
from voice.audio import mulaw_decode, rms
from voice.transports.phone.stream import PhoneStream
from voice.transports.phone.twilio import TwilioProtocol
from voice.transports.phone.wire import Start


class StalledSocket:
    """A websocket whose peer stopped reading: every send waits forever."""

    def __init__(self) -> None:
        self.sends = 0

    async def send_text(self, message: str) -> None:
        self.sends += 1
        await asyncio.Event().wait()

    async def close(self, code: int = 1000) -> None:
        pass


async def test_a_client_that_stops_reading_is_hung_up() -> None:
    protocol = TwilioProtocol()
    protocol.stream_sid = "MZ1"
    start = Start(call_id="CA1", stream_id="MZ1", caller=None, callee=None)
    socket = StalledSocket()
    stream = PhoneStream("CA1", cast(WebSocket, socket), protocol, start, send_timeout_s=0.2)
    stream.play(np.zeros(16_000, dtype=np.int16))
    events: list[Any] = []
    async with asyncio.timeout(5):  # bounded: the send timeout is 0.2 s
        async for event in stream.inbound():
            events.append(event)
    assert events == [HangUp("client stopped reading")]
    assert socket.sends == 1  # nothing was queued behind the stalled send
    await stream.close()


class RecordingSocket:
    """A websocket whose peer reads everything at once: keeps what was sent."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    async def send_text(self, message: str) -> None:
        self.sent.append(message)

    async def close(self, code: int = 1000) -> None:
        pass


def tone(ms: int, rate: int = 16_000) -> np.ndarray:
    t = np.arange(rate * ms // 1000) / rate
    return (8000 * np.sin(2 * np.pi * 440 * t)).astype(np.int16)


async def test_each_sentence_goes_out_whole_and_opens_with_its_own_audio() -> None:
    """A reply sentence is not held back in a resampler until the next one: the second starts
    with its own first frame, not with the end of the first (which is silence in speech)."""
    protocol = TwilioProtocol()
    protocol.stream_sid = "MZ1"
    start = Start(call_id="CA1", stream_id="MZ1", caller=None, callee=None)
    socket = RecordingSocket()
    stream = PhoneStream("CA1", cast(WebSocket, socket), protocol, start, lead_s=10.0)
    first = np.concatenate([tone(200), np.zeros(1600, dtype=np.int16)])  # 100 ms silence after
    stream.play(first)
    end = stream.play(tone(200))
    async with asyncio.timeout(5):
        await stream.wait_sent(end)
    frames = [
        mulaw_decode(base64.b64decode(json.loads(m)["media"]["payload"]))
        for m in socket.sent
        if json.loads(m)["event"] == "media"
    ]
    loud = [rms(frame) > 1000 for frame in frames]
    assert len(frames) == 25  # 300 ms, then 200 ms, in 20 ms frames
    assert loud == [True] * 10 + [False] * 5 + [True] * 10
    await stream.close()

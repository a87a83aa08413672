"""The phone transport against a client that stops reading.

A real socket only blocks a sender once the kernel's buffers on both sides are full, which on
loopback takes minutes of audio; the socket here is a stand-in whose sends never complete,
which is what the server sees at that point.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import numpy as np
from starlette.websockets import WebSocket

from pipeline.transport import HangUp
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

"""The phone transport: against a client that stops reading, and what it sends.

A real socket only blocks a sender once the kernel's buffers on both sides are full, which on
loopback takes minutes of audio; the first test's socket is a stand-in whose sends never
complete, which is what the server sees at that point. Long before that, a client that stopped
reading has not echoed a mark: the last test shows it over real sockets
(tests/support/media_line.py).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import socket
import time
from typing import Any, cast

import numpy as np
import pytest
from starlette.websockets import WebSocket
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from pipeline.transport import HangUp
from tests.support.media_line import Ended, MediaLine
from tests.support.providers import TelnyxWire, TwilioWire, VonageWire, Wire
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
    sent = np.concatenate(
        [
            mulaw_decode(base64.b64decode(json.loads(m)["media"]["payload"]))
            for m in socket.sent
            if json.loads(m)["event"] == "media"
        ]
    )
    frames = np.split(sent, len(sent) // 160)  # 20 ms frames
    loud = [rms(frame) > 1000 for frame in frames]
    assert len(sent) == 25 * 160  # 300 ms, then 200 ms
    assert loud == [True] * 10 + [False] * 5 + [True] * 10
    await stream.close()


class TimedSocket(RecordingSocket):
    """Keeps when each message went, as well."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    async def send_text(self, message: str) -> None:
        self.times.append(time.monotonic())
        await super().send_text(message)


def test_reply_audio_is_paced_never_more_than_the_lead_and_a_message_ahead() -> None:
    """On the server's event loop (uvloop, whose timers fire up to a millisecond early): the
    first frames go at once, up to the lead; then each message (Twilio's: five 20 ms frames) no
    earlier than `lead_s` and one frame before its first frame plays, and every frame goes."""
    import uvloop

    lead_s, frame_s, frame_bytes = 0.1, 0.02, 160

    async def play() -> list[tuple[float, int]]:
        protocol = TwilioProtocol()
        protocol.stream_sid = "MZ1"
        start = Start(call_id="CA1", stream_id="MZ1", caller=None, callee=None)
        socket = TimedSocket()
        stream = PhoneStream("CA1", cast(WebSocket, socket), protocol, start, lead_s=lead_s)
        end = stream.play(tone(1000))
        async with asyncio.timeout(10):
            await stream.wait_sent(end)
        await stream.close()
        sent = [(t, json.loads(m)) for t, m in zip(socket.times, socket.sent, strict=True)]
        return [
            (t, len(base64.b64decode(m["media"]["payload"])))
            for t, m in sent
            if m["event"] == "media"
        ]

    messages = uvloop.run(play())
    sizes = [size for _, size in messages]
    assert sum(sizes) == 8000 and max(sizes) == 5 * frame_bytes  # 1 s, in messages of 100 ms
    assert all(size % frame_bytes == 0 for size in sizes)
    first, frames = messages[0][0], 0
    for index, (sent, size) in enumerate(messages):
        plays_at = first + frames * frame_s
        assert sent >= plays_at - lead_s - frame_s - 0.002, index
        frames += size // frame_bytes


# -- over a real socket ------------------------------------------------------------------------

PING_S = 4.0  # the server's websocket ping interval, and its pong timeout
ECHO_TIMEOUT_S = 1.0  # the stream's send timeout: how late a mark's echo may be


def noise(samples: int) -> np.ndarray:
    return np.random.default_rng(5).normal(0, 1000, samples).astype(np.int16)


class ProviderClient:
    """A provider's side: the opening, then 20 ms of caller audio every 20 ms of its own clock
    for `run_s` (or until the server has hung up), then its hang-up. `reads`: whether it reads
    what the server sends (and echoes each mark, as a provider does once the phone played it);
    if not, it never reads a byte, on a socket with a small receive buffer."""

    def __init__(self, wire: Wire, reads: bool, run_s: float) -> None:
        self.wire, self.reads, self.run_s = wire, reads, run_s
        self.echoed: list[str] = []

    async def run(self, url: str, ended: asyncio.Future[Ended]) -> None:
        host, port = url.split("//")[1].split("/")[0].split(":")
        raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if not self.reads:
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        raw.setblocking(False)
        await asyncio.get_running_loop().sock_connect(raw, (host, int(port)))
        queue = 16 if self.reads else 1  # not reading: the client's library stops at once too
        async with connect(
            url, sock=raw, compression=None, max_queue=queue, close_timeout=ECHO_TIMEOUT_S
        ) as sock:
            for message in self.wire.opening():
                await sock.send(message)
            reading = asyncio.create_task(self._read(sock)) if self.reads else None
            start = time.monotonic()
            with contextlib.suppress(ConnectionClosed):
                for n in range(round(self.run_s / 0.02)):
                    if ended.done():
                        break
                    delay = start + n * 0.02 - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)  # the phone's clock, not a wait for the server
                    await sock.send(self.wire.media(noise(self.wire.frame_samples)))
                stop = self.wire.hang_up()
                if stop is not None:
                    await sock.send(stop)
            if reading is not None:
                reading.cancel()

    async def _read(self, sock: ClientConnection) -> None:
        with contextlib.suppress(ConnectionClosed):
            async for raw in sock:
                heard = self.wire.read(raw, time.monotonic())
                if heard.kind == "mark":
                    await sock.send(self.wire.echo(heard.name))
                    self.echoed.append(heard.name)


@pytest.mark.slow
async def test_a_client_that_stops_reading_is_hung_up_long_before_the_ping_timeout() -> None:
    """Half a second of reply, then its mark: a client that never reads never echoes it, and is
    hung up `ECHO_TIMEOUT_S` after the reply should have played; the server's buffers would
    have taken it all, and the websocket ping (PING_S, then PING_S for the pong) came later.
    A client that reads and echoes is not hung up."""
    line = MediaLine(
        idle_s=None,
        send_timeout_s=ECHO_TIMEOUT_S,
        reply=tone(500),
        ping_interval_s=PING_S,
        ping_timeout_s=PING_S,
    )
    deaf = [
        ProviderClient(wire(), False, 4 * PING_S) for wire in (TwilioWire, TelnyxWire, VonageWire)
    ]
    hearing = [
        ProviderClient(wire(), True, 3 * ECHO_TIMEOUT_S) for wire in (TwilioWire, VonageWire)
    ]
    clients = deaf + hearing
    async with line.serving():
        ends = [line.ended(c.wire.call_id) for c in clients]
        running = [
            asyncio.create_task(c.run(line.base + c.wire.route, end))
            for c, end in zip(clients, ends, strict=True)
        ]
        async with asyncio.timeout(3 * PING_S):  # past the ping timeout: the old behaviour fails
            ended = await asyncio.gather(*ends)
            await asyncio.gather(*running)
    reasons = {
        f"{c.wire.transport} reads={c.reads}": e.reason for c, e in zip(clients, ended, strict=True)
    }
    assert reasons == {
        "twilio reads=False": "client stopped reading",
        "telnyx reads=False": "client stopped reading",
        "vonage reads=False": "client stopped reading",
        "twilio reads=True": "stop: stream stopped",
        "vonage reads=True": "socket closed",  # Vonage has no stop message: the socket closes
    }
    for client, end in zip(deaf, ended[: len(deaf)], strict=True):
        took = end.at - line.started[client.wire.call_id]
        assert took < PING_S, took  # before the first ping went out, let alone its timeout
    # 500 ms of reply: a mark at 200 and 400 ms, and at its end
    echoed = ["hotline-1-part", "hotline-2-part", "hotline-3"]
    assert all(client.echoed == echoed for client in hearing)

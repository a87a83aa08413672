"""Idle means no audio: a trickle of tiny or all-zero frames does not hold a line.

Phone streams (Twilio, Telnyx, Vonage) over real websockets to a real uvicorn in this process,
run as the phone route runs them (tests/support/media_line.py); SIP calls as `SipMedia` over a
real RTP session on loopback. Every client runs concurrently, on its own clock, for a bounded
number of frames; the test waits for each call's hang-up with a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from pipeline.transport import HangUp, InboundEvent
from tests.support.media_line import Ended, MediaLine
from tests.support.providers import TelnyxWire, TwilioWire, VonageWire, Wire
from voice.audio import mulaw_encode
from voice.transports.sip.media import SipMedia
from voice.transports.sip.rtp import G711, RtpPacket, RtpSession, open_rtp_session

pytestmark = pytest.mark.slow  # real time: each call runs past a 1 s idle timeout

IDLE_S = 1.0
IDLE_REASON = f"no audio for {IDLE_S:.0f} s"
RUN_S = 3 * IDLE_S  # how long a client goes on sending (a trickler is hung up long before)
RNG = np.random.default_rng(9)


def noise(samples: int) -> np.ndarray:
    """Audio that is not silence: what a line carries even when nobody speaks."""
    return RNG.normal(0, 1000, samples).astype(np.int16)


async def pace_to(at: float) -> None:
    """The client's own clock (pacing what it sends), not a wait for the server: sleep until
    monotonic time `at`."""
    delay = at - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


@dataclass
class Client:
    """A phone provider's side that sends `frame()` every `every_s` (and reads what it gets)."""

    name: str
    wire: Wire
    frame: Callable[[], np.ndarray]
    every_s: float
    hangs_up: bool = False  # after run_s, as the provider does when the caller hangs up
    run_s: float = RUN_S

    async def run(self, line: MediaLine) -> None:
        async with connect(line.base + self.wire.route, compression=None) as sock:
            for message in self.wire.opening():
                await sock.send(message)
            reading = asyncio.create_task(self._read(sock))
            start = time.monotonic()
            with contextlib.suppress(ConnectionClosed):
                for n in range(round(self.run_s / self.every_s)):
                    await pace_to(start + n * self.every_s)
                    await sock.send(self.wire.media(self.frame()))
                if self.hangs_up:
                    stop = self.wire.hang_up()
                    if stop is not None:
                        await sock.send(stop)
        await reading

    async def _read(self, sock: ClientConnection) -> None:
        with contextlib.suppress(ConnectionClosed):
            async for _ in sock:
                pass


def phone_clients() -> list[Client]:
    clients = []
    for wire_type in (TwilioWire, TelnyxWire, VonageWire):
        rate = wire_type.wire_rate
        frame = wire_type.frame_samples
        clients += [
            # one sample: a 1-byte μ-law frame (Twilio, Telnyx), 2 bytes of L16 (Vonage)
            Client("one sample every 0.1 s", wire_type(), partial(noise, 1), 0.1),
            Client("2 ms every 0.1 s", wire_type(), partial(noise, rate // 500), 0.1),
            Client("zeros every 20 ms", wire_type(), partial(np.zeros, frame, np.int16), 0.02),
            Client("20 ms of audio every 20 ms", wire_type(), partial(noise, frame), 0.02, True),
        ]
    # 20 ms of audio every 0.5 s is 4% of the time: not enough to hold a line either
    clients.append(Client("20 ms of audio every 0.5 s", TwilioWire(), partial(noise, 160), 0.5))
    return clients


async def test_a_phone_stream_of_tiny_or_silent_frames_is_hung_up_one_of_audio_is_not() -> None:
    clients = phone_clients()
    line = MediaLine(idle_s=IDLE_S)
    async with line.serving():
        running = [asyncio.create_task(client.run(line)) for client in clients]
        ends = [line.ended(client.wire.call_id) for client in clients]
        async with asyncio.timeout(RUN_S + 5 * IDLE_S):  # the deadline for every hang-up
            await asyncio.gather(*running)  # a client that fails, fails the test at once
            ended: list[Ended] = await asyncio.gather(*ends)
    stayed = {"stop: ", "socket closed"}  # the client's own hang-up (Vonage has no stop)
    outcome = {
        f"{client.wire.transport}: {client.name}": "stayed"
        if end.reason.startswith("stop: ") or end.reason in stayed
        else end.reason
        for client, end in zip(clients, ended, strict=True)
    }
    assert outcome == {
        f"{client.wire.transport}: {client.name}": "stayed" if client.hangs_up else IDLE_REASON
        for client in clients
    }
    for client, end in zip(clients, ended, strict=True):
        if end.reason == IDLE_REASON:  # not before the timeout, counted from the stream's start
            assert end.at - line.started[client.wire.call_id] >= IDLE_S, client.name


async def test_reply_audio_keeps_a_line_whose_caller_sends_only_silence() -> None:
    """A caller listening on a muted phone (zeros) is there while the reply plays: the idle
    timeout counts from the reply's end."""
    reply_s = 2 * IDLE_S
    wire = TwilioWire()
    line = MediaLine(idle_s=IDLE_S, reply=noise(round(16_000 * reply_s)))
    zeros = Client("zeros", wire, lambda: np.zeros(160, np.int16), 0.02, run_s=reply_s + RUN_S)
    async with line.serving():
        running = asyncio.create_task(zeros.run(line))
        async with asyncio.timeout(zeros.run_s + 5 * IDLE_S):
            await running
            end = await line.ended(wire.call_id)
    assert end.reason == IDLE_REASON
    assert end.at - line.started[wire.call_id] >= reply_s + IDLE_S


# -- SIP ---------------------------------------------------------------------------------------


class SipCall:
    """`SipMedia` over a real RTP session, fed by a raw UDP socket playing the caller's phone."""

    def __init__(self, name: str, packet: Callable[[int], tuple[int, bytes]], every_s: float):
        self.name = name
        self.packet = packet  # frame number -> (sequence number, payload)
        self.every_s = every_s
        self.phone = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.phone.bind(("127.0.0.1", 0))
        self.phone.setblocking(False)
        self.media: SipMedia | None = None
        self.rtp: RtpSession | None = None
        self.started = 0.0

    async def open(self) -> None:
        def audio(pcm: np.ndarray, at: float) -> None:
            if self.media is not None:
                self.media.audio_in(pcm, at)

        self.rtp = await open_rtp_session(
            "127.0.0.1",
            (30_000, 40_000),
            codec=G711("PCMU"),
            dtmf_payload_type=None,
            on_audio=audio,
            on_dtmf=lambda digit, at: None,
            remote=self.phone.getsockname(),
        )
        self.media = SipMedia(self.name, self.rtp, idle_timeout_s=IDLE_S)
        self.started = time.monotonic()

    async def run(self) -> None:
        assert self.rtp is not None
        start = time.monotonic()
        for n in range(round(RUN_S / self.every_s)):
            await pace_to(start + n * self.every_s)
            sequence, payload = self.packet(n)
            datagram = RtpPacket(0, sequence % 65_536, n * 160, 0x5EED, False, payload)
            self.phone.sendto(datagram.to_bytes(), ("127.0.0.1", self.rtp.local_port))

    async def hang_up(self) -> tuple[str, float]:
        """The first hang-up, and when it came (by the end of the run: "still up")."""
        assert self.media is not None
        events = self.media.inbound()

        async def first() -> InboundEvent:
            async for event in events:
                if isinstance(event, HangUp):
                    return event
            raise AssertionError("inbound ended without a hang-up")

        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(RUN_S + IDLE_S / 2 - (time.monotonic() - self.started)):
                event = await first()
                assert isinstance(event, HangUp)
                return event.reason, time.monotonic()
        return "still up", time.monotonic()

    async def close(self) -> None:
        if self.media is not None:
            await self.media.close()
        self.phone.close()


def mulaw(pcm: np.ndarray) -> bytes:
    return bytes(mulaw_encode(pcm))


async def test_sip_rtp_of_tiny_frames_or_lost_packets_is_hung_up_a_muted_phone_is_not() -> None:
    calls = [
        SipCall("one byte every 0.1 s", lambda n: (n, mulaw(noise(1))), 0.1),
        SipCall("2 ms every 0.1 s", lambda n: (n, mulaw(noise(16))), 0.1),
        # one byte a packet, each 40 sequence numbers on: the jitter buffer plays the 39 lost
        # packets between as silence, which is not the caller's audio
        SipCall("one byte every 0.1 s, 39 lost between", lambda n: (40 * n, mulaw(noise(1))), 0.1),
        SipCall("20 ms of audio every 0.5 s", lambda n: (n, mulaw(noise(160))), 0.5),
        # a muted μ-law phone: digital silence at the full rate (see voice/transports/sip/media.py)
        SipCall("zeros every 20 ms", lambda n: (n, mulaw(np.zeros(160, np.int16))), 0.02),
        SipCall("20 ms of audio every 20 ms", lambda n: (n, mulaw(noise(160))), 0.02),
    ]
    try:
        for call in calls:
            await call.open()
        sending = [asyncio.create_task(call.run()) for call in calls]
        outcomes: list[tuple[str, float]] = await asyncio.gather(*(c.hang_up() for c in calls))
        await asyncio.gather(*sending)
    finally:
        for call in calls:
            await call.close()
    reasons = {call.name: reason for call, (reason, _) in zip(calls, outcomes, strict=True)}
    assert reasons == {
        "one byte every 0.1 s": IDLE_REASON,
        "2 ms every 0.1 s": IDLE_REASON,
        "one byte every 0.1 s, 39 lost between": IDLE_REASON,
        "20 ms of audio every 0.5 s": IDLE_REASON,
        "zeros every 20 ms": "still up",
        "20 ms of audio every 20 ms": "still up",
    }
    for call, (reason, at) in zip(calls, outcomes, strict=True):
        if reason == IDLE_REASON:
            assert at - call.started >= IDLE_S, call.name

"""WebRTC transport (aiortc): inbound audio resampled to 16 kHz mono, outbound paced by the clock.

The caller's page (or `hotline call`) opens a data channel named "events"; transcripts and turn
timings are sent to it as JSON.
"""

from __future__ import annotations

import asyncio
import fractions
import json
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence

import aioice.ice
import av
import numpy as np
from aiortc import MediaStreamTrack, RTCDataChannel, RTCPeerConnection
from aiortc.jitterbuffer import JitterBuffer
from aiortc.mediastreams import MediaStreamError

from pipeline.transport import (
    FRAME_SAMPLES,
    PCM,
    SAMPLE_RATE,
    CallerAudio,
    HangUp,
    InboundEvent,
    PlaybackCleared,
    Taps,
    until_hang_up,
)
from voice.transports.positions import PositionWaiters

log = logging.getLogger(__name__)

_TIME_BASE = fractions.Fraction(1, SAMPLE_RATE)
_FRAME_S = FRAME_SAMPLES / SAMPLE_RATE


def restrict_ice_host_addresses(addresses: Sequence[str]) -> None:
    """Offer only these local addresses as ICE host candidates (aioice skips 127.0.0.1 otherwise).

    Used for loopback tests and for servers that must not advertise every interface.
    """
    chosen = list(addresses)

    def host_addresses(use_ipv4: bool = True, use_ipv6: bool = True) -> list[str]:
        return [a for a in chosen if (":" in a and use_ipv6) or (":" not in a and use_ipv4)]

    aioice.ice.get_host_addresses = host_addresses


def shorten_jitter_buffer(pc: RTCPeerConnection) -> None:
    """Hand each received audio frame on as soon as it is complete (20 ms instead of 80 ms).

    aiortc holds 4 frames back ("prefetch") in every audio receiver's jitter buffer. Its buffer
    already places late packets by sequence number and stalls on a gap whatever the prefetch,
    so holding frames back buys no robustness, only 60 ms of latency in each direction, which
    endpointing and barge-in pay for. Call after the audio transceivers exist.
    """
    for transceiver in pc.getTransceivers():
        if transceiver.kind != "audio":
            continue
        receiver = transceiver.receiver
        attribute = "_RTCRtpReceiver__jitter_buffer"
        if isinstance(getattr(receiver, attribute, None), JitterBuffer):
            setattr(receiver, attribute, JitterBuffer(capacity=16, prefetch=1))
        else:
            log.warning("aiortc's receiver changed; jitter buffer left as it is")


def take_samples(chunks: deque[PCM], count: int) -> tuple[PCM, int]:
    """The next `count` samples of `chunks` (taken off it), zero-padded; and how many were
    real samples."""
    frame = np.zeros(count, dtype=np.int16)
    filled = 0
    while filled < count and chunks:
        chunk = chunks[0]
        take = min(count - filled, int(chunk.size))
        frame[filled : filled + take] = chunk[:take]
        filled += take
        if take == chunk.size:
            chunks.popleft()
        else:
            chunks[0] = chunk[take:]
    return frame, filled


class PacedAudioTrack(MediaStreamTrack):
    """An audio track that sends one 20 ms frame of `next_frame()` per 20 ms of the clock.

    Pacing uses the absolute clock (start + pts / rate), never a sum of sleeps, as aiortc's own
    `AudioStreamTrack` does, so that a late wake-up does not accumulate into drift.
    """

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._start: float | None = None
        self._pts = 0

    def next_frame(self) -> PCM:
        """The next FRAME_SAMPLES samples to send; called once per frame, on time."""
        raise NotImplementedError

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self._start is None:
            self._start = time.monotonic()
        else:
            self._pts += FRAME_SAMPLES
            delay = self._start + self._pts / SAMPLE_RATE - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        samples = self.next_frame()
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = SAMPLE_RATE
        frame.pts = self._pts
        frame.time_base = _TIME_BASE
        return frame


class OutboundAudio(PacedAudioTrack):
    """Reply audio queued by the conversation, sent in 20 ms frames paced by the absolute clock.

    Positions count reply samples since the call started; silence sent while nothing is queued
    or while paused does not advance them (a browser plays frames as they come: what was sent
    was heard, so a pause just stops sending and a resume goes on).
    """

    def __init__(self, taps: Taps | None = None) -> None:
        super().__init__()
        self.taps = taps if taps is not None else Taps()
        self._chunks: deque[PCM] = deque()
        self._queued = 0
        self._played = 0
        self._waiters = PositionWaiters()
        self.paused = False

    @property
    def queued_samples(self) -> int:
        return self._queued

    @property
    def played_samples(self) -> int:
        return self._played

    def play(self, pcm: PCM) -> int:
        if pcm.size:
            self._chunks.append(pcm)
            self._queued += int(pcm.size)
        return self._queued

    def clear(self) -> None:
        self._chunks.clear()
        if not self.paused:
            self.taps.cut(time.monotonic())
        self.paused = False
        self._queued = self._played
        self._waiters.fail()

    def pause(self) -> None:
        if not self.paused:
            self.paused = True
            self.taps.cut(time.monotonic())

    def wait_played(self, position: int) -> asyncio.Future[float]:
        if position <= self._played or position > self._queued:
            future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
            if position <= self._played:
                future.set_result(time.monotonic())
            else:
                future.set_exception(PlaybackCleared(f"position {position} was never queued"))
            return future
        return self._waiters.add(position)

    def stop(self) -> None:
        self._waiters.fail()
        super().stop()

    def next_frame(self) -> PCM:
        if self.paused:
            return np.zeros(FRAME_SAMPLES, dtype=np.int16)
        frame, filled = take_samples(self._chunks, FRAME_SAMPLES)
        self._played += filled
        self._waiters.reach(self._played)
        if filled:
            self.taps.heard(frame[:filled], time.monotonic())
        return frame


class WebRTCTransport:
    """A `Transport` over one aiortc peer connection."""

    def __init__(
        self,
        call_id: str,
        pc: RTCPeerConnection,
        connect_timeout_s: float = 20.0,
        idle_timeout_s: float = 10.0,
    ) -> None:
        self.call_id = call_id
        self.pc = pc
        self._connect_timeout_s = connect_timeout_s
        self._idle_timeout_s = idle_timeout_s
        self.taps = Taps()
        self.outbound = OutboundAudio(self.taps)
        self._inbound: asyncio.Queue[InboundEvent] = asyncio.Queue()
        self._caller = CallerAudio(self._inbound)
        self._reader: asyncio.Task[None] | None = None
        self._channel: RTCDataChannel | None = None
        self._pending_events: list[str] = []
        self._closed = False
        pc.on("track", self._on_track)
        pc.on("datachannel", self._on_datachannel)
        pc.on("connectionstatechange", self._on_state)
        self._watchdog = asyncio.get_running_loop().call_later(
            connect_timeout_s, self._give_up_unless_connected
        )

    def _give_up_unless_connected(self) -> None:
        if self.pc.connectionState != "connected" and not self._closed:
            log.warning("call %s: caller never connected; hanging up", self.call_id)
            self._caller.put(HangUp("never connected"))

    # -- aiortc callbacks --------------------------------------------------------------------

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio" and self._reader is None:
            # Answer on the caller's own audio transceiver (as aiortc's server example does).
            self.pc.addTrack(self.outbound)
            self._reader = asyncio.create_task(self._read(track))

    def _on_datachannel(self, channel: RTCDataChannel) -> None:
        if channel.label != "events":
            return
        self._channel = channel

        def flush() -> None:
            for message in self._pending_events:
                channel.send(message)
            self._pending_events.clear()

        if channel.readyState == "open":
            flush()
        else:
            channel.on("open", flush)

    async def _on_state(self) -> None:
        state = self.pc.connectionState
        log.info("call %s: connection %s", self.call_id, state)
        if state in ("failed", "closed"):
            self._caller.put(HangUp(f"connection {state}"))

    async def _read(self, track: MediaStreamTrack) -> None:
        resampler = av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)
        wait_s = self._connect_timeout_s  # for the first packet; then RTP comes every 20 ms
        try:
            while True:
                try:
                    async with asyncio.timeout(wait_s):
                        frame = await track.recv()
                except TimeoutError:
                    log.warning("call %s: no audio for %.0f s, hanging up", self.call_id, wait_s)
                    self._caller.put(HangUp(f"no audio for {wait_s:.0f} s"))
                    return
                wait_s = self._idle_timeout_s
                assert isinstance(frame, av.AudioFrame)
                at = time.monotonic()
                for out in resampler.resample(frame):
                    pcm = out.to_ndarray().reshape(-1).astype(np.int16, copy=False)
                    self._caller.add(pcm, at)
                    self.taps.caller(pcm, at)
        except MediaStreamError:
            self._caller.put(HangUp("caller track ended"))

    # -- Transport ---------------------------------------------------------------------------

    def inbound(self) -> AsyncIterator[InboundEvent]:
        return until_hang_up(self._inbound)

    def play(self, pcm: PCM) -> int:
        return self.outbound.play(pcm)

    async def clear(self) -> None:
        self.outbound.clear()

    async def pause(self) -> None:
        self.outbound.pause()

    async def resume(self) -> None:
        self.outbound.paused = False

    @property
    def played_samples(self) -> int:
        return self.outbound.played_samples

    @property
    def queued_samples(self) -> int:
        return self.outbound.queued_samples

    async def wait_played(self, position: int) -> float:
        return await self.outbound.wait_played(position)

    async def wait_sent(self, position: int) -> float:
        # Frames leave as they are paced out; a browser plays them on arrival.
        return await self.outbound.wait_played(position)

    def send_event(self, event: dict[str, object]) -> None:
        message = json.dumps(event)
        channel = self._channel
        if channel is not None and channel.readyState == "open":
            channel.send(message)
        elif not self._closed:
            self._pending_events.append(message)

    def hang_up(self, reason: str) -> None:
        """Ask the conversation to end (server shutdown, API hang-up)."""
        self._caller.put(HangUp(reason))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._watchdog.cancel()
        self.outbound.stop()
        if self._reader is not None:
            self._reader.cancel()
        await self.pc.close()

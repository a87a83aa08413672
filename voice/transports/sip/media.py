"""A SIP call's audio as a `Transport`: RTP in (through the jitter buffer, resampled to 16 kHz),
reply audio out in 20 ms G.711 frames paced by the absolute clock, as aiortc paces its tracks.

RTP flows without pause while the call is up (silence included), as phones and trunks expect:
media timeouts and NAT bindings depend on it. A reply's first frame carries the marker bit.
The caller hears a frame as it is sent (there is no far-end playout report in plain RTP), so the
played position is the sent one; `clear()` (barge-in) drops every queued frame at once;
`pause()` sends silence instead of the queued frames until `resume()` goes on with them.
Everything here runs on the event loop: RTP arrives through the session's datagram callbacks
and leaves from one pacing task.

A call whose line carries no audio for `idle_timeout_s` is hung up (voice/transports/activity.py):
RTP that stopped, or a trickle of frames shorter than 10 ms; the silence the jitter buffer puts
in for a lost packet is not the caller's audio. A received frame of digital silence is: a muted
μ-law phone sends exact zeros at the full rate (A-law's silence is not even zero), the peer is
one the access rules let in, and the timeout is there to find a peer that is gone, not a quiet
one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable

import numpy as np

from pipeline.transport import (
    PCM,
    SAMPLE_RATE,
    CallerAudio,
    Dtmf,
    HangUp,
    InboundEvent,
    PlaybackCleared,
    Taps,
    until_hang_up,
)
from voice.audio import StreamResampler, resample
from voice.transports.activity import LineActivity
from voice.transports.positions import PositionWaiters
from voice.transports.sip.rtp import RtpSession

log = logging.getLogger(__name__)

WIRE_RATE = 8000
_FRAME_S = 0.02
_WIRE_FRAME = 160  # 20 ms at 8 kHz


class SipMedia:
    """A `Transport` over one call's `RtpSession` (which must call `audio_in` and `key_in`)."""

    def __init__(
        self,
        call_id: str,
        rtp: RtpSession,
        on_close: Callable[[], None] | None = None,
        idle_timeout_s: float | None = 30.0,
    ) -> None:
        self.call_id = call_id
        self.rtp = rtp
        self.taps = Taps()
        self._on_close = on_close
        self._idle_timeout_s = idle_timeout_s
        self._inbound: asyncio.Queue[InboundEvent] = asyncio.Queue()
        self._caller = CallerAudio(self._inbound)
        self._to_pipeline = StreamResampler(WIRE_RATE, SAMPLE_RATE)
        self._frames: deque[tuple[PCM, PCM, int]] = deque()  # (wire frame, 16 kHz, end position)
        self._queued = 0
        self._sent = 0
        self._talking = False  # the last frame sent was reply audio
        self._waiters = PositionWaiters()
        self._closed = False
        self.held = False  # the caller put us on hold: send nothing
        self.paused = False  # the caller spoke over the reply: silence until resume or clear
        self.activity = LineActivity(time.monotonic(), zeros_count=True)
        self._concealed_seen = rtp.packets_lost  # lost packets whose silence came in already
        self._sender = asyncio.create_task(self._send_loop(), name=f"rtp-{call_id}")

    # -- inbound (the RTP session's callbacks) -----------------------------------------------

    def audio_in(self, pcm8k: PCM, at: float) -> None:
        if self.rtp.packets_lost > self._concealed_seen and not pcm8k.any():
            self._concealed_seen += 1  # the jitter buffer's silence for a lost packet
        else:
            self.activity.caller_audio(pcm8k, WIRE_RATE, at)
        pcm = self._to_pipeline(pcm8k)
        if pcm.size:
            self._caller.add(pcm, at)
            self.taps.caller(pcm, at)

    def key_in(self, digit: str, at: float) -> None:
        self._caller.put(Dtmf(digit, at))

    @property
    def last_audio_at(self) -> float:
        """When the line last carried audio (the caller's, or the reply going out)."""
        return self.activity.last_audio_at

    # -- Transport ---------------------------------------------------------------------------

    def inbound(self) -> AsyncIterator[InboundEvent]:
        return until_hang_up(self._inbound)

    def play(self, pcm: PCM) -> int:
        if pcm.size == 0 or self._closed:
            return self._queued
        wire = resample(pcm, SAMPLE_RATE, WIRE_RATE)  # each sentence whole: nothing held back
        count = -(-len(wire) // _WIRE_FRAME)
        padded = np.zeros(count * _WIRE_FRAME, dtype=np.int16)
        padded[: len(wire)] = wire
        start, self._queued = self._queued, self._queued + int(pcm.size)
        after = start
        for index in range(count):
            end = start + round((index + 1) * (self._queued - start) / count)
            frame = padded[index * _WIRE_FRAME : (index + 1) * _WIRE_FRAME]
            self._frames.append((frame, pcm[after - start : end - start], end))
            after = end
        return self._queued

    async def clear(self) -> None:
        self._frames.clear()
        if not self.paused:
            self.taps.cut(time.monotonic())
        self.paused = False
        self._queued = self._sent
        self._waiters.fail()

    async def pause(self) -> None:
        if not self.paused:
            self.paused = True
            self.taps.cut(time.monotonic())

    async def resume(self) -> None:
        self.paused = False

    @property
    def played_samples(self) -> int:
        return self._sent

    @property
    def queued_samples(self) -> int:
        return self._queued

    async def wait_played(self, position: int) -> float:
        if position <= self._sent:
            return time.monotonic()
        if position > self._queued or self._closed:
            raise PlaybackCleared(f"position {position} is not queued")
        return await self._waiters.add(position)

    async def wait_sent(self, position: int) -> float:
        return await self.wait_played(position)

    def send_event(self, event: dict[str, object]) -> None:
        pass  # a phone has no screen

    def hang_up(self, reason: str) -> None:
        self._caller.put(HangUp(reason))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._sender.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._sender
        self._waiters.fail()
        self.rtp.close()
        if self._on_close is not None:
            self._on_close()

    # -- pacing ------------------------------------------------------------------------------

    async def _send_loop(self) -> None:
        start = time.monotonic()
        sent_frames = 0
        silence = np.zeros(_WIRE_FRAME, dtype=np.int16)
        while True:
            due = start + sent_frames * _FRAME_S
            now = time.monotonic()
            if due > now:
                await asyncio.sleep(due - now)
            elif now - due > 0.2:  # the loop stalled: start again from now, not a burst
                start, sent_frames = now, 0
            sent_frames += 1
            if self.held:  # on hold: the caller may send nothing, and hears nothing from us
                self.activity.in_use(now)
                continue
            idle_s = self._idle_timeout_s
            if idle_s is not None and self.activity.idle_for(now) > idle_s:
                log.warning(
                    "call %s: no audio in its RTP for %.0f s (%d frames under 10 ms)",
                    self.call_id,
                    idle_s,
                    self.activity.not_audio,
                )
                self.hang_up(f"no audio for {idle_s:.0f} s")
                self._idle_timeout_s = None
            if not self._frames or self.paused:
                self._talking = False
                self.rtp.send_frame(silence)
                continue
            frame, source, end = self._frames.popleft()
            self.rtp.send_frame(frame, marker=not self._talking)
            self.activity.in_use(now)
            self._talking = True
            self.taps.heard(source, time.monotonic())
            self._sent = end
            self._waiters.reach(end)

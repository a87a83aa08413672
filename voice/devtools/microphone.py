"""A scripted caller's microphone: utterances queued, handed out one 20 ms wire frame at a time
by the phone's clock (the Twilio, Telnyx and Vonage phones of `voice.devtools.stream_phone`, and
the SIP handset of `voice.devtools.sip_caller`)."""

from __future__ import annotations

import asyncio
from collections import deque

import numpy as np

from pipeline.transport import FRAME_SAMPLES, PCM, SAMPLE_RATE
from voice.audio import StreamResampler


class Microphone:
    """Utterances (16 kHz) as 20 ms frames at `wire_rate`; silence when none is queued, or the
    line's own noise: with `noise_dbfs`, white noise of that RMS on every frame, speech and
    silence alike (a phone line is never digitally silent, and a detector hears the
    difference). Key presses queue beside them (`press`, taken by the phone with `next_key`)."""

    def __init__(self, wire_rate: int, noise_dbfs: float | None = None) -> None:
        self.wire_rate = wire_rate
        self.frame_samples = wire_rate // 50
        self._noise = None if noise_dbfs is None else 10 ** (noise_dbfs / 20) * 32768
        self._rng = np.random.default_rng()
        self._queued: deque[tuple[list[PCM], asyncio.Future[list[float]], list[float]]] = deque()
        self._keys: deque[tuple[str, asyncio.Future[None] | None]] = deque()

    @property
    def speaking(self) -> bool:
        """An utterance is queued or being sent."""
        return bool(self._queued)

    def say(self, pcm: PCM) -> asyncio.Future[list[float]]:
        """Queue an utterance (16 kHz); the future gives the time each 20 ms frame was sent."""
        narrow = StreamResampler(SAMPLE_RATE, self.wire_rate)(pcm, last=True)
        count = max(1, -(-len(pcm) // FRAME_SAMPLES))
        frames = [np.zeros(self.frame_samples, dtype=np.int16) for _ in range(count)]
        for i, frame in enumerate(frames):
            piece = narrow[i * self.frame_samples : (i + 1) * self.frame_samples]
            frame[: len(piece)] = piece
        future: asyncio.Future[list[float]] = asyncio.get_running_loop().create_future()
        self._queued.append((frames, future, []))
        return future

    def next_frame(self, now: float) -> PCM:
        """The frame to send at `now` (monotonic), which is kept as its send time."""
        frame = self._next_spoken(now)
        if self._noise is None:
            return frame
        noisy = frame + self._rng.normal(0.0, self._noise, self.frame_samples)
        return np.clip(np.round(noisy), -32768, 32767).astype(np.int16)

    def _next_spoken(self, now: float) -> PCM:
        if not self._queued:
            return np.zeros(self.frame_samples, dtype=np.int16)
        frames, future, sent = self._queued[0]
        frame = frames[len(sent)]
        sent.append(now)
        if len(sent) == len(frames):
            self._queued.popleft()
            if not future.done():
                future.set_result(sent)
        return frame

    def press(self, digits: str) -> asyncio.Future[None]:
        """Queue key presses; the future is done once the phone has sent the last one."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if not digits:
            done.set_result(None)
        for i, digit in enumerate(digits):
            self._keys.append((digit, done if i == len(digits) - 1 else None))
        return done

    def next_key(self) -> tuple[str, asyncio.Future[None] | None] | None:
        """The next key to send, with the future to finish once it went (the last of a press)."""
        return self._keys.popleft() if self._keys else None

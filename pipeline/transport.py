"""The small interface every transport (WebRTC, Twilio, ...) offers to a call's `Conversation`.

Audio crossing this interface is always 16 kHz mono int16 (`SAMPLE_RATE`), in any chunk size.
Outbound positions are counted in samples since the start of the call, so that the conversation
can tell exactly which part of a reply the caller has heard.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

SAMPLE_RATE = 16_000
FRAME_SAMPLES = 320  # 20 ms
VAD_WINDOW = 512  # 32 ms: the turn detector decides on whole windows, from the call's first sample

PCM = npt.NDArray[np.int16]


@dataclass(frozen=True)
class AudioIn:
    """Caller audio: 16 kHz mono int16; `at` is `time.monotonic()` when its last sample arrived."""

    pcm: PCM
    at: float


@dataclass(frozen=True)
class Dtmf:
    """A key the caller pressed."""

    digit: str
    at: float


@dataclass(frozen=True)
class HangUp:
    """The caller (or the network) ended the call."""

    reason: str


InboundEvent = AudioIn | Dtmf | HangUp


async def until_hang_up(queue: asyncio.Queue[InboundEvent]) -> AsyncIterator[InboundEvent]:
    """A transport's inbound events from `queue`, in order, ending after the first HangUp."""
    while True:
        event = await queue.get()
        yield event
        if isinstance(event, HangUp):
            return


class CallerAudio:
    """A transport's caller audio on its way to the conversation's inbound `queue`, handed over
    when it completes one of the turn detector's windows rather than with every 20 ms frame.

    The detector decides nothing on part of a window, so a frame that does not complete one only
    woke the conversation's task for nothing: 3 of every 8 frames, and waking that task for each
    frame was 0.3-0.6 CPU-s of a lone phone call's event loop per call-minute (the loop: 1.80-1.82
    against 1.84-1.92 with a silent caller, 2.09-2.22 against 2.27-2.28 in a one-call bench).
    Windows are counted from the call's first sample, as the detector counts them, so each is
    still decided at the frame that completes it. Anything else the transport queues (`put`: a
    key, the hang-up) first takes the audio held, so the order stays the wire's.
    """

    def __init__(self, queue: asyncio.Queue[InboundEvent], window: int = VAD_WINDOW) -> None:
        self._queue = queue
        self._window = window
        self._held: list[PCM] = []
        self._samples = 0  # handed in so far
        self._at = 0.0  # when the latest of them arrived

    def add(self, pcm: PCM, at: float) -> None:
        """Caller audio (16 kHz) whose last sample arrived at `at`."""
        before = self._samples // self._window
        self._samples += int(pcm.size)
        self._held.append(pcm)
        self._at = at
        if self._samples // self._window > before:
            self.flush()

    def put(self, event: InboundEvent) -> None:
        """Queue `event` after the audio held."""
        self.flush()
        self._queue.put_nowait(event)

    def flush(self) -> None:
        """Hand over the audio held now."""
        if self._held:
            pcm = self._held[0] if len(self._held) == 1 else np.concatenate(self._held)
            self._held.clear()
            self._queue.put_nowait(AudioIn(pcm, self._at))


class AudioTap(Protocol):
    """Something that follows a call's audio as it happens (a recorder, a supervisor listening
    in). Times are `time.monotonic()`. It must return at once: it is called on the event loop."""

    def caller(self, pcm: PCM, at: float) -> None:
        """Caller audio (16 kHz) whose last sample arrived at `at`."""
        ...

    def heard(self, pcm: PCM, at: float) -> None:
        """Reply audio (16 kHz) that starts playing to the caller at `at`."""
        ...

    def cut(self, at: float) -> None:
        """Reply audio said to play from `at` on will not be heard after all (barge-in)."""
        ...


class Taps:
    """The taps on one call's audio, each told in turn; a transport owns one and reports to it."""

    def __init__(self) -> None:
        self._taps: list[AudioTap] = []

    def add(self, tap: AudioTap) -> None:
        self._taps.append(tap)

    def remove(self, tap: AudioTap) -> None:
        if tap in self._taps:
            self._taps.remove(tap)

    def __bool__(self) -> bool:
        return bool(self._taps)

    def caller(self, pcm: PCM, at: float) -> None:
        for tap in self._taps:
            tap.caller(pcm, at)

    def heard(self, pcm: PCM, at: float) -> None:
        for tap in self._taps:
            tap.heard(pcm, at)

    def cut(self, at: float) -> None:
        for tap in self._taps:
            tap.cut(at)


class PlaybackCleared(Exception):
    """Raised to whoever waits on an outbound position that `clear()` dropped."""


class Transport(Protocol):
    """What a `Conversation` needs from the wire: frames in, paced audio out, pause, flush,
    close.

    `taps` is told the call's audio as it crosses the wire both ways (recording, listen-in).
    """

    taps: Taps

    def inbound(self) -> AsyncIterator[InboundEvent]:
        """Caller audio and events, in arrival order; ends when the call ends."""
        ...

    def play(self, pcm: PCM) -> int:
        """Queue reply audio (never blocks); returns the outbound position after it."""
        ...

    async def clear(self) -> None:
        """Drop every queued sample that has not been sent yet (barge-in); ends a pause."""
        ...

    async def pause(self) -> None:
        """Go quiet at once but keep the reply: the caller may only be saying "mm-hm"
        (`pipeline.turn_taking`). The played position stays where the caller stopped hearing,
        and waiters on later positions wait on (until `resume`, or fail at `clear`)."""
        ...

    async def resume(self) -> None:
        """Play on from the played position: what the caller did not hear is sent again (phone
        streams, whose provider dropped its buffer at the pause) or sent on (SIP, WebRTC)."""
        ...

    @property
    def played_samples(self) -> int:
        """Outbound position the caller is known to have heard up to."""
        ...

    @property
    def queued_samples(self) -> int:
        """Outbound position after the last queued sample."""
        ...

    async def wait_played(self, position: int) -> float:
        """Wait until playback reaches `position`; returns the monotonic time it did.

        Raises `PlaybackCleared` if `clear()` dropped that position first.
        """
        ...

    async def wait_sent(self, position: int) -> float:
        """Wait until the audio up to `position` has left for the caller; returns when it did.

        Raises `PlaybackCleared` if `clear()` dropped that position first.
        """
        ...

    def hang_up(self, reason: str) -> None:
        """Ask the call to end: `inbound()` yields `HangUp(reason)` and finishes."""
        ...

    def send_event(self, event: dict[str, object]) -> None:
        """Best-effort notification to the caller's UI (transcripts, turn timings)."""
        ...

    async def close(self) -> None:
        """Hang up and release everything; idempotent."""
        ...

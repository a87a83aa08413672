"""The scripted callers' turn loop, shared by the WebRTC caller and the emulated Twilio phone.

`converse` speaks utterances over a `Line` (`voice.devtools.webrtc_caller`'s aiortc peer or
`voice.devtools.phone_caller`'s `TwilioPhone`) and times each turn at the caller: its onset and
end of speech from the times its frames were sent, the reply's start and stop from the frames
heard. What was heard is kept by an `Ear` as (time, audible) per 20 ms frame, which the frame
tests (`first_audible_after`, `silent_for_after`) search.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from pipeline.transport import FRAME_SAMPLES, PCM, SAMPLE_RATE
from voice.audio import resample, rms

log = logging.getLogger(__name__)

AUDIBLE_RMS = 300.0  # int16 RMS above which a received 20 ms frame counts as reply audio
FRAME_S = FRAME_SAMPLES / SAMPLE_RATE  # one 20 ms frame, in seconds
BARGE_IN_QUIET_S = 0.25  # an interrupted reply has stopped once it is silent this long
BARGE_IN_WAIT_S = 5.0  # how long an interruption waits for the reply to stop
OPENING_WAIT_S = 30.0  # how long a caller who hears out the opening waits for it
# How long a person who picks up waits to hear something before speaking anyway: a server
# that says nothing first (no notice, no greeting) costs the caller this, once.
OPENING_START_S = 3.0


def voiced_span(pcm: PCM) -> tuple[int, int]:
    """Indices of the first and last audible 20 ms frames of an utterance (its speech)."""
    loud = [
        i
        for i in range(0, max(1, len(pcm)), FRAME_SAMPLES)
        if rms(pcm[i : i + FRAME_SAMPLES]) > AUDIBLE_RMS
    ]
    if not loud:
        return 0, max(0, (len(pcm) - 1) // FRAME_SAMPLES)
    return loud[0] // FRAME_SAMPLES, loud[-1] // FRAME_SAMPLES


@dataclass
class CallerTurn:
    """One utterance and the reply it got, timed at the caller."""

    onset: float  # monotonic: first audible frame of the utterance sent
    speech_end: float  # monotonic: last audible frame sent
    reply_start: float | None = None  # first audible reply frame received after speech_end
    reply_stop: float | None = None  # reply audio went silent (for an interrupted reply)

    @property
    def voice_to_voice_ms(self) -> float | None:
        if self.reply_start is None:
            return None
        return round((self.reply_start - self.speech_end) * 1e3, 1)


@dataclass
class CallResult:
    call_id: str
    turns: list[CallerTurn]
    reply_audio: PCM  # everything received, 16 kHz mono
    events: list[dict[str, object]] = field(default_factory=list)
    barge_in_stop_ms: float | None = None  # caller onset -> reply audio stopped

    def transcripts(self, role: str) -> list[str]:
        return [
            str(e["text"])
            for e in self.events
            if e.get("type") == "transcript" and e.get("role") == role
        ]

    def records(self) -> list[dict[str, object]]:
        return [e["record"] for e in self.events if e.get("type") == "turn"]  # type: ignore[misc]


def barge_in_stop_ms(turns: Sequence[CallerTurn]) -> float | None:
    """From the interrupting (last) utterance's onset to the interrupted reply going quiet."""
    if len(turns) >= 2 and turns[-2].reply_stop is not None:
        return round((turns[-2].reply_stop - turns[-1].onset) * 1e3, 1)
    return None


FrameTest = Callable[[list[tuple[float, bool]]], float | None]


class Ear:
    """What the caller heard: the audio and when each frame was audible. Frames are kept at the
    line's own `rate` and made 16 kHz once, when `audio()` is asked for (resampling each 20 ms
    frame as it came was a tenth of a bench caller's event loop)."""

    def __init__(self, rate: int = SAMPLE_RATE) -> None:
        self.rate = rate
        self.frames: list[tuple[float, bool]] = []  # (received at, audible)
        self.chunks: list[PCM] = []
        self.changed = asyncio.Event()

    def record(self, at: float, audible: bool, pcm: PCM) -> None:
        """Keep a frame heard at `at` (its audio at the ear's rate) and wake whoever waits."""
        self.frames.append((at, audible))
        self.chunks.append(pcm)
        self.changed.set()

    def audio(self) -> PCM:
        """Everything heard, 16 kHz mono."""
        if not self.chunks:
            return np.zeros(0, dtype=np.int16)
        return resample(np.concatenate(self.chunks), self.rate, SAMPLE_RATE)

    async def wait_for(self, predicate: FrameTest, within_s: float) -> float | None:
        """Wait until `predicate(frames)` returns a time; None after `within_s` seconds."""
        try:
            async with asyncio.timeout(within_s):  # one timer for the wait, not one per frame
                while (found := predicate(self.frames)) is None:
                    self.changed.clear()
                    await self.changed.wait()
        except TimeoutError:
            return None
        return found

    async def wait_or_hang_up(
        self, predicate: FrameTest, within_s: float, hung_up: asyncio.Event
    ) -> float | None:
        """`wait_for`, cut short when the line hangs up (then the frames as they are)."""
        if hung_up.is_set():
            return predicate(self.frames)
        waiting = asyncio.ensure_future(self.wait_for(predicate, within_s))
        ended = asyncio.ensure_future(hung_up.wait())
        await asyncio.wait({waiting, ended}, return_when=asyncio.FIRST_COMPLETED)
        ended.cancel()
        if waiting.done():
            return waiting.result()
        waiting.cancel()
        return predicate(self.frames)


def first_audible_after(t: float) -> FrameTest:
    """The first audible frame heard after `t`. Like every frame test it reads the list from
    where it stopped the last time (an `Ear`'s frames only grow) and keeps what it found, so a
    caller waiting out a whole call looks at each frame once, not at every frame heard so far
    for each new one (that was quadratic in the call's length)."""
    seen = 0
    found: float | None = None

    def find(frames: list[tuple[float, bool]]) -> float | None:
        nonlocal seen, found
        while found is None and seen < len(frames):
            at, audible = frames[seen]
            seen += 1
            if at > t and audible:
                found = at
        return found

    return find


def silent_for_after(t: float, quiet_s: float) -> FrameTest:
    """The start of the first silent stretch of `quiet_s` seconds that begins after `t`."""
    seen = 0
    start: float | None = None
    found: float | None = None

    def find(frames: list[tuple[float, bool]]) -> float | None:
        nonlocal seen, start, found
        while found is None and seen < len(frames):
            at, audible = frames[seen]
            seen += 1
            if at <= t:
                continue
            if audible:
                start = None
            elif start is None:
                start = at
            elif at - start >= quiet_s:
                found = start
        return found

    return find


class Line(Protocol):
    """A caller's end of a call, as the turn loop uses it."""

    def say(self, pcm: PCM) -> Awaitable[list[float]]:
        """Speak an utterance (16 kHz); gives the time each of its 20 ms frames was sent."""
        ...

    def hear(self, predicate: FrameTest, within_s: float) -> Awaitable[float | None]:
        """Wait for `predicate` over the frames heard; None if it did not come in time (or, where
        the line can tell, the call ended first)."""
        ...

    def press(self, digits: str) -> Awaitable[None]:
        """Press keys; done once they all went."""
        ...


async def converse(
    line: Line,
    utterances: Sequence[PCM],
    turns: list[CallerTurn],
    *,
    barge_in_after_ms: float | None = None,
    dtmf: str = "",
    reply_timeout_s: float = 30.0,
    quiet_s: float = 0.8,
    opening_wait_s: float | None = None,
) -> None:
    """Speak `utterances` over `line`, one turn each, appending each turn to `turns` as it starts.

    Each utterance is spoken after the previous reply has finished (`quiet_s` of silence); with
    `opening_wait_s`, the first one too waits until what the server says first (a notice, a
    greeting) has been heard out, as a caller does, if it began within `opening_wait_s`.
    With `barge_in_after_ms`, the last utterance is spoken that long after the previous reply
    started instead, interrupting it. `dtmf` keys are pressed once a reply has finished (the
    first one waited out), or at the end if none was. Stops at the first utterance that gets no
    reply within `reply_timeout_s`.
    """
    pressed = not dtmf
    if opening_wait_s is not None:
        opened = await line.hear(first_audible_after(0.0), opening_wait_s)
        if opened is not None:
            await line.hear(silent_for_after(opened, quiet_s), OPENING_WAIT_S)
    for index, pcm in enumerate(utterances):
        interrupting = (
            barge_in_after_ms is not None and index == len(utterances) - 1 and bool(turns)
        )
        if interrupting and barge_in_after_ms is not None and turns[-1].reply_start is not None:
            delay = turns[-1].reply_start + barge_in_after_ms / 1e3 - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)  # the script's own timing, not a synchronisation
        sent = await line.say(pcm)
        first, last = voiced_span(pcm)
        turn = CallerTurn(onset=sent[first], speech_end=sent[last] + FRAME_S)
        turns.append(turn)
        if interrupting:
            stopped = silent_for_after(turn.onset, BARGE_IN_QUIET_S)
            turns[-2].reply_stop = await line.hear(stopped, BARGE_IN_WAIT_S)
        turn.reply_start = await line.hear(first_audible_after(turn.speech_end), reply_timeout_s)
        if turn.reply_start is None:
            log.warning("no reply heard within %.0f s", reply_timeout_s)
            break
        if not (barge_in_after_ms is not None and index == len(utterances) - 2):
            await line.hear(silent_for_after(turn.reply_start, quiet_s), reply_timeout_s)
            if not pressed:
                await line.press(dtmf)
                pressed = True
    if not pressed:
        await line.press(dtmf)

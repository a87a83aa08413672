"""Saying one sentence of a reply: synthesis in the voice's line, ranked by when the sentence is
needed; the reply's first chunk trimmed of piper's leading silence; the audio resampled whole to
the pipeline's rate and queued at a known outbound position (what the caller heard is read from
those positions); the reply's first audio timed as it goes out, and its gaps.

A gap is the caller hearing the reply stop between two of its sentences: the line played
everything queued before the next sentence came. Each one of `GAP_MS` or more goes into the
turn's record with what the late sentence waited on: `text` (its words came after the line ran
dry: the LLM, or a tool), `synthesis` (its words were there, its audio was not: the voice's line
under load), or `loop` (its audio was ready before the line ran dry and was queued after it).
Only the server sees this on a live call; `hotline bench` measures the same at the caller.

When the line runs dry while the next sentence's words wait for their audio (`synthesis`), the
voice says `gap_filler` ("Um,"), synthesized once per voice (by the server at startup; else at
the voice's first gap, which stays silent) and cut to its audible part, at once: under load a
sentence can come a second late, and a caller who hears a second of silence takes it for the
reply's end and talks into it. One filler a gap; none in the record's
text (the caller heard a hesitation, not words); the record counts them (`reply_fillers`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref

import numpy as np
import soxr

from pipeline.conversation_settings import ConversationSettings
from pipeline.records import TurnClock
from pipeline.replies import Spoken
from pipeline.scheduling import Urgency, urgent_in
from pipeline.services import SpeechSynthesizer
from pipeline.speculation import Gate
from pipeline.transport import PCM, SAMPLE_RATE, PlaybackCleared, Transport
from pipeline.tts import AUDIBLE, TextToSpeech, trim_leading_silence

log = logging.getLogger(__name__)

GAP_MS = 100.0  # a reply silent this long between two of its sentences has a gap (as the bench)
FILLER_TAIL_MS = 40  # of silence kept after the filler's last audible sample
# Each voice's fillers (text -> 16 kHz audio, or None while it is being made): made once per
# process, at startup (`make_filler`) or at the voice's first gap.
_FILLERS: weakref.WeakKeyDictionary[SpeechSynthesizer, dict[str, PCM | None]] = (
    weakref.WeakKeyDictionary()
)


def filler_audio(audio: PCM, rate: int) -> PCM:
    """A filler's audio at the pipeline's rate, cut to its audible part (and `FILLER_TAIL_MS`
    after it): piper ends "Um," with a comma's pause, which would hold the sentence after it."""
    audio = trim_leading_silence(audio, rate)
    loud = np.flatnonzero(np.abs(audio.astype(np.int32)) >= AUDIBLE)
    if loud.size:
        audio = audio[: int(loud[-1]) + rate * FILLER_TAIL_MS // 1000]
    return np.asarray(soxr.resample(audio, rate, SAMPLE_RATE, "HQ"), np.int16)


def make_filler(tts: TextToSpeech, text: str) -> None:
    """Make the voice's filler now, in the calling thread (the server does at startup, so that
    no call's reply waits behind its synthesis)."""
    if text:
        audio = filler_audio(tts.synthesize_blocking(text), tts.sample_rate)
        _FILLERS.setdefault(tts, {})[text] = audio if audio.size else None


class Speaker:
    """One call's voice onto its line."""

    def __init__(
        self, transport: Transport, tts: SpeechSynthesizer, settings: ConversationSettings
    ) -> None:
        self.transport, self.tts, self.settings = transport, tts, settings
        # The latest sentence queued: its end position, when it had played (None until it has:
        # the next sentence reads it to know whether the line ran dry), and who watches it play.
        self._last_end = -1
        self._last_played_at: float | None = None
        self._watch: asyncio.Task[None] | None = None
        self._clock: TurnClock | None = None  # the reply being spoken
        self._next_asked = False  # a later sentence of it has its words, not yet its audio
        self._making: set[asyncio.Task[None]] = set()  # fillers being synthesized

    async def speak(
        self, sentence: str, spoken: list[Spoken], clock: TurnClock, gate: Gate | None = None
    ) -> list[asyncio.Task[None]]:
        """Synthesize one sentence and queue it (once `gate`, if any, is open); returns the
        tasks that watch it play (cancel them when the reply ends). Synthesis follows playback:
        a sentence waits until the one `sentences_ahead` places before it has played
        (PlaybackCleared if the reply is cleared meanwhile)."""
        asked_at = time.monotonic()
        self._clock, self._next_asked = clock, bool(spoken)
        try:
            audio = await self._synthesize(sentence, spoken, clock)
        finally:
            self._next_asked = False
        synthesized_at = time.monotonic()
        if not spoken:
            audio = trim_leading_silence(audio, self.tts.sample_rate)
        # Whole, not streamed: a stream would hold back the end of each sentence (22 ms) until
        # the next, and a reply would open with the last one's.
        pcm = np.asarray(soxr.resample(audio, self.tts.sample_rate, SAMPLE_RATE, "HQ"), np.int16)
        if pcm.size == 0:
            return []
        if gate is not None:
            await gate.passed()
        start = self.transport.queued_samples
        ran_out_at = self._last_played_at if spoken and start == self._last_end else None
        end = self.transport.play(pcm)
        if ran_out_at is not None:
            self._gap(clock, time.monotonic() - ran_out_at, asked_at, synthesized_at, ran_out_at)
        spoken.append(Spoken(sentence, start, end))
        if self._watch is not None:
            self._watch.cancel()  # only the latest sentence can run dry
        self._last_end, self._last_played_at = end, None
        self._watch = asyncio.create_task(self._watch_run_out(end))
        watchers = [self._watch]
        if len(spoken) == 1:
            watchers.append(asyncio.create_task(self._watch_first_audio(start, clock)))
        return watchers

    async def _synthesize(self, sentence: str, spoken: list[Spoken], clock: TurnClock) -> PCM:
        ahead = self.settings.sentences_ahead
        if len(spoken) >= ahead:
            await self.transport.wait_played(spoken[-ahead].end)
        clock.mark("first_sentence")
        urgency = self._urgency(spoken)
        try:
            audio = await self.tts.synthesize(sentence, urgency)
        finally:
            urgency.settle()
        clock.mark("tts_first_chunk")
        return audio

    @staticmethod
    def _gap(
        clock: TurnClock, gap_s: float, asked_at: float, synthesized_at: float, ran_out_at: float
    ) -> None:
        """The line ran dry at `ran_out_at` and a sentence asked for at `asked_at`, synthesized
        at `synthesized_at`, is queued `gap_s` later: a gap, if it is long enough to hear."""
        if gap_s * 1e3 < GAP_MS:
            return
        if asked_at > ran_out_at:
            waited_on = "text"
        elif synthesized_at > ran_out_at:
            waited_on = "synthesis"
        else:
            waited_on = "loop"
        clock.gap(gap_s * 1e3, waited_on)

    async def _watch_run_out(self, end: int, fill: bool = True) -> None:
        """Note when the latest sentence (or filler) at `end` has played; if the line is dry
        then while the next sentence waits for its audio, say the filler (one a gap)."""
        with contextlib.suppress(PlaybackCleared):
            played_at = await self.transport.wait_played(end)
            if self._last_end != end:
                return
            self._last_played_at = played_at
            filler = self._filler() if fill and self._next_asked else None
            if filler is None or self.transport.queued_samples != end or self._clock is None:
                return
            filled = self.transport.play(filler)
            self._clock.fillers += 1
            self._last_end, self._last_played_at = filled, None
            self._watch = asyncio.create_task(self._watch_run_out(filled, fill=False))

    def _filler(self) -> PCM | None:
        """The voice's filler audio, if it has been made (its making begun if not)."""
        text = self.settings.gap_filler
        if not text:
            return None
        made = _FILLERS.setdefault(self.tts, {})
        if text not in made:
            made[text] = None
            task = asyncio.create_task(self._make_filler(text))
            self._making.add(task)
            task.add_done_callback(self._making.discard)
        return made[text]

    async def _make_filler(self, text: str) -> None:
        """Synthesize the filler; one that fails or says nothing leaves the voice without
        (None, logged once): its gaps stay silent."""
        try:
            audio = filler_audio(await self.tts.synthesize(text), self.tts.sample_rate)
        except Exception as error:
            log.warning("gap filler %r not synthesized (%r): gaps stay silent", text, error)
            return
        _FILLERS[self.tts][text] = audio if audio.size else None

    def _urgency(self, spoken: list[Spoken]) -> Urgency:
        """A reply's first chunk is urgent (its caller is waiting); a later sentence becomes
        urgent once the audio queued before it has less than `urgent_before_s` left to play."""
        if not spoken:
            return Urgency(True)
        left = (self.transport.queued_samples - self.transport.played_samples) / SAMPLE_RATE
        return urgent_in(left - self.settings.urgent_before_s)

    async def _watch_first_audio(self, start: int, clock: TurnClock) -> None:
        with contextlib.suppress(PlaybackCleared):
            # The first 20 ms frame of the reply has gone out once sending passes its start.
            clock.mark("first_audio", await self.transport.wait_sent(start + 1))

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
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import numpy as np
import soxr

from pipeline.conversation_settings import ConversationSettings
from pipeline.records import TurnClock
from pipeline.replies import Spoken
from pipeline.scheduling import Urgency, urgent_in
from pipeline.services import SpeechSynthesizer
from pipeline.speculation import Gate
from pipeline.transport import SAMPLE_RATE, PlaybackCleared, Transport
from pipeline.tts import trim_leading_silence

GAP_MS = 100.0  # a reply silent this long between two of its sentences has a gap (as the bench)


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

    async def speak(
        self, sentence: str, spoken: list[Spoken], clock: TurnClock, gate: Gate | None = None
    ) -> list[asyncio.Task[None]]:
        """Synthesize one sentence and queue it (once `gate`, if any, is open); returns the
        tasks that watch it play (cancel them when the reply ends). Synthesis follows playback:
        a sentence waits until the one `sentences_ahead` places before it has played
        (PlaybackCleared if the reply is cleared meanwhile)."""
        asked_at = time.monotonic()
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

    async def _watch_run_out(self, end: int) -> None:
        with contextlib.suppress(PlaybackCleared):
            played_at = await self.transport.wait_played(end)
            if self._last_end == end:
                self._last_played_at = played_at

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

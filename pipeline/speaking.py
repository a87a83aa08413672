"""Saying one sentence of a reply: synthesis in the voice's line, ranked by when the sentence is
needed; the reply's first chunk trimmed of piper's leading silence; the audio resampled whole to
the pipeline's rate and queued at a known outbound position (what the caller heard is read from
those positions); the reply's first audio timed as it goes out."""

from __future__ import annotations

import asyncio
import contextlib

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


class Speaker:
    """One call's voice onto its line."""

    def __init__(
        self, transport: Transport, tts: SpeechSynthesizer, settings: ConversationSettings
    ) -> None:
        self.transport, self.tts, self.settings = transport, tts, settings

    async def speak(
        self, sentence: str, spoken: list[Spoken], clock: TurnClock, gate: Gate | None = None
    ) -> list[asyncio.Task[None]]:
        """Synthesize one sentence and queue it (once `gate`, if any, is open); returns the
        first-audio watcher if it made one. Synthesis follows playback: a sentence waits until
        the one `sentences_ahead` places before it has played (PlaybackCleared if the reply is
        cleared meanwhile)."""
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
        end = self.transport.play(pcm)
        spoken.append(Spoken(sentence, start, end))
        if len(spoken) == 1:
            return [asyncio.create_task(self._watch_first_audio(start, clock))]
        return []

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

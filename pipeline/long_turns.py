"""Long turns transcribed while the caller speaks, so their end costs what a short turn's does.

A call's early transcriptions (at each pause, `pipeline.conversation`) used to cover the whole
turn so far, and so did the one at its end: a turn of 15-20 s of speech was transcribed from
its start after the caller stopped, which took 0.8-1.6 s on these cores (20 s of audio needs
the 30 s window, and the decoder runs once per word), against about 0.1 s for a short turn.

`LongTurns` stands between a call and its recognizer. Every transcription a call asks for ends
where the caller went quiet (a pause, or the end of the turn), so the audio up to there can be
kept as it was heard. Once a transcription covers at least `piece_s` of audio not yet kept,
its words are kept ("committed") with that audio, and from then on a transcription of audio
that begins with the kept audio decodes only what follows it: the caller's last few seconds.
The turn's text is the kept words, then the new ones. A transcription that would commit runs
to the end even when its pause is dropped (the caller spoke on): its words are what the next
one builds on. A turn shorter than `piece_s` is transcribed whole, exactly as before.

Each piece starts cold: Whisper hears its first words without the audio before them, and
tiny.en sometimes mishears a short first word ("two to lock" as "due to lock"). Giving it the
kept words as its prompt did not help (same word errors, and some pieces looped). Longer pieces
mean fewer cold starts; the piece length was chosen on human speech (Asterisk's 20 long
prompts, 8.9-25 s, phone path, tiny.en): whole turns 20 word errors in 765, last
transcription p50 814 / max 1611 ms; pieces of 2 s: 30 errors, 97 / 120 ms; 5 s: 27, 108 /
597 ms; 6 s: 21 errors, 120 / 232 ms; 8 s: 36, 164 / 758 ms (the error counts move by several
with where the cuts fall, so only the trend from 2 s to 6 s is clear).
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from pipeline.scheduling import Urgency
from pipeline.services import SpeechRecognizer
from pipeline.stt import Transcript
from pipeline.transport import SAMPLE_RATE

PIECE_S = 6.0  # the least audio a transcription must add to be kept


@dataclass(frozen=True)
class Kept:
    """The start of a turn whose words are known: its audio (a copy) and their text."""

    audio: npt.NDArray[np.int16]
    text: str
    after: Kept | None  # what this piece was transcribed after


class LongTurns:
    """A call's recognizer that transcribes long turns piece by piece (module docstring)."""

    def __init__(self, stt: SpeechRecognizer, piece_s: float = PIECE_S) -> None:
        self._stt = stt
        self._piece = round(piece_s * SAMPLE_RATE)
        self._kept: Kept | None = None

    @property
    def busy(self) -> bool:
        return self._stt.busy

    async def transcribe(
        self, audio: npt.NDArray[np.int16], urgent: bool | Urgency = True
    ) -> Transcript:
        """The words of `audio`: those already kept for its start, then a transcription of
        the rest."""
        base = self._base(audio)
        start = len(base.audio) if base is not None else 0
        if base is not None and start == len(audio):  # the turn ended where a piece was kept
            return Transcript(base.text, start / SAMPLE_RATE, 0.0, earlier_s=start / SAMPLE_RATE)
        job = asyncio.ensure_future(self._stt.transcribe(audio[start:], urgent))
        if len(audio) - start < self._piece:
            transcript = await job  # cancelled with its caller
        else:
            job.add_done_callback(functools.partial(self._keep, audio, base))
            transcript = await asyncio.shield(job)
        if base is None:
            return transcript
        return replace(
            transcript,
            text=_joined(base, transcript),
            audio_s=len(audio) / SAMPLE_RATE,
            earlier_s=start / SAMPLE_RATE,
        )

    def _base(self, audio: npt.NDArray[np.int16]) -> Kept | None:
        """The kept piece `audio` begins with (or is), if any."""
        kept = self._kept
        if kept is None:
            return None
        length = len(kept.audio)
        if len(audio) >= length and np.array_equal(audio[:length], kept.audio):
            return kept
        if len(audio) >= length:
            self._kept = None  # another turn
        return None

    def _keep(
        self, audio: npt.NDArray[np.int16], base: Kept | None, job: asyncio.Future[Transcript]
    ) -> None:
        """Keep `audio`'s words once transcribed, unless something longer built on the same
        start (or on this one) was kept meanwhile, or the turn moved on."""
        if job.cancelled() or job.exception() is not None:
            return
        current = self._kept
        if current is not base and (current is None or current.after is not base):
            return
        if current is not None and current is not base and len(current.audio) >= len(audio):
            return
        self._kept = Kept(audio.copy(), _joined(base, job.result()), base)


def _joined(base: Kept | None, transcript: Transcript) -> str:
    """The kept words, then the transcript's."""
    parts = (base.text if base is not None else "", transcript.text.strip())
    return " ".join(part for part in parts if part)

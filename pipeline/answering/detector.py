"""The answering-machine detector: feed it the callee's audio from the answer on, and early
transcripts of what it offers; it says who answered, how it knew and when.

Clock: the audio itself. Every time is in ms since the answer, counted in samples fed (20 ms
frames at 16 kHz), so a recorded opening replays exactly as the call decided it live. A
transcript is taken as arriving at the position of the audio fed so far.

Rules, in the order they can fire (defaults measured by `hotline amd-bench`):
- *beep* (any time, `tone`): a tone of 150 ms or more: a machine. Reported on its own as well
  (`BeepHeard`, `BeepEnded`), before or after any verdict, so that a voicemail message can be
  dropped after the beep. A beep after a `human` verdict revises it (`Verdict.revised`).
- *transcript*: a machine phrase ("leave a message", "after the tone", "unavailable", ...) in
  an early transcript of the opening: a machine.
- *shape*, human: a short opening (first speech to last, at most `human_max_ms`) followed by
  `human_silence_ms` of silence: a person said "Hello?" and waits. Decided 700 ms after their
  speech ends, so the greeting starts within a second of their "Hello?" without first playing
  anything. A longer opening still shorter than a greeting (`machine_min_ms`) followed by the
  longer `patient_silence_ms`: a person too ("Hello? ... Yes, this is Sam.").
- *shape*, machine: the opening has gone on for `machine_min_ms` (a greeting), unless an
  early transcript of `veto_words` words or more held no machine phrase (a person greeting at
  length: "Good afternoon, Acme Dental, this is Jordan, ..."); then a beep, a later machine
  phrase or the long silence after a person's greeting decides.
- *timeout*: no speech for `no_speech_ms`, or nothing decided by `max_ms`: unknown.

Why decide before greeting rather than greet at once and stop on a machine: a machine's first
words are often "Hi, ..." too, and a greeting spoken into a voicemail is recorded in it; 700 ms
of silence after a short "Hello?" is the pause a person leaves for the caller anyway. Measured
(`hotline amd-bench`, phone path): a short opening is decided 710–735 ms after its speech
ends, which leaves 265 ms for piper's first chunk (36–134 ms for a short sentence) to start
the greeting within a second. The one cost: a machine whose greeting is short and followed by
a pause is taken for a person until its beep revises the verdict.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import BaseModel, Field

from pipeline.answering.tone import Tone, ToneSettings, ToneTracker
from pipeline.answering.words import machine_phrase, normalise
from pipeline.transport import FRAME_SAMPLES, SAMPLE_RATE
from pipeline.vad import WINDOW, SpeechProbability

Answer = Literal["human", "machine", "unknown"]
Basis = Literal["shape", "beep", "transcript", "timeout"]
HYSTERESIS = 0.15  # a window is silent below threshold - HYSTERESIS (as `pipeline.turns`)


class AnsweringSettings(BaseModel):
    """When the opening says person, machine or cannot tell."""

    threshold: float = Field(default=0.5, gt=0, lt=1, description="Silero prob: voiced.")
    quiet_floor: int = Field(default=32, ge=0, description="As `TurnSettings.quiet_floor`.")
    min_word_ms: int = Field(default=96, ge=0, description="A shorter first sound is a click.")
    human_silence_ms: int = Field(default=700, gt=0, description="Silence after a short opening.")
    human_max_ms: int = Field(default=2000, gt=0, description="Longest short opening.")
    patient_silence_ms: int = Field(
        default=1500, gt=0, description="Silence after a longer opening that is still a person."
    )
    machine_min_ms: int = Field(default=3500, gt=0, description="An opening this long: machine.")
    no_speech_ms: int = Field(default=4000, gt=0, description="No speech by then: unknown.")
    max_ms: int = Field(default=8000, gt=0, description="Nothing decided by then: unknown.")
    listen_pause_ms: int = Field(
        default=150, gt=0, description="Silence after speech that offers it for transcription."
    )
    listen_every_ms: int = Field(
        default=1000, gt=0, description="Offer unbroken speech this often for transcription."
    )
    veto_words: int = Field(
        default=4,
        ge=0,
        description="An early transcript of this many words and no machine phrase holds back "
        "the shape's machine verdict: a person greeting at length (0: never).",
    )
    tone: ToneSettings = Field(default_factory=ToneSettings)


@dataclass(frozen=True)
class Verdict:
    """Who answered, by which rule, at `at_ms` (ms since the answer)."""

    answer: Answer
    by: Basis
    at_ms: float
    why: str
    revised: bool = False  # a beep turned an earlier `human` into `machine`


@dataclass(frozen=True)
class BeepHeard:
    """A beep started at `start_ms`; known at `at_ms` (it has lasted the tone's `min_ms`)."""

    start_ms: float
    at_ms: float
    hz: float


@dataclass(frozen=True)
class BeepEnded:
    """The beep stopped at `end_ms`: a voicemail message can start."""

    start_ms: float
    end_ms: float
    hz: float


@dataclass(frozen=True)
class OpeningSoFar:
    """The callee's audio from the answer to `at_ms` (16 kHz int16), for an early transcript
    to give back through `AnsweringMachineDetector.hear`."""

    audio: np.ndarray
    at_ms: float


AnsweringEvent = Verdict | BeepHeard | BeepEnded | OpeningSoFar


def _ms(samples: int) -> float:
    return samples * 1000 / SAMPLE_RATE


def _samples(ms: int) -> int:
    return ms * SAMPLE_RATE // 1000


class AnsweringMachineDetector:
    """One outbound call's detector. Not thread-safe; one per call."""

    def __init__(
        self,
        settings: AnsweringSettings | None = None,
        speech: Callable[[np.ndarray], float] | None = None,
    ) -> None:
        """`speech`: the probability that a 512-sample float window is speech (default
        Silero, `pipeline.vad.SpeechProbability`)."""
        self.settings = s = settings or AnsweringSettings()
        self._speech = speech or SpeechProbability(s.quiet_floor, s.threshold - HYSTERESIS)
        self._tones = ToneTracker(s.tone)
        self._tone_held = np.zeros(0, dtype=np.int16)  # the start of the tracker's next frame
        self._tape: list[np.ndarray] = []
        self._pending = np.zeros(0, dtype=np.float32)
        self.position = 0  # samples fed: the clock
        self._analysed = 0
        self._opening: int | None = None  # first voiced window of the opening
        self._speaking = False
        self._run_start = 0  # first voiced window of the current speech run
        self._silence_from = 0  # where the current silence began (when not speaking)
        self._offered = 0  # the last position offered for transcription
        self._offered_speech = 0  # speech end covered by the last offer
        self._vetoed = False  # words heard and none a machine's: length alone is no machine
        self.verdict: Verdict | None = None
        self.beep: Tone | None = None  # the first beep (end None while it sounds)

    @property
    def now_ms(self) -> float:
        return _ms(self.position)

    def push(self, frame: np.ndarray) -> list[AnsweringEvent]:
        """Feed the callee's audio (int16 16 kHz mono, any length: transports hand it over a
        detector window at a time); returns what it settled."""
        samples = np.array(frame, dtype=np.int16).reshape(-1)
        self.position += len(samples)
        events: list[AnsweringEvent] = []
        for end, piece in self._tone_frames(samples):
            tone = self._tones.push(piece, end)
            if tone is not None:
                events.extend(self._on_tone(tone))
        if self.verdict is not None:
            return events
        self._tape.append(samples)
        self._pending = np.concatenate([self._pending, samples.astype(np.float32) / 32768.0])
        while len(self._pending) >= WINDOW and self.verdict is None:
            window, self._pending = self._pending[:WINDOW], self._pending[WINDOW:]
            start = self._analysed
            self._analysed += WINDOW
            self._step(start, self._speech(window))
            verdict = self._shape(self._analysed)
            if verdict is not None:
                events.append(self._decide(verdict))
        if self.verdict is None and (offer := self._offer()) is not None:
            events.append(offer)
        return events

    def _tone_frames(self, samples: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """The tone tracker's 20 ms frames that `samples` complete, each with the position of
        its last sample (the tracker judges pairs of whole frames)."""
        held = np.concatenate([self._tone_held, samples]) if self._tone_held.size else samples
        whole = len(held) - len(held) % FRAME_SAMPLES
        self._tone_held = held[whole:]
        start = self.position - len(held)  # the position of held[0]
        return [
            (start + i + FRAME_SAMPLES, held[i : i + FRAME_SAMPLES])
            for i in range(0, whole, FRAME_SAMPLES)
        ]

    def hear(self, text: str) -> Verdict | None:
        """An early transcript of (a prefix of) the opening, arriving now; the verdict if it
        settles one. Words with no machine phrase (`veto_words` or more) hold back the
        shape's machine verdict for the rest of the call."""
        if self.verdict is not None:
            return None
        phrase = machine_phrase(text)
        if phrase is None:
            words = len(normalise(text).split())
            self._vetoed |= 0 < self.settings.veto_words <= words
            return None
        return self._decide(Verdict("machine", "transcript", self.now_ms, f'"{phrase}"'))

    def _decide(self, verdict: Verdict) -> Verdict:
        self.verdict = verdict
        self._tape, self._pending = [], np.zeros(0, dtype=np.float32)
        return verdict

    def _on_tone(self, tone: Tone) -> list[AnsweringEvent]:
        if tone.end is not None:
            if self.beep is not None and self.beep.start == tone.start:
                self.beep = tone
                return [BeepEnded(_ms(tone.start), _ms(tone.end), tone.hz)]
            return []
        if self.beep is not None:
            return []  # only the first beep is reported
        self.beep = tone
        events: list[AnsweringEvent] = [BeepHeard(_ms(tone.start), self.now_ms, tone.hz)]
        if self.verdict is None or self.verdict.answer != "machine":
            revised = self.verdict is not None
            why = f"{tone.hz:.0f} Hz tone"
            events.append(self._decide(Verdict("machine", "beep", self.now_ms, why, revised)))
        return events

    def _step(self, start: int, prob: float) -> None:
        """One 32 ms window of VAD with hysteresis; a first sound shorter than min_word_ms
        is not the opening."""
        s = self.settings
        if not self._speaking and prob >= s.threshold:
            self._speaking, self._run_start = True, start
            if self._opening is None:
                self._opening = start
        elif self._speaking and prob < s.threshold - HYSTERESIS:
            self._speaking, self._silence_from = False, start
            short = start - self._run_start < _samples(s.min_word_ms)
            if self._opening == self._run_start and short:
                self._opening = None

    def _shape(self, end: int) -> Verdict | None:
        s = self.settings
        at = _ms(end)
        if self._opening is None:
            if end >= _samples(s.no_speech_ms):
                return Verdict("unknown", "timeout", at, f"no speech in {s.no_speech_ms} ms")
            return None
        length = (end if self._speaking else self._silence_from) - self._opening
        if length >= _samples(s.machine_min_ms) and not self._vetoed:
            return Verdict("machine", "shape", at, f"opening longer than {s.machine_min_ms} ms")
        if not self._speaking:
            silence = end - self._silence_from
            short = length <= _samples(s.human_max_ms)
            if short and silence >= _samples(s.human_silence_ms):
                return Verdict("human", "shape", at, f"{_ms(length):.0f} ms, then silence")
            if silence >= _samples(s.patient_silence_ms):
                why = f"{_ms(length):.0f} ms, then a long silence"
                return Verdict("human", "shape", at, why)
        if end >= _samples(s.max_ms):
            return Verdict("unknown", "timeout", at, f"undecided at {s.max_ms} ms")
        return None

    def _offer(self) -> OpeningSoFar | None:
        """The opening so far, after each pause in speech and every listen_every_ms of
        unbroken speech."""
        s = self.settings
        if self._opening is None:
            return None
        end = self._analysed
        if self._speaking:
            due = end - max(self._offered, self._run_start) >= _samples(s.listen_every_ms)
        else:
            paused = end - self._silence_from >= _samples(s.listen_pause_ms)
            due = paused and self._silence_from > self._offered_speech
        if not due:
            return None
        self._offered = end
        self._offered_speech = end if self._speaking else self._silence_from
        return OpeningSoFar(np.concatenate(self._tape)[:end], _ms(end))

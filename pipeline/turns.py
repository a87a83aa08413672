"""Turns: Silero VAD + end-of-turn detection on the caller's 16 kHz audio.

The Silero v6 network that faster-whisper ships (`faster_whisper/assets/silero_vad_v6.onnx`) runs
under onnxruntime: one `InferenceSession` per process, shared by every call (onnxruntime's `run`
is thread-safe). Each call owns a `TurnDetector` holding its streaming state: the LSTM state
(h, c), the 64-sample context that Silero v5/v6 prepends to each 512-sample (32 ms) window, and the
samples not yet making a whole window. One window costs about 0.05–0.1 ms of CPU, so `push` may
run inline on the event loop.

Rules (VAD hysteresis as in faster-whisper): a window is voiced when prob >= threshold, silent
when prob < threshold - 0.15, and in between it keeps the current state. `SpeechStarted` fires
once `start_speech_ms` of audio has passed since the first voiced window without a silent one
(it drives barge-in). A turn ends after `end_silence_ms` of trailing silence; turns shorter than
`min_speech_ms` (first voiced window to end of last) are dropped; a turn longer than
`max_turn_s` is cut there.

Defaults chosen by measurement (200 utterances: espeak-ng, 8 voices x 130/160/200 wpm x 8
phrases with comma and sentence pauses, plus piper's joe voice). Share of single utterances split
in two, by end_silence_ms: 300: 21%, 400: 9%, 500: 4%, 600: 1.5%, 700: 0%. At 500 ms no comma pause
splits (longest seen: 448 ms, piper) and nothing spoken at 160 wpm or faster splits; the 4% left
are sentence stops ("Okay. Thanks. Goodbye") at a slow 130 wpm, not worth 200 ms more on
every turn. Endpoint delay (detected_at - speech_ended_at) = end_silence_ms + 20–28 ms (window
and frame rounding). SpeechStarted is decided 120 ms (median, max 177) of audio after the onset.
Short words span 128 ms of voiced windows at 240 wpm ("two"), so min_speech_ms = start_speech_ms
= 96 (3 windows): every SpeechStarted is then followed by exactly one TurnSegment. Clicks, white
noise (-40 to -10 dBFS), DTMF, ring-back tones, 50 Hz hum and low-passed noise bursts start no
speech at all. Cost: 0.057 ms per window, 0.04 ms per 20 ms frame; on a quiet line (below
`quiet_floor`, once Silero has heard silence) nothing: in the endpoint study Silero ran on
55% of the windows, with the same split rates or
fewer (500 ms: 6.0% against 10.0%; `SpeechProbability`, in `pipeline.vad`). On a line with noise
of its own, windows within `noise_margin` of that noise are quiet too (Silero on 41-43% of a
noisy line's windows instead of all of them).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, Field

from pipeline.transport import SAMPLE_RATE
from pipeline.turn_taking.policy import TurnPolicy
from pipeline.vad import WINDOW, SpeechProbability

RATE = SAMPLE_RATE  # Silero's rate here, the pipeline's
HYSTERESIS = 0.15


class TurnSettings(BaseModel):
    """When the caller's speech starts and when their turn is over."""

    threshold: float = Field(
        default=0.5, gt=0.0, lt=1.0, description="Silero prob for a voiced window."
    )
    min_speech_ms: int = Field(
        default=96, ge=0, description="Shorter speech is dropped (coughs, clicks)."
    )
    end_silence_ms: int = Field(
        default=500,
        gt=0,
        description="Trailing silence that ends a turn no turn model has judged (the turn "
        "model's verdict picks policy.min_delay_ms or policy.timeout_ms instead).",
    )
    start_speech_ms: int = Field(
        default=96, ge=0, description="Speech needed before SpeechStarted fires (drives barge-in)."
    )
    pre_roll_ms: int = Field(
        default=200, ge=0, description="Audio kept before the first voiced window."
    )
    post_roll_ms: int = Field(
        default=120,
        ge=0,
        description="Audio kept after the last voiced window (at most pause_ms, so that a "
        "pause offers the same audio as the turn that ends there).",
    )
    max_turn_s: float = Field(default=30.0, gt=0.0, description="A longer turn is cut here.")
    finished_silence_ms: int = Field(
        default=0,
        ge=0,
        description="Trailing silence that ends a turn whose early transcript sounds finished "
        "(a whole sentence or question; `pipeline.endpoint`), whatever the turn model says. "
        "0: off. The text rule of before the turn model; `policy.finished_words` is its "
        "successor.",
    )
    policy: TurnPolicy = Field(
        default_factory=TurnPolicy,
        description="When a pause ends the turn: the turn model's score and the early "
        "transcript pick a delay between policy.min_delay_ms and policy.timeout_ms; "
        "policy.model=false: no turn model (`pipeline.turn_taking.end_of_turn`).",
    )
    quiet_floor: int = Field(
        default=32,
        ge=0,
        description="Once the caller is silent, a window whose loudest sample is below this "
        "(int16; 32: -60 dBFS) stays silent without running Silero (0: Silero hears every "
        "window).",
    )
    noise_margin: float = Field(
        default=1.4,
        ge=0,
        description="Once the caller is silent, a window whose RMS is below this many times "
        "the line's own noise (the lowest RMS of the last 15 silent windows) also "
        "stays silent without running Silero: 1.4 is 3 dB (0: only quiet_floor).",
    )
    pause_ms: int = Field(
        default=120,
        ge=0,
        description="Trailing silence after which TurnPause offers the words so far for an "
        "early transcription (0: never). Ignored when not below end_silence_ms.",
    )


@dataclass(frozen=True)
class SpeechStarted:
    """The caller started speaking; `at` is back-dated to the first voiced window."""

    at: float


@dataclass(frozen=True)
class TurnPause:
    """The caller paused: the turn may be over. Its audio so far, for an early transcription.

    If the turn then ends with no more speech, its `TurnSegment` has the same `end_position`
    and the same audio, so a transcript of this one can stand for it.
    """

    audio: np.ndarray
    end_position: int
    speech_ended_at: float = 0.0  # start of the silence: the zero of the turn, if it ends here


@dataclass(frozen=True)
class SpeechResumed:
    """The caller spoke again after a `TurnPause`: that pause did not end the turn."""

    at: float


@dataclass(frozen=True)
class EndJudgement:
    """What was decided at the pause that ended a turn: the turn model's score (None: not
    scored) and the silence the end-of-turn policy chose (ms from the end of speech)."""

    score: float | None
    delay_ms: int


@dataclass(frozen=True)
class TurnSegment:
    """One finished caller turn."""

    audio: np.ndarray  # int16 16 kHz mono: pre-roll + speech + post-roll
    speech_started_at: float
    speech_ended_at: float  # start of the trailing silence: the zero of a turn
    detected_at: float  # when end-of-turn was decided (the `at` of the deciding chunk)
    end_position: int = 0  # samples since the call began where the speech ended
    # The judgement made at its last pause (`TurnDetector.hasten`); None: none came in time.
    judgement: EndJudgement | None = None


TurnEvent = SpeechStarted | TurnPause | SpeechResumed | TurnSegment


class _Tape:
    """Recent audio addressed by absolute sample position; old audio is dropped on request."""

    def __init__(self) -> None:
        self._chunks: list[np.ndarray] = []
        self.start = 0  # absolute position of the first kept sample
        self.end = 0  # absolute position after the last sample

    def append(self, pcm: np.ndarray) -> None:
        self._chunks.append(pcm)
        self.end += len(pcm)

    def slice(self, start: int, end: int) -> np.ndarray:
        joined = np.concatenate(self._chunks) if self._chunks else np.zeros(0, np.int16)
        self._chunks = [joined]
        lo = max(start, self.start) - self.start
        hi = min(end, self.end) - self.start
        return joined[lo:hi].copy()

    def drop_before(self, position: int) -> None:
        while self._chunks and self.start + len(self._chunks[0]) <= position:
            self.start += len(self._chunks.pop(0))


class TurnDetector:
    """One call's end-of-turn detector. Not thread-safe; use one per call."""

    def __init__(self, settings: TurnSettings | None = None) -> None:
        self.settings = settings or TurnSettings()
        self._vad = SpeechProbability(
            self.settings.quiet_floor,
            self.settings.threshold - HYSTERESIS,
            self.settings.noise_margin,
        )
        self.reset()

    def reset(self) -> None:
        """Forget all audio and state, as if the call had just begun."""
        self._vad.reset()
        self._pending = np.zeros(0, dtype=np.float32)
        self._tape = _Tape()
        self._received = 0  # samples pushed so far
        self._analysed = 0  # samples covered by whole windows so far
        self._last_at = 0.0
        self._onset: int | None = None  # first voiced window of the current candidate / turn
        self._onset_at = 0.0  # its time, fixed when SpeechStarted is emitted
        self._started = False  # SpeechStarted emitted for the current onset
        self._silence_from: int | None = None  # position where the trailing silence began
        self._paused = False  # TurnPause emitted for the current silence
        self._end_silence = self._ms(self.settings.end_silence_ms)  # for the current silence
        self._judgement: EndJudgement | None = None  # of the current silence, if judged

    def push(self, pcm: np.ndarray, at: float) -> list[TurnEvent]:
        """Feed int16 16 kHz mono audio; `at` is the monotonic time its last sample arrived."""
        samples = np.array(pcm, dtype=np.int16).reshape(-1)  # a copy: callers reuse buffers
        self._tape.append(samples)
        self._received += len(samples)
        self._last_at = at
        self._pending = np.concatenate([self._pending, samples.astype(np.float32) / 32768.0])
        events: list[TurnEvent] = []
        while len(self._pending) >= WINDOW:
            window, self._pending = self._pending[:WINDOW], self._pending[WINDOW:]
            start = self._analysed
            self._analysed += WINDOW
            event = self._step(start, self._vad(window))
            if event is not None:
                events.append(event)
        if self._onset is None:
            keep = self._analysed - self._ms(self.settings.pre_roll_ms)
            self._tape.drop_before(keep)
        return events

    def _step(self, start: int, prob: float) -> TurnEvent | None:
        s = self.settings
        end = start + WINDOW
        voiced = prob >= s.threshold
        silent = prob < s.threshold - HYSTERESIS
        if self._onset is None:
            if voiced:
                self._onset, self._silence_from, self._paused = start, None, False
                self._end_silence, self._judgement = self._ms(s.end_silence_ms), None
                return self._maybe_started(end)
            return None
        if voiced:
            resumed = self._paused
            self._silence_from = None
            self._paused = False
            self._end_silence, self._judgement = self._ms(s.end_silence_ms), None
            if resumed:
                return SpeechResumed(at=self._time_of(start))
        elif silent and self._silence_from is None:
            self._silence_from = start
        if not self._started:
            if self._silence_from is not None:  # too short to count as speech
                self._onset, self._silence_from = None, None
                return None
            return self._maybe_started(end)
        if self._silence_from is not None and end - self._silence_from >= self._end_silence:
            return self._finish(self._silence_from)
        if (
            self._silence_from is not None
            and not self._paused
            and 0 < s.pause_ms < s.end_silence_ms
            and end - self._silence_from >= self._ms(s.pause_ms)
        ):
            self._paused = True
            audio = self._segment_audio(self._silence_from)
            ended_at = self._time_of(self._silence_from)
            return TurnPause(audio, self._silence_from, ended_at)
        if end - self._onset >= self._ms(round(s.max_turn_s * 1000)):
            return self._finish(self._silence_from if self._silence_from is not None else end)
        return None

    @property
    def speech_ms(self) -> float:
        """How long the caller's current speech has gone on, in audio: from its first voiced
        window to now, or to the silence after it (0 while the caller is silent)."""
        if self._onset is None or not self._started:
            return 0.0
        end = self._silence_from if self._silence_from is not None else self._analysed
        return (end - self._onset) * 1000 / SAMPLE_RATE

    def hasten(
        self, end_position: int, end_silence_ms: int, judgement: EndJudgement | None = None
    ) -> TurnSegment | None:
        """How long the silence that began at `end_position` (if it is still going on) has to
        last to end the turn: `end_silence_ms` (at most the longer of the settings'
        end_silence_ms and policy.timeout_ms), in place of what an earlier call said (an
        answer given with more of the pause's evidence: its early transcript, the turn model's
        score). At once when it has
        lasted that long already (the segment is returned; `detected_at` is the latest audio's
        time). `judgement` (why) goes into the turn's segment, however it ends. Speech resuming
        forgets both."""
        if self._onset is None or not self._started or self._silence_from != end_position:
            return None
        self._judgement = judgement or self._judgement
        timeout = self._ms(max(self.settings.end_silence_ms, self.settings.policy.timeout_ms))
        self._end_silence = min(timeout, self._ms(end_silence_ms))
        if self._analysed - self._silence_from >= self._end_silence:
            return self._finish(self._silence_from)
        return None

    def _maybe_started(self, end: int) -> SpeechStarted | None:
        assert self._onset is not None
        if end - self._onset < self._ms(self.settings.start_speech_ms):
            return None
        self._started = True
        self._onset_at = self._time_of(self._onset)
        return SpeechStarted(at=self._onset_at)

    def _finish(self, speech_end: int) -> TurnSegment | None:
        assert self._onset is not None
        onset, s = self._onset, self.settings
        if speech_end - onset < self._ms(s.min_speech_ms):
            self._onset, self._started, self._silence_from = None, False, None
            return None
        audio = self._segment_audio(speech_end)
        judged = self._judgement if speech_end == self._silence_from else None
        self._onset, self._started, self._silence_from = None, False, None
        self._end_silence, self._judgement = self._ms(s.end_silence_ms), None
        return TurnSegment(
            audio=audio,
            speech_started_at=self._onset_at,
            speech_ended_at=self._time_of(speech_end),
            detected_at=self._last_at,
            end_position=speech_end,
            judgement=judged,
        )

    def _segment_audio(self, speech_end: int) -> np.ndarray:
        assert self._onset is not None
        s = self.settings
        return self._tape.slice(
            self._onset - self._ms(s.pre_roll_ms), speech_end + self._ms(s.post_roll_ms)
        )

    def _time_of(self, position: int) -> float:
        """Map an audio position onto the `at` clock of the latest chunk."""
        return self._last_at - (self._received - position) / RATE

    @staticmethod
    def _ms(ms: int) -> int:
        return ms * RATE // 1000

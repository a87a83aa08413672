"""The endpoint study: how often single caller turns are split in two, and how long the end of a
turn takes, with and without ending a turn early when its early transcript sounds finished.

- `PHRASES` and `SPEAKERS`: single caller turns with comma pauses and sentence stops, spoken by
  six espeak-ng voices at 130, 160 and 200 wpm and piper's joe (normal and fast): 200 turns.
- `simulate(...)`: one turn through a fresh `TurnDetector` in 20 ms frames on a simulated clock
  (its audio, then 1.5 s of silence). At each `TurnPause` the pause's audio is transcribed with
  the real `SpeechToText` (`Ear`, cached per audio) and, as the server does, when
  `sounds_finished(text)` the detector is told `hasten(...)` at the simulated moment the
  transcript arrives (the pause's time + the measured inference time).
- `run_study(...)` → `StudyReport` (`.table()` renders Markdown); `python -m
  voice.devtools.endpoint_study [-v] [--window fit|full ...]` runs it all (both windows unless
  told).

A turn is wrongly split when it yields more than one `TurnSegment`; the endpoint delay is the
last segment's `detected_at - speech_ended_at`. The results, and what they mean for
`TurnSettings.finished_silence_ms`, are in `pipeline.endpoint`. The whole run takes about 7
minutes on 2 busy cores (most of it tiny.en in the 30 s window; `--window fit` alone, about 3).
Piper's audio differs a little from one process to the next (its generator noise), which can
move a split rate by a turn; the early ends at 450-500 ms do not depend on the inference time
while it stays under about 250 ms.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, TextIO

import numpy as np

from pipeline.endpoint import sounds_finished
from pipeline.stt import STTSettings
from pipeline.transport import SAMPLE_RATE
from pipeline.turns import TurnDetector, TurnPause, TurnSegment, TurnSettings
from voice.audio import PCM, frames
from voice.devtools.wer_study import VOICES, Voice

RATE = SAMPLE_RATE
FRAME = RATE * 20 // 1000
TAIL_MS = 1500  # silence after the words (300 ms of it from `Voice.speak`)
LOUD = 1000  # a sample above this (-30 dBFS) after a pause is more speech

Window = Literal["fit", "full"]

# One caller turn each, with pauses inside: commas and sentence stops, as callers speak.
PHRASES: tuple[str, ...] = (
    "Okay. Thanks. Goodbye.",
    "I need a taxi, to the airport, at six.",
    "Yes. That's right. My number is five five five, one two three four.",
    "Hi. I'd like to book a table, for two people, tonight.",
    "No, sorry. I meant Friday. Not Thursday.",
    "Hello? Is anyone there? I can't hear you.",
    "My order never arrived. Can you check it, please?",
    "Well, let me see. Maybe around seven thirty.",
    "Sure. Go ahead. I'm listening.",
    "The card ends in four two. No, wait. Four three.",
)
ESPEAK_VOICES = ("en-us", "en-us+f3", "en-gb", "en-gb-x-rp+m3", "en-gb-scotland+f4", "en-029")
WPM = (130, 160, 200)
SPEAKERS: tuple[Voice, ...] = (
    *(Voice(f"espeak {v} {wpm}", "espeak", v, wpm) for v in ESPEAK_VOICES for wpm in WPM),
    *(v for v in VOICES if v.engine == "piper"),
)


@dataclass(frozen=True)
class Utterance:
    """One caller turn: a phrase said by a speaker."""

    voice: Voice
    text: str

    def audio(self) -> PCM:
        """The words (200 ms of silence before) and `TAIL_MS` of silence after; read-only,
        made once per process."""
        return _audio(self)


UTTERANCES: tuple[Utterance, ...] = tuple(Utterance(v, t) for v in SPEAKERS for t in PHRASES)


@functools.cache
def _audio(utterance: Utterance) -> PCM:
    speech = utterance.voice.speak(utterance.text)
    audio = np.concatenate([speech, np.zeros(RATE * (TAIL_MS - 300) // 1000, np.int16)])
    audio.flags.writeable = False
    return audio


@dataclass(frozen=True)
class Heard:
    """The early transcript of one pause."""

    text: str
    inference_s: float
    more: bool  # the caller went on speaking after this pause (it was not the end)


Transcribe = Callable[[PCM], tuple[str, float]]  # audio -> (text, inference seconds)


class Ear:
    """The server's STT (tiny.en, its default settings but the encoder `window`) for early
    transcripts, cached per pause audio: every setting of a sweep hears the same words at the
    same delay (the first measured). `transcribe` stands in for the model (tests)."""

    def __init__(self, window: Window, transcribe: Transcribe | None = None) -> None:
        self.window = window
        self.heard: dict[tuple[Utterance, int, int], Heard] = {}
        self._stt = transcribe

    def __call__(self, utterance: Utterance, pause: TurnPause) -> Heard:
        key = (utterance, pause.end_position, len(pause.audio))
        if key not in self.heard:
            text, inference_s = self._transcribe(pause.audio)
            after = utterance.audio()[pause.end_position + FRAME * 10 :]
            more = bool(np.any(np.abs(after.astype(np.int32)) > LOUD))
            self.heard[key] = Heard(text, inference_s, more)
        return self.heard[key]

    def _transcribe(self, audio: PCM) -> tuple[str, float]:
        if self._stt is None:
            from pipeline.stt import SpeechToText

            stt = SpeechToText.shared(STTSettings(window=self.window))
            stt.warm_up()

            def run(pcm: PCM) -> tuple[str, float]:
                transcript = stt.transcribe_blocking(pcm)
                return transcript.text, transcript.inference_s

            self._stt = run
        return self._stt(audio)


@dataclass(frozen=True)
class Outcome:
    """One utterance under one setting."""

    utterance: Utterance
    segments: int  # turns it was heard as (1 is right)
    delay_s: float  # endpoint delay of the last turn
    early: bool  # the last turn ended early: its transcript sounded finished
    hastened: int  # turns ended early, the last included


def simulate(
    utterance: Utterance,
    settings: TurnSettings,
    ear: Ear | None = None,
    finished: Callable[[str], bool] = sounds_finished,
) -> Outcome:
    """Feed the utterance to a fresh detector in 20 ms frames on a simulated clock; with `ear`
    and `settings.finished_silence_ms`, hasten the end of a turn whose early transcript sounds
    finished once the transcript has arrived."""
    detector = TurnDetector(settings)
    turns: list[tuple[TurnSegment, bool]] = []
    pending: tuple[float, TurnPause, Heard] | None = None  # the latest pause's transcript
    hastened: set[int] = set()  # where silences were told to end early
    hasten = ear is not None and settings.finished_silence_ms > 0
    for index, frame in enumerate(frames(utterance.audio(), FRAME)):
        at = (index + 1) * FRAME / RATE
        for event in detector.push(frame, at):
            if isinstance(event, TurnPause) and hasten and ear is not None:
                heard = ear(utterance, event)
                pending = (at + heard.inference_s, event, heard)  # the server drops older ones
            elif isinstance(event, TurnSegment):
                turns.append((event, event.end_position in hastened))
        if pending is not None and at >= pending[0]:
            _arrival, pause, heard = pending
            pending = None
            if finished(heard.text):
                hastened.add(pause.end_position)  # ends now, or later with less silence
                segment = detector.hasten(pause.end_position, settings.finished_silence_ms)
                if segment is not None:
                    turns.append((segment, True))
    last, early = turns[-1] if turns else (None, False)
    delay = float("nan") if last is None else last.detected_at - last.speech_ended_at
    return Outcome(utterance, len(turns), delay, early, sum(e for _, e in turns))


@dataclass(frozen=True)
class Setting:
    """End of turn after `end_silence_ms`, or `finished_silence_ms` when the early transcript
    (from the STT `window`) sounds finished; 0: never early."""

    end_silence_ms: int = 500
    finished_silence_ms: int = 0
    window: str = "–"

    @property
    def label(self) -> str:
        if not self.finished_silence_ms:
            return f"{self.end_silence_ms} ms"
        return f"{self.end_silence_ms} ms, finished {self.finished_silence_ms} ms"


@dataclass
class StudyReport:
    """Every utterance's outcome under every setting, and the early transcripts heard."""

    outcomes: dict[Setting, list[Outcome]] = field(default_factory=dict)
    heard: dict[str, list[Heard]] = field(default_factory=dict)  # by STT window

    def split_rate(self, setting: Setting) -> float:
        chosen = self.outcomes[setting]
        return sum(o.segments > 1 for o in chosen) / len(chosen)

    def delay_ms(self, setting: Setting, q: float) -> float:
        delays = [o.delay_s for o in self.outcomes[setting] if not np.isnan(o.delay_s)]
        return float(np.percentile(delays, q)) * 1000 if delays else float("nan")

    def early(self, setting: Setting) -> int:
        return sum(o.early for o in self.outcomes[setting])

    def split_early(self, setting: Setting) -> int:
        """Utterances split by a turn ended early (a mid-utterance pause sounded finished)."""
        return sum(o.hastened > int(o.early) for o in self.outcomes[setting])

    def table(self) -> str:
        """Markdown: split rate, endpoint delay and turns ended early, per setting."""
        rows = [
            [
                "end of turn",
                "STT window",
                "split",
                "median ms",
                "p95 ms",
                "ended early",
                "split early",
            ],
            ["---", "---", *["---:"] * 5],
        ]
        for setting in self.outcomes:
            rows.append(
                [
                    setting.label,
                    setting.window,
                    f"{self.split_rate(setting) * 100:.1f}%",
                    f"{self.delay_ms(setting, 50):.0f}",
                    f"{self.delay_ms(setting, 95):.0f}",
                    str(self.early(setting)),
                    str(self.split_early(setting)),
                ]
            )
        return _markdown(rows)

    def transcript_table(self, finished: Callable[[str], bool] = sounds_finished) -> str:
        """Markdown: of the early transcripts, how many sound finished, at the end of the
        utterance (wanted) and in the middle (each one a split if the pause is long enough)."""
        rows = [
            ["STT window", "end: finished", "middle: finished", "inference median ms"],
            ["---", "---:", "---:", "---:"],
        ]
        for window, heard in self.heard.items():
            end = [h for h in heard if not h.more]
            middle = [h for h in heard if h.more]
            times = [h.inference_s * 1000 for h in heard]
            rows.append(
                [
                    window,
                    _share(sum(finished(h.text) for h in end), len(end)),
                    _share(sum(finished(h.text) for h in middle), len(middle)),
                    f"{np.median(times):.0f}" if times else "–",
                ]
            )
        return _markdown(rows)


def _share(count: int, total: int) -> str:
    return f"{count}/{total} ({count / total * 100:.0f}%)" if total else "–"


def _markdown(rows: list[list[str]]) -> str:
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)


# (end_silence_ms, finished_silence_ms) tried with each STT window.
EARLY: tuple[tuple[int, int], ...] = (
    *((500, ms) for ms in (250, 300, 350, 400, 450)),
    (550, 450),
    (600, 450),
    (600, 500),  # the words used the other way: more silence when the turn sounds unfinished
)


def run_study(
    utterances: Sequence[Utterance] = UTTERANCES,
    end_silences: Iterable[int] = (300, 400, 500, 600, 700),
    early: Iterable[tuple[int, int]] = EARLY,
    ears: Sequence[Ear] | None = None,
    finished: Callable[[str], bool] = sounds_finished,
    progress: Callable[[Setting, Outcome], None] | None = None,
) -> StudyReport:
    """Every utterance at each of `end_silences` (never early), then at each (end_silence_ms,
    finished_silence_ms) of `early` hearing with each of `ears` (default: the server's STT in
    the 30 s window, then in the fitted one); an ear already used keeps what it heard."""
    report = StudyReport()
    base = TurnSettings()
    plan: list[tuple[Setting, Ear | None]] = [(Setting(ms), None) for ms in end_silences]
    pairs = list(early)
    for heard_by in [Ear("full"), Ear("fit")] if ears is None else ears:
        plan += [(Setting(end, ms, heard_by.window), heard_by) for end, ms in pairs]
    for setting, ear in plan:
        settings = base.model_copy(
            update={
                "end_silence_ms": setting.end_silence_ms,
                "finished_silence_ms": setting.finished_silence_ms,
            }
        )
        outcomes = report.outcomes.setdefault(setting, [])
        for utterance in utterances:
            outcome = simulate(utterance, settings, ear, finished)
            outcomes.append(outcome)
            if progress is not None:
                progress(setting, outcome)
        if ear is not None:
            report.heard[ear.window] = list(ear.heard.values())
    return report


def print_study(
    windows: Sequence[Window] = ("full", "fit"),
    verbose: bool = False,
    out: TextIO | None = None,
) -> StudyReport:
    """Run the study and print its tables (and, if `verbose`, every split and every early
    transcript in the middle of an utterance that sounded finished)."""
    stream = out or sys.stdout

    def show(setting: Setting, outcome: Outcome) -> None:
        if verbose and outcome.segments > 1:
            u = outcome.utterance
            print(
                f"split: {setting.label} {setting.window:4} {u.voice.name:28} {u.text!r}",
                file=stream,
                flush=True,
            )

    report = run_study(ears=[Ear(w) for w in windows], progress=show)
    if verbose:
        for window, heard in report.heard.items():
            for h in heard:
                if h.more and sounds_finished(h.text):
                    print(f"finished mid-turn ({window}): {h.text!r}", file=stream)
    defaults = STTSettings()
    print(
        f"\n{len(UTTERANCES)} utterances ({len(PHRASES)} phrases x {len(SPEAKERS)} speakers), "
        f"{TAIL_MS} ms of silence after each; 20 ms frames, simulated clock; early end at the "
        f"simulated arrival of the pause's transcript (Whisper {defaults.model}, the server's "
        f"phone window: {defaults.encoder_window})\n",
        file=stream,
    )
    print(report.table(), file=stream)
    print(
        "\nsplit: utterances heard as more than one turn; median/p95: endpoint delay "
        "(detected_at - speech_ended_at) of the last turn; ended early: last turns ended by "
        "their finished-sounding transcript; split early: utterances split by a mid-utterance "
        "pause that sounded finished.\n",
        file=stream,
    )
    print(report.transcript_table(), file=stream)
    return report


if __name__ == "__main__":
    # python -m voice.devtools.endpoint_study [-v] [--window fit|full ...]
    args = sys.argv[1:]
    chosen = [args[i + 1] for i, arg in enumerate(args[:-1]) if arg == "--window"]
    if any(w not in ("fit", "full") for w in chosen):
        sys.exit(f"--window {chosen}: use fit or full")
    picked: list[Window] = ["full" if w == "full" else "fit" for w in chosen]
    print_study(picked or ["full", "fit"], verbose="-v" in args)

"""`hotline amd-bench`: answering-machine detection replayed on recorded openings.

Each opening (`amd_openings`: Asterisk's recorded voicemail greetings and beep, Allison's
"Hello.", piper greetings and answers) goes through the phone path (8 kHz μ-law and back,
`turn_bench.decisions.phone_line`) and into a fresh `AnsweringMachineDetector` in 20 ms frames,
as a call would feed it. What the detector offers for an early transcript is transcribed by
the server's Whisper (`pipeline.stt.SpeechToText`, `STTSettings()`: tiny.en) and handed back
when it would have arrived live: when offered, or when the previous transcription finished,
plus the inference time measured here (one STT worker). Scored on the first verdict: correct,
per-class errors, decision time (humans: after the end of their speech; machines: against the
greeting's end and the beep's end), and the beep's onset and end against the truth.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from pipeline.answering.detector import (
    AnsweringMachineDetector,
    AnsweringSettings,
    BeepEnded,
    BeepHeard,
    OpeningSoFar,
    Verdict,
)
from voice.audio import PCM
from voice.devtools.amd_openings import (
    Opening,
    recorded_humans,
    recorded_machines,
    synthetic_openings,
)
from voice.devtools.bench_report import percentile
from voice.devtools.turn_bench.decisions import phone_line

FRAME = 320
SHORT_MS = 1500  # a short opening ("Hello?", "Hello, this is Jordan."): speech this long
Transcribe = Callable[[PCM], tuple[str, float]]  # audio -> (text, inference ms)


@dataclass
class Outcome:
    """One opening's replay."""

    name: str
    truth: str
    synthetic: bool
    answer: str = "none"
    by: str = ""
    at_ms: float = 0.0
    why: str = ""
    final: str = "none"  # after a beep's revision
    after_speech_ms: float | None = None  # human verdict: after the last speech before it
    spoken_ms: float | None = None  # human verdict: first speech to the last before it
    greeting_end_ms: float | None = None
    beep_true_ms: tuple[float, float] | None = None
    beep_heard_ms: tuple[float, float | None] | None = None  # detected onset and end
    transcripts: list[tuple[float, str, float]] = field(default_factory=list)  # at, text, ms

    @property
    def correct(self) -> bool:
        return self.answer == self.truth

    @property
    def in_time(self) -> bool:
        """A machine decided by the end of its greeting + beep."""
        deadline = self.beep_true_ms[1] if self.beep_true_ms else self.greeting_end_ms
        return deadline is not None and self.answer == "machine" and self.at_ms <= deadline


def replay(
    opening: Opening, transcribe: Transcribe | None, settings: AnsweringSettings | None = None
) -> Outcome:
    """Feed the opening (already on the line) to a fresh detector, frame by frame."""
    detector = AnsweringMachineDetector(settings)
    outcome = Outcome(opening.name, opening.truth, opening.synthetic)
    arriving: list[tuple[float, str, float]] = []  # (arrival ms, text, inference ms)
    busy_until = 0.0
    audio = opening.audio
    for start in range(0, len(audio) - FRAME + 1, FRAME):
        while arriving and arriving[0][0] <= detector.now_ms:
            at, text, spent = arriving.pop(0)
            outcome.transcripts.append((at, text, spent))
            if (verdict := detector.hear(text)) is not None:
                _record(outcome, verdict, opening)
        for event in detector.push(audio[start : start + FRAME]):
            if isinstance(event, Verdict):
                _record(outcome, event, opening)
            elif isinstance(event, BeepHeard):
                outcome.beep_heard_ms = (event.start_ms, None)
            elif isinstance(event, BeepEnded):
                outcome.beep_heard_ms = (event.start_ms, event.end_ms)
            elif isinstance(event, OpeningSoFar) and transcribe is not None:
                text, spent = transcribe(event.audio)
                busy_until = max(event.at_ms, busy_until) + spent
                arriving.append((busy_until, text, spent))
    outcome.greeting_end_ms = (
        opening.ms(opening.greeting_end) if opening.greeting_end is not None else None
    )
    if opening.beep is not None:
        outcome.beep_true_ms = (opening.ms(opening.beep[0]), opening.ms(opening.beep[1]))
    return outcome


def _record(outcome: Outcome, verdict: Verdict, opening: Opening) -> None:
    outcome.final = verdict.answer
    if verdict.revised:
        return
    outcome.answer, outcome.by, outcome.at_ms, outcome.why = (
        verdict.answer,
        verdict.by,
        verdict.at_ms,
        verdict.why,
    )
    ended = [opening.ms(end) for _, end in opening.spans if opening.ms(end) <= verdict.at_ms]
    if verdict.answer == "human" and ended:
        outcome.after_speech_ms = verdict.at_ms - ended[-1]
        outcome.spoken_ms = ended[-1] - opening.ms(opening.spans[0][0])


def openings(seed: int = 28, noise_dbfs: float | None = None) -> list[Opening]:
    """Every opening of the study, on the phone line; `noise_dbfs`: white noise at that RMS
    level added before the line (a noisy handset)."""
    from voice.devtools.turn_bench.sources import asterisk_clips, sources_dir

    rng = np.random.default_rng(seed)
    clips = asterisk_clips(sources_dir())
    built = recorded_machines(clips, rng) + recorded_humans(clips, rng)
    built += synthetic_openings(_piper, clips["beep"].audio, rng)
    for opening in built:
        audio = opening.audio.astype(np.float64)
        if noise_dbfs is not None:
            audio += rng.normal(0.0, 10 ** (noise_dbfs / 20) * 32768, len(audio))
        opening.audio = phone_line(np.clip(np.round(audio), -32768, 32767).astype(np.int16))
    return built


def _piper(text: str) -> PCM:
    """piper's joe voice with its noise off: the same audio every run."""
    from pipeline.tts import TextToSpeech, TTSSettings
    from voice.audio import resample

    voice = TextToSpeech.shared(TTSSettings(noise_scale=0.0, noise_w_scale=0.0))
    return resample(voice.synthesize_blocking(text), voice.sample_rate, 16000)


def whisper() -> Transcribe:
    """The server's Whisper (tiny.en by default), warmed up."""
    from pipeline.stt import SpeechToText

    stt = SpeechToText.shared()
    stt.warm_up()

    def transcribe(audio: PCM) -> tuple[str, float]:
        transcript = stt.transcribe_blocking(audio)
        return transcript.text, transcript.inference_s * 1000

    return transcribe


def summary(outcomes: list[Outcome]) -> dict[str, Any]:
    """Accuracy, errors per class, decision times, beep timing."""
    humans = [o for o in outcomes if o.truth == "human"]
    machines = [o for o in outcomes if o.truth == "machine"]
    beeped = [o for o in machines if o.beep_true_ms and o.beep_heard_ms]
    onset = [abs(o.beep_heard_ms[0] - o.beep_true_ms[0]) for o in beeped]  # type: ignore[index]
    delays = [o.after_speech_ms for o in humans if o.after_speech_ms is not None]
    short = [
        o.after_speech_ms
        for o in humans
        if o.after_speech_ms is not None and o.spoken_ms is not None and o.spoken_ms <= SHORT_MS
    ]
    to_beep_end = [o.at_ms - o.beep_true_ms[1] for o in machines if o.beep_true_ms and o.correct]
    return {
        "openings": len(outcomes),
        "correct": sum(o.correct for o in outcomes),
        "accuracy": round(sum(o.correct for o in outcomes) / max(1, len(outcomes)), 3),
        "final_correct": sum(o.final == o.truth for o in outcomes),
        "human_errors": [f"{o.name}: {o.answer} ({o.why})" for o in humans if not o.correct],
        "machine_errors": [f"{o.name}: {o.answer} ({o.why})" for o in machines if not o.correct],
        "by": {b: sum(o.by == b for o in outcomes) for b in sorted({o.by for o in outcomes})},
        "human_after_speech_ms": _stats(delays),
        "human_short_after_speech_ms": _stats(short),
        "human_since_answer_ms": _stats([o.at_ms for o in humans if o.correct]),
        "machine_since_answer_ms": _stats([o.at_ms for o in machines if o.correct]),
        "machine_minus_beep_end_ms": _stats(to_beep_end),
        "machines_in_time": sum(o.in_time for o in machines),
        "machines": len(machines),
        "beeps": len([o for o in machines if o.beep_true_ms]),
        "beeps_heard": len(beeped),
        "beep_onset_error_ms": _stats(onset),
    }


def _stats(values: list[float]) -> dict[str, float | None]:
    return {
        "n": len(values),
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "max": round(max(values), 1) if values else None,
    }


def print_report(runs: dict[str, list[Outcome]], console: Console) -> None:
    table = Table(title="Who answered: answering-machine detection (phone path)")
    columns = ("detector", "correct", "after beeps", "human err", "machine err", "in time")
    for column in (*columns, "human ms"):
        table.add_column(column)
    table.add_column("machine ms")
    for name, outcomes in runs.items():
        s = summary(outcomes)
        human, machine = s["human_after_speech_ms"], s["machine_since_answer_ms"]
        table.add_row(
            name,
            f"{s['correct']}/{s['openings']} ({s['accuracy']:.1%})",
            f"{s['final_correct']}/{s['openings']}",
            str(len(s["human_errors"])),
            str(len(s["machine_errors"])),
            f"{s['machines_in_time']}/{s['machines']}",
            f"{human['p50']} / {human['p95']}",
            f"{machine['p50']} / {machine['p95']}",
        )
    console.print(table)
    console.print(
        "[dim]human ms: verdict after the end of their speech, p50 / p95; machine "
        "ms: verdict since the answer; in time: by the end of greeting + beep[/]"
    )
    for name, outcomes in runs.items():
        s = summary(outcomes)
        console.print(
            f"[bold]{name}[/]: by {s['by']}; beeps heard {s['beeps_heard']}/"
            f"{s['beeps']}, onset error {s['beep_onset_error_ms']}; humans whose speech "
            f"lasted up to {SHORT_MS} ms decided after it {s['human_short_after_speech_ms']}"
        )
        for error in s["human_errors"] + s["machine_errors"]:
            console.print(f"  [red]wrong[/] {error}")


def write_json(runs: dict[str, list[Outcome]], path: Path) -> None:
    data = {
        name: {"summary": summary(outcomes), "outcomes": [asdict(o) for o in outcomes]}
        for name, outcomes in runs.items()
    }
    path.write_text(json.dumps(data, indent=1, default=str))


def run_study(
    seed: int = 28,
    limit: int | None = None,
    progress: Callable[[str], None] | None = None,
    noise_dbfs: float | None = None,
) -> dict[str, list[Outcome]]:
    """Both detectors on every opening: shape + beep alone, and with Whisper's transcripts."""
    chosen = openings(seed, noise_dbfs)[:limit]
    runs: dict[str, list[Outcome]] = {"shape + beep": [], "+ transcript": []}
    transcribe = whisper()
    for index, opening in enumerate(chosen):
        runs["shape + beep"].append(replay(opening, None))
        runs["+ transcript"].append(replay(opening, transcribe))
        if progress is not None:
            progress(f"{index + 1}/{len(chosen)} {opening.name}")
    return runs

"""The decisions: every pause of every turn, as the server hears it, with what it knows there.

- Paths: "phone" takes the turn to 8 kHz (libswresample, as the test callers narrow audio),
  μ-law encodes and decodes it (`voice.audio`), and brings it back to 16 kHz with the server's
  own stream resampler (`StreamResampler(8000, 16000)`, soxr "QQ"); "wide" is the 16 kHz turn
  as built (the Asterisk clips in it are 8 kHz recordings upsampled, so "wide" holds no more
  than 4 kHz of them; LibriVox is true 16 kHz).
- `pauses(audio)`: the server's VAD (`pipeline.turns.TurnDetector`, `pause_ms=100`, an
  end_silence_ms longer than any turn) over the turn in 20 ms frames on a simulated clock.
  Every `TurnPause` (a silence of 100 ms or more) is a decision: the last one the turn's end,
  the others holds. A hold's silence runs until `SpeechResumed`.
- `features(...)`: per decision, from the pause's audio only (`TurnPause.audio`, the turn up
  to the pause): the Smart Turn v3.2 score and its inference ms (`pipeline.turn_taking.model`),
  and the early transcript (Whisper tiny.en through `pipeline.stt`, the server's settings on
  both paths, `STTSettings()`: its fitted window) with its inference ms. One inference at a
  time, on these cores.

Features are cached per path and recipe as JSON in `$HOTLINE_CACHE_DIR/turn-bench/`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from pipeline.turns import SpeechResumed, TurnDetector, TurnPause, TurnSettings
from voice.audio import PCM, StreamResampler, frames, mulaw_decode, mulaw_encode
from voice.devtools.turn_bench.corpus import RATE, Turn

Path_ = Literal["phone", "wide"]
PATHS: tuple[Path_, ...] = ("phone", "wide")
FRAME = RATE * 20 // 1000
PAUSE_MS = 100
MATCH_BEFORE_MS = 150  # a VAD silence starting this soon before an inserted pause is that pause


def phone_line(audio: PCM) -> PCM:
    """`audio` (16 kHz) as the server hears it over a phone call: 8 kHz μ-law, back to 16 kHz."""
    narrow = StreamResampler(RATE, 8000)(audio, last=True)
    line = mulaw_decode(mulaw_encode(narrow))
    return StreamResampler(8000, RATE)(line, last=True)


def heard(audio: PCM, path: Path_) -> PCM:
    return phone_line(audio) if path == "phone" else audio


@dataclass(frozen=True)
class Pause:
    """One silence of 100 ms or more inside a turn, as the VAD offered it."""

    position: int  # samples into the turn where the silence began
    offered_ms: float  # when the pause was offered, ms after the silence began
    silence_ms: float  # how long the silence lasted (inf: the turn's end)
    audio: PCM  # the turn so far (`TurnPause.audio`)

    @property
    def end(self) -> bool:
        return math.isinf(self.silence_ms)


def pauses(audio: PCM) -> list[Pause]:
    """Every pause of one turn through a fresh `TurnDetector`, 20 ms frames, simulated clock.
    The last silence is the end: it runs to the end of the audio."""
    settings = TurnSettings(
        pause_ms=PAUSE_MS, post_roll_ms=PAUSE_MS, end_silence_ms=3_600_000, max_turn_s=3600.0
    )
    detector = TurnDetector(settings)
    found: list[tuple[TurnPause, float]] = []
    resumed: list[float] = []
    for index, frame in enumerate(frames(audio, FRAME)):
        at = (index + 1) * FRAME / RATE
        for event in detector.push(frame, at):
            if isinstance(event, TurnPause):
                found.append((event, at))
            elif isinstance(event, SpeechResumed) and len(resumed) < len(found):
                resumed.append(event.at)
    result = []
    for index, (pause, at) in enumerate(found):
        silence = (
            (resumed[index] - pause.speech_ended_at) * 1000 if index < len(resumed) else math.inf
        )
        offered = (at - pause.speech_ended_at) * 1000
        result.append(Pause(pause.end_position, offered, silence, pause.audio))
    return result


def category(turn: Turn, pause: Pause) -> str:
    """The inserted pause this silence is ("sentence", "continuation", ...), "end" for the
    last, or "natural" (a silence inside a recording)."""
    if pause.end:
        return "end"
    before = MATCH_BEFORE_MS * RATE // 1000
    for gap in turn.gaps:
        if gap.start - before <= pause.position <= gap.start + gap.ms * RATE / 1000:
            return gap.category
    return "natural"


@dataclass(frozen=True)
class Decision:
    """One decision: what was known at the pause, and what the truth was."""

    turn: str
    kind: str
    category: str
    offered_ms: float
    silence_ms: float  # inf at the turn's end
    score: float  # Smart Turn v3.2: probability the turn is over
    model_ms: float
    text: str  # early transcript of the turn so far
    stt_ms: float

    @property
    def end(self) -> bool:
        return math.isinf(self.silence_ms)


Scorer = Callable[[PCM], tuple[float, float]]  # audio -> (score, ms)
Transcriber = Callable[[PCM], tuple[str, float]]  # audio -> (text, ms)


def models() -> tuple[Scorer, Transcriber]:
    """Smart Turn and the server's STT, warmed up."""
    from pipeline.stt import SpeechToText, STTSettings
    from pipeline.turn_taking.model import shared

    model = shared()
    model.warm_up()
    stt = SpeechToText.shared(STTSettings())
    stt.warm_up()

    def score(audio: PCM) -> tuple[float, float]:
        result = model.score(audio)
        return result.complete, result.inference_ms

    def transcribe(audio: PCM) -> tuple[str, float]:
        transcript = stt.transcribe_blocking(audio)
        return transcript.text, transcript.inference_s * 1000

    return score, transcribe


def features(
    turns: Sequence[Turn],
    path: Path_,
    score: Scorer,
    transcribe: Transcriber,
    progress: Callable[[int, int], None] | None = None,
) -> list[Decision]:
    """Every decision of `turns` on `path`, with the model's score and the early transcript."""
    decisions: list[Decision] = []
    for index, turn in enumerate(turns):
        for pause in pauses(heard(turn.audio, path)):
            complete, model_ms = score(pause.audio)
            text, stt_ms = transcribe(pause.audio)
            decisions.append(
                Decision(
                    turn.name,
                    turn.kind,
                    category(turn, pause),
                    pause.offered_ms,
                    pause.silence_ms,
                    complete,
                    model_ms,
                    text,
                    stt_ms,
                )
            )
        if progress is not None:
            progress(index + 1, len(turns))
    return decisions


def save(decisions: Sequence[Decision], file: Path) -> None:
    rows = [{**asdict(d), "silence_ms": None if d.end else d.silence_ms} for d in decisions]
    file.parent.mkdir(parents=True, exist_ok=True)
    temporary = file.with_suffix(".tmp")
    temporary.write_text(json.dumps(rows))
    temporary.rename(file)


def load(file: Path) -> list[Decision] | None:
    """Cached decisions, or None when there are none (or they do not parse)."""
    try:
        rows = json.loads(file.read_text())
        return [
            Decision(
                **{**r, "silence_ms": math.inf if r["silence_ms"] is None else r["silence_ms"]}
            )
            for r in rows
        ]
    except (OSError, ValueError, TypeError, KeyError):
        return None


def silences(turns: Sequence[Turn], path: Path_ = "wide") -> list[float]:
    """The holds' silences (ms) of `turns` (VAD only: for calibrating the pause lengths)."""
    out: list[float] = []
    for turn in turns:
        out += [p.silence_ms for p in pauses(heard(turn.audio, path)) if not p.end]
    return out


def silence_only_cutoffs(
    held: Sequence[float], timeouts: Sequence[int] = (300, 600)
) -> list[float]:
    """Share of holds longer than each timeout: the silence-only row's cut-offs there."""
    array = np.asarray(held)
    return [float((array > t).mean()) if len(array) else 0.0 for t in timeouts]

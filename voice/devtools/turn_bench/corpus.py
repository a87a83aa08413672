"""The turn set: caller turns built from human recordings, with pauses where callers pause.

Each turn is one caller's whole turn, 16 kHz int16: 300 ms of silence, the words with mid-turn
pauses, then `TAIL_MS` of silence (longer than any timeout swept). The recipe is deterministic
for a seed; the audio is never shipped, only this code and the sources (`sources`).

What is human and what is not:
- Words: Allison's Asterisk prompts (8 kHz, upsampled to 16 kHz with soxr) and the LibriVox
  readers (16 kHz). Each piece is cut from a recording: a whole clip, a phrase of one at its
  internal punctuation (the silences inside a clip found by energy: a clip with k internal
  punctuation marks is cut at its k longest internal silences of 50 ms or more, in order, or not
  at all), a single digit/day/month clip, or LibriVox words at their aligned boundaries.
- Pauses: synthetic. The silence between pieces is drawn from `PAUSES` (below) and filled
  with a faint noise floor (about -87 dBFS RMS), as quiet as between the clips' own words.
- Fillers ("um", "uh"): synthetic, from piper's bundled joe voice (noise off, so the same audio
  every run), resampled to 16 kHz; no human filler installs offline.
- Prosody: each Asterisk clip was recorded on its own, so a pause at a join between clips
  (after a list item, a lead-in such as "the number i have is", a digit group) follows the
  intonation of a finished recording; a pause at a comma inside a clip follows Allison's own
  reading of the comma. Neither is a caller's spontaneous "I'm still going" prosody.
- Turn shapes: one sentence; a prompt with an internal comma ("To leave a message, please
  enter a mailbox number.", "I am sorry, that's not a valid extension."); two sentences of one
  turn; digit strings in groups after a lead-in ("the number i have is 5 5 5, 1 2 3, 4 5 6 7");
  lists of days or months ("Monday, Wednesday, and Friday"); a self-correction ("4 2 ... no,
  4 3"); a hesitation (a pause mid-phrase, alone or around a filler).

Pause lengths: silent pauses are log-normally distributed, with a brief mode (under 200 ms),
a medium one and a long one (over 1 s) (Campione & Véronis 2002, "A large-scale multilingual
study of silent pause duration", Speech Prosody; read and spontaneous speech in five
languages). `PAUSES` is a three-component log-normal mixture: weight 0.22 brief (median 170 ms,
sigma 0.35), 0.66 medium (median 370 ms, sigma 0.4), 0.12 long (median 1.6 s, sigma 0.45),
capped at 3 s. Calibrated by the silence-only row (the VAD-measured silences of all holds,
the recordings' own pauses of 100 ms or more included) to land near eot-bench's silence
baseline: 55.6% / 21.7% cut-offs at 300 / 600 ms, 10% at 1 s and 5% at 1.6 s. Seed 24, 240
turns, holds longer than 300 / 600 / 1000 / 1600 ms: wide 54.9 / 22.4 / 9.4 / 6.1%, phone
57.1 / 20.2 / 9.6 / 6.1%. (A two-mode mixture, 0.2 at 170 ms and 0.8 at 450 ms, sigma 0.45,
matched 300 / 600 ms as well but had too light a tail: 5% of holds past 935 ms.)

Each inserted pause is marked with its category (`CATEGORIES`); "continuation", "digits" and
"hesitation" follow words that plainly go on, "sentence" a finished sentence.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from voice.audio import PCM, resample
from voice.devtools.turn_bench.sources import Clip

RATE = 16000
LEAD_MS = 300
TAIL_MS = 3500  # trailing silence: longer than the longest timeout swept
SILENT_RMS = 40.0  # a 10 ms frame quieter than this (int16 RMS, -58 dBFS) is silence
CATEGORIES = ("sentence", "continuation", "digits", "hesitation")
CONTINUES = frozenset({"continuation", "digits", "hesitation"})  # words that plainly go on


@dataclass(frozen=True)
class PauseModel:
    """A log-normal mixture of silent pause lengths: (weight, median ms, sigma) per mode."""

    modes: tuple[tuple[float, float, float], ...] = (
        (0.22, 170.0, 0.35),  # brief
        (0.66, 370.0, 0.4),  # medium
        (0.12, 1600.0, 0.45),  # long
    )
    max_ms: float = 3000.0

    def draw(self, rng: np.random.Generator) -> float:
        pick, total = rng.random(), sum(w for w, _, _ in self.modes)
        chosen = self.modes[-1]
        for mode in self.modes:
            pick -= mode[0] / total
            if pick < 0:
                chosen = mode
                break
        _, median, sigma = chosen
        return float(min(self.max_ms, median * np.exp(sigma * rng.standard_normal())))


PAUSES = PauseModel()


@dataclass(frozen=True)
class Gap:
    """An inserted pause: where its silence starts (samples into the turn), how long it is."""

    category: str
    start: int
    ms: float


@dataclass(frozen=True)
class Turn:
    """One caller turn of the set."""

    name: str
    kind: str
    text: str
    audio: PCM
    gaps: tuple[Gap, ...]
    synthetic_filler: bool = False


def frame_rms(audio: PCM, ms: int = 10) -> np.ndarray:
    size = RATE * ms // 1000
    usable = len(audio) // size * size
    frames = audio[:usable].astype(np.float64).reshape(-1, size)
    return np.sqrt((frames**2).mean(axis=1)) if usable else np.zeros(0)


def trim(audio: PCM, margin_ms: int = 10) -> PCM:
    """`audio` without its leading and trailing silence (10 ms kept each side)."""
    voiced = np.flatnonzero(frame_rms(audio) >= SILENT_RMS)
    if not len(voiced):
        return audio[:0]
    size = RATE // 100
    lo = max(0, (voiced[0] - margin_ms // 10) * size)
    hi = min(len(audio), (voiced[-1] + 1 + margin_ms // 10) * size)
    return audio[lo:hi]


_SPLIT = re.compile(r"(?<=[,;:.?!])\s+(?=\S)")


def phrases(clip: Clip, min_gap_ms: int = 50) -> list[tuple[str, PCM]] | None:
    """The clip cut at its internal punctuation: (text, audio) per phrase, or None when it has
    fewer internal silences than punctuation marks."""
    texts = _SPLIT.split(clip.text.strip())
    audio = trim(clip.audio)
    if len(texts) == 1:
        return [(texts[0], audio)]
    silent = frame_rms(audio) < SILENT_RMS
    runs: list[tuple[int, int]] = []  # (first frame, frames) of internal silences
    start: int | None = None
    for index, quiet in enumerate(silent):
        if quiet and start is None:
            start = index
        elif not quiet and start is not None:
            if index - start >= min_gap_ms // 10 and start > 0:
                runs.append((start, index - start))
            start = None
    if len(runs) < len(texts) - 1:
        return None
    chosen = sorted(sorted(runs, key=lambda r: -r[1])[: len(texts) - 1])
    size = RATE // 100
    bounds = [0, *(x for s, n in chosen for x in ((s + 1) * size, (s + n - 1) * size)), len(audio)]
    return [(t, audio[bounds[2 * i] : bounds[2 * i + 1]]) for i, t in enumerate(texts)]


def joined_category(text: str) -> str:
    """The category of a pause after `text`: a finished sentence or a continuation."""
    return "sentence" if text.rstrip().endswith((".", "?", "!")) else "continuation"


class Assembler:
    """Pieces of speech joined by pauses, with the pauses' bookkeeping."""

    def __init__(
        self,
        rng: np.random.Generator,
        pauses: PauseModel = PAUSES,
        floor: np.random.Generator | None = None,
    ) -> None:
        """`rng` draws the pauses; `floor` (default: `rng`) the noise floor, from its own
        stream so that a pause's length does not change the draws after it."""
        self._rng = rng
        self._floor = floor or rng
        self._pauses = pauses
        self._parts: list[PCM] = [self._silence(LEAD_MS)]
        self._length = len(self._parts[0])
        self.gaps: list[Gap] = []
        self.words: list[str] = []

    def _silence(self, ms: float) -> PCM:
        samples = round(ms * RATE / 1000)
        return np.round(self._floor.normal(0.0, 1.5, samples)).astype(np.int16)

    def _add(self, audio: PCM) -> None:
        self._parts.append(audio)
        self._length += len(audio)

    def speak(self, text: str, audio: PCM) -> Assembler:
        self.words.append(text)
        self._add(audio)
        return self

    def tight(self, ms: float | None = None) -> Assembler:
        """A gap between words of one group (0-30 ms: no decision meant, though the VAD may
        still hear one where a word fades out)."""
        self._add(self._silence(self._rng.uniform(0, 30) if ms is None else ms))
        return self

    def pause(self, category: str, ms: float | None = None) -> Assembler:
        length = self._pauses.draw(self._rng) if ms is None else ms
        self.gaps.append(Gap(category, self._length, length))
        self._add(self._silence(length))
        return self

    def turn(self, name: str, kind: str, filler: bool = False) -> Turn:
        audio = np.concatenate([*self._parts, self._silence(TAIL_MS)])
        text = " ".join(w for w in self.words if w)
        return Turn(name, kind, text, audio, tuple(self.gaps), filler)


Fillers = dict[str, PCM]


def piper_fillers() -> Fillers:
    """'um' and 'uh' from piper's joe voice (noise off: the same audio every run), 16 kHz."""
    from pipeline.tts import TextToSpeech, TTSSettings

    tts = TextToSpeech.shared(TTSSettings(noise_scale=0.0, noise_w_scale=0.0))
    return {
        word: trim(resample(tts.synthesize_blocking(f"{word.capitalize()}."), tts.sample_rate))
        for word in ("um", "uh")
    }


@dataclass(frozen=True)
class Pools:
    """The pieces the recipe draws from."""

    sentences: tuple[list[tuple[str, PCM]], ...]  # whole clips, as phrases
    prompts: tuple[list[tuple[str, PCM]], ...]  # clips with an internal comma
    digits: dict[str, PCM]  # "0".."9" and "oh"
    lead_ins: tuple[tuple[str, PCM], ...]  # words before a number
    items: tuple[tuple[str, PCM], ...]  # days and months
    words: dict[str, PCM]  # "and", "no"
    librivox: tuple[Clip, ...]
    fillers: Fillers


DIGIT_NAMES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
LEAD_INS = ("vm-num-i-have", "conf-enteringno", "vm-from-phonenumber", "queue-thereare",
            "vm-theperson", "privacy-prompt", "telephone-number")  # fmt: skip


def pools(asterisk: dict[str, Clip], librivox: dict[str, Clip], fillers: Fillers) -> Pools:
    """Sort the clips into the recipe's pools (clips with brackets, ellipses, digits in the
    text or over 7 s are left out of the sentence pools)."""
    sentences: list[list[tuple[str, PCM]]] = []
    prompts: list[list[tuple[str, PCM]]] = []
    for name, clip in sorted(asterisk.items()):
        text = clip.text
        if "/" in name or "[" in text or "(" in text or "..." in text or len(clip.audio) > 7 * RATE:
            continue
        if len(text.split()) < 3 or not text.endswith((".", "?", "!")) or re.search(r"\d", text):
            continue
        split = phrases(clip)
        if split is None:
            continue
        (prompts if any(t.endswith(",") for t, _ in split[:-1]) else sentences).append(split)
    digits = {str(d): trim(asterisk[f"digits/{d}"].audio) for d in range(10)}
    digits["oh"] = trim(asterisk["digits/oh"].audio)
    lead_ins = []
    for name in LEAD_INS:
        split = phrases(asterisk[name]) if name in asterisk else None
        if split:
            lead_ins.append((" ".join(t for t, _ in split), np.concatenate([a for _, a in split])))
    items = [(asterisk[f"digits/day-{d}"].text, trim(asterisk[f"digits/day-{d}"].audio))
             for d in range(7)]  # fmt: skip
    items += [(asterisk[f"digits/mon-{m}"].text, trim(asterisk[f"digits/mon-{m}"].audio))
              for m in range(12)]  # fmt: skip
    words = {"and": trim(asterisk["vm-and"].audio), "no": trim(asterisk["vm-no"].audio)}
    return Pools(tuple(sentences), tuple(prompts), digits, tuple(lead_ins), tuple(items), words,
                 tuple(librivox.values()), fillers)  # fmt: skip


Builder = Callable[[Pools, np.random.Generator, Assembler], tuple[str, bool]]

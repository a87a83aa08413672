"""Word error rate of speech recognition, and the telephone channel it is measured through.

A caller on a phone line reaches Hotline as 8 kHz G.711 μ-law: band-limited to about
300–3400 Hz, quantised to 8 bits, then resampled to 16 kHz for Whisper. This module holds the
metric and that channel:

- `normalize` / `word_errors` / `word_error_rate`: WER by word-level edit distance, after a
  normaliser that makes "7 p.m." equal "seven pm" and "4572" equal "four five seven two".
- `telephone(pcm16k)`: the phone line (band-pass, 16 kHz → 8 kHz, μ-law round trip, back to
  16 kHz with the server's own `StreamResampler`).

The corpus, the voices and the study of the bundled Whisper models are in
`voice.devtools.wer_study`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import soxr

from pipeline.transport import SAMPLE_RATE
from voice.audio import PCM, StreamResampler, mulaw_decode, mulaw_encode

RATE = SAMPLE_RATE
PHONE_RATE = 8_000
PHONE_BAND_HZ = (300.0, 3400.0)

# -- normalisation -------------------------------------------------------------------------

# fmt: off
_ONES = (
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen",
    "nineteen",
)
_TENS = ("twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
_ORDINALS = (
    "first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth",
    "tenth", "eleventh", "twelfth", "thirteenth", "fourteenth", "fifteenth", "sixteenth",
    "seventeenth", "eighteenth", "nineteenth", "twentieth",
)
# fmt: on
# Spellings that mean the same word; both sides are mapped to the right-hand form.
_SAME_WORD = {
    "ok": "okay",
    "mr": "mister",
    "mrs": "missus",
    "dr": "doctor",
    "alright": "all right",
}


def number_words(n: int) -> str:
    """0–99 in words ("twenty one"); longer numbers digit by digit ("four five seven two")."""
    if n < 0:
        return "minus " + number_words(-n)
    if n < 20:
        return _ONES[n]
    if n < 100:
        tens, ones = divmod(n, 10)
        return _TENS[tens - 2] + ("" if ones == 0 else " " + _ONES[ones])
    return " ".join(_ONES[int(d)] for d in str(n))


def ordinal_words(n: int) -> str:
    """1–99 as an ordinal ("twenty first"); others fall back to `number_words`."""
    if 1 <= n <= 20:
        return _ORDINALS[n - 1]
    if 20 < n < 100:
        tens, ones = divmod(n, 10)
        if ones == 0:
            return _TENS[tens - 2][:-1] + "ieth"  # "thirty" → "thirtieth"
        return _TENS[tens - 2] + " " + _ORDINALS[ones - 1]
    return number_words(n)


def _spell_digits(match: re.Match[str]) -> str:
    digits = match.group(0)
    # Numbers written with a leading zero ("007") are read digit by digit, whatever the length.
    if len(digits) > 2 or (len(digits) == 2 and digits[0] == "0"):
        return " " + " ".join(_ONES[int(d)] for d in digits) + " "
    return " " + number_words(int(digits)) + " "


def normalize(text: str) -> list[str]:
    """The words of `text` as compared by WER.

    Lowercase; "$20" → "twenty dollars"; "7:30", "7.30", "at 730" and "730pm" → "seven thirty",
    "7:00" → "seven", "10:05" → "ten oh five";
    "21st" → "twenty first"; numbers 0–99 in words, longer digit strings digit by digit (how
    callers read order and phone numbers); "1,500" → "one five zero zero"; hyphens split words
    ("twenty-one" → "twenty one"); apostrophes and other punctuation are dropped ("o'clock" →
    "oclock", "p.m." → "pm"); a few equivalent spellings are merged ("ok" → "okay").
    """
    s = text.lower()
    s = re.sub(r"\b([a-z])\.([a-z])\.", r"\1\2", s)  # "p.m." → "pm"
    s = re.sub(r"(?<=\d),(?=\d{3}\b)", "", s)  # thousands separators
    s = re.sub(r"\$(\d+)(?:\.00)?\b", r"\1 dollars", s)
    # "at 730", "1130pm": a clock time without its colon, said "seven thirty"
    s = re.sub(r"\b(at|by|until|till) (1[0-2]|[1-9])([0-5]\d)\b", r"\1 \2:\3", s)
    s = re.sub(r"\b(1[0-2]|[1-9])([0-5]\d) ?(am|pm)\b", r"\1:\2 \3", s)
    s = re.sub(r"\b(\d{1,2}):00\b", r"\1", s)  # "7:00" is said "seven"
    s = re.sub(r"\b(\d{1,2}):0(\d)\b", r"\1 oh \2", s)  # "10:05" is said "ten oh five"
    s = re.sub(r"\b(\d{1,2}):(\d{2})\b", r"\1 \2", s)
    s = re.sub(r"%", " percent ", s)
    s = re.sub(r"\b(\d+)(?:st|nd|rd|th)\b", lambda m: " " + ordinal_words(int(m.group(1))) + " ", s)
    s = re.sub(r"\d+", _spell_digits, s)
    s = s.replace("'", "").replace("’", "")
    s = re.sub(r"[^a-z]+", " ", s)
    words: list[str] = []
    for word in s.split():
        words.extend(_SAME_WORD.get(word, word).split())
    return words


# -- word error rate -----------------------------------------------------------------------


@dataclass(frozen=True)
class WordErrors:
    """Edit counts of one hypothesis against one reference (or a sum of them)."""

    substitutions: int = 0
    deletions: int = 0
    insertions: int = 0
    reference_words: int = 0

    @property
    def edits(self) -> int:
        return self.substitutions + self.deletions + self.insertions

    @property
    def rate(self) -> float:
        """Edits per reference word; an empty reference counts each inserted word as 1.0."""
        return self.edits / max(self.reference_words, 1)

    def __add__(self, other: WordErrors) -> WordErrors:
        return WordErrors(
            self.substitutions + other.substitutions,
            self.deletions + other.deletions,
            self.insertions + other.insertions,
            self.reference_words + other.reference_words,
        )


# (edits, substitutions, deletions, insertions); tuples compare by edits first.
_Cell = tuple[int, int, int, int]


def align(reference: Sequence[str], hypothesis: Sequence[str]) -> WordErrors:
    """Minimum edit distance between two word lists (Levenshtein), split by kind of edit.

    Every minimal alignment gives the same split: deletions - insertions is always
    len(reference) - len(hypothesis), so the edit total fixes all three counts."""
    # previous[j] / current[j]: the best _Cell aligning reference[:i] with hypothesis[:j].
    previous: list[_Cell] = [(j, 0, 0, j) for j in range(len(hypothesis) + 1)]
    for i, ref_word in enumerate(reference, start=1):
        current: list[_Cell] = [(i, 0, i, 0)]
        for j, hyp_word in enumerate(hypothesis, start=1):
            e, s, d, n = previous[j - 1]
            diagonal = (e, s, d, n) if ref_word == hyp_word else (e + 1, s + 1, d, n)
            e, s, d, n = previous[j]
            deletion = (e + 1, s, d + 1, n)
            e, s, d, n = current[j - 1]
            insertion = (e + 1, s, d, n + 1)
            current.append(min(diagonal, deletion, insertion))
        previous = current
    _, substitutions, deletions, insertions = previous[-1]
    return WordErrors(substitutions, deletions, insertions, len(reference))


def word_errors(reference: str, hypothesis: str) -> WordErrors:
    """Edit counts after `normalize` on both sides."""
    return align(normalize(reference), normalize(hypothesis))


def word_error_rate(reference: str, hypothesis: str) -> float:
    """(substitutions + deletions + insertions) / reference words, after `normalize`.

    0.0 for a perfect transcript; can exceed 1.0 when the hypothesis adds words. An empty
    reference gives 0.0 against an empty hypothesis, else the number of inserted words."""
    return word_errors(reference, hypothesis).rate


# -- the telephone channel -----------------------------------------------------------------


def band_pass(
    pcm: PCM, rate: int = RATE, low_hz: float = PHONE_BAND_HZ[0], high_hz: float = PHONE_BAND_HZ[1]
) -> PCM:
    """Keep `low_hz`–`high_hz` (the telephone band), with 100 Hz / 300 Hz raised-cosine edges.

    Whole-signal FFT filter (zero phase): fine for utterances, not for a live stream."""
    samples = np.asarray(pcm, dtype=np.float64)
    if samples.size == 0:
        return np.zeros(0, dtype=np.int16)
    spectrum = np.fft.rfft(samples)
    freqs = np.asarray(np.fft.rfftfreq(samples.size, 1.0 / rate), dtype=np.float64)
    gain = _edge(freqs, low_hz - 100.0, low_hz) - _edge(freqs, high_hz, high_hz + 300.0)
    out = np.fft.irfft(spectrum * gain, n=samples.size)
    return np.clip(np.round(out), -32768, 32767).astype(np.int16)


def _edge(freqs: npt.NDArray[np.float64], start: float, stop: float) -> npt.NDArray[np.float64]:
    """0 below `start`, 1 above `stop`, a raised-cosine ramp between."""
    x = np.clip((freqs - start) / (stop - start), 0.0, 1.0)
    ramp: npt.NDArray[np.float64] = 0.5 - 0.5 * np.cos(np.pi * x)
    return ramp


def telephone(pcm16k: PCM, band: bool = True) -> PCM:
    """16 kHz int16 speech as Hotline receives it from a phone call, back at 16 kHz.

    Optional line band-pass (300–3400 Hz), soxr down to 8 kHz, G.711 μ-law encode and decode,
    then up to 16 kHz with `StreamResampler` as the Twilio path does. The output has the
    input's length (±1 sample from resampling, padded or cut to match)."""
    pcm = np.asarray(pcm16k, dtype=np.int16)
    if band:
        pcm = band_pass(pcm)
    narrow = soxr.resample(pcm, RATE, PHONE_RATE, "HQ")
    line = mulaw_decode(mulaw_encode(np.asarray(narrow, dtype=np.int16)))
    wide = StreamResampler(PHONE_RATE, RATE)(line, last=True)
    if len(wide) >= len(pcm):
        return np.ascontiguousarray(wide[: len(pcm)], dtype=np.int16)
    return np.concatenate([wide, np.zeros(len(pcm) - len(wide), dtype=np.int16)])

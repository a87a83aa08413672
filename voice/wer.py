"""Word error rate of the bundled Whisper models on telephone-quality speech.

A caller on a phone line reaches Hotline as 8 kHz G.711 μ-law: band-limited to about
300–3400 Hz, quantised to 8 bits, then resampled to 16 kHz for Whisper. This module measures how
much that costs each model:

- `normalize` / `word_errors` / `word_error_rate`: WER by word-level edit distance, after a
  normaliser that makes "7 p.m." equal "seven pm" and "4572" equal "four five seven two".
- `telephone(pcm16k)`: the phone line (band-pass, 16 kHz → 8 kHz, μ-law round trip, back to
  16 kHz with the server's own `StreamResampler`).
- `CORPUS` and `VOICES`: short caller-like sentences, spoken on the fly by several espeak-ng
  voices and piper's bundled joe voice.
- `run_study(...)` → `StudyReport` (`.table()` renders Markdown), `print_study(...)` for the CLI.

Corpus WER is total edits over total reference words (not a mean of per-utterance rates).
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, TextIO

import numpy as np
import numpy.typing as npt
import soxr

from voice.audio import PCM, StreamResampler, espeak, mulaw_decode, mulaw_encode

RATE = 16_000
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


# -- corpus and voices ---------------------------------------------------------------------

# What callers say. Written as spoken: numbers in words, so the reference is what was synthesised.
CORPUS: tuple[str, ...] = (
    "Hi, I would like to book a table for four people tonight.",
    "Can I move my reservation to Friday at seven thirty?",
    "My order number is four five seven two.",
    "Yes, that's right.",
    "No, that's not what I asked for.",
    "I live at twenty two Baker Street, apartment nine.",
    "My name is Sarah Johnson.",
    "Could you spell that for me please?",
    "What time do you close on Sundays?",
    "I need to cancel my appointment for tomorrow morning.",
    "My phone number is five five five, two three eight, nine one four zero.",
    "The package never arrived and I want a refund.",
    "Is there a doctor available this afternoon?",
    "Please transfer me to the billing department.",
    "I was charged twice on my last invoice.",
    "Can you send the confirmation to my email address?",
    "The delivery should be at half past three.",
    "I'd like two large pizzas with extra cheese.",
    "My account was locked after I changed my password.",
    "Sorry, could you repeat that?",
    "I'm calling about the flat on Elm Road.",
    "We will arrive at the hotel around midnight.",
    "Is parking included in the price?",
    "The card ends in eight three one six.",
    "Okay, thank you very much, goodbye.",
)


@dataclass(frozen=True)
class Voice:
    """A synthetic speaker: an espeak-ng voice at a speed, or the bundled piper voice."""

    name: str
    engine: Literal["espeak", "piper"]
    espeak_voice: str = "en-us"
    wpm: int = 160
    length_scale: float | None = None  # piper speaking rate (< 1 faster)

    @property
    def family(self) -> str:
        return "piper" if self.engine == "piper" else "espeak-ng"

    def speak(self, text: str) -> PCM:
        """`text` spoken, int16 16 kHz, with 200 ms of silence before and 300 ms after (as a
        turn segment from the VAD has); cached for the process."""
        return _speak_cached(self, text).copy()


VOICES: tuple[Voice, ...] = (
    Voice("espeak en-us", "espeak", "en-us", 160),
    Voice("espeak en-us+f3 fast", "espeak", "en-us+f3", 190),
    Voice("espeak en-gb", "espeak", "en-gb", 150),
    Voice("espeak en-gb-x-rp+m3 slow", "espeak", "en-gb-x-rp+m3", 130),
    Voice("espeak en-gb-scotland+f4", "espeak", "en-gb-scotland+f4", 165),
    Voice("espeak en-029", "espeak", "en-029", 160),
    Voice("piper joe", "piper"),
    Voice("piper joe fast", "piper", length_scale=0.8),
)


@functools.cache
def _speak_cached(voice: Voice, text: str) -> PCM:
    if voice.engine == "espeak":
        speech = espeak(text, voice.espeak_voice, voice.wpm)
    else:
        speech = _piper(text, voice.length_scale)
    lead = np.zeros(RATE * 200 // 1000, dtype=np.int16)
    tail = np.zeros(RATE * 300 // 1000, dtype=np.int16)
    return np.concatenate([lead, speech, tail])


def _piper(text: str, length_scale: float | None) -> PCM:
    from pipeline.tts import TextToSpeech, TTSSettings

    tts = TextToSpeech.shared(TTSSettings(length_scale=length_scale))
    audio = tts.synthesize_blocking(text)
    out = soxr.resample(audio, tts.sample_rate, RATE, "HQ")
    return np.ascontiguousarray(out, dtype=np.int16)


# -- the study -----------------------------------------------------------------------------

Condition = Literal["clean", "telephone"]
CONDITIONS: tuple[Condition, ...] = ("clean", "telephone")
_CHANNELS: dict[Condition, Callable[[PCM], PCM]] = {
    "clean": lambda pcm: pcm,
    "telephone": telephone,
}


@dataclass(frozen=True)
class Trial:
    """One utterance transcribed by one model in one condition."""

    model: str
    condition: Condition
    voice: Voice
    reference: str
    hypothesis: str
    errors: WordErrors
    inference_s: float
    audio_s: float

    @property
    def runaway(self) -> bool:
        """The transcript more than doubled the words said (Whisper stuck in a loop)."""
        return self.errors.insertions > max(self.errors.reference_words, 1)


@dataclass
class StudyReport:
    """Every trial of a study, with aggregates by model × condition × voice family."""

    trials: list[Trial] = field(default_factory=list)
    load_s: dict[str, float] = field(default_factory=dict)

    def errors(
        self, model: str, condition: str, family: str | None = None, voice: str | None = None
    ) -> WordErrors:
        total = WordErrors()
        for t in self._select(model, condition, family, voice):
            total = total + t.errors
        return total

    def wer(
        self, model: str, condition: str, family: str | None = None, voice: str | None = None
    ) -> float:
        """Corpus WER (total edits / total reference words); NaN with no matching trials."""
        errors = self.errors(model, condition, family, voice)
        return errors.rate if errors.reference_words else float("nan")

    def mean_inference_s(self, model: str, condition: str | None = None) -> float:
        times = [
            t.inference_s
            for t in self.trials
            if t.model == model and (condition is None or t.condition == condition)
        ]
        return float(np.mean(times)) if times else float("nan")

    def percentile_inference_s(self, model: str, q: float, condition: str | None = None) -> float:
        times = [
            t.inference_s
            for t in self.trials
            if t.model == model and (condition is None or t.condition == condition)
        ]
        return float(np.percentile(times, q)) if times else float("nan")

    @property
    def models(self) -> list[str]:
        return _unique(t.model for t in self.trials)

    @property
    def conditions(self) -> list[str]:
        return _unique(t.condition for t in self.trials)

    @property
    def families(self) -> list[str]:
        return _unique(t.voice.family for t in self.trials)

    @property
    def voices(self) -> list[str]:
        return _unique(t.voice.name for t in self.trials)

    def capped_wer(self, model: str, condition: str) -> float:
        """Mean per-utterance WER with each utterance capped at 1.0, so that one runaway
        transcript cannot dominate; NaN with no matching trials."""
        chosen = self._select(model, condition, None, None)
        if not chosen:
            return float("nan")
        return float(np.mean([min(t.errors.rate, 1.0) for t in chosen]))

    def exact(self, model: str, condition: str) -> float:
        """Share of utterances transcribed without a single word error."""
        chosen = self._select(model, condition, None, None)
        if not chosen:
            return float("nan")
        return sum(t.errors.edits == 0 for t in chosen) / len(chosen)

    def runaways(self, model: str, condition: str) -> int:
        """Utterances whose transcript more than doubled the words said (a decoding loop)."""
        return sum(t.runaway for t in self._select(model, condition, None, None))

    def table(self) -> str:
        """Markdown: WER per model × condition, by voice family and overall, with the median
        inference time per utterance (robust to a busy machine; the mean is in `print_study`)."""
        families = self.families
        header = [
            "model",
            "audio",
            *(f"WER {f}" for f in families),
            "WER all",
            "WER capped",
            "exact",
            "runaways",
            "median ms",
        ]
        rows = [header, ["---"] * 2 + ["---:"] * (len(header) - 2)]
        for model in self.models:
            for condition in self.conditions:
                rows.append(
                    [
                        model,
                        _CONDITION_LABEL.get(condition, condition),
                        *(_pct(self.wer(model, condition, f)) for f in families),
                        _pct(self.wer(model, condition)),
                        _pct(self.capped_wer(model, condition)),
                        _pct(self.exact(model, condition)),
                        str(self.runaways(model, condition)),
                        f"{self.percentile_inference_s(model, 50, condition) * 1000:.0f}",
                    ]
                )
        return _markdown(rows)

    def voice_table(self) -> str:
        """Markdown: WER per voice (rows) for each model × condition (columns)."""
        columns = [(m, c) for m in self.models for c in self.conditions]
        header = ["voice", *(f"{m} {c}" for m, c in columns)]
        rows = [header, ["---"] + ["---:"] * len(columns)]
        for voice in self.voices:
            rows.append([voice, *(_pct(self.wer(m, c, voice=voice)) for m, c in columns)])
        return _markdown(rows)

    def worst(self, model: str, condition: str, count: int = 5) -> list[Trial]:
        """The trials with the most edits, for reading what went wrong."""
        chosen = self._select(model, condition, None, None)
        return sorted(chosen, key=lambda t: t.errors.edits, reverse=True)[:count]

    def _select(
        self, model: str, condition: str, family: str | None, voice: str | None
    ) -> list[Trial]:
        return [
            t
            for t in self.trials
            if t.model == model
            and t.condition == condition
            and (family is None or t.voice.family == family)
            and (voice is None or t.voice.name == voice)
        ]


_CONDITION_LABEL = {"clean": "clean 16 kHz", "telephone": "phone 8 kHz μ-law"}


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _pct(rate: float) -> str:
    return "–" if np.isnan(rate) else f"{rate * 100:.1f}%"


def _markdown(rows: list[list[str]]) -> str:
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)


def run_study(
    models: Sequence[str] = ("tiny.en", "base"),
    voices: Sequence[Voice] = VOICES,
    sentences: Sequence[str] = CORPUS,
    conditions: Sequence[Condition] = CONDITIONS,
    progress: Callable[[Trial], None] | None = None,
) -> StudyReport:
    """Transcribe every sentence by every voice, clean and over the phone, with every model.

    Models run one utterance at a time with the server's settings (int8, beam 1, English), so
    `inference_s` is the latency one caller's turn would see on an idle machine."""
    from pipeline.stt import SpeechToText, STTSettings

    report = StudyReport()
    audio = {
        (voice, text, condition): _CHANNELS[condition](voice.speak(text))
        for voice in voices
        for text in sentences
        for condition in conditions
    }
    for model in models:
        stt = SpeechToText.shared(STTSettings(model=model))
        report.load_s[model] = stt.load_s
        stt.warm_up()
        for (voice, text, condition), pcm in audio.items():
            transcript = stt.transcribe_blocking(pcm)
            trial = Trial(
                model=model,
                condition=condition,
                voice=voice,
                reference=text,
                hypothesis=transcript.text,
                errors=word_errors(text, transcript.text),
                inference_s=transcript.inference_s,
                audio_s=transcript.audio_s,
            )
            report.trials.append(trial)
            if progress is not None:
                progress(trial)
    return report


def print_study(
    models: Sequence[str] = ("tiny.en", "base"),
    voices: Sequence[Voice] = VOICES,
    sentences: Sequence[str] = CORPUS,
    verbose: bool = False,
    out: TextIO | None = None,
) -> StudyReport:
    """Run the study and print the Markdown tables (and, if `verbose`, every transcript)."""
    stream = out or sys.stdout

    def show(trial: Trial) -> None:
        if verbose:
            print(
                f"{trial.model:8} {trial.condition:9} {trial.voice.name:26} "
                f"{trial.errors.rate * 100:5.1f}% {trial.inference_s * 1000:4.0f} ms "
                f"{trial.hypothesis!r}",
                file=stream,
                flush=True,
            )

    report = run_study(models, voices, sentences, progress=show)
    utterances = len(voices) * len(sentences)
    print(
        f"\n{utterances} utterances ({len(sentences)} sentences x {len(voices)} voices), "
        f"each clean and through an 8 kHz mu-law phone line\n",
        file=stream,
    )
    print(report.table(), file=stream)
    print(
        "\nWER: edits / reference words over the corpus; capped: mean of per-utterance WER, "
        "each at most 100%; exact: utterances without an error; runaways: transcripts that "
        "more than doubled the words said.",
        file=stream,
    )
    print("\nBy voice:\n", file=stream)
    print(report.voice_table(), file=stream)
    for model in report.models:
        print(
            f"\n{model}: loaded in {report.load_s[model]:.2f} s; inference mean "
            f"{report.mean_inference_s(model) * 1000:.0f} ms, median "
            f"{report.percentile_inference_s(model, 50) * 1000:.0f} ms, p90 "
            f"{report.percentile_inference_s(model, 90) * 1000:.0f} ms",
            file=stream,
        )
    return report


if __name__ == "__main__":
    print_study(verbose="-v" in sys.argv[1:])

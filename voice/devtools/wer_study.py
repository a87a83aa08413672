"""The WER study: the bundled Whisper models on clean and telephone-quality speech.

- `CORPUS` and `VOICES`: short caller-like sentences, spoken on the fly by several espeak-ng
  voices and piper's bundled joe voice.
- `run_study(...)` → `StudyReport` (`.table()` renders Markdown), `print_study(...)` for the CLI
  (`hotline wer`, or `python -m voice.devtools.wer_study [-v] [--window fit|full]
  [--model NAME ...]`:
  `--window` compares the fitted encoder window with Whisper's full 30 s one).

The metric and the phone line are in `voice.devtools.wer`. Corpus WER is total edits over total
reference words (not a mean of per-utterance rates).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, TextIO

import numpy as np

from voice.audio import PCM, espeak, resample
from voice.devtools.wer import RATE, WordErrors, telephone, word_errors

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
    return resample(tts.synthesize_blocking(text), tts.sample_rate, RATE)


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
    window_s: float = 30.0  # the encoder window of the text kept (`Transcript.window_s`)
    retried: bool = False  # the fitted window looked wrong: the 30 s window's text

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
    window: Literal["fit", "full"] | None = None,
) -> StudyReport:
    """Transcribe every sentence by every voice, clean and over the phone, with every model.

    Models run one utterance at a time with the server's settings (int8, beam 1, English, the
    encoder window of `STTSettings` unless `window` says "fit" or "full"), so `inference_s` is
    the latency one caller's turn would see on an idle machine."""
    from pipeline.stt import SpeechToText, STTSettings

    report = StudyReport()
    audio = {
        (voice, text, condition): _CHANNELS[condition](voice.speak(text))
        for voice in voices
        for text in sentences
        for condition in conditions
    }
    for model in models:
        settings = STTSettings(model=model)
        if window is not None:
            settings = settings.model_copy(update={"window": window})
        stt = SpeechToText.shared(settings)
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
                window_s=transcript.window_s,
                retried=transcript.retried,
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
    window: Literal["fit", "full"] | None = None,
) -> StudyReport:
    """Run the study and print the Markdown tables (and, if `verbose`, every transcript)."""
    from pipeline.stt import STTSettings

    stream = out or sys.stdout

    def show(trial: Trial) -> None:
        if verbose:
            print(
                f"{trial.model:8} {trial.condition:9} {trial.voice.name:26} "
                f"{trial.errors.rate * 100:5.1f}% {trial.inference_s * 1000:4.0f} ms "
                f"{trial.window_s:2.0f}{'r' if trial.retried else ' '} {trial.hypothesis!r}",
                file=stream,
                flush=True,
            )

    report = run_study(models, voices, sentences, progress=show, window=window)
    utterances = len(voices) * len(sentences)
    print(
        f"\n{utterances} utterances ({len(sentences)} sentences x {len(voices)} voices), "
        f"each clean and through an 8 kHz mu-law phone line; encoder window: "
        f"{window or STTSettings().window}\n",
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
            f"{report.percentile_inference_s(model, 90) * 1000:.0f} ms, p95 "
            f"{report.percentile_inference_s(model, 95) * 1000:.0f} ms; retried in the 30 s "
            f"window: {sum(t.retried for t in report.trials if t.model == model)}",
            file=stream,
        )
    return report


if __name__ == "__main__":
    # python -m voice.devtools.wer_study [-v] [--window fit|full] [--model NAME ...]
    args = sys.argv[1:]
    after = {arg: args[i + 1] for i, arg in enumerate(args[:-1])}
    mode = after.get("--window")
    if mode not in (None, "fit", "full"):
        sys.exit(f"--window {mode}: use fit or full")
    chosen = tuple(args[i + 1] for i, arg in enumerate(args[:-1]) if arg == "--model")
    print_study(
        chosen or ("tiny.en", "base"),
        verbose="-v" in args,
        window=None if mode is None else "full" if mode == "full" else "fit",
    )

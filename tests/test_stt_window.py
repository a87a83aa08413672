"""The encoder window fitted to the audio: buckets, the loop guard, and fit against Whisper's own
30 s window with the bundled models on espeak-ng and piper speech."""

from __future__ import annotations

import functools
import statistics
import time
from pathlib import Path

import numpy as np
import pytest

from pipeline.stt import SpeechToText, STTSettings, resolve_model_dir
from pipeline.stt_window import (
    COMPRESSION_LIMIT,
    MARGIN_S,
    WindowedDecoder,
    compression_ratio,
    has_sound,
    looks_looped,
    repeated_run,
    window_for,
)
from tests.support.speech import RATE, concat, espeak, noise, silence, words_in_order
from voice.audio import resample
from voice.devtools.wer import word_errors

SENTENCES = (
    "Hi, I would like to book a table for four people tonight.",
    "My order number is four five seven two.",
    "Please transfer me to the billing department.",
    "Is parking included in the price?",
)


@functools.cache
def _steady_piper(text: str) -> np.ndarray:
    from pipeline.tts import TextToSpeech, TTSSettings

    voice = TextToSpeech.shared(TTSSettings(noise_scale=0.0, noise_w_scale=0.0))
    return resample(voice.synthesize_blocking(text), voice.sample_rate, RATE)


def piper(text: str) -> np.ndarray:
    """`text` in piper's bundled voice without its random variation (noise scales 0), so that
    every run hears the same audio: with piper's default noise, "Please transfer me" came out
    of the fitted window as "Place transfer meet" in 2 processes of 6, the 30 s window never."""
    return _steady_piper(text).copy()


def turn(speech: np.ndarray) -> np.ndarray:
    """Speech framed as the VAD hands over a turn: 200 ms before, 300 ms after."""
    return concat(silence(200), speech, silence(300))


def as_float(pcm: np.ndarray) -> np.ndarray:
    return pcm.astype(np.float32) / 32768.0


@pytest.fixture(scope="module")
def fit() -> SpeechToText:
    stt = SpeechToText.shared(STTSettings(window="fit"))
    stt.warm_up()
    return stt


@pytest.fixture(scope="module")
def full() -> SpeechToText:
    stt = SpeechToText.shared(STTSettings(window="full"))
    stt.warm_up()
    return stt


# -- the window ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("audio_s", "window"),
    [
        (0.3, 10),
        (1.5, 10),
        (6.0, 10),
        (6.01, 15),
        (11.0, 15),
        (11.5, 20),
        (16.01, 30),
        (26.0, 30),
        (26.01, None),  # not 4 s of silence left in 30 s: faster-whisper's own path
        (45.0, None),
    ],
)
def test_the_window_is_the_smallest_bucket_holding_audio_and_margin(
    audio_s: float, window: int | None
) -> None:
    assert MARGIN_S == 4.0
    assert window_for(audio_s) == window


# -- the loop guard --------------------------------------------------------------------------


def test_repeated_run_is_the_longest_stretch_repeating_the_one_before() -> None:
    assert repeated_run(words_in_order("Yes, that's right. Yes, that's right.")) == 3
    assert repeated_run(words_in_order("Yes, that's right. Yes, that's right. Yes")) == 4
    assert repeated_run(words_in_order("no no no")) == 2
    assert repeated_run(words_in_order("My order number is four five seven two")) == 0
    assert repeated_run([]) == 0


@pytest.mark.parametrize(
    ("text", "looped"),
    [
        # what tiny.en wrote in windows with too little silence after the speech
        ("Yes, that's right. Yes, that's right", True),
        ("Could you spell that for me, please? Could you spell that for", True),
        ("No, not your work, not your work, not your work.", True),
        ("L-M-R-O-O-O-O-O-O-O-O-O-O-O-O-O-O-O-O-O-O-O-O", True),
        # what callers say
        ("My phone number is 5, 5, 5, 2, 3, 8, 9, 1, 4, 0.", False),
        ("My phone number is five five five, two three eight, nine one four zero.", False),
        ("No, no, that's not what I asked for.", False),
        ("Thank you, thank you.", False),
        ("Hi, I would like to book a table for four people tonight.", False),
    ],
)
def test_the_loop_detector_tells_loops_from_speech(text: str, looped: bool) -> None:
    assert looks_looped(words_in_order(text), text, tokens=12, cap=40) is looped


def test_reaching_the_token_cap_is_a_loop() -> None:
    text = "I would like to"
    assert not looks_looped(words_in_order(text), text, tokens=39, cap=40)
    assert looks_looped(words_in_order(text), text, tokens=40, cap=40)


def test_compression_ratio_flags_character_loops() -> None:
    assert compression_ratio("") == 0.0
    assert compression_ratio("Is parking included in the price?") < 1.5
    assert compression_ratio("O-" * 40) > COMPRESSION_LIMIT


def test_has_sound_tells_silence_from_speech_and_noise() -> None:
    assert not has_sound(as_float(silence(2000)))
    assert not has_sound(np.zeros(0, dtype=np.float32))
    assert not has_sound(as_float(noise(2000, level=0.001)))  # -60 dBFS line hiss
    assert has_sound(as_float(noise(2000, level=0.02)))
    assert has_sound(as_float(turn(espeak("yes"))))
    assert has_sound(as_float(espeak("yes")[:300]))  # shorter than one 32 ms frame


def test_a_window_too_tight_loops_and_the_guard_catches_it() -> None:
    """The margin exists because Whisper reads a sentence twice when too little silence follows
    it: the guard must flag every such read."""
    from faster_whisper import WhisperModel

    settings = STTSettings()
    model = WhisperModel(
        str(resolve_model_dir(settings.model)),
        compute_type=settings.compute_type,
        cpu_threads=1,
        local_files_only=True,
    )
    decoder = WindowedDecoder(model, settings)
    samples = as_float(turn(piper("Yes, that's right.")))  # about 1.7 s
    cap = int(settings.max_tokens_per_s * len(samples) / RATE) + 8

    results = [decoder.decode(samples, window, cap) for window in (3, 4, 5, 6)]

    for result in results:
        print(f"{result.window_s} s window: {result.text!r} suspect={result.suspect}")
    repeats = [r for r in results if words_in_order(r.text).count("right") >= 2]
    assert repeats, "no tight window looped: nothing to catch"
    assert all(r.suspect for r in repeats)
    fitted = decoder.decode(samples, window_for(len(samples) / RATE) or 30, cap)
    assert words_in_order(fitted.text) == ["yes", "that's", "right"]
    assert not fitted.suspect


# -- fit against the full window -------------------------------------------------------------


def test_fit_gives_the_words_of_the_full_window(fit: SpeechToText, full: SpeechToText) -> None:
    """On natural-sounding speech both windows get (nearly) every word. Robotic espeak voices
    are left to the WER study: their misreadings change with any perturbation of the input,
    even between two processes running the same window."""
    fit_edits = full_edits = 0
    for reference in SENTENCES:
        audio = turn(piper(reference))
        a, b = fit.transcribe_blocking(audio), full.transcribe_blocking(audio)
        print(f"{a.audio_s:.1f} s: fit {a.window_s:.0f} s {a.text!r} | full {b.text!r}")
        assert (a.window_s, a.retried, b.window_s) == (10, False, 30)
        fit_edits += word_errors(reference, a.text).edits
        full_edits += word_errors(reference, b.text).edits

    assert fit_edits <= full_edits + 1


def test_the_window_follows_the_length_of_the_turn(fit: SpeechToText) -> None:
    short = turn(piper(SENTENCES[0]))  # about 3.7 s
    longer = turn(concat(*(piper(s) for s in SENTENCES[:3])))  # about 9 s
    too_long = concat(longer, silence(27_000 - len(longer) * 1000 // RATE))  # 27 s

    transcripts = [fit.transcribe_blocking(a) for a in (short, longer, too_long)]

    assert [t.window_s for t in transcripts] == [window_for(t.audio_s) or 30 for t in transcripts]
    assert [t.window_s for t in transcripts] == [10, 15, 30]
    assert not any(t.retried for t in transcripts)
    for t in transcripts[1:]:
        assert {"table", "order", "billing"} <= set(words_in_order(t.text))


def test_silence_skips_the_fitted_window(fit: SpeechToText) -> None:
    """A short window hears "you" in digital silence; silence goes to the 30 s path."""
    transcript = fit.transcribe_blocking(silence(2000))

    assert (transcript.text, transcript.window_s, transcript.retried) == ("", 30, False)


def test_no_words_from_sound_is_retried_in_the_full_window(
    fit: SpeechToText, full: SpeechToText
) -> None:
    tone = (np.sin(np.arange(RATE) * 2 * np.pi * 220 / RATE) * 3000).astype(np.int16)

    transcript = fit.transcribe_blocking(tone)

    print(f"tone: {transcript.text!r}, {transcript.inference_s * 1000:.0f} ms")
    assert transcript.retried
    assert transcript.window_s == 30
    assert transcript.text == full.transcribe_blocking(tone).text


def test_empty_audio_has_no_window(fit: SpeechToText) -> None:
    transcript = fit.transcribe_blocking(np.zeros(0, dtype=np.int16))

    assert (transcript.text, transcript.window_s, transcript.retried) == ("", 0.0, False)


@pytest.mark.serial
def test_fit_is_faster_than_full_in_the_same_run(fit: SpeechToText, full: SpeechToText) -> None:
    audio = turn(piper(SENTENCES[2]))
    times: dict[str, list[float]] = {"fit": [], "full": []}
    for _ in range(5):  # interleaved, so a busy moment slows both
        for name, stt in (("fit", fit), ("full", full)):
            started = time.perf_counter()
            transcript = stt.transcribe_blocking(audio)
            times[name].append(time.perf_counter() - started)
            assert not transcript.retried

    fit_s, full_s = statistics.median(times["fit"]), statistics.median(times["full"])
    print(f"median fit {fit_s * 1000:.0f} ms, full {full_s * 1000:.0f} ms")
    assert fit_s < 0.5 * full_s


def test_base_detects_the_language_and_takes_the_prompt_in_a_fitted_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOTLINE_CACHE_DIR", str(tmp_path))
    settings = STTSettings(
        model="base",
        language=None,
        initial_prompt="Sarah Johnson.",
        workers=1,
        cpu_threads=2,
        window="fit",
    )
    base = SpeechToText(settings)
    transcript = base.transcribe_blocking(turn(piper("My name is Sarah Johnson.")))

    print(f"base, language detected: {transcript.text!r} in {transcript.window_s:.0f} s")
    assert words_in_order(transcript.text) == ["my", "name", "is", "sarah", "johnson"]
    assert (transcript.window_s, transcript.retried) == (10, False)

"""Word error rate, the telephone channel, and one utterance through both with tiny.en."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from pipeline.stt import SpeechToText
from tests.support.speech import RATE, concat, espeak, silence
from voice.devtools.wer import (
    WordErrors,
    normalize,
    telephone,
    word_error_rate,
    word_errors,
)
from voice.devtools.wer_study import CORPUS, VOICES, StudyReport, Trial, run_study

# -- word error rate ------------------------------------------------------------------------


def test_identical_text_has_no_errors() -> None:
    assert word_error_rate("book a table for two", "book a table for two") == 0.0


def test_substitution_deletion_and_insertion_are_counted_apart() -> None:
    assert word_errors("book a table for two", "book the table for two") == WordErrors(
        substitutions=1, reference_words=5
    )
    assert word_errors("book a table for two", "book table for two") == WordErrors(
        deletions=1, reference_words=5
    )
    assert word_errors("book a table for two", "book a big table for two") == WordErrors(
        insertions=1, reference_words=5
    )
    assert word_error_rate("book a table for two", "book table for two") == pytest.approx(0.2)


def test_mixed_edits_take_the_cheapest_alignment() -> None:
    errors = word_errors("the cat sat on the mat", "a cat sat the mat today")

    assert (errors.substitutions, errors.deletions, errors.insertions) == (1, 1, 1)
    assert errors.rate == pytest.approx(3 / 6)


def test_insertions_can_push_the_rate_above_one() -> None:
    assert word_error_rate("yes", "yes yes yes yes") == pytest.approx(3.0)


def test_a_completely_wrong_transcript_scores_one() -> None:
    assert word_error_rate("cancel my order", "hello there friend") == pytest.approx(1.0)
    assert word_error_rate("cancel my order", "") == pytest.approx(1.0)


def test_empty_reference() -> None:
    assert word_error_rate("", "") == 0.0
    assert word_error_rate("", "um okay") == pytest.approx(2.0)
    assert word_error_rate("  ...  ", "") == 0.0


def test_case_and_punctuation_do_not_count() -> None:
    assert word_error_rate("Yes, that's right.", "yes thats RIGHT!") == 0.0
    assert word_error_rate("Okay, see you at 7 p.m.", "ok see you at seven pm") == 0.0


@pytest.mark.parametrize(
    ("written", "spoken"),
    [
        ("7", "seven"),
        ("21", "twenty-one"),
        ("My order number is 4572.", "my order number is four five seven two"),
        ("Call 555-238-9140", "call five five five two three eight nine one four zero"),
        ("Friday at 7:30", "friday at seven thirty"),
        ("Friday at 7.30", "friday at seven thirty"),
        ("Friday at 730", "friday at seven thirty"),
        ("at 7:00 pm", "at seven pm"),
        ("on the 21st", "on the twenty first"),
        ("$20", "twenty dollars"),
        ("Dr. Smith", "doctor smith"),
    ],
)
def test_numbers_written_as_digits_equal_the_words_said(written: str, spoken: str) -> None:
    assert normalize(written) == normalize(spoken)
    assert word_error_rate(spoken, written) == 0.0


def test_a_wrong_digit_is_one_error() -> None:
    assert word_error_rate("my order number is four five seven two", "My order is 4582") == (
        pytest.approx(2 / 8)  # "number" deleted, "seven" → "eight"
    )


def test_corpus_sentences_normalise_to_words() -> None:
    for sentence in CORPUS:
        words = normalize(sentence)
        assert words, sentence
        assert all(word.isalpha() and word.islower() for word in words), sentence


# -- the telephone channel -----------------------------------------------------------------


def _power_above(pcm: npt.NDArray[np.int16], hz: float) -> float:
    spectrum = np.abs(np.fft.rfft(pcm.astype(np.float64))) ** 2
    freqs = np.fft.rfftfreq(len(pcm), 1.0 / RATE)
    return float(spectrum[freqs > hz].sum() / spectrum.sum())


@pytest.fixture(scope="module")
def speech() -> npt.NDArray[np.int16]:
    return concat(silence(200), espeak("Please send a taxi to the station", "en-gb"), silence(300))


def test_telephone_keeps_rate_and_duration(speech: npt.NDArray[np.int16]) -> None:
    line = telephone(speech)

    assert line.dtype == np.int16
    assert abs(len(line) - len(speech)) <= RATE // 50  # within one 20 ms frame


def test_telephone_is_band_limited(speech: npt.NDArray[np.int16]) -> None:
    """Above 4 kHz the line keeps none of the speech, only the images of the caller path's
    upsampler (soxr "QQ" in `StreamResampler`, about -23 dB: 0.5% of the power here)."""
    line = telephone(speech)

    assert _power_above(speech, 4000) > 1e-2  # espeak puts real energy up there (3.7%)
    assert _power_above(line, 4000) < 1e-2
    assert _power_above(line, 4000) < _power_above(speech, 4000) / 5


def test_telephone_degrades_but_keeps_the_speech(speech: npt.NDArray[np.int16]) -> None:
    line = telephone(speech)
    n = min(len(line), len(speech))
    a, b = speech[:n].astype(np.float64), line[:n].astype(np.float64)

    correlation = float(np.corrcoef(a, b)[0, 1])
    distortion = float(np.sqrt(np.mean((a - b) ** 2)) / np.sqrt(np.mean(a**2)))
    assert correlation > 0.8
    assert distortion > 0.2  # measurably not the input (about 0.4 here)
    assert np.array_equal(telephone(speech), line)  # deterministic


def test_telephone_without_band_pass_keeps_the_low_end(speech: npt.NDArray[np.int16]) -> None:
    def below_250(pcm: npt.NDArray[np.int16]) -> float:
        return 1.0 - _power_above(pcm, 250)

    assert below_250(telephone(speech, band=False)) > 10 * below_250(telephone(speech))


def test_telephone_of_silence_is_silence() -> None:
    assert np.abs(telephone(silence(500))).max() <= 1  # soxr's int16 output dithers by 1 LSB
    assert len(telephone(np.zeros(0, dtype=np.int16))) == 0


# -- end to end: one sentence through the line into tiny.en ----------------------------------


def test_one_phone_utterance_transcribed_by_tiny_en() -> None:
    sentence = "I need to cancel my appointment for tomorrow morning."
    stt = SpeechToText.shared()

    clean = stt.transcribe_blocking(VOICES[0].speak(sentence))
    phone = stt.transcribe_blocking(telephone(VOICES[0].speak(sentence)))

    print(f"clean: {clean.text!r}  phone: {phone.text!r}")
    assert word_error_rate(sentence, clean.text) < 0.25
    assert word_error_rate(sentence, phone.text) < 0.5


def test_run_study_reports_every_trial_and_renders_a_table() -> None:
    voices = [VOICES[0]]
    sentences = ["Yes, that's right."]

    report = run_study(models=["tiny.en"], voices=voices, sentences=sentences)

    assert [(t.model, t.condition) for t in report.trials] == [
        ("tiny.en", "clean"),
        ("tiny.en", "telephone"),
    ]
    assert report.wer("tiny.en", "clean") <= 0.5
    assert all(t.inference_s > 0 for t in report.trials)
    table = report.table().splitlines()
    assert table[0].startswith("| model | audio | WER espeak-ng | WER all |")
    assert len(table) == 4  # header, rule, clean, telephone
    assert "tiny.en" in table[2] and "tiny.en" in table[3]


def test_report_aggregates_edits_not_per_utterance_rates() -> None:
    def trial(reference: str, hypothesis: str) -> Trial:
        return Trial(
            model="m",
            condition="telephone",
            voice=VOICES[0],
            reference=reference,
            hypothesis=hypothesis,
            errors=word_errors(reference, hypothesis),
            inference_s=0.3,
            audio_s=1.0,
        )

    report = StudyReport(
        trials=[
            trial("yes", "no"),  # 1 edit / 1 word
            trial("my order number is four five seven two", "my order number is 4572"),
            trial("no", "no no no no"),  # a runaway: 3 insertions
        ]
    )

    assert report.wer("m", "telephone") == pytest.approx(4 / 10)
    assert report.capped_wer("m", "telephone") == pytest.approx((1 + 0 + 1) / 3)
    assert report.exact("m", "telephone") == pytest.approx(1 / 3)
    assert report.runaways("m", "telephone") == 1
    assert report.mean_inference_s("m") == pytest.approx(0.3)
    assert np.isnan(report.wer("m", "clean"))

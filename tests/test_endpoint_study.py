"""The endpoint study's machinery on a few utterances: splits, early ends, their timing."""

from __future__ import annotations

from pipeline.endpoint import sounds_finished
from pipeline.turns import TurnSettings
from voice.devtools.endpoint_study import Ear, Setting, Utterance, run_study, simulate
from voice.devtools.wer_study import Voice

# espeak-ng stops ~420 ms between these two sentences at 160 wpm: a split at 300 or 400 ms of
# end silence, not at 500.
OKAY_THANKS = Utterance(Voice("espeak en-us 160", "espeak", "en-us", 160), "Okay. Thanks.")
TAXI = Utterance(
    Voice("espeak en-us 160", "espeak", "en-us", 160), "I need a taxi, to the airport."
)


def hearing(text: str, inference_s: float = 0.05) -> Ear:
    """An ear that hears `text` in every pause, after `inference_s`."""
    return Ear("fit", lambda _audio: (text, inference_s))


def test_a_sentence_stop_splits_a_turn_at_300_ms_and_the_report_counts_it() -> None:
    report = run_study([OKAY_THANKS], end_silences=(300, 500), early=(), ears=[])
    assert report.split_rate(Setting(300)) == 1.0
    assert report.split_rate(Setting(500)) == 0.0
    assert 500 <= report.delay_ms(Setting(500), 50) <= 530
    assert "| 300 ms | – | 100.0% |" in report.table()


def test_a_finished_sounding_pause_ends_the_turn_early_and_can_split_it() -> None:
    ear = hearing("I need a taxi.")
    report = run_study([OKAY_THANKS], end_silences=(), early=[(500, 300)], ears=[ear])
    setting = Setting(500, 300, "fit")
    assert report.split_rate(setting) == 1.0  # the stop between the sentences sounded finished
    assert report.split_early(setting) == 1
    assert report.early(setting) == 1  # and so did the end
    assert 300 <= report.delay_ms(setting, 50) < 360
    assert len(report.heard["fit"]) == 2
    assert [h.more for h in report.heard["fit"]] == [True, False]
    assert "1/1 (100%)" in report.transcript_table()


def test_an_unfinished_sounding_pause_waits_the_whole_end_silence() -> None:
    settings = TurnSettings(finished_silence_ms=300)
    outcome = simulate(OKAY_THANKS, settings, hearing("Okay"))
    assert (outcome.segments, outcome.early, outcome.hastened) == (1, False, 0)
    assert outcome.delay_s >= 0.5


def test_a_transcript_that_comes_too_late_changes_nothing() -> None:
    settings = TurnSettings(finished_silence_ms=300, pause_ms=200)
    late = simulate(OKAY_THANKS, settings, hearing("I need a taxi.", inference_s=0.45))
    assert (late.segments, late.early) == (1, False)  # speech resumed, then the turn ended
    assert late.delay_s >= 0.5
    # In time for the end, the turn ends as soon as the transcript is in (pause + 150 ms, the
    # pause being 224 ms: 7 windows of 32 ms).
    soon = simulate(TAXI, settings, hearing("I need a taxi.", inference_s=0.15))
    assert soon.early
    assert 0.35 <= soon.delay_s < 0.45


def test_tiny_en_hears_a_whole_sentence_at_the_end_of_a_turn() -> None:
    """The real model (about a second): the end of the turn reads as finished. When it arrives
    depends on how busy the machine is, so this leaves the timing to the tests above."""
    ear = Ear("fit")
    run_study([TAXI], end_silences=(), early=[(500, 300)], ears=[ear])
    last = [h for h in ear.heard.values() if not h.more]
    assert len(last) == 1
    assert "taxi" in last[0].text.lower()
    assert sounds_finished(last[0].text), last[0].text
    assert 0 < last[0].inference_s < 5

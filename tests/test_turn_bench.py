"""`hotline turn-bench`: scoring on hand-built decisions, the recipe on synthetic clips, the VAD
replay on piper speech (no downloads, no network)."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from pipeline.turn_taking.policy import TurnPolicy, end_delay_ms
from tests.support.speech import noise, piper, silence
from voice.devtools.turn_bench.corpus import (
    LEAD_MS,
    RATE,
    TAIL_MS,
    Gap,
    Pools,
    Turn,
    phrases,
    trim,
)
from voice.devtools.turn_bench.decisions import (
    Decision,
    Pause,
    category,
    load,
    pauses,
    phone_line,
    save,
)
from voice.devtools.turn_bench.recipe import build_turns
from voice.devtools.turn_bench.report import plot, print_report, write_json
from voice.devtools.turn_bench.run import BenchResult, PathResult
from voice.devtools.turn_bench.scoring import (
    ROWS,
    Goal,
    Point,
    Row,
    best,
    bound,
    cutoffs_at,
    delay_at,
    delay_ms,
    evaluate,
    pareto,
    score_row,
)
from voice.devtools.turn_bench.sources import Clip, sdist_url

SILENCE, TEXT, MODEL, VETO, UNFINISHED = ROWS


def decision(
    silence_ms: float,
    score: float = 0.5,
    text: str = "Okay.",
    category: str = "sentence",
    model_ms: float = 50.0,
    stt_ms: float = 100.0,
) -> Decision:
    return Decision("t", "kind", category, 120.0, silence_ms, score, model_ms, text, stt_ms)


def test_a_policy_that_never_ends_early_cuts_nothing_off_and_waits_the_timeout() -> None:
    decisions = [decision(300), decision(900), decision(math.inf), decision(math.inf)]
    point = evaluate(decisions, SILENCE, 0.5, 0, 1000)
    assert point.cutoff_rate == 0.0
    assert point.mean_delay_ms == 1000
    short = evaluate(decisions, SILENCE, 0.5, 0, 600)
    assert short.cutoff_rate == 0.5  # the 900 ms hold is cut off at 600 ms


def test_a_confident_model_ends_once_its_score_is_in_and_min_delay_has_passed() -> None:
    policy = MODEL.policy(0.5, 100)
    assert delay_ms(decision(math.inf, score=0.9), policy, 1000, MODEL) == 170  # 120 + 50
    policy = MODEL.policy(0.5, 300)
    assert delay_ms(decision(math.inf, score=0.9), policy, 1000, MODEL) == 300
    assert delay_ms(decision(math.inf, score=0.2), policy, 1000, MODEL) == 1000
    # the timeout fires before a slow model has answered
    slow = decision(math.inf, score=0.9, model_ms=500)
    assert delay_ms(slow, MODEL.policy(0.5, 0), 300, MODEL) == 300


def test_the_hanging_words_veto_counts_only_once_the_transcript_has_arrived() -> None:
    policy = VETO.policy(0.5, 300)
    early_words = decision(math.inf, score=0.9, text="My number is", stt_ms=100)
    assert delay_ms(early_words, policy, 1500, VETO) == 1500
    late_words = decision(math.inf, score=0.9, text="My number is", stt_ms=400)
    assert delay_ms(late_words, policy, 1500, VETO) == 300  # ended before the words came
    finished = decision(math.inf, score=0.9, text="That's all.", stt_ms=100)
    assert delay_ms(finished, policy, 1500, VETO) == 300


def test_text_rules_end_no_sooner_than_the_transcript() -> None:
    policy = TEXT.policy(0.5, 0)
    assert delay_ms(decision(math.inf, text="I need a taxi."), policy, 900, TEXT) == 220
    assert delay_ms(decision(math.inf, text="I need a"), policy, 900, TEXT) == 900


def test_waiting_for_the_words_holds_a_confident_model_until_the_transcript() -> None:
    row = Row(
        "wait",
        lambda t, m: TurnPolicy(threshold=t, min_delay_ms=m, wait_for_words=True),
        True,
        True,
    )
    late = decision(math.inf, score=0.9, text="To leave a message,", stt_ms=400)
    assert delay_ms(late, row.policy(0.5, 100), 1500, row) == 1500
    done = decision(math.inf, score=0.9, text="That is all.", stt_ms=400)
    assert delay_ms(done, row.policy(0.5, 100), 1500, row) == 520  # 120 + 400


def test_words_that_do_not_sound_finished_veto_a_confident_model() -> None:
    policy = UNFINISHED.policy(0.5, 300)
    digits = decision(math.inf, score=0.9, text="My number is 5 5 5", stt_ms=100)
    assert delay_ms(digits, policy, 1500, UNFINISHED) == 1500
    finished = decision(math.inf, score=0.9, text="That is all.", stt_ms=100)
    assert delay_ms(finished, policy, 1500, UNFINISHED) == 300


def test_the_default_policy_keeps_its_meaning() -> None:
    policy = TurnPolicy()
    assert end_delay_ms(policy, 900, 0.9, None) == policy.min_delay_ms
    assert end_delay_ms(policy, 900, 0.9, "My number is five five five") == policy.min_delay_ms
    assert end_delay_ms(policy, 900, 0.9, "To leave a message,") == 900
    assert end_delay_ms(policy, 900, policy.threshold / 2, "That is all.") == 900


def test_held_through_counts_only_pauses_after_words_that_go_on() -> None:
    decisions = [
        decision(700, score=0.1, category="continuation"),
        decision(700, score=0.9, category="digits"),
        decision(700, score=0.9, category="sentence"),
        decision(math.inf, score=0.9),
    ]
    point = evaluate(decisions, MODEL, 0.5, 200, 1200)
    assert point.held_through == 0.5
    assert point.cutoff_rate == pytest.approx(2 / 3)


def test_the_bound_gives_ends_and_pauses_after_finished_sentences_one_delay() -> None:
    decisions = [
        decision(700, category="sentence"),
        decision(250, category="sentence"),
        decision(3000, category="continuation"),  # known to go on: never cut
        decision(2000, category="digits"),
        decision(math.inf, category="end"),
    ]
    result = bound(decisions, delays=(200, 300, 800))
    points = {p.mean_delay_ms: p.cutoff_rate for p in result.points}
    assert points == {200: 0.5, 300: 0.25, 800: 0.0}  # of 4 holds
    assert result.cutoffs_300 == 0.25
    assert result.delay_5 == 700  # interpolated between 300 ms (25%) and 800 ms (0%)
    # every row's best is no better at the same mean delay: the model row on these decisions
    model = score_row(decisions, MODEL)
    for point in model.points:
        reachable = [p for p in result.points if p.mean_delay_ms <= point.mean_delay_ms]
        assert not reachable or min(p.cutoff_rate for p in reachable) <= point.cutoff_rate


def _p(delay: float, cutoffs: float) -> Point:
    return Point(0.5, 0, 1000, delay, cutoffs, math.nan)


def test_pareto_keeps_only_points_nothing_beats() -> None:
    points = [_p(300, 0.5), _p(400, 0.6), _p(500, 0.2), _p(500, 0.3), _p(800, 0.2), _p(900, 0.1)]
    frontier = pareto(points)
    assert [(p.mean_delay_ms, p.cutoff_rate) for p in frontier] == [
        (300, 0.5),
        (500, 0.2),
        (900, 0.1),
    ]


def test_interpolation_between_frontier_points() -> None:
    frontier = [_p(200, 0.6), _p(400, 0.2), _p(800, 0.0)]
    assert cutoffs_at(frontier, 300) == pytest.approx(0.4)
    assert cutoffs_at(frontier, 600) == pytest.approx(0.1)
    assert cutoffs_at(frontier, 100) is None  # faster than any policy
    assert cutoffs_at(frontier, 2000) == 0.0
    assert delay_at(frontier, 0.05) == pytest.approx(700)
    assert delay_at(frontier, 0.4) == pytest.approx(300)
    assert delay_at([_p(200, 0.6), _p(400, 0.2)], 0.1) is None


def test_best_operating_point_says_whether_the_goal_is_met() -> None:
    points = [_p(300, 0.2), _p(420, 0.05), _p(500, 0.04), _p(700, 0.01)]
    point, met = best(points, Goal(0.05, 450))
    assert point is not None and point.mean_delay_ms == 420 and met
    point, met = best(points, Goal(0.02, 450))
    assert point is not None and point.mean_delay_ms == 700 and not met
    assert best(points, Goal(0.001, 450)) == (None, False)


def tone(ms: int, hz: float = 440.0) -> np.ndarray:
    t = np.arange(RATE * ms // 1000) / RATE
    return (8000 * np.sin(2 * np.pi * hz * t)).astype(np.int16)


def test_phrases_cut_a_clip_at_its_internal_silences_in_order() -> None:
    audio = np.concatenate([tone(400), silence(80), tone(300), silence(200), tone(500)])
    clip = Clip("x", "To leave a message, please. Thank you.", audio, 16000)
    split = phrases(clip)
    assert split is not None
    assert [t for t, _ in split] == ["To leave a message,", "please.", "Thank you."]
    lengths = [len(a) * 1000 // RATE for _, a in split]
    assert lengths == pytest.approx([400, 300, 500], abs=20)
    two_pieces = np.concatenate([tone(300), silence(100), tone(300)])
    assert phrases(Clip("y", "One, two, three.", two_pieces, 16000)) is None  # 2 gaps wanted


READING = "he was not an ill disposed young man"


def tone_pools() -> Pools:
    """The recipe's pools made of tones: each piece a different pitch."""
    pieces = iter(range(200, 4000, 37))

    def piece(ms: int = 300) -> np.ndarray:
        return tone(ms, next(pieces))

    sentence = [("Hello there,", piece()), ("how are you.", piece())]
    prompt = [("To leave a message,", piece()), ("press one.", piece())]
    return Pools(
        sentences=(sentence, [("Thank you.", piece())]),
        prompts=(prompt,),
        digits={**{str(d): piece(150) for d in range(10)}, "oh": piece(150)},
        lead_ins=(("the number i have is", piece()),),
        items=tuple((f"Day{i}", piece(200)) for i in range(19)),
        words={"and": piece(100), "no": piece(100)},
        librivox=(
            Clip(
                "l",
                "he was not an ill disposed young man",
                piece(2000),
                16000,
                tuple((w, 0.25 * i, 0.25 * i + 0.2) for i, w in enumerate(READING.split())),
            ),
        ),
        fillers={"um": piece(200), "uh": piece(150)},
    )


def test_the_recipe_is_the_same_for_the_same_seed() -> None:
    pools = tone_pools()
    first, again, other = (
        build_turns(pools, 7, 30),
        build_turns(pools, 7, 30),
        build_turns(pools, 8, 30),
    )
    assert [t.text for t in first] == [t.text for t in again]
    assert all(
        np.array_equal(a.audio, b.audio) and a.gaps == b.gaps
        for a, b in zip(first, again, strict=True)
    )
    assert [t.text for t in first] != [t.text for t in other]


def test_inserted_pauses_are_silent_and_the_speech_around_them_is_not() -> None:
    turns = build_turns(tone_pools(), 3, 40)
    gaps = [(turn, gap) for turn in turns for gap in turn.gaps]
    assert {g.category for _, g in gaps} == {"sentence", "continuation", "digits", "hesitation"}
    for turn, gap in gaps:
        length = round(gap.ms * RATE / 1000)
        inside = turn.audio[gap.start : gap.start + length]
        assert np.abs(inside.astype(np.int32)).max(initial=0) < 20, (turn.text, gap)
        before = turn.audio[gap.start - 160 : gap.start]
        after = turn.audio[gap.start + length : gap.start + length + 160]
        assert np.abs(before).max() > 1000 and np.abs(after).max() > 1000, (turn.text, gap)
    for turn in turns:
        assert not np.abs(turn.audio[-RATE * TAIL_MS // 1000 :].astype(np.int32)).max() > 20
        assert not np.abs(turn.audio[: RATE * LEAD_MS // 1000].astype(np.int32)).max() > 20


def test_category_matches_a_vad_silence_to_the_pause_inserted_there() -> None:
    gaps = (Gap("digits", 16000, 500.0), Gap("hesitation", 32000, 300.0))
    turn = Turn("t", "k", "x", silence(100), gaps)
    at = [
        category(turn, Pause(position, 120, 400, silence(10)))
        for position in (16000 - 800, 16000 + 4000, 32000 + 100, 26000)
    ]
    assert at == ["digits", "digits", "hesitation", "natural"]
    assert category(turn, Pause(16000, 120, math.inf, silence(10))) == "end"


def test_the_vad_replay_finds_each_pause_and_measures_its_silence() -> None:
    words = trim(piper("My number is five five five."))
    more = trim(piper("One two three."))
    audio = np.concatenate([silence(300), words, silence(700), more, silence(2000)])
    found = pauses(audio)
    assert [p.end for p in found][-1] and sum(p.end for p in found) == 1
    long_holds = [p for p in found if not p.end and p.silence_ms > 400]
    assert len(long_holds) == 1 and long_holds[0].silence_ms == pytest.approx(700, abs=100)
    assert all(100 <= p.offered_ms <= 200 for p in found)
    heard = pauses(phone_line(audio))
    assert sum(p.end for p in heard) == 1 and any(abs(p.silence_ms - 700) < 100 for p in heard)


def test_the_phone_path_narrows_the_audio_to_a_phone_line() -> None:
    hiss = noise(1000, level=0.1)
    line = phone_line(hiss)
    assert abs(len(line) - len(hiss)) < 160

    def above_4khz(pcm: np.ndarray) -> float:
        power = np.abs(np.fft.rfft(pcm.astype(np.float64))) ** 2
        return float(power[np.fft.rfftfreq(len(pcm), 1 / RATE) > 4200].sum() / power.sum())

    assert above_4khz(hiss) > 0.4 and above_4khz(line) < 0.05  # QQ images: -26 dB


def test_cached_decisions_come_back_as_they_were_saved(tmp_path: Path) -> None:
    decisions = [decision(420.0, score=0.25, text="To leave a message,"), decision(math.inf)]
    save(decisions, tmp_path / "features.json")
    assert load(tmp_path / "features.json") == decisions
    (tmp_path / "broken.json").write_text("[{]")
    assert load(tmp_path / "broken.json") is None
    assert load(tmp_path / "missing.json") is None


def test_the_report_writes_tables_json_and_a_plot(tmp_path: Path) -> None:
    decisions = [
        decision(350, score=0.9, text="Hello.", category="sentence"),
        decision(500, score=0.2, text="My number is 5 5 5", category="digits"),
        decision(math.inf, score=0.8, text="Hello. My number is 5 5 5 1 2 3 4."),
        decision(math.inf, score=0.3, text="Thanks."),
    ]
    rows = [score_row(decisions, row) for row in ROWS]
    result = BenchResult([], [PathResult("phone", decisions, rows, 0.0)], 1.0)
    console = Console(file=io.StringIO(), width=200)
    print_report(result, console)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert all(row.name in text for row in ROWS) and "eot-bench: silence only" in text
    write_json(result, tmp_path / "bench.json")
    saved = json.loads((tmp_path / "bench.json").read_text())
    silence_row = saved["paths"][0]["rows"][0]
    assert silence_row["row"] == "silence only" and silence_row["frontier"]
    plot(result, tmp_path / "pareto.png")
    assert (tmp_path / "pareto.png").read_bytes()[:4] == b"\x89PNG"


def test_the_sdist_is_read_from_the_simple_index_with_its_hash() -> None:
    page = (
        '<a href="https://x/pocketsphinx-5.1.0.tar.gz#sha256=aa">5.1.0</a>'
        '<a href="https://x/pocketsphinx-5.1.1-cp311-manylinux.whl#sha256=bb">w</a>'
        '<a href="https://x/pocketsphinx-5.1.1.tar.gz#sha256=cc">5.1.1</a>'
    )
    assert sdist_url(page) == ("https://x/pocketsphinx-5.1.1.tar.gz", "cc")
    with pytest.raises(RuntimeError):
        sdist_url(page.replace("5.1.1.tar.gz", "5.1.2.tar.gz"))

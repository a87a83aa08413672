"""Tests for voice.experiments.report: per-arm summaries, cluster bootstrap, text/CSV/PNG output."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from voice.experiments.report import (
    CSV_COLUMNS,
    _weighted_percentile,
    build_report,
    plot_report,
    render_report,
    write_csv,
)
from voice.experiments.turn_records import load_jsonl

EXP = "latency-1"


def turn(
    call_id: str,
    arm: str,
    first_audio: float | None,
    *,
    n: int = 0,
    budget: float | None = 800.0,
    effort: str = "low",
    tier: str = "small",
    taken: str = "planned",
    interrupted: bool = False,
    error_ms: float | None = None,
    experiment: str = EXP,
) -> dict[str, Any]:
    timings: dict[str, float] = {"endpoint": 200.0, "stt": 90.0}
    if first_audio is not None:
        timings["first_audio"] = first_audio
    return {
        "call_id": call_id,
        "experiment": experiment,
        "arm": arm,
        "budget_ms": budget,
        "turn": n,
        "interrupted": interrupted,
        "timings_ms": timings,
        "effort": "stale",  # the decision's effort wins over the top-level one
        # the provider's service tiers: never counted as tiers (those are the decision's)
        "service_tier_requested": "stale",
        "service_tier_served": "stale",
        "decision": {
            "taken": taken,
            "effort": effort,
            "tier": tier,
            "planned_effort": effort,
            "planned_tier": tier,
            "fits": True,
            "predicted_first_audio_ms": 750.0,
            "actual_first_audio_ms": first_audio,
            "error_ms": error_ms,
        },
    }


def two_arms(seed: int = 1) -> list[dict[str, Any]]:
    """Arm "fast": 8 calls x 6 turns at 700-900 ms; arm "slow": 8 calls x 6 turns at 1400-1800."""
    rng = np.random.default_rng(seed)
    records: list[dict[str, Any]] = []
    for c in range(8):
        for t in range(6):
            i = c * 6 + t
            records.append(
                turn(f"f{c}", "fast", float(rng.uniform(700, 900)), n=t,
                     effort="low" if t % 3 else "medium", taken="fallback" if i % 12 == 0 else
                     "planned", interrupted=i % 8 == 0, error_ms=-40.0 if t % 2 else 60.0)
            )  # fmt: skip
            records.append(
                turn(f"s{c}", "slow", float(rng.uniform(1400, 1800)), n=t, budget=1000.0,
                     effort="high", tier="large", taken="hedge" if i % 16 == 0 else "planned")
            )  # fmt: skip
    return records


def values(records: list[dict[str, Any]], arm: str) -> np.ndarray:
    return np.array([r["timings_ms"]["first_audio"] for r in records if r["arm"] == arm])


def diff(report: Any, arm: str, metric: str) -> Any:
    [d] = [d for d in report.differences if d.arm == arm and d.metric == metric]
    return d


def test_summaries_match_numpy_and_counts() -> None:
    records = two_arms()
    report = build_report(records, EXP)
    fast, slow = report.arms
    assert (fast.arm, slow.arm) == ("fast", "slow")
    assert (fast.calls, fast.turns, slow.calls, slow.turns) == (8, 48, 8, 48)
    assert fast.budget_ms == 800.0 and slow.budget_ms == 1000.0
    for summary in (fast, slow):
        v = values(records, summary.arm)
        assert summary.p50_ms == pytest.approx(np.percentile(v, 50))
        assert summary.p95_ms == pytest.approx(np.percentile(v, 95))
    assert fast.within_budget == pytest.approx(np.mean(values(records, "fast") <= 800))
    assert fast.within_budget is not None and 0.3 < fast.within_budget < 0.7
    assert slow.within_budget == 0.0
    assert fast.efforts == {"low": 32, "medium": 16}
    assert list(fast.efforts) == ["low", "medium"]
    assert slow.efforts == {"high": 48} and slow.tiers == {"large": 48}
    assert (fast.fallbacks, fast.hedges, slow.fallbacks, slow.hedges) == (4, 0, 0, 3)
    assert fast.barge_in_rate == pytest.approx(6 / 48) and slow.barge_in_rate == 0.0
    assert fast.mean_abs_prediction_error_ms == pytest.approx(50.0)
    assert slow.mean_abs_prediction_error_ms is None


def test_differences_for_clearly_different_arms() -> None:
    report = build_report(two_arms(), EXP, reference="fast", resamples=1000)
    assert {(d.arm, d.reference) for d in report.differences} == {("slow", "fast")}
    assert [d.metric for d in report.differences] == [
        "p50_ms", "p95_ms", "within_budget", "barge_in_rate",
    ]  # fmt: skip
    fast, slow = report.arms
    assert fast.p95_ms is not None and slow.p95_ms is not None
    p95 = diff(report, "slow", "p95_ms")
    assert p95.estimate == pytest.approx(slow.p95_ms - fast.p95_ms)
    assert p95.low <= p95.estimate <= p95.high
    assert p95.low > 400  # excludes 0 by a wide margin
    within = diff(report, "slow", "within_budget")
    assert within.high < 0 and within.low <= within.estimate <= within.high
    # Deterministic for a seed; another seed moves the interval a little.
    again = build_report(two_arms(), EXP, reference="fast", resamples=1000)
    assert again.differences == report.differences
    other = build_report(two_arms(), EXP, reference="fast", resamples=1000, seed=7)
    assert other.differences != report.differences


def test_identical_arms_interval_contains_zero() -> None:
    records = [r for r in two_arms() if r["arm"] == "fast"]
    records += [{**r, "arm": "copy", "call_id": "c" + r["call_id"]} for r in records]
    report = build_report(records, EXP)
    assert [a.arm for a in report.arms] == ["fast", "copy"]
    for d in report.differences:
        assert d.reference == "fast" and d.estimate == pytest.approx(0.0)
        assert d.low < 0 < d.high or d.low == d.high == 0


def test_arm_order_and_reference_arguments() -> None:
    report = build_report(two_arms(), EXP, arms=["slow", "fast"])
    assert [a.arm for a in report.arms] == ["slow", "fast"]
    assert diff(report, "fast", "p50_ms").estimate < -400
    with pytest.raises(ValueError, match="nope"):
        build_report(two_arms(), EXP, arms=["fast", "nope"])
    with pytest.raises(ValueError, match="reference"):
        build_report(two_arms(), EXP, arms=["fast"], reference="slow")


def test_other_experiments_ignored_and_missing_first_audio_outside_budget() -> None:
    records = [
        turn("a", "x", 500.0), turn("a", "x", None, n=1), turn("b", "x", 700.0),
        turn("b", "x", 900.0, n=1),
        turn("z", "x", 100.0, experiment="other"), turn("z", "y", 100.0, experiment="other"),
    ]  # fmt: skip
    report = build_report(records, EXP)
    [x] = report.arms
    assert (x.calls, x.turns) == (2, 4)
    assert x.within_budget == pytest.approx(0.5)  # 500 and 700 within; None and 900 not
    assert x.p50_ms == pytest.approx(700.0)  # percentiles over the three measured turns
    assert report.differences == []
    with pytest.raises(ValueError, match="no turn records for experiment nope"):
        build_report(records, "nope")


def test_no_budget_gives_no_within_share_and_skips_that_difference() -> None:
    records = [turn(f"a{i}", "a", 800.0 + i, budget=None) for i in range(5)]
    records += [turn(f"b{i}", "b", 900.0 + i, budget=1000.0) for i in range(5)]
    report = build_report(records, EXP)
    assert report.arms[0].within_budget is None and report.arms[1].within_budget == 1.0
    assert "within_budget" not in {d.metric for d in report.differences}


def test_tier_mix_counts_the_tiers_that_spoke_not_service_tiers() -> None:
    answered = turn("a", "x", 700.0, tier="fast")
    failed = turn("b", "x", None, taken="failed")
    failed["decision"] |= {"tier": None, "effort": None}  # no tier answered
    report = build_report([answered, failed], EXP)
    assert report.arms[0].tiers == {"fast": 1}  # not the failed turn's service tier, "stale"


def clustered_arm(clustered: bool) -> list[dict[str, Any]]:
    """10 calls x 10 turns, 10 of the 100 turns slow (1500 ms): all in one call, or one per call.

    A reference arm with every turn at 700 ms makes the reference's resamples constant, so the
    difference interval is the arm's own interval.
    """
    records = [turn(f"r{c}", "ref", 700.0, n=t) for c in range(10) for t in range(10)]
    for c in range(10):
        for t in range(10):
            slow = c == 0 if clustered else t == 0
            records.append(turn(f"a{c}", "arm", 1500.0 if slow else 700.0, n=t))
    return records


def test_bootstrap_resamples_calls_not_turns() -> None:
    wide = build_report(clustered_arm(True), EXP, reference="ref")
    narrow = build_report(clustered_arm(False), EXP, reference="ref")
    # Same turns, so the same point estimates...
    for a, b in zip(wide.differences, narrow.differences, strict=True):
        assert a.estimate == pytest.approx(b.estimate)
    # ...but with one slow turn in every call each resample of calls has exactly 10% slow turns,
    # so the interval collapses; a turn-level bootstrap would give both the same (wide) interval.
    w, n = diff(wide, "arm", "within_budget"), diff(narrow, "arm", "within_budget")
    assert w.estimate == pytest.approx(-0.1)
    assert n.low == pytest.approx(-0.1) and n.high == pytest.approx(-0.1)
    assert w.high - w.low > 0.15
    assert w.low < -0.15 and w.high > -0.05


def test_weighted_percentile_matches_numpy_on_expanded_sample() -> None:
    rng = np.random.default_rng(3)
    vals = rng.uniform(0, 1000, 30)
    vals[[4, 9]] = np.nan
    weights = rng.integers(0, 4, size=(50, 30)).astype(np.float64)
    weights[:, 0] = 1  # never empty
    for q in (0.0, 5.0, 50.0, 95.0, 100.0):
        got = _weighted_percentile(vals, weights, q)
        ok = ~np.isnan(vals)
        want = [np.percentile(np.repeat(vals[ok], w[ok].astype(int)), q) for w in weights]
        np.testing.assert_allclose(got, want, rtol=1e-9)


def test_bootstrap_over_a_hundred_and_twenty_calls_compares_every_arm() -> None:
    """Three arms of 40 calls, 2000 resamples: every arm against the reference on every metric.
    (How fast it is belongs to `hotline bench`, not to a wall-clock bound here.)"""
    records = [
        turn(f"{arm}{c}", arm, 600.0 + 37.0 * ((c * 7 + t) % 23), n=t)
        for arm in ("a", "b", "c") for c in range(40) for t in range(8)
    ]  # fmt: skip
    report = build_report(records, EXP, resamples=2000)
    assert report.resamples == 2000
    assert len(report.differences) == 8  # two arms x four metrics
    pairs = {(d.arm, d.reference, d.metric) for d in report.differences}
    metrics = {d.metric for d in report.differences}
    assert pairs == {(arm, "a", m) for arm in ("b", "c") for m in metrics} and len(metrics) == 4
    assert all(d.low <= d.estimate <= d.high for d in report.differences)


def test_render_report() -> None:
    report = build_report(two_arms(), EXP, reference="fast", resamples=500)
    text = render_report(report)
    assert "\x1b" not in text
    assert EXP in text and "differences vs fast" in text
    rows = [line for line in text.splitlines() if line.startswith(("fast  ", "slow  "))]
    assert len(rows) == 2
    assert "low 32, medium 16" in rows[0] and "800 ms" in rows[0]
    diff_lines = [line for line in text.splitlines() if line.startswith("slow − fast")]
    assert len(diff_lines) == 4 and all("95% CI" in line for line in diff_lines)
    p95_line = next(line for line in diff_lines if "p95_ms" in line)
    d = diff(report, "slow", "p95_ms")
    assert f"+{d.estimate:.0f} ms" in p95_line and f"[{d.low:.0f}, {d.high:.0f}]" in p95_line
    within_line = next(line for line in diff_lines if "within_budget" in line)
    assert "pp" in within_line and "−" in within_line
    assert render_report(report) == text


def test_write_csv(tmp_path: Path) -> None:
    records = [*two_arms(), turn("o", "x", 1.0, experiment="other"), turn("m", "fast", None)]
    path = tmp_path / "turns.csv"
    assert write_csv(records, EXP, path) == 97
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames or ()) == CSV_COLUMNS
        rows = list(reader)
    assert len(rows) == 97
    first = rows[0]
    assert first["call_id"] == "f0" and first["arm"] == "fast" and first["effort"] == "medium"
    assert first["taken"] == "fallback" and first["endpoint_ms"] == "200.0"
    assert float(first["first_audio_ms"]) == pytest.approx(records[0]["timings_ms"]["first_audio"])
    assert first["within_budget"] == str(records[0]["timings_ms"]["first_audio"] <= 800)
    assert rows[-1]["first_audio_ms"] == "" and rows[-1]["within_budget"] == "False"
    assert rows[-1]["llm_first_token_ms"] == ""


def test_plot_report(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    records = two_arms()
    path = tmp_path / "report.png"
    plot_report(records, build_report(records, EXP, resamples=100), path)
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG")
    assert len(data) > 20_000


def test_load_jsonl_round_trip_and_bad_line(tmp_path: Path) -> None:
    records = two_arms()[:5]
    path = tmp_path / "turns.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n\n")
    assert load_jsonl(path) == records
    path.write_text(json.dumps(records[0]) + "\n\n{not json\n")
    with pytest.raises(ValueError, match="line 3"):
        load_jsonl(path)
    path.write_text("[1, 2]\n")
    with pytest.raises(ValueError, match="line 1"):
        load_jsonl(str(path))

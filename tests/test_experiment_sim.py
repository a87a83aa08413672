"""Experiments through the real pipeline (turn detector, faster-whisper, piper, the controller
and router) against the tier simulator over real HTTP: `voice.experiments.simulate`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from pipeline.llm.settings import ControllerSettings
from voice.cli.main import app
from voice.experiments.arms import Arm, Experiment
from voice.experiments.report import build_report, render_report
from voice.experiments.simulate import Simulation, TierChange, load_simulation, simulate

pytestmark = pytest.mark.timeout(600)

TURNS = 3  # per arm in the adaptive-against-high run
DEPLOY = Path(__file__).resolve().parent.parent / "deploy" / "experiments"


def within(records: list[dict[str, Any]], arm: str, budget_ms: float) -> float:
    mine = [r for r in records if r["arm"] == arm]
    hits = [r for r in mine if r["timings_ms"].get("first_audio", 1e9) <= budget_ms]
    return len(hits) / len(mine)


async def calibrated_budget_ms(slack_ms: float) -> float:
    """This machine's own first audio at effort `none` (the fastest a turn can be), plus slack.

    Machines differ by a third or more in STT and TTS time, so a fixed budget would test the
    machine, not the controller.
    """
    probe = Experiment(
        name="calibrate", arms=[Arm(name="none", policy="fixed", effort="none", budget_ms=1e4)]
    )
    records = await simulate(Simulation(experiment=probe, calls=1, turns_per_call=3))
    first_audio = sorted(r["timings_ms"]["first_audio"] for r in records)
    return round(first_audio[len(first_audio) // 2] + slack_ms)


@pytest.mark.serial  # first-audio times against a budget: measured on an otherwise idle machine
async def test_adaptive_arm_keeps_more_turns_within_budget_than_fixed_high(
    tmp_path: Path,
) -> None:
    # 400 ms over the pipeline's own median: room for the adaptive arm to think a little, far
    # less than the ~1.4 s that high effort's 1024 reasoning tokens take at 750 tokens/s.
    budget = await calibrated_budget_ms(slack_ms=400)
    experiment = Experiment(
        name="adaptive-vs-high",
        arms=[
            Arm(name="adaptive", policy="adaptive", budget_ms=budget),
            Arm(name="fixed-high", policy="fixed", effort="high", budget_ms=budget),
        ],
    )
    # One call of three turns per arm: the arms differ by far more than three turns can hide
    # (high effort's reasoning alone is about three times the slack; seen: 100% against 0%,
    # in every run of five turns).
    records = await simulate(Simulation(experiment=experiment, calls=1, turns_per_call=TURNS))

    for arm in ("adaptive", "fixed-high"):
        mine = [r for r in records if r["arm"] == arm]
        assert len(mine) == TURNS, f"{arm}: {len(mine)} of {TURNS} turns were answered"
        assert {r["call_id"] for r in mine} == {f"sim-{arm}-1"}
        assert all(r["experiment"] == "adaptive-vs-high" and r["reply_text"] for r in mine)
    adaptive_share = within(records, "adaptive", budget)
    high_share = within(records, "fixed-high", budget)
    print(f"\nwithin {budget:.0f} ms: adaptive {adaptive_share:.0%}, fixed high {high_share:.0%}")
    assert adaptive_share >= high_share + 0.6
    adaptive = [r["decision"] for r in records if r["arm"] == "adaptive"]
    assert all(d["budget_ms"] == budget and d["taken"] == "planned" for d in adaptive)
    assert {d["effort"] for d in adaptive} <= {"none", "minimal", "low", "medium"}
    high = [r["decision"] for r in records if r["arm"] == "fixed-high"]
    assert {d["effort"] for d in high} == {"high"}
    assert all(d["reason"].startswith("fixed arm: high on fast") for d in high)

    report = build_report(records, "adaptive-vs-high")
    text = render_report(report)
    print(text)
    assert "adaptive" in text and "fixed-high" in text
    share = next(d for d in report.differences if d.metric == "within_budget")
    assert (share.arm, share.reference) == ("fixed-high", "adaptive")
    assert share.low <= share.estimate <= share.high < 0  # the interval excludes no difference
    assert "fixed-high − adaptive" in text and "95% CI" in text

    # the CLI reads the same records from an export, and writes the CSV and the plot
    export = tmp_path / "records.jsonl"
    export.write_text("".join(json.dumps(r) + "\n" for r in records))
    csv, png = tmp_path / "turns.csv", tmp_path / "arms.png"
    command = ["experiments", "report", "adaptive-vs-high", "--jsonl", str(export)]
    result = CliRunner().invoke(app, [*command, "--csv", str(csv), "--plot", str(png)])
    assert result.exit_code == 0, result.output
    assert "fixed-high − adaptive" in result.stdout
    assert len(csv.read_text().splitlines()) == 1 + len(records) == 1 + 2 * TURNS
    assert png.read_bytes().startswith(b"\x89PNG")


@pytest.mark.slow
async def test_a_scripted_429_burst_falls_back_within_the_turn_and_rests_the_tier() -> None:
    # Held on the fast tier by a fixed arm: an adaptive one planned turn 2 on standard when a
    # loaded runner had made turn 1 on fast slow, and the 429 was never met (a CI run).
    on_fast = Arm(name="on-fast", policy="fixed", effort="none", tier="fast", budget_ms=1500)
    experiment = Experiment(name="burst", arms=[on_fast])
    sim = Simulation(
        experiment=experiment,
        calls=1,
        turns_per_call=3,
        changes=[TierChange(at_turn=2, tier="fast", set={"fail_status": 429, "fail_times": 1})],
        # The rest outlasts the call, however slowly a loaded machine gets to turn 3 (5 s did not
        # on a CI run: turn 3 came 5.4 s after the 429 and was planned on fast again).
        controller=ControllerSettings(cooldown_s=600, cooldown_max_s=600),
    )
    records = await simulate(sim)

    assert [r["turn"] for r in records] == [1, 2, 3]
    assert all(r["reply_text"] for r in records), "every turn was answered"
    first, second, third = (r["decision"] for r in records)
    assert (first["taken"], first["tier"]) == ("planned", "fast")
    assert (second["taken"], second["planned_tier"], second["tier"]) == (
        "fallback",
        "fast",
        "standard",
    )
    failed, spoke = second["attempts"]
    assert (failed["tier"], failed["result"], failed["status"]) == ("fast", "failed", 429)
    assert (spoke["tier"], spoke["result"]) == ("standard", "spoke")
    assert third["tier"] == "standard" and "fast cooling down after HTTP 429" in third["reason"]


def test_the_example_files_are_valid() -> None:
    sim = load_simulation(DEPLOY / "three-arms.simulation.yaml")
    names = [a.name for a in sim.experiment.arms]
    assert names == ["adaptive-800", "adaptive-1500", "fixed-medium"]
    assert sim.calls * sim.turns_per_call == 30 and len(sim.changes) == 3
    with pytest.raises(ValueError, match="no tier 'turbo'"):
        Simulation(
            experiment=sim.experiment,
            changes=[TierChange(at_turn=1, tier="turbo", set={"ttft_ms": 1})],
        )

"""Experiments: arms, validation, deterministic weighted assignment, files."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from pydantic import ValidationError

from voice.experiments.arms import Arm, Experiment, load_experiment

DEPLOY = Path(__file__).resolve().parent.parent / "deploy" / "experiments"


def two_arms(weights: tuple[float, float] = (1, 1), name: str = "exp") -> Experiment:
    return Experiment(
        name=name,
        arms=[
            Arm(name="adaptive", budget_ms=1200, weight=weights[0]),
            Arm(name="fixed-low", policy="fixed", effort="low", weight=weights[1]),
        ],
    )


def test_assignment_is_deterministic_and_weighted() -> None:
    experiment = two_arms((3, 1))
    ids = [f"call-{i}" for i in range(4000)]
    arms = [experiment.assign(call_id).name for call_id in ids]
    assert arms == [two_arms((3, 1)).assign(call_id).name for call_id in ids]  # any worker
    share = Counter(arms)["adaptive"] / len(ids)
    assert 0.72 < share < 0.78  # 3 : 1
    # another experiment reshuffles: assignments are independent across experiments
    other = [two_arms((3, 1), name="other").assign(call_id).name for call_id in ids]
    assert sum(a != b for a, b in zip(arms, other, strict=True)) > 1000


def test_an_experiment_is_validated() -> None:
    with pytest.raises(ValidationError, match="unique"):
        Experiment(name="x", arms=[Arm(name="a"), Arm(name="a")])
    with pytest.raises(ValidationError, match="needs an effort"):
        Arm(name="a", policy="fixed")
    with pytest.raises(ValidationError):
        Experiment(name="x", arms=[])
    with pytest.raises(ValidationError, match="reserved"):
        Experiment(name="active", arms=[Arm(name="a")])
    with pytest.raises(ValidationError):
        Experiment(name="has space", arms=[Arm(name="a")])
    with pytest.raises(ValidationError):
        Arm(name="a", weight=0)


def test_experiment_files(tmp_path: Path) -> None:
    live = load_experiment(DEPLOY / "live-budget.yaml")
    assert [a.name for a in live.arms] == ["adaptive-1200", "fixed-low"]
    assert live.arm("fixed-low").effort == "low" and live.arm("fixed-low").tier == "fast"
    as_json = tmp_path / "exp.json"
    as_json.write_text(live.model_dump_json())
    assert load_experiment(as_json) == live
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed")
    with pytest.raises(ValueError, match="cannot read experiment file"):
        load_experiment(broken)

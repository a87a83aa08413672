"""Reading one exported turn record (`TurnRecord.to_dict()`, one JSON line of an export) for the
experiment report: its arm, first audio, budget and what the controller decided."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

EFFORT_ORDER: tuple[str, ...] = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
NO_ARM = "(none)"


def load_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """One JSON object per non-empty line; a bad line raises ValueError naming its number."""
    records: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: line {number}: invalid JSON ({e.msg})") from e
            if not isinstance(obj, dict):
                raise ValueError(f"{path}: line {number}: expected a JSON object")
            records.append(obj)
    return records


def arm_of(rec: Mapping[str, Any]) -> str:
    arm = rec.get("arm")
    return NO_ARM if arm is None else str(arm)


def first_audio(rec: Mapping[str, Any]) -> float | None:
    value = (rec.get("timings_ms") or {}).get("first_audio")
    return None if value is None else float(value)


def decided(rec: Mapping[str, Any], key: str) -> Any:
    """`decision[key]` when present, else the top-level field."""
    decision = rec.get("decision") or {}
    value = decision.get(key)
    return rec.get(key) if value is None else value


def tier_of(rec: Mapping[str, Any]) -> Any:
    """The tier that spoke, by its name in our settings (`decision["tier"]`). The record's own
    `service_tier_requested` and `service_tier_served` are the provider's service tiers."""
    return (rec.get("decision") or {}).get("tier")


def effort_key(effort: str) -> tuple[int, str]:
    return (
        (EFFORT_ORDER.index(effort), "") if effort in EFFORT_ORDER else (len(EFFORT_ORDER), effort)
    )


def budget_of(rec: Mapping[str, Any], default: float | None = None) -> float | None:
    budget = rec.get("budget_ms")
    return default if budget is None else float(budget)


def within(first_audio: float | None, budget: float | None) -> bool | None:
    if budget is None:
        return None
    return first_audio is not None and first_audio <= budget

"""Scoring, as LiveKit's eot-bench does it: a policy gives every decision a delay, a hold is
cut off when its delay is shorter than its silence, and a sweep of policies draws the trade-off.

- `delay_ms(decision, policy, timeout_ms, row)`: the silence after which the policy ends the
  turn at this pause, replayed causally with `pipeline.turn_taking.policy.end_delay_ms`, the
  function a live call decides with. The pause is offered at `offered_ms`; the model's score
  arrives `model_ms` later, the early transcript `stt_ms` later (both start at the pause, in
  parallel). What the policy says with what has arrived holds until the next thing arrives;
  the turn ends at the first moment the silence reaches it. So the model row ends at
  max(min_delay, offered + model_ms) when confident, the text row no sooner than its
  transcript, silence only at the timeout.
- A sweep over (threshold, min delay, timeout) gives each policy a point: mean delay over the
  turns' ends and the cut-off rate over the holds. The Pareto frontier keeps the points no
  other beats on both; cut-offs at 300 / 600 ms mean delay and the delay at 5% / 10% cut-offs
  are read off it by linear interpolation between its points.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.turn_taking.policy import TurnPolicy, end_delay_ms
from voice.devtools.turn_bench.corpus import CONTINUES
from voice.devtools.turn_bench.decisions import Decision

THRESHOLDS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
MIN_DELAYS = (0, 100, 150, 200, 250, 300, 400, 500, 600, 800, 1000, 1200)
TIMEOUTS = (200, 300, 400, 500, 600, 700, 800, 1000, 1200, 1500, 2000, 2500, 3000)
HOLD_THROUGH_MS = 1000


@dataclass(frozen=True)
class Row:
    """One detector: how it builds a policy and what it waits for."""

    name: str
    policy: Callable[[float, int], TurnPolicy]  # (threshold, min_delay_ms) -> policy
    uses_model: bool
    uses_text: bool
    thresholds: tuple[float, ...] = THRESHOLDS
    min_delays: tuple[int, ...] = MIN_DELAYS
    timeouts: tuple[int, ...] = TIMEOUTS


def _silence_only(threshold: float, min_delay: int) -> TurnPolicy:
    return TurnPolicy(model=False, hanging_words=False, finished_words=False)


def _text_rules(threshold: float, min_delay: int) -> TurnPolicy:
    return TurnPolicy(model=False, hanging_words=True, finished_words=True, min_delay_ms=min_delay)


def _smart_turn(threshold: float, min_delay: int) -> TurnPolicy:
    return TurnPolicy(threshold=threshold, min_delay_ms=min_delay, hanging_words=False)


def _with_veto(threshold: float, min_delay: int) -> TurnPolicy:
    return TurnPolicy(threshold=threshold, min_delay_ms=min_delay, hanging_words=True)


def _unfinished_veto(threshold: float, min_delay: int) -> TurnPolicy:
    return TurnPolicy(
        threshold=threshold, min_delay_ms=min_delay, hanging_words=True, unfinished_words=True
    )


ROWS: tuple[Row, ...] = (
    Row("silence only", _silence_only, False, False, (0.5,), (0,)),
    Row("text rules (endpoint.py)", _text_rules, False, True, (0.5,)),
    Row("Smart Turn v3.2", _smart_turn, True, False),
    Row("Smart Turn + hanging veto", _with_veto, True, True),
    Row("Smart Turn + unfinished veto", _unfinished_veto, True, True),
)


def delay_ms(d: Decision, policy: TurnPolicy, timeout_ms: int, row: Row) -> float:
    """The silence (ms) after which `policy` ends the turn at decision `d`, causally."""
    arrivals: list[tuple[float, str]] = []
    if row.uses_model:
        arrivals.append((d.offered_ms + d.model_ms, "score"))
    if row.uses_text:
        arrivals.append((d.offered_ms + d.stt_ms, "text"))
    arrivals.sort()
    score: float | None = None
    text: str | None = None
    now = d.offered_ms
    for arrival, what in [*arrivals, (math.inf, "")]:
        end = max(now, float(end_delay_ms(policy, timeout_ms, score, text)))
        if end < arrival:
            return end
        now = arrival
        if what == "score":
            score = d.score
        elif what == "text":
            text = d.text
    raise AssertionError("unreachable: the last arrival is at infinity")


@dataclass(frozen=True)
class Point:
    """One policy's result."""

    threshold: float
    min_delay_ms: int
    timeout_ms: int
    mean_delay_ms: float  # over the turns' ends
    cutoff_rate: float  # cut-off holds / holds
    held_through: float  # of holds after words that plainly go on, share held >= 1 s


def evaluate(
    decisions: Sequence[Decision], row: Row, threshold: float, min_delay: int, timeout: int
) -> Point:
    policy = row.policy(threshold, min_delay)
    ends: list[float] = []
    cut = holds = going_on = held = 0
    for d in decisions:
        delay = delay_ms(d, policy, timeout, row)
        if d.end:
            ends.append(delay)
            continue
        holds += 1
        cut += delay < d.silence_ms
        if d.category in CONTINUES:
            going_on += 1
            held += delay >= HOLD_THROUGH_MS
    return Point(
        threshold,
        min_delay,
        timeout,
        float(np.mean(ends)) if ends else math.nan,
        cut / holds if holds else 0.0,
        held / going_on if going_on else math.nan,
    )


def sweep(decisions: Sequence[Decision], row: Row) -> list[Point]:
    """Every (threshold, min delay, timeout) of the row's grid (min delay < timeout)."""
    return [
        evaluate(decisions, row, threshold, min_delay, timeout)
        for threshold in row.thresholds
        for min_delay in row.min_delays
        for timeout in row.timeouts
        if min_delay < timeout
    ]


def pareto(points: Sequence[Point]) -> list[Point]:
    """The points no other point beats (lower or equal delay and cut-offs, one lower), by
    rising delay."""
    frontier: list[Point] = []
    for p in sorted(points, key=lambda p: (p.mean_delay_ms, p.cutoff_rate)):
        if math.isnan(p.mean_delay_ms):
            continue
        if not frontier or p.cutoff_rate < frontier[-1].cutoff_rate:
            frontier.append(p)
    return frontier


def cutoffs_at(frontier: Sequence[Point], delay: float) -> float | None:
    """Cut-off rate at `delay` ms mean delay, interpolated on the frontier; None when every
    point is slower."""
    if not frontier or delay < frontier[0].mean_delay_ms:
        return None
    for lo, hi in itertools.pairwise(frontier):
        if lo.mean_delay_ms <= delay <= hi.mean_delay_ms:
            span = hi.mean_delay_ms - lo.mean_delay_ms
            share = (delay - lo.mean_delay_ms) / span if span else 0.0
            return lo.cutoff_rate + share * (hi.cutoff_rate - lo.cutoff_rate)
    return frontier[-1].cutoff_rate


def delay_at(frontier: Sequence[Point], rate: float) -> float | None:
    """Mean delay at `rate` cut-offs, interpolated on the frontier; None when no point cuts
    off that few."""
    if not frontier or rate < frontier[-1].cutoff_rate:
        return None
    if rate >= frontier[0].cutoff_rate:
        return frontier[0].mean_delay_ms
    for lo, hi in itertools.pairwise(frontier):
        if hi.cutoff_rate <= rate <= lo.cutoff_rate:
            span = lo.cutoff_rate - hi.cutoff_rate
            share = (lo.cutoff_rate - rate) / span if span else 0.0
            return lo.mean_delay_ms + share * (hi.mean_delay_ms - lo.mean_delay_ms)
    return None


@dataclass(frozen=True)
class Goal:
    """At most `cutoffs` false cut-offs at a mean delay of at most `delay_ms`."""

    cutoffs: float
    delay_ms: float

    @property
    def label(self) -> str:
        return f"≤ {self.cutoffs:.0%} cut-offs at ≤ {self.delay_ms:.0f} ms"


GOALS = (Goal(0.05, 450), Goal(0.10, 300))


def best(points: Sequence[Point], goal: Goal) -> tuple[Point | None, bool]:
    """The fastest point within the goal's cut-offs, and whether it is fast enough."""
    within = [
        p for p in points if p.cutoff_rate <= goal.cutoffs and not math.isnan(p.mean_delay_ms)
    ]
    if not within:
        return None, False
    point = min(within, key=lambda p: (p.mean_delay_ms, p.cutoff_rate))
    return point, point.mean_delay_ms <= goal.delay_ms


def cost_ms(decisions: Sequence[Decision], row: Row) -> tuple[float, float]:
    """Inference CPU ms per decision (model + STT, what the row uses): median, p95."""
    costs = [d.model_ms * row.uses_model + d.stt_ms * row.uses_text for d in decisions]
    if not costs:
        return 0.0, 0.0
    return float(np.median(costs)), float(np.percentile(costs, 95))


@dataclass(frozen=True)
class RowResult:
    """One row on one path."""

    row: str
    points: list[Point]
    frontier: list[Point]
    cutoffs_300: float | None
    cutoffs_600: float | None
    delay_5: float | None
    delay_10: float | None
    cost: tuple[float, float]
    goals: list[tuple[Goal, Point | None, bool]]


BOUND_ROW = "bound: knows every pause but one after a finished sentence"
AMBIGUOUS = "sentence"  # a pause after a finished sentence, inside a turn: it reads as an end


def bound(decisions: Sequence[Decision], delays: Sequence[int] = range(0, 3001, 10)) -> RowResult:
    """The best any detector can do on this set without knowing more than the caller has said.

    It knows which pauses are holds, except a pause after a finished sentence (`AMBIGUOUS`):
    that one reads exactly as the turn's end (all a detector has is the turn so far, and the
    same words end other turns), so it gets the same delay as the ends. Every other hold is
    held for ever. For each delay d: mean delay d, cut-offs = the ambiguous holds whose
    silence is longer than d. No policy of any row can do better at the same mean delay
    unless it tells a finished sentence that goes on from one that ends the turn."""
    holds = [d for d in decisions if not d.end]
    ambiguous = np.asarray([d.silence_ms for d in holds if d.category == AMBIGUOUS])
    points = [
        Point(
            math.nan,
            delay,
            delay,
            float(delay),
            float((ambiguous > delay).sum()) / len(holds) if holds else 0.0,
            1.0,
        )
        for delay in delays
    ]
    return _result(BOUND_ROW, points, (0.0, 0.0))


def score_row(decisions: Sequence[Decision], row: Row) -> RowResult:
    return _result(row.name, sweep(decisions, row), cost_ms(decisions, row))


def _result(name: str, points: list[Point], cost: tuple[float, float]) -> RowResult:
    frontier = pareto(points)
    return RowResult(
        name,
        points,
        frontier,
        cutoffs_at(frontier, 300),
        cutoffs_at(frontier, 600),
        delay_at(frontier, 0.05),
        delay_at(frontier, 0.10),
        cost,
        [(goal, *best(points, goal)) for goal in GOALS],
    )

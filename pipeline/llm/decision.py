"""The decision of one turn, as its turn record keeps it: what the controller planned and why,
what spoke and how it came to, how far the prediction was, and every request tried.

``tier`` and ``planned_tier`` name our tiers (``fast``, ``standard``: `pipeline.llm.tiers`);
the service tier sent and the one the provider served are the turn record's
``service_tier_requested`` and ``service_tier_served``. Made once, when the turn is over
(`pipeline.llm.routing.RoutedReply.finish`); the record serializes it as a dict under
``decision`` (`dataclasses.asdict`), with these field names as its keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pipeline.llm.controller import TurnPlan
from pipeline.llm.estimates import TurnOutcome

# How the turn's reply came about: the plan spoke, its hedge, a fallback after a failure;
# "failed": no request could answer; "none": the caller cut in before any did.
Taken = Literal["planned", "hedge", "fallback", "failed", "none"]
# Why a request was sent: the plan, a fallback after a failure, or the plan's hedge.
AttemptKind = Literal["planned", "fallback", "hedge"]
# How it ended: "refused" its effort (a 400), "timeout": no first token in time, "lost": it
# was cancelled, another spoke first or the caller cut in; "pending" while it runs.
AttemptResult = Literal["pending", "spoke", "failed", "refused", "timeout", "lost"]


@dataclass(frozen=True, slots=True)
class AttemptSummary:
    """One request of a turn, as its decision lists it."""

    tier: str
    effort: str
    kind: AttemptKind
    result: AttemptResult
    status: int | None  # HTTP status of its error; None: none, a timeout or a connection error
    error: str | None  # the error's message


@dataclass(frozen=True, slots=True)
class Decision:
    """The controller's part of a turn record: the decision, predicted vs actual, what spoke."""

    tier: str | None  # the tier that spoke; None: none did
    effort: str | None  # the effort that spoke
    planned_tier: str
    planned_effort: str
    taken: Taken
    reason: str
    budget_ms: float
    fits: bool
    filler: str | None
    first_token_deadline_ms: float
    predicted_first_audio_ms: float
    actual_first_audio_ms: float | None
    error_ms: float | None  # actual - predicted first audio
    attempts: tuple[AttemptSummary, ...] = ()

    @classmethod
    def of(
        cls,
        plan: TurnPlan,
        outcome: TurnOutcome | None,
        taken: Taken | None = None,
        attempts: Sequence[AttemptSummary] = (),
    ) -> Decision:
        """The decision of a turn planned as ``plan``; ``outcome``: what the request that spoke
        took (None: none spoke). ``taken`` None: told by the tier and effort that spoke (the
        plan's, its hedge's, else a fallback's), or "none" when none did."""
        if taken is None:
            taken = "none" if outcome is None else _taken(plan, outcome)
        actual = outcome.first_audio_ms if outcome is not None else None
        return cls(
            tier=outcome.tier if outcome is not None else None,
            effort=outcome.effort if outcome is not None else None,
            planned_tier=plan.tier,
            planned_effort=plan.effort,
            taken=taken,
            reason=plan.reason,
            budget_ms=plan.budget_ms,
            fits=plan.fits,
            filler=plan.filler,
            first_token_deadline_ms=round(plan.first_token_deadline_ms, 1),
            predicted_first_audio_ms=round(plan.predicted_first_audio_ms, 1),
            actual_first_audio_ms=actual,
            error_ms=None if actual is None else round(actual - plan.predicted_first_audio_ms, 1),
            attempts=tuple(attempts),
        )


def _taken(plan: TurnPlan, outcome: TurnOutcome) -> Taken:
    spoke = (outcome.tier, outcome.effort)
    if spoke == (plan.tier, plan.effort):
        return "planned"
    hedged = plan.hedge is not None and spoke == (plan.hedge.tier, plan.hedge.effort)
    return "hedge" if hedged else "fallback"

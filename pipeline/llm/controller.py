"""Latency budget controller: the tier and reasoning effort each turn can afford.

A pure object: no I/O, no asyncio, time from an injected clock (seconds, monotonic; it only
ends cool-downs). ``plan(ctx)`` runs before the LLM call, ``observe(outcome)`` after it.
The estimates it plans on, and how it learns them, are `pipeline.llm.estimates`
(`LatencyModel`, which `Controller` extends); its knobs are `ControllerSettings`
(`pipeline.llm.settings`).

Planning: every (tier, effort) of the tiers on offer that is not cooling down, and that the
provider has not refused, is predicted; of those whose quantile of first audio fits
``budget_ms`` the highest effort wins, on the cheapest tier (lowest ``cost_rank``) that
delivers it. When nothing fits, the option with the lowest
predicted first audio wins, the reason says "nothing fits", and with ``filler`` on a short
phrase is offered to speak at once. The output token cap is ``reply_tokens`` plus a generous
reasoning allowance (mean + 4 sd): the cap counts reasoning tokens, and a cap that cuts the
reasoning leaves nothing to say. The first-token deadline is the quantile of the first token;
with ``hedge`` on, the plan carries a second plan (another tier, or a lower effort) to fire
at that deadline if no token has come: keep whichever speaks first, cancel the other.

Knobs (`ControllerSettings`, defaults): ``budget_ms`` 1000, ``quantile`` 0.9,
``half_life_turns`` 2, ``prior_weight`` 1, ``prior_spread`` 0.2, ``min_spread`` 0.05 (floor on
a learned sd, as a fraction of its mean), ``first_sentence_tokens`` 12, ``tts_prior_ms`` 100,
``reasoning_tokens`` (prior per effort, in effort order: the simulator's 0/16/64/256/1024/
2048/4096), ``reply_tokens`` 160, ``cooldown_s`` 5, ``cooldown_max_s`` 60, ``hedge`` off,
``filler`` off with ``filler_phrases``. Per tier (`TierOption`): service_tier, efforts,
``cost_rank``, priors ``prior_ttft_ms`` and ``prior_tokens_per_s``, ``prefill_tokens_per_s``.

Worked example (default settings and tiers, no observations yet): 400 ms spent, 600 prompt
tokens. On the fast tier (200 ms, 750 tokens/s, prefill 8 000 tokens/s), effort ``low``
(64 reasoning tokens): first token 400 + 200 + 75 + 64 x 1.33 = 760 ms, first audio
760 + 12 x 1.33 + 100 = 876 ms mean; sd 52 ms, so p90 = 876 + 1.28 x 52 = 943 ms <= 1 000:
fits. ``medium`` (256 tokens) predicts 1 272 ms at p90, so the plan is fast/low, first-token
deadline 820 ms (the p90 of the first token), cap 160 + ceil(64 + 4 x 12.8) = 276 tokens.
With only the standard tier (550 ms, 55 tokens/s) even effort ``none`` predicts 1 572 ms at
p90: "nothing fits the 1000 ms budget: fastest is none on standard at p90 1572 ms".
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from pipeline.llm.estimates import LatencyModel, Prediction
from pipeline.llm.settings import ControllerSettings
from pipeline.llm.tiers import DEFAULT_TIERS, TierOption


@dataclass(frozen=True, slots=True)
class TurnContext:
    """What the controller knows about a turn before the LLM call."""

    spent_ms: float  # end of caller speech -> now (end-of-turn wait, STT)
    prompt_tokens: int = 0
    tiers_available: Sequence[TierOption] = DEFAULT_TIERS
    budget_ms: float | None = None  # None: the settings' budget
    # A fixed arm: always this effort (the nearest one the tier offers), on this tier while it
    # is available (None: the first available). Predictions are still made and recorded.
    fixed_effort: str | None = None
    fixed_tier: str | None = None


@dataclass(frozen=True, slots=True)
class TurnPlan:
    """How to call the LLM for one turn, and why. Times are ms since the end of caller speech."""

    tier: str
    service_tier: str | None
    effort: str
    max_output_tokens: int  # reasoning tokens included
    first_token_deadline_ms: float
    predicted_first_audio_ms: float
    fits: bool  # False: nothing fitted the budget; this is the fastest option
    reason: str
    budget_ms: float = 0.0  # the budget this plan was made for
    filler: str | None = None  # speak this at once, before the reply
    hedge: TurnPlan | None = None  # fire at first_token_deadline_ms if no token has come


@dataclass(frozen=True, slots=True)
class _Option:
    tier: TierOption
    effort: str
    rank: int
    prediction: Prediction


class _Offer(NamedTuple):
    tier: TierOption
    efforts: tuple[str, ...]  # those to plan: the tier's, less the ones the provider refused


class Controller(LatencyModel):
    """Plans each turn's tier, effort and token cap; learns from what each turn took."""

    def __init__(self, settings: ControllerSettings, clock: Callable[[], float]) -> None:
        super().__init__(settings, clock)
        self._fillers = 0

    # ------------------------------------------------------------ planning

    def _offer(self, ctx: TurnContext, notes: list[str]) -> list[_Offer]:
        """The tiers to plan on, each with its efforts: not cooling down, not refused."""
        cooling = self.cooling()
        for name, left in cooling.items():
            notes.append(f"{name} cooling down after {self._cooling[name][1]} ({left:.0f} s left)")
        offer = [_Offer(t, self.supported_efforts(t)) for t in ctx.tiers_available]
        offer = [o for o in offer if o.efforts]
        if not offer:
            offer = [_Offer(t, t.efforts) for t in ctx.tiers_available]
            notes.append("every effort was refused: trying them anyway")
        resting = [o for o in offer if o.tier.name not in cooling]
        if not resting:
            notes.append("every tier is cooling down: using them anyway")
            return offer
        return resting

    def plan(self, ctx: TurnContext) -> TurnPlan:
        """The highest effort that fits the budget at the quantile, on the cheapest tier."""
        if not ctx.tiers_available:
            raise ValueError("no tiers available")
        for tier in ctx.tiers_available:
            self._register(tier)
        notes: list[str] = []
        tiers = self._offer(ctx, notes)
        budget = self.settings.budget_ms if ctx.budget_ms is None else ctx.budget_ms
        if ctx.fixed_effort is not None:
            return self._plan_fixed(ctx, tiers, budget, notes)
        options = self._options(tiers, ctx.spent_ms, ctx.prompt_tokens)
        chosen, fits = self._pick(options, budget)
        hedge = None
        if self.settings.hedge:
            deadline = chosen.prediction.first_token_ms
            alternatives = [
                o
                for o in self._options(tiers, deadline, ctx.prompt_tokens)
                if o.tier.name != chosen.tier.name or o.rank < chosen.rank
            ]
            if alternatives:
                alt, alt_fits = self._pick(alternatives, budget)
                why = f"hedge if no first token by {deadline:.0f} ms"
                hedge = self._plan(alt, alt_fits, budget, [why], None, None)
        filler = None
        if not fits and self.settings.filler:
            phrases = self.settings.filler_phrases
            filler = phrases[self._fillers % len(phrases)]
            self._fillers += 1
        return self._plan(chosen, fits, budget, notes, filler, hedge, options)

    def _plan_fixed(
        self, ctx: TurnContext, tiers: list[_Offer], budget: float, notes: list[str]
    ) -> TurnPlan:
        """A fixed arm's plan: its effort on its tier (or the next available), with predictions."""
        assert ctx.fixed_effort is not None
        want = self._ranks.get(ctx.fixed_effort)
        if want is None:
            raise ValueError(
                f"unknown effort {ctx.fixed_effort!r}; known: {', '.join(self._ranks)}"
            )
        tier, efforts = next((o for o in tiers if o.tier.name == ctx.fixed_tier), tiers[0])
        if ctx.fixed_tier is not None and tier.name != ctx.fixed_tier:
            notes.append(f"{ctx.fixed_tier} unavailable")
        if (tier.name, ctx.fixed_effort) in self._unsupported:
            notes.append(f"{ctx.fixed_effort} unsupported on {tier.name}")
        # the arm's effort if offered, else the nearest below it, else the lowest offered
        offered = sorted(self._ranks[e] for e in efforts)
        rank = max((r for r in offered if r <= want), default=offered[0])
        effort = next(e for e, r in self._ranks.items() if r == rank)
        o = _Option(tier, effort, rank, self.predict(tier, effort, ctx.spent_ms, ctx.prompt_tokens))
        fits = o.prediction.first_audio_ms <= budget
        q = f"p{round(self.settings.quantile * 100)}"
        at = o.prediction.first_audio_ms
        verdict = "fits" if fits else "exceeds"
        why = f"fixed arm: {effort} on {tier.name}; {q} first audio {at:.0f} ms {verdict} the"
        why += f" {budget:.0f} ms budget"
        plan = self._plan(o, fits, budget, notes, None, None)
        return dataclasses.replace(plan, reason="; ".join([why, *notes]))

    def _options(self, tiers: Sequence[_Offer], spent_ms: float, prompt: int) -> list[_Option]:
        return [
            _Option(t, e, self._ranks[e], self.predict(t, e, spent_ms, prompt))
            for t, efforts in tiers
            for e in efforts
        ]

    def _pick(self, options: list[_Option], budget: float) -> tuple[_Option, bool]:
        fitting = [o for o in options if o.prediction.first_audio_ms <= budget]
        if not fitting:
            return min(options, key=lambda o: o.prediction.first_audio_ms), False
        best = max(
            fitting,
            key=lambda o: (o.rank, -o.tier.cost_rank, -o.prediction.first_audio_ms),
        )
        return best, True

    def _plan(
        self,
        o: _Option,
        fits: bool,
        budget: float,
        notes: list[str],
        filler: str | None,
        hedge: TurnPlan | None,
        options: list[_Option] | None = None,
    ) -> TurnPlan:
        s, q = self.settings, f"p{round(self.settings.quantile * 100)}"
        at = o.prediction.first_audio_ms
        if fits:
            reason = f"{o.effort} on {o.tier.name}: {q} first audio {at:.0f} ms fits the"
            reason += f" {budget:.0f} ms budget"
            higher = [p for p in options or [] if p.rank > o.rank]
            if higher:
                nxt = min(higher, key=lambda p: (p.rank, p.prediction.first_audio_ms))
                reason += f"; {nxt.effort} would take {nxt.prediction.first_audio_ms:.0f} ms"
        else:
            reason = f"nothing fits the {budget:.0f} ms budget: fastest is {o.effort} on"
            reason += f" {o.tier.name} at {q} {at:.0f} ms"
        reasoning = self._reasoning_of(o.tier.name, o.effort)
        return TurnPlan(
            tier=o.tier.name,
            service_tier=o.tier.service_tier,
            effort=o.effort,
            max_output_tokens=s.reply_tokens + math.ceil(reasoning.mean + 4 * reasoning.sd),
            first_token_deadline_ms=o.prediction.first_token_ms,
            predicted_first_audio_ms=at,
            fits=fits,
            reason="; ".join([reason, *notes]),
            budget_ms=budget,
            filler=filler,
            hedge=hedge,
        )

"""Latency budget controller: the tier and reasoning effort each turn can afford.

A pure object: no I/O, no asyncio, time from an injected clock (seconds, monotonic; it only
ends cool-downs). ``plan(ctx)`` runs before the LLM call, ``observe(outcome)`` after it.

The model
---------
Every time is in ms since the end of the caller's speech (the zero of a turn). For tier ``t``,
effort ``e``, ``spent`` ms already gone (end-of-turn wait + STT) and ``p`` prompt tokens::

    first token  = spent + L(t) + p / prefill(t) + R(t, e) * P(t)
    first audio  = first token + n * P(t) + T

``L`` is queueing + prefill latency before any token, ``P`` decode time per token (reasoning
and visible tokens alike), ``R`` the hidden reasoning tokens, ``n`` the visible tokens of the
first sentence (``first_sentence_tokens``) and ``T`` first sentence complete -> first audio
sent (synthesis of the first chunk). Each of L, P, R, T is an online estimate with a mean and
a variance; the terms are taken as independent (variance of ``R * P``: ``P²·var R + R²·var P +
var R·var P``), and the quantile of a sum is ``mean + z·sd``, z from the normal distribution
(1.28 for ``quantile=0.9``). L and P are kept per tier (a tier that slows down slows every
effort), R per (tier, effort), T once.

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

Learning: ``observe()`` updates each estimate with an exponentially weighted mean and variance.
Priors (from each `TierOption` and the settings, with sd = ``prior_spread`` x mean) count as
``prior_weight`` observations, so the first observations move them quickly; after that every
observation's weight halves each ``half_life_turns`` turns, so a tier that slows down is
followed within a few turns. L is learned from the measured time to first visible token
minus the reasoning time and the prefill; a request cancelled before its first token
(``waited_ms``) raises L when it waited longer than L predicts. The variance tracks squared
one-step-ahead errors, so a mean that lags a change widens the quantile. A failed request
(429, 5xx, a timeout) puts its tier in a cool-down of ``cooldown_s``, doubled for each
further failure in a row up to ``cooldown_max_s``, or the provider's Retry-After if longer
(``TurnOutcome.retry_after_s``, parsed from the response by the LLM client); a first token
from the tier ends it and forgets the failures. A request whose effort the provider refused
(a 400 naming the reasoning effort: ``TurnOutcome.effort_unsupported``) rests nothing: that
(tier, effort) is dropped from every later plan, fixed arms included (they take the nearest
effort the tier still offers), for the life of the controller (``unsupported()`` lists them).
A tier with no effort left is not planned; if no tier has one, all are tried anyway.

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
from statistics import NormalDist
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, Field

EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
# Default reasoning-token priors per effort: what the simulator spends.
REASONING_TOKENS = dict(zip(EFFORTS, (0.0, 16.0, 64.0, 256.0, 1024.0, 2048.0, 4096.0), strict=True))


class TierOption(BaseModel):
    """One way to call the LLM: a service tier, the efforts it takes, its price and priors."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(description="Our label for the tier, e.g. 'fast'.")
    service_tier: str | None = Field(description="The service_tier sent; None: send none.")
    efforts: tuple[str, ...] = Field(default=EFFORTS, min_length=1, description="Efforts offered.")
    cost_rank: int = Field(default=0, ge=0, description="0 is cheapest; premium tiers rank higher.")
    prior_ttft_ms: float = Field(gt=0, description="Queueing + prefill, reasoning excluded.")
    prior_tokens_per_s: float = Field(gt=0, description="Decode speed, reasoning included.")
    prefill_tokens_per_s: float | None = Field(
        default=None, gt=0, description="Prompt processing speed; None: prompt size ignored."
    )


# The simulator's tier profiles; the fast tier is the premium one.
FAST_TIER = TierOption(
    name="fast",
    service_tier="priority",
    cost_rank=1,
    prior_ttft_ms=200,
    prior_tokens_per_s=750,
    prefill_tokens_per_s=8000,
)
STANDARD_TIER = TierOption(
    name="standard",
    service_tier="default",
    prior_ttft_ms=550,
    prior_tokens_per_s=55,
    prefill_tokens_per_s=4000,
)
DEFAULT_TIERS = (FAST_TIER, STANDARD_TIER)


class ControllerSettings(BaseModel):
    """The knobs of the controller (see the module docstring for the model)."""

    budget_ms: float = Field(default=1000.0, gt=0, description="End of speech -> first audio.")
    quantile: float = Field(default=0.9, gt=0.5, lt=1, description="Plans fit at this quantile.")
    half_life_turns: float = Field(default=2.0, gt=0, description="Observation weight half-life.")
    prior_weight: float = Field(default=1.0, ge=0, description="Priors count as N observations.")
    prior_spread: float = Field(default=0.2, ge=0, description="Prior sd / prior mean.")
    min_spread: float = Field(default=0.05, ge=0, description="Floor on learned sd / mean.")
    first_sentence_tokens: int = Field(default=12, ge=1, description="Visible tokens to budget.")
    tts_prior_ms: float = Field(default=100.0, ge=0, description="First sentence -> first audio.")
    reasoning_tokens: dict[str, float] = Field(
        default_factory=lambda: dict(REASONING_TOKENS),
        min_length=1,
        description="Prior reasoning tokens per effort, lowest effort first (sets the order).",
    )
    reply_tokens: int = Field(default=160, ge=1, description="Visible tokens allowed per reply.")
    cooldown_s: float = Field(default=5.0, ge=0, description="Tier rest after a failure.")
    cooldown_max_s: float = Field(
        default=60.0, ge=0, description="Rests double with each failure in a row, up to this."
    )
    hedge: bool = Field(default=False, description="Plan a second request at the deadline.")
    filler: bool = Field(default=False, description="Offer a filler phrase when nothing fits.")
    filler_phrases: list[str] = Field(
        default_factory=lambda: ["One moment.", "Let me see.", "Okay, so."], min_length=1
    )


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
class Prediction:
    first_token_ms: float  # at the quantile, since the end of caller speech
    first_audio_ms: float  # at the quantile
    first_audio_mean_ms: float


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
class TurnOutcome:
    """What happened to one LLM request (the one that spoke, or one that failed or lost)."""

    tier: str
    effort: str
    ttft_ms: float | None = None  # request sent -> first visible token (reasoning included)
    reasoning_tokens: int | None = None
    output_tokens: int | None = None  # reasoning included; recorded, not modelled
    decode_tokens_per_s: float | None = None
    tts_first_chunk_ms: float | None = None  # first sentence complete -> first audio sent
    first_audio_ms: float | None = None  # since the end of caller speech
    prompt_tokens: int = 0
    failed: bool = False
    status: int | None = None  # HTTP status of a failure; None: timeout or connection error
    waited_ms: float | None = None  # no first token after this long, then cancelled
    retry_after_s: float | None = None  # a failure's Retry-After: rest the tier at least this
    effort_unsupported: bool = False  # a failure refusing the effort: never plan it on the tier


@dataclass(slots=True)
class Estimate:
    """Exponentially weighted mean, and variance of the next observation around that mean.

    The variance tracks squared one-step-ahead errors (``d`` before the mean moves), so the
    lag of the mean counts as spread: the predictive spread, not the sample's.
    """

    mean: float
    var: float
    count: int = 0

    @property
    def sd(self) -> float:
        return math.sqrt(self.var)

    def update(self, x: float, alpha: float, prior_weight: float, min_spread: float) -> None:
        w = max(alpha, 1.0 / (self.count + 1.0 + prior_weight))
        d = x - self.mean
        self.mean += w * d
        self.var = max((1.0 - w) * self.var + w * d * d, (min_spread * self.mean) ** 2)
        self.count += 1


@dataclass(frozen=True, slots=True)
class _Option:
    tier: TierOption
    effort: str
    rank: int
    prediction: Prediction


class _Offer(NamedTuple):
    tier: TierOption
    efforts: tuple[str, ...]  # those to plan: the tier's, less the ones the provider refused


class Controller:
    """Plans each turn's tier, effort and token cap; learns from what each turn took."""

    def __init__(self, settings: ControllerSettings, clock: Callable[[], float]) -> None:
        self.settings = settings
        self.clock = clock
        self._z = NormalDist().inv_cdf(settings.quantile)
        self._alpha = 1.0 - 0.5 ** (1.0 / settings.half_life_turns)
        self._ranks = {effort: i for i, effort in enumerate(settings.reasoning_tokens)}
        self._tiers: dict[str, TierOption] = {}
        self._latency: dict[str, Estimate] = {}  # ms before any token, prefill excluded
        self._token_ms: dict[str, Estimate] = {}  # ms per generated token
        self._reasoning: dict[tuple[str, str], Estimate] = {}
        self._tts = self._prior(settings.tts_prior_ms)
        self._cooling: dict[str, tuple[float, str]] = {}  # tier -> (until, why)
        self._strikes: dict[str, int] = {}  # failures in a row, per tier
        self._unsupported: set[tuple[str, str]] = set()  # (tier, effort) the provider refused
        self._fillers = 0

    # ------------------------------------------------------------ estimates

    def _prior(self, mean: float) -> Estimate:
        return Estimate(mean, (self.settings.prior_spread * mean) ** 2)

    def _learn(self, estimate: Estimate, x: float) -> None:
        s = self.settings
        estimate.update(x, self._alpha, s.prior_weight, s.min_spread)

    def _register(self, tier: TierOption) -> None:
        if tier.name not in self._tiers:
            self._latency[tier.name] = self._prior(tier.prior_ttft_ms)
            self._token_ms[tier.name] = self._prior(1000.0 / tier.prior_tokens_per_s)
        self._tiers[tier.name] = tier
        for effort in tier.efforts:
            self._reasoning_of(tier.name, effort)

    def _reasoning_of(self, tier: str, effort: str) -> Estimate:
        if effort not in self._ranks:
            raise ValueError(f"unknown effort {effort!r}; known: {', '.join(self._ranks)}")
        key = (tier, effort)
        if key not in self._reasoning:
            self._reasoning[key] = self._prior(self.settings.reasoning_tokens[effort])
        return self._reasoning[key]

    def _prefill_ms(self, tier: TierOption, prompt_tokens: int) -> float:
        rate = tier.prefill_tokens_per_s
        return 1000.0 * prompt_tokens / rate if rate else 0.0

    def estimates(self, tier: str, effort: str) -> dict[str, Estimate]:
        """Current estimates behind a (tier, effort): latency_ms, token_ms, reasoning, tts_ms."""
        if tier not in self._tiers:
            raise ValueError(f"unknown tier {tier!r}")
        return {
            "latency_ms": self._latency[tier],
            "token_ms": self._token_ms[tier],
            "reasoning": self._reasoning_of(tier, effort),
            "tts_ms": self._tts,
        }

    def predict(
        self, tier: TierOption, effort: str, spent_ms: float, prompt_tokens: int = 0
    ) -> Prediction:
        """First token and first audio at the quantile, since the end of caller speech."""
        self._register(tier)
        lat, per = self._latency[tier.name], self._token_ms[tier.name]
        reason = self._reasoning_of(tier.name, effort)

        def tokens(mean: float) -> tuple[float, float]:  # mean and variance of `mean` tokens' time
            var = per.mean**2 * reason.var + mean**2 * per.var + reason.var * per.var
            return mean * per.mean, var

        start = spent_ms + lat.mean + self._prefill_ms(tier, prompt_tokens)
        think, think_var = tokens(reason.mean)
        speak, speak_var = tokens(reason.mean + self.settings.first_sentence_tokens)
        audio = start + speak + self._tts.mean
        return Prediction(
            first_token_ms=start + think + self._z * math.sqrt(lat.var + think_var),
            first_audio_ms=audio + self._z * math.sqrt(lat.var + speak_var + self._tts.var),
            first_audio_mean_ms=audio,
        )

    # ------------------------------------------------------------ planning

    def cooling(self) -> dict[str, float]:
        """Tiers cooling down now, with the seconds left."""
        now = self.clock()
        return {name: until - now for name, (until, _) in self._cooling.items() if until > now}

    def unsupported(self) -> set[tuple[str, str]]:
        """The (tier, effort) pairs the provider refused: never planned again."""
        return set(self._unsupported)

    def supported_efforts(self, tier: TierOption) -> tuple[str, ...]:
        """The efforts of ``tier`` the provider has not refused."""
        return tuple(e for e in tier.efforts if (tier.name, e) not in self._unsupported)

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

    # ------------------------------------------------------------ learning

    def failure(self, tier: str, status: int | None, retry_after_s: float | None = None) -> None:
        """A request failed (429, 5xx, None: a timeout): rest the tier for a while, longer
        each failure in a row (a first token from it resets that)."""
        s = self.settings
        strikes = self._strikes[tier] = self._strikes.get(tier, 0) + 1
        rest = min(s.cooldown_s * 2 ** (strikes - 1), max(s.cooldown_max_s, s.cooldown_s))
        rest = max(rest, retry_after_s or 0.0)
        why = f"HTTP {status}" if status is not None else "a timeout"
        self._cooling[tier] = (self.clock() + rest, why)

    def refuse(self, tier: str, effort: str) -> None:
        """The provider refused ``effort`` on ``tier`` (HTTP 400): never plan it there again.
        The tier itself is not rested: its other efforts are still planned."""
        self._unsupported.add((tier, effort))

    def observe(self, outcome: TurnOutcome) -> None:
        """Learn from one request's timings (or its failure)."""
        if outcome.failed and outcome.effort_unsupported:
            self.refuse(outcome.tier, outcome.effort)
            return
        if outcome.failed:
            self.failure(outcome.tier, outcome.status, outcome.retry_after_s)
            return
        tier = self._tiers.get(outcome.tier)
        if tier is None:
            raise ValueError(f"unknown tier {outcome.tier!r}: it was never planned")
        lat, per = self._latency[tier.name], self._token_ms[tier.name]
        reason = self._reasoning_of(tier.name, outcome.effort)
        speed = outcome.decode_tokens_per_s
        if speed:
            self._learn(per, 1000.0 / speed)
        if outcome.reasoning_tokens is not None:
            self._learn(reason, outcome.reasoning_tokens)
        tokens = reason.mean if outcome.reasoning_tokens is None else outcome.reasoning_tokens
        overhead = tokens * (1000.0 / speed if speed else per.mean)
        overhead += self._prefill_ms(tier, outcome.prompt_tokens)
        if outcome.ttft_ms is not None:
            self._cooling.pop(tier.name, None)
            self._strikes.pop(tier.name, None)
            self._learn(lat, max(outcome.ttft_ms - overhead, 0.0))
        elif outcome.waited_ms is not None and outcome.waited_ms - overhead > lat.mean:
            # censored: the first token would have come later still; learn the lower bound
            self._learn(lat, outcome.waited_ms - overhead)
        if outcome.tts_first_chunk_ms is not None:
            self._learn(self._tts, outcome.tts_first_chunk_ms)


def decision_record(plan: TurnPlan, outcome: TurnOutcome) -> dict[str, object]:
    """The controller's part of a turn record: the decision, predicted vs actual, what spoke."""
    spoke = (outcome.tier, outcome.effort)
    taken = "planned"
    if spoke != (plan.tier, plan.effort):
        hedged = plan.hedge is not None and spoke == (plan.hedge.tier, plan.hedge.effort)
        taken = "hedge" if hedged else "fallback"
    actual = outcome.first_audio_ms
    return {
        "tier": outcome.tier,
        "effort": outcome.effort,
        "planned_tier": plan.tier,
        "planned_effort": plan.effort,
        "taken": taken,
        "reason": plan.reason,
        "budget_ms": plan.budget_ms,
        "fits": plan.fits,
        "filler": plan.filler,
        "first_token_deadline_ms": round(plan.first_token_deadline_ms, 1),
        "predicted_first_audio_ms": round(plan.predicted_first_audio_ms, 1),
        "actual_first_audio_ms": actual,
        "error_ms": None if actual is None else round(actual - plan.predicted_first_audio_ms, 1),
    }

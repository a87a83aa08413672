"""What the latency budget controller learns, and what it predicts from it.

`LatencyModel` keeps, per tier, an online estimate of each term of the model below, the tiers
resting after a failure and the efforts the provider refused; ``predict()`` turns the estimates
into a first token and a first audio at the quantile, ``observe(outcome)`` learns from one
request after it. The controller (`pipeline.llm.controller`) plans on top of it. A pure object:
no I/O, no asyncio, time from an injected clock (seconds, monotonic; it only ends cool-downs).

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
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from statistics import NormalDist

from pipeline.llm.settings import ControllerSettings
from pipeline.llm.tiers import TierOption


@dataclass(frozen=True, slots=True)
class Prediction:
    """What a (tier, effort) is expected to take on a turn, in ms."""

    first_token_ms: float  # at the quantile, since the end of caller speech
    first_audio_ms: float  # at the quantile
    first_audio_mean_ms: float


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


class LatencyModel:
    """Estimates per tier and effort, cool-downs and refusals: what `Controller` plans on."""

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

    # ------------------------------------------------------------ what rules options out

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

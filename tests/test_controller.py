"""Latency budget controller on scripted timelines: a fake clock and tiers with scripted speeds."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from pipeline.llm.controller import Controller, TurnContext, TurnPlan
from pipeline.llm.decision import Decision
from pipeline.llm.estimates import TurnOutcome
from pipeline.llm.settings import ControllerSettings
from pipeline.llm.tiers import DEFAULT_TIERS, EFFORTS, FAST_TIER, STANDARD_TIER, TierOption

# Reasoning tokens per effort, as the simulator spends them.
SIM_REASONING = dict(zip(EFFORTS, (0, 16, 64, 256, 1024, 2048, 4096), strict=True))


class Clock:
    def __init__(self) -> None:
        self.now = 5000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Truth:
    """How a tier really behaves in a scripted timeline (the simulator's model, no jitter)."""

    latency_ms: float
    tokens_per_s: float
    prefill_tokens_per_s: float | None = None
    reasoning: dict[str, int] = field(default_factory=lambda: dict(SIM_REASONING))
    tts_ms: float = 80.0

    def outcome(self, plan: TurnPlan, ctx: TurnContext, jitter_ms: float = 0.0) -> TurnOutcome:
        per_token = 1000.0 / self.tokens_per_s
        prefill = 0.0
        if self.prefill_tokens_per_s:
            prefill = 1000.0 * ctx.prompt_tokens / self.prefill_tokens_per_s
        reasoning = self.reasoning[plan.effort]
        ttft = self.latency_ms + jitter_ms + prefill + reasoning * per_token
        first_audio = ctx.spent_ms + ttft + 12 * per_token + self.tts_ms
        return TurnOutcome(
            tier=plan.tier,
            effort=plan.effort,
            ttft_ms=ttft,
            reasoning_tokens=reasoning,
            output_tokens=reasoning + 30,
            decode_tokens_per_s=self.tokens_per_s,
            tts_first_chunk_ms=self.tts_ms,
            first_audio_ms=first_audio,
            prompt_tokens=ctx.prompt_tokens,
        )


FAST = Truth(200, 750, 8000)
STANDARD = Truth(550, 55, 4000)
CTX = TurnContext(spent_ms=300, prompt_tokens=400)


def rank(effort: str) -> int:
    return EFFORTS.index(effort)


def make(clock: Clock | None = None, **settings: object) -> Controller:
    return Controller(ControllerSettings.model_validate(settings), clock or Clock())


def turn(ctrl: Controller, ctx: TurnContext, truths: dict[str, Truth]) -> TurnPlan:
    plan = ctrl.plan(ctx)
    ctrl.observe(truths[plan.tier].outcome(plan, ctx))
    return plan


def test_fast_tier_affords_a_higher_effort_than_the_standard_tier_alone() -> None:
    both, alone = make(), make()
    standard_only = TurnContext(CTX.spent_ms, CTX.prompt_tokens, (STANDARD_TIER,))
    for _ in range(10):  # priors first, then what the scripted tiers teach
        with_fast = turn(both, CTX, {"fast": FAST, "standard": STANDARD})
        without = turn(alone, standard_only, {"standard": STANDARD})
        assert with_fast.tier == "fast" and with_fast.fits
        assert rank(with_fast.effort) >= rank("low") > rank(without.effort)
        assert without.effort == "none" and not without.fits
        assert "nothing fits" in without.reason


def test_cheapest_tier_that_delivers_the_effort_wins() -> None:
    capped = [t.model_copy(update={"efforts": ("none", "low")}) for t in DEFAULT_TIERS]
    plan = make(budget_ms=5000).plan(TurnContext(300, 400, capped))
    assert (plan.tier, plan.effort, plan.fits) == ("standard", "low", True)
    # with every effort on offer the premium tier is worth it: it reaches a higher one
    plan = make(budget_ms=5000).plan(TurnContext(300, 400))
    assert plan.tier == "fast" and rank(plan.effort) > rank("low")


def test_429_moves_the_next_turns_to_the_standard_tier_at_the_lowest_effort() -> None:
    clock = Clock()
    ctrl = make(clock, cooldown_s=30)
    truths = {"fast": FAST, "standard": STANDARD}
    first = turn(ctrl, CTX, truths)
    assert first.tier == "fast"
    plan = ctrl.plan(CTX)
    ctrl.observe(TurnOutcome(tier="fast", effort=plan.effort, failed=True, status=429))
    for _ in range(3):
        clock.now += 5
        plan = turn(ctrl, CTX, truths)
        assert (plan.tier, plan.effort) == ("standard", "none")
        assert "fast cooling down after HTTP 429" in plan.reason
    clock.now += 16  # the cool-down ends by the clock
    assert ctrl.cooling() == {}
    assert ctrl.plan(CTX).tier == "fast"


def test_retry_after_timeouts_and_recovery() -> None:
    clock = Clock()
    ctrl = make(clock, cooldown_s=30)
    ctrl.failure("fast", 429, retry_after_s=60)
    clock.now += 45
    assert set(ctrl.cooling()) == {"fast"}
    ctrl.failure("standard", None)
    plan = ctrl.plan(CTX)  # every tier resting: still answer, and say so
    assert "every tier is cooling down" in plan.reason
    assert "standard cooling down after a timeout" in plan.reason
    # a first token from the tier (a hedge or a probe) ends its cool-down at once
    ctrl.observe(FAST.outcome(TurnPlan("fast", "priority", "none", 160, 0, 0, True, ""), CTX))
    assert set(ctrl.cooling()) == {"standard"}


def test_cool_downs_double_with_failures_in_a_row_and_reset_on_a_first_token() -> None:
    clock = Clock()
    ctrl = make(clock, cooldown_s=5, cooldown_max_s=12)
    ctrl.plan(CTX)
    rests = []
    for _ in range(4):
        ctrl.failure("fast", 503)
        rests.append(round(ctrl.cooling()["fast"]))
    assert rests == [5, 10, 12, 12]
    ctrl.observe(FAST.outcome(TurnPlan("fast", "priority", "none", 160, 0, 0, True, ""), CTX))
    ctrl.failure("fast", 429)
    assert round(ctrl.cooling()["fast"]) == 5


def test_a_failures_retry_after_sets_the_rest_when_longer() -> None:
    clock = Clock()
    ctrl = make(clock, cooldown_s=5, cooldown_max_s=12)
    ctrl.plan(CTX)
    failed = TurnOutcome("fast", "low", failed=True, status=429, retry_after_s=30)
    ctrl.observe(failed)
    assert ctrl.cooling() == {"fast": pytest.approx(30)}  # past cooldown_max_s, as asked
    clock.now += 31
    ctrl.observe(TurnOutcome("standard", "low", failed=True, status=503, retry_after_s=1))
    assert ctrl.cooling() == {"standard": pytest.approx(5)}  # shorter: our own rest stands


def test_a_refused_effort_is_never_planned_again_on_that_tier() -> None:
    ctrl = make()
    late = TurnContext(spent_ms=5000, prompt_tokens=400)  # nothing fits: the fastest option
    assert (ctrl.plan(late).tier, ctrl.plan(late).effort) == ("fast", "none")
    ctrl.observe(TurnOutcome("fast", "none", failed=True, status=400, effort_unsupported=True))
    assert ctrl.unsupported() == {("fast", "none")}
    assert ctrl.cooling() == {}  # the tier is not rested
    assert ctrl.supported_efforts(FAST_TIER) == EFFORTS[1:]
    plan = ctrl.plan(late)
    assert (plan.tier, plan.effort) == ("fast", "minimal")
    # a fixed arm asking for it gets the nearest effort the tier still takes
    fixed = ctrl.plan(TurnContext(300, 400, fixed_effort="none", fixed_tier="fast"))
    assert fixed.effort == "minimal" and "none unsupported on fast" in fixed.reason
    other = ctrl.plan(TurnContext(300, 400, fixed_effort="none", fixed_tier="standard"))
    assert other.effort == "none"


def test_a_tier_with_every_effort_refused_is_left_out_unless_none_is_left() -> None:
    ctrl = make()
    for effort in EFFORTS:
        ctrl.refuse("fast", effort)
    assert ctrl.supported_efforts(FAST_TIER) == ()
    assert ctrl.plan(TurnContext(spent_ms=5000)).tier == "standard"
    for effort in EFFORTS:
        ctrl.refuse("standard", effort)
    plan = ctrl.plan(CTX)  # still an answer, and it says why
    assert "every effort was refused: trying them anyway" in plan.reason


def test_estimates_follow_a_tier_that_slows_down_within_5_turns() -> None:
    ctrl = make()
    for _ in range(10):
        before = turn(ctrl, CTX, {"fast": FAST})
    slow = Truth(450, 300, 8000)
    for _ in range(5):
        turn(ctrl, CTX, {"fast": slow})
    est = ctrl.estimates("fast", "high")  # learned at low efforts, shared by every effort
    assert est["latency_ms"].mean == pytest.approx(450, rel=0.15)
    assert est["token_ms"].mean == pytest.approx(1000 / 300, rel=0.15)
    after = ctrl.plan(CTX)
    assert rank(after.effort) < rank(before.effort)
    truth = slow.outcome(after, CTX)
    assert truth.first_audio_ms is not None
    predicted = ctrl.predict(FAST_TIER, after.effort, CTX.spent_ms, CTX.prompt_tokens)
    assert predicted.first_audio_mean_ms == pytest.approx(truth.first_audio_ms, rel=0.1)
    assert predicted.first_audio_ms >= truth.first_audio_ms


def test_slower_adaptation_with_a_long_half_life_is_not_enough() -> None:
    ctrl = make(half_life_turns=20)
    for _ in range(30):
        turn(ctrl, CTX, {"fast": FAST})
    for _ in range(5):
        turn(ctrl, CTX, {"fast": Truth(450, 300, 8000)})
    assert ctrl.estimates("fast", "none")["latency_ms"].mean < 0.85 * 450


def test_latency_is_learned_net_of_reasoning_and_prefill() -> None:
    ctrl = make(budget_ms=1500)
    big = TurnContext(spent_ms=200, prompt_tokens=4000)  # 500 ms of prefill on the fast tier
    thinker = Truth(300, 750, 8000, reasoning={**SIM_REASONING, "low": 192, "medium": 768})
    for _ in range(8):
        plan = turn(ctrl, big, {"fast": thinker})
    assert plan.tier == "fast" and thinker.reasoning[plan.effort] >= 192
    est = ctrl.estimates("fast", plan.effort)
    assert est["latency_ms"].mean == pytest.approx(300, rel=0.05)
    assert est["reasoning"].mean == pytest.approx(thinker.reasoning[plan.effort], rel=0.05)
    assert est["tts_ms"].mean == pytest.approx(80, rel=0.05)


def test_reasoning_learned_per_effort_raises_the_token_cap() -> None:
    ctrl = make(budget_ms=3000)
    low_only = [FAST_TIER.model_copy(update={"efforts": ("none", "low")})]
    ctx = TurnContext(300, 400, low_only)
    assert ctrl.plan(ctx).max_output_tokens < 160 + 2 * 64
    for _ in range(6):
        plan = turn(ctrl, ctx, {"fast": Truth(200, 750, reasoning={"none": 0, "low": 400})})
    assert plan.effort == "low"
    assert ctrl.plan(ctx).max_output_tokens >= 160 + 400
    none_only = TurnContext(300, 400, [FAST_TIER.model_copy(update={"efforts": ("none",)})])
    assert ctrl.plan(none_only).max_output_tokens == 160


def test_a_cancelled_slow_request_teaches_a_lower_bound() -> None:
    ctrl = make()
    ctrl.plan(CTX)
    mean = ctrl.estimates("fast", "none")["latency_ms"].mean
    ctrl.observe(TurnOutcome(tier="fast", effort="none", waited_ms=50))  # barge-in: no news
    assert ctrl.estimates("fast", "none")["latency_ms"].mean == mean
    ctrl.observe(TurnOutcome(tier="fast", effort="none", waited_ms=900))  # hedged away
    assert ctrl.estimates("fast", "none")["latency_ms"].mean > mean + 200


@pytest.mark.parametrize("budget_ms", [700.0, 1000.0, 2500.0])
def test_no_plan_exceeds_the_budget_unless_nothing_fits(budget_ms: float) -> None:
    rng, clock = random.Random(budget_ms), Clock()
    ctrl = make(clock, budget_ms=budget_ms, filler=True)
    tier_sets = [DEFAULT_TIERS, (FAST_TIER,), (STANDARD_TIER,)]
    seen_fit = seen_nothing = 0
    for _ in range(150):
        clock.now += rng.uniform(0, 8)
        ctx = TurnContext(rng.uniform(0, 1200), rng.randrange(0, 3000), rng.choice(tier_sets))
        plan = ctrl.plan(ctx)
        cooling = ctrl.cooling()
        open_tiers = [t for t in ctx.tiers_available if t.name not in cooling]
        options = [
            ctrl.predict(t, e, ctx.spent_ms, ctx.prompt_tokens).first_audio_ms
            for t in open_tiers or ctx.tiers_available
            for e in t.efforts
        ]
        if plan.fits:
            seen_fit += 1
            assert plan.predicted_first_audio_ms <= budget_ms
            assert "nothing fits" not in plan.reason and plan.filler is None
        else:
            seen_nothing += 1
            assert min(options) > budget_ms
            assert plan.predicted_first_audio_ms == pytest.approx(min(options))
            assert "nothing fits" in plan.reason and plan.filler
        if rng.random() < 0.05:
            ctrl.observe(TurnOutcome(tier=plan.tier, effort=plan.effort, failed=True, status=503))
        else:
            truth = {"fast": FAST, "standard": STANDARD}[plan.tier]
            ctrl.observe(truth.outcome(plan, ctx, jitter_ms=rng.uniform(-150, 150)))
    assert seen_fit and seen_nothing


def test_filler_only_when_nothing_fits_and_enabled() -> None:
    late = TurnContext(900, 400)
    ctrl = make(filler=True, filler_phrases=["One moment.", "Let me see."])
    fillers = [ctrl.plan(late).filler for _ in range(3)]
    assert fillers == ["One moment.", "Let me see.", "One moment."]
    assert ctrl.plan(CTX).filler is None
    assert make().plan(late).filler is None


def test_hedge_fires_another_tier_or_a_lower_effort_at_the_deadline() -> None:
    ctrl = make(hedge=True)
    plan = ctrl.plan(CTX)
    assert plan.hedge is not None and plan.hedge.hedge is None
    hedge = plan.hedge
    assert hedge.tier != plan.tier or rank(hedge.effort) < rank(plan.effort)
    tier = {t.name: t for t in DEFAULT_TIERS}[hedge.tier]
    from_deadline = ctrl.predict(tier, hedge.effort, plan.first_token_deadline_ms, 400)
    assert hedge.predicted_first_audio_ms == pytest.approx(from_deadline.first_audio_ms)
    assert f"no first token by {plan.first_token_deadline_ms:.0f} ms" in hedge.reason
    assert plan.first_token_deadline_ms < plan.predicted_first_audio_ms
    only = TurnContext(300, 400, [FAST_TIER.model_copy(update={"efforts": ("none",)})])
    assert ctrl.plan(only).hedge is None
    assert make().plan(CTX).hedge is None


def test_decision_says_what_spoke_and_how_far_the_prediction_was() -> None:
    ctrl = make(hedge=True)
    plan = ctrl.plan(CTX)
    assert plan.hedge is not None
    spoke = FAST.outcome(plan, CTX)
    decision = Decision.of(plan, spoke)
    assert decision.taken == "planned" and decision.reason == plan.reason
    assert (decision.tier, decision.planned_tier) == (plan.tier, plan.tier)
    assert spoke.first_audio_ms is not None
    assert decision.error_ms == round(spoke.first_audio_ms - plan.predicted_first_audio_ms, 1)
    hedged = STANDARD.outcome(plan.hedge, CTX)
    assert Decision.of(plan, hedged).taken == "hedge"
    fallback = Decision.of(plan, TurnOutcome(tier="standard", effort="max"))
    assert fallback.taken == "fallback" and fallback.error_ms is None
    unanswered = Decision.of(plan, None, "failed")
    assert (unanswered.taken, unanswered.tier, unanswered.effort) == ("failed", None, None)
    assert unanswered.planned_tier == plan.tier and unanswered.actual_first_audio_ms is None


def test_bad_inputs_are_refused() -> None:
    ctrl = make()
    with pytest.raises(ValueError, match="unknown effort"):
        ctrl.plan(TurnContext(0, 0, [FAST_TIER.model_copy(update={"efforts": ("turbo",)})]))
    with pytest.raises(ValueError, match="no tiers"):
        ctrl.plan(TurnContext(0, 0, ()))
    with pytest.raises(ValueError, match="never planned"):
        make().observe(TurnOutcome(tier="fast", effort="none", ttft_ms=100))
    with pytest.raises(ValueError):
        TierOption(name="x", service_tier=None, prior_ttft_ms=0, prior_tokens_per_s=10)


def test_worked_example_of_the_module_docstring() -> None:
    ctrl = make()
    low = ctrl.predict(FAST_TIER, "low", spent_ms=400, prompt_tokens=600)
    assert low.first_audio_mean_ms == pytest.approx(876.3, abs=0.1)
    assert low.first_audio_ms == pytest.approx(943.1, abs=0.1)
    plan = ctrl.plan(TurnContext(400, 600))
    assert (plan.tier, plan.effort, plan.max_output_tokens) == ("fast", "low", 276)
    assert plan.first_token_deadline_ms == pytest.approx(820.4, abs=0.1)
    assert "medium would take 1272 ms" in plan.reason
    alone = ctrl.plan(TurnContext(400, 600, (STANDARD_TIER,)))
    assert alone.reason == (
        "nothing fits the 1000 ms budget: fastest is none on standard at p90 1572 ms"
    )


def test_p90_predictions_cover_about_nine_turns_in_ten() -> None:
    rng, ctrl = random.Random(3), make()
    covered = []
    for i in range(300):
        plan = ctrl.plan(CTX)
        outcome = FAST.outcome(plan, CTX, jitter_ms=rng.gauss(0, 60))
        assert outcome.first_audio_ms is not None
        if i >= 20:
            covered.append(outcome.first_audio_ms <= plan.predicted_first_audio_ms)
        ctrl.observe(outcome)
    assert 0.85 <= sum(covered) / len(covered) <= 0.97  # normal approximation, ~6-turn memory

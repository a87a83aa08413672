"""TierRouter: planned requests, fallback and hedging across tiers, against the real tier
simulator over real HTTP on 127.0.0.1, through the real `openai` SDK."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from pipeline.llm.errors import LLMError
from pipeline.llm.routing import Policy
from pipeline.llm.tiers import LLMTier
from tests.support.routing import (
    FAST,
    FAST_PROFILE,
    HEARD,
    HISTORY,
    REASONING,
    STANDARD,
    STANDARD_PROFILE,
    TIGHT_MS,
    TIMINGS,
    Rig,
    attempt,
    attempts,
    rig_for,
    speak,
)
from voice.llm_sim.serving import running_simulator


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    async with rig_for() as made:
        yield made


# ---------------------------------------------------------------- the planned request


@pytest.mark.parametrize(
    ("budget_ms", "tier", "reported"),
    [(None, "standard", "default"), (TIGHT_MS, "fast", "priority")],
    ids=["roomy-budget-cheap-tier", "tight-budget-fast-tier"],
)
async def test_planned_request_speaks_and_teaches_the_controller(
    rig: Rig, budget_ms: float | None, tier: str, reported: str
) -> None:
    call = rig.call(budget_ms=budget_ms)
    assert (call.experiment, call.arm) == ("exp-1", "arm-a")
    reply = call.reply(HISTORY, time.monotonic())
    plan = reply.plan
    assert plan.tier == tier
    before = rig.controller.estimates(plan.tier, plan.effort)
    latency_seen, tts_seen = before["latency_ms"].count, before["tts_ms"].count

    text = await speak(reply)

    assert text.startswith(f"You said: {HEARD}. ")
    assert rig.stats.requests == 1
    last = rig.stats.last_request
    assert last is not None
    assert (last.service_tier, last.effort) == (plan.service_tier, plan.effort)
    assert last.max_tokens == plan.max_output_tokens
    assert reply.service_tier_requested == last.service_tier  # as sent
    assert reply.service_tier_served == reported  # as the simulator echoed it
    assert reply.first_token_at is not None and reply.first_token_at > reply.requested_at
    decision = reply.finish(TIMINGS)
    assert decision is not None
    assert decision.taken == "planned"
    assert (decision.tier, decision.effort) == (plan.tier, plan.effort)
    assert (decision.planned_tier, decision.planned_effort) == (plan.tier, plan.effort)
    assert decision.reason == plan.reason
    assert decision.budget_ms == (budget_ms or 1000.0)
    assert decision.fits == plan.fits
    assert decision.predicted_first_audio_ms == round(plan.predicted_first_audio_ms, 1)
    assert decision.actual_first_audio_ms == TIMINGS["first_audio"]
    assert attempts(decision) == [attempt(plan.tier, plan.effort, "planned", "spoke")]
    after = rig.controller.estimates(plan.tier, plan.effort)
    assert after["latency_ms"].count == latency_seen + 1
    assert after["tts_ms"].count == tts_seen + 1
    assert reply.finish(TIMINGS) is None  # a turn teaches the controller once
    assert rig.controller.estimates(plan.tier, plan.effort)["latency_ms"].count == latency_seen + 1
    await rig.stats.wait_until(lambda s: s.streams_completed == 1)
    assert rig.stats.streams_cancelled == 0


# ---------------------------------------------------------------- fallback


@pytest.mark.parametrize("status", [429, 503])
async def test_capacity_error_falls_back_within_the_turn_and_rests_the_tier(
    rig: Rig, status: int
) -> None:
    rig.sim.profiles["fast"].fail_status = status
    call = rig.call(budget_ms=TIGHT_MS)
    reply = call.reply(HISTORY, time.monotonic())
    assert reply.plan.tier == "fast"

    assert (await speak(reply)).startswith(f"You said: {HEARD}. ")

    decision = reply.finish(TIMINGS)
    assert decision is not None
    assert decision.taken == "fallback"
    assert (decision.planned_tier, decision.tier) == ("fast", "standard")
    assert decision.actual_first_audio_ms == TIMINGS["first_audio"]
    assert attempts(decision) == [
        attempt("fast", reply.plan.effort, "planned", "failed", status),
        attempt("standard", str(decision.effort), "fallback", "spoke"),
    ]
    listed = decision.attempts
    assert isinstance(listed, tuple)
    assert "'fast' tier" in str(listed[0].error)
    assert listed[1].error is None
    assert reply.service_tier_served == "default"
    assert rig.stats.errors_injected == 1
    last = rig.stats.last_request
    assert last is not None and last.service_tier == "default"
    assert set(rig.controller.cooling()) == {"fast"}

    # the next turn keeps off the resting tier: no second request to it
    second = call.reply(HISTORY, time.monotonic())
    assert second.plan.tier == "standard"
    assert f"fast cooling down after HTTP {status}" in second.plan.reason
    assert (await speak(second)).startswith(f"You said: {HEARD}. ")
    second_decision = second.finish(TIMINGS)
    assert second_decision is not None and second_decision.taken == "planned"
    assert rig.stats.errors_injected == 1  # the fast tier still fails every request it gets
    assert rig.stats.requests == 3 and rig.stats.streams_started == 2

    # once the cool-down is over (by the controller's clock) the fast tier is planned again
    rig.clock.now += rig.controller.settings.cooldown_s + 1
    assert rig.controller.cooling() == {}
    assert call.reply(HISTORY, time.monotonic()).plan.tier == "fast"


async def test_no_first_token_by_the_deadline_falls_back_and_cancels_the_slow_request() -> None:
    slow = FAST_PROFILE.model_copy(update={"ttft_ms": 3000})
    async with rig_for(profiles={"fast": slow}, llm={"first_token_grace_ms": 150}) as rig:
        reply = rig.call(budget_ms=TIGHT_MS).reply(HISTORY, time.monotonic())
        assert reply.plan.tier == "fast"
        started = time.monotonic()

        assert (await speak(reply)).startswith(f"You said: {HEARD}. ")

        assert time.monotonic() - started < 2.0  # well before the fast tier's first token
        decision = reply.finish(TIMINGS)
        assert decision is not None
        assert decision.taken == "fallback"
        assert (decision.planned_tier, decision.tier) == ("fast", "standard")
        assert attempts(decision) == [
            attempt("fast", reply.plan.effort, "planned", "timeout"),
            attempt("standard", str(decision.effort), "fallback", "spoke"),
        ]
        assert reply.service_tier_served == "default"
        # the simulator saw the fast stream go away; the standard one ran to the end
        await rig.stats.wait_until(lambda s: s.streams_cancelled == 1 and s.streams_completed == 1)
        assert rig.stats.streams_started == 2
        assert set(rig.controller.cooling()) == {"fast"}
        plan = rig.call(budget_ms=TIGHT_MS).reply(HISTORY, time.monotonic()).plan
        assert plan.tier == "standard"
        assert "fast cooling down after a timeout" in plan.reason


async def test_client_error_reaches_the_caller_without_fallback_or_rest() -> None:
    broken = LLMTier(
        name="broken",
        service_tier="nonexistent",  # the simulator answers 400 invalid_value
        prior_ttft_ms=5,
        prior_tokens_per_s=20_000,
    )
    async with rig_for(tiers=[broken, STANDARD]) as rig:
        call = rig.call(policy="fixed", effort="low", tier="broken")
        reply = call.reply(HISTORY, time.monotonic())
        assert (reply.plan.tier, reply.plan.service_tier) == ("broken", "nonexistent")

        with pytest.raises(LLMError) as raised:
            await speak(reply)

        assert raised.value.status == 400
        assert "service_tier" in raised.value.message
        # no second request: the standard tier was never asked
        assert len(reply.attempts) == 1
        assert rig.stats.streams_started == 0 and rig.stats.last_request is None
        decision = reply.finish({})
        assert decision is not None
        assert decision.taken == "failed"
        assert (decision.tier, decision.effort) == (None, None)
        assert decision.actual_first_audio_ms is None
        assert attempts(decision) == [attempt("broken", "low", "planned", "failed", 400)]
        # a bad request is not a capacity problem: the tier is not rested
        assert rig.controller.cooling() == {}
        assert "cooling" not in call.reply(HISTORY, time.monotonic()).plan.reason


async def test_every_tier_failing_raises_after_trying_each_once(rig: Rig) -> None:
    for profile in rig.sim.profiles.values():
        profile.fail_status = 503
    reply = rig.call(budget_ms=TIGHT_MS).reply(HISTORY, time.monotonic())

    with pytest.raises(LLMError, match=r"every tier failed \(fast, standard\)") as raised:
        await speak(reply)

    assert raised.value.status == 503
    assert rig.stats.errors_injected == 2
    assert set(rig.controller.cooling()) == {"fast", "standard"}
    decision = reply.finish(TIMINGS)
    assert decision is not None
    assert decision.taken == "failed"
    listed = attempts(decision)
    assert [(a["tier"], a["kind"], a["result"], a["status"]) for a in listed] == [
        ("fast", "planned", "failed", 503),
        ("standard", "fallback", "failed", 503),
    ]


# ---------------------------------------------------------------- hedging


async def test_hedge_speaks_first_when_the_planned_tier_stalls() -> None:
    fast_low = FAST.model_copy(update={"efforts": ("low",)})  # the hedge goes to standard
    stalled = FAST_PROFILE.model_copy(update={"ttft_ms": 3000})
    async with rig_for(tiers=[fast_low, STANDARD], profiles={"fast": stalled}, hedge=True) as rig:
        reply = rig.call(budget_ms=TIGHT_MS).reply(HISTORY, time.monotonic())
        plan = reply.plan
        assert (plan.tier, plan.effort) == ("fast", "low")
        assert plan.hedge is not None and plan.hedge.tier == "standard"
        prior = rig.controller.estimates("fast", "low")["latency_ms"].mean
        started = time.monotonic()

        assert (await speak(reply)).startswith(f"You said: {HEARD}. ")

        assert time.monotonic() - started < 2.0  # the stalled tier's first token never came
        decision = reply.finish(TIMINGS)
        assert decision is not None
        assert decision.taken == "hedge"
        assert (decision.tier, decision.effort) == ("standard", plan.hedge.effort)
        assert (decision.planned_tier, decision.planned_effort) == ("fast", "low")
        assert attempts(decision) == [
            attempt("fast", "low", "planned", "lost"),
            attempt("standard", plan.hedge.effort, "hedge", "spoke"),
        ]
        assert reply.service_tier_served == "default"
        await rig.stats.wait_until(lambda s: s.streams_cancelled == 1 and s.streams_completed == 1)
        # the lost request counts as censored: it waited longer than the prior predicts
        assert rig.controller.estimates("fast", "low")["latency_ms"].mean > prior
        assert rig.controller.cooling() == {}  # losing is not failing


async def test_planned_request_beats_a_slower_hedge() -> None:
    fast_low = FAST.model_copy(update={"efforts": ("low",)})
    late = FAST_PROFILE.model_copy(update={"ttft_ms": 80})  # past the deadline, then speaks
    crawling = STANDARD_PROFILE.model_copy(update={"ttft_ms": 3000})
    profiles = {"fast": late, "standard": crawling}
    async with rig_for(tiers=[fast_low, STANDARD], profiles=profiles, hedge=True) as rig:
        reply = rig.call(budget_ms=TIGHT_MS).reply(HISTORY, time.monotonic())
        plan = reply.plan
        assert plan.hedge is not None and plan.hedge.tier == "standard"
        assert plan.first_token_deadline_ms < 40  # the hedge fires well before 80 ms
        started = time.monotonic()

        assert (await speak(reply)).startswith(f"You said: {HEARD}. ")

        assert time.monotonic() - started < 2.0
        decision = reply.finish(TIMINGS)
        assert decision is not None
        assert decision.taken == "planned"
        assert (decision.tier, decision.effort) == ("fast", "low")
        assert attempts(decision) == [
            attempt("fast", "low", "planned", "spoke"),
            attempt("standard", plan.hedge.effort, "hedge", "lost"),
        ]
        assert reply.service_tier_served == "priority"
        await rig.stats.wait_until(lambda s: s.streams_cancelled == 1 and s.streams_completed == 1)
        last = rig.stats.last_request
        assert last is not None and last.service_tier == "default"  # the hedge was sent
        assert rig.stats.requests == 2


async def test_hedge_gets_its_own_first_token_deadline() -> None:
    """A hedge to a slower tier is not cut off at the planned request's deadline + grace."""
    fast_low = FAST.model_copy(update={"efforts": ("low",)})
    standard = STANDARD.model_copy(update={"prior_ttft_ms": 150})
    stalled = FAST_PROFILE.model_copy(update={"ttft_ms": 3000})
    slower = STANDARD_PROFILE.model_copy(update={"ttft_ms": 150})
    async with rig_for(
        tiers=[fast_low, standard],
        profiles={"fast": stalled, "standard": slower},
        llm={"first_token_grace_ms": 60},
        hedge=True,
    ) as rig:
        reply = rig.call(budget_ms=TIGHT_MS).reply(HISTORY, time.monotonic())
        plan = reply.plan
        assert plan.hedge is not None and plan.hedge.tier == "standard"
        # the hedge's first token is due after the planned request would be given up on
        assert plan.hedge.first_token_deadline_ms > plan.first_token_deadline_ms + 60 + 50

        assert (await speak(reply)).startswith(f"You said: {HEARD}. ")

        decision = reply.finish(TIMINGS)
        assert decision is not None
        assert decision.taken == "hedge"
        assert attempts(decision) == [
            attempt("fast", "low", "planned", "lost"),
            attempt("standard", plan.hedge.effort, "hedge", "spoke"),
        ]
        await rig.stats.wait_until(lambda s: s.streams_cancelled == 1)


# ---------------------------------------------------------------- fixed arms, cancellation


async def test_fixed_policy_sends_its_effort_on_its_tier(rig: Rig) -> None:
    reply = rig.call(policy="fixed", effort="medium", tier="standard").reply(
        HISTORY, time.monotonic()
    )
    plan = reply.plan
    assert (plan.tier, plan.service_tier, plan.effort) == ("standard", "default", "medium")
    assert plan.reason.startswith("fixed arm: medium on standard")

    assert (await speak(reply)).startswith(f"You said: {HEARD}. ")

    last = rig.stats.last_request
    assert last is not None
    assert (last.service_tier, last.effort, last.profile) == ("default", "medium", "standard")
    decision = reply.finish(TIMINGS)
    assert decision is not None
    assert (decision.taken, decision.tier, decision.effort) == (
        "planned",
        "standard",
        "medium",
    )
    assert reply.reasoning_tokens == REASONING["medium"]


async def test_fixed_policy_without_a_tier_uses_the_first_tier(rig: Rig) -> None:
    reply = rig.call(policy="fixed", effort="high").reply(HISTORY, time.monotonic())
    assert (reply.plan.tier, reply.plan.effort) == ("fast", "high")
    assert reply.plan.reason.startswith("fixed arm: high on fast")
    await speak(reply)
    last = rig.stats.last_request
    assert last is not None and (last.service_tier, last.effort) == ("priority", "high")


def test_fixed_policy_needs_an_effort() -> None:
    with pytest.raises(ValidationError, match="a fixed policy needs an effort"):
        Policy(policy="fixed")
    with pytest.raises(ValidationError):
        Policy(budget_ms=0)
    assert Policy(policy="fixed", effort="low").tier is None
    assert Policy().policy == "adaptive"


async def test_closing_mid_stream_cancels_the_request_and_still_decides(rig: Rig) -> None:
    rig.sim.profiles["standard"].tokens_per_s = 20  # seconds to say the whole reply
    reply = rig.call(policy="fixed", effort="none", tier="standard").reply(
        HISTORY, time.monotonic()
    )
    first = None
    async for delta in reply:
        first = delta
        break
    await reply.aclose()

    assert first == "You"
    await rig.stats.wait_until(lambda s: s.streams_cancelled == 1)
    assert rig.stats.streams_completed == 0
    latency_seen = rig.controller.estimates("standard", "none")["latency_ms"].count
    decision = reply.finish(TIMINGS)
    assert decision is not None
    assert (decision.taken, decision.tier, decision.effort) == (
        "planned",
        "standard",
        "none",
    )
    assert decision.actual_first_audio_ms == TIMINGS["first_audio"]
    assert attempts(decision) == [attempt("standard", "none", "planned", "spoke")]
    assert rig.controller.estimates("standard", "none")["latency_ms"].count == latency_seen + 1


async def test_barge_in_before_the_first_token_loses_the_request() -> None:
    stalled = FAST_PROFILE.model_copy(update={"ttft_ms": 3000})
    async with rig_for(profiles={"fast": stalled}, llm={"first_token_grace_ms": 5000}) as rig:
        reply = rig.call(budget_ms=TIGHT_MS).reply(HISTORY, time.monotonic())
        assert reply.plan.tier == "fast"

        async def first_delta() -> str | None:
            async for delta in reply:
                return delta
            return None

        task = asyncio.create_task(first_delta())
        await rig.stats.wait_until(lambda s: s.streams_started == 1)
        task.cancel()  # the caller spoke again: the response task is cancelled
        with pytest.raises(asyncio.CancelledError):
            await task

        await rig.stats.wait_until(lambda s: s.streams_cancelled == 1)
        decision = reply.finish({})
        assert decision is not None
        assert decision.taken == "none"
        assert (decision.tier, decision.effort) == (None, None)
        assert attempts(decision) == [attempt("fast", reply.plan.effort, "planned", "lost")]
        assert rig.controller.cooling() == {}  # cut off by the caller, not failed


async def test_a_request_cut_off_before_its_first_token_teaches_the_wait_net_of_prefill() -> None:
    """The censored wait of a barged-in request, like a lost hedge's, excludes the prefill."""
    slow_prefill = {"prefill_tokens_per_s": 500}
    tiers = [FAST.model_copy(update=slow_prefill), STANDARD.model_copy(update=slow_prefill)]
    profiles = {
        "fast": FAST_PROFILE.model_copy(update={"ttft_ms": 3000, **slow_prefill}),
        "standard": STANDARD_PROFILE.model_copy(update=slow_prefill),
    }
    llm = {"first_token_grace_ms": 5000}
    async with rig_for(tiers=tiers, profiles=profiles, llm=llm) as rig:
        began = time.monotonic()
        reply = rig.call(budget_ms=TIGHT_MS).reply(HISTORY, began)
        assert reply.plan.tier == "fast"
        prefill_ms = 1000 * reply.prompt_tokens / 500
        assert prefill_ms > 200
        prior = rig.controller.estimates("fast", reply.plan.effort)["latency_ms"].mean

        async def first_delta() -> str | None:
            async for delta in reply:
                return delta
            return None

        task = asyncio.create_task(first_delta())
        # the caller talks over the wait: cut off past the prefill, long before any token
        await asyncio.sleep((prefill_ms + 100) / 1000)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        decision = reply.finish({})
        waited_at_most_ms = (time.monotonic() - began) * 1000

        assert decision is not None and decision.taken == "none"
        learned = rig.controller.estimates("fast", reply.plan.effort)["latency_ms"].mean
        assert learned > prior  # it waited longer than the latency the prior predicts
        # ... but only the wait beyond the prompt's prefill is latency
        assert learned <= waited_at_most_ms - prefill_ms
        await rig.stats.wait_until(lambda s: s.streams_cancelled == 1)


async def test_a_provider_sending_garbage_counts_as_failed_and_the_turn_falls_back() -> None:
    """A 'provider' whose stream is not JSON: the turn still gets its reply from the next tier."""

    async def garbage(request: Request) -> Response:
        async def body() -> AsyncIterator[bytes]:
            yield b"data: {this is not json\n\n"

        return StreamingResponse(body(), media_type="text/event-stream")

    broken = Starlette(routes=[Route("/v1/chat/completions", garbage, methods=["POST"])])
    async with running_simulator(app=broken) as broken_url:
        fast = FAST.model_copy(update={"base_url": broken_url})
        async with rig_for(tiers=[fast, STANDARD]) as rig:
            reply = rig.call(budget_ms=TIGHT_MS).reply(HISTORY, time.monotonic())
            assert reply.plan.tier == "fast"
            assert (await speak(reply)).startswith(f"You said: {HEARD}. ")
            decision = reply.finish(TIMINGS)
    assert decision is not None and decision.taken == "fallback"
    failed, spoke = attempts(decision)
    assert (failed["tier"], failed["result"], failed["status"]) == ("fast", "failed", None)
    assert (spoke["tier"], spoke["result"]) == ("standard", "spoke")


async def test_each_tier_speaks_its_own_api_flavour_and_model() -> None:
    """A tier on the Responses API with its own model, next to one on Chat Completions."""
    fast = FAST.model_copy(update={"api": "responses", "model": "fast-model"})
    async with rig_for(tiers=[fast, STANDARD]) as rig:
        # Effort low, not the `max` a tight budget plans here: 4096 reasoning tokens streamed
        # through the Responses API once missed the first-token deadline on a loaded runner.
        call = rig.call(policy="fixed", effort="low", tier="fast")
        first = call.reply(HISTORY, time.monotonic())
        assert first.plan.tier == "fast"
        assert (await speak(first)).startswith(f"You said: {HEARD}. ")
        sent = rig.stats.last_request
        assert sent is not None
        assert (sent.api, sent.model, sent.effort) == ("responses", "fast-model", first.plan.effort)
        fixed = rig.call(policy="fixed", effort="low", tier="standard").reply(
            HISTORY, time.monotonic()
        )
        assert (await speak(fixed)).startswith("You said:")
        sent = rig.stats.last_request
        assert sent is not None and (sent.api, sent.model) == ("chat", "hotline-sim")


async def test_a_held_speculative_reply_teaches_synthesis_time_not_the_wait(rig: Rig) -> None:
    reply = rig.call(budget_ms=TIGHT_MS).reply(HISTORY, time.monotonic())
    plan = reply.plan
    before = rig.controller.estimates(plan.tier, plan.effort)["tts_ms"]
    seen, prior = before.count, before.mean
    await speak(reply)
    # Synthesised 20 ms after the first sentence, then held 240 ms until the turn ended there,
    # then sent 2 ms later: 22 ms of synthesis and sending, not 262.
    held = {
        "first_sentence": 40.0,
        "tts_first_chunk": 60.0,
        "endpoint": 300.0,
        "first_audio": 302.0,
    }
    decision = reply.finish(held)
    assert decision is not None and decision.actual_first_audio_ms == 302.0
    after = rig.controller.estimates(plan.tier, plan.effort)["tts_ms"]
    assert after.count == seen + 1
    assert after.mean < max(prior, 22.0) + 1  # the wait (240 ms) was not learned as synthesis

"""Provider errors that steer the controller (issue 12): a 429/503's Retry-After rests the tier
at least that long, and a 400 refusing the reasoning effort drops that (tier, effort) for good
while the turn is planned again. Fake OpenAI-compatible providers over real HTTP on 127.0.0.1,
through the real `openai` SDK, next to the tier simulator."""

from __future__ import annotations

import email.utils
import json
import time
from collections.abc import AsyncIterator
from typing import Any, Literal

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from pipeline.llm.client import LLMClient
from pipeline.llm.errors import LLMError, retry_after_s
from pipeline.llm.settings import LLMSettings
from tests.support.routing import (
    FAST,
    HEARD,
    HISTORY,
    STANDARD,
    TIGHT_MS,
    TIMINGS,
    attempt,
    attempts,
    rig_for,
    speak,
)
from voice.llm_sim.serving import running_simulator

Api = Literal["chat", "responses"]
# What OpenAI answers a model that does not take the effort.
REFUSED_NONE = {
    "error": {
        "message": "Unsupported value: 'reasoning_effort' does not support 'none' with this "
        "model. Supported values are: 'low', 'medium', and 'high'.",
        "type": "invalid_request_error",
        "param": "reasoning_effort",
        "code": "unsupported_value",
    }
}
BAD_MESSAGES = {
    "error": {
        "message": "Invalid 'messages[1].content': string too long.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "string_above_max_length",
    }
}
LATE_S = 5.0  # a turn this late fits no budget
REPLY = ["Sure", ",", " a table", " for two."]


class FakeProvider:
    """Chat Completions (and Responses, errors only) that answer as told; records each effort."""

    def __init__(
        self,
        status: int | None = None,
        body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        refuse: tuple[str, ...] = (),
    ) -> None:
        self.status, self.body, self.headers, self.refuse = status, body, headers or {}, refuse
        self.efforts: list[str | None] = []
        routes = [
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/responses", self.responses, methods=["POST"]),
        ]
        self.app = Starlette(routes=routes)

    def error(self, effort: str | None) -> Response | None:
        if effort is not None and effort in self.refuse:
            return JSONResponse(REFUSED_NONE, 400)
        if self.status is not None:
            return JSONResponse(self.body or {"error": {}}, self.status, headers=self.headers)
        return None

    async def chat(self, request: Request) -> Response:
        sent = await request.json()
        self.efforts.append(sent.get("reasoning_effort"))
        if (failure := self.error(sent.get("reasoning_effort"))) is not None:
            return failure

        async def stream() -> AsyncIterator[bytes]:
            for i, text in enumerate(REPLY):
                last = i == len(REPLY) - 1
                choice = {"index": 0, "delta": {"content": text}, "finish_reason": None}
                if last:
                    choice["finish_reason"] = "stop"
                chunk = {
                    "id": "chatcmpl-fake",
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": sent["model"],
                    "choices": [choice],
                }
                yield f"data: {json.dumps(chunk)}\n\n".encode()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    async def responses(self, request: Request) -> Response:
        sent = await request.json()
        effort = (sent.get("reasoning") or {}).get("effort")
        self.efforts.append(effort)
        failure = self.error(effort)
        assert failure is not None, "this fake only answers the Responses API with errors"
        if effort in self.refuse:  # the Responses API names the nested field
            body = json.loads(bytes(failure.body))
            body["error"]["param"] = "reasoning.effort"
            return JSONResponse(body, 400)
        return failure


async def first_error(url: str, api: Api = "chat", effort: str = "low") -> LLMError:
    client = LLMClient(LLMSettings(api=api, reasoning_effort=effort), base_url=url)
    try:
        with pytest.raises(LLMError) as raised:
            async with client.stream(HISTORY) as stream:
                async for _ in stream:
                    pass
    finally:
        await client.aclose()
    return raised.value


# ---------------------------------------------------------------- the client reads the error


def test_retry_after_is_read_as_seconds_or_an_http_date() -> None:
    now = 1_700_000_000.0
    assert retry_after_s({"retry-after": "30"}, now) == 30.0
    assert retry_after_s({"retry-after": "1.5"}, now) == 1.5
    date = email.utils.formatdate(now + 42, usegmt=True)
    assert retry_after_s({"retry-after": date}, now) == pytest.approx(42, abs=1)
    past = email.utils.formatdate(now - 60, usegmt=True)
    assert retry_after_s({"retry-after": past}, now) == 0.0
    assert retry_after_s({"retry-after-ms": "250", "retry-after": "30"}, now) == 0.25
    for junk in ("soon", "-5", "nan", "inf", ""):
        assert retry_after_s({"retry-after": junk}, now) is None
    assert retry_after_s({}, now) is None


@pytest.mark.parametrize("status", [429, 503])
@pytest.mark.parametrize("form", ["seconds", "http-date"])
async def test_a_capacity_error_carries_the_providers_retry_after(status: int, form: str) -> None:
    value = "30" if form == "seconds" else email.utils.formatdate(time.time() + 30, usegmt=True)
    provider = FakeProvider(status, {"error": {"message": "slow down"}}, {"Retry-After": value})
    async with running_simulator(app=provider.app) as url:
        error = await first_error(url)
    assert (error.status, error.message) == (status, "slow down")
    assert error.retry_after_s == pytest.approx(30, abs=1.5)
    assert not error.effort_unsupported


@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_a_400_refusing_the_effort_is_told_apart_from_other_400s(api: Api) -> None:
    refusing = FakeProvider(refuse=("none",))
    async with running_simulator(app=refusing.app) as url:
        refused = await first_error(url, api, effort="none")
    assert refused.status == 400 and refused.retry_after_s is None
    assert refused.param == ("reasoning_effort" if api == "chat" else "reasoning.effort")
    assert "does not support 'none'" in refused.message
    assert refused.effort_unsupported

    broken = FakeProvider(400, BAD_MESSAGES)
    async with running_simulator(app=broken.app) as url:
        other = await first_error(url, api)
    assert (other.status, other.param) == (400, "messages")
    assert not other.effort_unsupported


def test_an_effort_named_only_in_the_message_counts_too() -> None:
    assert LLMError(400, "This model does not support reasoning effort 'none'.").effort_unsupported
    assert LLMError(400, "Unknown value for reasoning.effort").effort_unsupported
    assert not LLMError(400, "Invalid 'messages'.", param="messages").effort_unsupported
    assert not LLMError(429, "x", param="reasoning_effort").effort_unsupported


# ---------------------------------------------------------------- the router and controller


async def test_retry_after_rests_the_tier_that_long_and_the_turn_falls_back() -> None:
    provider = FakeProvider(429, {"error": {"message": "rate limited"}}, {"Retry-After": "30"})
    async with running_simulator(app=provider.app) as fake_url:
        fast = FAST.model_copy(update={"base_url": fake_url})
        async with rig_for(tiers=[fast, STANDARD]) as rig:  # cooldown_s: the default 5 s
            call = rig.call(budget_ms=TIGHT_MS)
            reply = call.reply(HISTORY, time.monotonic())
            assert reply.plan.tier == "fast"

            assert (await speak(reply)).startswith(f"You said: {HEARD}. ")

            decision = reply.finish(TIMINGS)
            assert decision is not None
            assert decision.taken == "fallback"
            assert (decision.planned_tier, decision.tier) == ("fast", "standard")
            assert attempts(decision) == [
                attempt("fast", reply.plan.effort, "planned", "failed", 429),
                attempt("standard", str(decision.effort), "fallback", "spoke"),
            ]
            # rested for the provider's 30 s, not the controller's own 5 s
            assert rig.controller.cooling() == {"fast": pytest.approx(30)}
            rig.clock.now += 29
            assert rig.call(budget_ms=TIGHT_MS).reply(HISTORY, time.monotonic()).plan.tier == (
                "standard"
            )
            rig.clock.now += 2
            assert rig.controller.cooling() == {}
            assert rig.call(budget_ms=TIGHT_MS).reply(HISTORY, time.monotonic()).plan.tier == (
                "fast"
            )
    assert provider.efforts == [reply.plan.effort]  # one request: the resting tier was spared


async def test_a_refused_effort_is_replanned_within_the_turn_and_never_planned_again() -> None:
    provider = FakeProvider(refuse=("none",))
    async with running_simulator(app=provider.app) as fake_url:
        fast = FAST.model_copy(update={"base_url": fake_url})
        async with rig_for(tiers=[fast, STANDARD]) as rig:
            call = rig.call(budget_ms=TIGHT_MS)
            # a turn already late: nothing fits, so the plan is the fastest option
            reply = call.reply(HISTORY, time.monotonic() - LATE_S)
            assert (reply.plan.tier, reply.plan.effort, reply.plan.fits) == ("fast", "none", False)

            assert await speak(reply) == "".join(REPLY)

            decision = reply.finish(TIMINGS)
            assert decision is not None
            assert decision.taken == "fallback"
            assert (decision.planned_tier, decision.planned_effort) == ("fast", "none")
            assert (decision.tier, decision.effort) == ("fast", "minimal")
            assert attempts(decision) == [
                attempt("fast", "none", "planned", "refused", 400),
                attempt("fast", "minimal", "fallback", "spoke"),
            ]
            listed = decision.attempts
            assert isinstance(listed, tuple) and "does not support 'none'" in str(listed[0].error)
            assert provider.efforts == ["none", "minimal"]
            assert rig.controller.unsupported() == {("fast", "none")}
            assert rig.controller.cooling() == {}  # the tier itself is fine

            # later turns keep off it: adaptive, and a fixed arm that asks for it
            again = call.reply(HISTORY, time.monotonic() - LATE_S)
            assert (again.plan.tier, again.plan.effort) == ("fast", "minimal")
            assert await speak(again) == "".join(REPLY)
            fixed = rig.call(policy="fixed", effort="none", tier="fast").reply(
                HISTORY, time.monotonic()
            )
            assert (fixed.plan.tier, fixed.plan.effort) == ("fast", "minimal")
            assert "none unsupported on fast" in fixed.plan.reason
            # the other tier still takes it
            standard = rig.call(policy="fixed", effort="none", tier="standard").reply(
                HISTORY, time.monotonic()
            )
            assert (standard.plan.tier, standard.plan.effort) == ("standard", "none")
    assert provider.efforts == ["none", "minimal", "minimal"]


async def test_other_400s_still_reach_the_caller() -> None:
    provider = FakeProvider(400, BAD_MESSAGES)
    async with running_simulator(app=provider.app) as fake_url:
        fast = FAST.model_copy(update={"base_url": fake_url})
        async with rig_for(tiers=[fast, STANDARD]) as rig:
            reply = rig.call(budget_ms=TIGHT_MS).reply(HISTORY, time.monotonic())
            with pytest.raises(LLMError) as raised:
                await speak(reply)
            assert (raised.value.status, raised.value.param) == (400, "messages")
            decision = reply.finish({})
            assert decision is not None and decision.taken == "failed"
            assert attempts(decision) == [
                attempt("fast", reply.plan.effort, "planned", "failed", 400)
            ]
            assert rig.controller.unsupported() == set() and rig.controller.cooling() == {}
            assert rig.stats.requests == 0  # the standard tier was never asked


async def test_a_tier_refusing_every_effort_is_left_for_the_next() -> None:
    """Every effort refused on a tier: each is tried once, then the turn moves on."""
    provider = FakeProvider(refuse=("none", "minimal"))
    fast = FAST.model_copy(update={"efforts": ("none", "minimal")})
    async with running_simulator(app=provider.app) as fake_url:
        fast = fast.model_copy(update={"base_url": fake_url})
        async with rig_for(tiers=[fast, STANDARD]) as rig:
            reply = rig.call(budget_ms=TIGHT_MS).reply(HISTORY, time.monotonic())
            assert (await speak(reply)).startswith(f"You said: {HEARD}. ")
            decision = reply.finish(TIMINGS)
            assert decision is not None
            listed = attempts(decision)
            assert [(a["tier"], a["kind"], a["result"], a["status"]) for a in listed] == [
                ("fast", "planned", "refused", 400),
                ("fast", "fallback", "refused", 400),
                ("standard", "fallback", "spoke", None),
            ]
            assert {listed[0]["effort"], listed[1]["effort"]} == {"none", "minimal"}
            assert rig.controller.unsupported() == {("fast", "none"), ("fast", "minimal")}
            assert rig.call(budget_ms=TIGHT_MS).reply(HISTORY, time.monotonic()).plan.tier == (
                "standard"
            )

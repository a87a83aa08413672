"""Tool calling through the LLM step: `LLMClient` streams against the tier simulator over real
HTTP on 127.0.0.1, through the real `openai` SDK, for both OpenAI APIs; and a request that only
calls tools wins its turn in the router (`TierRouter.for_call(..., tools=...)`)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pytest
import pytest_asyncio
from starlette.applications import Starlette

from pipeline.llm.attempt import Attempt
from pipeline.llm.client import ChatMessage, LLMClient, LLMStream, estimate_prompt_tokens
from pipeline.llm.controller import TurnPlan
from pipeline.llm.errors import LLMError
from pipeline.llm.routing import Policy
from pipeline.llm.settings import LLMSettings
from pipeline.tools import ToolCall, ToolSpec
from tests.support.routing import (
    FAST,
    FAST_PROFILE,
    STANDARD,
    STANDARD_PROFILE,
    TIGHT_MS,
    TIMINGS,
    attempt,
    attempts,
    rig_for,
    speak,
)
from voice.llm_sim.serving import running_simulator
from voice.llm_sim.simulator import (
    SimulatorSettings,
    SimulatorStats,
    TierProfile,
    create_simulator_app,
    simulator_stats,
)

Api = Literal["chat", "responses"]
APIS: list[Api] = ["chat", "responses"]

ORDER_STATUS = ToolSpec(
    "get_order_status",
    "Where an order is.",
    {
        "type": "object",
        "properties": {"order_number": {"type": "string"}},
        "required": ["order_number"],
    },
)
TRANSFER = ToolSpec(
    "transfer_to_human",
    "Put the caller through to a person.",
    {"type": "object", "properties": {"reason": {"type": "string"}}, "required": ["reason"]},
)
END_CALL = ToolSpec("end_call", "Hang up.")
TOOLS = [ORDER_STATUS, TRANSFER, END_CALL]


@dataclass
class Sim:
    app: Starlette
    url: str

    @property
    def stats(self) -> SimulatorStats:
        return simulator_stats(self.app)

    def client(self, api: Api, **changes: Any) -> LLMClient:
        return LLMClient(LLMSettings(api=api, **changes), base_url=self.url)


def quick_profiles(tokens_per_s: float = 20_000) -> dict[str, TierProfile]:
    return {
        "fast": TierProfile(ttft_ms=5, tokens_per_s=tokens_per_s, reported_as="priority"),
        "standard": TierProfile(ttft_ms=20, tokens_per_s=2_000, reported_as="default"),
    }


@pytest_asyncio.fixture
async def sim() -> AsyncIterator[Sim]:
    app = create_simulator_app(SimulatorSettings(profiles=quick_profiles(), seed=3))
    async with running_simulator(app=app) as url:
        yield Sim(app, url)


async def reply(
    sim: Sim, api: Api, history: Sequence[ChatMessage], **options: Any
) -> tuple[str, LLMStream]:
    client = sim.client(api)
    try:
        async with client.stream(history, **options) as stream:
            text = "".join([delta async for delta in stream])
    finally:
        await client.aclose()
    return text, stream


# ---------------------------------------------------------------- the client


@pytest.mark.parametrize("api", APIS)
async def test_asking_for_a_person_calls_transfer_to_human(sim: Sim, api: Api) -> None:
    said = "Please transfer me to a person"
    text, stream = await reply(sim, api, [ChatMessage("user", said)], tools=TOOLS)

    assert text == ""
    assert [c.name for c in stream.tool_calls] == ["transfer_to_human"]
    assert stream.tool_calls[0].parsed() == {"reason": said}
    assert stream.tool_calls[0].id.startswith("call_")
    assert stream.finish_reason == "tool_calls"
    assert stream.first_token_at is None and stream.first_tool_call_at is not None
    assert stream.first_tool_call_at >= stream.requested_at
    sent = sim.stats.last_request
    assert sent is not None
    assert [t.name for t in sent.tools] == ["get_order_status", "transfer_to_human", "end_call"]
    assert sent.tools[0].parameters == ORDER_STATUS.parameters
    assert sent.parallel_tool_calls


@pytest.mark.parametrize("api", APIS)
async def test_two_order_numbers_are_two_calls_after_a_spoken_preface(sim: Sim, api: Api) -> None:
    history = [ChatMessage("user", "Where are orders 4512 and 7781?")]
    text, stream = await reply(sim, api, history, tools=TOOLS)

    assert text == "Let me look that up."
    assert stream.first_token_at is not None and stream.first_tool_call_at is not None
    assert stream.first_token_at <= stream.first_tool_call_at  # the words came first
    assert [(c.name, c.parsed()) for c in stream.tool_calls] == [
        ("get_order_status", {"order_number": "4512"}),
        ("get_order_status", {"order_number": "7781"}),
    ]
    assert len({c.id for c in stream.tool_calls}) == 2
    assert stream.finish_reason == "tool_calls"


@pytest.mark.parametrize("api", APIS)
async def test_tool_results_sent_back_are_spoken(sim: Sim, api: Api) -> None:
    asked = [ChatMessage("user", "Where are orders four five one two and 7,781?")]
    preface, first = await reply(sim, api, asked, tools=TOOLS)
    calls = first.tool_calls
    assert [c.parsed() for c in calls] == [{"order_number": "4512"}, {"order_number": "7781"}]
    results = [
        {"order": "4512", "status": "shipped", "eta": "Friday"},
        {"error": "no order 7781 on file"},
    ]
    history = [
        *asked,
        ChatMessage("assistant", preface, tool_calls=tuple(calls)),
        *(
            ChatMessage("tool", json.dumps(r), tool_call_id=c.id)
            for c, r in zip(calls, results, strict=True)
        ),
    ]
    text, stream = await reply(sim, api, history, tools=TOOLS)

    assert text == (
        "Order 4512: status shipped, eta Friday. "
        "Sorry, I couldn't get order status: no order 7781 on file."
    )
    assert stream.tool_calls == []
    assert stream.finish_reason == "stop"
    sent = sim.stats.last_request
    assert sent is not None and ("user", asked[0].content) in sent.messages
    assert ("assistant", preface) in sent.messages


@pytest.mark.parametrize("api", APIS)
async def test_a_goodbye_ends_the_call_and_its_result_says_goodbye(sim: Sim, api: Api) -> None:
    asked = [ChatMessage("user", "That's all, bye")]
    _, first = await reply(sim, api, asked, tools=TOOLS)
    assert [(c.name, c.parsed()) for c in first.tool_calls] == [
        ("end_call", {"reason": "the caller said goodbye"})
    ]
    call = first.tool_calls[0]
    history = [
        *asked,
        ChatMessage("assistant", "", tool_calls=(call,)),
        ChatMessage("tool", '{"ok": true}', tool_call_id=call.id),
    ]
    text, _ = await reply(sim, api, history, tools=TOOLS)
    assert text == "Thank you for calling. Goodbye."


@pytest.mark.parametrize("api", APIS)
async def test_a_result_for_no_call_is_a_400(sim: Sim, api: Api) -> None:
    history = [
        ChatMessage("user", "Where is order 4512?"),
        ChatMessage("tool", '{"status": "shipped"}', tool_call_id="call_nobody_made"),
    ]
    with pytest.raises(LLMError) as raised:
        await reply(sim, api, history, tools=TOOLS)
    assert raised.value.status == 400
    assert sim.stats.requests == 0  # refused before any generation


@pytest.mark.parametrize("api", APIS)
async def test_a_call_left_unanswered_is_a_400(sim: Sim, api: Api) -> None:
    call = ToolCall("call_1", "get_order_status", '{"order_number": "4512"}')
    history = [
        ChatMessage("user", "Where is order 4512?"),
        ChatMessage("assistant", "", tool_calls=(call,)),
        ChatMessage("user", "Hello?"),
    ]
    with pytest.raises(LLMError) as raised:
        await reply(sim, api, history, tools=TOOLS)
    assert raised.value.status == 400


@pytest.mark.parametrize("api", APIS)
async def test_without_tools_the_reply_is_as_before(sim: Sim, api: Api) -> None:
    history = [ChatMessage("user", "Please transfer me to a person about order 4512")]
    text, stream = await reply(sim, api, history)
    with_tools, _ = await reply(
        sim, api, [ChatMessage("user", "What time do you open?")], tools=TOOLS
    )

    assert text.startswith("You said: Please transfer me to a person about order 4512. ")
    assert stream.tool_calls == [] and stream.first_tool_call_at is None
    assert stream.finish_reason == "stop"
    # offered tools that fit nothing said: the same answer as without them
    without, _ = await reply(sim, api, [ChatMessage("user", "What time do you open?")])
    assert with_tools == without


@pytest.mark.parametrize("api", APIS)
async def test_instructions_replace_the_system_prompt(sim: Sim, api: Api) -> None:
    client = sim.client(api, system_prompt="You answer the phone for Luigi's.")
    try:
        async with client.stream([ChatMessage("user", "hi")], instructions="Be Mario.") as stream:
            _ = [delta async for delta in stream]
    finally:
        await client.aclose()
    sent = sim.stats.last_request
    assert sent is not None and sent.messages[0] == ("system", "Be Mario.")
    assert sent.tools == []


def test_history_messages_are_checked() -> None:
    call = ToolCall("call_1", "end_call", "{}")
    with pytest.raises(ValueError):
        ChatMessage("user", "hi", tool_calls=(call,))
    with pytest.raises(ValueError):
        ChatMessage("tool", "{}")
    with pytest.raises(ValueError):
        ChatMessage("assistant", "hi", tool_call_id="call_1")


def test_the_prompt_estimate_counts_tool_calls_instructions_and_tools() -> None:
    plain = [ChatMessage("user", "Where is order 4512?")]
    call = ToolCall("call_1", "get_order_status", json.dumps({"order_number": "4512" * 20}))
    called = [*plain, ChatMessage("assistant", "", tool_calls=(call,))]
    assert estimate_prompt_tokens(called) > estimate_prompt_tokens(plain) + 20
    assert estimate_prompt_tokens(plain, "x" * 400) > estimate_prompt_tokens(plain, "x") + 90
    assert estimate_prompt_tokens(plain, tools=TOOLS) > estimate_prompt_tokens(plain) + 40


# ---------------------------------------------------------------- an attempt, and the router


async def test_an_attempt_that_only_calls_a_tool_settles_at_the_first_fragment() -> None:
    # 10 tokens a second: the call's arguments take a second or more after its first fragment
    app = create_simulator_app(SimulatorSettings(profiles=quick_profiles(tokens_per_s=10)))
    async with running_simulator(app=app) as url:
        client = LLMClient(LLMSettings(api="chat"), base_url=url)
        plan = TurnPlan("fast", "priority", "none", 160, 10.0, 10.0, True, "")
        history = [ChatMessage("user", "Get me a human please")]
        stream = client.stream(history, service_tier="priority", effort="none", tools=TOOLS)
        tried = Attempt(plan, stream, "planned")
        tried.task = asyncio.create_task(tried.pump())
        try:
            async with asyncio.timeout(5):
                await tried.settled.wait()
            assert tried.error is None
            assert stream.first_tool_call_at is not None and stream.first_token_at is None
            assert not stream.finished  # the arguments are still coming
            assert tried.queue.empty()  # no text was said
        finally:
            tried.task.cancel()
            await asyncio.gather(tried.task, return_exceptions=True)
            await stream.aclose()
            await client.aclose()


@pytest.mark.parametrize("api", APIS)
async def test_a_request_that_only_calls_a_tool_wins_without_a_hedge(api: Api) -> None:
    # The router expects the fast tier's first token by ~1.2 s, then hedges to standard; the
    # tier sends the call's first fragment within a few ms, then its arguments at 4 tokens a
    # second (3 s or so): only that first fragment can beat the hedge. (With the hedge due at
    # ~200 ms, a loaded 2-core CI runner twice read the Responses stream's first events late.)
    fast = FAST.model_copy(update={"efforts": ("none",), "prior_ttft_ms": 1000})
    standard = STANDARD.model_copy(update={"prior_ttft_ms": 2500})
    slow_arguments = FAST_PROFILE.model_copy(update={"tokens_per_s": 4})
    stalled = STANDARD_PROFILE.model_copy(update={"ttft_ms": 6000})
    profiles = {"fast": slow_arguments, "standard": stalled}
    async with rig_for(
        tiers=[fast, standard], profiles=profiles, llm={"api": api}, hedge=True
    ) as rig:
        call = rig.router.for_call(
            Policy(budget_ms=TIGHT_MS), instructions="Be brief.", tools=TOOLS
        )
        reply = call.reply([ChatMessage("user", "I want to talk to an agent")], time.monotonic())
        plan = reply.plan
        assert (plan.tier, plan.effort) == ("fast", "none")
        assert plan.hedge is not None and plan.hedge.tier == "standard"
        assert plan.first_token_deadline_ms < 2500  # the hedge is due before the arguments end

        assert await speak(reply) == ""

        assert [(c.name, c.parsed()) for c in reply.tool_calls] == [
            ("transfer_to_human", {"reason": "I want to talk to an agent"})
        ]
        decision = reply.finish(TIMINGS)
        assert decision is not None and decision.taken == "planned"
        assert attempts(decision) == [attempt("fast", "none", "planned", "spoke")]
        assert rig.stats.requests == 1  # no hedge was sent
        sent = rig.stats.last_request
        assert sent is not None and sent.messages[0] == ("system", "Be brief.")
        assert [t.name for t in sent.tools] == [t.name for t in TOOLS]

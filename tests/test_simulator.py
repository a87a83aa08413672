"""The tier simulator, driven by the real `openai` SDK over real HTTP on 127.0.0.1."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, cast

import httpx
import openai
import pytest
import pytest_asyncio
from openai import AsyncOpenAI
from starlette.applications import Starlette

from voice.llm_sim.serving import running_simulator
from voice.llm_sim.simulator import (
    SimulatorSettings,
    SimulatorStats,
    TierProfile,
    create_simulator_app,
    simulator_settings,
    simulator_stats,
)
from voice.server import quiet_uvicorn

# Fast profiles keep the suite quick; the standard tier stays ~10x slower than the fast one.
FAST = TierProfile(ttft_ms=5, tokens_per_s=20_000, reported_as="priority")
STANDARD = TierProfile(ttft_ms=30, tokens_per_s=1_500, reported_as="default")
REASONING = {
    "none": 0, "minimal": 16, "low": 64, "medium": 256, "high": 1024, "xhigh": 2048, "max": 4096
}  # fmt: skip


def quick_settings(**changes: Any) -> SimulatorSettings:
    profiles = {"fast": FAST.model_copy(), "standard": STANDARD.model_copy()}
    return SimulatorSettings(profiles=profiles, seed=7, **changes)


@dataclass
class Sim:
    app: Starlette
    url: str
    client: AsyncOpenAI

    @property
    def stats(self) -> SimulatorStats:
        return simulator_stats(self.app)

    @property
    def settings(self) -> SimulatorSettings:
        return simulator_settings(self.app)


@pytest_asyncio.fixture
async def sim() -> AsyncIterator[Sim]:
    app = create_simulator_app(quick_settings())
    async with running_simulator(app=app) as url:
        client = AsyncOpenAI(base_url=url, api_key="sk-test", max_retries=0)
        try:
            yield Sim(app, url, client)
        finally:
            await client.close()


def user(text: str) -> list[Any]:
    return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]


async def reply_to(sim: Sim, words: str) -> str:
    reply = await sim.client.chat.completions.create(
        model="hotline-sim", messages=user(words), service_tier="priority"
    )
    return reply.choices[0].message.content or ""


async def test_replies_run_as_long_as_a_real_models_spoken_ones(sim: Sim) -> None:
    """40-60 words in 2-4 sentences by default (issue 26): the echo, the scripted answer, then
    sentences from the pool; the same words get the same reply."""
    asked = ["Book a table for two tonight", "hello", "Where is my order", "My number is 5 5 5"]
    for words in asked:
        text = await reply_to(sim, words)
        sentences = [x for x in re.split(r"(?<=[.?!])\s+", text) if x]
        assert text.startswith(f"You said: {words}. "), text
        assert 2 <= len(sentences) <= 4, sentences
        assert len(sentences) == 4 or 40 <= len(text.split()) <= 60, text
        assert await reply_to(sim, words) == text
    sim.settings.reply_sentences = (1, 3)  # the echo and a two-sentence answer are three
    longer = await reply_to(sim, "Hi there")
    sim.settings.replies = "short"
    assert longer == await reply_to(sim, "Hi there")  # nothing added past the maximum


async def test_short_replies_stop_after_the_scripted_answer(sim: Sim) -> None:
    sim.settings.replies = "short"
    text = await reply_to(sim, "Where is my order")
    answer = text.removeprefix("You said: Where is my order. ")
    assert answer in sim.settings.answers, text


async def test_chat_stream_echoes_words_tier_and_usage(sim: Sim) -> None:
    stream = await sim.client.chat.completions.create(
        model="hotline-sim",
        messages=user("Book a table for two tonight"),
        stream=True,
        stream_options={"include_usage": True},
        service_tier="priority",
        reasoning_effort="low",
    )
    chunks = [chunk async for chunk in stream]

    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.startswith("You said: Book a table for two tonight. ")
    assert len(text.split()) > 9  # the scripted answer follows
    assert chunks[0].choices[0].delta.role == "assistant"
    assert {c.service_tier for c in chunks} == {"priority"}
    assert len({c.id for c in chunks}) == 1
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    # word-sized deltas: every content delta after the first starts with a space
    contents = [c.choices[0].delta.content for c in chunks[1:] if c.choices]
    assert all(d is None or d.startswith(" ") for d in contents[1:])
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None
    assert all(c.usage is None for c in chunks[:-1])
    assert usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.reasoning_tokens == 64
    assert usage.completion_tokens == 64 + len(text.split())
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert sim.stats.streams_completed == 1 and sim.stats.streams_cancelled == 0


async def test_chat_stream_without_usage_option_has_no_usage_chunk(sim: Sim) -> None:
    stream = await sim.client.chat.completions.create(
        model="m", messages=user("hello"), stream=True
    )
    chunks = [chunk async for chunk in stream]
    assert all(c.choices and c.usage is None for c in chunks)


async def test_chat_non_streaming_equals_the_streamed_reply(sim: Sim) -> None:
    messages = user("What time do you open on Saturday?")
    reply = await sim.client.chat.completions.create(model="m", messages=messages)
    stream = await sim.client.chat.completions.create(model="m", messages=messages, stream=True)
    streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    assert reply.object == "chat.completion"
    assert reply.choices[0].message.content == streamed
    assert streamed.startswith("You said: What time do you open on Saturday. ")
    assert reply.choices[0].finish_reason == "stop"
    assert reply.service_tier == "default"  # no service_tier sent: the standard profile
    assert reply.usage is not None and reply.usage.completion_tokens == len(streamed.split())


@pytest.mark.parametrize(
    ("requested", "echoed"),
    [
        ("priority", "priority"),
        ("fast", "priority"),
        ("auto", "default"),
        ("default", "default"),
        ("flex", "default"),
        ("scale", "default"),
        (None, "default"),
    ],
)
async def test_chat_echoes_the_tier_actually_used(
    sim: Sim, requested: str | None, echoed: str
) -> None:
    reply = await sim.client.chat.completions.create(
        model="m", messages=user("hi"), service_tier=cast(Any, requested)
    )
    assert reply.service_tier == echoed
    assert sim.stats.last_request is not None
    assert sim.stats.last_request.service_tier == requested


@pytest.mark.parametrize("effort", list(REASONING))
async def test_usage_counts_reasoning_tokens_per_effort(sim: Sim, effort: str) -> None:
    chat = await sim.client.chat.completions.create(
        model="m", messages=user("hi"), reasoning_effort=cast(Any, effort), service_tier="fast"
    )
    response = await sim.client.responses.create(
        model="m", input="hi", reasoning={"effort": cast(Any, effort)}, service_tier="fast"
    )
    assert chat.usage is not None and chat.usage.completion_tokens_details is not None
    assert chat.usage.completion_tokens_details.reasoning_tokens == REASONING[effort]
    assert response.usage is not None
    assert response.usage.output_tokens_details.reasoning_tokens == REASONING[effort]
    assert response.reasoning is not None and response.reasoning.effort == effort


async def test_responses_stream_sends_the_full_event_sequence(sim: Sim) -> None:
    stream = await sim.client.responses.create(
        model="hotline-sim",
        instructions="Be brief.",
        input=[{"role": "user", "content": "Can I move my appointment?"}],
        stream=True,
        service_tier="ultrafast",
        reasoning={"effort": "minimal"},
    )
    events = [event async for event in stream]

    kinds = [e.type for e in events]
    n_deltas = kinds.count("response.output_text.delta")
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",  # reasoning item
        "response.output_item.done",
        "response.output_item.added",  # message item
        "response.content_part.added",
        *["response.output_text.delta"] * n_deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    text = "".join(deltas)
    assert text.startswith("You said: Can I move my appointment. ")
    done = events[-4]
    assert done.type == "response.output_text.done" and done.text == text
    message_ids = {e.item_id for e in events if e.type == "response.output_text.delta"}
    item = events[-2]
    assert item.type == "response.output_item.done" and item.item.type == "message"
    assert message_ids == {item.item.id} and item.output_index == 1
    final = events[-1]
    assert final.type == "response.completed"
    assert final.response.output_text == text and final.response.status == "completed"
    assert final.response.service_tier == "priority"
    assert final.response.usage is not None
    assert final.response.usage.output_tokens_details.reasoning_tokens == 16
    assert final.response.usage.output_tokens == 16 + len(deltas)


async def test_responses_stream_helper_accumulates_the_same_text(sim: Sim) -> None:
    """The SDK's own `responses.stream()` state machine accepts our event sequence."""
    async with sim.client.responses.stream(model="m", input="Where is my order") as stream:
        deltas = [e.delta async for e in stream if e.type == "response.output_text.delta"]
        final = await stream.get_final_response()
    assert final.output_text == "".join(deltas)
    assert final.output_text.startswith("You said: Where is my order. ")


async def test_responses_non_streaming_uses_the_last_user_message(sim: Sim) -> None:
    response = await sim.client.responses.create(
        model="m",
        instructions="Be brief.",
        input=[
            {"role": "user", "content": "first question"},
            {"role": "assistant", "content": "first answer"},
            {"role": "user", "content": [{"type": "input_text", "text": "second question"}]},
        ],
    )
    assert response.object == "response" and response.status == "completed"
    assert response.output_text.startswith("You said: second question. ")
    assert response.service_tier == "default"
    assert response.instructions == "Be brief."
    assert sim.stats.last_request is not None
    assert sim.stats.last_request.messages == [
        ("system", "Be brief."),
        ("user", "first question"),
        ("assistant", "first answer"),
        ("user", "second question"),
    ]


async def test_the_token_cap_truncates_and_counts_reasoning(sim: Sim) -> None:
    chat = await sim.client.chat.completions.create(
        model="m", messages=user("one two three"), reasoning_effort="low", max_completion_tokens=70
    )
    assert chat.choices[0].finish_reason == "length"
    content = chat.choices[0].message.content or ""
    assert content.startswith("You said: one two three. ") and len(content.split()) == 6
    response = await sim.client.responses.create(
        model="m", input="one two three", reasoning={"effort": "low"}, max_output_tokens=70
    )
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage is not None and response.usage.output_tokens == 70


async def test_legacy_max_tokens_is_honoured(sim: Sim) -> None:
    reply = await sim.client.chat.completions.create(model="m", messages=user("hi"), max_tokens=3)
    assert reply.choices[0].message.content == "You said: hi."


async def test_bad_requests_get_openai_shaped_400s(sim: Sim) -> None:
    async with httpx.AsyncClient(base_url=sim.url) as http:
        bad_json = await http.post("/chat/completions", content=b"{not json")
        no_messages = await http.post("/chat/completions", json={"model": "m"})
        no_input = await http.post("/responses", json={"model": "m", "stream": True})
        bad_role = await http.post(
            "/chat/completions", json={"model": "m", "messages": [{"role": "robot"}]}
        )
    for reply in (bad_json, no_messages, no_input, bad_role):
        assert reply.status_code == 400
        error = reply.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["type"] == "invalid_request_error"
    assert bad_json.json()["error"]["param"] is None
    assert no_messages.json()["error"]["param"] == "messages"
    assert no_messages.json()["error"]["code"] == "missing_required_parameter"
    assert no_input.json()["error"]["param"] == "input"
    assert bad_role.json()["error"]["param"] == "messages[0].role"

    with pytest.raises(openai.BadRequestError) as raised:
        await sim.client.responses.create(model="m", input="hi", max_output_tokens=0)
    assert raised.value.param == "max_output_tokens"

    with pytest.raises(openai.BadRequestError) as raised:
        await sim.client.chat.completions.create(
            model="m", messages=user("hi"), reasoning_effort=cast(Any, "turbo")
        )
    assert raised.value.param == "reasoning_effort" and raised.value.code == "invalid_value"
    with pytest.raises(openai.BadRequestError) as raised:
        await sim.client.responses.create(model="m", input="hi", service_tier=cast(Any, "gold"))
    assert raised.value.param == "service_tier"
    assert sim.stats.requests == 0  # none of these reached generation


async def test_failure_injection_returns_the_configured_status(sim: Sim) -> None:
    sim.settings.profiles["fast"].fail_status = 429
    sim.settings.profiles["fast"].fail_times = 1
    sim.settings.profiles["standard"].fail_status = 503

    with pytest.raises(openai.RateLimitError) as rate_limited:
        await sim.client.chat.completions.create(
            model="m", messages=user("hi"), service_tier="priority"
        )
    assert rate_limited.value.status_code == 429
    assert rate_limited.value.code == "rate_limit_exceeded"
    # fail_times=1: the fast tier has recovered
    recovered = await sim.client.chat.completions.create(
        model="m", messages=user("hi"), service_tier="priority"
    )
    assert recovered.service_tier == "priority"

    with pytest.raises(openai.InternalServerError) as overloaded:
        await sim.client.responses.create(model="m", input="hi", stream=True)
    assert overloaded.value.status_code == 503
    assert sim.stats.errors_injected == 2


async def test_failure_probability_zero_never_fails(sim: Sim) -> None:
    sim.settings.profiles["standard"].fail_status = 500
    sim.settings.profiles["standard"].fail_probability = 0.0
    reply = await sim.client.chat.completions.create(model="m", messages=user("hi"))
    assert reply.choices[0].message.content
    assert sim.stats.errors_injected == 0


async def _time_to_first_text(client: AsyncOpenAI, tier: str, effort: str) -> float:
    start = time.monotonic()
    stream = await client.chat.completions.create(
        model="m",
        messages=user("hi"),
        stream=True,
        service_tier=cast(Any, tier),
        reasoning_effort=cast(Any, effort),
    )
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            await stream.close()
            return time.monotonic() - start
    raise AssertionError("no visible text")


async def test_standard_tier_with_high_effort_is_slower_than_fast_tier(sim: Sim) -> None:
    fast = await _time_to_first_text(sim.client, "priority", "high")
    standard = await _time_to_first_text(sim.client, "default", "high")
    # Pacing is by the absolute clock, so the standard tier cannot be early:
    floor = STANDARD.ttft_ms / 1000 + REASONING["high"] / STANDARD.tokens_per_s
    print(f"\nfirst visible token, effort=high: fast {fast * 1000:.0f} ms, "
          f"standard {standard * 1000:.0f} ms (scheduled >= {floor * 1000:.0f} ms)")  # fmt: skip
    assert standard >= floor
    assert standard > fast


async def test_closing_a_stream_stops_generation(sim: Sim) -> None:
    sim.settings.profiles["standard"].tokens_per_s = 40  # a reply of ~2 s
    stream = await sim.client.chat.completions.create(model="m", messages=user("hi"), stream=True)
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            break
    await stream.close()
    await sim.stats.wait_until(lambda s: s.streams_cancelled == 1)
    assert sim.stats.streams_completed == 0


async def test_reasoning_can_stream_in_a_cerebras_style_field(sim: Sim) -> None:
    sim.settings.stream_reasoning_as = "reasoning"
    stream = await sim.client.chat.completions.create(
        model="m", messages=user("hi"), stream=True, reasoning_effort="minimal"
    )
    chunks = [c async for c in stream if c.choices]
    reasoning = [(c.choices[0].delta.model_extra or {}).get("reasoning") for c in chunks]
    assert sum(r is not None for r in reasoning) == 16
    first_reasoning = next(i for i, r in enumerate(reasoning) if r)
    first_text = next(i for i, c in enumerate(chunks) if c.choices[0].delta.content)
    assert first_reasoning < first_text


async def test_models_lists_the_simulated_model(sim: Sim) -> None:
    page = await sim.client.models.list()
    assert [m.id for m in page.data] == ["hotline-sim"]


async def test_running_simulator_yields_a_loopback_url_and_stops(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The embedded simulator's uvicorn loop does not poll ten times a second: with its tick an
    hour long, leaving the context still stops it at once."""
    monkeypatch.setattr(quiet_uvicorn, "MAIN_LOOP_TICK_S", 3600.0)
    async with asyncio.timeout(30), running_simulator(quick_settings()) as url:
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        async with httpx.AsyncClient() as http:
            assert (await http.get(f"{url}/models")).status_code == 200
    async with httpx.AsyncClient() as http:
        with pytest.raises(httpx.ConnectError):
            await http.get(f"{url}/models")


def test_settings_reject_unknown_profiles() -> None:
    with pytest.raises(ValueError, match="unknown tier profile"):
        SimulatorSettings(service_tiers={"priority": "turbo"})

"""LLMClient against the running tier simulator, over real HTTP, for both OpenAI APIs."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal

import pytest
import pytest_asyncio
from openai import AsyncOpenAI
from starlette.applications import Starlette

from pipeline.llm.client import ChatMessage, LLMClient
from pipeline.llm.errors import LLMError
from pipeline.llm.settings import DEFAULT_SYSTEM_PROMPT, LLMSettings
from voice.llm_sim.serving import running_simulator
from voice.llm_sim.simulator import (
    SimulatorSettings,
    SimulatorStats,
    TierProfile,
    create_simulator_app,
    simulator_settings,
    simulator_stats,
)

Api = Literal["chat", "responses"]
APIS: list[Api] = ["chat", "responses"]

HISTORY = [
    ChatMessage("user", "Hi, I would like to book a table."),
    ChatMessage("assistant", "Sure. For how many people?"),
    ChatMessage("user", "Four people at eight tonight"),
]


@dataclass
class Sim:
    app: Starlette
    url: str

    @property
    def stats(self) -> SimulatorStats:
        return simulator_stats(self.app)

    @property
    def settings(self) -> SimulatorSettings:
        return simulator_settings(self.app)

    def client(self, api: Api, **changes: Any) -> LLMClient:
        return LLMClient(LLMSettings(api=api, **changes), base_url=self.url)


@pytest_asyncio.fixture
async def sim() -> AsyncIterator[Sim]:
    profiles = {
        "fast": TierProfile(ttft_ms=5, tokens_per_s=20_000, reported_as="priority"),
        "standard": TierProfile(ttft_ms=20, tokens_per_s=2_000, reported_as="default"),
    }
    app = create_simulator_app(SimulatorSettings(profiles=profiles, seed=3))
    async with running_simulator(app=app) as url:
        yield Sim(app, url)


async def non_streamed_reply(sim: Sim, api: Api, history: list[ChatMessage]) -> str:
    """The same request made directly with the SDK, without streaming."""
    client = AsyncOpenAI(base_url=sim.url, api_key="sk-test", max_retries=0)
    try:
        turns: list[Any] = [{"role": m.role, "content": m.content} for m in history]
        if api == "chat":
            system: Any = {"role": "system", "content": DEFAULT_SYSTEM_PROMPT}
            chat = await client.chat.completions.create(
                model="hotline-sim",
                messages=[system, *turns],
                service_tier="priority",
                reasoning_effort="low",
                max_completion_tokens=160,
            )
            return chat.choices[0].message.content or ""
        response = await client.responses.create(
            model="hotline-sim",
            instructions=DEFAULT_SYSTEM_PROMPT,
            input=turns,
            service_tier="priority",
            reasoning={"effort": "low"},
            max_output_tokens=160,
        )
        return response.output_text
    finally:
        await client.close()


async def collect(client: LLMClient, **options: Any) -> tuple[str, Any]:
    async with client.stream(HISTORY, **options) as stream:
        text = "".join([delta async for delta in stream])
    return text, stream


@pytest.mark.parametrize("api", APIS)
async def test_streamed_text_equals_the_non_streamed_reply(sim: Sim, api: Api) -> None:
    client = sim.client(api)
    try:
        text, stream = await collect(client)
    finally:
        await client.aclose()
    assert text == await non_streamed_reply(sim, api, HISTORY)
    assert text == stream.text
    assert text.startswith("You said: Four people at eight tonight. ")


@pytest.mark.parametrize("api", APIS)
async def test_system_prompt_and_history_are_sent(sim: Sim, api: Api) -> None:
    client = sim.client(api, system_prompt="You answer the phone for Luigi's.")
    try:
        await collect(client)
    finally:
        await client.aclose()
    request = sim.stats.last_request
    assert request is not None and request.api == api and request.stream
    assert request.messages == [
        ("system", "You answer the phone for Luigi's."),
        *[(m.role, m.content) for m in HISTORY],
    ]
    assert (request.service_tier, request.effort, request.max_tokens) == ("priority", "low", 160)


@pytest.mark.parametrize("api", APIS)
async def test_stream_attributes_fill_in(sim: Sim, api: Api) -> None:
    client = sim.client(api)
    try:
        async with client.stream(HISTORY) as stream:
            assert stream.first_token_at is None and not stream.finished
            first = await anext(stream)
            assert first == "You"
            assert stream.first_token_at is not None
            rest = [delta async for delta in stream]
    finally:
        await client.aclose()
    print(
        f"\n{api}: first token after {(stream.first_token_at - stream.requested_at) * 1e3:.1f} ms"
    )
    assert stream.first_token_at >= stream.requested_at
    assert stream.finished and stream.finish_reason == "stop"
    assert stream.service_tier_served == "priority"
    assert stream.reasoning_tokens == 64  # effort "low"
    assert stream.output_tokens == 64 + 1 + len(rest)


@pytest.mark.parametrize("api", APIS)
async def test_none_sends_no_tier_and_no_reasoning_field(sim: Sim, api: Api) -> None:
    client = sim.client(api)
    try:
        _, stream = await collect(client, service_tier=None, effort=None)
    finally:
        await client.aclose()
    request = sim.stats.last_request
    assert request is not None
    assert request.service_tier is None and request.effort is None
    assert stream.service_tier_served == "default"  # the provider's default tier
    assert stream.reasoning_tokens == 0  # the simulator's default effort is "none"


@pytest.mark.parametrize("api", APIS)
async def test_per_call_tier_effort_and_cap_override_settings(sim: Sim, api: Api) -> None:
    client = sim.client(api)
    try:
        text, stream = await collect(
            client, service_tier="default", effort="minimal", max_output_tokens=20
        )
    finally:
        await client.aclose()
    assert (stream.service_tier_requested, stream.service_tier_served) == ("default", "default")
    assert stream.reasoning_tokens == 16
    assert stream.output_tokens == 20
    assert len(text.split()) == 4 and stream.finish_reason == "length"


async def test_reasoning_streamed_in_delta_reasoning_is_not_spoken(sim: Sim) -> None:
    sim.settings.stream_reasoning_as = "reasoning"  # as Cerebras does
    client = sim.client("chat")
    try:
        text, stream = await collect(client)
    finally:
        await client.aclose()
    assert text == await non_streamed_reply(sim, "chat", HISTORY)
    assert stream.reasoning_tokens == 64


async def slow_stream_settings(sim: Sim) -> None:
    sim.settings.profiles["fast"].tokens_per_s = 30  # a reply takes ~1 s: time to cancel it
    sim.settings.reasoning_tokens["low"] = 0


@pytest.mark.parametrize("api", APIS)
async def test_aclose_mid_stream_closes_the_http_stream(sim: Sim, api: Api) -> None:
    await slow_stream_settings(sim)
    client = sim.client(api)
    try:
        stream = client.stream(HISTORY)
        assert await anext(stream) == "You"
        await stream.aclose()
        await sim.stats.wait_until(lambda s: s.streams_cancelled == 1)
    finally:
        await client.aclose()
    assert sim.stats.streams_completed == 0
    assert not stream.finished
    with pytest.raises(StopAsyncIteration):
        await anext(stream)


@pytest.mark.parametrize("api", APIS)
async def test_cancelling_the_consuming_task_closes_the_http_stream(sim: Sim, api: Api) -> None:
    await slow_stream_settings(sim)
    client = sim.client(api)
    first_delta = asyncio.Event()
    heard: list[str] = []

    async def speak() -> None:
        async for delta in client.stream(HISTORY):  # no async with: cancellation alone must do
            heard.append(delta)
            first_delta.set()

    task = asyncio.create_task(speak())
    try:
        async with asyncio.timeout(5):
            await first_delta.wait()
        task.cancel()  # barge-in
        with pytest.raises(asyncio.CancelledError):
            await task
        await sim.stats.wait_until(lambda s: s.streams_cancelled == 1)
    finally:
        await client.aclose()
    assert sim.stats.streams_completed == 0
    assert 1 <= len(heard) < 20


async def test_leaving_async_with_early_closes_the_http_stream(sim: Sim) -> None:
    await slow_stream_settings(sim)
    client = sim.client("chat")
    try:
        async with client.stream(HISTORY) as stream:
            async for _ in stream:
                break
        await sim.stats.wait_until(lambda s: s.streams_cancelled == 1)
    finally:
        await client.aclose()


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("status", [429, 503])
async def test_provider_errors_raise_llm_error(sim: Sim, api: Api, status: int) -> None:
    sim.settings.profiles["fast"].fail_status = status
    client = sim.client(api)
    try:
        with pytest.raises(LLMError) as raised:
            await collect(client)
    finally:
        await client.aclose()
    assert raised.value.status == status
    assert "simulated 'fast' tier" in raised.value.message
    assert sim.stats.errors_injected == 1  # no SDK retries by default


async def test_unreachable_provider_raises_llm_error_without_status() -> None:
    with socket.socket() as probe:  # a loopback port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = LLMClient(LLMSettings(base_url=f"http://127.0.0.1:{port}/v1"))
    try:
        with pytest.raises(LLMError) as raised:
            await collect(client)
    finally:
        await client.aclose()
    assert raised.value.status is None


async def test_a_silent_provider_times_out_as_llm_error(sim: Sim) -> None:
    sim.settings.profiles["fast"].ttft_ms = 5_000
    client = sim.client("chat", timeout_s=0.2)
    try:
        with pytest.raises(LLMError) as raised:
            await collect(client)
        await sim.stats.wait_until(lambda s: s.streams_cancelled == 1)
    finally:
        await client.aclose()
    assert raised.value.status is None and "timed out" in raised.value.message


def test_a_base_url_is_required() -> None:
    with pytest.raises(ValueError, match="HOTLINE_LLM__BASE_URL"):
        LLMClient(LLMSettings())


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_the_sdk_resources_a_reply_needs_are_loaded_when_the_client_is_made(api: Api) -> None:
    """Not on the event loop during the first caller's first turn (a fresh interpreter: this
    process may have imported them already)."""
    module = {
        "chat": "openai.resources.chat.completions",
        "responses": "openai.resources.responses",
    }
    code = (
        "import sys\n"
        "from pipeline.llm.client import LLMClient\n"
        "from pipeline.llm.settings import LLMSettings\n"
        f"assert {module[api]!r} not in sys.modules\n"
        f"LLMClient(LLMSettings(api={api!r}), base_url='http://127.0.0.1:9/v1')\n"
        f"assert {module[api]!r} in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)

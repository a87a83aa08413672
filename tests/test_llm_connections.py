"""The connections to the LLM provider (`pipeline.llm.connections`): kept between a call's turns
and opened before the first one, against the tier simulator over real HTTP on 127.0.0.1 (the
server sees each request's client port: one port, one connection)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from starlette.applications import Starlette

from pipeline.llm.client import ChatMessage, LLMClient
from pipeline.llm.settings import LLMSettings
from voice.llm_sim import serving
from voice.llm_sim.serving import running_simulator
from voice.llm_sim.simulator import SimulatorSettings, TierProfile, create_simulator_app

HISTORY = [ChatMessage("user", "Four people at eight tonight")]
IDLE_S = 0.6  # between two turns' requests; the short keep-alive below is a third of it
KEY = "sk-connections-test-key"
Served = tuple[str, list[tuple[str, int]]]  # the base URL, and (path, client port) per request


class Peers:
    """Each HTTP request's path and client port, as the server saw them (an ASGI middleware)."""

    def __init__(self, app: Any, seen: list[tuple[str, int]]) -> None:
        self.app, self.seen = app, seen

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.seen.append((scope["path"], scope["client"][1]))
        await self.app(scope, receive, send)


@contextlib.asynccontextmanager
async def serve(app: Starlette) -> AsyncIterator[Served]:
    seen: list[tuple[str, int]] = []
    app.add_middleware(Peers, seen=seen)
    async with running_simulator(app=app) as url:
        yield url, seen


def ports(seen: list[tuple[str, int]]) -> set[int]:
    return {port for _path, port in seen}


def fast_simulator() -> Starlette:
    fast = TierProfile(ttft_ms=5, tokens_per_s=20_000, reported_as="priority")
    return create_simulator_app(SimulatorSettings(profiles={"fast": fast, "standard": fast}))


@pytest_asyncio.fixture
async def sim() -> AsyncIterator[Served]:
    async with serve(fast_simulator()) as served:
        yield served


async def reply(client: LLMClient) -> str:
    async with client.stream(HISTORY) as stream:
        return "".join([delta async for delta in stream])


async def two_turns(url: str, keepalive_s: float) -> None:
    """Two turns' requests from one client, `IDLE_S` apart."""
    client = LLMClient(LLMSettings(keepalive_s=keepalive_s), base_url=url)
    try:
        assert await reply(client)
        await asyncio.sleep(IDLE_S)  # the pause under test, not a synchronisation
        assert await reply(client)
    finally:
        await client.aclose()


@pytest.mark.parametrize(("keepalive_s", "connections"), [(IDLE_S / 3, 2), (60.0, 1)])
async def test_an_idle_connection_is_kept_for_keepalive_s(
    sim: Served, keepalive_s: float, connections: int
) -> None:
    """Two turns' requests with a pause between them ride one connection when the pause is
    shorter than `keepalive_s`, and two when it is longer (HTTPX2's own 5 s closed the
    connection between most turns of a call)."""
    url, seen = sim
    await two_turns(url, keepalive_s)
    assert len(seen) == 2 and len(ports(seen)) == connections, seen
    # Longer than HTTPX2's and uvicorn's 5 s, and the embedded simulator keeps it as long.
    assert serving.KEEP_ALIVE_S >= LLMSettings().keepalive_s > 5


async def test_the_simulator_keeps_an_idle_connection_keep_alive_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The embedded simulator closes an idle connection after its `KEEP_ALIVE_S` (uvicorn's own
    5 s closed it between a call's turns, whatever the client kept): shortened, the second turn
    needs a new connection though the client would have kept it."""
    monkeypatch.setattr(serving, "KEEP_ALIVE_S", IDLE_S / 3)
    async with serve(fast_simulator()) as (url, seen):
        await two_turns(url, keepalive_s=60.0)
    assert len(seen) == 2 and len(ports(seen)) == 2, seen


async def test_connect_opens_the_connection_the_first_turn_rides(
    sim: Served,
) -> None:
    url, seen = sim
    client = LLMClient(LLMSettings(), base_url=url)
    try:
        assert await client.connect()
        assert [path for path, _port in seen] == ["/v1/models"]
        assert await reply(client)
    finally:
        await client.aclose()
    assert [path for path, _port in seen] == ["/v1/models", "/v1/chat/completions"]
    assert len(ports(seen)) == 1, seen


async def test_connect_to_a_provider_without_models_keeps_the_connection() -> None:
    """A provider that answers `/models` with 404 is connected all the same."""
    async with serve(Starlette()) as (url, seen):
        client = LLMClient(LLMSettings(), base_url=url)
        try:
            assert await client.connect()
            assert await client.connect()
        finally:
            await client.aclose()
    assert [path for path, _port in seen] == ["/v1/models"] * 2
    assert len(ports(seen)) == 1, seen


async def test_connect_to_no_provider_is_logged_without_the_key(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = LLMClient(LLMSettings(api_key=KEY), base_url=f"http://127.0.0.1:{port}/v1")
    try:
        with caplog.at_level(logging.WARNING, logger="pipeline.llm.connections"):
            assert not await client.connect()
    finally:
        await client.aclose()
    assert "no connection opened ahead of the first call" in caplog.text
    assert f"127.0.0.1:{port}" in caplog.text and KEY not in caplog.text

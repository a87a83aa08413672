"""The command line's own options, and `serve`'s uvicorn loop."""

from __future__ import annotations

import asyncio
import importlib.metadata
import socket
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from typer.testing import CliRunner

from tests.support.poll import until
from voice.cli import main
from voice.cli.main import app
from voice.server import quiet_uvicorn


def test_version_prints_the_installed_version_and_starts_nothing() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"hotline {importlib.metadata.version('hotline')}"


def test_the_commands_are_still_listed_without_arguments() -> None:
    result = CliRunner().invoke(app, [])
    assert "serve" in result.output and "bench" in result.output


DEPLOY_AGENTS = Path(__file__).resolve().parent.parent / "deploy" / "agents"


def test_agents_check_accepts_the_shipped_examples_with_their_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ORDERS_TOKEN", "tok-123")
    monkeypatch.setenv("HOTLINE_AGENTS__SIGNING_SECRET", "a-signing-secret")
    result = CliRunner().invoke(app, ["agents", "check", str(DEPLOY_AGENTS)])
    assert result.exit_code == 0, result.output
    assert "2 agent files OK (order-status, receptionist)" in result.output


@pytest.mark.parametrize(
    ("environment", "named"),
    [
        ({"HOTLINE_AGENTS__SIGNING_SECRET": "s"}, "tools[0].headers.Authorization"),
        ({"ORDERS_TOKEN": "tok-123"}, "HOTLINE_AGENTS__SIGNING_SECRET"),
    ],
)
def test_agents_check_fails_as_serve_does_without_starting_it(
    monkeypatch: pytest.MonkeyPatch, environment: dict[str, str], named: str
) -> None:
    for name in ("ORDERS_TOKEN", "HOTLINE_AGENTS__SIGNING_SECRET"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    checked = CliRunner().invoke(app, ["agents", "check", str(DEPLOY_AGENTS)])
    monkeypatch.setenv("HOTLINE_AGENTS__DIR", str(DEPLOY_AGENTS))
    # stops before loading anything (else it could not listen on that host, and would fail)
    served = CliRunner().invoke(app, ["serve", "--host", "256.0.0.1", "--port", "1"])
    assert checked.exit_code == served.exit_code == 2
    assert named in checked.output and "the agents cannot start" in checked.output
    assert checked.output == served.output


async def test_the_server_loop_sleeps_until_asked_to_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    """`serve`'s uvicorn loop does not poll (uvicorn's ticks ten times a second, most of an idle
    server's wake-ups): with its tick an hour long it still answers with a Date header, and a
    request to exit (what a drain ends with) stops it at once, after one look at the clock."""
    monkeypatch.setattr(quiet_uvicorn, "MAIN_LOOP_TICK_S", 3600.0)
    web = FastAPI()
    web.get("/ping")(lambda: {"ok": True})
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = main.DrainingServer(
        uvicorn.Config(web, host="127.0.0.1", port=port, log_config=None), web
    )
    ticks: list[int] = []
    on_tick = server.on_tick

    async def counted(counter: int) -> bool:
        ticks.append(counter)
        return await on_tick(counter)

    monkeypatch.setattr(server, "on_tick", counted)
    serving = asyncio.create_task(server.serve())
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
        await until(lambda: server.started or None, "the server listening")
        answer = await http.get("/ping")
    assert answer.json() == {"ok": True} and "date" in answer.headers
    web.state.request_exit()
    await asyncio.wait_for(serving, 30)
    assert ticks == [0, 10], ticks

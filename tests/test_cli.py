"""The command line's own options."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest
from typer.testing import CliRunner

from voice.cli.main import app


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

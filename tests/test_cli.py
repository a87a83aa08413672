"""The command line's own options."""

from __future__ import annotations

import importlib.metadata

from typer.testing import CliRunner

from voice.cli.main import app


def test_version_prints_the_installed_version_and_starts_nothing() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"hotline {importlib.metadata.version('hotline')}"


def test_the_commands_are_still_listed_without_arguments() -> None:
    result = CliRunner().invoke(app, [])
    assert "serve" in result.output and "bench" in result.output

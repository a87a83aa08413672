"""`hotline test DIR`: run the scenario files of DIR against their agents (voice/evals/)."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer
from rich.console import Console

from voice.cli.client import TokenOption
from voice.cli.logs import setup_logging

console = Console()

if TYPE_CHECKING:
    from voice.evals.runner import Attempt

# As voice.evals.scenario.Transport (not imported here: the CLI loads it only when run).
TransportName = Literal["twilio", "telnyx", "vonage", "sip", "webrtc"]


def agent_test_command(
    directory: Annotated[Path, typer.Argument(help="A directory of scenario files (or one file)")],
    agents: Annotated[
        Path | None,
        typer.Option(help="The agent files' directory [default: the one above DIR]"),
    ] = None,
    url: Annotated[
        str | None,
        typer.Option(
            "--url", "--server", help="Call this running server [default: start one for the run]"
        ),
    ] = None,
    token: TokenOption = None,
    transport: Annotated[
        TransportName | None,
        typer.Option(help="Place every call over this transport [default: each scenario's own]"),
    ] = None,
    sip_port: Annotated[
        int, typer.Option(help="The --url server's SIP port (for SIP scenarios)")
    ] = 5060,
    parallel: Annotated[int, typer.Option(min=1, max=32, help="Calls at once")] = 1,
    repeat: Annotated[
        int, typer.Option(min=1, max=20, help="Call each scenario N times; report flaky checks")
    ] = 1,
    junit: Annotated[Path | None, typer.Option(help="Write JUnit XML here")] = None,
    auth_token: Annotated[
        str | None,
        typer.Option(
            help="Twilio auth token to sign the webhook with",
            envvar="HOTLINE_TELEPHONY__TWILIO_AUTH_TOKEN",
            show_envvar=False,
        ),
    ] = None,
    log_level: Annotated[str, typer.Option()] = "warning",
) -> None:
    """Call each agent as its scenarios say and check what it does: tools, transfers, hang-ups,
    what the caller heard. Exits 1 when an expectation fails, 2 when a file is wrong."""
    from voice.evals.report import failed, print_table, rows, write_junit

    setup_logging(log_level)
    server = _Server(url, token, auth_token, sip_port)
    table = rows(_run(directory, agents, server, transport, parallel, repeat))
    print_table(table, console)
    if junit is not None:
        write_junit(table, junit)
    if failed(table):
        raise typer.Exit(1)


@dataclass(frozen=True)
class _Server:
    """The server given (`url` None: start one for the run) and how to reach it."""

    url: str | None
    token: str | None
    auth_token: str | None
    sip_port: int


def _run(
    directory: Path,
    agents: Path | None,
    server: _Server,
    transport: TransportName | None,
    parallel: int,
    repeat: int,
) -> list[Attempt]:
    """Load the scenarios and agents, start a server unless given one, place every call."""
    from voice.agents.directory import AgentFileError
    from voice.evals.judge import judge_settings
    from voice.evals.runner import Target, prepare, run_suite, serve, workdir
    from voice.evals.scenario import ScenarioFileError, load_scenarios

    try:
        scenarios = load_scenarios(directory, transport)
    except ScenarioFileError as exc:
        typer.echo(f"hotline: the scenarios cannot run:\n{exc}", err=True)
        raise typer.Exit(2) from None
    agents_dir = agents or (directory if directory.is_dir() else directory.parent).parent
    url = server.url
    with workdir() as scratch:
        try:
            prepared = prepare(scenarios, agents_dir, Path(scratch), lookup_only=url is not None)
        except AgentFileError as exc:
            typer.echo(f"hotline: the agents cannot start:\n{exc}", err=True)
            raise typer.Exit(2) from None
        if url is not None and any(s.mocks for s in scenarios):
            console.print("note: mocks are not applied to a server given with --url")
        try:
            with contextlib.ExitStack() as stack:
                if url is None:
                    target = prepared.target(
                        stack.enter_context(serve(prepared, Path(scratch) / "server.log"))
                    )
                else:
                    target = Target(url, server.token, sip_port=server.sip_port)
                target.twilio_auth_token, target.judge = server.auth_token, judge_settings()
                attempts = asyncio.run(run_suite(scenarios, prepared, target, parallel, repeat))
        except RuntimeError as exc:
            typer.echo(f"hotline: {exc}", err=True)
            raise typer.Exit(2) from None
        finally:
            prepared.close()
    return attempts

"""`hotline test DIR`: run the scenario files of DIR against their agents (voice/evals/)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer
from rich.console import Console

from voice.cli.client import TokenOption
from voice.cli.logs import setup_logging

console = Console()

if TYPE_CHECKING:
    from voice.evals.lines import Target
    from voice.evals.prepared import Prepared
    from voice.evals.runner import Attempt
    from voice.evals.scenario import Scenario

# As voice.evals.scenario.Transport and SipTransport (not imported here: the CLI loads them
# only when run).
TransportName = Literal["twilio", "telnyx", "vonage", "sip", "webrtc"]
SipTransportName = Literal["udp", "tcp", "tls"]


@dataclass(frozen=True)
class _Server:
    """The server given (`url` None: start one for the run) and how to reach it."""

    url: str | None
    token: str | None
    auth_token: str | None
    sip_port: int
    sip_tls_port: int
    sip_ca: Path | None
    isolated: bool  # the run's own server in a child process, not in this one


_AgentsOption = Annotated[
    Path | None, typer.Option(help="The agent files' directory (default: the one above DIR)")
]
_UrlOption = Annotated[
    str | None,
    typer.Option(
        "--url", "--server", help="Call this running server (default: serve the agents here)"
    ),
]
_TransportOption = Annotated[
    TransportName | None,
    typer.Option(help="Place every call over this transport (default: each scenario's own)"),
]
_SipTransportOption = Annotated[
    SipTransportName | None,
    typer.Option(help="Place every SIP call over this (default: each scenario's own)"),
]
_SipPortOption = Annotated[
    int, typer.Option(help="The --url server's SIP port, UDP and TCP (for SIP scenarios)")
]
_SipTlsPortOption = Annotated[int, typer.Option(help="The --url server's SIP-TLS port")]
_SipCaOption = Annotated[
    Path | None, typer.Option(help="CA file to check the --url server's SIP-TLS certificate with")
]
_RepeatOption = Annotated[
    int, typer.Option(min=1, max=20, help="Call each scenario N times; report flaky checks")
]
_IsolatedOption = Annotated[
    bool, typer.Option(help="Serve the agents in a `hotline serve` child process, not here")
]
_TwilioAuthOption = Annotated[
    str | None,
    typer.Option(
        help="Twilio auth token to sign the webhook with",
        envvar="HOTLINE_TELEPHONY__TWILIO_AUTH_TOKEN",
        show_envvar=False,
    ),
]


def agent_test_command(
    directory: Annotated[Path, typer.Argument(help="A directory of scenario files (or one file)")],
    agents: _AgentsOption = None,
    url: _UrlOption = None,
    token: TokenOption = None,
    transport: _TransportOption = None,
    sip_transport: _SipTransportOption = None,
    sip_port: _SipPortOption = 5060,
    sip_tls_port: _SipTlsPortOption = 5061,
    sip_ca: _SipCaOption = None,
    parallel: Annotated[int, typer.Option(min=1, max=32, help="Calls at once")] = 1,
    repeat: _RepeatOption = 1,
    junit: Annotated[Path | None, typer.Option(help="Write JUnit XML here")] = None,
    isolated: _IsolatedOption = False,
    auth_token: _TwilioAuthOption = None,
    log_level: Annotated[str, typer.Option()] = "warning",
) -> None:
    """Call each agent as its scenarios say and check what it does: tools, transfers, hang-ups,
    what the caller heard. Exits 1 when an expectation fails, 2 when a file is wrong."""
    from voice.evals.report import failed, print_table, rows, write_junit
    from voice.evals.scenario import ScenarioFileError, load_scenarios

    setup_logging(log_level)
    try:
        scenarios = load_scenarios(directory, transport, sip_transport)
    except ScenarioFileError as exc:
        typer.echo(f"hotline: the scenarios cannot run:\n{exc}", err=True)
        raise typer.Exit(2) from None
    server = _Server(url, token, auth_token, sip_port, sip_tls_port, sip_ca, isolated)
    agents_dir = agents or (directory if directory.is_dir() else directory.parent).parent
    table = rows(_run(scenarios, agents_dir, server, parallel, repeat))
    print_table(table, console)
    if junit is not None:
        write_junit(table, junit)
    if failed(table):
        raise typer.Exit(1)


def _run(
    scenarios: list[Scenario], agents_dir: Path, server: _Server, parallel: int, repeat: int
) -> list[Attempt]:
    """Load the agents, start a server unless given one, place every call."""
    from voice.agents.directory import AgentFileError
    from voice.evals.own_server import serve_child
    from voice.evals.prepared import prepare, workdir

    with workdir() as scratch:
        try:
            prepared = prepare(scenarios, agents_dir, Path(scratch), server.url is not None)
        except AgentFileError as exc:
            typer.echo(f"hotline: the agents cannot start:\n{exc}", err=True)
            raise typer.Exit(2) from None
        try:
            with contextlib.ExitStack() as stack:
                target = _given(server)
                if target is None and server.isolated:
                    log = Path(scratch) / "server.log"
                    target = stack.enter_context(serve_child(prepared, log))
                run = _suite(scenarios, prepared, target, server, parallel, repeat)
                return asyncio.run(run)
        except (RuntimeError, OSError, ssl.SSLError) as exc:
            typer.echo(f"hotline: {exc}", err=True)
            raise typer.Exit(2) from None
        finally:
            prepared.close()


def _given(server: _Server) -> Target | None:
    """The server given with --url, as the calls reach it (None: the run starts its own)."""
    from voice.evals.lines import Target

    if server.url is None:
        return None
    target = Target(server.url, server.token, sip_port=server.sip_port)
    target.sip_tls_port = server.sip_tls_port
    if server.sip_ca is not None:
        target.sip_tls = ssl.create_default_context(cafile=str(server.sip_ca))
    return target


async def _suite(
    scenarios: list[Scenario],
    prepared: Prepared,
    target: Target | None,
    server: _Server,
    parallel: int,
    repeat: int,
) -> list[Attempt]:
    """Every call, against `target`, or (None) the run's own server in this process."""
    from voice.evals.judge import judge_settings
    from voice.evals.own_server import serve_here
    from voice.evals.runner import run_suite

    async with contextlib.AsyncExitStack() as stack:
        if target is None:
            target = await stack.enter_async_context(serve_here(prepared))
        target.twilio_auth_token, target.judge = server.auth_token, judge_settings()
        return await run_suite(scenarios, prepared, target, parallel, repeat)

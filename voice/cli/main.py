"""`hotline serve | call | llm-sim | bench | soak | wer | experiments`."""

from __future__ import annotations

import asyncio
import importlib.metadata
import logging
import signal
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Literal

import typer
import uvicorn
from fastapi import FastAPI
from rich.console import Console

from voice.cli.agent_tests import agent_test_command
from voice.cli.amd_bench import amd_bench_command
from voice.cli.call import call_command
from voice.cli.campaign import campaign_app
from voice.cli.dial import dial_command
from voice.cli.experiments import experiments_app
from voice.cli.logs import setup_logging
from voice.cli.models import fetch_models_command
from voice.cli.turn_bench import turn_bench_command
from voice.devtools.bench_command import bench_command
from voice.devtools.soak import soak_command
from voice.server.quiet_uvicorn import QuietServer

if TYPE_CHECKING:
    from voice.agents.directory import AgentDirectory
    from voice.server.settings import Settings

app = typer.Typer(
    help="Hotline: self-hosted real-time voice AI telephony server.", no_args_is_help=True
)
console = Console()


def _print_version(asked: bool) -> None:
    if asked:
        console.print(f"hotline {importlib.metadata.version('hotline')}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version and exit"
        ),
    ] = False,
) -> None:
    """Hotline: self-hosted real-time voice AI telephony server."""


class DrainingServer(QuietServer):
    """uvicorn (ticking once a second, `QuietServer`), except that SIGTERM drains first: no new
    calls, calls in progress finish (up to the drain timeout), then the server stops and the
    process exits 0. A second SIGTERM, or SIGINT, stops at once (calls are hung up)."""

    def __init__(self, config: uvicorn.Config, app: FastAPI) -> None:
        super().__init__(config)
        self.app = app
        self._draining = False
        app.state.request_exit = self.stop

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        ready = self._loop is not None and hasattr(self.app.state, "switchboard")
        if sig == signal.SIGTERM and not self._draining and ready:
            self._draining = True
            logging.getLogger(__name__).info("SIGTERM: draining before exit")
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._start_drain)
            return
        super().handle_exit(sig, frame)

    def _start_drain(self) -> None:
        from voice.server.routes.ops import drain_then_exit

        self.app.state.drain_task = asyncio.create_task(drain_then_exit(self.app))


@app.command()
def serve(
    host: Annotated[
        str | None, typer.Option(help="Address to listen on [default: 127.0.0.1]")
    ] = None,
    port: Annotated[int | None, typer.Option(help="Port to listen on [default: 8080]")] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning")] = "info",
) -> None:
    """Run the server: softphone page at /, WebRTC offers at /offer."""
    from voice.server.app import create_app
    from voice.server.ffmpeg import single_threaded_ffmpeg
    from voice.server.malloc import limit_arenas
    from voice.server.settings import Settings

    limit_arenas()  # before any thread starts
    single_threaded_ffmpeg()  # no idle FFmpeg thread pool per call's audio
    setup_logging(log_level)
    overrides: dict[str, object] = {}
    if host is not None:
        overrides["host"] = host
    if port is not None:
        overrides["port"] = port
    settings = Settings(**overrides)  # type: ignore[arg-type]
    _check_agents(settings)
    server_app = create_app(settings)
    config = uvicorn.Config(
        server_app,
        host=settings.host,
        port=settings.port,
        # uvicorn's loggers (its access log too) reach setup_logging's one handler, whose
        # formatter redacts secrets (`?token=`) from every line.
        log_config=None,
        access_log=True,
        ws_max_size=64 * 1024,
    )
    DrainingServer(config, server_app).run()


def _check_agents(settings: Settings) -> AgentDirectory:
    """Bad agent files stop `serve` at once, with every problem named (file and field)."""
    from voice.agents.directory import AgentFileError
    from voice.agents.runtime import AgentSetupError, check_agents
    from voice.server.app import agent_directory

    try:
        secret = settings.agents.signing_secret
        agents = agent_directory(settings)
        check_agents(agents, secret.get_secret_value().encode() if secret is not None else None)
    except (AgentFileError, AgentSetupError) as exc:
        typer.echo(f"hotline: the agents cannot start:\n{exc}", err=True)
        raise typer.Exit(2) from None
    return agents


agents_app = typer.Typer(help="Agent files.", no_args_is_help=True)
app.add_typer(agents_app, name="agents")


@agents_app.command("check")
def check_agents_command(
    directory: Annotated[
        Path, typer.Argument(help="A directory of agent files (as HOTLINE_AGENTS__DIR)")
    ],
) -> None:
    """Check agent files without starting the server: the checks and messages of `serve`
    (the rest of the settings, e.g. HOTLINE_AGENTS__SIGNING_SECRET, from the environment).
    Exits 2 when an agent cannot start."""
    from voice.server.settings import Settings

    settings = Settings()
    settings.agents = settings.agents.model_copy(update={"dir": str(directory)})
    agents = _check_agents(settings)
    numbers = sum(len(agent.numbers) for agent in agents.agents.values())
    typer.echo(
        f"{len(agents.names)} agent files OK ({', '.join(agents.names) or 'none'}), "
        f"{numbers} numbers; default agent: {agents.default.name}"
    )


@app.command("llm-sim")
def llm_sim(
    port: Annotated[int, typer.Option(help="Port to listen on")] = 8090,
    host: Annotated[str, typer.Option(help="Address to listen on")] = "127.0.0.1",
    log_level: Annotated[str, typer.Option()] = "info",
) -> None:
    """Run the OpenAI-compatible tier simulator on its own (replies are simulated)."""
    from voice.llm_sim.serving import serve_simulator

    setup_logging(log_level)
    serve_simulator(host, port)


app.command("call")(call_command)
app.command("dial")(dial_command)
app.command("bench")(bench_command)
app.command("fetch-models")(fetch_models_command)
app.command("soak")(soak_command)
app.command("turn-bench")(turn_bench_command)
app.command("amd-bench")(amd_bench_command)
app.command("test")(agent_test_command)
app.add_typer(experiments_app, name="experiments")
app.add_typer(campaign_app, name="campaign")


@app.command()
def wer(
    model: Annotated[
        list[str] | None, typer.Option(help="Whisper model to measure; repeat [default: both]")
    ] = None,
    verbose: Annotated[bool, typer.Option(help="Print every transcript")] = False,
    window: Annotated[
        Literal["fit", "full"] | None,
        typer.Option(help="Encoder window [default: each model's own, as the server's]"),
    ] = None,
) -> None:
    """Word error rate of the STT models on clean and telephone (8 kHz μ-law) speech."""
    from voice.devtools.wer_study import print_study

    print_study(tuple(model or ("tiny.en", "base")), verbose=verbose, window=window)


@app.command("endpoint-study")
def endpoint_study(
    verbose: Annotated[bool, typer.Option(help="Print every split")] = False,
) -> None:
    """How often single caller turns are split in two, by end-of-turn setting (200 turns)."""
    from voice.devtools.endpoint_study import print_study

    print_study(verbose=verbose)

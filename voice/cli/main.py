"""`hotline serve | call | llm-sim | bench | soak | wer | experiments`."""

from __future__ import annotations

import asyncio
import importlib.metadata
import logging
import signal
import socket
import statistics
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer
import uvicorn
from fastapi import FastAPI
from rich.console import Console
from rich.table import Table

from voice.cli.client import DEFAULT_URL, TokenOption, UrlOption, auth_headers, one_line_errors
from voice.cli.experiments import experiments_app
from voice.cli.logs import setup_logging
from voice.cli.models import fetch_models_command
from voice.cli.turn_bench import turn_bench_command
from voice.devtools.bench import bench_command
from voice.devtools.soak import soak_command

if TYPE_CHECKING:
    from pipeline.transport import PCM
    from voice.agents.directory import AgentDirectory
    from voice.devtools.turns import CallResult
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


class DrainingServer(uvicorn.Server):
    """uvicorn, except that SIGTERM drains first: no new calls, calls in progress finish (up
    to the drain timeout), then the server stops and the process exits 0. A second SIGTERM,
    or SIGINT, stops at once (calls are hung up)."""

    def __init__(self, config: uvicorn.Config, app: FastAPI) -> None:
        super().__init__(config)
        self.app = app
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining = False
        app.state.request_exit = self._stop

    def _stop(self) -> None:
        self.should_exit = True

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

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
    from voice.server.settings import Settings

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


@app.command()
def call(
    wav: Annotated[
        list[Path], typer.Option(help="WAV file the caller speaks; repeat for several turns")
    ],
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    twilio: Annotated[
        str | None,
        typer.Option(
            help="Call as Twilio would instead of over WebRTC: the server's base URL (the "
            "voice webhook is asked first) or its ws://…/twilio/stream URL"
        ),
    ] = None,
    dtmf: Annotated[str, typer.Option(help="Keys to press after the first reply (--twilio)")] = "",
    auth_token: Annotated[
        str | None, typer.Option(help="Twilio auth token to sign the webhook with (--twilio)")
    ] = None,
    out: Annotated[Path, typer.Option(help="Where to write the reply audio")] = Path("reply.wav"),
    repeat: Annotated[int, typer.Option(help="Place the call this many times")] = 1,
    log_level: Annotated[str, typer.Option()] = "warning",
) -> None:
    """Call a server over WebRTC (or as Twilio), play WAVs as the caller, time the replies.

    Voice-to-voice latency is measured at the caller: from the last audible frame of each
    utterance sent to the first audible reply frame received. The server's parts of it come
    from its turn records (milliseconds since the end of speech, as the server detected it).
    """
    from voice.audio import read_wav, write_wav
    from voice.server.urls import http_url

    setup_logging(log_level)
    utterances = [read_wav(path) for path in wav]
    if twilio is not None:  # the calls API lives on the server that took the Twilio call
        url = http_url(twilio).split("/twilio/")[0]
    measured: dict[int, dict[str, list[float]]] = {}
    for attempt in range(repeat):
        with one_line_errors(url):
            result, detail = _call_once(url, token, utterances, twilio, dtmf, auth_token)
        write_wav(out, result.reply_audio)
        console.print(f"[bold]call {result.call_id}[/] ({attempt + 1}/{repeat}), reply: {out}")
        _print_ending(result, detail)
        console.print(_turn_table(result, detail.get("records", []), measured))
    if repeat > 1 and measured:
        stages = list(next(iter(measured.values())))
        table = Table("turn", *(f"{stage} ms" for stage in stages), title=f"medians of {repeat}")
        for index, samples in sorted(measured.items()):
            table.add_row(
                str(index + 1),
                *(f"{statistics.median(samples.get(stage, [0.0])):.0f}" for stage in stages),
            )
        console.print(table)


def _call_once(
    url: str,
    token: str | None,
    utterances: list[PCM],
    twilio: str | None,
    dtmf: str,
    auth_token: str | None,
) -> tuple[CallResult, dict[str, Any]]:
    """One call (WebRTC, or as Twilio), then its record from the calls API (both with the API
    token). httpx.HTTPError when the server refuses either."""
    import httpx

    from voice.devtools.twilio_call import place_twilio_call
    from voice.devtools.webrtc_caller import place_call

    result: CallResult
    if twilio is None:
        result = asyncio.run(place_call(url, utterances, token=token))
    else:
        phone = asyncio.run(place_twilio_call(twilio, utterances, dtmf=dtmf, auth_token=auth_token))
        if phone.rejected is not None:
            typer.echo(f"hotline: call rejected: {phone.rejected}", err=True)
            raise typer.Exit(1)
        result = phone
    response = httpx.get(
        f"{url.rstrip('/')}/calls/{result.call_id}", headers=auth_headers(token), timeout=10
    )
    return result, response.raise_for_status().json()


def _print_ending(result: CallResult, detail: dict[str, Any]) -> None:
    """Where the call went (a transfer) and why it ended, as the caller and the server saw it."""
    from voice.devtools.phone_caller import PhoneCallResult

    if isinstance(result, PhoneCallResult) and result.transferred_to is not None:
        console.print(f"[bold]Twilio put the caller through to {result.transferred_to}[/]")
    elif isinstance(result, PhoneCallResult) and result.after_stream is not None:
        console.print(f"after the stream, Twilio was told: {result.after_stream}")
    for event in result.events:
        if event.get("type") == "transfer":
            console.print(f"[bold]put through to {event.get('to')}[/] ({event.get('reason')})")
    if detail.get("end_reason"):
        console.print(f"the call ended: {detail['end_reason']}")


def _turn_table(
    result: CallResult, records: list[dict[str, Any]], measured: dict[int, dict[str, list[float]]]
) -> Table:
    """One call's turns, as the caller heard them and as the server recorded them; their
    timings are added to `measured` (turn index -> part -> ms) for the medians."""
    table = Table(
        "turn", "caller said", "bot replied", "voice-to-voice ms", "server parts ms", "LLM"
    )
    for index, turn in enumerate(result.turns):
        record = records[index] if index < len(records) else {}
        parts: dict[str, float] = record.get("timings_ms", {})
        v2v = turn.voice_to_voice_ms
        if v2v is not None:
            samples = measured.setdefault(index, {})
            samples.setdefault("voice_to_voice", []).append(v2v)
            for stage, ms in parts.items():
                samples.setdefault(stage, []).append(ms)
        table.add_row(
            str(index + 1),
            str(record.get("caller_text", "")),
            str(record.get("reply_text", "")),
            "-" if v2v is None else f"{v2v:.0f}",
            " ".join(f"{k}={v:.0f}" for k, v in parts.items()),
            _decision(record.get("decision")),
        )
    return table


def _decision(decision: dict[str, Any] | None) -> str:
    """The controller's choice for a turn, in a few words."""
    if not decision:
        return ""
    taken = "" if decision.get("taken") == "planned" else f" ({decision.get('taken')})"
    return f"{decision.get('effort')} on {decision.get('tier')}{taken}"


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


app.command("bench")(bench_command)
app.command("fetch-models")(fetch_models_command)
app.command("soak")(soak_command)
app.command("turn-bench")(turn_bench_command)
app.add_typer(experiments_app, name="experiments")


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

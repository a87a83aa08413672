"""`hotline experiments simulate | report | start | stop`."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console

from voice.cli.client import TokenOption, UrlOption, auth_headers, explain

experiments_app = typer.Typer(
    help="Latency experiments: simulate arms offline, run them on live calls, report.",
    no_args_is_help=True,
)
console = Console(stderr=True)

ServerOption = UrlOption  # --url (or --server, its older name)


def _api(
    method: str, server: str, path: str, token: str | None, body: object = None
) -> httpx.Response:
    """One call to the experiments API; exits with the server's reason if it fails."""
    url = f"{server.rstrip('/')}{path}"
    try:
        response = httpx.request(method, url, json=body, headers=auth_headers(token), timeout=60)
        return response.raise_for_status()
    except httpx.HTTPError as exc:
        raise _fail(explain(exc, server)) from exc


def _fail(message: str) -> typer.Exit:
    console.print(f"[red]error:[/] {message}", markup=True, highlight=False, soft_wrap=True)
    return typer.Exit(2)


def _report(
    records: list[dict[str, Any]],
    name: str,
    plot: Path | None,
    csv: Path | None,
    reference: str | None,
    resamples: int,
) -> None:
    from voice.experiments.report import build_report, plot_report, render_report, write_csv

    try:
        report = build_report(records, name, reference=reference, resamples=resamples)
    except ValueError as exc:
        raise _fail(str(exc)) from exc
    typer.echo(render_report(report), nl=False)
    if csv is not None:
        rows = write_csv(records, name, csv)
        console.print(f"{rows} turns written to {csv}")
    if plot is not None:
        try:
            plot_report(records, report, plot)
        except RuntimeError as exc:
            raise _fail(str(exc)) from exc
        console.print(f"plot written to {plot}")


PlotOption = Annotated[
    Path | None, typer.Option(help="Draw latency CDFs and effort mix per arm (PNG)")
]
CsvOption = Annotated[Path | None, typer.Option(help="Export one row per turn (CSV)")]
ReferenceOption = Annotated[
    str | None, typer.Option(help="Arm the others are compared with [default: the first]")
]
ResamplesOption = Annotated[int, typer.Option(help="Bootstrap resamples of calls")]


@experiments_app.command()
def simulate(
    config: Annotated[Path, typer.Argument(help="Simulation file (YAML or JSON)")],
    out: Annotated[Path, typer.Option(help="Turn records (JSONL)")] = Path("experiment.jsonl"),
    plot: PlotOption = None,
    csv: CsvOption = None,
    reference: ReferenceOption = None,
    resamples: ResamplesOption = 2000,
    recording: Annotated[
        list[Path] | None,
        typer.Option(
            help="Replay this recorded call's caller (a stereo Ogg/Opus file, or a directory of "
            "them) instead of the scripted callers; repeatable",
            show_default=False,
        ),
    ] = None,
    log_level: Annotated[str, typer.Option()] = "warning",
) -> None:
    """Replay utterances through the real pipeline against the tier simulator, for every arm.

    Or replay recorded calls (--recording): each one's caller, split at their pauses, is a call.
    """
    from voice.cli.logs import setup_logging
    from voice.experiments.recorded import load_recorded_calls
    from voice.experiments.simulate import load_simulation, simulate

    setup_logging(log_level)
    try:
        sim = load_simulation(config)
        recorded = load_recorded_calls([*sim.recordings, *(recording or [])], sim.split)
    except ValueError as exc:  # RecordingError is one
        raise _fail(str(exc)) from exc
    arms = ", ".join(arm.name for arm in sim.experiment.arms)
    turns = sum(len(c.utterances) for c in recorded) or sim.calls * sim.turns_per_call
    callers = f" from {len(recorded)} recorded calls" if recorded else ""
    console.print(f"simulating {sim.experiment.name}: {turns} turns for each arm ({arms}){callers}")
    with out.open("w", encoding="utf-8") as sink:

        def write(record: dict[str, Any]) -> None:
            sink.write(json.dumps(record) + "\n")
            sink.flush()
            first_audio = record["timings_ms"].get("first_audio")
            decision = record.get("decision") or {}
            console.print(
                f"  {record['arm']:>16} {record['call_id']} turn {record['turn']:>3}: "
                f"{'-' if first_audio is None else f'{first_audio:.0f}'} ms, "
                f"{decision.get('effort')} on {decision.get('tier')} ({decision.get('taken')})",
                highlight=False,
            )

        records = asyncio.run(simulate(sim, on_record=write, recorded=recorded))
    console.print(f"{len(records)} turn records written to {out}")
    _report(records, sim.experiment.name, plot, csv, reference, resamples)


@experiments_app.command()
def report(
    name: Annotated[str, typer.Argument(help="Experiment name")],
    jsonl: Annotated[
        Path | None, typer.Option(help="Read turn records from this export (JSONL)")
    ] = None,
    redis_url: Annotated[
        str | None,
        typer.Option(help="Read from this Redis [default: $HOTLINE_REDIS_URL]", show_default=False),
    ] = None,
    server: Annotated[
        str | None, typer.Option(help="Read through a server's API instead", show_default=False)
    ] = None,
    token: TokenOption = None,
    key_prefix: Annotated[str, typer.Option(help="Redis key prefix")] = "hotline",
    plot: PlotOption = None,
    csv: CsvOption = None,
    reference: ReferenceOption = None,
    resamples: ResamplesOption = 2000,
) -> None:
    """Per arm: voice-to-voice p50/p95, share within budget, effort mix, fallbacks, barge-ins.

    Differences between arms come with bootstrap confidence intervals (resampling calls).
    """
    from voice.experiments.turn_records import load_jsonl

    records: list[dict[str, Any]]
    if jsonl is not None:
        try:
            records = load_jsonl(jsonl)
        except (OSError, ValueError) as exc:
            raise _fail(str(exc)) from exc
    elif server is not None:
        response = _api("GET", server, f"/experiments/{name}/records", token)
        records = [json.loads(line) for line in response.text.splitlines() if line.strip()]
    else:
        redis = redis_url or os.environ.get("HOTLINE_REDIS_URL")
        if not redis:
            raise _fail("give --jsonl, --server or --redis-url (or set HOTLINE_REDIS_URL)")
        records = asyncio.run(_from_redis(redis, key_prefix, name))
    _report(records, name, plot, csv, reference, resamples)


async def _from_redis(url: str, prefix: str, name: str) -> list[dict[str, Any]]:
    from voice.cluster.records import RegistrySettings
    from voice.cluster.store import REDIS_UNREACHABLE, connect
    from voice.experiments.arms import ExperimentStore, experiment_records

    client = connect(RegistrySettings(redis_url=url))
    try:
        return await experiment_records(ExperimentStore(client, prefix), name)
    except REDIS_UNREACHABLE as exc:
        raise _fail(f"cannot reach Redis at {url}: {exc}") from exc
    finally:
        await client.aclose()


@experiments_app.command()
def start(
    config: Annotated[Path, typer.Argument(help="Experiment file (YAML or JSON)")],
    server: ServerOption = "http://127.0.0.1:8080",
    token: TokenOption = None,
) -> None:
    """Start an experiment on a running cluster: new calls are assigned to its arms."""
    from voice.experiments.arms import load_experiment

    try:
        experiment = load_experiment(config)
    except ValueError as exc:
        raise _fail(str(exc)) from exc
    body = experiment.model_dump(mode="json")
    _api("PUT", server, f"/experiments/{experiment.name}", token, body)
    console.print(f"experiment {experiment.name} running")


@experiments_app.command()
def stop(server: ServerOption = "http://127.0.0.1:8080", token: TokenOption = None) -> None:
    """Stop the running experiment: new calls get the default policy again."""
    response = _api("DELETE", server, "/experiments/active", token)
    console.print(f"stopped: {response.json().get('stopped')}")

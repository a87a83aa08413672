"""The `hotline bench` command: its options, the progress bar, and a sweep over several loads.

`--calls` may be given more than once (`--calls 1 --calls 16 --calls 24`): each load runs in
turn against the same server, its report printed as it ends, and a last table puts them side by
side with each load's p95 over the first load's p50. The JSON report is then
`{"levels": [...], "p95_over_first_p50": [...]}`; with one load it is that load's report.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
import uvloop
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from voice.cli.client import DEFAULT_URL, TokenOption, UrlOption, explain
from voice.cli.logs import setup_logging
from voice.devtools.bench import SIP_PORT, Transport, run_bench
from voice.devtools.bench_report import BenchReport, LoadSweep


class BenchTransport(StrEnum):
    webrtc = "webrtc"
    twilio = "twilio"
    sip = "sip"


_KINDS: dict[BenchTransport, Transport] = {
    BenchTransport.webrtc: "webrtc",
    BenchTransport.twilio: "twilio",
    BenchTransport.sip: "sip",
}

BargeInOption = Annotated[
    float | None,
    typer.Option(
        "--barge-in",
        min=0,
        help="Speak each call's last turn this many ms into the reply before it, and report "
        "how soon that reply went quiet at the caller (target 300 ms)",
    ),
]
BackchannelOption = Annotated[
    float | None,
    typer.Option(
        "--backchannel",
        min=0,
        help="Say 'Okay.' this many ms into each call's last reply, and report how many "
        "replies it stopped for good (target at most 5%)",
    ),
]
LineNoiseOption = Annotated[
    float | None,
    typer.Option(
        "--line-noise",
        max=0,
        help="White noise of this RMS (dBFS) on every caller's line, as a real line is never "
        "digitally silent (--transport twilio; e.g. -50)",
    ),
]


def bench_command(
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    transport: Annotated[
        BenchTransport,
        typer.Option(help="webrtc (/offer), twilio (/twilio/stream) or sip (UDP, --sip-port)"),
    ] = BenchTransport.webrtc,
    sip_port: Annotated[
        int, typer.Option(help="The server's SIP port, on the URL's host (--transport sip)")
    ] = SIP_PORT,
    calls: Annotated[
        list[int] | None,
        typer.Option(min=1, help="Concurrent calls; repeat for a sweep over loads, in order"),
    ] = None,
    turns: Annotated[int, typer.Option(min=1, help="Turns per call")] = 3,
    out: Annotated[Path, typer.Option(help="Where to write the JSON report")] = Path("bench.json"),
    wav: Annotated[
        list[Path] | None,
        typer.Option(help="WAV the callers speak (repeatable; default: espeak-ng phrases)"),
    ] = None,
    stagger: Annotated[float, typer.Option(help="Seconds between call starts")] = 0.2,
    barge_in: BargeInOption = None,
    backchannel: BackchannelOption = None,
    line_noise: LineNoiseOption = None,
) -> None:
    """Benchmark a running server: N concurrent scripted calls, voice-to-voice latency and cost.

    Latency is measured at the caller (end of caller speech to first reply audio); its parts
    come from the server's turn records. Exits 1 when a call failed or a turn got no reply.
    """
    console = Console()
    setup_logging("warning", console)
    kind = _KINDS[transport]
    run = functools.partial(
        run_bench,
        stagger_s=stagger,
        wavs=wav or (),
        sip_port=sip_port,
        barge_in_after_ms=barge_in,
        backchannel_after_ms=backchannel,
        token=token,
        line_noise_dbfs=line_noise,
    )
    reports = [_with_progress(console, run, url, kind, load, turns) for load in calls or [1]]
    _write(console, reports, out)


def _write(console: Console, reports: list[BenchReport], out: Path) -> None:
    """Write the JSON report (a sweep's, with its table shown, for several loads); exit 1 when
    a call failed or a turn got no reply."""
    if len(reports) == 1:
        out.write_text(reports[0].to_json() + "\n")
    else:
        sweep = LoadSweep(reports)
        console.print(sweep.table())
        out.write_text(sweep.to_json() + "\n")
    console.print(f"report written to {out}")
    failed = [report for report in reports if report.failures]
    for report in failed:
        console.print(f"[red]{report.failures} of {report.calls} calls failed[/]")
    if failed:
        raise typer.Exit(1)


def _with_progress(
    console: Console,
    run: Callable[..., Coroutine[Any, Any, BenchReport]],
    url: str,
    kind: Transport,
    calls: int,
    turns: int,
) -> BenchReport:
    """`run` (`run_bench` with its options) under a progress bar, then its report shown; exit 2
    when the server cannot be reached or the script is impossible."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), console=console) as bar:
        task = bar.add_task(f"{kind}, {calls} calls: turns", total=calls * turns)
        try:
            # uvloop, as the server's: the callers send 50 frames a second each, on the same
            # cores as the server when it runs beside it.
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                report = runner.run(
                    run(url, kind, calls, turns, progress=lambda n: bar.update(task, completed=n))
                )
        except ValueError as exc:
            console.print(f"[red]{exc}[/]")
            raise typer.Exit(2) from exc
        except httpx.HTTPError as exc:
            console.print(f"[red]{explain(exc, url)}[/]", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from exc
    console.print(report)
    return report

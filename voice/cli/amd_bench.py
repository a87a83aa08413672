"""`hotline amd-bench`: who answered, person or machine, on recorded openings."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console


def amd_bench_command(
    seed: Annotated[int, typer.Option(help="Seed of the openings' pauses and digits")] = 28,
    out: Annotated[Path, typer.Option(help="JSON results file")] = Path("amd-bench.json"),
    limit: Annotated[
        int | None, typer.Option(min=1, help="Only the first N openings (a quick run)")
    ] = None,
    noise_dbfs: Annotated[
        float | None, typer.Option(help="Add white noise at this RMS level (e.g. -45)")
    ] = None,
) -> None:
    """Answering-machine detection replayed on openings over the phone path: Asterisk's
    recorded voicemail greetings and beep, a recorded "Hello.", piper greetings and answers
    (fetched once into the cache). Reports accuracy, errors per class and decision times."""
    from voice.devtools.amd_study import print_report, run_study, write_json

    console = Console(width=max(Console().width, 130))
    runs = run_study(
        seed, limit, progress=lambda line: console.print(f"[dim]{line}[/]"), noise_dbfs=noise_dbfs
    )
    print_report(runs, console)
    write_json(runs, out)
    console.print(f"results: {out}")

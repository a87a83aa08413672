"""`hotline turn-bench`: end-of-turn detection measured on human speech, the eot-bench way."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer
from rich.console import Console


def turn_bench_command(
    path: Annotated[
        Literal["phone", "wide", "both"],
        typer.Option(help="phone: 8 kHz μ-law as the server hears a call; wide: 16 kHz"),
    ] = "both",
    seed: Annotated[int, typer.Option(help="Seed of the turn set's recipe")] = 24,
    out: Annotated[Path, typer.Option(help="JSON results file")] = Path("turn-bench.json"),
    limit: Annotated[
        int | None, typer.Option(min=1, help="Only the first N turns (a quick run)")
    ] = None,
    plot: Annotated[
        Path | None, typer.Option(help="Write the Pareto plot here (PNG; the `plot` extra)")
    ] = None,
    no_cache: Annotated[
        bool, typer.Option("--no-cache", help="Recompute the features even if cached")
    ] = False,
) -> None:
    """Turn-taking on human speech: false cut-offs against mean end-of-turn delay, per
    detector (silence only, the text rules, Smart Turn v3.2, Smart Turn + transcript).

    The turn set is built on this machine from Debian's Asterisk prompts and pocketsphinx's
    LibriVox clips (fetched once into the cache), with mid-turn pauses inserted; every silence
    of 100 ms or more is a decision, the last of a turn its end.
    """
    from voice.devtools.turn_bench.report import plot as draw
    from voice.devtools.turn_bench.report import print_report, write_json
    from voice.devtools.turn_bench.run import run_bench

    console = Console(width=max(Console().width, 150))
    paths: list[Literal["phone", "wide"]] = ["phone", "wide"] if path == "both" else [path]

    def progress(name: str, done: int, total: int) -> None:
        if done % 20 == 0 or done == total:
            console.print(f"[dim]{name}: features of {done}/{total} turns[/]")

    result = run_bench(paths, seed=seed, limit=limit, use_cache=not no_cache, progress=progress)
    print_report(result, console)
    write_json(result, out)
    console.print(f"results: {out}")
    if plot is not None:
        try:
            draw(result, plot)
        except ImportError:
            console.print("[red]--plot needs matplotlib: pip install 'hotline[plot]'[/]")
            raise typer.Exit(1) from None
        console.print(f"plot: {plot}")

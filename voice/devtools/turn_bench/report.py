"""The bench's output: a rich table per path, a JSON file, and a Pareto plot (`plot` extra)."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from pipeline.endpoint import leaves_hanging, sounds_finished
from voice.devtools.turn_bench.corpus import CONTINUES, PAUSES
from voice.devtools.turn_bench.run import BenchResult, PathResult
from voice.devtools.turn_bench.scoring import HOLD_THROUGH_MS, Point, RowResult

# LiveKit eot-bench's published rows (real English human-to-agent turns: different data).
PUBLISHED: tuple[tuple[str, float, float, float, float], ...] = (
    ("eot-bench: silence only", 0.556, 0.217, 1600, 1000),
    ("eot-bench: Smart Turn v3.2", 0.352, 0.148, 1051, 739),
    ("eot-bench: LiveKit Turn Detector v1", 0.099, 0.045, 543, 295),
)

_PUBLISHED_KEYS = (
    "row",
    "cutoffs_at_300ms",
    "cutoffs_at_600ms",
    "delay_at_5pct_ms",
    "delay_at_10pct_ms",
)
SYNTHETIC = (
    "Words are human recordings (Asterisk's Allison, 8 kHz upsampled; LibriVox, 16 kHz); the "
    "mid-turn pauses are inserted silences drawn from a log-normal mixture, and the fillers "
    "('um', 'uh') are piper's joe voice: those parts are synthetic."
)


def _pct(value: float | None) -> str:
    return "–" if value is None or math.isnan(value) else f"{value * 100:.1f}%"


def _ms(value: float | None) -> str:
    return "–" if value is None or math.isnan(value) else f"{value:.0f}"


def _policy(point: Point | None) -> str:
    if point is None:
        return "none"
    if math.isnan(point.threshold):  # the bound: one delay at the ends and ambiguous pauses
        return f"delay {point.min_delay_ms}"
    return f"thr {point.threshold:g}, min {point.min_delay_ms}, timeout {point.timeout_ms}"


def path_table(result: PathResult) -> Table:
    """Cut-offs and delays per row on one path, with eot-bench's published rows beneath."""
    ends = sum(d.end for d in result.decisions)
    holds = len(result.decisions) - ends
    table = Table(
        "row",
        "cut-offs @300 ms",
        "cut-offs @600 ms",
        "delay @5% ms",
        "delay @10% ms",
        "inference ms p50/p95",
        title=f"{result.path} path: {ends} turn ends, {holds} holds",
    )
    for row in result.rows:
        table.add_row(
            row.row,
            _pct(row.cutoffs_300),
            _pct(row.cutoffs_600),
            _ms(row.delay_5),
            _ms(row.delay_10),
            f"{row.cost[0]:.0f} / {row.cost[1]:.0f}",
        )
    for name, c300, c600, d5, d10 in PUBLISHED:
        table.add_row(f"[dim]{name}[/]", _pct(c300), _pct(c600), _ms(d5), _ms(d10), "")
    return table


def _operating(point: Point | None, met: bool) -> str:
    if point is None:
        return "not reached"
    return (
        f"{'MET' if met else 'not met'}: {point.mean_delay_ms:.0f} ms, "
        f"{_pct(point.cutoff_rate)} cut-offs, continuing held {HOLD_THROUGH_MS} ms: "
        f"{_pct(point.held_through)}\n{_policy(point)}"
    )


def goals_table(result: PathResult) -> Table:
    """Each row's best operating point for each goal (the fastest policy within the goal's
    cut-offs), whether it is fast enough, and the share of pauses after words that plainly
    go on that it holds through 1 s."""
    goals = [goal for goal, _, _ in result.rows[0].goals] if result.rows else []
    table = Table("row", *(g.label for g in goals), title=f"{result.path} path: best points")
    for row in result.rows:
        table.add_row(row.row, *(_operating(point, met) for _, point, met in row.goals))
    return table


def category_stats(result: PathResult) -> dict[str, dict[str, float]]:
    """Per pause category: decisions, median silence, and how the model and the words judge
    them (share the model calls over at 0.5; share of transcripts left hanging / finished)."""
    stats: dict[str, dict[str, float]] = {}
    for name in sorted({d.category for d in result.decisions}):
        chosen = [d for d in result.decisions if d.category == name]
        silences = [d.silence_ms for d in chosen if not d.end]
        stats[name] = {
            "decisions": len(chosen),
            "silence_ms_p50": float(np.median(silences)) if silences else math.nan,
            "model_over": float(np.mean([d.score >= 0.5 for d in chosen])),
            "words_hanging": float(np.mean([leaves_hanging(d.text) for d in chosen])),
            "words_finished": float(np.mean([sounds_finished(d.text) for d in chosen])),
        }
    return stats


def category_table(result: PathResult) -> Table:
    table = Table(
        "pause",
        "decisions",
        "silence p50 ms",
        "Smart Turn >= 0.5",
        "words hanging",
        "words finished",
        title=f"{result.path} path: pauses by category (end: the turn's end; natural: a "
        "recording's own pause)",
    )
    for name, s in category_stats(result).items():
        table.add_row(
            name,
            f"{s['decisions']:.0f}",
            _ms(s["silence_ms_p50"]),
            _pct(s["model_over"]),
            _pct(s["words_hanging"]),
            _pct(s["words_finished"]),
        )
    return table


def print_report(result: BenchResult, console: Console | None = None) -> None:
    out = console or Console()
    kinds = Counter(t.kind for t in result.turns)
    out.print(
        f"{len(result.turns)} turns ({', '.join(f'{k} {n}' for k, n in kinds.items())}); "
        f"{sum(t.synthetic_filler for t in result.turns)} with a synthetic filler."
    )
    out.print(SYNTHETIC)
    for path in result.paths:
        out.print(path_table(path))
        out.print(goals_table(path))
        shipped = path.defaults
        if shipped is not None:
            out.print(
                f"{path.path}: TurnPolicy() as shipped (Smart Turn + hanging veto, "
                f"{_policy(shipped)}): {shipped.mean_delay_ms:.0f} ms mean delay, "
                f"{_pct(shipped.cutoff_rate)} cut-offs, continuing held {HOLD_THROUGH_MS} ms: "
                f"{_pct(shipped.held_through)}"
            )
        out.print(category_table(path))
    out.print(f"whole run: {result.seconds:.0f} s")


def _point(point: Point | None) -> dict[str, Any] | None:
    if point is None:
        return None
    return {
        "threshold": point.threshold,
        "min_delay_ms": point.min_delay_ms,
        "timeout_ms": point.timeout_ms,
        "mean_delay_ms": point.mean_delay_ms,
        "cutoff_rate": point.cutoff_rate,
        "continuing_held_1s": None if math.isnan(point.held_through) else point.held_through,
    }


def _row(row: RowResult) -> dict[str, Any]:
    return {
        "row": row.row,
        "cutoffs_at_300ms": row.cutoffs_300,
        "cutoffs_at_600ms": row.cutoffs_600,
        "delay_at_5pct_ms": row.delay_5,
        "delay_at_10pct_ms": row.delay_10,
        "inference_ms_p50": row.cost[0],
        "inference_ms_p95": row.cost[1],
        "goals": [{"goal": g.label, "met": met, "point": _point(p)} for g, p, met in row.goals],
        "frontier": [_point(p) for p in row.frontier],
    }


def to_json(result: BenchResult) -> dict[str, Any]:
    """Everything the tables show, the frontiers, and how the set was made."""
    return {
        "turns": len(result.turns),
        "kinds": dict(Counter(t.kind for t in result.turns)),
        "synthetic": SYNTHETIC,
        "pauses": vars(PAUSES),
        "continuing_categories": sorted(CONTINUES),
        "seconds": result.seconds,
        "published": [dict(zip(_PUBLISHED_KEYS, p, strict=True)) for p in PUBLISHED],
        "paths": [
            {
                "path": p.path,
                "decisions": len(p.decisions),
                "ends": sum(d.end for d in p.decisions),
                "categories": category_stats(p),
                "features_s": p.features_s,
                "shipped_defaults": _point(p.defaults),
                "rows": [_row(r) for r in p.rows],
            }
            for p in result.paths
        ],
    }


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinity: None stands for them."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def write_json(result: BenchResult, file: Path) -> None:
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(json.dumps(_finite(to_json(result)), indent=2, allow_nan=False))


def plot(result: BenchResult, file: Path) -> None:
    """The Pareto frontiers (mean delay vs cut-offs), one panel per path (matplotlib, lazily:
    the `plot` extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(result.paths), figsize=(6 * len(result.paths), 4.5))
    panels = axes if len(result.paths) > 1 else [axes]
    for ax, path in zip(panels, result.paths, strict=True):
        for row in path.rows:
            xs = [p.mean_delay_ms for p in row.frontier]
            ys = [p.cutoff_rate * 100 for p in row.frontier]
            ax.plot(xs, ys, marker=".", label=row.row)
        for name, c300, c600, _d5, _d10 in PUBLISHED:
            ax.scatter([300, 600], [c300 * 100, c600 * 100], marker="x", s=20, label=name)
        ax.set(
            title=f"{path.path} path",
            xlabel="mean end-of-turn delay (ms)",
            ylabel="false cut-offs (% of holds)",
            xlim=(0, 2000),
            ylim=(0, 100),
        )
        ax.grid(alpha=0.3)
    panels[0].legend(fontsize=7)
    figure.tight_layout()
    file.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(file, dpi=120)
    plt.close(figure)

"""One bench run: build the set, compute (or load) the decisions per path, score every row."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pipeline.turn_taking.policy import TurnPolicy
from voice.devtools.turn_bench.corpus import Turn, piper_fillers, pools
from voice.devtools.turn_bench.decisions import Decision, Path_, features, load, models, save
from voice.devtools.turn_bench.recipe import build_turns
from voice.devtools.turn_bench.scoring import (
    ROWS,
    Point,
    Row,
    RowResult,
    bound,
    evaluate,
    score_row,
)
from voice.devtools.turn_bench.sources import (
    asterisk_clips,
    bench_dir,
    librivox_clips,
    sources_dir,
)

TURNS = 240
DEFAULT_TIMEOUT_MS = TurnPolicy().timeout_ms
DEFAULTS = Row("TurnPolicy() defaults", lambda t, m: TurnPolicy(), True, True)
FEATURES_VERSION = 2  # bump when what a decision holds, or how it is measured, changes


@dataclass
class PathResult:
    """One path: its decisions and every row's result."""

    path: Path_
    decisions: list[Decision]
    rows: list[RowResult]
    features_s: float  # time spent computing features (0: from the cache)
    defaults: Point | None = None  # `TurnPolicy()` as shipped, timeout DEFAULT_TIMEOUT_MS


@dataclass
class BenchResult:
    turns: list[Turn]
    paths: list[PathResult] = field(default_factory=list)
    seconds: float = 0.0


def turn_set(seed: int, count: int = TURNS) -> list[Turn]:
    """The turn set for `seed` (sources fetched on first use)."""
    root = sources_dir()
    return build_turns(
        pools(asterisk_clips(root), librivox_clips(root), piper_fillers()), seed, count
    )


def fingerprint(turns: Sequence[Turn], path: Path_) -> str:
    """A key for the features of these turns on this path (their audio and pauses)."""
    digest = hashlib.sha1(f"v{FEATURES_VERSION}:{path}".encode())
    for turn in turns:
        digest.update(turn.audio.tobytes())
        digest.update(repr(turn.gaps).encode())
    return digest.hexdigest()[:16]


def decisions_for(
    turns: Sequence[Turn],
    path: Path_,
    use_cache: bool = True,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[list[Decision], float]:
    """The decisions of `turns` on `path`, from the cache when it has them."""
    file = bench_dir() / f"features-{path}-{fingerprint(turns, path)}.json"
    cached = load(file) if use_cache else None
    if cached is not None:
        return cached, 0.0
    began = time.perf_counter()
    score, transcribe = models()
    found = features(turns, path, score, transcribe, progress)
    save(found, file)
    return found, time.perf_counter() - began


def run_bench(
    paths: Sequence[Path_],
    seed: int = 24,
    limit: int | None = None,
    rows: Sequence[Row] = ROWS,
    use_cache: bool = True,
    progress: Callable[[str, int, int], None] | None = None,
) -> BenchResult:
    """Build the set (the first `limit` turns if given), then score every row on every path."""
    began = time.perf_counter()
    turns = turn_set(seed)[:limit] if limit else turn_set(seed)
    result = BenchResult(turns)
    for path in paths:
        tick = None if progress is None else (lambda i, n, p=path: progress(p, i, n))
        decisions, seconds = decisions_for(turns, path, use_cache, tick)
        scored = [*(score_row(decisions, row) for row in rows), bound(decisions)]
        policy = TurnPolicy()
        shipped = evaluate(
            decisions, DEFAULTS, policy.threshold, policy.min_delay_ms, DEFAULT_TIMEOUT_MS
        )
        result.paths.append(PathResult(path, decisions, scored, seconds, shipped))
    result.seconds = time.perf_counter() - began
    return result

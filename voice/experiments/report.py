"""Per-arm reports for latency experiments, from the turn records of finished calls.

- `voice.experiments.turn_records` reads exported turn records (`load_jsonl`) and each one;
  `build_report(records, name)` summarises each arm (voice-to-voice p50/p95, share within the
  arm's budget, effort/tier mix, fallbacks, hedges, barge-in rate, prediction error) and
  compares every arm with a reference arm.
- `render_report`, `write_csv` and `plot_report` turn that into text, a per-turn CSV and a PNG.

Voice-to-voice latency of a turn is `timings_ms["first_audio"]`; a turn without it counts as
outside the budget and is left out of the percentiles.

Statistics. Turns of one call are correlated (same caller, line, prompt length), so the
intervals come from a *cluster* bootstrap: each resample draws an arm's calls with replacement
(as many as it has, independently per arm), keeps all turns of each drawn call, recomputes the
metric, and the difference arm − reference is taken per resample. The interval is the percentile
interval of those differences at the requested confidence. Resampling turns instead would treat
correlated turns as independent and give intervals that are too narrow. Resamples are vectorised
as integer call weights, so percentiles of a resample are weighted percentiles that match
`numpy.percentile` (linear) of the expanded sample exactly.

A record is read through `voice.experiments.turn_records`.
"""

from __future__ import annotations

import csv
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from voice.experiments.turn_records import (
    arm_of,
    budget_of,
    decided,
    effort_key,
    first_audio,
    tier_of,
    within,
)

METRICS: tuple[str, ...] = ("p50_ms", "p95_ms", "within_budget", "barge_in_rate")
CSV_COLUMNS: tuple[str, ...] = (
    "call_id", "arm", "turn", "budget_ms", "first_audio_ms", "within_budget", "effort", "tier",
    "taken", "planned_effort", "planned_tier", "fits", "predicted_first_audio_ms", "interrupted",
    "endpoint_ms", "stt_ms", "llm_first_token_ms", "first_sentence_ms", "tts_first_chunk_ms",
)  # fmt: skip

Floats = npt.NDArray[np.float64]


@dataclass(frozen=True)
class ArmSummary:
    arm: str
    calls: int
    turns: int
    budget_ms: float | None
    p50_ms: float | None
    p95_ms: float | None
    within_budget: float | None
    efforts: dict[str, int]
    tiers: dict[str, int]
    fallbacks: int
    hedges: int
    barge_in_rate: float
    mean_abs_prediction_error_ms: float | None


@dataclass(frozen=True)
class Difference:
    metric: str
    arm: str
    reference: str
    estimate: float
    low: float
    high: float


@dataclass(frozen=True)
class ExperimentReport:
    experiment: str
    arms: list[ArmSummary]
    differences: list[Difference]
    confidence: float
    resamples: int


# -- per-arm data and metrics ----------------------------------------------------------------


@dataclass(frozen=True)
class _Arm:
    records: list[Mapping[str, Any]]
    budget: float | None
    first_audio: Floats  # NaN where missing
    within: Floats  # 0/1 against the turn's budget (the arm's where the record has none)
    interrupted: Floats
    call: npt.NDArray[np.intp]  # call index per turn
    calls: int


def _arm_data(records: list[Mapping[str, Any]]) -> _Arm:
    budgets = Counter(b for r in records if (b := budget_of(r)) is not None)
    budget = budgets.most_common(1)[0][0] if budgets else None
    fa = [first_audio(r) for r in records]
    call_ids: dict[str, int] = {}
    call = [call_ids.setdefault(str(r.get("call_id")), len(call_ids)) for r in records]
    return _Arm(
        records=records,
        budget=budget,
        first_audio=np.array([np.nan if v is None else v for v in fa], dtype=np.float64),
        within=np.array(
            [bool(within(v, budget_of(r, budget))) for v, r in zip(fa, records, strict=True)],
            dtype=np.float64,
        ),
        interrupted=np.array([bool(r.get("interrupted")) for r in records], dtype=np.float64),
        call=np.array(call, dtype=np.intp),
        calls=len(call_ids),
    )


def _weighted_percentile(values: Floats, weights: Floats, q: float) -> Floats:
    """Per row of integer `weights` (B, T): numpy's linear percentile of `values` repeated."""
    valid = ~np.isnan(values)
    order = np.argsort(values[valid], kind="stable")
    vals = values[valid][order]
    if vals.size == 0:
        return np.full(weights.shape[0], np.nan)
    cum = np.cumsum(weights[:, valid][:, order], axis=1)
    n = cum[:, -1]
    h = (n - 1) * (q / 100.0)
    lo = np.floor(h)
    j_lo = np.minimum((cum <= lo[:, None]).sum(axis=1), vals.size - 1)
    j_hi = np.minimum((cum <= np.ceil(h)[:, None]).sum(axis=1), vals.size - 1)
    out = vals[j_lo] + (h - lo) * (vals[j_hi] - vals[j_lo])
    return np.where(n > 0, out, np.nan)


def _metric(arm: _Arm, metric: str, weights: Floats) -> Floats:
    """`metric` of `arm` for each row of turn weights (B, T)."""
    if metric in ("p50_ms", "p95_ms"):
        return _weighted_percentile(arm.first_audio, weights, 50.0 if metric == "p50_ms" else 95.0)
    column = arm.within if metric == "within_budget" else arm.interrupted
    result: Floats = (weights @ column) / weights.sum(axis=1)
    return result


def _bootstrap(arm: _Arm, rng: np.random.Generator, resamples: int) -> dict[str, Floats]:
    """Every metric over `resamples` cluster resamples (calls drawn with replacement)."""
    out: dict[str, list[Floats]] = {m: [] for m in METRICS}
    chunk = max(1, min(resamples, 2_000_000 // max(1, len(arm.records))))
    for start in range(0, resamples, chunk):
        size = min(chunk, resamples - start)
        counts = rng.multinomial(arm.calls, np.full(arm.calls, 1.0 / arm.calls), size=size)
        weights = counts[:, arm.call].astype(np.float64)
        for m in METRICS:
            out[m].append(_metric(arm, m, weights))
    return {m: np.concatenate(parts) for m, parts in out.items()}


def _summary(name: str, arm: _Arm) -> ArmSummary:
    fa = arm.first_audio[~np.isnan(arm.first_audio)]
    efforts = Counter(str(e) for r in arm.records if (e := decided(r, "effort")) is not None)
    tiers = Counter(str(t) for r in arm.records if (t := tier_of(r)) is not None)
    taken = Counter((r.get("decision") or {}).get("taken") for r in arm.records)
    errors = [
        abs(float(e))
        for r in arm.records
        if (e := (r.get("decision") or {}).get("error_ms")) is not None
    ]
    return ArmSummary(
        arm=name,
        calls=arm.calls,
        turns=len(arm.records),
        budget_ms=arm.budget,
        p50_ms=float(np.percentile(fa, 50)) if fa.size else None,
        p95_ms=float(np.percentile(fa, 95)) if fa.size else None,
        within_budget=None if arm.budget is None else float(arm.within.mean()),
        efforts={k: efforts[k] for k in sorted(efforts, key=effort_key)},
        tiers={k: tiers[k] for k in sorted(tiers)},
        fallbacks=taken["fallback"],
        hedges=taken["hedge"],
        barge_in_rate=float(arm.interrupted.mean()),
        mean_abs_prediction_error_ms=float(np.mean(errors)) if errors else None,
    )


def build_report(
    records: Sequence[Mapping[str, Any]],
    experiment: str,
    *,
    arms: Sequence[str] | None = None,
    reference: str | None = None,
    resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> ExperimentReport:
    """Summarise each arm of `experiment` and bootstrap every arm's difference to `reference`."""
    if not 0.0 < confidence < 1.0:
        raise ValueError("confidence must be between 0 and 1")
    if resamples < 1:
        raise ValueError("resamples must be at least 1")
    by_arm: dict[str, list[Mapping[str, Any]]] = {}
    for rec in records:
        if rec.get("experiment") == experiment:
            by_arm.setdefault(arm_of(rec), []).append(rec)
    if not by_arm:
        raise ValueError(f"no turn records for experiment {experiment}")
    names = list(arms) if arms is not None else list(by_arm)
    missing = [a for a in names if a not in by_arm]
    if missing or not names:
        raise ValueError(f"no turn records for arm(s) {', '.join(missing)} in {experiment}")
    reference = names[0] if reference is None else reference
    if reference not in names:
        raise ValueError(f"reference arm {reference!r} is not one of {', '.join(names)}")

    data = {a: _arm_data(by_arm[a]) for a in names}
    summaries = {a: _summary(a, data[a]) for a in names}
    rng = np.random.default_rng(seed)
    boots = {a: _bootstrap(data[a], rng, resamples) for a in names}
    tail = (1.0 - confidence) / 2.0 * 100.0
    differences: list[Difference] = []
    for arm in names:
        if arm == reference:
            continue
        for m in METRICS:
            value, ref_value = getattr(summaries[arm], m), getattr(summaries[reference], m)
            if value is None or ref_value is None:
                continue
            diffs = boots[arm][m] - boots[reference][m]
            diffs = diffs[~np.isnan(diffs)]
            low, high = np.percentile(diffs, [tail, 100.0 - tail]) if diffs.size else (np.nan,) * 2
            differences.append(
                Difference(m, arm, reference, float(value - ref_value), float(low), float(high))
            )
    return ExperimentReport(
        experiment, [summaries[a] for a in names], differences, confidence, resamples
    )


# -- output ----------------------------------------------------------------------------------


def _ms(v: float | None) -> str:
    return "—" if v is None else f"{v:.0f} ms"


def _pct(v: float | None) -> str:
    return "—" if v is None else f"{100 * v:.1f}%"


def _signed(v: float, digits: int, plus: bool) -> str:
    text = f"{v:+.{digits}f}" if plus else f"{v:.{digits}f}"
    return text.replace("-", "−")


def render_report(report: ExperimentReport) -> str:
    """Plain-text table of the arms, then one line per (arm, metric) difference with its CI."""
    header = ["arm", "calls", "turns", "budget", "p50", "p95", "within", "effort mix",
              "fallbacks", "hedges", "barge-in", "|pred err|"]  # fmt: skip
    rows = [header] + [
        [s.arm, str(s.calls), str(s.turns), _ms(s.budget_ms), _ms(s.p50_ms), _ms(s.p95_ms),
         _pct(s.within_budget), ", ".join(f"{e} {n}" for e, n in s.efforts.items()) or "—",
         str(s.fallbacks), str(s.hedges), _pct(s.barge_in_rate),
         _ms(s.mean_abs_prediction_error_ms)]
        for s in report.arms
    ]  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    left = {0, 7}  # text columns; numbers right-aligned

    def line(row: list[str]) -> str:
        cells = (
            c.ljust(w) if i in left else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )
        return "  ".join(cells).rstrip()

    out = [f"experiment {report.experiment}", "", line(header)]
    out.append("  ".join("-" * w for w in widths))
    out += [line(r) for r in rows[1:]]
    if report.differences:
        ci = f"{100 * report.confidence:g}% CI"
        out += ["", f"differences vs {report.differences[0].reference}:"]
        name_w = max(len(f"{d.arm} − {d.reference}") for d in report.differences)
        metric_w = max(len(d.metric) for d in report.differences)
        for d in report.differences:
            share = d.metric in ("within_budget", "barge_in_rate")
            scale, unit, digits = (100.0, "pp", 1) if share else (1.0, "ms", 0)
            est = f"{_signed(d.estimate * scale, digits, True)} {unit}"
            low, high = (_signed(v * scale, digits, False) for v in (d.low, d.high))
            out.append(
                f"{(d.arm + ' − ' + d.reference).ljust(name_w)}  {d.metric.ljust(metric_w)}  "
                f"{est.rjust(10)}  [{low}, {high}] {ci}"
            )
        out.append(f"({ci}: percentile intervals over {report.resamples} resamples of calls)")
    return "\n".join(out) + "\n"


def write_csv(records: Sequence[Mapping[str, Any]], experiment: str, path: str | Path) -> int:
    """One row per turn of `experiment` (columns `CSV_COLUMNS`); returns the row count."""
    rows = 0
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(CSV_COLUMNS))
        writer.writeheader()
        for rec in records:
            if rec.get("experiment") != experiment:
                continue
            decision = rec.get("decision") or {}
            timings = rec.get("timings_ms") or {}
            fa, budget = first_audio(rec), budget_of(rec)
            row: dict[str, Any] = {
                "call_id": rec.get("call_id"), "arm": arm_of(rec), "turn": rec.get("turn"),
                "budget_ms": budget, "first_audio_ms": fa,
                "within_budget": within(fa, budget),
                "effort": decided(rec, "effort"), "tier": tier_of(rec),
                "interrupted": bool(rec.get("interrupted")),
            }  # fmt: skip
            for key in ("taken", "planned_effort", "planned_tier", "fits"):
                row[key] = decision.get(key)
            row["predicted_first_audio_ms"] = decision.get("predicted_first_audio_ms")
            for key in ("endpoint", "stt", "llm_first_token", "first_sentence", "tts_first_chunk"):
                row[f"{key}_ms"] = timings.get(key)
            writer.writerow({k: "" if v is None else v for k, v in row.items()})
            rows += 1
    return rows


def plot_report(
    records: Sequence[Mapping[str, Any]], report: ExperimentReport, path: str | Path
) -> None:
    """PNG: voice-to-voice CDF per arm (budgets dashed) and the effort mix per arm."""
    try:
        import matplotlib
    except ImportError as e:
        raise RuntimeError("plotting needs matplotlib: pip install 'hotline[plot]'") from e
    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 5), layout="constrained")
    cdf_ax, mix_ax = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    tab10 = matplotlib.colormaps["tab10"]
    for i, s in enumerate(report.arms):
        colour = tab10(i % 10)
        fa = [
            v for r in records
            if r.get("experiment") == report.experiment and arm_of(r) == s.arm
            and (v := first_audio(r)) is not None
        ]  # fmt: skip
        if fa:
            xs = np.sort(np.array(fa, dtype=np.float64))
            cdf_ax.step(
                xs,
                np.arange(1, xs.size + 1) / xs.size,
                where="post",
                color=colour,
                label=f"{s.arm} (n={xs.size})",
            )
        if s.budget_ms is not None:
            cdf_ax.axvline(s.budget_ms, color=colour, linestyle="--", linewidth=1)
    cdf_ax.set_xlabel("voice-to-voice (ms, end of speech -> first audio)")
    cdf_ax.set_ylabel("share of turns")
    cdf_ax.set_ylim(0, 1.02)
    cdf_ax.grid(alpha=0.3)
    cdf_ax.legend(loc="lower right", fontsize="small")

    efforts = sorted({e for s in report.arms for e in s.efforts}, key=effort_key)
    shades = matplotlib.colormaps["viridis"](np.linspace(0.1, 0.9, max(1, len(efforts))))
    rows = np.arange(len(report.arms))
    left = np.zeros(len(report.arms))
    for effort, shade in zip(efforts, shades, strict=False):
        shares = np.array([s.efforts.get(effort, 0) / max(1, s.turns) for s in report.arms])
        mix_ax.barh(rows, shares, left=left, color=shade, label=effort)
        left += shares
    mix_ax.set_yticks(rows, [s.arm for s in report.arms])
    mix_ax.invert_yaxis()
    mix_ax.set_xlim(0, 1)
    mix_ax.set_xlabel("share of turns by reasoning effort")
    if efforts:
        mix_ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=len(efforts),
                      fontsize="small")  # fmt: skip
    fig.suptitle(report.experiment)
    fig.savefig(path, dpi=120, format="png")
    fig.clear()

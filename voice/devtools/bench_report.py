"""`hotline bench`'s figures: turn and call samples, percentiles, the report and its tables,
and the matching of the callers' turns with the server's turn records. Pure: no I/O."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from pipeline.records import STAGES
from voice.devtools.turns import CallResult

DELIVERY = "delivery"  # derived part: caller-side voice-to-voice minus the server's first_audio
BARGE_IN_TARGET_MS = 300.0  # caller starts speaking -> the reply is silent at the caller
BACKCHANNEL_TARGET = 0.05  # share of replies a caller's acknowledgement may stop (issue 24)
MATCH_WINDOW_S = 2.0  # a server record this close to a caller turn's end of speech is that turn


@dataclass
class TurnSample:
    """One turn as the caller timed it, with the server's parts when its record was found."""

    voice_to_voice_ms: float | None
    timings_ms: dict[str, float] = field(default_factory=dict)
    reply_words: int | None = None  # the server's record of the reply: words the caller heard
    cut: bool | None = None  # the server's record: the caller's next words cut the reply short
    # How the reply played (voice/devtools/playback.py; None: not measured on this transport).
    gaps: int | None = None  # dry spells over 100 ms after it began
    longest_gap_ms: float | None = None
    over_caller_ms: float | None = None  # reply audio while the caller said its next words
    # The server's record: the effort and tier the latency budget controller chose ("low on
    # fast"); None: no record, or no decision in it.
    plan: str | None = None
    fillers: int | None = None  # the server's record: hesitations said where the line ran dry


@dataclass
class CallSample:
    call_id: str
    duration_s: float
    expected_turns: int
    turns: list[TurnSample] = field(default_factory=list)
    error: str | None = None
    barge_in: bool = False  # the call's last turn cut into the reply before it
    barge_in_stop_ms: float | None = None  # its onset -> that reply's audio stopped (caller)
    # --backchannel: the caller's "okay" during the last reply stopped it for good (the server
    # cut it, or took the "okay" for a turn); None: not asked.
    backchannel_stopped: bool | None = None

    @property
    def failed(self) -> bool:
        """The call broke, a turn of it got no reply, or a barge-in did not stop the reply."""
        return (
            self.error is not None
            or len(self.turns) < self.expected_turns
            or any(turn.voice_to_voice_ms is None for turn in self.turns)
            or (self.barge_in and self.barge_in_stop_ms is None)
        )


@dataclass
class Stats:
    count: int
    p50: float | None
    p95: float | None
    max: float | None


def percentile(values: Sequence[float], q: float) -> float | None:
    """The `q`th percentile, linearly interpolated between closest ranks (None when empty)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    value = ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
    return round(value, 1)


def stats(values: Sequence[float]) -> Stats:
    top = round(max(values), 1) if values else None
    return Stats(len(values), percentile(values, 50), percentile(values, 95), top)


@dataclass
class Health:
    """The server's `/healthz` figures the report needs."""

    cpu_s: float
    rss_mb: float
    peak_rss_mb: float
    cpu_by_thread: dict[str, float] = field(default_factory=dict)  # a server before 2026-12-05: {}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Health:
        threads = {str(k): float(v) for k, v in (data.get("cpu_by_thread") or {}).items()}
        return cls(float(data["cpu_s"]), float(data["rss_mb"]), float(data["peak_rss_mb"]), threads)


@dataclass
class BenchReport:
    url: str
    transport: str
    calls: int
    turns: int
    wall_s: float
    voice_to_voice_ms: Stats
    parts_ms: dict[str, Stats]
    failures: int
    server_cpu_s: float
    call_minutes: float
    cpu_s_per_call_minute: float | None
    server_rss_mb: float
    server_peak_rss_mb: float
    samples: list[CallSample]
    # With `hotline bench --barge-in MS`: how soon the reply went quiet at the caller after the
    # caller's interrupting speech began (README's target: BARGE_IN_TARGET_MS); else None.
    barge_in_stop_ms: Stats | None = None
    # With `hotline bench --backchannel MS`: of the replies a caller said "okay" into, how many
    # that stopped for good (target: at most BACKCHANNEL_TARGET of them); else None.
    backchannels: int | None = None
    backchannel_stops: int | None = None
    # Replies: their length (words the caller heard), and how they played where measured.
    reply_words: Stats | None = None
    playback_turns: int = 0  # turns whose playback was measured
    gap_turns: int = 0  # of those, with a gap (a dry spell over 100 ms)
    longest_gap_ms: float | None = None
    over_caller_turns: int = 0  # of those, with reply audio over the caller's next words
    filler_turns: int = 0  # turns whose reply said its gap filler ("Um,") into a dry line
    # Turns whose reply the caller's next words cut short (the server's records): a --barge-in
    # run's own, or, under overload, callers who took a gap for the reply's end and spoke.
    cut_turns: int = 0
    # The server's CPU per call-minute by thread ("tts", "main", "recorder", ...; /healthz).
    cpu_by_thread: dict[str, float] = field(default_factory=dict)
    # Turns by the controller's plan, most first ({"low on fast": 60, "medium on fast": 4}): at
    # one caller it spends on effort what the budget leaves, which moves the latency figures.
    plans: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> BenchReport:
        data = json.loads(text)
        data["voice_to_voice_ms"] = Stats(**data["voice_to_voice_ms"])
        data["parts_ms"] = {name: Stats(**part) for name, part in data["parts_ms"].items()}
        for name in ("barge_in_stop_ms", "reply_words"):
            if data.get(name) is not None:
                data[name] = Stats(**data[name])
        data["samples"] = [
            CallSample(**{**call, "turns": [TurnSample(**turn) for turn in call["turns"]]})
            for call in data["samples"]
        ]
        return cls(**data)

    def table(self) -> Table:
        title = (
            f"{self.transport}: {self.calls} calls × {self.turns} turns, "
            f"{self.failures} failed, {self.wall_s:.0f} s"
        )
        table = Table("ms", "n", "p50", "p95", "max", title=title)
        rows = [("voice-to-voice (caller)", self.voice_to_voice_ms)]
        rows += [(f"  {name}", part) for name, part in self.parts_ms.items()]
        if self.barge_in_stop_ms is not None:
            rows.append(("barge-in: reply stopped (caller)", self.barge_in_stop_ms))
        for name, row in rows:
            cells = (_number(row.p50), _number(row.p95), _number(row.max))
            table.add_row(name, str(row.count), *cells)
        return table

    def __rich__(self) -> Group:
        cost = (
            f"server CPU: {_number(self.cpu_s_per_call_minute, '.2f')} s per call-minute "
            f"({self.server_cpu_s:.1f} s over {self.call_minutes:.2f} call-minutes)\n"
            f"server RSS: peak {self.server_peak_rss_mb:.0f} MB, now {self.server_rss_mb:.0f} MB"
        )
        if self.cpu_by_thread:
            parts = ", ".join(f"{name} {cpu:.2f}" for name, cpu in self.cpu_by_thread.items())
            cost += f"\nserver CPU by thread, s per call-minute: {parts}"
        if self.barge_in_stop_ms is not None and self.barge_in_stop_ms.p95 is not None:
            within = "within" if self.barge_in_stop_ms.p95 <= BARGE_IN_TARGET_MS else "over"
            cost += (
                f"\nbarge-in: p95 {self.barge_in_stop_ms.p95:.0f} ms from the caller's onset to "
                f"silence, {within} the {BARGE_IN_TARGET_MS:.0f} ms target"
            )
        words = self.reply_words
        if words is not None and words.p50 is not None:
            cost += f"\nreplies: p50 {words.p50:.0f} words (max {_number(words.max)})"
        if self.plans:
            cost += f"\nthe controller's plans: {_counted(self.plans)}"
        if self.playback_turns:
            cost += (
                f"\nplayback: {self.gap_turns} of {self.playback_turns} turns with a gap over "
                f"100 ms (longest {_number(self.longest_gap_ms)} ms); reply audio over the "
                f"caller in {self.over_caller_turns}; a hesitation into a dry line in "
                f"{self.filler_turns}"
            )
        if self.cut_turns:
            heard = sum(len(call.turns) for call in self.samples)
            cost += f"\nreplies the caller cut short: {self.cut_turns} of {heard}"
        if self.backchannels:
            stops = self.backchannel_stops or 0
            within = "within" if stops <= BACKCHANNEL_TARGET * self.backchannels else "over"
            cost += (
                f"\nbackchannel: {stops} of {self.backchannels} replies stopped by the caller's "
                f"'okay', {within} the {BACKCHANNEL_TARGET:.0%} target"
            )
        return Group(self.table(), Text(cost))


def _number(value: float | None, spec: str = ".0f") -> str:
    return "-" if value is None else format(value, spec)


def _counted(plans: dict[str, int]) -> str:
    """Plans and their counts, as in "low on fast 60, medium on fast 4"."""
    return ", ".join(f"{plan} {count}" for plan, count in plans.items())


def summarize(
    url: str,
    transport: str,
    turns: int,
    samples: list[CallSample],
    before: Health,
    after: Health,
    wall_s: float,
    barge_in: bool = False,
) -> BenchReport:
    """Aggregate per-call samples and the server's health before and after into a report
    (`barge_in`: each call's last turn cut into a reply, and how soon it stopped is reported;
    calls whose `backchannel_stopped` is known count towards the backchannel figure)."""
    acknowledged = [call.backchannel_stopped for call in samples if call.error is None]
    said = [stopped for stopped in acknowledged if stopped is not None]
    heard = [t for call in samples for t in call.turns if t.voice_to_voice_ms is not None]
    parts: dict[str, Stats] = {}
    for stage in (*STAGES, DELIVERY):
        values = [t.timings_ms[stage] for t in heard if stage in t.timings_ms]
        if values:
            parts[stage] = stats(values)
    call_minutes = sum(call.duration_s for call in samples) / 60
    cpu_s = round(max(0.0, after.cpu_s - before.cpu_s), 3)
    return BenchReport(
        url=url,
        transport=transport,
        calls=len(samples),
        turns=turns,
        wall_s=round(wall_s, 1),
        voice_to_voice_ms=stats([v for t in heard if (v := t.voice_to_voice_ms) is not None]),
        parts_ms=parts,
        failures=sum(call.failed for call in samples),
        server_cpu_s=cpu_s,
        call_minutes=round(call_minutes, 3),
        cpu_s_per_call_minute=round(cpu_s / call_minutes, 3) if call_minutes > 0 else None,
        server_rss_mb=after.rss_mb,
        server_peak_rss_mb=max(before.peak_rss_mb, after.peak_rss_mb),
        samples=samples,
        barge_in_stop_ms=stats([v for call in samples if (v := call.barge_in_stop_ms) is not None])
        if barge_in
        else None,
        backchannels=len(said) if said else None,
        backchannel_stops=sum(said) if said else None,
        cpu_by_thread=_cpu_by_thread(before, after, call_minutes),
        **_replies([t for call in samples for t in call.turns]),
    )


def _cpu_by_thread(before: Health, after: Health, call_minutes: float) -> dict[str, float]:
    """Each thread group's CPU over the run per call-minute, largest first (a group's threads
    that ended during the run are left out of it)."""
    if call_minutes <= 0:
        return {}
    used = {
        name: max(0.0, cpu - before.cpu_by_thread.get(name, 0.0))
        for name, cpu in after.cpu_by_thread.items()
    }
    ranked = sorted(used.items(), key=lambda item: -item[1])
    return {name: round(cpu / call_minutes, 2) for name, cpu in ranked if cpu > 0}


def _replies(turns: list[TurnSample]) -> dict[str, Any]:
    """The report's reply figures from its turns."""
    words = [t.reply_words for t in turns if t.reply_words is not None]
    measured = [t for t in turns if t.gaps is not None]
    longest = [t.longest_gap_ms for t in measured if t.longest_gap_ms]
    plans = Counter(t.plan for t in turns if t.plan is not None)
    return {
        "plans": dict(plans.most_common()),
        "reply_words": stats([float(w) for w in words]) if words else None,
        "playback_turns": len(measured),
        "gap_turns": sum(bool(t.gaps) for t in measured),
        "longest_gap_ms": max(longest) if longest else None,
        "over_caller_turns": sum(bool(t.over_caller_ms) for t in measured),
        "filler_turns": sum(bool(t.fillers) for t in turns),
        "cut_turns": sum(bool(t.cut) for t in turns),
    }


def match_records(
    result: CallResult, records: list[dict[str, Any]], clock_offset_s: float
) -> list[TurnSample]:
    """Pair each caller turn with the server's record of it.

    One record per caller turn pairs by order. When the server heard a different number of
    turns (an utterance split in two, a noise taken for speech), each caller turn takes the
    record whose end of speech (wall clock) is nearest to its own, within `MATCH_WINDOW_S`;
    `clock_offset_s` turns the caller's monotonic times into wall-clock times.
    """
    samples: list[TurnSample] = []
    for index, turn in enumerate(result.turns):
        record: dict[str, Any] | None = None
        if len(records) == len(result.turns):
            record = records[index]
        elif records:
            ended = turn.speech_end + clock_offset_s
            nearest = min(records, key=lambda r: abs(float(r.get("started_at", 0.0)) - ended))
            if abs(float(nearest.get("started_at", 0.0)) - ended) <= MATCH_WINDOW_S:
                record = nearest
        timings = {k: float(v) for k, v in (record or {}).get("timings_ms", {}).items()}
        v2v = turn.voice_to_voice_ms
        if v2v is not None and "first_audio" in timings:
            timings[DELIVERY] = round(v2v - timings["first_audio"], 1)
        reply = (record or {}).get("reply_text")
        words = len(str(reply).split()) if reply is not None else None
        cut = bool(record["interrupted"]) if record and "interrupted" in record else None
        fillers = record.get("reply_fillers") if record else None  # None: an older server
        samples.append(TurnSample(v2v, timings, words, cut, plan=_plan(record), fillers=fillers))
    return samples


def _plan(record: dict[str, Any] | None) -> str | None:
    """The effort and tier the controller chose for the turn ("low on fast"), if recorded."""
    decision = (record or {}).get("decision")
    if not isinstance(decision, dict) or "tier" not in decision:
        return None
    return f"{decision.get('effort') or 'no effort'} on {decision['tier']}"


@dataclass
class LoadSweep:
    """`hotline bench --calls 1 --calls 16 ...`: one report per load, run in the order given on
    one server, each load's p95 against the first load's p50 (the ratio issue 26's goals are
    stated in: 16 calls within 1.5x of one call's p50, 24 within 2x). A load's peak RSS is the
    server's peak so far, so a sweep that means to show it runs its loads from the smallest up."""

    reports: list[BenchReport]

    def ratios(self) -> list[float | None]:
        """Each load's voice-to-voice p95 over the first load's p50."""
        base = self.reports[0].voice_to_voice_ms.p50 if self.reports else None
        return [
            round(p95 / base, 2) if base and (p95 := r.voice_to_voice_ms.p95) is not None else None
            for r in self.reports
        ]

    def to_json(self) -> str:
        levels = [asdict(report) for report in self.reports]
        return json.dumps({"levels": levels, "p95_over_first_p50": self.ratios()}, indent=2)

    def table(self) -> Table:
        first = self.reports[0].calls if self.reports else 0
        table = Table(
            "calls",
            "answered",
            "p50 ms",
            "p95 ms",
            f"p95 ÷ p50 at {first}",
            "turns with a gap",
            "replies cut",
            "CPU s per call-minute",
            "peak RSS MB",
            "the controller's plans",
            title="load sweep (one server, in this order)",
        )
        for report, ratio in zip(self.reports, self.ratios(), strict=True):
            heard = report.voice_to_voice_ms.count
            played = report.playback_turns
            gaps = f"{report.gap_turns} of {played}" if played else "-"
            table.add_row(
                str(report.calls),
                f"{heard} of {report.calls * report.turns}",
                _number(report.voice_to_voice_ms.p50),
                _number(report.voice_to_voice_ms.p95),
                _number(ratio, ".2f"),
                gaps,
                str(report.cut_turns),
                _number(report.cpu_s_per_call_minute, ".2f"),
                f"{report.server_peak_rss_mb:.0f}",
                _counted(report.plans) or "-",
            )
        return table

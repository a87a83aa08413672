"""`hotline bench`: N concurrent scripted callers against a running server, timed at the caller.

Voice-to-voice latency runs from the end of each caller utterance to the first audible reply
frame, measured by the caller. Its parts come from the server's turn records (`GET /calls/{id}`,
ms since the end of caller speech as the server detected it). CPU and memory come from the
server's `/healthz` before and after: CPU seconds per call-minute is the server's CPU time spent
during the run divided by the summed duration of the calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

import httpx
import numpy as np
import typer
from rich.console import Console, Group
from rich.logging import RichHandler
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from pipeline.records import STAGES
from voice.audio import PCM, espeak, read_wav
from voice.devtools.turns import CallResult
from voice.server.urls import websocket_url

log = logging.getLogger(__name__)

UTTERANCES = (
    "Please book a table for two people tonight.",
    "What will the weather be like in Paris tomorrow?",
    "Can you tell me when the pharmacy opens on Sunday?",
)
DELIVERY = "delivery"  # derived part: caller-side voice-to-voice minus the server's first_audio
MATCH_WINDOW_S = 2.0  # a server record this close to a caller turn's end of speech is that turn


# -- samples and statistics (pure) --------------------------------------------------------------


@dataclass
class TurnSample:
    """One turn as the caller timed it, with the server's parts when its record was found."""

    voice_to_voice_ms: float | None
    timings_ms: dict[str, float] = field(default_factory=dict)


@dataclass
class CallSample:
    call_id: str
    duration_s: float
    expected_turns: int
    turns: list[TurnSample] = field(default_factory=list)
    error: str | None = None

    @property
    def failed(self) -> bool:
        """The call broke, or a turn of it got no reply."""
        return (
            self.error is not None
            or len(self.turns) < self.expected_turns
            or any(turn.voice_to_voice_ms is None for turn in self.turns)
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
    return Stats(
        len(values),
        percentile(values, 50),
        percentile(values, 95),
        round(max(values), 1) if values else None,
    )


@dataclass
class Health:
    """The server's `/healthz` figures the report needs."""

    cpu_s: float
    rss_mb: float
    peak_rss_mb: float

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Health:
        return cls(float(data["cpu_s"]), float(data["rss_mb"]), float(data["peak_rss_mb"]))


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

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> BenchReport:
        data = json.loads(text)
        data["voice_to_voice_ms"] = Stats(**data["voice_to_voice_ms"])
        data["parts_ms"] = {name: Stats(**part) for name, part in data["parts_ms"].items()}
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
        return Group(self.table(), Text(cost))


def _number(value: float | None, spec: str = ".0f") -> str:
    return "-" if value is None else format(value, spec)


def summarize(
    url: str,
    transport: str,
    turns: int,
    samples: list[CallSample],
    before: Health,
    after: Health,
    wall_s: float,
) -> BenchReport:
    """Aggregate per-call samples and the server's health before and after into a report."""
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
    )


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
        samples.append(TurnSample(v2v, timings))
    return samples


# -- caller speech ------------------------------------------------------------------------------


def _spoken(text: str) -> PCM:
    speech = espeak(text, wpm=150)
    lead, tail = np.zeros(4800, dtype=np.int16), np.zeros(3200, dtype=np.int16)
    return np.concatenate([lead, speech, tail])  # 300 ms before, 200 ms after


def caller_speech(wavs: Sequence[Path] = ()) -> list[PCM]:
    """The utterances callers speak: the given WAV files, or espeak-ng phrases (cached)."""
    if wavs:
        return [read_wav(path) for path in wavs]
    return [_spoken(text) for text in UTTERANCES]


# -- running ------------------------------------------------------------------------------------


def twilio_stream_url(url: str) -> str:
    """The server's Twilio media stream websocket for a server URL."""
    return f"{websocket_url(url.rstrip('/'))}/twilio/stream"


Transport = Literal["webrtc", "twilio"]


class _Bench:
    """One benchmark run: its callers, and the turns they have finished so far."""

    def __init__(self, http: httpx.AsyncClient, url: str, transport: Transport) -> None:
        self.http, self.url, self.transport = http, url, transport
        self.done: list[int] = []  # turns of each finished call
        self.known: set[str] = set()  # calls the server's count must leave out

    async def health(self) -> Health:
        response = await self.http.get("/healthz")
        response.raise_for_status()
        return Health.from_json(response.json())

    async def active_calls(self) -> list[dict[str, Any]]:
        response = await self.http.get("/calls")
        response.raise_for_status()
        calls: list[dict[str, Any]] = response.json()["calls"]
        return calls

    async def place(self, utterances: list[PCM]) -> CallResult:
        if self.transport == "twilio":
            from voice.devtools.twilio_call import place_twilio_call

            return await place_twilio_call(twilio_stream_url(self.url), utterances)
        from voice.devtools.webrtc_caller import place_call

        return await place_call(self.url, utterances)

    async def call(self, utterances: list[PCM], delay_s: float) -> CallSample:
        await asyncio.sleep(delay_s)  # staggered start: part of the script, not a synchronisation
        started = time.monotonic()
        try:
            result = await self.place(utterances)
        except Exception as exc:
            log.warning("bench call failed: %r", exc)
            duration = round(time.monotonic() - started, 3)
            return CallSample("", duration, len(utterances), error=repr(exc))
        sample = CallSample(result.call_id, round(time.monotonic() - started, 3), len(utterances))
        self.known.add(result.call_id)  # from now on counted by the caller, not the server
        self.done.append(len(result.turns))
        records: list[dict[str, Any]] = []
        try:
            response = await self.http.get(f"/calls/{result.call_id}")
            response.raise_for_status()
            records = response.json().get("records", [])
        except httpx.HTTPError as exc:
            log.warning("call %s: no server records: %r", result.call_id, exc)
        sample.turns = match_records(result, records, time.time() - time.monotonic())
        return sample

    async def watch(self, total: int, report: Callable[[int], None]) -> None:
        """Report turns done: finished calls' turns plus the server's count for calls going on."""
        shown = 0
        while True:
            going_on = 0
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                calls = await self.active_calls()
                going_on = sum(int(c["turns"]) for c in calls if c["call_id"] not in self.known)
            count = min(total, sum(self.done) + going_on)
            if count > shown:
                shown = count
                report(shown)
            await asyncio.sleep(0.5)  # a poll interval, not a synchronisation


async def run_bench(
    url: str,
    transport: Transport,
    calls: int,
    turns: int,
    *,
    progress: Callable[[int], None] | None = None,
    stagger_s: float = 0.2,
    wavs: Sequence[Path] = (),
) -> BenchReport:
    """Place `calls` concurrent calls of `turns` turns each and report latency and cost.

    `progress` is called with the number of turns completed so far (of `calls * turns`).
    """
    speech = caller_speech(wavs)
    script = [speech[i % len(speech)] for i in range(turns)]
    async with httpx.AsyncClient(base_url=url.rstrip("/"), timeout=30) as http:
        bench = _Bench(http, url, transport)
        before = await bench.health()
        bench.known = {c["call_id"] for c in await bench.active_calls()}
        watcher = None
        if progress is not None:
            watcher = asyncio.create_task(bench.watch(calls * turns, progress))
        started = time.monotonic()
        try:
            samples = await asyncio.gather(
                *(bench.call(script, i * stagger_s) for i in range(calls))
            )
        finally:
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
        wall_s = time.monotonic() - started
        after = await bench.health()
    if progress is not None:
        progress(min(calls * turns, sum(bench.done)))
    return summarize(url, transport, turns, list(samples), before, after, wall_s)


# -- command ------------------------------------------------------------------------------------


class BenchTransport(StrEnum):
    webrtc = "webrtc"
    twilio = "twilio"


def bench_command(
    url: Annotated[str, typer.Option(help="Server URL")] = "http://127.0.0.1:8080",
    transport: Annotated[
        BenchTransport, typer.Option(help="webrtc (/offer) or twilio (/twilio/stream)")
    ] = BenchTransport.webrtc,
    calls: Annotated[int, typer.Option(min=1, help="Concurrent calls")] = 1,
    turns: Annotated[int, typer.Option(min=1, help="Turns per call")] = 3,
    out: Annotated[Path, typer.Option(help="Where to write the JSON report")] = Path("bench.json"),
    wav: Annotated[
        list[Path] | None,
        typer.Option(help="WAV the callers speak (repeatable; default: espeak-ng phrases)"),
    ] = None,
    stagger: Annotated[float, typer.Option(help="Seconds between call starts")] = 0.2,
) -> None:
    """Benchmark a running server: N concurrent scripted calls, voice-to-voice latency and cost.

    Latency is measured at the caller (end of caller speech to first reply audio); its parts
    come from the server's turn records. Exits 1 when a call failed or a turn got no reply.
    """
    console = Console()
    logging.basicConfig(
        level=logging.WARNING,
        format="%(name)s: %(message)s",
        handlers=[RichHandler(console=console, show_path=False)],
    )
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    kind: Transport = "twilio" if transport is BenchTransport.twilio else "webrtc"
    with Progress(*columns, TimeElapsedColumn(), console=console) as bar:
        task = bar.add_task(f"{kind} turns", total=calls * turns)
        try:
            report = asyncio.run(
                run_bench(
                    url,
                    kind,
                    calls,
                    turns,
                    progress=lambda n: bar.update(task, completed=n),
                    stagger_s=stagger,
                    wavs=wav or (),
                )
            )
        except httpx.HTTPError as exc:
            console.print(f"[red]cannot reach the server at {url}: {exc!r}[/]")
            raise typer.Exit(2) from exc
    console.print(report)
    out.write_text(report.to_json() + "\n")
    console.print(f"report written to {out}")
    if report.failures:
        console.print(f"[red]{report.failures} of {report.calls} calls failed[/]")
        raise typer.Exit(1)

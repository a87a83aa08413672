"""`hotline soak`: many short phone calls in a row against a running server, and its memory.

A developer tool for leaks. Each call plays Twilio's part of a Media Stream with the faithful
Twilio phone of `voice.devtools.phone_caller` (`connected`, `start` with a fresh CallSid,
`seconds` of 20 ms μ-law silence frames in real time, `stop`), one after another; after each, once
the
server has no call in progress, its RSS is read from `/healthz`. What a call leaves behind shows
as a slope: the least-squares MB per call over the calls after the warm-up (the first calls
settle caches and allocator arenas). The server must admit streams without a token: start it
without a stream secret or Twilio auth token (see `voice.transports.phone.tokens`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

import httpx
import numpy as np
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from websockets.asyncio.client import connect
from websockets.exceptions import WebSocketException

from pipeline.transport import SAMPLE_RATE
from voice.cli.client import DEFAULT_URL, TokenOption, UrlOption, auth_headers, explain
from voice.devtools.phone_caller import DEFAULT_CALLEE, DEFAULT_CALLER, TwilioPhone, twilio_sid
from voice.transports.phone.twilio import CALLEE_PARAMETER, CALLER_PARAMETER


class SoakError(Exception):
    """A soak call did not go as a call should (refused, or ended by the server)."""


def mb_per_call(rss_mb: Sequence[float]) -> float:
    """Least-squares slope of RSS (MB) over consecutive calls; 0.0 for fewer than two."""
    if len(rss_mb) < 2:
        return 0.0
    x = np.arange(len(rss_mb), dtype=np.float64)
    y = np.asarray(rss_mb, dtype=np.float64)
    return float(np.sum((x - x.mean()) * (y - y.mean())) / np.sum((x - x.mean()) ** 2))


@dataclass
class SoakReport:
    """The server's RSS in MB before the first call (`idle_mb`) and after each call."""

    url: str
    seconds: float
    warmup: int
    idle_mb: float
    rss_mb: list[float] = field(default_factory=list)
    call_ids: list[str] = field(default_factory=list)

    @property
    def mb_per_call(self) -> float:
        """Growth per call over the calls after the warm-up."""
        return mb_per_call(self.rss_mb[self.warmup :])

    def lines(self) -> list[str]:
        """The report in a few lines of text."""
        rss, after = self.rss_mb, self.rss_mb[self.warmup :]
        if not rss:
            return [f"no calls; RSS idle {self.idle_mb:.1f} MB"]
        every = max(1, len(rss) // 10)
        series = ", ".join(f"{n}: {rss[n - 1]:.1f}" for n in range(every, len(rss) + 1, every))
        first_counted = f"{after[0]:.1f}" if after else "-"
        return [
            f"{len(rss)} calls of {self.seconds:g} s against {self.url}",
            f"RSS MB: idle {self.idle_mb:.1f}, after call 1 {rss[0]:.1f}, after the warm-up "
            f"({self.warmup} calls) {first_counted}, last {rss[-1]:.1f}, "
            f"min {min(after or rss):.1f}, max {max(after or rss):.1f} after the warm-up",
            f"RSS MB after call n: {series}",
            f"slope after the warm-up: {self.mb_per_call:.3f} MB per call "
            f"(least squares over {len(after)} calls)",
        ]


def stream_url(base: str) -> str:
    """The Twilio media stream of a server at the http(s) base URL `base`."""
    scheme, _, rest = base.rstrip("/").partition("://")
    return f"{'wss' if scheme == 'https' else 'ws'}://{rest}/twilio/stream"


async def soak_call(stream: str, seconds: float) -> str:
    """One short call on the Twilio media stream `stream`: `connected`, `start`, `seconds` of
    silence in real time, `stop`. Returns its CallSid; SoakError if the server ends it first."""
    call_sid = twilio_sid("CA")
    numbers = {CALLER_PARAMETER: DEFAULT_CALLER, CALLEE_PARAMETER: DEFAULT_CALLEE}
    async with connect(stream, compression=None, open_timeout=10) as socket:
        phone = TwilioPhone(socket, call_sid, twilio_sid("AC"), numbers)
        await phone.open()
        spoken = phone.say(np.zeros(max(1, round(seconds * SAMPLE_RATE)), dtype=np.int16))
        parts = [asyncio.create_task(phone.run()), asyncio.create_task(phone.listen())]
        ended = asyncio.create_task(phone.hung_up.wait())
        try:
            first: set[asyncio.Future[Any]] = {spoken, ended}
            await asyncio.wait(first, return_when=asyncio.FIRST_COMPLETED)
            for part in parts:
                if part.done():
                    part.result()  # a failure in the phone itself is raised, not hidden
            if not spoken.done():
                why = f"{socket.close_code} {socket.close_reason}".strip()
                raise SoakError(f"call {call_sid}: the server ended it early ({why})")
            await phone.hang_up()
        finally:
            for task in (*parts, ended):
                task.cancel()
            await asyncio.gather(*parts, ended, return_exceptions=True)
    return call_sid


async def settled_rss(http: httpx.AsyncClient, base: str, timeout_s: float = 10.0) -> float:
    """The server's RSS in MB once it has no call in progress (or after `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    while True:
        health = (await http.get(f"{base}/healthz")).raise_for_status().json()
        if health["active_calls"] == 0 or time.monotonic() > deadline:
            return float(health["rss_mb"])
        await asyncio.sleep(0.05)  # polling another process: nothing to wait on here


async def run_soak(
    url: str,
    calls: int,
    *,
    seconds: float = 1.0,
    warmup: int = 20,
    progress: Callable[[int, float], None] | None = None,
    token: str | None = None,
) -> SoakReport:
    """Place `calls` short calls one after another on the server at `url` (http base URL),
    reading its RSS after each; `progress(calls done, RSS MB)` after each."""
    base = url.rstrip("/")
    async with httpx.AsyncClient(timeout=10, headers=auth_headers(token)) as http:
        report = SoakReport(base, seconds, warmup, await settled_rss(http, base))
        for done in range(1, calls + 1):
            report.call_ids.append(await soak_call(stream_url(base), seconds))
            report.rss_mb.append(await settled_rss(http, base))
            if progress is not None:
                progress(done, report.rss_mb[-1])
    return report


def soak_command(
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    calls: Annotated[int, typer.Option(min=2, help="Calls to place, one after another")] = 200,
    warmup: Annotated[int, typer.Option(min=0, help="First calls left out of the slope")] = 20,
    seconds: Annotated[float, typer.Option(min=0.02, help="Silence each call sends")] = 1.0,
) -> None:
    """Soak a running server: N short phone calls in a row, and its RSS after each.

    Reports the server's memory growth in MB per call (least-squares slope after the warm-up):
    a server that keeps nothing heavy of a finished call stays near 0. Its phone streams must
    need no token (no stream secret or Twilio auth token set). Exits 1 when a call fails.
    """
    if calls < warmup + 2:
        raise typer.BadParameter("place at least two calls more than the warm-up")
    console = Console()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), console=console) as bar:
        task = bar.add_task("calls", total=calls)

        def advance(done: int, rss_mb: float) -> None:
            bar.update(task, completed=done, description=f"calls (RSS {rss_mb:.1f} MB)")

        try:
            report = asyncio.run(
                run_soak(url, calls, seconds=seconds, warmup=warmup, progress=advance, token=token)
            )
        except httpx.HTTPError as exc:
            console.print(
                f"[red]soak failed:[/] {explain(exc, url)}", highlight=False, soft_wrap=True
            )
            raise typer.Exit(1) from exc
        except (SoakError, WebSocketException, OSError) as exc:
            console.print(f"[red]soak failed:[/] {exc}")
            raise typer.Exit(1) from exc
    for line in report.lines():
        console.print(line)

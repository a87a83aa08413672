"""`hotline bench`: N concurrent scripted callers against a running server, timed at the caller.

Voice-to-voice latency runs from the end of each caller utterance to the first audible reply
frame, measured by the caller. Its parts come from the server's turn records (`GET /calls/{id}`,
ms since the end of caller speech as the server detected it). CPU and memory come from the
server's `/healthz` before and after: CPU seconds per call-minute is the server's CPU time spent
during the run divided by the summed duration of the calls. The figures and their tables are
in `voice.devtools.bench_report`.

`--transport sip` calls the server's SIP port (`--sip-port`, on the URL's host: the server runs
with `HOTLINE_SIP__ENABLED=true`, and must allow this machine, `HOTLINE_SIP__ALLOW`) with
`voice.devtools.sip_caller`; each caller's unique From user finds its call in `GET /calls`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx
import numpy as np

from voice.audio import PCM, espeak, read_wav
from voice.cli.client import auth_headers
from voice.devtools.bench_report import (
    BenchReport,
    CallSample,
    Health,
    match_records,
    summarize,
)
from voice.devtools.playback import playback
from voice.devtools.turns import CallResult
from voice.server.urls import websocket_url

log = logging.getLogger(__name__)

UTTERANCES = (
    "Please book a table for two people tonight.",
    "What will the weather be like in Paris tomorrow?",
    "Can you tell me when the pharmacy opens on Sunday?",
)
BACKCHANNEL = "Okay."  # what `--backchannel` has the caller say into a reply
# How often the progress display asks the server how many turns its calls are at. The server's
# CPU is what the bench measures: `GET /calls` every 0.5 s cost it 0.12 CPU-seconds a minute
# (idle: 0.33), which a one-call run charged to its single call-minute.
WATCH_S = 2.0


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


Transport = Literal["webrtc", "twilio", "sip"]
SIP_PORT = 5060


async def sip_calls(http: httpx.AsyncClient, caller: str) -> list[str]:
    """The server's ids of the SIP calls from `caller` (the From user) that its `GET /calls` and
    `GET /calls/ended` list now."""
    found: list[str] = []
    for path in ("/calls", "/calls/ended?limit=200"):
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, TypeError):
            response = await http.get(path)
            response.raise_for_status()
            for call in response.json()["calls"]:
                if call.get("caller") == caller and call.get("transport") == "sip":
                    found.append(str(call["call_id"]))
    return found


async def sip_call_id(
    http: httpx.AsyncClient, caller: str, within_s: float = 10.0, known: Collection[str] = ()
) -> str | None:
    """The server's id of the SIP call from `caller` (a unique From user, or one whose `known`
    earlier calls are left out); None if not listed within `within_s`."""
    deadline = time.monotonic() + within_s
    while True:
        new = [call_id for call_id in await sip_calls(http, caller) if call_id not in known]
        if new:
            return new[0]
        if time.monotonic() >= deadline:
            return None
        await asyncio.sleep(0.2)  # a poll interval, not a synchronisation


class _Bench:
    """One benchmark run: its callers, and the turns they have finished so far."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        url: str,
        transport: Transport,
        sip_port: int = SIP_PORT,
        barge_in_after_ms: float | None = None,
        backchannel: bool = False,
        token: str | None = None,
        line_noise_dbfs: float | None = None,
    ) -> None:
        self.http, self.url, self.transport, self.sip_port = http, url, transport, sip_port
        self.token = token  # the API token: `http` sends it too
        self.line_noise_dbfs = line_noise_dbfs  # white noise on the callers' lines (twilio)
        self.barge_in_after_ms = barge_in_after_ms  # the last turn cuts in this long into a reply
        self.backchannel = backchannel  # that last "turn" is an "okay", not a turn
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

            return await place_twilio_call(
                twilio_stream_url(self.url),
                utterances,
                barge_in_after_ms=self.barge_in_after_ms,
                line_noise_dbfs=self.line_noise_dbfs,
            )
        if self.transport == "sip":
            from voice.devtools.sip_caller import place_sip_call

            host = urlsplit(self.url).hostname or "127.0.0.1"
            result = await place_sip_call(
                host, self.sip_port, utterances, barge_in_after_ms=self.barge_in_after_ms
            )
            if result.rejected is not None:
                raise RuntimeError(f"SIP call {result.sip_call_id}: {result.rejected}")
            result.call_id = await sip_call_id(self.http, result.caller) or result.call_id
            return result
        from voice.devtools.webrtc_caller import place_call

        return await place_call(
            self.url, utterances, barge_in_after_ms=self.barge_in_after_ms, token=self.token
        )

    async def call(self, utterances: list[PCM], delay_s: float) -> CallSample:
        await asyncio.sleep(delay_s)  # staggered start: part of the script, not a synchronisation
        started = time.monotonic()
        try:
            result = await self.place(utterances)
        except Exception as exc:
            log.warning("bench call failed: %r", exc)
            duration = round(time.monotonic() - started, 3)
            return CallSample("", duration, len(utterances), error=repr(exc))
        expected = len(utterances) - self.backchannel
        # The reply played on after the "okay" (heard at the caller), or it never came back.
        resumed = len(result.turns) > expected and result.turns[expected].reply_start is not None
        if self.backchannel:
            result.turns = result.turns[:expected]  # the "okay" is not a turn of the call
        sample = CallSample(result.call_id, round(time.monotonic() - started, 3), expected)
        sample.barge_in = self.barge_in_after_ms is not None and not self.backchannel
        sample.barge_in_stop_ms = result.barge_in_stop_ms
        self.known.add(result.call_id)  # from now on counted by the caller, not the server
        self.done.append(len(result.turns))
        records = await self._records(result.call_id, len(result.turns))
        sample.turns = match_records(result, records, time.time() - time.monotonic())
        fed = getattr(result, "fed", None)  # the emulated phone's playout: Twilio only
        if fed:
            cut = [bool(turn.cut) for turn in sample.turns]
            played = playback(result.turns, getattr(result, "playback", []), fed, cut)
            for turn, heard in zip(sample.turns, played, strict=True):
                if heard is not None:
                    turn.gaps, turn.longest_gap_ms = heard.gaps, heard.longest_gap_ms
                    turn.over_caller_ms = heard.over_caller_ms
            if self.barge_in_after_ms is not None and len(sample.turns) >= 2:
                sample.turns[-2].over_caller_ms = None  # the barge-in: over the reply on purpose
        if self.backchannel:  # silenced by it, or answered as a turn of its own
            # Not the record's `interrupted`: the caller's hang-up also cuts a reply that
            # resumed (under load a gap between sentences passes for its end).
            sample.backchannel_stopped = not resumed or len(records) > expected
        return sample

    async def _records(self, call_id: str, heard: int, within_s: float = 10.0) -> list[Any]:
        """The server's turn records of the call, once it holds one per turn the caller heard
        (a turn's record is written when its reply ends, which may be just after the caller
        hung up), or what it holds after `within_s`."""
        records: list[Any] = []
        deadline = time.monotonic() + within_s
        while True:
            try:
                response = await self.http.get(f"/calls/{call_id}")
                response.raise_for_status()
                records = response.json().get("records", [])
            except httpx.HTTPError as exc:
                log.warning("call %s: no server records: %r", call_id, exc)
                return records
            if len(records) >= heard or time.monotonic() >= deadline:
                return records
            await asyncio.sleep(0.2)  # a poll interval, not a synchronisation

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
            await asyncio.sleep(WATCH_S)  # a poll interval, not a synchronisation


def _check_script(
    transport: Transport,
    turns: int,
    barge_in_after_ms: float | None,
    backchannel_after_ms: float | None,
    line_noise_dbfs: float | None,
) -> None:
    """ValueError for a script no caller can follow."""
    if barge_in_after_ms is not None and turns < 2:
        raise ValueError("a barge-in needs a reply to cut into: 2 turns or more")
    if barge_in_after_ms is not None and backchannel_after_ms is not None:
        raise ValueError("a call's last turn is a barge-in or a backchannel, not both")
    if line_noise_dbfs is not None and transport != "twilio":
        raise ValueError("line noise is only simulated on twilio calls")


async def run_bench(
    url: str,
    transport: Transport,
    calls: int,
    turns: int,
    *,
    progress: Callable[[int], None] | None = None,
    stagger_s: float = 0.2,
    wavs: Sequence[Path] = (),
    sip_port: int = SIP_PORT,
    barge_in_after_ms: float | None = None,
    backchannel_after_ms: float | None = None,
    token: str | None = None,
    line_noise_dbfs: float | None = None,
) -> BenchReport:
    """Place `calls` concurrent calls of `turns` turns each and report latency and cost (with
    the server's API token, if it has one).

    `progress` is called with the number of turns completed so far (of `calls * turns`).
    SIP calls go to `sip_port` on the URL's host. With `barge_in_after_ms`, each call's last
    turn is spoken that long after the reply before it began, and the report says how soon
    that reply went quiet at the caller (needs 2 turns or more). With `backchannel_after_ms`,
    the caller says "Okay." that long into each call's last reply, and the report counts the
    replies it stopped for good (a reply shorter than that is no test of it). With
    `line_noise_dbfs` (twilio only), the callers' lines carry white noise of that RMS.
    """
    _check_script(transport, turns, barge_in_after_ms, backchannel_after_ms, line_noise_dbfs)
    speech = caller_speech(wavs)
    script = [speech[i % len(speech)] for i in range(turns)]
    if backchannel_after_ms is not None:
        script.append(_spoken(BACKCHANNEL))
        barge_in_after_ms = backchannel_after_ms  # said into the reply as a barge-in would be
    headers = auth_headers(token)
    async with httpx.AsyncClient(base_url=url.rstrip("/"), timeout=30, headers=headers) as http:
        backchannel = backchannel_after_ms is not None
        bench = _Bench(
            http, url, transport, sip_port, barge_in_after_ms, backchannel, token, line_noise_dbfs
        )
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
    barge_in = barge_in_after_ms is not None and backchannel_after_ms is None
    return summarize(url, transport, turns, list(samples), before, after, wall_s, barge_in)

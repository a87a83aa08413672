"""Blocking model work on a few threads, the urgent jobs first.

Many calls share one voice (and one recognizer) with fewer threads than calls. When callers
talk at once, a job that the caller is waiting on right now (the first chunk of a reply) should
not queue behind jobs whose result is needed only seconds later (the next sentences, which will
play after the current one). `UrgentFirst` runs at most `workers` jobs at once; waiting jobs
start urgent first, in arrival order within each kind. A job cancelled while it waits never
runs; one already running finishes on its thread and keeps its slot until it does.

A job may become urgent while it waits: a transcription started speculatively at the caller's
pause is urgent once the turn really ended there. Such a job carries an `Urgency` that the
caller promotes, or that promotes itself at a time (`urgent_in`: a reply's later sentence
once the audio ahead of it is about to run out, so that it does not wait behind other calls'
first chunks until its own caller hears a gap); the line is a short list (one entry per waiting
call), searched at each start.

Urgent work need not wait for a worker to finish a long job that is needed only later: a pool
may keep `lane` more threads for urgent jobs alone. An urgent job takes a lane before a shared
worker, so while every shared worker is busy with a later sentence, a first chunk still starts
at once and the OS shares the cores between them; a job promoted while it waits starts on a
free lane. Later jobs never take a lane. (Running the shared workers at a lower OS priority
instead was tried: under load the later sentences then came too late, and replies ran dry.)
"""

from __future__ import annotations

import asyncio
import ctypes
import itertools
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")


@dataclass
class Urgency:
    """A waiting job's rank, which its owner may raise while it waits."""

    urgent: bool = False
    _timer: asyncio.TimerHandle | None = field(default=None, repr=False, compare=False)
    # Called once promoted (the pool it waits in: a free lane may take it now).
    _on_promote: Callable[[], None] | None = field(default=None, repr=False, compare=False)

    def promote(self) -> None:
        self.urgent = True
        if self._on_promote is not None:
            self._on_promote()

    def settle(self) -> None:
        """The job is done (or no longer wanted): no promotion is due any more."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def urgent_in(seconds: float) -> Urgency:
    """A rank that turns urgent in `seconds` (at once if that is not in the future): a job
    whose result is needed by a known time, such as a reply's next sentence, needed when the
    audio queued before it runs out. Call `settle()` once the job is done."""
    if seconds <= 0:
        return Urgency(True)
    urgency = Urgency()
    urgency._timer = asyncio.get_running_loop().call_later(seconds, urgency.promote)
    return urgency


_PR_SET_NAME = 15  # linux/prctl.h


def name_os_thread() -> None:
    """Give the calling thread's Python name to the OS, so that `top -H`, `/proc` and profilers
    tell the worker threads apart (Python 3.11 leaves them all with the process's name). Linux
    keeps 15 bytes of it; elsewhere this does nothing."""
    if sys.platform.startswith("linux"):
        name = threading.current_thread().name.encode()[:15]
        ctypes.CDLL(None).prctl(_PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)


class UrgentFirst:
    """A thread pool whose waiting line lets urgent jobs ahead (see the module docstring)."""

    def __init__(self, workers: int, name: str, lane: int = 0) -> None:
        self._executor = ThreadPoolExecutor(
            workers, thread_name_prefix=name, initializer=name_os_thread
        )
        self._lane = ThreadPoolExecutor(
            max(1, lane), thread_name_prefix=f"{name}-lane", initializer=name_os_thread
        )
        self._free = {False: workers, True: lane}  # free threads: shared, lane
        self._waiting: list[tuple[Urgency, int, asyncio.Future[bool]]] = []
        self._order = itertools.count()

    @property
    def waiting(self) -> int:
        return sum(1 for *_, turn in self._waiting if not turn.done())

    async def run(self, job: Callable[[], T], urgent: bool | Urgency = False) -> T:
        """`job()` on a worker thread, once a slot is free and no more urgent job waits."""
        loop = asyncio.get_running_loop()
        rank = urgent if isinstance(urgent, Urgency) else Urgency(urgent)
        lane = self._take(rank)
        if lane is None:
            turn: asyncio.Future[bool] = loop.create_future()
            self._waiting.append((rank, next(self._order), turn))
            rank._on_promote = self._promoted
            try:
                lane = await turn  # a finishing job hands its slot over
            except asyncio.CancelledError:
                if turn.done() and not turn.cancelled():
                    self._release(turn.result())  # handed a slot, but no longer wanted
                raise
            finally:
                rank._on_promote = None
        running = (self._lane if lane else self._executor).submit(job)
        running.add_done_callback(lambda _: loop.call_soon_threadsafe(self._release, lane))
        return await asyncio.wrap_future(running)

    def _take(self, rank: Urgency) -> bool | None:
        """A free slot for a job arriving now (True: the lane), or None: it waits in line."""
        if rank.urgent and self._free[True] > 0:
            self._free[True] -= 1
            return True
        if self._free[False] > 0 and not self.waiting:
            self._free[False] -= 1
            return False
        return None

    def _release(self, lane: bool) -> None:
        """A slot came free: to the first job in line that may take it."""
        self._waiting = [entry for entry in self._waiting if not entry[2].done()]  # cancelled
        allowed = [entry for entry in self._waiting if entry[0].urgent or not lane]
        if allowed:
            first = min(allowed, key=lambda entry: (not entry[0].urgent, entry[1]))
            self._waiting.remove(first)
            first[2].set_result(lane)
            return
        self._free[lane] += 1

    def _promoted(self) -> None:
        """A waiting job turned urgent: a free lane takes it (the first urgent one in line)."""
        if self._free[True] > 0:
            self._free[True] -= 1
            self._release(True)

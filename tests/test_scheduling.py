"""`UrgentFirst`: a few worker threads, urgent jobs let ahead of the waiting line."""

from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path

import pytest

from pipeline.scheduling import Urgency, UrgentFirst, urgent_in


class Jobs:
    """Jobs that record the order they ran in; the first one blocks until released."""

    def __init__(self) -> None:
        self.ran: list[str] = []
        self.running = 0
        self.most_at_once = 0
        self.release = threading.Event()
        self.blocking = threading.Event()
        self._lock = threading.Lock()

    def job(self, name: str, block: bool = False) -> str:
        with self._lock:
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        if block:
            self.blocking.set()
            self.release.wait(10)
        with self._lock:
            self.ran.append(name)
            self.running -= 1
        return name


async def test_urgent_jobs_go_ahead_of_those_already_waiting() -> None:
    pool, jobs = UrgentFirst(1, "test"), Jobs()
    first = asyncio.create_task(pool.run(lambda: jobs.job("first", block=True)))
    await asyncio.to_thread(jobs.blocking.wait, 10)
    later = [asyncio.create_task(pool.run(lambda n=n: jobs.job(n))) for n in ("a", "b")]
    await asyncio.sleep(0)  # let them join the line before the urgent one
    urgent = asyncio.create_task(pool.run(lambda: jobs.job("urgent"), urgent=True))
    await asyncio.sleep(0)
    assert pool.waiting == 3
    jobs.release.set()
    assert await asyncio.gather(first, *later, urgent) == ["first", "a", "b", "urgent"]
    assert jobs.ran == ["first", "urgent", "a", "b"]


async def test_a_job_cancelled_while_waiting_never_runs_and_frees_its_place() -> None:
    pool, jobs = UrgentFirst(1, "test"), Jobs()
    first = asyncio.create_task(pool.run(lambda: jobs.job("first", block=True)))
    await asyncio.to_thread(jobs.blocking.wait, 10)
    dropped = asyncio.create_task(pool.run(lambda: jobs.job("dropped"), urgent=True))
    kept = asyncio.create_task(pool.run(lambda: jobs.job("kept")))
    await asyncio.sleep(0)
    dropped.cancel()  # barge-in: the synthesis is no longer wanted
    jobs.release.set()
    assert await kept == "kept" and await first == "first"
    assert dropped.cancelled() and jobs.ran == ["first", "kept"]
    assert await pool.run(lambda: jobs.job("after")) == "after"  # no slot was lost


async def test_no_more_than_the_workers_run_at_once() -> None:
    pool, jobs = UrgentFirst(2, "test"), Jobs()
    names = [str(n) for n in range(12)]
    done = await asyncio.gather(
        *(pool.run(lambda n=n: jobs.job(n), urgent=int(n) % 3 == 0) for n in names)
    )
    assert sorted(done) == sorted(names) and sorted(jobs.ran) == sorted(names)
    assert jobs.most_at_once <= 2


async def test_a_waiting_job_promoted_to_urgent_goes_ahead() -> None:
    pool, jobs = UrgentFirst(1, "test"), Jobs()
    first = asyncio.create_task(pool.run(lambda: jobs.job("first", block=True)))
    await asyncio.to_thread(jobs.blocking.wait, 10)
    early = Urgency()  # a transcription begun at a pause
    queued = [
        asyncio.create_task(pool.run(lambda: jobs.job("other"))),
        asyncio.create_task(pool.run(lambda: jobs.job("early"), early)),
    ]
    await asyncio.sleep(0)
    early.promote()  # the turn ended at that pause
    jobs.release.set()
    assert await asyncio.gather(first, *queued) == ["first", "other", "early"]
    assert jobs.ran == ["first", "early", "other"]


async def test_a_job_needed_by_a_time_goes_ahead_of_urgent_ones_that_came_after_it_then() -> None:
    """A reply's later sentence (needed when the audio before it runs out) waits behind other
    calls' first chunks until its time comes, then goes ahead of those that came after it."""
    pool, jobs = UrgentFirst(1, "test"), Jobs()
    first = asyncio.create_task(pool.run(lambda: jobs.job("first", block=True)))
    await asyncio.to_thread(jobs.blocking.wait, 10)
    soon = urgent_in(0.05)
    later = urgent_in(60.0)
    queued = [
        asyncio.create_task(pool.run(lambda: jobs.job("later sentence"), later)),
        asyncio.create_task(pool.run(lambda: jobs.job("next sentence"), soon)),
    ]
    await asyncio.sleep(0)
    assert not soon.urgent
    passed = asyncio.Event()  # a timer of the same loop, due just after `soon`'s
    asyncio.get_running_loop().call_later(0.06, passed.set)
    await passed.wait()
    assert soon.urgent and not later.urgent
    queued.append(asyncio.create_task(pool.run(lambda: jobs.job("first chunk"), urgent=True)))
    await asyncio.sleep(0)
    jobs.release.set()
    await asyncio.gather(first, *queued)
    assert jobs.ran == ["first", "next sentence", "first chunk", "later sentence"]
    for urgency in (soon, later):
        urgency.settle()
    assert not later.urgent  # settled: its timer will not fire


async def test_a_job_already_due_is_urgent_at_once() -> None:
    assert urgent_in(0.0).urgent and urgent_in(-1.0).urgent


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the OS name of a thread: Linux")
async def test_the_workers_carry_their_pool_name_in_the_os() -> None:
    """`top -H`, /proc and the bench's CPU by thread tell the pools apart by it."""
    pool = UrgentFirst(2, "tts")

    def names() -> tuple[str, str]:
        os_name = Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text()
        return os_name.strip(), threading.current_thread().name

    # Which worker runs which job is the OS's choice (under load one may run all four), so
    # each job checks the name of the thread it ran on.
    seen = await asyncio.gather(*(pool.run(names) for _ in range(4)))
    assert all(os_name == name for os_name, name in seen), seen
    assert {name for name, _ in seen} <= {"tts_0", "tts_1"}


async def test_an_urgent_job_starts_on_the_lane_while_the_workers_run_later_ones() -> None:
    """A first chunk does not wait for another call's long later sentence to finish."""
    pool, jobs = UrgentFirst(1, "test", lane=1), Jobs()
    first = asyncio.create_task(pool.run(lambda: jobs.job("later sentence", block=True)))
    await asyncio.to_thread(jobs.blocking.wait, 10)
    waiting = asyncio.create_task(pool.run(lambda: jobs.job("next later sentence")))
    assert await pool.run(lambda: jobs.job("first chunk"), urgent=True) == "first chunk"
    assert jobs.ran == ["first chunk"] and pool.waiting == 1  # the later one never took the lane
    jobs.release.set()
    assert await asyncio.gather(first, waiting) == ["later sentence", "next later sentence"]
    assert await pool.run(lambda: jobs.job("urgent again"), urgent=True) == "urgent again"


async def test_a_job_promoted_while_it_waits_starts_on_the_free_lane() -> None:
    pool, jobs = UrgentFirst(1, "test", lane=1), Jobs()
    first = asyncio.create_task(pool.run(lambda: jobs.job("first", block=True)))
    await asyncio.to_thread(jobs.blocking.wait, 10)
    soon = Urgency()  # a later sentence whose audio ahead is about to run out
    promoted = asyncio.create_task(pool.run(lambda: jobs.job("promoted"), soon))
    await asyncio.sleep(0)
    assert pool.waiting == 1
    soon.promote()
    assert await promoted == "promoted" and jobs.ran == ["promoted"]
    jobs.release.set()
    assert await first == "first"


async def test_the_lane_adds_to_the_workers_and_no_more() -> None:
    pool, jobs = UrgentFirst(1, "test", lane=1), Jobs()
    names = [f"urgent {n}" for n in range(4)] + ["later"]
    done = await asyncio.gather(
        *(pool.run(lambda n=n: jobs.job(n), urgent=n != "later") for n in names)
    )
    assert done == names and sorted(jobs.ran) == sorted(names) and jobs.most_at_once <= 2

"""Waiting on a condition with a deadline: the one poll of the test suite.

`await until(check, "what it waits for")` calls `check()` (plain or async) until it returns a
truthy value and returns that value. At the deadline it raises `PollTimeout`, an
`AssertionError` that says what was awaited, for how long and what `check()` last returned (or
raised), so a failing test shows what it saw instead of a bare timeout. `wait_until` is the same
for code that is not async (a thread, a synchronous test).

An exception raised by `check()` propagates at once, unless its type is in `ignoring`
(e.g. `httpx.TransportError` while a server restarts): then it is kept as what was last seen.
`describe`, when given, is called at the deadline and shown instead (for a check that returns a
bare `False`: the responses, counts or log lines that explain it).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, overload

T = TypeVar("T")

EVERY_S = 0.05


class PollTimeout(AssertionError):
    """A condition that did not hold by its deadline; carries what the check last returned."""

    def __init__(self, what: str, within_s: float, last: object) -> None:
        shown = repr(last)
        if len(shown) > 2000:
            shown = shown[:1000] + " … " + shown[-1000:]
        super().__init__(f"{what}: not within {within_s:g} s; last saw: {shown}")
        self.what = what
        self.last = last


@overload
async def until(
    check: Callable[[], Awaitable[T | None]],
    what: str,
    within_s: float = ...,
    every_s: float = ...,
    ignoring: tuple[type[BaseException], ...] = ...,
    describe: Callable[[], object] | None = ...,
) -> T: ...


@overload
async def until(
    check: Callable[[], T | None],
    what: str,
    within_s: float = ...,
    every_s: float = ...,
    ignoring: tuple[type[BaseException], ...] = ...,
    describe: Callable[[], object] | None = ...,
) -> T: ...


async def until(
    check: Callable[[], object],
    what: str,
    within_s: float = 10.0,
    every_s: float = EVERY_S,
    ignoring: tuple[type[BaseException], ...] = (),
    describe: Callable[[], object] | None = None,
) -> object:
    """The first truthy value of `check()` (awaited if it is awaitable); `PollTimeout` with the
    last value (or `describe()`) after `within_s`."""
    poll = _Poll(what, within_s, describe)
    while True:
        last: object
        try:
            last = check()
            if inspect.isawaitable(last):
                last = await last
        except ignoring as error:
            last = error
        else:
            if last:
                return last
        poll.saw(last)
        await asyncio.sleep(every_s)


def wait_until(
    check: Callable[[], T | None],
    what: str,
    within_s: float = 10.0,
    every_s: float = EVERY_S,
    ignoring: tuple[type[BaseException], ...] = (),
    describe: Callable[[], object] | None = None,
) -> T:
    """`until` for synchronous code: blocks the calling thread between checks."""
    poll = _Poll(what, within_s, describe)
    while True:
        try:
            value = check()
        except ignoring as error:
            poll.saw(error)
        else:
            if value:
                return value
            poll.saw(value)
        time.sleep(every_s)


class _Poll:
    """One wait's deadline and what it last saw; `saw` raises `PollTimeout` once it is past."""

    def __init__(self, what: str, within_s: float, describe: Callable[[], object] | None) -> None:
        self.what, self.within_s, self.describe = what, within_s, describe
        self.deadline = time.monotonic() + within_s

    def saw(self, last: object) -> None:
        if time.monotonic() >= self.deadline:
            shown = self.describe() if self.describe is not None else last
            raise PollTimeout(self.what, self.within_s, shown)


class LoopLag:
    """How long a loaded machine kept this event loop from running: a ticker sleeping `tick_s`
    adds up how late each wake-up came (beyond the timer's own ~1 ms). A bound on work done on
    this loop allows for it: derived from the run, not guessed.

    `async with LoopLag() as lag: ...` then `lag.total_s`."""

    def __init__(self, tick_s: float = 0.02, slack_s: float = 0.002) -> None:
        self.tick_s, self.slack_s = tick_s, slack_s
        self.total_s = 0.0
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LoopLag:
        self._task = asyncio.create_task(self._tick())
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _tick(self) -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(self.tick_s)
            self.total_s += max(0.0, time.monotonic() - before - self.tick_s - self.slack_s)

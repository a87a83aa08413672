"""Waiting for a playback position: what both transports offer the conversation.

A transport counts reply samples as they are queued, sent and played; `wait_played(position)`
and `wait_sent(position)` resolve with the monotonic time the position was reached, and fail
with `PlaybackCleared` when the reply is cleared (barge-in) or the call ends first.
"""

from __future__ import annotations

import asyncio
import time

from pipeline.transport import PlaybackCleared


class PositionWaiters:
    """Futures for positions (in samples) not reached yet."""

    def __init__(self) -> None:
        self._waiting: list[tuple[int, asyncio.Future[float]]] = []

    def add(self, position: int) -> asyncio.Future[float]:
        """A future resolved once `reach` passes `position`."""
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._waiting.append((position, future))
        return future

    def reach(self, reached: int) -> None:
        """Everything up to `reached` has happened: resolve those waiters, now."""
        now = time.monotonic()
        still = []
        for position, future in self._waiting:
            if position > reached:
                still.append((position, future))
            elif not future.done():
                future.set_result(now)
        self._waiting = still

    def waiting_for(self, position: int) -> bool:
        """Whether someone still waits for exactly `position`."""
        return any(p == position and not f.done() for p, f in self._waiting)

    def fail(self, why: str = "playback cleared") -> None:
        """The positions will never be reached: every waiter gets `PlaybackCleared`."""
        for _, future in self._waiting:
            if not future.done():
                future.set_exception(PlaybackCleared(why))
        self._waiting.clear()

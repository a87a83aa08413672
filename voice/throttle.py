"""Budgets for what a flood could multiply: token buckets, bounded tables of the recently seen,
and log lines (`LogThrottle`: the first of each kind, then now and then, saying how many were
left out). Pure bookkeeping with an injected clock; the SIP endpoint's limits per source, its
refusals inside calls, and the console's sign-in refusals all count with these."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar

Clock = Callable[[], float]
K = TypeVar("K")
V = TypeVar("V")


class TokenBucket:
    """`burst` tokens, refilled at `rate` per second; one per message."""

    __slots__ = ("burst", "rate", "stamp", "tokens")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate, self.burst = rate, burst
        self.tokens, self.stamp = burst, now

    def ready(self, now: float) -> bool:
        """Whether a token is there (none is taken)."""
        if now > self.stamp:
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now
        return self.tokens >= 1.0

    def take(self, now: float) -> bool:
        if not self.ready(now):
            return False
        self.tokens -= 1.0
        return True


def remember(table: OrderedDict[K, V], key: K, value: V, cap: int) -> None:
    """Put `key` in `table` as its most recent entry; past `cap` entries the oldest go."""
    table[key] = value
    table.move_to_end(key)
    while len(table) > cap:
        table.popitem(last=False)


class LogThrottle:
    """For log lines a flood could multiply: at most one per key every `every_s`, and at most
    `burst` in all (refilled at `per_s` a second); `held_back` counts the lines left out."""

    def __init__(
        self,
        every_s: float = 10.0,
        per_s: float = 1.0,
        burst: float = 10.0,
        max_keys: int = 1024,
        clock: Clock = time.monotonic,
    ) -> None:
        self.every_s = every_s
        self.max_keys = max_keys
        self.clock = clock
        self._last: OrderedDict[str, float] = OrderedDict()
        self._held: OrderedDict[str, int] = OrderedDict()  # per key, since its last line
        self._bucket = TokenBucket(per_s, burst, clock())
        self.held_back = 0

    def allow(self, key: str) -> bool:
        now = self.clock()
        last = self._last.get(key)
        if (last is not None and now - last < self.every_s) or not self._bucket.take(now):
            self.held_back += 1
            remember(self._held, key, self._held.get(key, 0) + 1, self.max_keys)
            return False
        remember(self._last, key, now, self.max_keys)
        return True

    def warn(self, logger: logging.Logger, key: str, message: str, *args: object) -> None:
        """`logger.warning(message, *args)` if `key` may log now, saying how many lines of
        that key were left out since its last one."""
        if not self.allow(key):
            return
        left_out = self._held.pop(key, 0)
        more = f" ({left_out} more like it left out)" if left_out else ""
        logger.warning(message + more, *args)

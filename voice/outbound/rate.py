"""Calls per second, per provider: a token bucket each, holding one second's worth of calls
(at least one). Providers limit how fast an account may place calls (Twilio queues what is
beyond, Telnyx and Vonage refuse it); Hotline refuses first, with how long to wait."""

from __future__ import annotations

import math
import time

from voice.throttle import Clock, TokenBucket


class CallRate:
    """The calls-per-second budget of each provider, on this worker."""

    def __init__(self, calls_per_second: float, clock: Clock = time.monotonic) -> None:
        self.calls_per_second = calls_per_second
        self._clock = clock
        self._buckets: dict[str, TokenBucket] = {}

    def take(self, provider: str) -> float | None:
        """Take a call from `provider`'s budget: None if there was one, else how many seconds
        until there is."""
        now = self._clock()
        bucket = self._buckets.get(provider)
        if bucket is None:
            burst = max(1.0, self.calls_per_second)
            bucket = self._buckets[provider] = TokenBucket(self.calls_per_second, burst, now)
        if bucket.take(now):
            return None
        return (1.0 - bucket.tokens) / self.calls_per_second

    @staticmethod
    def retry_after(wait_s: float) -> str:
        """`wait_s` as a Retry-After value (whole seconds, at least one)."""
        return str(max(1, math.ceil(wait_s)))

"""Calls per second, per provider: a token bucket each, holding one second's worth of calls
(at least one). Providers limit how fast an account may place calls (Twilio queues what is
beyond, Telnyx and Vonage refuse it); Hotline refuses first, with how long to wait.

`ClusterCallRate` keeps each provider's bucket in Redis, so the budget is the cluster's, shared
by every worker (the account's limit is): one Lua script per call (GCRA: the bucket as the
time its last call's token is paid off, `{p}:outbound:rate:<provider>`), on the workers'
clocks (assumed to agree, as the webhook outbox assumes). While Redis cannot be reached, each
worker falls back to its own `CallRate`."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

import redis.asyncio as aioredis

from voice.cluster.store import REDIS_UNREACHABLE, text
from voice.throttle import Clock, TokenBucket

log = logging.getLogger(__name__)


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


# KEYS: the provider's bucket. ARGV: now, seconds per call, burst (calls), '1' to take one.
# The bucket is the time at which every call taken so far is paid off ("theoretical arrival
# time"); a call may go while that is at most `burst` calls ahead of now. Returns the wait in
# seconds as text ('0': taken, or there is one to take).
_GCRA = """
local now, interval, burst = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
local wait = tat + interval - now - burst * interval
if wait > 0 then return tostring(wait) end
if ARGV[4] == '1' then
  local paid = tat + interval
  redis.call('SET', KEYS[1], tostring(paid), 'PX', math.ceil((paid - now) * 1000) + 1000)
end
return '0'
"""


class ClusterCallRate:
    """The calls-per-second budget of each provider, shared by the workers of one Redis."""

    def __init__(
        self,
        redis: aioredis.Redis,
        prefix: str,
        calls_per_second: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.calls_per_second = calls_per_second
        self._prefix, self._clock = prefix, clock
        self._script = redis.register_script(_GCRA)
        self._local = CallRate(calls_per_second)  # while Redis is away
        self._burst = max(1.0, calls_per_second)

    def _key(self, provider: str) -> str:
        return f"{{{self._prefix}}}:outbound:rate:{provider}"

    async def take(self, provider: str) -> float | None:
        """Take a call from `provider`'s budget: None if there was one, else how many seconds
        until there is."""
        return await self._ask(provider, take=True)

    async def wait_s(self, provider: str) -> float:
        """Seconds until `provider`'s budget has a call (0: now), taking none."""
        return await self._ask(provider, take=False) or 0.0

    async def _ask(self, provider: str, take: bool) -> float | None:
        args = [repr(self._clock()), repr(1.0 / self.calls_per_second), repr(self._burst)]
        args.append("1" if take else "0")
        try:
            said = await self._script(keys=[self._key(provider)], args=args)
        except REDIS_UNREACHABLE as exc:
            log.warning("outbound: calls per second counted on this worker only: %s", exc)
            return self._local.take(provider) if take else None
        wait = float(text(said))
        return wait if wait > 0 else None

    retry_after = staticmethod(CallRate.retry_after)

"""The state every part of `CallRegistry` shares: the Redis client, this worker's calls, the
outbox of writes, and whether Redis answered last (`_up`, `_down`).

`CallRegistry` (voice.cluster.registry) is assembled from parts that each keep one concern:
the heartbeat and the reaper (voice.cluster.liveness), control commands between workers
(voice.cluster.control), and, in its own module, admission, writes and reads.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import deque
from typing import Any

import redis.asyncio as aioredis

from voice.cluster.records import RegisteredCall, RegistrySettings, RegistryUnavailable, WorkerInfo
from voice.cluster.store import REDIS_UNREACHABLE, SCRIPTS, Op, active_key, workers_key

log = logging.getLogger("voice.cluster.registry")


class CallRegistryBase:
    """This worker's connection to the cluster and what it holds for it."""

    def __init__(self, settings: RegistrySettings, worker: WorkerInfo, client: aioredis.Redis):
        self.settings, self.worker, self.redis = settings, worker, client
        self.embedded = settings.redis_url is None
        self.healthy = False  # Redis answered the last command
        self._prefix = p = settings.key_prefix
        self._workers_key, self._active_key = workers_key(p), active_key(p)
        self._calls: dict[str, RegisteredCall] = {}  # this worker's active calls: what it syncs
        self._turn_ms: dict[str, int] = {}  # the last turn id of each call here
        self._outbox: deque[Op] = deque()
        self._wake, self._empty = asyncio.Event(), asyncio.Event()
        self._empty.set()
        self._lock = asyncio.Lock()  # this worker's membership: admission, heartbeat, end
        self._dropped = 0
        self._incarnation = uuid.uuid4().hex  # tells this process from an earlier one, same id
        self._reap_after = time.monotonic() + settings.worker_ttl_s
        self._writer: asyncio.Task[None] | None = None
        self._beater: asyncio.Task[None] | None = None
        self._block_s = max(0.05, min(0.5, settings.socket_timeout_s / 2))  # < socket timeout
        self._scripts = {name: client.register_script(lua) for name, lua in SCRIPTS.items()}

    @property
    def buffered(self) -> int:
        """Writes waiting for Redis (metrics)."""
        return len(self._outbox)

    def _up(self) -> None:
        if not self.healthy:
            log.info("sessions: Redis reachable (%d writes buffered)", len(self._outbox))
            if self._dropped:
                log.warning("sessions: %d buffered writes were dropped", self._dropped)
                self._dropped = 0
            self._reap_after = time.monotonic() + self.settings.worker_ttl_s  # others return too
        self.healthy = True

    def _down(self, exc: BaseException) -> None:
        if self.healthy:
            log.warning("sessions: Redis unreachable (%s); buffering, calls go on", exc)
        self.healthy = False

    def _enqueue(self, op: Op) -> None:
        if len(self._outbox) >= self.settings.outbox_limit:
            events = [o for o in self._outbox if o.kind == "event"]
            self._outbox.remove(events[0] if events else self._outbox[0])
            if not self._dropped:
                log.warning("sessions: outbox full, dropping the oldest writes")
            self._dropped += 1
        self._outbox.append(op)
        self._empty.clear()
        self._wake.set()

    async def _batch(self, commands: Any) -> list[Any]:
        """Run `commands(pipe)` in one round trip; RegistryUnavailable if Redis is down."""
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                commands(pipe)
                results: list[Any] = await pipe.execute()
        except REDIS_UNREACHABLE as exc:
            self._down(exc)
            raise RegistryUnavailable(str(exc)) from exc
        self._up()
        return results

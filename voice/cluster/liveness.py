"""Liveness: this worker's heartbeat, and the reaper that marks the calls of workers whose
heartbeat expired `lost` (one claim per call, so two reapers never both do it)."""

from __future__ import annotations

import asyncio
import json
import logging
import time

from redis.exceptions import RedisError

from voice.cluster.registry_base import CallRegistryBase
from voice.cluster.store import (
    REDIS_UNREACHABLE,
    Args,
    Op,
    call_keys,
    encode,
    event_json,
    not_cancelled,
    text,
    worker_keys,
)

log = logging.getLogger("voice.cluster.registry")


class Liveness(CallRegistryBase):
    """Heartbeats (`_beat`, `_beat_loop`) and the reaper (`reap`)."""

    async def _beat(self) -> None:
        worker = self.worker
        worker.active_calls, worker.heartbeat_at = len(self._calls), time.time()
        async with self._lock:
            fields, calls = encode(worker), list(self._calls)
            ttl_ms = int(self.settings.worker_ttl_s * 1000)
            try:
                existed, *stale = await self._scripts["heartbeat"](
                    keys=worker_keys(self._prefix, worker.worker_id),
                    args=[
                        worker.worker_id,
                        ttl_ms,
                        self._incarnation,
                        len(fields),
                        *fields,
                        *calls,
                    ],
                )
            except REDIS_UNREACHABLE as exc:
                self._down(exc)
                raise
        self._up()
        if not existed and calls:  # Redis forgot us (a restart) or we were reaped: rewrite
            log.warning("sessions: worker %s back with %d calls", worker.worker_id, len(calls))
            for call in self._calls.values():
                self._enqueue(Op("record", call))
        ending = {op.call.call_id for op in self._outbox if op.kind == "end"}
        for call_id in {text(c) for c in stale} - ending:  # an earlier process with our id
            await self._mark_lost(call_id, worker.worker_id)

    async def _beat_loop(self) -> None:
        while not_cancelled():
            try:
                await self._beat()
                if time.monotonic() >= self._reap_after:
                    await self.reap()
            except REDIS_UNREACHABLE:
                pass  # noted by _beat; the next beat registers again
            except RedisError:
                log.exception("sessions: heartbeat failed")
            await asyncio.sleep(self.settings.heartbeat_s)

    async def reap(self) -> list[str]:
        """Mark the calls of workers whose heartbeat expired `lost`; the call ids this claimed."""
        registered = {text(w) for w in await self.redis.smembers(self._workers_key)}
        claimed: list[str] = []
        for worker_id in sorted(registered - {self.worker.worker_id}):
            if not await self.redis.exists(worker_keys(self._prefix, worker_id)[0]):
                claimed += await self._reap_worker(worker_id)
        return claimed

    async def _reap_worker(self, worker_id: str) -> list[str]:
        keys = worker_keys(self._prefix, worker_id)
        calls = [text(c) for c in await self._scripts["reap"](keys=keys, args=[worker_id])]
        for call_id in calls:
            await self._mark_lost(call_id, worker_id)
        return calls

    async def _mark_lost(self, call_id: str, worker_id: str) -> None:
        log.warning("sessions: call %s lost with worker %s", call_id, worker_id)
        fields = ["state", json.dumps("lost"), "ended_at", json.dumps(time.time())]
        args: Args = [self.settings.retention_s, event_json("state", state="lost"), "lost"]
        await self._scripts["write_call"](
            keys=call_keys(self._prefix, call_id), args=[*args, *fields]
        )

"""Redis at the edge: worker registry, admission, call records, turn and event streams, control.

Never in the audio path. A call's writes (record, turns, events, its end) go to an ordered
in-memory outbox drained by one task; while Redis is unreachable they wait there, in order, and
the call goes on. Admission and reads (listing, `get_call`, `send_control`) ask Redis directly:
admission fails closed while it is down (unless `fail_open`), reads raise `RegistryUnavailable`.
Without `redis_url` the process runs alone on an in-process fakeredis store, same code path.
The key layout, the Lua scripts and the client are in `voice.cluster.store`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any, cast
from urllib.parse import urlsplit

from redis.exceptions import RedisError

from voice.cluster.control import ControlChannel
from voice.cluster.liveness import Liveness
from voice.cluster.records import (
    TERMINAL_STATES,
    Admission,
    RegisteredCall,
    RegistrySettings,
    RegistryUnavailable,
    UnknownCall,
    WorkerInfo,
)
from voice.cluster.store import (
    ENDED_KEPT,
    EVENTS_KEPT,
    REDIS_UNREACHABLE,
    Args,
    Op,
    call_keys,
    claim_key,
    connect,
    decode,
    encode,
    ended_key,
    event_json,
    index_experiment_call,
    not_cancelled,
    text,
    worker_keys,
)

log = logging.getLogger(__name__)


class CallRegistry(Liveness, ControlChannel):
    """This worker's view of the cluster: `open`, `start`, then `close`. Its heartbeat and
    reaper are in `voice.cluster.liveness`, control commands in `voice.cluster.control`."""

    @classmethod
    async def open(cls, settings: RegistrySettings, worker: WorkerInfo) -> CallRegistry:
        """Connect, register this worker (if Redis answers) and start writing the outbox."""
        self = cls(settings, worker, connect(settings))
        if settings.redis_url is None:
            log.info("sessions: no Redis URL, in-process store (fakeredis): this process is alone")
        else:
            password = urlsplit(settings.redis_url).password
            url = settings.redis_url.replace(password, "***") if password else settings.redis_url
            log.info("sessions: Redis at %s", url)
        try:
            await self._beat()
        except REDIS_UNREACHABLE as exc:
            log.error("sessions: Redis unreachable: %s", exc)
        self._writer = asyncio.create_task(self._write_loop(), name="sessions-writer")
        return self

    async def start(self) -> None:
        """Heartbeat this worker and reap dead ones, every `heartbeat_s`."""
        if self._beater is None:
            self._beater = asyncio.create_task(self._beat_loop(), name="sessions-heartbeat")

    async def stop(self) -> None:
        """Stop heartbeating (this worker then expires) and reaping."""
        beater, self._beater = self._beater, None
        if beater is not None:
            beater.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beater

    async def close(self, flush_timeout_s: float = 2.0) -> None:
        """Flush the outbox, leave the cluster (calls still here become `lost`), disconnect."""
        await self.stop()
        if not await self.flush(flush_timeout_s):
            log.warning("sessions: closing with %d writes not in Redis", len(self._outbox))
        if self._writer is not None:
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
        try:
            await self.redis.delete(worker_keys(self._prefix, self.worker.worker_id)[0])
            await self._reap_worker(self.worker.worker_id)
        except REDIS_UNREACHABLE:
            log.warning("sessions: Redis unreachable at close; this worker will expire")
        await self.redis.aclose()

    # -- this worker's calls -------------------------------------------------------------------

    async def set_draining(self, draining: bool) -> None:
        self.worker.draining = draining
        with contextlib.suppress(*REDIS_UNREACHABLE):
            await self._beat()

    async def admit(self, call: RegisteredCall) -> Admission:
        """Admit `call` here within this worker's capacity and the cluster limit, atomically."""
        if self.worker.draining:
            return Admission(False, "draining")
        if call.call_id in self._calls:
            return Admission(False, "duplicate")
        if len(self._calls) >= self.worker.capacity:
            return Admission(False, "worker_full")
        try:  # a call id is never reused: a finished call's record must not be overwritten
            if not await self.claim("call", call.call_id, self.settings.retention_s):
                return Admission(False, "duplicate")
        except RegistryUnavailable:
            if not self.settings.fail_open:
                return Admission(False, "redis_unavailable")
        call.worker_id = worker_id = self.worker.worker_id
        limit = -1 if self.settings.cluster_limit is None else self.settings.cluster_limit
        for attempt in (1, 2):
            async with self._lock:
                try:
                    args: Args = [call.call_id, worker_id, self.worker.capacity, limit]
                    keys = worker_keys(self._prefix, worker_id)
                    reason = str(await self._scripts["admit"](keys=keys, args=args))
                except REDIS_UNREACHABLE as exc:
                    self._down(exc)
                    if not self.settings.fail_open:
                        return Admission(False, "redis_unavailable")
                    reason = "ok"  # the next heartbeat registers it
                else:
                    self._up()
                if reason == "ok":
                    self._calls[call.call_id] = call
            if reason != "not_registered" or attempt == 2:
                break
            # Expired (a long pause): register again first.
            with contextlib.suppress(*REDIS_UNREACHABLE):
                await self._beat()
        if reason != "ok":
            return Admission(False, reason)
        self._enqueue(Op("record", call, event_json("state", state=call.state)))
        return Admission(True, "ok")

    async def refusal(self) -> str | None:
        """Why a call arriving now would be refused (`draining`, `worker_full`, `cluster_full`,
        `redis_unavailable`), or None. A look, not a reservation (`admit` still decides): for an
        edge that must answer before the call exists (Twilio's webhook answers in TwiML)."""
        if self.worker.draining:
            return "draining"
        if len(self._calls) >= self.worker.capacity:
            return "worker_full"
        try:
            [active] = await self._batch(lambda pipe: pipe.hlen(self._active_key))
        except RegistryUnavailable:
            return None if self.settings.fail_open else "redis_unavailable"
        limit = self.settings.cluster_limit
        return "cluster_full" if limit is not None and int(active) >= limit else None

    async def claim(self, kind: str, name: str, ttl_s: float) -> bool:
        """Take `name` once across the cluster for `ttl_s`; False if it was taken before."""
        try:
            key = claim_key(self._prefix, kind, name)
            taken = await self.redis.set(key, self.worker.worker_id, nx=True, ex=int(ttl_s) or 1)
        except REDIS_UNREACHABLE as exc:
            self._down(exc)
            raise RegistryUnavailable(str(exc)) from exc
        self._up()
        return bool(taken)

    def update_call(self, call_id: str, **fields: Any) -> None:
        """Change fields of an active call of this worker (a `state` change is also an event)."""
        call = self._calls.get(call_id)
        if call is None:
            raise UnknownCall(call_id)
        for name, value in fields.items():
            setattr(call, name, value)
        event = event_json("state", state=call.state) if "state" in fields else ""
        self._enqueue(Op("record", call, event))

    def end_call(self, call_id: str, state: str = "ended", reason: str | None = None) -> None:
        """The call is over: out of the active set, final record, retention on its keys."""
        call = self._calls.pop(call_id, None)
        if call is None:
            return
        self._turn_ms.pop(call_id, None)  # a late turn still gets a later id: the clock's
        call.state, call.ended_at, call.end_reason = state, time.time(), reason
        self._enqueue(Op("end", call, event_json("state", state=state)))

    def append_turn(self, call_id: str, record: dict[str, Any]) -> None:
        """Append a finished turn (and a `turn` event), in order; never raises."""
        call = self._calls.get(call_id) or RegisteredCall(call_id, worker_id=self.worker.worker_id)
        ms = max(int(time.time() * 1000), self._turn_ms.get(call_id, 0) + 1)
        self._turn_ms[call_id] = ms  # fixed now: a retry of this write is seen as one
        self._enqueue(Op("turn", call, event_json("turn", record=record), json.dumps(record), ms))

    def publish(self, call_id: str, event: dict[str, Any]) -> None:
        """A live event of the call (`type` and more) for its watchers, in order; never raises."""
        call = self._calls.get(call_id) or RegisteredCall(call_id)
        self._enqueue(Op("event", call, json.dumps({"at": time.time(), **event})))

    async def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until every buffered write is in Redis; False after `timeout_s`."""
        try:
            await asyncio.wait_for(self._empty.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    async def _write_loop(self) -> None:
        delay = 0.02
        while not_cancelled():
            if not self._outbox:
                self._empty.set()
                self._wake.clear()
                await self._wake.wait()
                continue
            op = self._outbox[0]
            try:
                await self._apply(op)
            except REDIS_UNREACHABLE as exc:
                self._down(exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.settings.heartbeat_s / 2)
                continue
            except RedisError:
                log.exception("sessions: dropped a %s write for call %s", op.kind, op.call.call_id)
            else:
                self._up()
                delay = 0.02
            if self._outbox and self._outbox[0] is op:
                self._outbox.popleft()

    async def _apply(self, op: Op) -> None:
        keys, retention = call_keys(self._prefix, op.call.call_id), self.settings.retention_s
        args: Args
        if op.kind == "turn":
            args = [f"{op.turn_ms}-0", op.turn, op.event, retention]
            await self._scripts["append_turn"](keys=keys[1:], args=args)
        elif op.kind == "event":
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.xadd(keys[2], {"data": op.event}, maxlen=EVENTS_KEPT, approximate=True)
                pipe.expire(keys[2], retention)
                await pipe.execute()
        elif op.kind == "end" or op.call.call_id in self._calls:  # else ended: `end` writes it
            if op.kind == "end":
                async with self._lock:
                    args = [op.call.call_id, op.call.worker_id]
                    release_keys = worker_keys(self._prefix, op.call.worker_id)
                    await self._scripts["release"](keys=release_keys, args=args)
            args = [retention, op.event, "replace", *encode(op.call)]
            await self._scripts["write_call"](keys=keys, args=args)
            await index_experiment_call(self.redis, self._prefix, op.call, retention)
            if op.kind == "end":
                async with self.redis.pipeline(transaction=False) as pipe:
                    ended = ended_key(self._prefix)
                    pipe.zadd(ended, {op.call.call_id: time.time()})
                    pipe.zremrangebyrank(ended, 0, -ENDED_KEPT - 1)
                    await pipe.execute()

    # -- the cluster, read from any worker ---------------------------------------------------

    async def workers(self) -> list[WorkerInfo]:
        """Every live worker (heartbeat not expired)."""
        [ids] = await self._batch(lambda pipe: pipe.smembers(self._workers_key))
        ids = sorted(text(i) for i in ids)
        infos = await self._batch(
            lambda p: [p.hgetall(worker_keys(self._prefix, w)[0]) for w in ids]
        )
        pairs = zip(ids, infos, strict=True)
        return [decode(WorkerInfo, info, worker_id=w) for w, info in pairs if info]

    async def active_calls(self) -> list[RegisteredCall]:
        """Every active call cluster-wide, oldest first."""
        [active] = await self._batch(lambda pipe: pipe.hgetall(self._active_key))
        owners = {text(k): text(v) for k, v in active.items()}
        ids = sorted(owners)
        records = await self._batch(
            lambda p: [p.hgetall(call_keys(self._prefix, c)[0]) for c in ids]
        )
        calls = [
            decode(RegisteredCall, record, call_id=c, worker_id=owners[c])
            for c, record in zip(ids, records, strict=True)
            if record  # admitted a moment ago: its record is on its way
        ]
        return sorted(calls, key=lambda call: call.started_at)

    async def ended_calls(self, limit: int = 50) -> list[RegisteredCall]:
        """The calls that ended last across the cluster, newest first (within retention)."""
        ended = ended_key(self._prefix)
        [ids] = await self._batch(lambda p: p.zrevrange(ended, 0, max(0, limit - 1)))
        ids = [text(i) for i in ids]
        records = await self._batch(
            lambda p: [p.hgetall(call_keys(self._prefix, i)[0]) for i in ids]
        )
        pairs = zip(ids, records, strict=True)
        return [decode(RegisteredCall, r, call_id=i) for i, r in pairs if r]

    async def turn_counts(self, call_ids: list[str]) -> dict[str, int]:
        """How many turns each call has had so far."""
        counts = await self._batch(
            lambda p: [p.xlen(call_keys(self._prefix, i)[1]) for i in call_ids]
        )
        return {i: int(n) for i, n in zip(call_ids, counts, strict=True)}

    async def annotate(self, call_id: str, **fields: Any) -> None:
        """Add fields to the record of a call that has ended (e.g. where its recording was
        copied); RegistryUnavailable if Redis cannot be written."""
        record_key = call_keys(self._prefix, call_id)[0]
        mapping = {name: json.dumps(value) for name, value in fields.items()}
        retention = self.settings.retention_s
        await self._batch(
            lambda p: (p.hset(record_key, mapping=mapping), p.expire(record_key, retention))
        )

    async def get_call(self, call_id: str) -> tuple[RegisteredCall, list[dict[str, Any]]] | None:
        """The call's record and its turns in order; None if unknown or past retention."""
        record_key, turns_key, _ = call_keys(self._prefix, call_id)
        record, turns = await self._batch(lambda p: (p.hgetall(record_key), p.xrange(turns_key)))
        if not record:
            return None
        return decode(RegisteredCall, record, call_id=call_id), [
            json.loads(data["data"]) for _id, data in turns or []
        ]

    async def watch(self, call_id: str, since: str = "0-0") -> AsyncIterator[dict[str, Any]]:
        """The call's events after `since` (default: all kept), then live, until it ends. Each
        has its stream `id` (give it as `since` to resume). Waits out Redis outages."""
        key, last = call_keys(self._prefix, call_id)[2], since
        while not_cancelled():
            try:
                block_ms = int(self._block_s * 1000)
                reply = await self.redis.xread({key: last}, count=100, block=block_ms)
            except REDIS_UNREACHABLE as exc:
                self._down(exc)
                await asyncio.sleep(self._block_s)
                continue
            for _stream, entries in cast(list[Any], reply or []):
                for entry_id, data in entries:
                    last = text(entry_id)
                    event: dict[str, Any] = {**json.loads(data["data"]), "id": last}
                    yield event
                    if event.get("type") == "state" and event.get("state") in TERMINAL_STATES:
                        return

"""Redis at the edge: worker registry, admission, call records, turn and event streams, control.

Never in the audio path. A call's writes (record, turns, events, its end) go to an ordered
in-memory outbox drained by one task; while Redis is unreachable they wait there, in order, and
the call goes on. Admission and reads (listing, `get_call`, `send_control`) ask Redis directly:
admission fails closed while it is down (unless `fail_open`), reads raise `SessionsUnavailable`.
Without `redis_url` the process runs alone on an in-process fakeredis store, same code path.

Keys (prefix `p`). Everything admission, heartbeats and the reaper touch atomically shares the
Redis Cluster slot `{p}`; each call's keys share the call's own slot:
  {p}:workers                set of registered worker ids
  {p}:worker:<w>             hash: WorkerInfo, expires `worker_ttl_s` after the last heartbeat
  {p}:worker:<w>:calls       set: the worker's active call ids
  {p}:active                 hash: active call id -> worker id (the cluster-wide count)
  p:call:{<id>}:record       hash: CallInfo, each field JSON
  p:call:{<id>}:turns        stream: one entry per finished turn, id `<ms>-0` (its wall clock)
  p:call:{<id>}:events       stream: live events (state, turn, anything `publish`ed)
  p:control:{<w>}            list: commands for worker w;  p:reply:{<uuid>}: the list of one ack
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast
from urllib.parse import unquote, urlsplit

import redis.asyncio as aioredis
from pydantic import BaseModel
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ClusterDownError, ReadOnlyError, RedisError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

log = logging.getLogger(__name__)

TERMINAL_STATES = frozenset({"ended", "lost", "failed"})
# "Redis is not there right now": writes wait, reads fail, loops retry. ReadOnlyError: a
# failover in progress (still talking to the old master).
_DOWN: tuple[type[Exception], ...] = (RedisConnectionError, RedisTimeoutError, ClusterDownError)
_DOWN += (TryAgainError, ReadOnlyError, OSError, TimeoutError)
_EVENTS_KEPT = 1000  # approximate length cap of a call's event stream (also in the Lua below)
T = TypeVar("T")
Args = list[str | int | float]


class SessionSettings(BaseModel):
    """Where the cluster's shared state lives and how long it is kept."""

    # None: an in-process store (one process is the whole cluster). Otherwise redis://,
    # rediss://, or redis+sentinel://[:password@]host:port[,host:port]/[master[/db]].
    redis_url: str | None = None
    cluster: bool = False  # redis_url names a Redis Cluster node
    sentinel_master: str | None = None  # master name when the sentinel URL has none
    key_prefix: str = "hotline"
    heartbeat_s: float = 1.0
    worker_ttl_s: float = 3.0  # a worker silent this long is dead; its calls become `lost`
    retention_s: int = 7 * 24 * 3600  # call records and streams, after their last write
    cluster_limit: int | None = None  # concurrent calls across all workers; None: no limit
    fail_open: bool = False  # admit calls while Redis is unreachable
    socket_timeout_s: float = 1.0  # every Redis command, so an outage never blocks a call
    outbox_limit: int = 10_000  # writes kept in memory during an outage (events dropped first)


@dataclass
class WorkerInfo:
    worker_id: str
    address: str = ""
    capacity: int = 8  # this worker's concurrent-call limit
    active_calls: int = 0
    draining: bool = False
    started_at: float = field(default_factory=time.time)
    heartbeat_at: float = 0.0


@dataclass
class CallInfo:
    call_id: str
    transport: str = ""
    worker_id: str = ""
    caller: str | None = None
    callee: str | None = None
    state: str = "active"
    started_at: float = field(default_factory=time.time)
    ended_at: float | None = None
    arm: str | None = None  # experiment arm


@dataclass(frozen=True)
class Admission:
    accepted: bool
    reason: str  # ok | draining | duplicate | worker_full | cluster_full | redis_unavailable


class SessionsUnavailable(Exception):
    """Redis could not be reached for a read or a control message."""


class UnknownCall(LookupError):
    """No active call has this id."""


class NoAck(Exception):
    """The worker that owns the call did not acknowledge in time."""


@dataclass
class Control:
    """A command for a call of this worker; `ack` sends the result back to the sender."""

    call_id: str
    command: str
    args: dict[str, Any]
    reply_key: str
    sessions: Sessions = field(repr=False)

    async def ack(self, result: dict[str, Any]) -> None:
        await self.sessions._reply(self.reply_key, result)


@dataclass
class _Op:
    """A buffered write: `record` (the call's fields now), `end`, `turn` or `event`."""

    kind: str
    call: CallInfo
    event: str = ""  # JSON event for the call's event stream, or ""
    turn: str = ""  # JSON turn record
    turn_ms: int = 0  # the turn's stream id: its wall-clock ms, increasing within the call


def _event(kind: str, **fields: Any) -> str:
    return json.dumps({"at": time.time(), "type": kind, **fields})


# The global scripts take KEYS: worker, worker calls, active, workers (`_worker_keys`).
# ARGV: call id, worker id, worker limit, cluster limit (-1: none). Checks both limits atomically.
_ADMIT = """
if redis.call('HEXISTS', KEYS[3], ARGV[1]) == 1 then return 'duplicate' end
if redis.call('EXISTS', KEYS[1]) == 0 then return 'not_registered' end
local cluster_limit = tonumber(ARGV[4])
if cluster_limit >= 0 and redis.call('HLEN', KEYS[3]) >= cluster_limit then
  return 'cluster_full' end
if redis.call('SCARD', KEYS[2]) >= tonumber(ARGV[3]) then return 'worker_full' end
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
redis.call('SADD', KEYS[2], ARGV[1])
return 'ok'
"""
# ARGV: worker id, ttl ms, incarnation, 2n, n field/value pairs, then the worker's active call
# ids: its membership becomes exactly that list. Returns {1 if this incarnation was registered,
# else 0 and the calls it dropped (those of an expired or earlier process with this id)}.
_HEARTBEAT = """
local existed = 0
if redis.call('HGET', KEYS[1], 'incarnation') == ARGV[3] then existed = 1 end
local stale = {existed}
local n = tonumber(ARGV[4])
redis.call('HSET', KEYS[1], 'incarnation', ARGV[3], unpack(ARGV, 5, 4 + n))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('SADD', KEYS[4], ARGV[1])
local want = {}
for i = 5 + n, #ARGV do want[ARGV[i]] = true end
for _, c in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  if not want[c] then
    redis.call('SREM', KEYS[2], c)
    if redis.call('HGET', KEYS[3], c) == ARGV[1] then redis.call('HDEL', KEYS[3], c) end
    if existed == 0 then table.insert(stale, c) end
  end
end
for i = 5 + n, #ARGV do
  redis.call('SADD', KEYS[2], ARGV[i])
  redis.call('HSET', KEYS[3], ARGV[i], ARGV[1])
end
return stale
"""
# ARGV: worker id. Claims an expired worker's calls: one reaper gets them, however many race.
_REAP = """
if redis.call('EXISTS', KEYS[1]) == 1 then return {} end
local calls = redis.call('SMEMBERS', KEYS[2])
for _, c in ipairs(calls) do
  if redis.call('HGET', KEYS[3], c) == ARGV[1] then redis.call('HDEL', KEYS[3], c) end
end
redis.call('DEL', KEYS[2])
redis.call('SREM', KEYS[4], ARGV[1])
return calls
"""
# ARGV: call id, worker id.
_RELEASE = """
if redis.call('HGET', KEYS[3], ARGV[1]) == ARGV[2] then redis.call('HDEL', KEYS[3], ARGV[1]) end
return redis.call('SREM', KEYS[2], ARGV[1])
"""
# KEYS: record, turns, events. ARGV: retention s, event JSON or '', mode, field/value pairs.
# Mode 'replace': the record becomes the fields; 'lost': only a record still going takes them.
_WRITE_CALL = """
if ARGV[3] == 'lost' then
  if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('HEXISTS', KEYS[1], 'ended_at') == 1 then
    return 0 end
else redis.call('DEL', KEYS[1]) end
redis.call('HSET', KEYS[1], unpack(ARGV, 4))
if ARGV[2] ~= '' then
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', 1000, '*', 'data', ARGV[2]) end
for i = 1, 3 do redis.call('EXPIRE', KEYS[i], ARGV[1]) end
return 1
"""
# KEYS: turns, events. ARGV: turn id, turn JSON, event JSON, retention s. A turn already there
# (a retry after a lost reply) is skipped, and its event with it.
_APPEND_TURN = """
local added = redis.pcall('XADD', KEYS[1], ARGV[1], 'data', ARGV[2])
if type(added) == 'table' and added.err then
  if string.find(added.err, 'equal or smaller', 1, true) then return 0 end
  return redis.error_reply(added.err)
end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', 1000, '*', 'data', ARGV[3])
for i = 1, 2 do redis.call('EXPIRE', KEYS[i], ARGV[4]) end
return 1
"""
_SCRIPTS = {"admit": _ADMIT, "heartbeat": _HEARTBEAT, "reap": _REAP, "release": _RELEASE}
_SCRIPTS |= {"write_call": _WRITE_CALL, "append_turn": _APPEND_TURN}
_embedded_server: Any = None  # the process's fakeredis server, made on first use


def connect(settings: SessionSettings) -> aioredis.Redis:
    """A client for `settings.redis_url` (or the in-process store), short timeouts everywhere."""
    options: dict[str, Any] = {
        "decode_responses": True,
        "socket_timeout": settings.socket_timeout_s,
        "socket_connect_timeout": settings.socket_timeout_s,
        "retry": Retry(NoBackoff(), 1),  # one retry: a pooled connection may predate a restart
    }
    url = settings.redis_url
    if url is None:
        import fakeredis

        global _embedded_server
        if _embedded_server is None:
            _embedded_server = fakeredis.FakeServer()
        return fakeredis.FakeAsyncRedis(server=_embedded_server, decode_responses=True)
    parts = urlsplit(url)
    if parts.scheme in ("redis+sentinel", "rediss+sentinel"):
        from redis.asyncio.sentinel import Sentinel

        hosts = [h.rsplit(":", 1) for h in parts.netloc.rpartition("@")[2].split(",")]
        path = [p for p in parts.path.split("/") if p]
        master = path[0] if path else settings.sentinel_master
        if master is None:
            raise ValueError("a sentinel URL needs a master name (path or sentinel_master)")
        if parts.password:
            options["password"] = unquote(parts.password)
        sentinel = Sentinel(  # type: ignore[no-untyped-call]
            [(h[0], int(h[1]) if len(h) > 1 else 26379) for h in hosts],
            sentinel_kwargs={"socket_timeout": settings.socket_timeout_s},
            ssl=parts.scheme.startswith("rediss"),
            **options,
        )
        db = int(path[1]) if len(path) > 1 else 0
        return cast(aioredis.Redis, sentinel.master_for(master, db=db))
    if settings.cluster:
        from redis.asyncio.cluster import RedisCluster

        # The commands used here exist alike on both clients; every multi-key one stays in a slot.
        return cast(aioredis.Redis, RedisCluster.from_url(url, **options))
    return aioredis.Redis.from_url(url, **options)


def _not_cancelled() -> bool:
    """Raise CancelledError if this task was cancelled: Python 3.11's `asyncio.wait_for` (in
    fakeredis) can swallow a cancellation that races a reply, so every loop here checks."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
    return True


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _encode(obj: Any) -> list[str]:
    """A dataclass as HSET arguments, each value JSON (None fields left out)."""
    items = dataclasses.asdict(obj).items()
    return [part for name, v in items if v is not None for part in (name, json.dumps(v))]


def _decode(cls: type[T], data: dict[Any, Any], **defaults: Any) -> T:
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    values = {_text(k): json.loads(_text(v)) for k, v in data.items() if _text(k) in names}
    return cls(**{**defaults, **values})


class Sessions:
    """This worker's view of the cluster: `open`, `start`, then `close`."""

    def __init__(self, settings: SessionSettings, worker: WorkerInfo, client: aioredis.Redis):
        self.settings, self.worker, self.redis = settings, worker, client
        self.embedded = settings.redis_url is None
        self.healthy = False  # Redis answered the last command
        self._prefix = p = settings.key_prefix
        self._workers_key, self._active_key = f"{{{p}}}:workers", f"{{{p}}}:active"
        self._calls: dict[str, CallInfo] = {}  # this worker's active calls: the truth it syncs
        self._turn_ms: dict[str, int] = {}  # the last turn id of each call here
        self._outbox: deque[_Op] = deque()
        self._wake, self._empty = asyncio.Event(), asyncio.Event()
        self._empty.set()
        self._lock = asyncio.Lock()  # this worker's membership: admission, heartbeat, end
        self._dropped = 0
        self._incarnation = uuid.uuid4().hex  # tells this process from an earlier one, same id
        self._reap_after = time.monotonic() + settings.worker_ttl_s
        self._writer: asyncio.Task[None] | None = None
        self._beater: asyncio.Task[None] | None = None
        self._block_s = max(0.05, min(0.5, settings.socket_timeout_s / 2))  # < socket timeout
        self._scripts = {name: client.register_script(lua) for name, lua in _SCRIPTS.items()}

    @classmethod
    async def open(cls, settings: SessionSettings, worker: WorkerInfo) -> Sessions:
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
        except _DOWN as exc:
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
            await self.redis.delete(self._worker_keys(self.worker.worker_id)[0])
            await self._reap_worker(self.worker.worker_id)
        except _DOWN:
            log.warning("sessions: Redis unreachable at close; this worker will expire")
        await self.redis.aclose()

    @property
    def buffered(self) -> int:
        """Writes waiting for Redis (metrics)."""
        return len(self._outbox)

    def _worker_keys(self, worker_id: str) -> list[str]:
        """The KEYS of the global scripts: worker, worker calls, active, workers."""
        worker = f"{{{self._prefix}}}:worker:{worker_id}"
        return [worker, f"{worker}:calls", self._active_key, self._workers_key]

    def _call_keys(self, call_id: str) -> list[str]:
        return [f"{self._prefix}:call:{{{call_id}}}:{k}" for k in ("record", "turns", "events")]

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

    # -- this worker's calls -------------------------------------------------------------------

    async def set_draining(self, draining: bool) -> None:
        self.worker.draining = draining
        with contextlib.suppress(*_DOWN):
            await self._beat()

    async def admit(self, call: CallInfo) -> Admission:
        """Admit `call` here within this worker's capacity and the cluster limit, atomically."""
        if self.worker.draining:
            return Admission(False, "draining")
        if call.call_id in self._calls:
            return Admission(False, "duplicate")
        if len(self._calls) >= self.worker.capacity:
            return Admission(False, "worker_full")
        call.worker_id = worker_id = self.worker.worker_id
        limit = -1 if self.settings.cluster_limit is None else self.settings.cluster_limit
        for attempt in (1, 2):
            async with self._lock:
                try:
                    args: Args = [call.call_id, worker_id, self.worker.capacity, limit]
                    keys = self._worker_keys(worker_id)
                    reason = str(await self._scripts["admit"](keys=keys, args=args))
                except _DOWN as exc:
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
            with contextlib.suppress(*_DOWN):  # expired (a long pause): register again first
                await self._beat()
        if reason != "ok":
            return Admission(False, reason)
        self._enqueue(_Op("record", call, _event("state", state=call.state)))
        return Admission(True, "ok")

    def update_call(self, call_id: str, **fields: Any) -> None:
        """Change fields of an active call of this worker (a `state` change is also an event)."""
        call = self._calls.get(call_id)
        if call is None:
            raise UnknownCall(call_id)
        for name, value in fields.items():
            setattr(call, name, value)
        event = _event("state", state=call.state) if "state" in fields else ""
        self._enqueue(_Op("record", call, event))

    def end_call(self, call_id: str, state: str = "ended") -> None:
        """The call is over: out of the active set, final record, retention on its keys."""
        call = self._calls.pop(call_id, None)
        if call is None:
            return
        self._turn_ms.pop(call_id, None)  # a late turn still gets a later id: the clock's
        call.state, call.ended_at = state, time.time()
        self._enqueue(_Op("end", call, _event("state", state=state)))

    def append_turn(self, call_id: str, record: dict[str, Any]) -> None:
        """Append a finished turn (and a `turn` event), in order; never raises."""
        call = self._calls.get(call_id) or CallInfo(call_id, worker_id=self.worker.worker_id)
        ms = max(int(time.time() * 1000), self._turn_ms.get(call_id, 0) + 1)
        self._turn_ms[call_id] = ms  # fixed now: a retry of this write is seen as one
        self._enqueue(_Op("turn", call, _event("turn", record=record), json.dumps(record), ms))

    def publish(self, call_id: str, event: dict[str, Any]) -> None:
        """A live event of the call (`type` and more) for its watchers, in order; never raises."""
        call = self._calls.get(call_id) or CallInfo(call_id)
        self._enqueue(_Op("event", call, json.dumps({"at": time.time(), **event})))

    async def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until every buffered write is in Redis; False after `timeout_s`."""
        try:
            await asyncio.wait_for(self._empty.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    def _enqueue(self, op: _Op) -> None:
        if len(self._outbox) >= self.settings.outbox_limit:
            events = [o for o in self._outbox if o.kind == "event"]
            self._outbox.remove(events[0] if events else self._outbox[0])
            if not self._dropped:
                log.warning("sessions: outbox full, dropping the oldest writes")
            self._dropped += 1
        self._outbox.append(op)
        self._empty.clear()
        self._wake.set()

    async def _write_loop(self) -> None:
        delay = 0.02
        while _not_cancelled():
            if not self._outbox:
                self._empty.set()
                self._wake.clear()
                await self._wake.wait()
                continue
            op = self._outbox[0]
            try:
                await self._apply(op)
            except _DOWN as exc:
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

    async def _apply(self, op: _Op) -> None:
        keys, retention = self._call_keys(op.call.call_id), self.settings.retention_s
        args: Args
        if op.kind == "turn":
            args = [f"{op.turn_ms}-0", op.turn, op.event, retention]
            await self._scripts["append_turn"](keys=keys[1:], args=args)
        elif op.kind == "event":
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.xadd(keys[2], {"data": op.event}, maxlen=_EVENTS_KEPT, approximate=True)
                pipe.expire(keys[2], retention)
                await pipe.execute()
        elif op.kind == "end" or op.call.call_id in self._calls:  # else ended: `end` writes it
            if op.kind == "end":
                async with self._lock:
                    args = [op.call.call_id, op.call.worker_id]
                    worker_keys = self._worker_keys(op.call.worker_id)
                    await self._scripts["release"](keys=worker_keys, args=args)
            args = [retention, op.event, "replace", *_encode(op.call)]
            await self._scripts["write_call"](keys=keys, args=args)

    # -- heartbeats and the reaper --------------------------------------------------------------

    async def _beat(self) -> None:
        worker = self.worker
        worker.active_calls, worker.heartbeat_at = len(self._calls), time.time()
        async with self._lock:
            fields, calls = _encode(worker), list(self._calls)
            ttl_ms = int(self.settings.worker_ttl_s * 1000)
            try:
                existed, *stale = await self._scripts["heartbeat"](
                    keys=self._worker_keys(worker.worker_id),
                    args=[
                        worker.worker_id,
                        ttl_ms,
                        self._incarnation,
                        len(fields),
                        *fields,
                        *calls,
                    ],
                )
            except _DOWN as exc:
                self._down(exc)
                raise
        self._up()
        if not existed and calls:  # Redis forgot us (a restart) or we were reaped: rewrite
            log.warning("sessions: worker %s back with %d calls", worker.worker_id, len(calls))
            for call in self._calls.values():
                self._enqueue(_Op("record", call))
        ending = {op.call.call_id for op in self._outbox if op.kind == "end"}
        for call_id in {_text(c) for c in stale} - ending:  # an earlier process with our id
            await self._mark_lost(call_id, worker.worker_id)

    async def _beat_loop(self) -> None:
        while _not_cancelled():
            try:
                await self._beat()
                if time.monotonic() >= self._reap_after:
                    await self.reap()
            except _DOWN:
                pass  # noted by _beat; the next beat registers again
            except RedisError:
                log.exception("sessions: heartbeat failed")
            await asyncio.sleep(self.settings.heartbeat_s)

    async def reap(self) -> list[str]:
        """Mark the calls of workers whose heartbeat expired `lost`; the call ids this claimed."""
        registered = {_text(w) for w in await self.redis.smembers(self._workers_key)}
        claimed: list[str] = []
        for worker_id in sorted(registered - {self.worker.worker_id}):
            if not await self.redis.exists(self._worker_keys(worker_id)[0]):
                claimed += await self._reap_worker(worker_id)
        return claimed

    async def _reap_worker(self, worker_id: str) -> list[str]:
        keys = self._worker_keys(worker_id)
        calls = [_text(c) for c in await self._scripts["reap"](keys=keys, args=[worker_id])]
        for call_id in calls:
            await self._mark_lost(call_id, worker_id)
        return calls

    async def _mark_lost(self, call_id: str, worker_id: str) -> None:
        log.warning("sessions: call %s lost with worker %s", call_id, worker_id)
        fields = ["state", json.dumps("lost"), "ended_at", json.dumps(time.time())]
        args: Args = [self.settings.retention_s, _event("state", state="lost"), "lost"]
        await self._scripts["write_call"](keys=self._call_keys(call_id), args=[*args, *fields])

    # -- the cluster, read from any worker ---------------------------------------------------

    async def _batch(self, commands: Any) -> list[Any]:
        """Run `commands(pipe)` in one round trip; SessionsUnavailable if Redis is down."""
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                commands(pipe)
                results: list[Any] = await pipe.execute()
        except _DOWN as exc:
            self._down(exc)
            raise SessionsUnavailable(str(exc)) from exc
        self._up()
        return results

    async def workers(self) -> list[WorkerInfo]:
        """Every live worker (heartbeat not expired)."""
        [ids] = await self._batch(lambda pipe: pipe.smembers(self._workers_key))
        ids = sorted(_text(i) for i in ids)
        infos = await self._batch(lambda p: [p.hgetall(self._worker_keys(w)[0]) for w in ids])
        pairs = zip(ids, infos, strict=True)
        return [_decode(WorkerInfo, info, worker_id=w) for w, info in pairs if info]

    async def active_calls(self) -> list[CallInfo]:
        """Every active call cluster-wide, oldest first."""
        [active] = await self._batch(lambda pipe: pipe.hgetall(self._active_key))
        owners = {_text(k): _text(v) for k, v in active.items()}
        ids = sorted(owners)
        records = await self._batch(lambda p: [p.hgetall(self._call_keys(c)[0]) for c in ids])
        calls = [
            _decode(CallInfo, record, call_id=c, worker_id=owners[c])
            for c, record in zip(ids, records, strict=True)
        ]
        return sorted(calls, key=lambda call: call.started_at)

    async def get_call(self, call_id: str) -> tuple[CallInfo, list[dict[str, Any]]] | None:
        """The call's record and its turns in order; None if unknown or past retention."""
        record_key, turns_key, _ = self._call_keys(call_id)
        record, turns = await self._batch(lambda p: (p.hgetall(record_key), p.xrange(turns_key)))
        if not record:
            return None
        return _decode(CallInfo, record, call_id=call_id), [
            json.loads(data["data"]) for _id, data in turns or []
        ]

    async def watch(self, call_id: str, since: str = "0-0") -> AsyncIterator[dict[str, Any]]:
        """The call's events after `since` (default: all kept), then live, until it ends. Each
        has its stream `id` (give it as `since` to resume). Waits out Redis outages."""
        key, last = self._call_keys(call_id)[2], since
        while _not_cancelled():
            try:
                block_ms = int(self._block_s * 1000)
                reply = await self.redis.xread({key: last}, count=100, block=block_ms)
            except _DOWN as exc:
                self._down(exc)
                await asyncio.sleep(self._block_s)
                continue
            for _stream, entries in cast(list[Any], reply or []):
                for entry_id, data in entries:
                    last = _text(entry_id)
                    event: dict[str, Any] = {**json.loads(data["data"]), "id": last}
                    yield event
                    if event.get("type") == "state" and event.get("state") in TERMINAL_STATES:
                        return

    # -- control ------------------------------------------------------------------------------

    async def send_control(
        self, call_id: str, command: str, args: dict[str, Any] | None = None, timeout_s: float = 5.0
    ) -> dict[str, Any]:
        """Send `command` to the worker that owns the call; its ack. UnknownCall: no active call
        has this id; NoAck: none within `timeout_s`; SessionsUnavailable: Redis is down."""
        [owner] = await self._batch(lambda pipe: pipe.hget(self._active_key, call_id))
        if owner is None:
            raise UnknownCall(call_id)
        reply_key = f"{self._prefix}:reply:{{{uuid.uuid4().hex}}}"
        deadline = time.monotonic() + timeout_s
        message: dict[str, Any] = {"call_id": call_id, "command": command, "args": args or {}}
        message |= {"reply": reply_key, "expires_at": time.time() + timeout_s}
        inbox = f"{self._prefix}:control:{{{_text(owner)}}}"
        await self._batch(
            lambda pipe: (
                pipe.rpush(inbox, json.dumps(message)),
                pipe.expire(inbox, max(60, int(timeout_s) + 1)),
            )
        )
        while _not_cancelled() and (left := deadline - time.monotonic()) > 0:
            try:
                popped = await self.redis.blpop([reply_key], timeout=min(left, self._block_s))
            except _DOWN as exc:
                self._down(exc)
                raise SessionsUnavailable(str(exc)) from exc
            if popped is not None:
                result: dict[str, Any] = json.loads(popped[1])
                return result
        raise NoAck(f"{command} for call {call_id}: no ack from worker {_text(owner)}")

    async def control_commands(self) -> AsyncIterator[Control]:
        """Commands for this worker's calls, sent from any worker (one consumer per process).
        A command for a call not (or no longer) here is acked `{"ok": False, ...}` here."""
        inbox = f"{self._prefix}:control:{{{self.worker.worker_id}}}"
        while _not_cancelled():
            try:
                popped = await self.redis.blpop([inbox], timeout=self._block_s)
            except RedisError as exc:
                if not isinstance(exc, _DOWN):
                    log.exception("sessions: reading control commands")
                self._down(exc)
                await asyncio.sleep(self._block_s)
                continue
            if popped is None:
                continue
            message = json.loads(popped[1])
            control = Control(
                message["call_id"], message["command"], message["args"], message["reply"], self
            )
            if message["expires_at"] < time.time():
                log.info("sessions: %s for call %s expired", control.command, control.call_id)
            elif control.call_id not in self._calls:
                await control.ack({"ok": False, "error": "unknown call"})
            else:
                yield control

    async def _reply(self, reply_key: str, result: dict[str, Any]) -> None:
        try:
            await self._batch(
                lambda pipe: (pipe.rpush(reply_key, json.dumps(result)), pipe.expire(reply_key, 60))
            )
        except SessionsUnavailable as exc:
            log.warning("sessions: ack to %s lost: %s", reply_key, exc)

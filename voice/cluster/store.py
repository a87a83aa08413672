"""The Redis storage layer of `voice.cluster.registry`: key layout, Lua scripts, client, encodings.

Keys (prefix `p`). Everything admission, heartbeats and the reaper touch atomically shares the
Redis Cluster slot `{p}`; each call's keys share the call's own slot:
  {p}:workers                set of registered worker ids
  {p}:worker:<w>             hash: WorkerInfo, expires `worker_ttl_s` after the last heartbeat
  {p}:worker:<w>:calls       set: the worker's active call ids
  {p}:active                 hash: active call id -> worker id (the cluster-wide count)
  p:call:{<id>}:record       hash: RegisteredCall, each field JSON
  p:call:{<id>}:turns        stream: one entry per finished turn, id `<ms>-0` (its wall clock)
  p:call:{<id>}:events       stream: live events (state, turn, anything `publish`ed)
  p:experiment:{<name>}:*    an experiment's config and calls (see `voice.experiments.arms`)
  p:control:{<w>}            list: commands for worker w;  p:reply:{<uuid>}: the list of one ack
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast
from urllib.parse import unquote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ClusterDownError, ReadOnlyError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

# "Redis is not there right now": writes wait, reads fail, loops retry. ReadOnlyError: a
# failover in progress (still talking to the old master).
REDIS_UNREACHABLE: tuple[type[Exception], ...] = (
    RedisConnectionError,
    RedisTimeoutError,
    ClusterDownError,
    TryAgainError,
    ReadOnlyError,
    OSError,
    TimeoutError,
)
EVENTS_KEPT = 1000  # approximate length cap of a call's event stream (also in the Lua below)
T = TypeVar("T")
Args = list[str | int | float]


class ClientSettings(Protocol):
    """What `connect` reads: `voice.cluster.registry.RegistrySettings` has it."""

    redis_url: str | None
    cluster: bool
    sentinel_master: str | None
    socket_timeout_s: float


class CallRef(Protocol):
    """What the outbox needs of a call: `voice.cluster.registry.RegisteredCall` has it."""

    call_id: str
    worker_id: str


def workers_key(prefix: str) -> str:
    return f"{{{prefix}}}:workers"


def active_key(prefix: str) -> str:
    return f"{{{prefix}}}:active"


def worker_keys(prefix: str, worker_id: str) -> list[str]:
    """The KEYS of the global scripts: worker, worker calls, active, workers."""
    worker = f"{{{prefix}}}:worker:{worker_id}"
    return [worker, f"{worker}:calls", active_key(prefix), workers_key(prefix)]


def call_keys(prefix: str, call_id: str) -> list[str]:
    return [f"{prefix}:call:{{{call_id}}}:{k}" for k in ("record", "turns", "events")]


def ended_key(prefix: str) -> str:
    """The calls that ended last, by when (a sorted set, trimmed to `ENDED_KEPT`)."""
    return f"{{{prefix}}}:ended"


ENDED_KEPT = 500


def claim_key(prefix: str, kind: str, name: str) -> str:
    """A name taken once across the cluster: a call id, a stream token's nonce."""
    return f"{prefix}:claim:{kind}:{{{name}}}"


def experiment_keys(prefix: str, name: str) -> tuple[str, str]:
    """An experiment's config (JSON) and its calls (sorted set of call ids by start time)."""
    return f"{prefix}:experiment:{{{name}}}:config", f"{prefix}:experiment:{{{name}}}:calls"


async def index_experiment_call(
    redis: aioredis.Redis, prefix: str, call: CallRef, retention_s: int
) -> None:
    """List a call that is in an experiment under it (its report finds the call there)."""
    experiment = getattr(call, "experiment", None)
    if not experiment:
        return
    index = experiment_keys(prefix, experiment)[1]
    async with redis.pipeline(transaction=False) as pipe:
        pipe.zadd(index, {call.call_id: getattr(call, "started_at", 0.0)})
        pipe.expire(index, retention_s)
        await pipe.execute()


def control_list(prefix: str, worker_id: str) -> str:
    return f"{prefix}:control:{{{worker_id}}}"


def reply_list(prefix: str, token: str) -> str:
    return f"{prefix}:reply:{{{token}}}"


@dataclass
class Op:
    """A buffered write: `record` (the call's fields now), `end`, `turn` or `event`."""

    kind: str
    call: CallRef
    event: str = ""  # JSON event for the call's event stream, or ""
    turn: str = ""  # JSON turn record
    turn_ms: int = 0  # the turn's stream id: its wall-clock ms, increasing within the call


def event_json(kind: str, **fields: Any) -> str:
    return json.dumps({"at": time.time(), "type": kind, **fields})


# The global scripts take KEYS: worker, worker calls, active, workers (`worker_keys`).
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
SCRIPTS = {"admit": _ADMIT, "heartbeat": _HEARTBEAT, "reap": _REAP, "release": _RELEASE}
SCRIPTS |= {"write_call": _WRITE_CALL, "append_turn": _APPEND_TURN}
_embedded_server: Any = None  # the process's fakeredis server, made on first use


def connect(settings: ClientSettings) -> aioredis.Redis:
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
        sentinel = Sentinel(
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


def not_cancelled() -> bool:
    """Raise CancelledError if this task was cancelled: Python 3.11's `asyncio.wait_for` (in
    fakeredis) can swallow a cancellation that races a reply, so every registry loop checks."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
    return True


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def encode(obj: Any) -> list[str]:
    """A dataclass as HSET arguments, each value JSON (None fields left out)."""
    items = dataclasses.asdict(obj).items()
    return [part for name, v in items if v is not None for part in (name, json.dumps(v))]


def decode(cls: type[T], data: dict[Any, Any], **defaults: Any) -> T:
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    values = {text(k): json.loads(text(v)) for k, v in data.items() if text(k) in names}
    return cls(**{**defaults, **values})

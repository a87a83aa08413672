"""Campaigns in Redis, so that any worker can run them and none is needed to finish them.

Keys (prefix `p`, campaign `c`; one campaign's keys share the Redis Cluster slot `{c}`):
  p:campaign:{c}           hash: `spec` (the request but its rows, JSON), `state` (creating |
                           running | paused | stopped | ended), `concurrency`, `base_url`,
                           `rows`, `created_at`, `n:<status>` (rows per status), `dials`
                           (attempts), `dialled` (calls the provider took), `ended_as`,
                           `ended_at`, `notify` (pending | sent | none)
  p:campaign:{c}:due       sorted set: queued row -> when it may be dialled (its turn, its
                           calling hours, its retry)
  p:campaign:{c}:inflight  sorted set: row being dialled -> the end of its holder's lease;
                           ringing row -> when its call is next looked at. Its size is the
                           campaign's calls in flight, cluster-wide (the concurrency)
  p:campaign:{c}:row:<i>   hash: to, timezone, variables (JSON), status, attempts, outcomes,
                           last_outcome, token, worker, call_id, next_at, waiting, retaken, …
  {p}:campaigns            sorted set: every campaign -> created at (the list)
  {p}:campaigns:live       set: campaigns not finished (ended and their webhook sent)
The row moves are the scripts of `voice.campaigns.scripts`; `CampaignStore` wraps them."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import redis.asyncio as aioredis

from voice.campaigns import scripts
from voice.campaigns.request import CampaignSpec
from voice.cluster.store import Args, text

_CHUNK = 500  # rows written (or swept) per round trip
_PAGE = 200  # rows read per round trip


@dataclass(frozen=True)
class Claimed:
    """A row this worker now holds to dial: `token` names the hold."""

    campaign_id: str
    row: str
    token: str
    attempts: int
    to: str
    timezone: str
    variables: dict[str, str]


class CampaignStore:
    """One cluster's campaigns (prefix `prefix`). Redis errors are the caller's to handle."""

    def __init__(self, redis: aioredis.Redis, prefix: str) -> None:
        self.redis = redis
        self.prefix = prefix
        self.index = f"{{{prefix}}}:campaigns"
        self.live_key = f"{{{prefix}}}:campaigns:live"
        register = redis.register_script
        self._claim, self._release = register(scripts.CLAIM), register(scripts.RELEASE)
        self._retake, self._placed = register(scripts.RETAKE), register(scripts.PLACED)
        self._settle, self._look = register(scripts.SETTLE), register(scripts.LOOK)
        self._provider = register(scripts.PROVIDER_STATUS)
        self._sweep, self._notify = register(scripts.SWEEP), register(scripts.NOTIFY)
        self._state = register(scripts.CHANGE_STATE)

    def meta_key(self, c: str) -> str:
        return f"{self.prefix}:campaign:{{{c}}}"

    def _keys(self, c: str, row: str | None = None) -> list[str]:
        """meta, due, inflight (and the row's)."""
        meta = self.meta_key(c)
        keys = [meta, f"{meta}:due", f"{meta}:inflight"]
        return [*keys, f"{meta}:row:{row}"] if row is not None else keys

    # -- a campaign as a whole -----------------------------------------------------------------

    async def create(self, spec: CampaignSpec, due: Sequence[float], base_url: str) -> str:
        """Store a new campaign (rows due at `due`, in order) and start it; its id."""
        c = secrets.token_hex(8)
        meta, due_key, _ = self._keys(c)
        now = time.time()
        fields: dict[str, Any] = {
            "spec": spec.spec_json(),
            "state": "creating",
            "concurrency": spec.head.concurrency,
            "base_url": base_url,
            "rows": len(spec.rows),
            "created_at": repr(now),
            "n:queued": len(spec.rows),
            "dials": 0,
            "dialled": 0,
        }
        await self.redis.hset(meta, mapping=cast(Any, fields))
        for start in range(0, len(spec.rows), _CHUNK):
            async with self.redis.pipeline(transaction=False) as pipe:
                chunk = range(start, min(start + _CHUNK, len(spec.rows)))
                for i in chunk:
                    row = spec.rows[i]
                    variables = json.dumps(row.variables, separators=(",", ":"))
                    mapping = {"to": row.to, "timezone": row.timezone, "variables": variables}
                    mapping |= {"status": "queued", "attempts": "0", "next_at": repr(due[i])}
                    if due[i] > now:
                        mapping["waiting"] = "hours"
                    pipe.hset(f"{meta}:row:{i}", mapping=cast(Any, mapping))
                pipe.zadd(due_key, {str(i): due[i] for i in chunk})
                await pipe.execute()
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hset(meta, "state", "running")
            pipe.zadd(self.index, {c: now})
            pipe.sadd(self.live_key, c)
            await pipe.execute()
        return c

    async def meta(self, c: str) -> dict[str, str]:
        """The campaign's meta hash as text ({} if there is no such campaign)."""
        raw = await self.redis.hgetall(self.meta_key(c))
        return {text(k): text(v) for k, v in raw.items()}

    async def live(self) -> list[str]:
        found = await self.redis.smembers(self.live_key)
        return sorted(text(c) for c in found)

    async def forget(self, c: str) -> None:
        """Drop a campaign that is gone (expired) from the live set."""
        await self.redis.srem(self.live_key, c)

    async def listed(self, limit: int) -> list[str]:
        """The most recent campaigns' ids, newest first."""
        found = await self.redis.zrevrange(self.index, 0, max(0, limit - 1))
        return [text(cast(str, c)) for c in found]

    async def change_state(self, c: str, what: str) -> str:
        """pause, resume or stop; the state after it ('' for no such campaign)."""
        found = await self._state(keys=[self.meta_key(c)], args=[what, repr(time.time())])
        return text(found)

    async def finished(self, c: str, how: str, retention_s: int) -> None:
        """The ended campaign's webhook was sent (or is not wanted): it leaves the live set, and
        its keys expire after `retention_s`."""
        meta, due, inflight = self._keys(c)
        rows = int(await self.redis.hget(meta, "rows") or 0)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hset(meta, "notify", how)
            pipe.srem(self.live_key, c)
            pipe.zremrangebyscore(self.index, "-inf", repr(time.time() - retention_s))
            for key in (meta, due, inflight):
                pipe.expire(key, retention_s)
            await pipe.execute()
        for start in range(0, rows, _CHUNK):
            async with self.redis.pipeline(transaction=False) as pipe:
                for i in range(start, min(start + _CHUNK, rows)):
                    pipe.expire(f"{meta}:row:{i}", retention_s)
                await pipe.execute()

    async def claim_notify(self, c: str, now: float, hold_s: float) -> bool:
        """This worker's turn to send the campaign.ended webhook (for `hold_s`)."""
        args: Args = [repr(now), repr(now + hold_s)]
        return bool(await self._notify(keys=[self.meta_key(c)], args=args))

    # -- rows ----------------------------------------------------------------------------------

    async def due_rows(self, c: str, now: float, limit: int) -> list[str]:
        due = self._keys(c)[1]
        found = await self.redis.zrangebyscore(due, "-inf", repr(now), start=0, num=limit)
        return [text(cast(str, r)) for r in found]

    async def next_due(self, c: str) -> float | None:
        first = await self.redis.zrange(self._keys(c)[1], 0, 0, withscores=True)
        return float(first[0][1]) if first else None

    async def expired(self, c: str, now: float, limit: int) -> list[str]:
        """Rows in flight whose lease or next look is past."""
        inflight = self._keys(c)[2]
        found = await self.redis.zrangebyscore(inflight, "-inf", repr(now), start=0, num=limit)
        return [text(cast(str, r)) for r in found]

    async def in_flight(self, c: str) -> int:
        return int(await self.redis.zcard(self._keys(c)[2]))

    async def claim(
        self, c: str, row: str, now: float, lease_s: float, worker: str
    ) -> Claimed | int:
        """Hold `row` to dial it: the claim, or -2 (not running), -1 (concurrency reached),
        0 (taken meanwhile)."""
        token = secrets.token_hex(8)
        args: Args = [repr(now), repr(now + lease_s), token, worker, row]
        found = await self._claim(keys=self._keys(c, row), args=args)
        if not isinstance(found, list):
            return int(found)
        attempts, to, timezone, variables = found
        decoded = json.loads(text(variables) or "{}")
        return Claimed(c, row, token, int(attempts), text(to), text(timezone), decoded)

    async def release(self, claim: Claimed, due_at: float, waiting: str, now: float) -> int:
        """Give `claim` back undialled, due at `due_at` (`waiting`: why)."""
        args: Args = [claim.token, repr(due_at), claim.row, waiting, repr(now)]
        return int(await self._release(keys=self._keys(claim.campaign_id, claim.row), args=args))

    async def retake(self, c: str, row: str, token: str, now: float) -> int:
        args: Args = [token, repr(now), row]
        return int(await self._retake(keys=self._keys(c, row), args=args))

    async def placed(self, claim: Claimed, call_id: str, look_at: float, now: float) -> bool:
        meta, _, inflight, row = self._keys(claim.campaign_id, claim.row)
        args: Args = [claim.token, claim.row, call_id, repr(look_at), repr(now)]
        return bool(await self._placed(keys=[meta, inflight, row], args=args))

    async def settle(
        self,
        c: str,
        row: str,
        token: str,
        outcome: str,
        due_at: float | None,
        now: float,
        *,
        counted: bool = True,
        took: bool = False,
        fields: dict[str, str] | None = None,
    ) -> int:
        """The dial held by `token` came to `outcome`: the row ends (`due_at` None) or is due
        again at `due_at` (`took`: the provider's report of a call it took). 0: stale; 1: done;
        2: done, and the campaign ended."""
        pairs = [p for kv in (fields or {}).items() for p in kv]
        final = "1" if due_at is None else "0"
        due = repr(due_at if due_at is not None else now)
        flags = ["0" if counted else "1", "1" if took else "0"]
        args: Args = [token, row, outcome, final, due, repr(now), *flags, *pairs]
        return int(await self._settle(keys=self._keys(c, row), args=args))

    async def provider_status(
        self, c: str, row: str, token: str, status: str, look_at: float
    ) -> bool:
        _, _, inflight, key = self._keys(c, row)
        args: Args = [token, row, status, repr(look_at)]
        return bool(await self._provider(keys=[inflight, key], args=args))

    async def take_look(self, c: str, row: str, now: float, next_at: float) -> bool:
        """This worker's turn to look at a ringing row (the others wait until `next_at`)."""
        args: Args = [row, repr(now), repr(next_at)]
        return bool(await self._look(keys=[self._keys(c)[2]], args=args))

    async def sweep(self, c: str, now: float) -> int:
        """Queued rows of a stopped campaign become `stopped`; 2 when it has ended."""
        due = self._keys(c)[1]
        while True:
            ids = [text(cast(str, r)) for r in await self.redis.zrange(due, 0, _CHUNK - 1)]
            keys = [*self._keys(c), *(self._keys(c, r)[3] for r in ids)]
            result = int(await self._sweep(keys=keys, args=[repr(now), *ids]))
            if len(ids) < _CHUNK or result != 1:
                return result

    async def row(self, c: str, row: str) -> dict[str, str]:
        raw = await self.redis.hgetall(self._keys(c, row)[3])
        return {text(k): text(v) for k, v in raw.items()}

    async def rows(self, c: str, offset: int, limit: int) -> list[dict[str, str]]:
        """Rows `offset`.. (at most `limit`), each with its index as `row`; read `_PAGE` at a
        time, so that a long read leaves the event loop to the calls between pages."""
        meta, rows = self.meta_key(c), []
        for start in range(offset, offset + limit, _PAGE):
            page = range(start, min(start + _PAGE, offset + limit))
            async with self.redis.pipeline(transaction=False) as pipe:
                for i in page:
                    pipe.hgetall(f"{meta}:row:{i}")
                found = cast(list[dict[Any, Any]], await pipe.execute())
            for i, raw in zip(page, found, strict=True):
                if raw:
                    rows.append({"row": str(i), **{text(k): text(v) for k, v in raw.items()}})
        return rows

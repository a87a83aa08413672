"""A placed call waiting to be answered (a `Dial`): who was called, from which number, the agent
that will talk and the request's metadata, kept in Redis under a random dial id until the
provider's media stream arrives, on whichever worker, and takes it (once: taking deletes it).
The provider's call id is added once the provider has said it, so that only that call's stream
can take the dial."""

from __future__ import annotations

import contextlib
import json
import secrets
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import redis.asyncio as aioredis

from voice.cluster.records import RegistryUnavailable
from voice.cluster.store import REDIS_UNREACHABLE

if TYPE_CHECKING:
    from voice.cluster.registry import CallRegistry


@dataclass(frozen=True)
class Dial:
    """An outbound call from its request until its media stream starts."""

    provider: str
    to: str
    from_: str
    agent: str
    metadata: dict[str, Any] = field(default_factory=dict)
    dial_id: str = field(default_factory=lambda: secrets.token_urlsafe(12))
    call_id: str | None = None  # the provider's (Twilio's CallSid), once it took the call
    machine_detection: bool = False  # a person or a machine? (pipeline/answering/)
    voicemail: str | None = None  # left on a machine after its beep; None: hang up


class DialBook:
    """The dials of the cluster, in Redis; RegistryUnavailable when Redis cannot be reached."""

    def __init__(self, redis: aioredis.Redis, prefix: str) -> None:
        self._redis = redis
        self._prefix = prefix

    @classmethod
    def of(cls, sessions: CallRegistry) -> DialBook:
        """The dials kept in the call registry's Redis."""
        return cls(sessions.redis, sessions.settings.key_prefix)

    def _key(self, dial_id: str) -> str:
        return f"{self._prefix}:outbound:{{{dial_id}}}"

    async def put(self, dial: Dial, ttl_s: float) -> None:
        """Keep `dial` for `ttl_s` (a later `put` of the same id replaces it)."""
        body = json.dumps(asdict(dial), separators=(",", ":"))
        try:
            await self._redis.set(self._key(dial.dial_id), body, ex=max(1, round(ttl_s)))
        except REDIS_UNREACHABLE as exc:
            raise RegistryUnavailable(str(exc)) from exc

    async def forget(self, dial_id: str) -> None:
        """Drop a dial the provider did not take (nothing if Redis is away: it expires)."""
        with contextlib.suppress(*REDIS_UNREACHABLE):
            await self._redis.delete(self._key(dial_id))

    async def take(self, dial_id: str) -> Dial | None:
        """The dial, now gone from Redis (None: unknown, expired or taken already)."""
        key = self._key(dial_id)
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.get(key)
                pipe.delete(key)
                body, _deleted = await pipe.execute()
        except REDIS_UNREACHABLE as exc:
            raise RegistryUnavailable(str(exc)) from exc
        if body is None:
            return None
        data = json.loads(body)
        return Dial(**data)

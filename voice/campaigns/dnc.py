"""The do-not-call list: one Redis set of the cluster (`{p}:dnc`), numbers in E.164 (`+` and
the digits, nothing else), looked at before every dial of every campaign."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

import redis.asyncio as aioredis

from voice.agents.agent import normalise_number
from voice.cluster.records import RegistryUnavailable
from voice.cluster.store import REDIS_UNREACHABLE

E164 = re.compile(r"\+[1-9][0-9]{6,14}")  # whole string, as POST /calls/outbound takes it
NUMBER_CHARS = 40  # of a number as written, before it is normalised
_CHUNK = 1000


def e164(number: object) -> str:
    """`number` in E.164 without punctuation (`+1 (555) 010-0100` -> `+15550100100`);
    ValueError if it is not one."""
    if not isinstance(number, str) or len(number) > NUMBER_CHARS:
        raise ValueError(f"{str(number)[:NUMBER_CHARS]!r} is not a phone number as text")
    normalised = normalise_number(number.strip())
    if E164.fullmatch(normalised) is None:
        raise ValueError(f"{number!r} is not a phone number in E.164 form (+15551234567)")
    return normalised


class DoNotCall:
    """The cluster's do-not-call list; RegistryUnavailable when Redis cannot be reached."""

    def __init__(self, redis: aioredis.Redis, prefix: str) -> None:
        self._redis = redis
        self.key = f"{{{prefix}}}:dnc"

    async def add(self, numbers: Iterable[str]) -> int:
        """Put E.164 `numbers` on the list; how many were not on it."""
        return await self._each(numbers, self._redis.sadd)

    async def remove(self, numbers: Iterable[str]) -> int:
        """Take E.164 `numbers` off the list; how many were on it."""
        return await self._each(numbers, self._redis.srem)

    async def _each(self, numbers: Iterable[str], command: Callable[..., Any]) -> int:
        chunk: list[str] = []
        changed = 0
        try:
            for number in numbers:
                chunk.append(number)
                if len(chunk) == _CHUNK:
                    changed += int(await command(self.key, *chunk))
                    chunk = []
            if chunk:
                changed += int(await command(self.key, *chunk))
        except REDIS_UNREACHABLE as exc:
            raise RegistryUnavailable(str(exc)) from exc
        return changed

    async def listed(self, number: str) -> bool:
        """Whether the E.164 `number` is on the list."""
        try:
            return bool(await self._redis.sismember(self.key, number))
        except REDIS_UNREACHABLE as exc:
            raise RegistryUnavailable(str(exc)) from exc

    async def count(self) -> int:
        try:
            return int(await self._redis.scard(self.key))
        except REDIS_UNREACHABLE as exc:
            raise RegistryUnavailable(str(exc)) from exc

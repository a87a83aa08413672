"""Control commands between workers: any worker may send a command (say, hang up) for a call,
and the worker that owns the call carries it out and acks it, through Redis lists."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import RedisError

from voice.cluster.records import NoAck, RegistryUnavailable, UnknownCall
from voice.cluster.registry_base import CallRegistryBase
from voice.cluster.store import REDIS_UNREACHABLE, control_list, not_cancelled, reply_list, text

log = logging.getLogger("voice.cluster.registry")


@dataclass
class Control:
    """A command for a call of this worker; `ack` sends the result back to the sender."""

    call_id: str
    command: str
    args: dict[str, Any]
    reply_key: str
    sessions: ControlChannel = field(repr=False)

    async def ack(self, result: dict[str, Any]) -> None:
        await self.sessions._reply(self.reply_key, result)


class ControlChannel(CallRegistryBase):
    """`send_control` from any worker; `control_commands` for this worker's calls."""

    async def send_control(
        self, call_id: str, command: str, args: dict[str, Any] | None = None, timeout_s: float = 5.0
    ) -> dict[str, Any]:
        """Send `command` to the worker that owns the call; its ack. UnknownCall: no active call
        has this id; NoAck: none within `timeout_s`; RegistryUnavailable: Redis is down."""
        [owner] = await self._batch(lambda pipe: pipe.hget(self._active_key, call_id))
        if owner is None:
            raise UnknownCall(call_id)
        reply_key = reply_list(self._prefix, uuid.uuid4().hex)
        deadline = time.monotonic() + timeout_s
        message: dict[str, Any] = {"call_id": call_id, "command": command, "args": args or {}}
        message |= {"reply": reply_key, "expires_at": time.time() + timeout_s}
        inbox = control_list(self._prefix, text(owner))
        await self._batch(
            lambda pipe: (
                pipe.rpush(inbox, json.dumps(message)),
                pipe.expire(inbox, max(60, int(timeout_s) + 1)),
            )
        )
        while not_cancelled() and (left := deadline - time.monotonic()) > 0:
            try:
                popped = await self.redis.blpop([reply_key], timeout=min(left, self._block_s))
            except REDIS_UNREACHABLE as exc:
                self._down(exc)
                raise RegistryUnavailable(str(exc)) from exc
            if popped is not None:
                result: dict[str, Any] = json.loads(popped[1])
                return result
        raise NoAck(f"{command} for call {call_id}: no ack from worker {text(owner)}")

    async def control_commands(self) -> AsyncIterator[Control]:
        """Commands for this worker's calls, sent from any worker (one consumer per process).
        A command for a call not (or no longer) here is acked `{"ok": False, ...}` here."""
        inbox = control_list(self._prefix, self.worker.worker_id)
        while not_cancelled():
            try:
                popped = await self.redis.blpop([inbox], timeout=self._block_s)
            except RedisError as exc:
                if not isinstance(exc, REDIS_UNREACHABLE):
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
        except RegistryUnavailable as exc:
            log.warning("sessions: ack to %s lost: %s", reply_key, exc)

"""Timer G and Timer H (RFC 3261 §17.2.1): a final non-2xx answer to an INVITE over UDP is
sent again until its ACK comes, first after T1, the interval doubling up to T2, and given up
64·T1 after the first send (Timer H). Over TCP and TLS nothing is resent (§17.2.1: Timer G is
only for unreliable transports). The ACK itself is absorbed by the transaction (Timer I,
`ServerTransactions.match`).

So that a stranger cannot make us a reflector (a spoofed source gets our answers), the answers
being resent to sources off the allow-list are bounded: at most `per_host` transactions per
stranger host and `strangers` in all; beyond that an answer is sent once and not resent."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from voice.throttle import LogThrottle

log = logging.getLogger(__name__)

Key = tuple[str, ...]
Send = Callable[[bytes], None]
T1 = 0.5
T2 = 4.0


@dataclass
class _Resend:
    data: bytes
    send: Send
    host: str
    stranger: bool
    interval: float
    deadline: float
    sent: int = 1
    handle: asyncio.TimerHandle | None = field(default=None, repr=False)


class Resender:
    """The refused INVITEs whose answer is resent until ACKed, by transaction key."""

    def __init__(
        self,
        *,
        t1: float = T1,
        t2: float = T2,
        per_host: int = 2,
        strangers: int = 16,
    ) -> None:
        self.t1, self.t2 = t1, t2
        self.per_host, self.strangers = per_host, strangers
        self._active: dict[Key, _Resend] = {}
        self.resent = 0  # datagrams sent again, in all
        self.declined = 0  # answers to strangers not resent: over the bound
        self._quiet = LogThrottle()  # a flood of refusals must not flood the log

    def __len__(self) -> int:
        return len(self._active)

    def start(self, key: Key, data: bytes, send: Send, host: str, *, stranger: bool) -> bool:
        """`data` (a 3xx-6xx to an INVITE) was just sent to `host`: resend it with `send`
        until `acked(key)`.
        False when a stranger is over its bound (sent once only)."""
        self.stop(key)  # a new final answer in the same transaction replaces the old
        if stranger and not self._room_for(host):
            self.declined += 1
            self._quiet.warn(
                log, "bound", "sip: not resending a refusal to %s: over the strangers' bound", host
            )
            return False
        loop = asyncio.get_running_loop()
        entry = _Resend(data, send, host, stranger, self.t1, loop.time() + 64 * self.t1)
        self._active[key] = entry
        entry.handle = loop.call_later(self.t1, self._fire, key)
        return True

    def acked(self, key: Key) -> None:
        """The ACK came (Timer G stops; RFC 3261 §17.2.1 "Confirmed" state)."""
        self.stop(key)

    def stop(self, key: Key) -> None:
        entry = self._active.pop(key, None)
        if entry is not None and entry.handle is not None:
            entry.handle.cancel()

    def close(self) -> None:
        for key in list(self._active):
            self.stop(key)

    def _room_for(self, host: str) -> bool:
        ours = [e for e in self._active.values() if e.stranger]
        if len(ours) >= self.strangers:
            return False
        return sum(1 for e in ours if e.host == host) < self.per_host

    def _fire(self, key: Key) -> None:
        entry = self._active.get(key)
        if entry is None:
            return
        loop = asyncio.get_running_loop()
        if loop.time() >= entry.deadline:  # Timer H: no ACK, the transaction is over
            self._active.pop(key, None)
            log.info(
                "sip: no ACK to a refused INVITE from %s after %d sends", entry.host, entry.sent
            )
            return
        entry.send(entry.data)
        entry.sent += 1
        self.resent += 1
        entry.interval = min(entry.interval * 2, self.t2)
        wait = min(entry.interval, max(entry.deadline - loop.time(), 0.0))
        entry.handle = loop.call_later(wait, self._fire, key)

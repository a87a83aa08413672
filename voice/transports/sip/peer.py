"""Who a SIP message came from and where its answers go (`Peer`), and the timers of RFC 3261
§17 every transaction runs by (T1 = 500 ms, T2 = 4 s, 64·T1 in all)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from voice.transports.sip.message import SipMessage
from voice.transports.sip.transactions import Source

T1 = 0.5
T2 = 4.0
TRANSACTION_S = 64 * T1  # how long a transaction (and its cached response) lives


@dataclass(eq=False)
class Peer:
    """Where a message came from and where its answers go: a UDP address, or a TCP connection."""

    transport: str  # "UDP" | "TCP" | "TLS"
    address: tuple[str, int]
    writer: asyncio.StreamWriter | None = field(default=None, repr=False)

    @property
    def host(self) -> str:
        return self.address[0]

    @property
    def source(self) -> Source:
        """Who asked, as transactions match it: the address for UDP, the host on a stream."""
        return (self.transport, self.host, self.address[1] if self.transport == "UDP" else 0)


Handler = Callable[[SipMessage, Peer], Awaitable[None]]


class SipError(Exception):
    """A request we sent got no final answer, or the answer could not be sent."""

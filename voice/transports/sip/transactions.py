"""Server transactions as RFC 3261 §17.2.3 matches them, so that a retransmitted request gets
the answer it got before, and nobody else does.

A request belongs to a transaction by its top Via's branch (with the magic cookie `z9hG4bK`),
that Via's sent-by and its method (an ACK belongs to its INVITE's transaction; a CANCEL has its
own), and here also by its *source*: the transport and address it came from (for TCP and TLS
the host: a retransmission may come on a new connection). A request from anywhere else that
copies a live call's branch is a new request, for the access rules to judge; the cached answer
(with its To tag and SDP) never goes to it. Requests without the cookie (RFC 2543) match by
Call-ID, CSeq, From tag and the top Via whole.

Each transaction lives 32 s (64·T1) from its last answer; sources off the allow-list and on it
are remembered apart, each table bounded (the oldest goes first), so a flood cannot grow memory
or push out an allowed PBX's transactions."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from voice.transports.sip.message import SipMessage, SipParseError, parse_name_addr, parse_via
from voice.transports.sip.resend import Resender, Send

MAGIC_COOKIE = "z9hG4bK"

Source = tuple[str, str, int]  # ("UDP", host, port) | ("TCP" | "TLS", host, 0)
Key = tuple[str, ...]
Absorb = Literal["absorb"]


def transaction_key(message: SipMessage, source: Source) -> Key | None:
    """The server transaction a request (or our response to it) belongs to; None if it has
    no usable top Via."""
    try:
        vias = message.header_values("Via")
        if not vias:
            return None
        via = parse_via(vias[0])
        number, method = message.cseq
        branch = via.branch or ""
        if method == "ACK":
            method = "INVITE"
        where = (source[0], source[1], str(source[2]))
        if branch.startswith(MAGIC_COOKIE):
            sent_by = f"{via.host.lower()}:{via.port or ''}"
            return ("3261", branch, sent_by, method, *where)
        from_tag = parse_name_addr(message.header("From") or "").tag or ""
        return ("2543", message.call_id, str(number), method, from_tag, vias[0], *where)
    except SipParseError:
        return None


@dataclass
class _Entry:
    response: bytes | None  # the last response sent; None while the handler has not answered
    status: int
    expiry: float


class ServerTransactions:
    """The requests answered (or being answered) lately, by transaction and source."""

    def __init__(
        self,
        lifetime_s: float,
        *,
        max_entries: int,
        max_stranger_entries: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.lifetime_s = lifetime_s
        self.clock = clock
        self._caps = {False: max_entries, True: max_stranger_entries}
        self._tables: dict[bool, OrderedDict[Key, _Entry]] = {
            False: OrderedDict(),
            True: OrderedDict(),
        }
        self.resender = Resender()  # Timer G/H: refusals of INVITEs over UDP, until the ACK

    def __len__(self) -> int:
        return sum(len(table) for table in self._tables.values())

    def match(self, request: SipMessage, source: Source) -> bytes | Absorb | None:
        """For a request just received: the answer to send again (a retransmission),
        "absorb" (a retransmission not answered yet, or the ACK of a refused INVITE: the
        transaction takes it) or None (a new request, for the handler)."""
        self._expire()
        key = transaction_key(request, source)
        entry = self._find(key) if key is not None else None
        if request.method == "ACK":
            if key is None or entry is None or entry.status < 300:
                return None
            self.resender.acked(key)  # Timer G stops; Timer I absorbs the ACK's repeats
            return "absorb"
        if entry is None:
            return None
        return entry.response if entry.response is not None else "absorb"

    def begin(self, request: SipMessage, source: Source, *, stranger: bool) -> None:
        """A new request went to the handler: its retransmissions are absorbed until it is
        answered."""
        key = transaction_key(request, source)
        if key is not None and request.method != "ACK":
            self._put(key, _Entry(None, 0, self.clock() + self.lifetime_s), stranger)

    def answered(
        self,
        response: SipMessage,
        data: bytes,
        source: Source,
        *,
        stranger: bool,
        resend: Send | None = None,
    ) -> None:
        """We sent `response` (as `data`) to `source`: its request's retransmissions get it.
        `resend` (UDP only): how to send it again; a 3xx-6xx to an INVITE is resent until
        its ACK (RFC 3261 §17.2.1, Timer G), bounded for strangers."""
        key = transaction_key(response, source)
        if key is None or response.status is None:
            return
        if resend is not None and response.status >= 300 and response.cseq[1] == "INVITE":
            self.resender.start(key, data, resend, source[1], stranger=stranger)
        entry = _Entry(data, response.status, self.clock() + self.lifetime_s)
        for kind, table in self._tables.items():
            if key in table:
                self._put(key, entry, kind)
                return
        self._put(key, entry, stranger)

    def _find(self, key: Key) -> _Entry | None:
        for table in self._tables.values():
            entry = table.get(key)
            if entry is not None:
                return entry
        return None

    def _put(self, key: Key, entry: _Entry, stranger: bool) -> None:
        table = self._tables[stranger]
        table[key] = entry
        table.move_to_end(key)  # every entry's expiry is now + lifetime: the table stays in order
        while len(table) > self._caps[stranger]:
            table.popitem(last=False)

    def _expire(self) -> None:
        now = self.clock()
        for table in self._tables.values():
            while table and next(iter(table.values())).expiry <= now:
                table.popitem(last=False)

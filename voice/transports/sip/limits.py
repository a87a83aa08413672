"""What one SIP source may cost a worker (issue 22): messages per second per source, counted
before a message is parsed, and TCP/TLS connections per source, with the operator's allow-list
keeping its own share of the connections. Pure bookkeeping with an injected clock: no I/O.

Three kinds of source: *allowed* (on the operator's allow-list: no message budget), *vouched*
(off the list, but it proved a digest user lately: a larger budget) and *strangers* (everyone
else: a small budget each, and a budget for all of them together, since UDP sources can be
spoofed by the thousand). IPv6 sources are counted per /64, the block one subscriber gets.
Every table here is bounded; the least recently seen source goes first."""

from __future__ import annotations

import ipaddress
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from voice.throttle import Clock, TokenBucket, remember

Kind = Literal["allowed", "vouched", "stranger"]


@dataclass(frozen=True)
class SipLimits:
    """Limits per source and timeouts of a `SipEndpoint`; the defaults are for production.

    A SIP user agent sends a handful of messages per call (INVITE, its retransmissions, ACK,
    the retry with credentials, BYE): 40 at once and 20 a second is far more than any honest
    phone needs before it has authenticated, and 20 parsed-and-refused messages a second cost
    about 2% of a core. All strangers together get 200 a second (spoofed sources each start
    with a full bucket)."""

    stranger_rate: float = 20.0  # messages per second, per stranger
    stranger_burst: float = 40.0
    strangers_rate: float = 200.0  # all strangers together
    strangers_burst: float = 400.0
    vouched_rate: float = 200.0  # a source that proved a digest user, per source
    vouched_burst: float = 400.0
    vouch_s: float = 600.0  # how long a proof vouches for its source (refreshed by each)
    max_sources: int = 4096  # sources remembered (budgets, allow-list answers, vouches)
    # TCP and TLS: connections in all; those off the allow-list (strangers and vouched
    # together) get at most `off_list_connections`, strangers alone `stranger_connections`, and
    # a host off the list `connections_per_host`: allowed hosts always keep 250 of the 1 000,
    # vouched ones 250 against strangers.
    max_connections: int = 1000
    off_list_connections: int = 750
    stranger_connections: int = 500
    connections_per_host: int = 16
    # From a message's first byte to its last (the TLS handshake too), and with no message.
    header_timeout_s: float = 10.0
    idle_timeout_s: float = 300.0
    # Server transactions remembered (RFC 3261 §17.2: 32 s each), for sources off and on the
    # allow-list apart, so strangers cannot push out the answers an allowed PBX may ask again.
    stranger_transactions: int = 2048
    transactions: int = 8192


def group(host: str) -> str:
    """What budgets and connection caps count by: the address itself, an IPv6 address's /64."""
    if ":" not in host:
        return host
    try:
        address = ipaddress.IPv6Address(host.split("%", 1)[0])
    except ValueError:
        return host
    if address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(ipaddress.IPv6Network((address, 64), strict=False))


class Sources:
    """Message budgets per source: `admit(host)` before a message from it is parsed."""

    def __init__(
        self,
        limits: SipLimits,
        trusted: Callable[[str], bool],
        clock: Clock = time.monotonic,
    ) -> None:
        self.limits = limits
        self.trusted = trusted
        self.clock = clock
        self._allowed: OrderedDict[str, bool] = OrderedDict()  # host -> on the allow-list
        self._vouched: OrderedDict[str, float] = OrderedDict()  # host -> until when
        self._buckets: OrderedDict[tuple[str, Kind], TokenBucket] = OrderedDict()
        self._strangers = TokenBucket(limits.strangers_rate, limits.strangers_burst, clock())
        self.dropped = 0  # messages refused in all
        self.dropped_by: OrderedDict[str, int] = OrderedDict()  # per source group, bounded

    def __len__(self) -> int:
        """How many entries the tables hold (each at most `max_sources`)."""
        return len(self._allowed) + len(self._vouched) + len(self._buckets)

    def kind(self, host: str) -> Kind:
        allowed = self._allowed.get(host)
        if allowed is None:
            allowed = bool(self.trusted(host))
            remember(self._allowed, host, allowed, self.limits.max_sources)
        if allowed:
            return "allowed"
        until = self._vouched.get(host)
        if until is not None:
            if until > self.clock():
                return "vouched"
            del self._vouched[host]
        return "stranger"

    def vouch(self, host: str) -> None:
        """`host` just proved a digest user: the vouched budget for `vouch_s` from now."""
        until = self.clock() + self.limits.vouch_s
        remember(self._vouched, host, until, self.limits.max_sources)

    def admit(self, host: str) -> bool:
        """Take one message's worth of `host`'s budget; False (and counted) when it has none."""
        kind = self.kind(host)
        if kind == "allowed":
            return True
        now = self.clock()
        bucket = self._bucket(host, kind, now)
        if kind == "vouched":
            admitted = bucket.take(now)
        else:
            admitted = bucket.ready(now) and self._strangers.ready(now)
            if admitted:
                bucket.take(now)
                self._strangers.take(now)
        if not admitted:
            self.dropped += 1
            key = group(host)
            remember(self.dropped_by, key, self.dropped_by.get(key, 0) + 1, 1024)
        return admitted

    def ready(self, host: str) -> bool:
        """Whether `host` has budget for a message now (none is taken)."""
        kind = self.kind(host)
        if kind == "allowed":
            return True
        now = self.clock()
        ready = self._bucket(host, kind, now).ready(now)
        return ready and (kind == "vouched" or self._strangers.ready(now))

    def _bucket(self, host: str, kind: Kind, now: float) -> TokenBucket:
        key = (group(host), kind)
        bucket = self._buckets.get(key)
        if bucket is None:
            limits = self.limits
            if kind == "vouched":
                bucket = TokenBucket(limits.vouched_rate, limits.vouched_burst, now)
            else:
                bucket = TokenBucket(limits.stranger_rate, limits.stranger_burst, now)
            remember(self._buckets, key, bucket, limits.max_sources)
        else:
            self._buckets.move_to_end(key)
        return bucket


class Connections:
    """TCP/TLS connections open now, by kind and by source: `open` says whether one more may
    come in (None) or why not."""

    def __init__(self, limits: SipLimits) -> None:
        self.limits = limits
        self.total = 0
        self.off_list = 0
        self.strangers = 0
        self._per_host: dict[str, int] = {}  # at most one entry per open connection

    def open(self, host: str, kind: Kind) -> str | None:
        limits = self.limits
        key = group(host)
        if self.total >= limits.max_connections:
            return f"all {limits.max_connections} connections are taken"
        if kind != "allowed":
            if self._per_host.get(key, 0) >= limits.connections_per_host:
                return f"it has {limits.connections_per_host} connections open"
            if self.off_list >= limits.off_list_connections:
                return "the share of sources off the allow-list is taken"
            if kind == "stranger" and self.strangers >= limits.stranger_connections:
                return "the strangers' share is taken"
        self.total += 1
        self.off_list += kind != "allowed"
        self.strangers += kind == "stranger"
        self._per_host[key] = self._per_host.get(key, 0) + 1
        return None

    def close(self, host: str, kind: Kind) -> None:
        """One connection `open` let in (as `kind`) has closed."""
        key = group(host)
        left = self._per_host.get(key, 0) - 1
        if left > 0:
            self._per_host[key] = left
        else:
            self._per_host.pop(key, None)
        self.total -= 1
        self.off_list -= kind != "allowed"
        self.strangers -= kind == "stranger"

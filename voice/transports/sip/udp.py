"""The SIP endpoint's UDP socket: datagrams in, and the ICMP errors that our datagrams caused
read back (RFC 3261 §18.4: a port, host or network unreachable "SHOULD cause the transport layer
to inform the transport user of a failure in sending").

Linux reports ICMP errors on an unconnected UDP socket only with `IP_RECVERR` (`IPV6_RECVERR`)
set; each error then waits in the socket's error queue, with the destination of the datagram
that caused it, until `recvmsg(MSG_ERRQUEUE)` reads it. asyncio tells us an error is waiting
(`error_received`); the queue is read there, a bounded number at a time, and each unreachable
destination is told to whoever watches it (`SendFailures`: an INVITE we sent there). Elsewhere,
or where the option is refused, nothing is read and a request's timers decide as before."""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import struct
import sys
from collections.abc import Callable

log = logging.getLogger(__name__)

IP_RECVERR = 11  # linux/in.h (Python 3.11's socket module does not name it)
IPV6_RECVERR = 25  # linux/in6.h
_ERRORS = {(socket.IPPROTO_IP, IP_RECVERR), (socket.IPPROTO_IPV6, IPV6_RECVERR)}
UNREACHABLE = {
    errno.ECONNREFUSED: "port unreachable",
    errno.EHOSTUNREACH: "host unreachable",
    errno.ENETUNREACH: "network unreachable",
    errno.EHOSTDOWN: "host down",
}
_READ_AT_ONCE = 64  # errors read per notice; the rest raise another one

Address = tuple[str, int]


class SendFailures:
    """Who waits to hear that a destination cannot be reached: a callback per watcher."""

    def __init__(self) -> None:
        self._watchers: dict[Address, dict[int, Callable[[str], None]]] = {}
        self._next = 0

    def watch(self, address: Address, failed: Callable[[str], None]) -> Callable[[], None]:
        """Call `failed(why)` if `address` proves unreachable; returns how to stop watching."""
        self._next += 1
        key = self._next
        self._watchers.setdefault(address, {})[key] = failed

        def stop() -> None:
            watchers = self._watchers.get(address)
            if watchers is not None:
                watchers.pop(key, None)
                if not watchers:
                    del self._watchers[address]

        return stop

    def failed(self, address: Address, why: str) -> None:
        for callback in list(self._watchers.get(address, {}).values()):
            callback(why)


def read_errors(sock: socket.socket, limit: int = _READ_AT_ONCE) -> list[tuple[Address, int]]:
    """The (destination, errno) of the errors waiting in `sock`'s error queue (non-blocking)."""
    found: list[tuple[Address, int]] = []
    for _ in range(limit):
        try:
            _data, ancillary, _flags, address = sock.recvmsg(1, 512, socket.MSG_ERRQUEUE)
        except OSError:  # BlockingIOError: the queue is empty
            break
        for level, kind, data in ancillary:
            if (level, kind) in _ERRORS and len(data) >= 4 and address:
                found.append(
                    ((str(address[0]), int(address[1])), struct.unpack_from("=I", data)[0])
                )
    return found


def read_back_errors(sock: socket.socket) -> bool:
    """Ask the kernel to queue ICMP errors on `sock` (Linux); False where it cannot."""
    if sys.platform != "linux":
        return False
    options = [(socket.IPPROTO_IP, IP_RECVERR)]
    if sock.family == socket.AF_INET6:  # and IPv4-mapped destinations, where the socket has them
        options.insert(0, (socket.IPPROTO_IPV6, IPV6_RECVERR))
    done = False
    for level, option in options:
        try:
            sock.setsockopt(level, option, 1)
            done = True
        except OSError as exc:
            log.debug("sip: ICMP errors not read back (%d, %d): %s", level, option, exc)
    return done


class UdpProtocol(asyncio.DatagramProtocol):
    """Datagrams to `received(data, address)`; unreachable destinations to `failures`."""

    def __init__(self, received: Callable[[bytes, Address], None], failures: SendFailures) -> None:
        self.received = received
        self.failures = failures
        self._errors: socket.socket | None = None  # a duplicate of the socket, to read errors

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        sock = transport.get_extra_info("socket")
        if sock is not None:
            errors = sock.dup()  # asyncio's wrapper has no recvmsg; the duplicate shares the queue
            if read_back_errors(errors):
                self._errors = errors
            else:
                errors.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._errors is not None:
            self._errors.close()
            self._errors = None

    def datagram_received(self, data: bytes, addr: tuple[str | object, ...]) -> None:
        self.received(data, (str(addr[0]), int(str(addr[1]))))

    def error_received(self, exc: Exception) -> None:
        if self._errors is None:
            log.debug("sip: udp error %s", exc)
            return
        for address, number in read_errors(self._errors):
            why = UNREACHABLE.get(number)
            if why is None:
                log.debug("sip: udp error %s for %s", errno.errorcode.get(number, number), address)
                continue
            try:
                self.failures.failed(address, why)
            except Exception:
                log.exception("sip: telling that %s is unreachable failed", address)

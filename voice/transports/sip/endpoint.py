"""SIP over UDP, TCP and TLS (RFC 3261 §18, §26.2; TLS from Python's `ssl`, the system's
OpenSSL) with the transaction rules a user agent server needs
(§17): a retransmitted request gets the response it got before, requests we send over UDP are
retransmitted until answered (timers A/E, T1 = 500 ms, T2 = 4 s, 32 s in all), and responses go
back where the request came from (symmetric, as `rport`, RFC 3581), which is what works behind
NAT. Malformed messages are logged (a few) and dropped; a TCP connection that sends one is
closed. Everything runs on the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from voice.transports.sip.message import (
    MAX_MESSAGE_BYTES,
    SipMessage,
    SipParseError,
    StreamFramer,
    parse_message,
)

log = logging.getLogger(__name__)

T1 = 0.5
T2 = 4.0
TRANSACTION_S = 64 * T1  # how long a transaction (and its cached response) lives
_MAX_TCP_CONNECTIONS = 1000


@dataclass(eq=False)
class Peer:
    """Where a message came from and where its answers go: a UDP address, or a TCP connection."""

    transport: str  # "UDP" | "TCP" | "TLS"
    address: tuple[str, int]
    writer: asyncio.StreamWriter | None = field(default=None, repr=False)

    @property
    def host(self) -> str:
        return self.address[0]


Handler = Callable[[SipMessage, Peer], Awaitable[None]]


class SipError(Exception):
    """A request we sent got no final answer, or the answer could not be sent."""


class _Udp(asyncio.DatagramProtocol):
    def __init__(self, endpoint: SipEndpoint) -> None:
        self.endpoint = endpoint

    def datagram_received(self, data: bytes, addr: tuple[str | object, ...]) -> None:
        address = (str(addr[0]), int(str(addr[1])))
        self.endpoint._received(data, Peer("UDP", address))

    def error_received(self, exc: Exception) -> None:
        log.debug("sip: udp error %s", exc)


class SipEndpoint:
    """Listens for SIP on `host:port` (UDP and TCP; port 0: any free port, the same for both)
    and hands each new request to `handler`; answers retransmissions itself."""

    def __init__(
        self,
        host: str,
        port: int,
        handler: Handler,
        tls: ssl.SSLContext | None = None,
        tls_port: int = 5061,
    ) -> None:
        """`tls`: also listen for SIP over TLS on `tls_port` (0: any free port)."""
        self.host = host
        self.port = port
        self.handler = handler
        self.tls = tls
        self.tls_port = tls_port
        self._udp: asyncio.DatagramTransport | None = None
        self._tcp: asyncio.Server | None = None
        self._tls: asyncio.Server | None = None
        self._connections: set[asyncio.StreamWriter] = set()
        # (branch, method) of requests answered lately -> (their last response, expiry)
        self._answered: dict[tuple[str, str], tuple[bytes, Peer, float]] = {}
        self._pending: dict[str, asyncio.Future[SipMessage]] = {}  # our requests, by branch
        self._tasks: set[asyncio.Task[None]] = set()
        self.bad_messages = 0

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        udp, _ = await loop.create_datagram_endpoint(
            lambda: _Udp(self), local_addr=(self.host, self.port)
        )
        self._udp = udp
        self.port = int(udp.get_extra_info("sockname")[1])
        self._tcp = await asyncio.start_server(self._tcp_connection, self.host, self.port)
        log.info("SIP listening on %s:%d (UDP and TCP)", self.host, self.port)
        if self.tls is not None:
            self._tls = await asyncio.start_server(
                self._tls_connection, self.host, self.tls_port, ssl=self.tls
            )
            self.tls_port = int(self._tls.sockets[0].getsockname()[1])
            log.info("SIP listening on %s:%d (TLS)", self.host, self.tls_port)

    async def close(self) -> None:
        if self._udp is not None:
            self._udp.close()
        for server in (self._tcp, self._tls):
            if server is not None:
                server.close()
        for writer in list(self._connections):
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        for future in self._pending.values():
            if not future.done():
                future.set_exception(SipError("endpoint closed"))

    # -- sending -----------------------------------------------------------------------------

    def send(self, message: SipMessage, peer: Peer) -> None:
        """Send now (best effort); a response is also remembered for its retransmissions."""
        data = message.to_bytes()
        if not message.is_request:
            try:
                branch, method = message.branch, message.cseq[1]
            except SipParseError:
                branch = None
            if branch:
                expiry = time.monotonic() + TRANSACTION_S
                self._answered[(branch, method)] = (data, peer, expiry)
        self._send_bytes(data, peer)

    def _send_bytes(self, data: bytes, peer: Peer) -> None:
        if peer.transport in ("TCP", "TLS"):
            if peer.writer is not None and not peer.writer.is_closing():
                peer.writer.write(data)
        elif self._udp is not None:
            self._udp.sendto(data, peer.address)

    async def request(self, message: SipMessage, peer: Peer) -> SipMessage:
        """Send a request (not INVITE) and return its final response; over UDP it is
        retransmitted until answered. SipError if none comes within 32 s."""
        branch = message.branch
        if not branch:
            raise SipError("a request needs a Via branch")
        future: asyncio.Future[SipMessage] = asyncio.get_running_loop().create_future()
        self._pending[branch] = future
        data = message.to_bytes()
        deadline = time.monotonic() + TRANSACTION_S
        interval = T1
        try:
            while True:
                self._send_bytes(data, peer)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SipError(f"{message.method}: no answer from {peer.address}")
                wait = min(interval, left) if peer.transport == "UDP" else left
                with contextlib.suppress(TimeoutError):
                    return await asyncio.wait_for(asyncio.shield(future), wait)
                interval = min(interval * 2, T2)
        finally:
            self._pending.pop(branch, None)

    # -- receiving ---------------------------------------------------------------------------

    def _received(self, data: bytes, peer: Peer) -> None:
        if not data.strip():
            return  # a keep-alive
        try:
            message = parse_message(data)
        except SipParseError as exc:
            self._bad(peer, exc)
            return
        self._dispatch(message, peer)

    def _dispatch(self, message: SipMessage, peer: Peer) -> None:
        if not message.is_request:
            future = self._pending.get(message.branch or "")
            if future is not None and not future.done() and (message.status or 0) >= 200:
                future.set_result(message)
            return
        self._expire()
        try:
            key = (message.branch or "", message.cseq[1])
        except SipParseError as exc:
            self._bad(peer, exc)
            return
        answered = self._answered.get(key) if key[0] and message.method != "ACK" else None
        if answered is not None:
            self._send_bytes(answered[0], peer)  # a retransmission: the same answer again
            return
        task = asyncio.create_task(self._handle(message, peer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _handle(self, message: SipMessage, peer: Peer) -> None:
        try:
            await self.handler(message, peer)
        except Exception:
            log.exception("sip: handling %s from %s failed", message.method, peer.address)

    def _bad(self, peer: Peer, error: Exception) -> None:
        self.bad_messages += 1
        if self.bad_messages <= 5 or self.bad_messages % 100 == 0:
            log.warning(
                "sip: malformed message #%d from %s dropped: %s",
                self.bad_messages,
                peer.address,
                error,
            )

    def _expire(self) -> None:
        now = time.monotonic()
        if len(self._answered) > 64:
            self._answered = {k: v for k, v in self._answered.items() if v[2] > now}

    async def _tls_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await self._tcp_connection(reader, writer, "TLS")

    async def _tcp_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, transport: str = "TCP"
    ) -> None:
        name = writer.get_extra_info("peername")
        if len(self._connections) >= _MAX_TCP_CONNECTIONS:
            writer.close()
            return
        peer = Peer(transport, (str(name[0]), int(name[1])), writer)
        self._connections.add(writer)
        framer = StreamFramer()
        try:
            while data := await reader.read(MAX_MESSAGE_BYTES):
                try:
                    messages = framer.feed(data)
                except SipParseError as exc:
                    self._bad(peer, exc)
                    break
                for message in messages:
                    self._dispatch(message, peer)
        except (ConnectionError, OSError):
            pass
        finally:
            self._connections.discard(writer)
            writer.close()

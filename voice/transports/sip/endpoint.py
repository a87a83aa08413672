"""SIP over UDP, TCP and TLS (RFC 3261 §18, §26.2; TLS from Python's `ssl`, the system's
OpenSSL) with the transaction rules a user agent server needs (§17): a retransmitted request
gets the response it got before, and only its own source does (`transactions`); requests we
send over UDP are retransmitted until answered (timers A/E, T1 = 500 ms, T2 = 4 s, 32 s in
all), and responses go back where the request came from (symmetric, as `rport`, RFC 3581),
which is what works behind NAT. Everything runs on the event loop.

Input is hostile (`SipLimits`): a source off the allow-list has a message budget, taken before
its message is parsed (over it: dropped silently, a log line now and then); TCP and TLS
connections are capped per source, the allow-list keeping its share, and closed on a slow
message (the TLS handshake included) or when idle (`streams`). Malformed messages are logged (a
few); one with a readable Via gets 400 (`checks`), and a TCP or TLS connection that sends one
is closed after it (its framing is lost)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from functools import partial

from voice.throttle import LogThrottle
from voice.transports.sip.checks import malformed_answer
from voice.transports.sip.limits import Connections, Kind, SipLimits, Sources, group
from voice.transports.sip.message import SipMessage, SipParseError, parse_message
from voice.transports.sip.peer import T1, T2, TRANSACTION_S, Handler, Peer, SipError
from voice.transports.sip.streams import (
    MalformedStream,
    StreamTimeout,
    accept_forever,
    listening_socket,
    stream_messages,
    tls_streams,
)
from voice.transports.sip.transactions import ServerTransactions
from voice.transports.sip.udp import SendFailures, UdpProtocol

# What the rest of the package has always imported from here (peer.py holds them now).
__all__ = ["T1", "T2", "TRANSACTION_S", "Handler", "Peer", "SipEndpoint", "SipError"]

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Connection:
    peer: Peer
    kind: Kind  # when it was let in
    calls: set[str] = field(default_factory=set)  # Call-IDs answered 2xx here, not yet ended


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
        *,
        trusted: Callable[[str], bool] | None = None,
        limits: SipLimits | None = None,
    ) -> None:
        """`tls`: also listen for SIP over TLS on `tls_port` (0: any free port). `trusted(host)`:
        whether a source is on the operator's allow-list (None: no source is)."""
        self.host = host
        self.port = port
        self.handler = handler
        self.tls = tls
        self.tls_port = tls_port
        self.limits = limits or SipLimits()
        self.sources = Sources(self.limits, trusted or (lambda host: False))
        self.connections = Connections(self.limits)
        self.transactions = ServerTransactions(
            TRANSACTION_S,
            max_entries=self.limits.transactions,
            max_stranger_entries=self.limits.stranger_transactions,
        )
        self._quiet = LogThrottle()
        self.failures = SendFailures()  # UDP destinations an ICMP error says are unreachable
        self._udp: asyncio.DatagramTransport | None = None
        self._tcp: asyncio.Server | None = None
        self._tls: socket.socket | None = None  # our own accept loop: caps before the handshake
        self._connections: dict[asyncio.StreamWriter, _Connection] = {}
        self._pending: dict[str, asyncio.Future[SipMessage]] = {}  # our requests, by branch
        self._listeners: dict[str, tuple[Callable[[SipMessage], None], Callable[[], None]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.bad_messages = 0
        self.refused_connections = 0  # TCP/TLS connections closed at once: over a cap
        self.timed_out = 0  # TCP/TLS connections closed: a slow message, a handshake, idle

    @property
    def rate_dropped(self) -> int:
        """Messages dropped unparsed: their source was over its budget."""
        return self.sources.dropped

    def vouch(self, host: str) -> None:
        """`host`, off the allow-list, just proved a digest user: it gets the vouched budget
        (`SipLimits.vouched_rate`, and a connection share of its own) for `vouch_s`."""
        self.sources.vouch(host)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        for attempt in range(8 if self.port == 0 else 1):  # port 0: one free for UDP and TCP
            udp, _ = await loop.create_datagram_endpoint(
                lambda: UdpProtocol(self._received_udp, self.failures),
                local_addr=(self.host, self.port),
            )
            port = int(udp.get_extra_info("sockname")[1])
            try:
                self._tcp = await asyncio.start_server(self._tcp_connection, self.host, port)
            except OSError:
                udp.close()
                if attempt == 7 or self.port != 0:
                    raise
                continue
            self._udp, self.port = udp, port
            break
        log.info("SIP listening on %s:%d (UDP and TCP)", self.host, self.port)
        if self.tls is not None:  # the handshake is ours, after the connection caps
            self._tls = listening_socket(self.host, self.tls_port)
            self.tls_port = int(self._tls.getsockname()[1])
            failed = partial(self._warn, "accept", "sip: TLS accept failed: %s")
            self._spawn(accept_forever(self._tls, self._accepted_tls, failed))
            log.info("SIP listening on %s:%d (TLS)", self.host, self.tls_port)

    async def close(self) -> None:
        if self._udp is not None:
            self._udp.close()
        if self._tcp is not None:
            self._tcp.close()
        for writer in list(self._connections):
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        for future in self._pending.values():
            if not future.done():
                future.set_exception(SipError("endpoint closed"))
        for _, closed in list(self._listeners.values()):
            closed()
        self._listeners.clear()
        if self._tls is not None:
            self._tls.close()

    # -- sending -----------------------------------------------------------------------------

    def send(self, message: SipMessage, peer: Peer) -> None:
        """Send now (best effort); a response is also remembered for its request's
        retransmissions from `peer`."""
        data = message.to_bytes()
        if not message.is_request:
            stranger = self.sources.kind(peer.host) == "stranger"
            resend = partial(self._send_bytes, peer=peer) if peer.transport == "UDP" else None
            self.transactions.answered(message, data, peer.source, stranger=stranger, resend=resend)
            self._note_call(message, peer)
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

    def listen(
        self, branch: str, answered: Callable[[SipMessage], None], closed: Callable[[], None]
    ) -> None:
        """Hand every response to our request of Via `branch` to `answered` (provisional ones
        and retransmissions too: an INVITE client transaction, `reinvite`) until `forget`;
        `closed()` if the endpoint closes first."""
        self._listeners[branch] = (answered, closed)

    def forget(self, branch: str) -> None:
        self._listeners.pop(branch, None)

    def _note_call(self, message: SipMessage, peer: Peer) -> None:
        """A call answered on a connection keeps it from the idle timeout until its BYE is
        answered (our BYE's answer, or ours to the caller's)."""
        connection = self._connections.get(peer.writer) if peer.writer is not None else None
        status = message.status or 0
        if connection is None or status < 200:
            return
        with contextlib.suppress(SipParseError):
            method = message.cseq[1]
            if method == "INVITE" and status < 300 and len(connection.calls) < 1024:
                connection.calls.add(message.call_id)
            elif method == "BYE":
                connection.calls.discard(message.call_id)

    # -- receiving ---------------------------------------------------------------------------

    def _admit(self, peer: Peer) -> bool:
        """Whether `peer`'s source has budget for one more message (taken, before parsing)."""
        if self.sources.admit(peer.host):
            return True
        self._warn(
            f"rate {peer.host}",
            "sip: %s over its budget: its messages are dropped unread (%d so far)",
            peer.host,
            self.sources.dropped_by.get(group(peer.host), 0),
        )
        return False

    def _received_udp(self, data: bytes, address: tuple[str, int]) -> None:
        self._received(data, Peer("UDP", address))

    def _received(self, data: bytes, peer: Peer) -> None:
        if not self._admit(peer):
            return
        if not data.strip():
            return  # a keep-alive
        try:
            message = parse_message(data)
        except SipParseError as exc:
            self._bad(peer, exc, data)
            return
        self._dispatch(message, peer)

    def _dispatch(self, message: SipMessage, peer: Peer) -> None:
        if not message.is_request:
            listener = self._listeners.get(message.branch or "")
            if listener is not None:
                return listener[0](message)
            future = self._pending.get(message.branch or "")
            if future is None:  # a late retransmission, or no request of ours at all
                line = "sip: a %s from %s answers no request of ours: dropped"
                return self._warn(f"stray {peer.host}", line, message.status, peer.address)
            if not future.done() and (message.status or 0) >= 200:
                self._note_call(message, peer)
                future.set_result(message)
            return
        answer = self.transactions.match(message, peer.source)
        if answer == "absorb":
            return
        if answer is not None:
            self._send_bytes(answer, peer)  # a retransmission: the same answer again
            return
        stranger = self.sources.kind(peer.host) == "stranger"
        self.transactions.begin(message, peer.source, stranger=stranger)
        self._spawn(self._handle(message, peer))

    def _spawn(self, work: Coroutine[object, object, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _handle(self, message: SipMessage, peer: Peer) -> None:
        try:
            await self.handler(message, peer)
        except Exception:
            log.exception("sip: handling %s from %s failed", message.method, peer.address)

    def _bad(self, peer: Peer, error: Exception, data: bytes = b"") -> None:
        """Malformed: a message with a readable Via answered once (§8.2.6), the rest dropped."""
        answer = malformed_answer(data, error) if data else None
        if answer is not None:
            self._send_bytes(answer, peer)
            line, code = "sip: malformed request from %s answered %s: %s", answer[8:11].decode()
            return self._warn(f"answered {peer.host} {code}", line, peer.address, code, error)
        self.bad_messages += 1  # logged once a source address every 10 s
        line = "sip: malformed message #%d from %s dropped: %s"
        self._warn(f"malformed {peer.address}", line, self.bad_messages, peer.address, error)

    def _warn(self, key: str, message: str, *args: object) -> None:
        """A log line a flood could repeat: one per `key` every 10 s, ten a second in all."""
        self._quiet.warn(log, key, message, *args)

    # -- TCP and TLS -------------------------------------------------------------------------

    def _let_in(self, transport: str, host: str) -> Kind | None:
        """The kind `host` is let in as, or None (logged) when a connection cap says no."""
        kind = self.sources.kind(host)
        refused = self.connections.open(host, kind)
        if refused is None:
            return kind
        self.refused_connections += 1
        self._warn(
            f"connection {host}", "sip: %s connection from %s refused: %s", transport, host, refused
        )
        return None

    async def _tcp_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        name = writer.get_extra_info("peername")
        address = (str(name[0]), int(name[1]))
        kind = self._let_in("TCP", address[0])
        if kind is None:
            writer.transport.abort()
            return
        await self._session(reader, writer, Peer("TCP", address, writer), kind)

    def _accepted_tls(self, sock: socket.socket, address: tuple[str, int]) -> None:
        kind = self._let_in("TLS", address[0])
        if kind is None:
            sock.close()
        else:
            self._spawn(self._tls_connection(sock, address, kind))

    async def _tls_connection(
        self, sock: socket.socket, address: tuple[str, int], kind: Kind
    ) -> None:
        """The handshake (within the header timeout), then SIP as on TCP."""
        assert self.tls is not None
        try:
            reader, writer = await tls_streams(sock, self.tls, self.limits.header_timeout_s)
        except BaseException as exc:
            self.connections.close(address[0], kind)
            if not isinstance(exc, OSError | TimeoutError):  # ssl.SSLError is an OSError
                raise
            self.timed_out += isinstance(exc, TimeoutError)
            why = str(exc) or type(exc).__name__
            self._warn(
                f"handshake {address[0]}", "sip: TLS handshake with %s failed: %s", address[0], why
            )
            return
        await self._session(reader, writer, Peer("TLS", address, writer), kind)

    async def _session(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: Peer, kind: Kind
    ) -> None:
        connection = _Connection(peer, kind)
        self._connections[writer] = connection
        try:
            await self._read(reader, connection)
        except (ConnectionError, OSError):
            pass
        finally:
            self.connections.close(peer.host, kind)
            self._connections.pop(writer, None)
            writer.close()

    async def _read(self, reader: asyncio.StreamReader, connection: _Connection) -> None:
        """Messages from one connection until it closes, sends garbage, goes over its source's
        budget or times out."""
        peer = connection.peer
        messages = stream_messages(
            reader,
            header_timeout_s=self.limits.header_timeout_s,
            idle_timeout_s=self.limits.idle_timeout_s,
            busy=lambda: bool(connection.calls),
            may_parse=lambda: self.sources.ready(peer.host) or self._admit(peer),
        )
        try:
            async with contextlib.aclosing(messages):
                async for message in messages:
                    if not self._admit(peer):
                        return
                    self._dispatch(message, peer)
        except SipParseError as exc:  # the framer's (MalformedStream, with the bytes) or not
            self._bad(peer, exc, exc.data if isinstance(exc, MalformedStream) else b"")
        except StreamTimeout as exc:
            self.timed_out += 1
            self._warn(
                f"timeout {peer.host}",
                "sip: %s connection from %s closed: %s",
                peer.transport,
                peer.host,
                exc,
            )

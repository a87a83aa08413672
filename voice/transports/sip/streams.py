"""SIP over TCP and TLS streams (RFC 3261 §18.3), the parts a hostile peer shapes.

`stream_messages`: a message must arrive whole within `header_timeout_s` of its first byte (a
sender of a byte now and then, or a header that never ends, is cut off), and a connection that
carries no message for `idle_timeout_s` is given up, unless `busy()` says it still carries a
call (our in-dialog requests and the caller's BYE go over it). A malformed message raises
`MalformedStream` with its bytes, so that its Via can still be answered 400 before the
connection closes (the framing is lost: nothing after it can be trusted).

TLS has its own accept loop (`accept_forever`, `tls_streams`), so that the endpoint counts a
connection against its caps before the handshake, and the handshake has a deadline."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import AsyncGenerator, Callable

from voice.transports.sip.message import (
    MAX_MESSAGE_BYTES,
    SipMessage,
    SipParseError,
    StreamFramer,
)


class MalformedStream(SipParseError):
    """A message on a stream did not parse; `data`: its bytes, from its first (at most
    MAX_MESSAGE_BYTES)."""

    def __init__(self, error: SipParseError, data: bytes) -> None:
        super().__init__(str(error))
        self.data = data


class _KeepingFramer(StreamFramer):
    """A `StreamFramer` that keeps the bytes of the message it failed on."""

    rejected = b""

    def _next(self) -> SipMessage | None:
        try:
            return super()._next()
        except SipParseError:
            # The buffer starts at the bad message here: what came before was framed and cut.
            self.rejected = bytes(self._buffer[:MAX_MESSAGE_BYTES])
            raise


class StreamTimeout(Exception):
    """A stream was too slow with a message, or idle too long."""

    def __init__(self, why: str, after_s: float) -> None:
        super().__init__(f"{why} after {after_s:g} s")
        self.why, self.after_s = why, after_s


async def stream_messages(
    reader: asyncio.StreamReader,
    *,
    header_timeout_s: float,
    idle_timeout_s: float,
    busy: Callable[[], bool],
    may_parse: Callable[[], bool],
) -> AsyncGenerator[SipMessage, None]:
    """Each message in turn until the stream ends (or `may_parse()`, asked before each piece is
    parsed, says no). StreamTimeout on a timeout; MalformedStream on a malformed message (the
    stream cannot be trusted after it: close the connection)."""
    loop = asyncio.get_running_loop()
    framer = _KeepingFramer()
    started: float | None = None  # when the first byte of the message not complete came
    last = loop.time()  # the last complete message (or the stream's start)
    while True:
        deadline = started + header_timeout_s if started is not None else last + idle_timeout_s
        try:
            async with asyncio.timeout_at(deadline):
                data = await reader.read(MAX_MESSAGE_BYTES)
        except TimeoutError:
            if started is not None:
                raise StreamTimeout("a message incomplete", header_timeout_s) from None
            if not busy():
                raise StreamTimeout("idle", idle_timeout_s) from None
            last = loop.time()  # idle, but a call on this connection is going on
            continue
        if not data or not may_parse():
            return
        try:
            messages = framer.feed(data)
        except SipParseError as exc:
            raise MalformedStream(exc, framer.rejected) from exc
        now = loop.time()
        if messages:
            last = now
            started = now if framer.incomplete else None
        elif started is None and framer.incomplete:
            started = now
        for message in messages:
            yield message


def listening_socket(host: str, port: int) -> socket.socket:
    """A non-blocking TCP socket listening on `host:port` (0: any free port)."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    listener = socket.socket(family, kind, proto)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
        listener.listen(100)
        listener.setblocking(False)
    except OSError:
        listener.close()
        raise
    return listener


async def accept_forever(
    listener: socket.socket,
    accepted: Callable[[socket.socket, tuple[str, int]], None],
    failed: Callable[[OSError], None],
) -> None:
    """Hand each connection to `accepted` (the socket, the peer's host and port)."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            sock, name = await loop.sock_accept(listener)
        except OSError as exc:  # out of file descriptors, most likely
            failed(exc)
            await asyncio.sleep(1.0)  # as asyncio's own servers do (ACCEPT_RETRY_DELAY)
            continue
        accepted(sock, (str(name[0]), int(name[1])))


async def tls_streams(
    sock: socket.socket, tls: ssl.SSLContext, timeout_s: float
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """The server side of a TLS handshake on a connection just accepted, within `timeout_s`
    (TimeoutError, or OSError such as ssl.SSLError; the socket is closed then), and its streams.
    Not `StreamWriter.start_tls`: under uvloop a ClientHello read before it is lost."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    protocol = asyncio.StreamReaderProtocol(reader)
    try:
        async with asyncio.timeout(timeout_s):
            transport, _ = await loop.connect_accepted_socket(
                lambda: protocol, sock, ssl=tls, ssl_handshake_timeout=2 * timeout_s
            )
    except BaseException:
        sock.close()
        raise
    # uvloop returns its TLS protocol, not ours: the writer needs ours
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)

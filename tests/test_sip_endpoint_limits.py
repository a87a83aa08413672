"""What a hostile source can do to the SIP endpoint (issue 22, items 3, 7 and 8): a real
`SipEndpoint` on 127.0.0.1, real UDP, TCP and TLS sockets, the allowed source on 127.0.0.1 and
strangers on 127.0.0.2-.9, and a small handler that answers as the SIP service does (the
allow-list and vouched sources are served, everyone else gets 403).

- a cached answer (a live call's 200 with its To tag and SDP) goes only to the source that
  asked: the same branch from anywhere else is a new request, judged by the handler;
- a stranger flooding UDP gets no more messages parsed than its budget allows, and the allowed
  source's OPTIONS are all answered meanwhile;
- TCP/TLS connections are capped per source, strangers fill only their share, slow and
  truncated messages and idle connections are closed."""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from voice.evals.prepared import tls_certificate
from voice.throttle import LogThrottle
from voice.transports.sip.endpoint import Peer, SipEndpoint
from voice.transports.sip.limits import SipLimits, Sources
from voice.transports.sip.message import (
    SipMessage,
    StreamFramer,
    new_branch,
    new_call_id,
    parse_message,
    parse_name_addr,
    response_to,
)

ALLOWED = "127.0.0.1"
SDP = b"v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
DEADLINE_S = 10.0  # generous: what a close or an answer may take on a loaded runner


def is_allowed(host: str) -> bool:
    return host == ALLOWED


class Service:
    """Answers as `SipService` does, in small: sources on the allow-list (127.0.0.1) or vouched
    are served (INVITE: 100 then 200 with a To tag and SDP; others: 200), the rest get 403."""

    def __init__(self) -> None:
        self.endpoint: SipEndpoint | None = None
        self.seen: list[tuple[str, str]] = []  # (method, source host) of each request handled
        self.vouched: set[str] = set()

    async def __call__(self, request: SipMessage, peer: Peer) -> None:
        assert self.endpoint is not None
        self.seen.append((request.method or "", peer.host))
        if request.method == "ACK":
            return
        if peer.host != ALLOWED and peer.host not in self.vouched:
            self.endpoint.send(response_to(request, 403, "Forbidden"), peer)
        elif request.method == "INVITE":
            self.endpoint.send(response_to(request, 100, "Trying"), peer)
            ok = response_to(
                request, 200, "OK", to_tag="bot42", body=SDP, content_type="application/sdp"
            )
            self.endpoint.send(ok, peer)
        else:
            self.endpoint.send(response_to(request, 200, "OK"), peer)

    def count(self, method: str | None = None, host: str | None = None) -> int:
        return sum(
            1
            for m, h in self.seen
            if (method is None or m == method) and (host is None or h == host)
        )


Serve = Callable[..., Awaitable[tuple[SipEndpoint, Service]]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Start a `SipEndpoint` on 127.0.0.1 (any free port) with these `SipLimits`."""
    started: list[SipEndpoint] = []

    async def start(tls: ssl.SSLContext | None = None, **kw: Any) -> tuple[SipEndpoint, Service]:
        service, limits = Service(), SipLimits(**kw)
        endpoint = SipEndpoint(ALLOWED, 0, service, tls, 0, trusted=is_allowed, limits=limits)
        service.endpoint = endpoint
        await endpoint.start()
        started.append(endpoint)
        return endpoint, service

    yield start
    for endpoint in started:
        await endpoint.close()


def sip_request(
    method: str,
    via: tuple[str, int],
    *,
    transport: str = "UDP",
    branch: str | None = None,
    call_id: str | None = None,
    cseq: int = 1,
    body: bytes = b"",
) -> bytes:
    host, port = via
    lines = [
        f"{method} sip:+15551230000@127.0.0.1 SIP/2.0",
        f"Via: SIP/2.0/{transport} {host}:{port};branch={branch or new_branch()};rport",
        "Max-Forwards: 70",
        f"From: <sip:caller@{host}>;tag=caller",
        "To: <sip:+15551230000@127.0.0.1>",
        f"Call-ID: {call_id or new_call_id(host)}",
        f"CSeq: {cseq} {method}",
        f"Content-Length: {len(body)}",
    ]
    if body:
        lines.append("Content-Type: application/sdp")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class UdpPhone(asyncio.DatagramProtocol):
    """A UDP client bound to `host`: what it sends, and the responses that come back."""

    def __init__(self) -> None:
        self.inbox: asyncio.Queue[SipMessage] = asyncio.Queue()
        self.received: list[SipMessage] = []
        self.transport: asyncio.DatagramTransport | None = None
        self.address = ("", 0)

    @classmethod
    async def open(cls, host: str, port: int) -> UdpPhone:
        loop = asyncio.get_running_loop()
        transport, phone = await loop.create_datagram_endpoint(
            cls, local_addr=(host, 0), remote_addr=(ALLOWED, port)
        )
        phone.transport = transport
        phone.address = transport.get_extra_info("sockname")[:2]
        return phone

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        message = parse_message(data)
        self.received.append(message)
        self.inbox.put_nowait(message)

    def send(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.sendto(data)

    async def final(self, timeout_s: float = DEADLINE_S) -> SipMessage:
        """The next final response."""
        async with asyncio.timeout(timeout_s):
            while True:
                message = await self.inbox.get()
                if (message.status or 0) >= 200:
                    return message

    async def ask(self, data: bytes) -> SipMessage:
        """Send a request until a final answer comes (as a phone does over UDP: Timer E)."""
        for _ in range(20):
            self.send(data)
            try:
                return await self.final(0.5)
            except TimeoutError:
                continue
        raise TimeoutError("no answer after 20 tries")

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class StreamPhone:
    """A TCP (or TLS) client bound to `host`."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.framer = StreamFramer()
        self.messages: list[SipMessage] = []
        self.address: tuple[str, int] = writer.get_extra_info("sockname")[:2]

    @classmethod
    async def open(cls, host: str, port: int, tls: ssl.SSLContext | None = None) -> StreamPhone:
        reader, writer = await asyncio.open_connection(
            ALLOWED, port, local_addr=(host, 0), ssl=tls, server_hostname=ALLOWED if tls else None
        )
        return cls(reader, writer)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def final(self, timeout_s: float = DEADLINE_S) -> SipMessage:
        async with asyncio.timeout(timeout_s):
            while True:
                while self.messages:
                    message = self.messages.pop(0)
                    if (message.status or 0) >= 200:
                        return message
                data = await self.reader.read(65536)
                if not data:
                    raise ConnectionError("closed")
                self.messages.extend(self.framer.feed(data))

    async def closed(self, timeout_s: float = DEADLINE_S) -> None:
        """Returns once the endpoint has closed the connection (TimeoutError if it does not)."""
        async with asyncio.timeout(timeout_s):
            try:
                while await self.reader.read(65536):
                    pass
            except (ConnectionError, ssl.SSLError):
                pass

    def close(self) -> None:
        self.writer.close()


# -- item 3: retransmissions ---------------------------------------------------------------


@pytest.mark.slow
async def test_a_cached_answer_goes_only_to_the_source_that_asked(serve: Serve) -> None:
    endpoint, service = await serve()
    caller = await UdpPhone.open(ALLOWED, endpoint.port)
    stranger = await UdpPhone.open("127.0.0.2", endpoint.port)
    branch, call_id = new_branch(), new_call_id(ALLOWED)
    invite = sip_request("INVITE", caller.address, branch=branch, call_id=call_id, body=SDP)
    caller.send(invite)
    ok = await caller.final()
    assert ok.status == 200 and parse_name_addr(ok.header("To") or "").tag == "bot42"

    # the stranger replays the live call's INVITE as it was on the wire: same branch, sent-by
    stranger.send(invite)
    refused = await stranger.final()
    assert refused.status == 403 and refused.body == b""
    assert all(m.status != 200 and b"bot42" not in m.to_bytes() for m in stranger.received)
    assert service.count("INVITE", "127.0.0.2") == 1  # it went to the handler, as new
    # its ACK of the 403 belongs to its INVITE's transaction: taken there, not handled
    stranger.send(sip_request("ACK", caller.address, branch=branch, call_id=call_id))
    assert (await stranger.ask(sip_request("OPTIONS", stranger.address))).status == 403
    assert service.count("ACK") == 0

    # the caller's own retransmission gets its cached 200, from the transaction layer
    caller.send(invite)
    again = await caller.final()
    assert again.status == 200 and again.body == SDP
    assert service.count("INVITE", ALLOWED) == 1
    # a CANCEL with the INVITE's branch is a transaction of its own
    cancel = sip_request("CANCEL", caller.address, branch=branch, call_id=call_id)
    answer = await caller.ask(cancel)
    assert answer.cseq[1] == "CANCEL" and service.count("CANCEL", ALLOWED) == 1
    caller.close()
    stranger.close()


@pytest.mark.slow
async def test_over_tcp_a_retransmission_may_come_on_a_new_connection_of_the_same_host(
    serve: Serve,
) -> None:
    endpoint, service = await serve()
    first = await StreamPhone.open(ALLOWED, endpoint.port)
    invite = sip_request("INVITE", first.address, transport="TCP", body=SDP)
    await first.send(invite)
    assert (await first.final()).status == 200
    second = await StreamPhone.open(ALLOWED, endpoint.port)  # the caller's new connection
    await second.send(invite)
    again = await second.final()
    assert again.status == 200 and again.body == SDP and service.count("INVITE") == 1
    stranger = await StreamPhone.open("127.0.0.3", endpoint.port)
    await stranger.send(invite)
    refused = await stranger.final()
    assert refused.status == 403 and b"bot42" not in refused.to_bytes()
    assert service.count("INVITE", "127.0.0.3") == 1
    for phone in (first, second, stranger):
        phone.close()


@pytest.mark.slow
async def test_strangers_cannot_grow_the_transactions_or_push_out_the_allowed_ones(
    serve: Serve,
) -> None:
    endpoint, service = await serve(
        stranger_rate=1e6, stranger_burst=1e6, strangers_rate=1e6, strangers_burst=1e6,
        stranger_transactions=16, transactions=64,
    )  # fmt: skip
    caller = await UdpPhone.open(ALLOWED, endpoint.port)
    invite = sip_request("INVITE", caller.address, body=SDP)
    assert (await caller.ask(invite)).status == 200
    stranger = await StreamPhone.open("127.0.0.2", endpoint.port)
    flood = b"".join(sip_request("OPTIONS", stranger.address, transport="TCP") for _ in range(300))
    await stranger.send(flood)
    for _ in range(300):
        assert (await stranger.final()).status == 403
    assert service.count("OPTIONS", "127.0.0.2") == 300
    assert len(endpoint.transactions) <= 16 + 64
    caller.send(invite)  # still remembered
    assert (await caller.final()).status == 200 and service.count("INVITE") == 1
    caller.close()
    stranger.close()


# -- item 8: messages per source ------------------------------------------------------------


def _flood(port: int, datagrams: list[bytes], source: socket.socket) -> None:
    for data in datagrams:
        source.sendto(data, (ALLOWED, port))


@pytest.mark.slow
async def test_a_flooding_stranger_is_held_to_its_budget_and_the_allowed_source_is_answered(
    serve: Serve, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "voice.transports.sip.endpoint")
    endpoint, service = await serve()  # the production budget: 20 a second, 40 at once
    limits = SipLimits()
    caller = await UdpPhone.open(ALLOWED, endpoint.port)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as source:
        source.bind(("127.0.0.2", 0))
        sent_by = source.getsockname()[:2]
        datagrams = [sip_request("OPTIONS", sent_by) for _ in range(2000)]
        started = time.monotonic()
        flood = asyncio.create_task(asyncio.to_thread(_flood, endpoint.port, datagrams, source))
        answers = []
        while not flood.done() or len(answers) < 20:
            answers.append(await caller.ask(sip_request("OPTIONS", caller.address)))
        await flood
        # this one queued behind the whole flood: once it is answered, every datagram of the
        # stranger has been handled or dropped
        answers.append(await caller.ask(sip_request("OPTIONS", caller.address)))
        elapsed = time.monotonic() - started
    assert all(answer.status == 200 for answer in answers)
    handled = service.count(host="127.0.0.2")
    allowed = limits.stranger_burst + limits.stranger_rate * elapsed
    assert handled <= allowed + 1, (handled, elapsed)
    assert endpoint.rate_dropped > 0 and handled + endpoint.rate_dropped <= 2000
    lines = [r for r in caplog.records if "127.0.0.2 over its budget" in r.getMessage()]
    assert 1 <= len(lines) <= 1 + elapsed / 10
    caller.close()


def test_a_strangers_budget_refills_and_a_vouched_source_gets_more() -> None:
    now = [0.0]
    limits = SipLimits(stranger_rate=10, stranger_burst=20, vouched_rate=100, vouched_burst=200)
    sources = Sources(limits, is_allowed, clock=lambda: now[0])
    assert sum(sources.admit(ALLOWED) for _ in range(10_000)) == 10_000  # no budget
    assert sum(sources.admit("127.0.0.2") for _ in range(100)) == 20
    now[0] += 1.0
    assert sum(sources.admit("127.0.0.2") for _ in range(100)) == 10
    assert sources.dropped == 170 and sources.dropped_by["127.0.0.2"] == 170
    sources.vouch("127.0.0.2")
    assert sources.kind("127.0.0.2") == "vouched"
    assert sum(sources.admit("127.0.0.2") for _ in range(1000)) == 200
    now[0] += limits.vouch_s + 1  # the proof is old: a stranger again, with a full bucket
    assert sources.kind("127.0.0.2") == "stranger"
    assert sum(sources.admit("127.0.0.2") for _ in range(100)) == 20


def test_strangers_together_have_a_budget_and_the_tables_stay_bounded() -> None:
    now = [0.0]
    limits = SipLimits(strangers_rate=50, strangers_burst=100, max_sources=64)
    sources = Sources(limits, is_allowed, clock=lambda: now[0])
    # 10 000 (spoofed) sources, 5 messages each: within each one's budget, not within all's
    admitted = sum(
        sources.admit(f"10.{i // 256}.{i % 256}.1") for i in range(10_000) for _ in "12345"
    )
    assert admitted == 100
    assert len(sources) <= 3 * 64 and len(sources.dropped_by) <= 1024
    assert sources.admit(ALLOWED)  # the allow-list is never refused
    # an IPv6 subscriber's /64 is one source
    assert sum(sources.admit(f"2001:db8:1:2::{i:x}") for i in range(100)) <= limits.stranger_burst


def test_a_flood_of_log_lines_is_held_back() -> None:
    now = [0.0]
    throttle = LogThrottle(every_s=10.0, per_s=1.0, burst=10.0, clock=lambda: now[0])
    assert sum(throttle.allow("rate 127.0.0.2") for _ in range(1000)) == 1
    assert sum(throttle.allow(f"rate 10.0.0.{i}") for i in range(200)) == 9  # the rest of 10
    now[0] += 10.0
    assert throttle.allow("rate 127.0.0.2")
    assert throttle.held_back == 1000 - 1 + 200 - 9


# -- item 7: TCP and TLS connections --------------------------------------------------------


@pytest.mark.slow
async def test_strangers_fill_their_share_and_the_allowed_source_still_gets_in(
    serve: Serve, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "voice.transports.sip.endpoint")
    endpoint, service = await serve(
        max_connections=8, off_list_connections=6, stranger_connections=4, connections_per_host=2
    )
    port = endpoint.port

    async def served(phone: StreamPhone) -> int | None:
        await phone.send(sip_request("OPTIONS", phone.address, transport="TCP"))
        return (await phone.final()).status

    kept = [await StreamPhone.open("127.0.0.2", port) for _ in range(2)]
    assert [await served(phone) for phone in kept] == [403, 403]  # let in, and refused SIP
    over = await StreamPhone.open("127.0.0.2", port)  # a third from the same host
    await over.closed()
    kept += [await StreamPhone.open("127.0.0.3", port) for _ in range(2)]
    assert [await served(phone) for phone in kept[2:]] == [403, 403]
    shut_out = await StreamPhone.open("127.0.0.4", port)  # the strangers' share is full
    await shut_out.closed()
    endpoint.vouch("127.0.0.5")  # proved a digest user: a share of its own
    service.vouched.add("127.0.0.5")
    kept += [await StreamPhone.open("127.0.0.5", port) for _ in range(2)]
    assert [await served(phone) for phone in kept[4:]] == [200, 200]
    pbx = [await StreamPhone.open(ALLOWED, port) for _ in range(2)]
    assert [await served(phone) for phone in pbx] == [200, 200]
    assert endpoint.refused_connections == 2
    assert endpoint.connections.strangers == 4 and endpoint.connections.total == 8
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert any("127.0.0.2 refused: it has 2 connections open" in line for line in refusals)
    assert any("127.0.0.4 refused: the strangers' share is taken" in line for line in refusals)
    for phone in [*kept, over, shut_out, *pbx]:
        phone.close()


@pytest.mark.slow
async def test_a_trickled_message_and_a_truncated_header_are_closed(serve: Serve) -> None:
    endpoint, service = await serve(header_timeout_s=0.3)
    truncated = await StreamPhone.open(ALLOWED, endpoint.port)  # even from the allow-list
    await truncated.send(sip_request("OPTIONS", truncated.address, transport="TCP")[:60])
    trickler = await StreamPhone.open("127.0.0.2", endpoint.port)
    message = sip_request("OPTIONS", trickler.address, transport="TCP")
    closed = asyncio.create_task(trickler.closed(DEADLINE_S + len(message) * 0.03))
    sent = 0
    for byte in message:  # one byte every 30 ms: the whole message would take about 7 s
        if closed.done():
            break
        try:
            await trickler.send(bytes([byte]))
        except ConnectionError:
            break
        sent += 1
        await asyncio.sleep(0.03)  # the trickle's pace (nothing waits on it)
    await closed
    assert sent < len(message) and service.count(host="127.0.0.2") == 0
    await truncated.closed()
    assert service.count() == 0 and endpoint.timed_out == 2
    whole = await StreamPhone.open(ALLOWED, endpoint.port)  # a whole message is no trouble
    await whole.send(message)
    assert (await whole.final()).status == 200
    for phone in (truncated, trickler, whole):
        phone.close()


@pytest.mark.slow
async def test_an_idle_connection_is_closed_but_not_one_carrying_a_call(serve: Serve) -> None:
    endpoint, _ = await serve(idle_timeout_s=0.5)
    call = await StreamPhone.open(ALLOWED, endpoint.port)
    call_id = new_call_id(ALLOWED)
    await call.send(sip_request("INVITE", call.address, transport="TCP", call_id=call_id, body=SDP))
    assert (await call.final()).status == 200
    await call.send(sip_request("ACK", call.address, transport="TCP", call_id=call_id))
    idle = await StreamPhone.open(ALLOWED, endpoint.port)  # its last message after the call's
    await idle.send(sip_request("OPTIONS", idle.address, transport="TCP"))
    assert (await idle.final()).status == 200
    await idle.closed()
    # the call's connection has been as quiet for longer, and is still open
    await call.send(sip_request("OPTIONS", call.address, transport="TCP"))
    assert (await call.final()).status == 200
    bye = sip_request("BYE", call.address, transport="TCP", call_id=call_id, cseq=2)
    await call.send(bye)
    assert (await call.final()).status == 200
    await call.closed()  # the call is over: now it is idle like any other
    assert endpoint.timed_out == 2 and endpoint.connections.total == 0
    call.close()
    idle.close()


def _certificate(directory: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server context with a self-signed certificate for 127.0.0.1; a client trusting it."""
    cert, key_file, client = tls_certificate(directory)
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert, key_file)
    return server, client


@pytest.mark.slow
async def test_tls_is_capped_before_the_handshake_and_a_silent_one_is_closed(
    serve: Serve, tmp_path: Path
) -> None:
    server_tls, client_tls = _certificate(tmp_path)
    endpoint, _ = await serve(server_tls, header_timeout_s=0.3)
    phone = await StreamPhone.open(ALLOWED, endpoint.tls_port, client_tls)
    await phone.send(sip_request("OPTIONS", phone.address, transport="TLS"))
    assert (await phone.final()).status == 200
    silent = await StreamPhone.open("127.0.0.2", endpoint.tls_port)  # TCP, no ClientHello
    await silent.closed()
    assert endpoint.timed_out == 1
    # caps count a connection from its first moment, not after its handshake
    patient, _ = await serve(server_tls, connections_per_host=1)
    first = await StreamPhone.open("127.0.0.3", patient.tls_port)  # holds its slot, silent
    second = await StreamPhone.open("127.0.0.3", patient.tls_port)
    await second.closed()
    assert patient.refused_connections == 1
    for each in (phone, silent, first, second):
        each.close()

"""Strangers inside someone else's SIP call, and the CANCEL races: a real `hotline serve` (SIP
on, 127.0.0.1 the only allowed source), driven with raw SIP over UDP from 127.0.0.1 (the
caller) and from 127.0.0.2-127.0.0.9 (strangers who know the call's Call-ID, tags and branch).
A stranger's re-INVITE, BYE and CANCEL get 403 and change nothing; a CANCEL right behind its
INVITE always wins (200, then 487, never a 200 for the INVITE, nothing kept); a second INVITE
with a call's Call-ID gets 482 and makes no second call."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.support.poll import PollTimeout, wait_until
from tests.support.server import LogMark, Server, logged
from tests.support.sip_server import NUMBER, SipServer

pytestmark = pytest.mark.slow


# -- a raw SIP phone ---------------------------------------------------------------------------


@dataclass
class Response:
    status: int
    method: str  # of its CSeq
    branch: str
    to_tag: str | None
    text: str


def parse_response(data: bytes) -> Response | None:
    text = data.decode("utf-8", "replace")
    if not text.startswith("SIP/2.0 "):
        return None  # a request (our BYE, say)
    head = text.split("\r\n\r\n", 1)[0].split("\r\n")
    headers: dict[str, str] = {}
    for line in head[1:]:
        name, _, value = line.partition(":")
        headers.setdefault(name.strip().lower(), value.strip())
    to_tag = headers["to"].split(";tag=")[1].split(";")[0] if ";tag=" in headers["to"] else None
    branch = headers["via"].split("branch=z9hG4bK")[1].split(";")[0]
    return Response(int(head[0].split(" ")[1]), headers["cseq"].split()[1], branch, to_tag, text)


class Phone:
    """A SIP user agent on one loopback address: a SIP socket and an RTP socket."""

    def __init__(self, host: str, server_port: int, user: str) -> None:
        self.host, self.server_port, self.user = host, server_port, user
        self.sip = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sip.bind((host, 0))
        self.rtp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.rtp.bind((host, 0))
        self.sip_port = self.sip.getsockname()[1]
        self.rtp_port = self.rtp.getsockname()[1]

    def close(self) -> None:
        self.sip.close()
        self.rtp.close()

    def sdp(self) -> str:
        return (
            f"v=0\r\no=- 1 1 IN IP4 {self.host}\r\ns=-\r\nc=IN IP4 {self.host}\r\nt=0 0\r\n"
            f"m=audio {self.rtp_port} RTP/AVP 0\r\n"
        )

    def request(
        self,
        method: str,
        call: str,
        branch: str,
        *,
        cseq: int = 1,
        from_tag: str = "caller-tag",
        to_tag: str | None = None,
        sent_by: str | None = None,
        sdp: bool = False,
    ) -> bytes:
        """A request of `call` (a SIP Call-ID) as this phone would send it; `sent_by` in the
        Via is this phone's address unless given (a stranger copying someone else's Via)."""
        via = sent_by or f"{self.host}:{self.sip_port}"
        to = f"<sip:{NUMBER}@127.0.0.1>" + (f";tag={to_tag}" if to_tag else "")
        body = self.sdp() if sdp else ""
        return (
            f"{method} sip:{NUMBER}@127.0.0.1:{self.server_port} SIP/2.0\r\n"
            f"Via: SIP/2.0/UDP {via};branch=z9hG4bK{branch};rport\r\nMax-Forwards: 70\r\n"
            f"From: <sip:{self.user}@{self.host}>;tag={from_tag}\r\nTo: {to}\r\n"
            f"Call-ID: {call}\r\nCSeq: {cseq} {method}\r\n"
            f"Contact: <sip:{self.user}@{self.host}:{self.sip_port}>\r\n"
            + ("Content-Type: application/sdp\r\n" if body else "")
            + f"Content-Length: {len(body)}\r\n\r\n{body}"
        ).encode()

    def send(self, *messages: bytes) -> None:
        for message in messages:
            self.sip.sendto(message, ("127.0.0.1", self.server_port))

    def until(
        self, done: Callable[[list[Response]], bool], within_s: float = 5.0
    ) -> list[Response]:
        """The responses received (requests to us are left aside) until `done(responses)`;
        fails after `within_s` with the statuses that came."""
        seen: list[Response] = []

        def check() -> bool:
            for data in waiting(self.sip):
                if (response := parse_response(data)) is not None:
                    seen.append(response)
            return done(seen)

        try:
            wait_until(check, f"{self.host}: the responses awaited", within_s)
        except PollTimeout as timeout:
            raise AssertionError(f"{timeout}; got {[(r.status, r.method) for r in seen]}") from None
        return seen

    def rtp_packets(self, count: int, within_s: float = 5.0) -> int:
        """Wait for `count` RTP packets at this phone's RTP port; how many came (fails if
        fewer within `within_s`)."""
        got = [0]

        def check() -> bool:
            got[0] += len(waiting(self.rtp))
            return got[0] >= count

        try:
            wait_until(check, f"{self.host}: {count} RTP packets", within_s)
        except PollTimeout as timeout:
            raise AssertionError(f"{timeout}; {got[0]} came") from None
        return got[0]  # (all that were waiting: `count` or more)

    def rtp_waiting(self) -> int:
        """The RTP packets that arrived and were not read yet (read now)."""
        return len(waiting(self.rtp))


def waiting(sock: socket.socket) -> list[bytes]:
    """The datagrams that arrived at `sock` and were not read yet (read now)."""
    sock.setblocking(False)
    got: list[bytes] = []
    with contextlib.suppress(BlockingIOError):
        while True:
            got.append(sock.recv(65535))
    return got


def final(*transactions: tuple[str, str]) -> Callable[[list[Response]], bool]:
    """Whether a final response came for each (method, branch)."""
    return lambda seen: all(
        any(r.method == method and r.branch == branch and r.status >= 200 for r in seen)
        for method, branch in transactions
    )


def of(seen: list[Response], method: str, branch: str | None = None) -> list[int]:
    return [r.status for r in seen if r.method == method and branch in (None, r.branch)]


# -- the server's side -------------------------------------------------------------------------


def calls_of(server: Server, caller: str) -> list[dict[str, Any]]:
    """The server's calls in progress (admitted ones included) from `caller` (a From user)."""
    listed = httpx.get(f"{server.url}/calls").json()["calls"]
    return [c for c in listed if c["transport"] == "sip" and c["caller"] == caller]


def logged_sync(server: Server, fragment: str, since: LogMark) -> None:
    """`logged()` for these tests, which are synchronous (blocking sockets): a line after
    `since` holding `fragment`, or its failure with the server's last lines."""
    asyncio.run(logged(server, fragment, since=since))


def active_calls(server: Server) -> int:
    """The calls this worker holds a slot for (its /healthz count, admitted calls included)."""
    count: int = httpx.get(f"{server.url}/healthz").json()["active_calls"]
    return count


def rtp_sockets(pid: int, ports: tuple[int, int]) -> int:
    """The UDP sockets process `pid` holds on `ports` (its RTP range)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    with open(f"/proc/{pid}/net/udp") as table:
        rows = [line.split() for line in table.read().splitlines()[1:]]
    low, high = ports
    return sum(low <= int(row[1].split(":")[1], 16) < high and row[9] in inodes for row in rows)


def answered_call(phone: Phone, call: str) -> Response:
    """Place a call and ACK its 200; the 200."""
    phone.send(phone.request("INVITE", call, f"{call}-1", sdp=True))
    seen = phone.until(final(("INVITE", f"{call}-1")))
    [ok] = [r for r in seen if r.method == "INVITE" and r.status >= 200]
    assert ok.status == 200, ok.text
    phone.send(phone.request("ACK", call, f"{call}-ack", to_tag=ok.to_tag))
    return ok


def hang_up(server: Server, phone: Phone, call: str, to_tag: str | None) -> None:
    """The caller's BYE: 200, and the call is gone from the server."""
    phone.send(phone.request("BYE", call, f"{call}-bye", cseq=9, to_tag=to_tag))
    assert of(phone.until(final(("BYE", f"{call}-bye"))), "BYE") == [200]
    wait_until(lambda: not calls_of(server, phone.user), f"{phone.user}'s call to end")


# -- the tests ---------------------------------------------------------------------------------


@dataclass
class Line:
    """The shared SIP server, and the phones a test placed on it (closed after the test)."""

    server: Server
    port: int
    rtp_ports: tuple[int, int]
    phones: list[Phone]

    def phone(self, host: str, user: str) -> Phone:
        made = Phone(host, self.port, user)
        self.phones.append(made)
        return made


@pytest.fixture
def line(sip_server: SipServer) -> Iterator[Line]:
    made = Line(sip_server.server, sip_server.port, sip_server.rtp_ports, [])
    yield made
    for phone in made.phones:
        phone.close()


def test_a_strangers_reinvite_is_refused_and_the_media_stays_with_the_caller(
    line: Line,
) -> None:
    server = line.server
    caller = line.phone("127.0.0.1", "reinvited")
    stranger = line.phone("127.0.0.2", "stranger")
    call = "reinvite-call"
    ok = answered_call(caller, call)
    caller.rtp_packets(10)  # the bot's RTP (silence) flows to the caller
    # the stranger knows the Call-ID and both tags, and offers its own RTP address
    move = stranger.request("INVITE", call, "move", cseq=2, to_tag=ok.to_tag, sdp=True)
    mark = server.log_mark()
    stranger.send(move)
    assert of(stranger.until(final(("INVITE", "move"))), "INVITE") == [403]
    logged_sync(server, "sip: INVITE from 127.0.0.2 refused", since=mark)
    caller.rtp_waiting()
    assert caller.rtp_packets(25) >= 25  # the media still goes to the caller...
    assert stranger.rtp_waiting() == 0  # ...and none to the stranger
    hang_up(server, caller, call, ok.to_tag)


def test_a_strangers_bye_and_update_are_refused_and_the_call_goes_on(line: Line) -> None:
    server = line.server
    caller = line.phone("127.0.0.1", "byed")
    stranger = line.phone("127.0.0.3", "stranger")
    call = "bye-call"
    ok = answered_call(caller, call)
    [listed] = calls_of(server, "byed")
    mark = server.log_mark()
    stranger.send(stranger.request("BYE", call, "bye", cseq=3, to_tag=ok.to_tag))
    stranger.send(stranger.request("UPDATE", call, "upd", cseq=4, to_tag=ok.to_tag))
    try:
        seen = stranger.until(final(("BYE", "bye"), ("UPDATE", "upd")))
    except AssertionError as missing:  # once in CI the BYE's 403 never came: the server's side
        raise AssertionError("\n".join([str(missing), *server.log[mark.line :][-40:]])) from None
    assert (of(seen, "BYE"), of(seen, "UPDATE")) == ([403], [403])
    logged_sync(server, "sip: BYE from 127.0.0.3 refused", since=mark)
    caller.rtp_waiting()
    caller.rtp_packets(25)  # the call goes on
    detail = httpx.get(f"{server.url}/calls/{listed['call_id']}").json()
    assert detail["state"] != "ended", detail
    hang_up(server, caller, call, ok.to_tag)  # and ends with the caller's own BYE


def test_a_ringing_call_is_cancelled_only_by_its_caller_and_by_its_invites_branch(
    line: Line,
) -> None:
    server = line.server
    caller = line.phone("127.0.0.1", "ringing")
    stranger = line.phone("127.0.0.4", "stranger")
    call = "ringing-call"
    caller.send(caller.request("INVITE", call, "ring-1", sdp=True))
    caller.until(lambda seen: 180 in of(seen, "INVITE"))
    # the INVITE's own branch and Via, copied, from elsewhere and with another tag
    cancel = stranger.request(
        "CANCEL", call, "ring-1", from_tag="other-tag", sent_by=f"127.0.0.1:{caller.sip_port}"
    )
    mark = server.log_mark()
    stranger.send(cancel)
    assert of(stranger.until(final(("CANCEL", "ring-1"))), "CANCEL") == [403]
    logged_sync(server, "sip: CANCEL from 127.0.0.4 refused", since=mark)
    # from the caller's address, but for a transaction that does not exist: 481
    caller.send(caller.request("CANCEL", call, "ring-2"))
    seen = caller.until(final(("CANCEL", "ring-2"), ("INVITE", "ring-1")))
    assert of(seen, "CANCEL") == [481]
    assert of(seen, "INVITE") == [200]  # the call is answered all the same
    [ok] = [r for r in seen if r.method == "INVITE"]
    caller.send(caller.request("ACK", call, "ring-ack", to_tag=ok.to_tag))
    hang_up(server, caller, call, ok.to_tag)


def test_a_cancel_right_behind_its_invite_always_wins_and_keeps_nothing(line: Line) -> None:
    server = line.server
    caller = line.phone("127.0.0.1", "hasty")
    rtp_before = rtp_sockets(server.process.pid, line.rtp_ports)
    slots_before = active_calls(server)  # (a call of an earlier test may still be ending)
    for n in range(20):
        call, branch = f"race{n}-call", f"race{n}"
        caller.send(  # one burst: the CANCEL arrives while the INVITE is being admitted
            caller.request("INVITE", call, branch, sdp=True),
            caller.request("CANCEL", call, branch),
        )
        seen = caller.until(final(("INVITE", branch), ("CANCEL", branch)))
        assert [s for s in of(seen, "CANCEL") if s >= 200] == [200], (n, seen)
        assert [s for s in of(seen, "INVITE") if s >= 200] == [487], (n, seen)
        caller.send(caller.request("ACK", call, branch))  # the 487's ACK
    # nothing kept: no call admitted or holding a slot, no RTP port open
    wait_until(lambda: not calls_of(server, "hasty"), "the cancelled calls to go")
    wait_until(lambda: active_calls(server) <= slots_before, f"slots held back to {slots_before}")
    assert rtp_sockets(server.process.pid, line.rtp_ports) <= rtp_before
    second = line.phone("127.0.0.1", "hasty-too")  # and calls are answered again
    first_ok, second_ok = (
        answered_call(caller, "after1-call"),
        answered_call(second, "after2-call"),
    )
    hang_up(server, caller, "after1-call", first_ok.to_tag)
    hang_up(server, second, "after2-call", second_ok.to_tag)


def test_a_second_invite_with_a_calls_call_id_makes_no_second_call(line: Line) -> None:
    server = line.server
    caller = line.phone("127.0.0.1", "twice")
    call = "twice-call"
    mark = server.log_mark()
    caller.send(  # the same request forked over two paths: two branches, one Call-ID
        caller.request("INVITE", call, "fork-a", sdp=True),
        caller.request("INVITE", call, "fork-b", sdp=True),
    )
    seen = caller.until(final(("INVITE", "fork-a"), ("INVITE", "fork-b")))
    finals = {r.branch: r for r in seen if r.status >= 200}
    assert (finals["fork-a"].status, finals["fork-b"].status) == (200, 482)
    logged_sync(server, "its Call-ID is in use (482)", since=mark)
    caller.send(caller.request("ACK", call, "fork-ack", to_tag=finals["fork-a"].to_tag))
    assert len(calls_of(server, "twice")) == 1
    # a retransmission of the answered INVITE makes no call either
    caller.send(caller.request("INVITE", call, "fork-a", sdp=True))
    hang_up(server, caller, call, finals["fork-a"].to_tag)  # the one call ends


def test_a_refusal_a_flood_repeats_is_logged_now_and_then(caplog: pytest.LogCaptureFixture) -> None:
    from voice.server.routes.sip_calls import WARN_EVERY_S  # new with the fix
    from voice.throttle import LogThrottle

    now = [0.0]
    warnings = LogThrottle(every_s=WARN_EVERY_S, clock=lambda: now[0])
    sip_log = logging.getLogger("voice.server.routes.sip")
    with caplog.at_level(logging.WARNING, logger="voice.server.routes.sip"):
        for _ in range(50):
            warnings.warn(sip_log, "cancel", "sip: CANCEL from %s refused", "127.0.0.5")
        warnings.warn(sip_log, "ack", "sip: ACK from %s dropped", "127.0.0.5")  # its own kind
        now[0] = WARN_EVERY_S
        warnings.warn(sip_log, "cancel", "sip: CANCEL from %s refused", "127.0.0.6")
    assert [r.getMessage() for r in caplog.records] == [
        "sip: CANCEL from 127.0.0.5 refused",
        "sip: ACK from 127.0.0.5 dropped",
        "sip: CANCEL from 127.0.0.6 refused (49 more like it left out)",
    ]

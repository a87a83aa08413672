"""Timer G / H (RFC 3261 §17.2.1): a refusal of an INVITE over UDP is resent, at growing
intervals, until the ACK; bounded for strangers. Unit tests of `Resender` and
`ServerTransactions` with short timers, and one raw-UDP exchange with the shared server."""

from __future__ import annotations

import asyncio
import socket
import time
import uuid

import pytest

from tests.support.sip_server import NUMBER, SipServer
from voice.transports.sip.message import parse_message
from voice.transports.sip.resend import Resender
from voice.transports.sip.timers import SessionTimer
from voice.transports.sip.transactions import ServerTransactions

T1 = 0.01  # unit tests: Timer G from 10 ms, up to 40 ms; Timer H at 640 ms


def _answer(status: int) -> bytes:
    head = (
        "Via: SIP/2.0/UDP 10.0.0.1:5060;branch=z9hG4bKtimer1\r\n"
        "From: <sip:a@10.0.0.1>;tag=f\r\nTo: <sip:b@10.0.0.2>{to}\r\n"
        "Call-ID: timer-call\r\nCSeq: 1 INVITE\r\nContent-Length: 0\r\n\r\n"
    )
    return (f"SIP/2.0 {status} Busy Here\r\n" + head.format(to=";tag=t")).encode()


def _ack() -> bytes:
    return (
        b"ACK sip:b@10.0.0.2 SIP/2.0\r\nVia: SIP/2.0/UDP 10.0.0.1:5060;branch=z9hG4bKtimer1\r\n"
        b"From: <sip:a@10.0.0.1>;tag=f\r\nTo: <sip:b@10.0.0.2>;tag=t\r\n"
        b"Call-ID: timer-call\r\nCSeq: 1 ACK\r\nContent-Length: 0\r\n\r\n"
    )


async def _until(check: object, within_s: float = 5.0) -> None:
    deadline = time.monotonic() + within_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)  # the event loop runs the timers meanwhile


def test_a_refusal_is_resent_at_doubling_intervals_until_the_ack() -> None:
    async def run() -> None:
        transactions = ServerTransactions(
            64 * T1, max_entries=10, max_stranger_entries=10, clock=time.monotonic
        )
        transactions.resender = Resender(t1=T1, t2=4 * T1)
        sent: list[float] = []
        answer = _answer(486)
        source = ("UDP", "10.0.0.1", 5060)
        transactions.answered(
            parse_message(answer),
            answer,
            source,
            stranger=False,
            resend=lambda data: sent.append(time.monotonic()),
        )
        start = time.monotonic()
        await _until(lambda: len(sent) >= 3)
        gaps = [b - a for a, b in zip([start, *sent], sent, strict=False)]
        assert gaps[2] > gaps[0]  # the interval grows (T1, 2·T1, 4·T1)
        assert transactions.match(parse_message(_ack()), source) == "absorb"
        count = len(sent)
        assert len(transactions.resender) == 0  # Timer G stopped by the ACK
        await asyncio.sleep(8 * T1)  # several intervals: nothing more may come
        assert len(sent) == count

    asyncio.run(run())


def test_without_an_ack_timer_h_gives_up_and_tcp_or_2xx_are_not_resent() -> None:
    async def run() -> None:
        resender = Resender(t1=T1, t2=4 * T1)
        sent: list[bytes] = []
        resender.start(("k",), b"486", sent.append, "10.0.0.1", stranger=False)
        await _until(lambda: len(resender) == 0)  # Timer H: 64·T1 after the first send
        assert 5 <= len(sent) <= 64  # T1, 2, 4, 4, 4 ... within 64·T1: about 17
        transactions = ServerTransactions(64 * T1, max_entries=10, max_stranger_entries=10)
        ok = _answer(200)
        busy = _answer(486)
        src = ("UDP", "10.0.0.1", 5060)
        transactions.answered(parse_message(ok), ok, src, stranger=False, resend=sent.append)
        transactions.answered(parse_message(busy), busy, ("TCP", "10.0.0.1", 0), stranger=False)
        assert len(transactions.resender) == 0  # a 2xx is the dialog's; TCP needs no resend

    asyncio.run(run())


def test_a_stranger_cannot_make_us_a_reflector() -> None:
    async def run() -> None:
        resender = Resender(t1=T1, per_host=2, strangers=3)
        sent: list[bytes] = []
        started = [
            resender.start((f"k{i}",), b"403", sent.append, "192.0.2.9", stranger=True)
            for i in range(5)
        ]
        assert started == [True, True, False, False, False]  # two per stranger host
        others = [
            resender.start((f"o{i}",), b"403", sent.append, f"192.0.2.{i}", stranger=True)
            for i in range(3)
        ]
        assert others == [True, False, False]  # three strangers' refusals at once in all
        assert resender.start(("pbx",), b"486", sent.append, "10.0.0.1", stranger=False)
        assert resender.declined == 5
        resender.close()
        assert len(resender) == 0

    asyncio.run(run())


# -- the real server ---------------------------------------------------------------------------


def _raw_invite(host: str, port: int, server_port: int, call: str, branch: str) -> bytes:
    return (
        f"INVITE sip:{NUMBER}@127.0.0.1:{server_port} SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP {host}:{port};branch=z9hG4bK{branch};rport\r\nMax-Forwards: 70\r\n"
        f"From: <sip:stranger@{host}>;tag=st\r\nTo: <sip:{NUMBER}@127.0.0.1>\r\n"
        f"Call-ID: {call}\r\nCSeq: 1 INVITE\r\nContact: <sip:stranger@{host}:{port}>\r\n"
        "Content-Length: 0\r\n\r\n"
    ).encode()


def _raw_ack(invite: bytes, to: str) -> bytes:
    """The ACK of a refused INVITE (RFC 3261 §17.1.1.3): its To is the response's."""
    head = invite.decode().split("\r\n")
    lines = [h for h in head[1:] if h.split(":")[0] in ("Via", "From", "Call-ID")]
    return (
        f"ACK {head[0].split()[1]} SIP/2.0\r\n" + "\r\n".join(lines) + "\r\n"
        f"To: {to}\r\nCSeq: 1 ACK\r\nMax-Forwards: 70\r\n"
        "Content-Length: 0\r\n\r\n"
    ).encode()


def _answers(sock: socket.socket, count: int, within_s: float) -> list[tuple[float, bytes]]:
    """Up to `count` datagrams, with their arrival times, waiting at most `within_s` in all."""
    got: list[tuple[float, bytes]] = []
    deadline = time.monotonic() + within_s
    while len(got) < count and (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            data = sock.recv(65535)
        except TimeoutError:
            break
        got.append((time.monotonic(), data))
    return got


@pytest.mark.slow
def test_the_server_resends_a_refused_invite_until_the_ack(sip_server: SipServer) -> None:
    """A stranger's INVITE gets 403; not ACKed, the 403 comes again at growing intervals
    (T1, 2·T1, ...); once ACKed, no more."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.7", 0))
    try:
        port = sock.getsockname()[1]
        invite = _raw_invite("127.0.0.7", port, sip_server.port, uuid.uuid4().hex, "tg1")
        sock.sendto(invite, ("127.0.0.1", sip_server.port))
        got = _answers(sock, 3, within_s=10.0)
        assert len(got) == 3, f"only {len(got)} answers came: {[d[:12] for _, d in got]}"
        first = got[0][1]
        assert first.startswith(b"SIP/2.0 4") and all(d == first for _, d in got)
        gap1, gap2 = got[1][0] - got[0][0], got[2][0] - got[1][0]
        assert gap2 > 1.5 * gap1  # Timer G doubles
        to = parse_message(first).header("To") or ""
        sock.sendto(_raw_ack(invite, to), ("127.0.0.1", sip_server.port))
        late = _answers(sock, 1, within_s=2 * gap2)  # the next would be ~2·gap2 after the last
        assert late == [], "the refusal came again after its ACK"
    finally:
        sock.close()


def _timed_invite(port: int, call: str) -> bytes:
    sdp = "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
    sdp += "m=audio 4000 RTP/AVP 0\r\n"
    return (
        f"INVITE sip:{NUMBER}@127.0.0.1:{port} SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP 127.0.0.1:5999;branch=z9hG4bK{call};rport\r\nMax-Forwards: 70\r\n"
        f"From: <sip:pbx@127.0.0.1>;tag=st1\r\nTo: <sip:{NUMBER}@127.0.0.1>\r\n"
        f"Call-ID: {call}\r\nCSeq: 1 INVITE\r\nContact: <sip:pbx@127.0.0.1:5999>\r\n"
        "Supported: timer\r\nSession-Expires: 2;refresher=uas\r\n"
        "Allow: INVITE, ACK, BYE, CANCEL, UPDATE\r\n"
        f"Content-Type: application/sdp\r\nContent-Length: {len(sdp)}\r\n\r\n{sdp}"
    ).encode()


def _reply(request: bytes, status: str) -> bytes:
    """Our answer to the server's request: its Via, From, To, Call-ID and CSeq copied."""
    message = parse_message(request)
    lines = [f"{name}: {value}" for name, value in message.headers if name.lower() in _COPIED]
    return (f"SIP/2.0 {status}\r\n" + "\r\n".join(lines) + "\r\nContent-Length: 0\r\n\r\n").encode()


_COPIED = {"via", "from", "to", "call-id", "cseq"}


def _next(sock: socket.socket, start: bytes, within_s: float = 6.0) -> bytes:
    got = _answers(sock, 1, within_s)
    while got and not got[0][1].startswith(start):  # 1xx, retransmissions
        got = _answers(sock, 1, within_s)
    assert got, f"no {start!r} came"
    return got[0][1]


@pytest.mark.slow
def test_with_refresher_uas_the_server_refreshes_and_a_481_ends_the_call(
    digest_sip_server: SipServer,
) -> None:
    """RFC 4028 §9/§10: the 200 says refresher=uas; the server sends UPDATEs itself (saying
    refresher=uac: it is their UAC); a 200 keeps the call (another UPDATE follows), a 481 ends
    it with BYE."""
    port = digest_sip_server.port
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    try:
        call = f"uas-{uuid.uuid4().hex}"
        sock.sendto(_timed_invite(port, call), ("127.0.0.1", port))
        ok = _next(sock, b"SIP/2.0 200")
        assert b"Session-Expires: 2;refresher=uas" in ok
        to = parse_message(ok).header("To") or ""
        ack = (
            f"ACK sip:{NUMBER}@127.0.0.1:{port} SIP/2.0\r\n"
            f"Via: SIP/2.0/UDP 127.0.0.1:5999;branch=z9hG4bK{call}a;rport\r\nMax-Forwards: 70\r\n"
            f"From: <sip:pbx@127.0.0.1>;tag=st1\r\nTo: {to}\r\nCall-ID: {call}\r\n"
            "CSeq: 1 ACK\r\nContent-Length: 0\r\n\r\n"
        )
        sock.sendto(ack.encode(), ("127.0.0.1", port))
        first = _next(sock, b"UPDATE ")
        assert b"Session-Expires: 2;refresher=uac" in first  # its UAC refreshes (§7.4)
        sock.sendto(_reply(first, "200 OK"), ("127.0.0.1", port))
        second = _next(sock, b"UPDATE ")  # the call went on: the next refresh
        assert parse_message(second).cseq[0] > parse_message(first).cseq[0]
        sock.sendto(_reply(second, "481 Call/Transaction Does Not Exist"), ("127.0.0.1", port))
        bye = _next(sock, b"BYE ")
        sock.sendto(_reply(bye, "200 OK"), ("127.0.0.1", port))
    finally:
        sock.close()


def _asking(session_expires: str, allow: str | None) -> SessionTimer | None:
    head = (
        "INVITE sip:b@10.0.0.2 SIP/2.0\r\nVia: SIP/2.0/UDP 10.0.0.1;branch=z9hG4bKx\r\n"
        "From: <sip:a@10.0.0.1>;tag=f\r\nTo: <sip:b@10.0.0.2>\r\nCall-ID: c\r\n"
        f"CSeq: 1 INVITE\r\nSupported: timer\r\nSession-Expires: {session_expires}\r\n"
    )
    head += f"Allow: {allow}\r\n" if allow else ""
    return SessionTimer.asked(parse_message((head + "Content-Length: 0\r\n\r\n").encode()), 90)


def test_who_refreshes_rfc_4028_section_9() -> None:
    uas = _asking("120;refresher=uas", "INVITE, ACK, BYE, UPDATE")
    assert uas is not None and uas.ours
    assert ("Session-Expires", "120;refresher=uas") in uas.headers()
    assert 0 < uas.refresh_due() <= 60  # before half the interval
    for value, allow in [("120;refresher=uac", "UPDATE"), ("120", "UPDATE"), ("120", None)]:
        timer = _asking(value, allow)
        assert timer is not None and not timer.ours  # the caller supports timers: it refreshes
        assert ("Session-Expires", "120;refresher=uac") in timer.headers()
    # no UPDATE in Allow (or no Allow): we still refresh, by re-INVITE
    for allow in ["INVITE, ACK, BYE", None]:
        reinvite = _asking("120;refresher=uas", allow)
        assert reinvite is not None and reinvite.ours and not reinvite.update
        assert ("Session-Expires", "120;refresher=uas") in reinvite.headers()
    assert uas.update and ("Session-Expires", "120;refresher=uac") in uas.refresh_headers()

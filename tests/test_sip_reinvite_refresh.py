"""Session refresh by re-INVITE (RFC 4028 §7.4, §9, §10; issue 25 item 4), against the shared
`hotline serve` with session timers from 1 s: a caller that asks `refresher=uas` and does not
allow UPDATE is refreshed by re-INVITE with our SDP unchanged, run as an INVITE client
transaction over UDP (Timer A, ACK of the 2xx and of its retransmission: RFC 3261 §17.1.1,
§13.2.2.4); a re-INVITE of the caller's meanwhile gets 491; a 481 ends the call with BYE."""

from __future__ import annotations

import socket
import time
import uuid

import pytest

from tests.support.sip_server import NUMBER, SipServer
from voice.transports.sip.message import SipMessage, parse_message

CALLER_SDP = "v=0\r\no=- 7 7 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
CALLER_SDP += "m=audio 4000 RTP/AVP 0\r\n"


class RawCaller:
    """A caller on a bare UDP socket: it writes each message itself and reads what comes."""

    def __init__(self, server_port: int) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.server = ("127.0.0.1", server_port)
        self.call_id = f"reinvite-{uuid.uuid4().hex}"
        self.to = ""  # the To of the server's 200, with its tag

    def send(self, data: bytes) -> None:
        self.sock.sendto(data, self.server)

    def next(self, start: bytes, within_s: float = 6.0) -> SipMessage:
        """The next message that starts with `start` (others are skipped: 1xx, resends)."""
        deadline = time.monotonic() + within_s
        while (left := deadline - time.monotonic()) > 0:
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65535)
            except TimeoutError:
                break
            if data.startswith(start):
                return parse_message(data)
        raise AssertionError(f"no {start!r} came within {within_s} s")

    def request(self, method: str, cseq: int, branch: str, extra: str = "", body: str = "") -> None:
        to = self.to or f"<sip:{NUMBER}@127.0.0.1>"
        self.send(
            (
                f"{method} sip:{NUMBER}@127.0.0.1:{self.server[1]} SIP/2.0\r\n"
                f"Via: SIP/2.0/UDP 127.0.0.1:{self.port};branch=z9hG4bK{branch};rport\r\n"
                f"Max-Forwards: 70\r\nFrom: <sip:pbx@127.0.0.1>;tag=rc1\r\nTo: {to}\r\n"
                f"Call-ID: {self.call_id}\r\nCSeq: {cseq} {method}\r\n"
                f"Contact: <sip:pbx@127.0.0.1:{self.port}>\r\n{extra}"
                + ("Content-Type: application/sdp\r\n" if body else "")
                + f"Content-Length: {len(body)}\r\n\r\n{body}"
            ).encode()
        )

    def answer(self, request: SipMessage, status: str, body: str = "") -> None:
        """Our answer to the server's request: its Via, From, To, Call-ID and CSeq copied."""
        copied = {"via", "from", "to", "call-id", "cseq"}
        lines = [f"{n}: {v}" for n, v in request.headers if n.lower() in copied]
        if body:
            lines.append("Content-Type: application/sdp")
        head = f"SIP/2.0 {status}\r\n" + "\r\n".join(lines)
        self.send(f"{head}\r\nContent-Length: {len(body)}\r\n\r\n{body}".encode())

    def close(self) -> None:
        self.sock.close()


def _o_line(message: SipMessage) -> str:
    return next(line for line in message.body.decode().splitlines() if line.startswith("o="))


def _answered_call(caller: RawCaller) -> SipMessage:
    """INVITE (refresher=uas, no UPDATE in Allow), its 200, our ACK; the 200."""
    timer = "Supported: timer\r\nSession-Expires: 2;refresher=uas\r\n"
    allow = "Allow: INVITE, ACK, BYE, CANCEL, OPTIONS\r\n"
    caller.request("INVITE", 1, f"{caller.call_id}i", timer + allow, CALLER_SDP)
    ok = caller.next(b"SIP/2.0 200")
    caller.to = ok.header("To") or ""
    caller.request("ACK", 1, f"{caller.call_id}a")
    return ok


@pytest.mark.slow
def test_without_update_the_server_refreshes_by_reinvite_and_acks_its_200(
    digest_sip_server: SipServer,
) -> None:
    caller = RawCaller(digest_sip_server.port)
    try:
        ok = _answered_call(caller)
        assert ok.header("Session-Expires") == "2;refresher=uas"  # RFC 4028 §9: echoed
        first = caller.next(b"INVITE ")  # due a third of the interval in: about 0.7 s
        assert first.header("Session-Expires") == "2;refresher=uac"  # we refresh, as its UAC
        assert "timer" in (first.header("Supported") or "")
        assert _o_line(first) == _o_line(ok)  # the same session description (RFC 3264 §8)
        # a re-INVITE of ours waits: the caller's own gets 491 (RFC 3261 §14.2)
        caller.request("INVITE", 2, f"{caller.call_id}g", body=CALLER_SDP)
        assert caller.next(b"SIP/2.0 ").status == 491
        again = caller.next(b"INVITE ")  # ignored: resent after T1 (Timer A), same branch
        assert again.branch == first.branch and again.cseq == first.cseq
        caller.answer(first, "200 OK", CALLER_SDP)
        ack = caller.next(b"ACK ")
        assert ack.cseq == (first.cseq[0], "ACK") and ack.branch != first.branch
        caller.answer(first, "200 OK", CALLER_SDP)  # our 200 again, as if the ACK were lost
        assert caller.next(b"ACK ").cseq == ack.cseq  # ACKed again
        second = caller.next(b"INVITE ")  # the call went on: the next refresh
        assert second.cseq[0] > first.cseq[0] and _o_line(second) == _o_line(ok)
        caller.answer(second, "481 Call/Transaction Does Not Exist")
        refused_ack = caller.next(b"ACK ")  # a refusal is ACKed on its INVITE's branch
        assert refused_ack.branch == second.branch
        bye = caller.next(b"BYE ")  # RFC 4028 §10: a 481 ends the session
        caller.answer(bye, "200 OK")
    finally:
        caller.close()

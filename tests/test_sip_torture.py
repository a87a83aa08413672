"""RFC 4475's SIP torture messages, each sent as one UDP datagram to a real `hotline serve` (the
shared `sip_server`: 127.0.0.1 allowed), and the class of answer each one gets.

The messages are the RFC's own bytes (Appendix A's base64, as tests/data/rfc4475/README says),
kept as files because their exact bytes matter (bare LF, folding, NUL and UTF-8 in places).

- §3.1.1, the valid messages: all accepted and answered sensibly: an OPTIONS or REGISTER 200,
  a method Hotline does not know 501 (RFC 3261 §8.2.1), an INVITE rung (1xx; then our CANCEL
  ends it with 487) or, with a To tag, 481 (§12.2.2), a response sent to us nothing at all.
- §3.1.2, the invalid messages: 400 where a Via can be read (505 for `SIP/7.0`), so that the
  sender stops retransmitting; a malformed *response* is dropped (and logged).
- A few of §3.2 and §3.3 with a status of their own: 416, 420, 406 and 400 for what is missing.

"Nothing at all" is checked without a sleep: an OPTIONS sent right behind, from the same
socket, must be the first thing answered (the server reads one socket's datagrams in order).
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from tests.support.sip_server import SipServer
from voice.transports.sip.message import SipMessage, parse_message

pytestmark = pytest.mark.slow

DATA = Path(__file__).parent / "data" / "rfc4475"
CALL = "call"  # an INVITE that rings: a 1xx, then 487 after our CANCEL
ANSWERED = "answered"  # one that rings, cannot be cancelled (no Via branch): 200, ACK, BYE
NOTHING = None  # a response sent to us: no answer

VALID: dict[str, int | str | None] = {  # §3.1.1
    "wsinv": 481,  # its To has a tag: a re-INVITE, of a dialog we do not have
    "intmeth": 501,  # quoted NUL, BEL and DEL in the To display name are valid
    "esc01": CALL,
    "escnull": 200,
    "esc02": 501,  # RE%47IST%45R is not REGISTER
    "lwsdisp": 200,
    "longreq": ANSWERED,  # its Via has no branch: no CANCEL can name it (RFC 3261 §9.2)
    "dblreq": 200,  # the REGISTER; the INVITE after its Content-Length is not a message
    "semiuri": 200,
    "transports": 200,
    "mpart01": 501,  # MESSAGE
    "unreason": NOTHING,
    "noreason": NOTHING,
}
INVALID: dict[str, int | str | None] = {  # §3.1.2
    "badinv01": 400,
    "clerr": 400,
    "scalar02": 400,
    "scalarlg": NOTHING,  # a response
    "quotbal": 400,
    "ltgtruri": 400,
    "lwsruri": 400,
    "lwsstart": 400,
    "trws": 400,
    "escruri": 400,
    "baddate": 400,
    "regbadct": 400,
    "badaspec": 400,
    "baddn": 400,
    "badvers": 505,
    "mismatch01": 400,
    "mismatch02": 400,
    "bigcode": NOTHING,  # a response
}
OTHERS: dict[str, int | str | None] = {  # §3.2, §3.3
    "badbranch": 200,  # a branch without the magic cookie (RFC 2543) is still a request
    "insuf": 400,
    "unkscm": 416,
    "novelsc": 416,
    "bext01": 420,
    "sdp01": 406,
    "ncl": 400,
    "mcl01": 400,
    "multi01": 400,
    "zeromf": 200,  # Max-Forwards 0 matters to a proxy; we are the UAS
}
EXPECTED = {**VALID, **INVALID, **OTHERS}


def status_of(data: bytes) -> int:
    return int(data.split(b" ", 2)[1])


def cseq_method(data: bytes) -> str:
    for line in data.split(b"\n"):
        if line.lower().startswith(b"cseq:"):
            return line.split()[-1].decode("utf-8", "replace")
    return ""


class Phone:
    """One socket on `host` (127.0.0.1, allowed, unless told; a port of its own for each)."""

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self.server = ("127.0.0.1", port)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((host, 0))

    def send(self, data: bytes) -> None:
        self.sock.sendto(data, self.server)

    def until_final(
        self, method: str | None = None, within_s: float = 5.0, lowest: int = 200
    ) -> list[bytes]:
        """The answers up to a final one (for `method`, by its CSeq, if given; or one of status
        `lowest` or more), waiting on the socket."""
        seen: list[bytes] = []
        deadline = time.monotonic() + within_s
        while not any(status_of(d) >= lowest and method in (None, cseq_method(d)) for d in seen):
            left = deadline - time.monotonic()
            assert left > 0, f"no final answer for {method}; got {[d[:40] for d in seen]}"
            self.sock.settimeout(left)
            try:
                seen.append(self.sock.recv(65535))
            except TimeoutError:
                continue
        return seen

    def close(self) -> None:
        self.sock.close()


def ping(port: int, name: str) -> bytes:
    return (
        f"OPTIONS sip:hotline@127.0.0.1:{port} SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP 127.0.0.1:5999;branch=z9hG4bK{name};rport\r\nMax-Forwards: 70\r\n"
        "From: <sip:pbx@127.0.0.1>;tag=a1\r\nTo: <sip:hotline@127.0.0.1>\r\n"
        f"Call-ID: ping-{name}@torture\r\nCSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n"
    ).encode()


def in_transaction(invite: SipMessage, method: str, to: str | None = None) -> bytes:
    """A CANCEL (or the ACK of a final refusal) of `invite`: its top Via, From, To, Call-ID
    and CSeq number (RFC 3261 §9.1, §17.1.1.3)."""
    headers = [
        ("Via", invite.header_values("Via")[0]),
        ("Max-Forwards", "70"),
        ("From", invite.header("From") or ""),
        ("To", to or invite.header("To") or ""),
        ("Call-ID", invite.call_id),
        ("CSeq", f"{invite.cseq[0]} {method}"),
    ]
    return SipMessage(method=method, uri=invite.uri, headers=headers).to_bytes()


def in_dialog(phone: Phone, invite: SipMessage, ok: SipMessage, method: str, number: int) -> bytes:
    """The ACK of our 200, or the caller's BYE (RFC 3261 §12.2.1.1, §13.2.2.4)."""
    via = f"SIP/2.0/UDP 127.0.0.1:{phone.sock.getsockname()[1]};branch=z9hG4bK{method}{number}"
    contact = ok.header("Contact") or ""
    headers = [
        ("Via", via),
        ("Max-Forwards", "70"),
        ("From", invite.header("From") or ""),
        ("To", ok.header("To") or ""),
        ("Call-ID", invite.call_id),
        ("CSeq", f"{number} {method}"),
    ]
    uri = contact.strip("<>").split(">")[0]
    return SipMessage(method=method, uri=uri, headers=headers).to_bytes()


def rung_then_cancelled(phone: Phone, data: bytes, answered: bool) -> None:
    """A 1xx, then our CANCEL: 487 (ACKed); or, for an INVITE no CANCEL can match, the 200,
    ACKed, and our BYE."""
    invite = parse_message(data)
    phone.sock.settimeout(5.0)
    provisional = phone.sock.recv(65535)
    assert 100 <= status_of(provisional) < 200, provisional[:200]
    phone.send(in_transaction(invite, "CANCEL"))
    seen = phone.until_final("INVITE")
    finals = [d for d in seen if status_of(d) >= 200 and cseq_method(d) == "INVITE"]
    assert [status_of(d) for d in finals] == [200 if answered else 487], seen
    final = parse_message(finals[-1])
    if not answered:
        phone.send(in_transaction(invite, "ACK", to=final.header("To")))
        return
    number = invite.cseq[0]
    phone.send(in_dialog(phone, invite, final, "ACK", number))
    phone.send(in_dialog(phone, invite, final, "BYE", number + 1))
    assert status_of(phone.until_final("BYE")[-1]) == 200


def nothing_then_ping(phone: Phone, port: int, name: str) -> None:
    phone.send(ping(port, name))
    seen = phone.until_final("OPTIONS")
    assert len(seen) == 1 and b"Call-ID: ping-" in seen[0], seen


@pytest.mark.parametrize("name", list(EXPECTED))
def test_each_torture_message_gets_its_class_of_answer(sip_server: SipServer, name: str) -> None:
    data = (DATA / f"{name}.dat").read_bytes()
    expected = EXPECTED[name]
    phone = Phone(sip_server.port)
    try:
        phone.send(data)
        if expected in (CALL, ANSWERED):
            rung_then_cancelled(phone, data, answered=expected == ANSWERED)
        elif expected is NOTHING:
            nothing_then_ping(phone, sip_server.port, name)
        else:
            seen = phone.until_final()
            finals = [status_of(d) for d in seen if status_of(d) >= 200]
            assert finals == [expected], [d[:300] for d in seen]
            nothing_then_ping(phone, sip_server.port, name)  # answered once, nothing more
    finally:
        phone.close()


def test_the_fixture_is_the_rfcs_complete_3_1_lists() -> None:
    """Every message of RFC 4475 §3.1.1 (13) and §3.1.2 (18) is here, with its file."""
    assert (len(VALID), len(INVALID)) == (13, 18)
    assert all((DATA / f"{name}.dat").is_file() for name in EXPECTED)

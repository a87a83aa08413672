"""The SDP in a SIP body (voice/transports/sip/body.py): plain, the application/sdp part of a
multipart/mixed body (SIP-I/SIP-T: SDP and ISUP, RFC 5621, RFC 3204), none (a late offer), or
415 with what we accept; and a SIP-T INVITE over UDP to the shared `hotline serve`."""

from __future__ import annotations

import contextlib
import time

import pytest

from tests.support.server import logged
from tests.support.sip_server import NUMBER, SipServer
from voice.devtools.sip_leg import SipLeg, offer_sdp
from voice.transports.sip.body import MAX_PARTS, BodyError, session_body
from voice.transports.sip.sdp import parse_sdp

SDP = offer_sdp("127.0.0.1", 4000, ["PCMU"]).encode()
ISUP = bytes.fromhex("0100600a00020a08038310") + b"\r\n--not-a-delimiter\x00\xff"
BOUNDARY = "unique-boundary-1"
MIXED = f"multipart/mixed;boundary={BOUNDARY}"


def sip_t(
    sdp: bytes = SDP,
    isup_disposition: str = "signal;handling=optional",
    boundary: str = BOUNDARY,
    newline: bytes = b"\r\n",
) -> bytes:
    """A SIP-T INVITE's body (RFC 3204 §3's example): SDP, then ISUP, between delimiters."""
    d = b"--" + boundary.encode()
    parts = [
        b"a preamble, ignored",
        d,
        b"Content-Type: application/sdp",
        b"",
        sdp.rstrip(b"\r\n"),
        d,
        b"Content-Type: application/ISUP;version=nxv3;base=etsi121",
        b"Content-Disposition: " + isup_disposition.encode(),
        b"",
        ISUP,
        d + b"--",
        b"an epilogue, ignored",
    ]
    return newline.join(parts)


def test_plain_sdp_and_no_body() -> None:
    assert session_body(SDP, "application/sdp") == SDP
    assert session_body(SDP, "Application/SDP; charset=utf-8", "identity") == SDP
    assert session_body(b"", None) == b""  # a late offer
    assert session_body(b"\r\n", "application/sdp") == b""


def test_the_sdp_part_of_a_multipart_body_is_taken() -> None:
    taken = session_body(sip_t(), MIXED)
    assert parse_sdp(taken) == parse_sdp(SDP)
    quoted = session_body(sip_t(boundary="b 1"), 'multipart/mixed; boundary="b 1"')
    assert parse_sdp(quoted) == parse_sdp(SDP)
    bare = session_body(sip_t(newline=b"\n"), MIXED)  # LF line ends
    assert parse_sdp(bare) == parse_sdp(SDP)


def test_a_multipart_body_without_sdp_is_a_late_offer() -> None:
    d = f"--{BOUNDARY}".encode()
    body = d + b"\r\nContent-Type: application/ISUP\r\n\r\n" + ISUP + b"\r\n" + d + b"--\r\n"
    assert session_body(body, MIXED) == b""


@pytest.mark.parametrize(
    ("body", "content_type", "encoding", "status"),
    [
        (b"hello", "text/plain", None, 415),
        (b"<xml/>", "application/pidf+xml", None, 415),
        (SDP, "application/sdp", "gzip", 415),
        (sip_t(isup_disposition="signal;handling=required"), MIXED, None, 415),
        (sip_t(), "multipart/mixed", None, 400),  # no boundary
        (sip_t(), "multipart/mixed;boundary=other", None, 400),  # not in the body
        (sip_t()[:-40], MIXED, None, 400),  # no closing delimiter
    ],
    ids=["text", "pidf", "gzip", "required-isup", "no-boundary", "wrong-boundary", "unclosed"],
)
def test_what_we_cannot_read_is_refused(
    body: bytes, content_type: str, encoding: str | None, status: int
) -> None:
    with pytest.raises(BodyError) as refused:
        session_body(body, content_type, encoding)
    assert refused.value.status == status
    headers = dict(refused.value.headers())
    if status == 415:
        assert refused.value.reason == "Unsupported Media Type"
        assert headers["Accept"] == "application/sdp, multipart/mixed"
        assert headers["Accept-Encoding"] == "identity"
    else:
        assert "Accept" not in headers and refused.value.reason == "Bad Request"


def test_part_count_is_bounded() -> None:
    d = f"--{BOUNDARY}".encode()
    part = d + b"\r\nContent-Type: text/plain\r\n\r\nx\r\n"
    assert session_body(part * MAX_PARTS + d + b"--", MIXED) == b""
    with pytest.raises(BodyError, match="more than"):
        session_body(part * (MAX_PARTS + 1) + d + b"--", MIXED)


def test_hostile_bodies_take_linear_time() -> None:
    """Near-delimiters (`--unique-boundary-` without a line start) and newline floods: the
    work doubles with the size, not more (relative, not absolute: no latency assertion)."""

    def cost(n: int) -> float:
        bodies = [
            f"--{BOUNDARY}\r\n\r\n".encode() + (f"x--{BOUNDARY}" * n).encode(),
            f"--{BOUNDARY}\r\n".encode() + b"\n" * (n * 20) + f"\r\n--{BOUNDARY}--".encode(),
        ]
        start = time.perf_counter()
        for body in bodies:
            with contextlib.suppress(BodyError):
                session_body(body, MIXED)
        return time.perf_counter() - start

    cost(1000)  # (warm)
    small, large = min(cost(4000) for _ in range(3)), min(cost(16000) for _ in range(3))
    assert large < small * 16, (small, large)  # 4x the input; quadratic would be 16x


@pytest.mark.slow
async def test_a_sip_t_invite_is_answered_and_an_unknown_body_gets_415(
    sip_server: SipServer,
) -> None:
    server = sip_server.server
    leg = SipLeg("udp", ("127.0.0.1", sip_server.port), f"sip:{NUMBER}@127.0.0.1")
    await leg.open("127.0.0.1", "sip-t-gateway")
    try:
        mark = server.log_mark()
        strange = leg.request("INVITE", leg.target, 1)
        strange.headers.append(("Content-Type", "application/vnd.example"))
        strange.body = b"{}"
        refused = await leg.transact(strange)
        assert refused is not None and refused.status == 415, refused
        assert refused.header("Accept") == "application/sdp, multipart/mixed"
        await logged(server, "refused: Content-Type 'application/vnd.example'", since=mark)
        invite = leg.request("INVITE", leg.target, 2)
        invite.headers.append(("Content-Type", MIXED))
        invite.headers.append(("MIME-Version", "1.0"))
        invite.body = sip_t(offer_sdp("127.0.0.1", 4000, ["PCMA"]).encode())
        ok = await leg.transact(invite)
        assert ok is not None and ok.status == 200, ok
        assert ok.header("Content-Type") == "application/sdp"
        assert [c.name for c in parse_sdp(ok.body).codecs] == ["PCMA", "telephone-event"]
        leg.remote_party = ok.header("To") or leg.remote_party
        ack = leg.request("ACK", leg.target, 2)
        leg.send(ack)
        assert await leg.bye() == 200
    finally:
        leg.close()

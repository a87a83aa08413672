"""SIP messages (voice/transports/sip/message.py, headers.py): requests and responses shaped as
baresip, linphone, Asterisk and a carrier trunk send them, the round trip, a UAS's responses,
TCP framing, header values (URIs, name-addr, Via, digest), and hostile input, which must only
ever raise SipParseError."""

from __future__ import annotations

import contextlib
import functools
import random
import textwrap
from collections.abc import Callable

import pytest

from voice.transports.sip.message import (
    MAX_MESSAGE_BYTES,
    NameAddr,
    SipMessage,
    SipParseError,
    SipUri,
    StreamFramer,
    Via,
    new_branch,
    new_call_id,
    new_tag,
    parse_auth_params,
    parse_message,
    parse_name_addr,
    parse_params,
    parse_uri,
    parse_via,
    response_to,
)


def wire(head: str, body: str = "") -> bytes:
    """A message as sent: lines joined by CRLF, `{length}` replaced by the body's length."""
    lines = textwrap.dedent(head).strip("\n").split("\n")
    data = "\r\n".join(textwrap.dedent(body).strip("\n").split("\n")) + "\r\n" if body else ""
    payload = data.encode()
    return ("\r\n".join(lines).replace("{length}", str(len(payload))) + "\r\n\r\n").encode() + (
        payload
    )


BARESIP_SDP = """
    v=0
    o=- 3897195034 2416913486 IN IP4 192.0.2.20
    s=-
    c=IN IP4 192.0.2.20
    t=0 0
    m=audio 10164 RTP/AVP 0 8 9 96 101
    a=rtpmap:0 PCMU/8000
    a=rtpmap:8 PCMA/8000
    a=rtpmap:96 opus/48000/2
    a=rtpmap:101 telephone-event/8000
    a=fmtp:101 0-15
    a=sendrecv
    a=ptime:20
"""

BARESIP_INVITE = wire(
    """
    INVITE sip:hotline@192.0.2.10 SIP/2.0
    Via: SIP/2.0/UDP 192.0.2.20:5060;branch=z9hG4bK2c8fa3bd6e1a92e3;rport
    Contact: <sip:alice-0x5612e4f0@192.0.2.20:5060;transport=udp>
    Max-Forwards: 70
    To: <sip:hotline@192.0.2.10>
    From: "Alice" <sip:alice@192.0.2.20>;tag=1ea6b1a5a4a2f0c3
    Call-ID: 7c8f9ae1f3d2b8a4
    CSeq: 34125 INVITE
    User-Agent: baresip v3.10.1 (x86_64/Linux)
    Allow: INVITE,ACK,BYE,CANCEL,OPTIONS,NOTIFY,SUBSCRIBE,INFO,MESSAGE,UPDATE,REFER
    Supported: replaces,norefersub
    Content-Type: application/sdp
    Content-Length: {length}
    """,
    BARESIP_SDP,
)

LINPHONE_INVITE = wire(
    """
    INVITE sip:hotline@192.0.2.10:5060 SIP/2.0
    Via: SIP/2.0/UDP 192.0.2.30:5060;branch=z9hG4bK.Q7nIzfEuS;rport
    From: <sip:bob@sip.example.org>;tag=TgNp~w8Ga
    To: sip:hotline@192.0.2.10:5060
    CSeq: 20 INVITE
    Call-ID: 1Rr0uGUwPE
    Max-Forwards: 70
    Supported: replaces, outbound, gruu, path
    Allow: INVITE, ACK, CANCEL, OPTIONS, BYE, REFER, NOTIFY, MESSAGE, SUBSCRIBE, INFO, UPDATE
    Content-Type: application/sdp
    Content-Length: {length}
    Contact: <sip:bob@192.0.2.30;transport=udp>;expires=3600;+sip.instance="<urn:uuid:5f1a3c2d-1b2c-4d3e-8f9a-0b1c2d3e4f5a>";+org.linphone.specs="ephemeral/1.1,groupchat/1.1,lime"
    User-Agent: Linphone-Desktop/5.2.4 (pc) linux/6.5, Qt 5.15.2 LinphoneCore/5.3.38
    """,  # noqa: E501
    """
    v=0
    o=bob 3213 1064 IN IP4 192.0.2.30
    s=Talk
    c=IN IP4 192.0.2.30
    t=0 0
    m=audio 7078 RTP/AVP 96 0 8 101
    a=rtpmap:96 opus/48000/2
    a=rtpmap:101 telephone-event/8000
    """,
)

ASTERISK_INVITE = wire(
    """
    INVITE sip:hotline@192.0.2.10:5060 SIP/2.0
    Via: SIP/2.0/UDP 192.0.2.2:5060;rport;branch=z9hG4bKPj6a3c1b9e-1f2d-4c8a-9e3b-7d6f5a4c3b2a
    From: "Reception" <sip:201@192.0.2.2>;tag=0b0c8f3e-7d5a-4e2b-8c1f-3a9d6e4b2c1f
    To: <sip:hotline@192.0.2.10>
    Contact: <sip:asterisk@192.0.2.2:5060>
    Call-ID: 4e6b8d2a-9c1f-4a3e-b5d7-2f8e6c4a1b3d
    CSeq: 31279 INVITE
    Allow: OPTIONS, REGISTER, SUBSCRIBE, NOTIFY, PUBLISH, INVITE, ACK, BYE, CANCEL, UPDATE, PRACK, INFO, MESSAGE, REFER
    Supported: 100rel, timer, replaces, norefersub, histinfo
    Session-Expires: 1800
    Min-SE: 90
    P-Asserted-Identity: "Reception" <sip:201@192.0.2.2>
    Max-Forwards: 70
    User-Agent: Asterisk PBX 20.5.2
    Content-Type: application/sdp
    Content-Length: {length}
    """,  # noqa: E501
    """
    v=0
    o=- 1936384052 1936384052 IN IP4 192.0.2.2
    s=Asterisk
    c=IN IP4 192.0.2.2
    t=0 0
    m=audio 17826 RTP/AVP 0 8 101
    a=rtpmap:0 PCMU/8000
    a=rtpmap:8 PCMA/8000
    a=rtpmap:101 telephone-event/8000
    a=fmtp:101 0-16
    a=ptime:20
    a=maxptime:140
    a=sendrecv
    """,
)

# Compact forms, Vias on one line and on separate lines, IPv6, a folded header.
CARRIER_INVITE = wire(
    """
    INVITE sip:+15551230000@[2001:db8::10]:5060;user=phone SIP/2.0
    v: SIP/2.0/UDP [2001:db8:1::5]:5060;branch=z9hG4bK-sbc-5a1f3e;received=2001:db8:1::5, SIP/2.0/UDP 198.51.100.20;branch=z9hG4bKcore.77a
    v: SIP/2.0/TCP core.carrier.example:5061;branch=z9hG4bKorigin.1
    Record-Route: <sip:[2001:db8:1::5];lr;ftag=as6f2d1c0b>
    f: "+1 555 987 6543" <sip:+15559876543@carrier.example;user=phone>;tag=as6f2d1c0b
    t: <sip:+15551230000@hotline.example;user=phone>
    i: 3c5e7a9b1d2f4a6c@carrier.example
    CSeq: 102 INVITE
    m: <sip:+15559876543@[2001:db8:1::5]:5060>
    Max-Forwards: 67
    k: timer
    x: 1800;refresher=uac
    Subject: inbound call
    \tfrom the PSTN
    c: application/sdp
    l: {length}
    """,  # noqa: E501
    """
    v=0
    o=SBC 71849 71849 IN IP6 2001:db8:1::5
    s=SIP Media Capabilities
    c=IN IP6 2001:db8:1::20
    t=0 0
    m=audio 31000 RTP/AVP 8 0 18 101
    a=rtpmap:101 telephone-event/8000
    """,
)

ACK = wire(
    """
    ACK sip:hotline@192.0.2.10:5060 SIP/2.0
    Via: SIP/2.0/UDP 192.0.2.20:5060;branch=z9hG4bK5d1f7a9c3e2b4d6f;rport
    Max-Forwards: 70
    To: <sip:hotline@192.0.2.10>;tag=8d9e0f1a2b3c4d5e
    From: "Alice" <sip:alice@192.0.2.20>;tag=1ea6b1a5a4a2f0c3
    Call-ID: 7c8f9ae1f3d2b8a4
    CSeq: 34125 ACK
    Content-Length: 0
    """
)

BYE = wire(
    """
    BYE sip:hotline@192.0.2.10:5060 SIP/2.0
    Via: SIP/2.0/UDP 192.0.2.30:5060;branch=z9hG4bK.bYe2k9;rport
    From: <sip:bob@sip.example.org>;tag=TgNp~w8Ga
    To: sip:hotline@192.0.2.10:5060;tag=8d9e0f1a
    CSeq: 21 BYE
    Call-ID: 1Rr0uGUwPE
    Max-Forwards: 70
    User-Agent: Linphone-Desktop/5.2.4 (pc) linux/6.5, Qt 5.15.2 LinphoneCore/5.3.38
    """
)  # no Content-Length: over UDP the body is the rest of the datagram (none)

CANCEL = wire(
    """
    CANCEL sip:hotline@192.0.2.10 SIP/2.0
    Via: SIP/2.0/UDP 192.0.2.20:5060;branch=z9hG4bK2c8fa3bd6e1a92e3;rport
    Max-Forwards: 70
    To: <sip:hotline@192.0.2.10>
    From: "Alice" <sip:alice@192.0.2.20>;tag=1ea6b1a5a4a2f0c3
    Call-ID: 7c8f9ae1f3d2b8a4
    CSeq: 34125 CANCEL
    Content-Length: 0
    """
)

OPTIONS = wire(
    """
    OPTIONS sip:hotline@192.0.2.10:5060 SIP/2.0
    Via: SIP/2.0/UDP 192.0.2.2:5060;rport;branch=z9hG4bKPj0e2c4a6b
    From: <sip:asterisk@192.0.2.2>;tag=6f7e8d9c
    To: <sip:hotline@192.0.2.10>
    Contact: <sip:asterisk@192.0.2.2:5060>
    Call-ID: 2b4d6f8a-1c3e-5a7b-9d0f-2e4a6c8b0d1f
    CSeq: 60422 OPTIONS
    Accept: application/sdp
    Max-Forwards: 70
    User-Agent: Asterisk PBX 20.5.2
    Content-Length:  0
    """
)

REFER = wire(
    """
    REFER sip:hotline@192.0.2.10:5060 SIP/2.0
    Via: SIP/2.0/UDP 192.0.2.30:5060;branch=z9hG4bK.r3f3rT;rport
    From: <sip:bob@sip.example.org>;tag=TgNp~w8Ga
    To: <sip:hotline@192.0.2.10:5060>;tag=8d9e0f1a
    CSeq: 22 REFER
    Call-ID: 1Rr0uGUwPE
    Max-Forwards: 70
    r: <sip:carol@sip.example.org?Replaces=5b2a%40192.0.2.40%3Bto-tag%3Dc1%3Bfrom-tag%3Dc2>
    b: <sip:bob@sip.example.org>
    Content-Length: 0
    """
)

NOTIFY = wire(
    """
    NOTIFY sip:hotline@192.0.2.10:5060 SIP/2.0
    Via: SIP/2.0/UDP 192.0.2.2:5060;rport;branch=z9hG4bKPjn0t1fy
    From: <sip:201@192.0.2.2>;tag=0b0c8f3e
    To: <sip:hotline@192.0.2.10>;tag=8d9e0f1a
    Contact: <sip:asterisk@192.0.2.2:5060>
    Call-ID: 4e6b8d2a-9c1f-4a3e-b5d7-2f8e6c4a1b3d
    CSeq: 31281 NOTIFY
    Event: refer
    Subscription-State: terminated;reason=noresource
    Content-Type: message/sipfrag;version=2.0
    Max-Forwards: 70
    Content-Length: {length}
    """,
    "SIP/2.0 200 OK",
)

RINGING = wire(
    """
    SIP/2.0 180 Ringing
    Via: SIP/2.0/UDP 192.0.2.10:5060;branch=z9hG4bKh0tl1ne;rport=5060;received=192.0.2.10
    From: <sip:hotline@192.0.2.10>;tag=h1a2
    To: <sip:alice@192.0.2.20>;tag=b2c3
    Call-ID: 9f8e7d6c@192.0.2.10
    CSeq: 1 INVITE
    Contact: <sip:alice-0x5612e4f0@192.0.2.20:5060;transport=udp>
    Content-Length: 0
    """
)

OK_WITH_SDP = wire(
    """
    SIP/2.0 200 OK
    Via: SIP/2.0/UDP 192.0.2.10:5060;branch=z9hG4bKh0tl1ne;rport=5060;received=192.0.2.10
    Contact: <sip:alice-0x5612e4f0@192.0.2.20:5060;transport=udp>
    From: <sip:hotline@192.0.2.10>;tag=h1a2
    To: <sip:alice@192.0.2.20>;tag=b2c3
    Call-ID: 9f8e7d6c@192.0.2.10
    CSeq: 1 INVITE
    Allow: INVITE,ACK,BYE,CANCEL,OPTIONS,NOTIFY,SUBSCRIBE,INFO,MESSAGE,UPDATE,REFER
    Content-Type: application/sdp
    Content-Length: {length}
    """,
    BARESIP_SDP,
)

UNAUTHORIZED = wire(
    """
    SIP/2.0 401 Unauthorized
    Via: SIP/2.0/UDP 192.0.2.10:5060;rport=5060;received=192.0.2.10;branch=z9hG4bKr3g1
    Call-ID: reg-1@192.0.2.10
    From: <sip:hotline@192.0.2.2>;tag=h9
    To: <sip:hotline@192.0.2.2>;tag=z9hG4bKr3g1
    CSeq: 1 REGISTER
    WWW-Authenticate: Digest realm="asterisk",nonce="1714061543/5d1e6b0a4e2c",opaque="4f6c",algorithm=MD5,qop="auth"
    Server: Asterisk PBX 20.5.2
    Content-Length:  0
    """  # noqa: E501
)

SAMPLES = {
    "baresip INVITE": BARESIP_INVITE,
    "linphone INVITE": LINPHONE_INVITE,
    "Asterisk INVITE": ASTERISK_INVITE,
    "carrier INVITE": CARRIER_INVITE,
    "ACK": ACK,
    "BYE": BYE,
    "CANCEL": CANCEL,
    "OPTIONS": OPTIONS,
    "REFER": REFER,
    "NOTIFY": NOTIFY,
    "180": RINGING,
    "200": OK_WITH_SDP,
    "401": UNAUTHORIZED,
}


def test_baresip_invite() -> None:
    m = parse_message(BARESIP_INVITE)
    assert m.is_request and (m.method, m.uri, m.status) == (
        "INVITE",
        "sip:hotline@192.0.2.10",
        None,
    )
    assert [name for name, _ in m.headers][:4] == ["Via", "Contact", "Max-Forwards", "To"]
    assert m.call_id == "7c8f9ae1f3d2b8a4"
    assert m.cseq == (34125, "INVITE")
    assert m.branch == "z9hG4bK2c8fa3bd6e1a92e3"
    caller = parse_name_addr(m.header("from") or "")
    assert (caller.display, caller.uri, caller.tag) == (
        "Alice",
        "sip:alice@192.0.2.20",
        "1ea6b1a5a4a2f0c3",
    )
    assert parse_name_addr(m.header("To") or "").tag is None
    assert m.header_values("Allow")[:3] == ["INVITE", "ACK", "BYE"]
    assert len(m.header_values("Allow")) == 11
    assert m.header_values("Supported") == ["replaces", "norefersub"]
    assert m.header("Content-Type") == "application/sdp"
    assert m.body.startswith(b"v=0\r\n") and m.body.endswith(b"a=ptime:20\r\n")
    assert m.header("Content-Length") == str(len(m.body))
    via = parse_via(m.header("Via") or "")
    assert via == Via(
        "UDP", "192.0.2.20", 5060, {"branch": "z9hG4bK2c8fa3bd6e1a92e3", "rport": None}
    )


def test_linphone_invite_quoted_contact_params_and_bare_to() -> None:
    m = parse_message(LINPHONE_INVITE)
    assert m.branch == "z9hG4bK.Q7nIzfEuS"
    contacts = m.header_values("Contact")
    assert len(contacts) == 1  # the commas are inside quotes
    contact = parse_name_addr(contacts[0])
    assert contact.uri == "sip:bob@192.0.2.30;transport=udp"
    assert contact.params["+sip.instance"] == '"<urn:uuid:5f1a3c2d-1b2c-4d3e-8f9a-0b1c2d3e4f5a>"'
    assert contact.params["expires"] == "3600"
    to = parse_name_addr(m.header("To") or "")
    assert (to.display, to.uri, to.params) == (None, "sip:hotline@192.0.2.10:5060", {})
    assert m.header_values("Allow")[-1] == "UPDATE"
    assert (m.header("User-Agent") or "").startswith("Linphone-Desktop")


def test_asterisk_invite_names_keep_their_spelling() -> None:
    m = parse_message(ASTERISK_INVITE)
    names = [name for name, _ in m.headers]
    assert "Min-SE" in names and "Session-Expires" in names and "P-Asserted-Identity" in names
    assert m.header("min-se") == "90"
    assert "REFER" in m.header_values("Allow") and "PRACK" in m.header_values("allow")
    assert m.header_values("Supported") == ["100rel", "timer", "replaces", "norefersub", "histinfo"]
    assert parse_name_addr(m.header("From") or "").display == "Reception"


def test_carrier_invite_compact_forms_vias_ipv6_and_folding() -> None:
    m = parse_message(CARRIER_INVITE)
    names = [name for name, _ in m.headers]
    assert names == [
        "Via", "Via", "Record-Route", "From", "To", "Call-ID", "CSeq", "Contact", "Max-Forwards",
        "Supported", "Session-Expires", "Subject", "Content-Type", "Content-Length",
    ]  # fmt: skip
    assert m.header("i") == m.header("CALL-ID") == m.call_id == "3c5e7a9b1d2f4a6c@carrier.example"
    vias = [parse_via(v) for v in m.header_values("v")]
    assert [(v.transport, v.host, v.port) for v in vias] == [
        ("UDP", "2001:db8:1::5", 5060),
        ("UDP", "198.51.100.20", None),
        ("TCP", "core.carrier.example", 5061),
    ]
    assert vias[0].params["received"] == "2001:db8:1::5"
    assert m.branch == "z9hG4bK-sbc-5a1f3e"
    assert str(vias[0]).startswith("SIP/2.0/UDP [2001:db8:1::5]:5060;branch=")
    assert m.header("Subject") == "inbound call from the PSTN"
    assert m.header("Session-Expires") == "1800;refresher=uac"
    uri = parse_uri(m.uri or "")
    assert (uri.user, uri.host, uri.port, uri.params) == (
        "+15551230000", "2001:db8::10", 5060, {"user": "phone"},
    )  # fmt: skip
    assert parse_name_addr(m.header("f") or "").display == "+1 555 987 6543"
    assert m.body.startswith(b"v=0") and m.header("l") == str(len(m.body))


def test_ack_bye_cancel_options() -> None:
    ack, bye, cancel, options = (parse_message(x) for x in (ACK, BYE, CANCEL, OPTIONS))
    assert ack.cseq == (34125, "ACK") and ack.body == b""
    assert parse_name_addr(ack.header("To") or "").tag == "8d9e0f1a2b3c4d5e"
    assert bye.cseq == (21, "BYE") and bye.header("Content-Length") == "0"
    assert parse_name_addr(bye.header("To") or "").tag == "8d9e0f1a"  # bare URI: a header param
    assert cancel.branch == parse_message(BARESIP_INVITE).branch
    assert options.header("Accept") == "application/sdp" and options.header("l") == "0"


def test_refer_and_notify_with_sipfrag() -> None:
    refer = parse_message(REFER)
    target = parse_name_addr(refer.header("Refer-To") or "")
    uri = parse_uri(target.uri)
    assert (uri.user, uri.host) == ("carol", "sip.example.org")
    assert uri.headers == "Replaces=5b2a%40192.0.2.40%3Bto-tag%3Dc1%3Bfrom-tag%3Dc2"
    assert str(uri) == target.uri
    assert refer.header("Referred-By") == "<sip:bob@sip.example.org>"
    notify = parse_message(NOTIFY)
    assert notify.header("o") == "refer"
    assert notify.header("Subscription-State") == "terminated;reason=noresource"
    assert notify.header("Content-Type") == "message/sipfrag;version=2.0"
    assert notify.body == b"SIP/2.0 200 OK\r\n"


def test_responses() -> None:
    ringing, ok, unauthorized = (parse_message(x) for x in (RINGING, OK_WITH_SDP, UNAUTHORIZED))
    assert not ringing.is_request and (ringing.status, ringing.reason) == (180, "Ringing")
    assert ringing.method is None and ringing.uri is None
    assert ringing.branch == "z9hG4bKh0tl1ne" and ringing.cseq == (1, "INVITE")
    assert parse_via(ringing.header("Via") or "").params["rport"] == "5060"
    assert ok.status == 200 and ok.body.startswith(b"v=0")
    scheme, params = parse_auth_params(unauthorized.header("WWW-Authenticate") or "")
    assert scheme == "Digest"
    assert params == {
        "realm": "asterisk",
        "nonce": "1714061543/5d1e6b0a4e2c",
        "opaque": "4f6c",
        "algorithm": "MD5",
        "qop": "auth",
    }


@pytest.mark.parametrize("name", SAMPLES)
def test_round_trip(name: str) -> None:
    m = parse_message(SAMPLES[name])
    again = parse_message(m.to_bytes())
    assert again == m
    assert again.to_bytes() == m.to_bytes()


def test_to_bytes_sets_content_length_and_canonical_names() -> None:
    m = SipMessage(method="MESSAGE", uri="sip:bob@example.org")
    m.add_header("v", "SIP/2.0/TCP 192.0.2.10:5060;branch=z9hG4bKabc")
    m.add_header("f", "<sip:hotline@example.org>;tag=1")
    m.add_header("to", "<sip:bob@example.org>")
    m.add_header("i", "x@y")
    m.add_header("cseq", "1 MESSAGE")
    m.add_header("content-length", "999")
    m.add_header("Content-Length", "5")
    m.body = b"hello"
    assert m.headers[0][0] == "Via" and m.headers[4][0] == "CSeq"
    text = m.to_bytes()
    assert text.startswith(b"MESSAGE sip:bob@example.org SIP/2.0\r\nVia: SIP/2.0/TCP ")
    assert text.count(b"Content-Length") == 1 and b"Content-Length: 5\r\n\r\nhello" in text
    plain = SipMessage(status=200, reason="OK", headers=[("Call-ID", "a")])
    assert plain.to_bytes() == b"SIP/2.0 200 OK\r\nCall-ID: a\r\nContent-Length: 0\r\n\r\n"


def test_header_editing() -> None:
    m = parse_message(BARESIP_INVITE)
    m.set_header("max-forwards", "69")
    assert m.headers[2] == ("Max-Forwards", "69")
    m.add_header("Route", "<sip:a;lr>, <sip:b;lr>")
    m.add_header("route", "<sip:c;lr>")
    assert m.header_values("Route") == ["<sip:a;lr>", "<sip:b;lr>", "<sip:c;lr>"]
    m.set_header("Route", "<sip:d;lr>")
    assert m.header_values("Route") == ["<sip:d;lr>"]
    m.remove_header("route")
    assert m.header("Route") is None and m.header_values("Route") == []
    m.set_header("X-Hotline-Call", "42")
    assert m.headers[-1] == ("X-Hotline-Call", "42") and m.header("x-hotline-call") == "42"
    m.add_header("www-authenticate", 'Digest realm="a, b"')
    assert m.header_values("WWW-Authenticate") == ['Digest realm="a, b"']  # not a list header
    with pytest.raises(ValueError):
        m.add_header("X-Evil", "a\r\nVia: injected")
    with pytest.raises(ValueError):
        m.set_header("Bad Name", "x")
    m.headers.append(("X-Evil", "a\r\nb"))
    with pytest.raises(ValueError):
        m.to_bytes()


def test_response_to_copies_what_rfc_3261_says() -> None:
    invite = parse_message(CARRIER_INVITE)
    ringing = response_to(invite, 180, "Ringing", to_tag="h0t", headers=[("Contact", "<sip:h@x>")])
    assert (ringing.status, ringing.reason, ringing.is_request) == (180, "Ringing", False)
    names = [name for name, _ in ringing.headers]
    assert names == ["Via", "Via", "From", "To", "Call-ID", "CSeq", "Contact", "Content-Length"]
    assert [v for n, v in ringing.headers if n == "Via"] == [
        v for n, v in invite.headers if n == "Via"
    ]
    assert ringing.header("To") == "<sip:+15551230000@hotline.example;user=phone>;tag=h0t"
    assert ringing.header("From") == invite.header("From")
    assert ringing.cseq == invite.cseq and ringing.call_id == invite.call_id
    assert ringing.branch == invite.branch
    assert ringing.header("Record-Route") is None and ringing.header("Subject") is None
    assert parse_message(ringing.to_bytes()) == ringing

    sdp = b"v=0\r\n"
    ok = response_to(invite, 200, "OK", to_tag="h0t", body=sdp, content_type="application/sdp")
    assert ok.header("Content-Type") == "application/sdp" and ok.body == sdp
    assert ok.header("Content-Length") == "5"
    assert parse_message(ok.to_bytes()) == ok

    bye = parse_message(BYE)  # its To has a tag already (bare form)
    assert response_to(bye, 200, "OK", to_tag="other").header("To") == bye.header("To")
    linphone = parse_message(LINPHONE_INVITE)
    to = response_to(linphone, 486, "Busy Here", to_tag="t1").header("To") or ""
    assert parse_name_addr(to).tag == "t1" and to == "sip:hotline@192.0.2.10:5060;tag=t1"
    assert response_to(linphone, 100, "Trying").header("To") == linphone.header("To")

    with pytest.raises(ValueError):
        response_to(parse_message(RINGING), 200, "OK")
    with pytest.raises(ValueError):
        response_to(invite, 200, "OK", body=b"x")  # a body needs a Content-Type
    with pytest.raises(ValueError):
        response_to(invite, 99, "Nope")


def test_content_length_on_udp() -> None:
    invite = parse_message(BARESIP_INVITE)
    length = f"Content-Length: {len(invite.body)}\r".encode()
    assert parse_message(BARESIP_INVITE + b"trailing junk") == invite
    smaller = parse_message(BARESIP_INVITE.replace(length, b"Content-Length: 3\r"))
    assert smaller.body == b"v=0" and smaller.header("Content-Length") == "3"
    padded = parse_message(BARESIP_INVITE.replace(length, b"Content-Length: 0003\r"))
    assert padded == smaller
    absent = parse_message(BYE + b"rest of datagram")
    assert absent.body == b"rest of datagram" and absent.header("Content-Length") == "16"
    too_long = f"Content-Length: {len(invite.body) + 1}\r".encode()
    with pytest.raises(SipParseError, match="Content-Length"):
        parse_message(BARESIP_INVITE.replace(length, too_long))


def test_leading_crlf_and_bare_lf_are_tolerated() -> None:
    assert parse_message(b"\r\n" + ACK) == parse_message(ACK)
    assert parse_message(ACK.replace(b"\r\n", b"\n")) == parse_message(ACK)


def test_name_addr() -> None:
    assert parse_name_addr('"Alice \\"Al\\" Smith" <sip:alice@example.org>;tag=1') == NameAddr(
        'Alice "Al" Smith', "sip:alice@example.org", {"tag": "1"}
    )
    assert parse_name_addr("Bob  Jones<sip:bob@example.org>") == NameAddr(
        "Bob Jones", "sip:bob@example.org", {}
    )
    assert parse_name_addr('"a<b>c" <sip:x@y>').display == "a<b>c"
    assert parse_name_addr("<sip:x@y;lr>").params == {}
    assert parse_name_addr("sip:x@y;lr;tag=9") == NameAddr(
        None, "sip:x@y", {"lr": None, "tag": "9"}
    )
    assert parse_name_addr(" <tel:+15551234> ; tag = 5 ").tag == "5"
    named = NameAddr('Say "hi"', "sip:a@b", {"tag": "t", "lr": None})
    assert str(named) == '"Say \\"hi\\"" <sip:a@b>;tag=t;lr'
    assert parse_name_addr(str(named)) == named
    for bad in [
        '"Alice <sip:alice@example.org>',  # unterminated quote
        "Alice <sip:alice@example.org",  # unterminated <
        '"Alice" sip:alice@example.org',  # quoted display name, no <
        "<sip:alice@example.org> junk",
        "<sip:a@b>;tag=1;tag=2",
        "<not a uri>",
        "",
        "<>",
        "sip:a@b;=x",
        "sip:a@b;tag=",
    ]:
        with pytest.raises(SipParseError):
            parse_name_addr(bad)


def test_uri() -> None:
    uri = parse_uri("sips:alice:secret@Example.ORG:5061;transport=tls;lr;maddr=[2001:db8::1]")
    assert uri == SipUri(
        "sips", "alice:secret", "Example.ORG", 5061,
        {"transport": "tls", "lr": None, "maddr": "[2001:db8::1]"},
    )  # fmt: skip
    assert str(uri) == "sips:alice:secret@Example.ORG:5061;transport=tls;lr;maddr=[2001:db8::1]"
    assert parse_uri("SIP:example.org") == SipUri("sip", None, "example.org", None, {})
    assert (
        parse_uri("sip:[::1]").host == "::1"
        and str(parse_uri("sip:[::1]:5070")) == "sip:[::1]:5070"
    )
    tel = parse_uri("tel:+1-201-555-0123;phone-context=example.com")
    assert (tel.user, tel.host, tel.params["phone-context"]) == (
        "+1-201-555-0123",
        "",
        "example.com",
    )
    assert str(tel) == "tel:+1-201-555-0123;phone-context=example.com"
    assert parse_uri("sip:*97%23@pbx.example").user == "*97%23"
    for bad in [
        "", "example.org", "http://example.org", "sip:", "sip:a@", "sip:host:99999", "sip:host:",
        "sip:host:5o60", "sip:[2001:db8::1", "sip:[nope]", "sip:a b@c", "sip:host;a=1;a=2",
        "sip:2001:db8::1", "tel:", "sip:host?a b",
    ]:  # fmt: skip
        with pytest.raises(SipParseError):
            parse_uri(bad)


def test_via() -> None:
    assert parse_via("SIP / 2.0 / tcp host.example ; branch=z9hG4bK1 ; received=192.0.2.1") == Via(
        "TCP", "host.example", None, {"branch": "z9hG4bK1", "received": "192.0.2.1"}
    )
    via = parse_via("SIP/2.0/UDP [2001:db8::5]:5062;rport=5062;branch=z9hG4bKx")
    assert (via.host, via.port, via.branch) == ("2001:db8::5", 5062, "z9hG4bKx")
    assert parse_via(str(via)) == via
    assert parse_via("SIP/2.0/WSS abc.invalid;branch=z9hG4bKw").transport == "WSS"
    for bad in ["", "SIP/2.0/UDP", "SIP/3.0/UDP h", "HTTP/1.1 h", "SIP/2.0/UDP h:x", "SIP/2.0/ h"]:
        with pytest.raises(SipParseError):
            parse_via(bad)


def test_params_and_auth_params() -> None:
    assert parse_params(';tag=a;LR;x="a;b"') == {"tag": "a", "lr": None, "x": '"a;b"'}
    assert parse_params("") == {}
    credentials = (
        'Digest username="hotline", realm="asterisk", nonce="1714061543/5d1e", '
        'uri="sip:192.0.2.2", response="0f9c1a8e7b6d5c4b3a2f1e0d9c8b7a6f", algorithm=MD5, '
        'cnonce="a1b2", qop=auth, nc=00000001, opaque="4f6c"'
    )
    scheme, params = parse_auth_params(credentials)
    assert scheme == "Digest" and params["uri"] == "sip:192.0.2.2" and params["nc"] == "00000001"
    assert len(params) == 10
    assert parse_auth_params('Digest realm="a \\"b\\", c",qop="auth,auth-int"')[1] == {
        "realm": 'a "b", c',
        "qop": "auth,auth-int",
    }
    assert parse_auth_params("Digest") == ("Digest", {})
    for bad in [
        "", 'Digest realm="unterminated', "Digest realm", "Digest realm=", 'Digest =x',
        'Digest realm="a" nonce="b"', 'Digest realm="a", realm="b"', '"Digest" realm=a',
    ]:  # fmt: skip
        with pytest.raises(SipParseError):
            parse_auth_params(bad)


def test_new_tag_branch_call_id() -> None:
    tags = {new_tag() for _ in range(100)}
    assert len(tags) == 100 and all(len(t) >= 8 and t.isalnum() for t in tags)
    branch = new_branch()
    assert branch.startswith("z9hG4bK") and len(branch) > 20 and branch != new_branch()
    call_id = new_call_id("192.0.2.10")
    assert call_id.endswith("@192.0.2.10") and len(call_id.split("@")[0]) >= 16
    assert "@" not in new_call_id("")


# -- TCP framing -----------------------------------------------------------------------------


def test_framer_arbitrary_chunks() -> None:
    stream = BARESIP_INVITE + ACK + NOTIFY
    expected = [parse_message(BARESIP_INVITE), parse_message(ACK), parse_message(NOTIFY)]
    for size in (1, 2, 3, 7, 64, 500, len(stream)):
        framer = StreamFramer()
        got = []
        for start in range(0, len(stream), size):
            got += framer.feed(stream[start : start + size])
        assert got == expected, size
    rng = random.Random(5)
    for _ in range(50):
        framer, got, pos = StreamFramer(), [], 0
        while pos < len(stream):
            step = rng.randint(1, 300)
            got += framer.feed(stream[pos : pos + step])
            pos += step
        assert got == expected


def test_framer_two_messages_in_one_chunk_and_keepalives() -> None:
    framer = StreamFramer()
    assert framer.feed(b"\r\n\r\n") == [] and framer.keepalives == 1
    got = framer.feed(OPTIONS + b"\r\n\r\n" + ACK + b"\r\n")
    assert got == [parse_message(OPTIONS), parse_message(ACK)]
    assert framer.keepalives == 2
    assert framer.feed(b"\r\n") == [] and framer.keepalives == 3  # the ping split across reads
    assert (
        framer.feed(b"\r") == []
        and framer.feed(b"\n" + BYE.replace(b"70\r\n", b"70\r\nl: 0\r\n")) != []
    )


def test_framer_needs_content_length_and_limits() -> None:
    with pytest.raises(SipParseError, match="Content-Length"):
        StreamFramer().feed(BYE)
    framer = StreamFramer()
    with pytest.raises(SipParseError, match="longer"):
        framer.feed(ACK.replace(b"Content-Length: 0", b"Content-Length: 70000"))
    with pytest.raises(SipParseError):
        framer.feed(ACK)  # a broken stream stays broken
    huge_head = StreamFramer()
    with pytest.raises(SipParseError):
        for _ in range(100):
            huge_head.feed(b"INVITE sip:a@b SIP/2.0\r\n" + b"X-Filler: " + b"a" * 1000 + b"\r\n")
    dribble = StreamFramer()
    with pytest.raises(SipParseError):
        for byte in b"X" * (MAX_MESSAGE_BYTES + 2):
            dribble.feed(bytes([byte]))
    with pytest.raises(SipParseError):
        StreamFramer().feed(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n")  # TLS hello


def test_framer_body_is_cut_by_content_length() -> None:
    body = b"SIP/2.0 200 OK\r\n\r\nnot a header"
    message = NOTIFY.split(b"\r\n\r\n")[0].replace(
        b"Content-Length: 16", b"Content-Length: %d" % len(body)
    )
    framer = StreamFramer()
    got = framer.feed(message + b"\r\n\r\n" + body + ACK)
    assert [m.body for m in got] == [body, b""]


# -- hostile input ---------------------------------------------------------------------------


def _without(header: bytes) -> bytes:
    return b"\r\n".join(
        line for line in BARESIP_INVITE.split(b"\r\n") if not line.startswith(header + b":")
    )


HOSTILE = {
    "empty": b"",
    "crlf only": b"\r\n\r\n",
    "binary garbage": bytes(range(256)) * 4,
    "no CRLF": b"INVITE sip:a@b SIP/2.0 Via: x From: y To: z",
    "no empty line": BARESIP_INVITE.split(b"\r\n\r\n")[0] + b"\r\n",
    "huge Content-Length": BARESIP_INVITE.replace(
        b"Content-Length: ", b"Content-Length: 99999999999999999999"
    ),
    "negative Content-Length": BARESIP_INVITE.replace(b"Content-Length: ", b"Content-Length: -"),
    "two Content-Lengths": ACK.replace(b"Content-Length: 0", b"Content-Length: 0\r\nl: 0"),
    "10 000 headers": ACK.replace(b"Max-Forwards", b"a:b\r\n" * 10_000 + b"Max-Forwards"),
    "201 headers": ACK.replace(b"Max-Forwards", b"a:b\r\n" * 201 + b"Max-Forwards"),
    "1 MB line": ACK.replace(b"Max-Forwards: 70", b"X-Long: " + b"a" * 1_000_000),
    "8193-byte line": ACK.replace(b"Max-Forwards: 70", b"X-Long: " + b"a" * 8185),
    "datagram too long": ACK + b"a" * MAX_MESSAGE_BYTES,
    "missing Call-ID": _without(b"Call-ID"),
    "missing CSeq": _without(b"CSeq"),
    "missing Via": _without(b"Via"),
    "missing From": _without(b"From"),
    "missing To": _without(b"To"),
    "empty Via": BARESIP_INVITE.replace(b"Via: SIP/2.0/UDP 192.0.2.20:5060;", b"Via: ,;"),
    "bad Via": BARESIP_INVITE.replace(b"SIP/2.0/UDP 192.0.2.20", b"SIP/2.0/UDP"),
    "status 99": RINGING.replace(b"180 Ringing", b"99 Ringing"),
    "status 700": RINGING.replace(b"180 Ringing", b"700 Ringing"),
    "status 1800": RINGING.replace(b"180 Ringing", b"1800 Ringing"),
    "status not a number": RINGING.replace(b"180 Ringing", b"abc Ringing"),
    "response version": RINGING.replace(b"SIP/2.0 180", b"SIP/3.0 180"),
    "request version": ACK.replace(b"5060 SIP/2.0\r\n", b"5060 HTTP/1.1\r\n"),
    "request line with 4 parts": ACK.replace(b"ACK sip:", b"ACK  sip:"),
    "bad method": ACK.replace(b"ACK sip", b"AC(K sip"),
    "Request-URI without scheme": ACK.replace(b"ACK sip:", b"ACK "),
    "CSeq not a number": ACK.replace(b"CSeq: 34125 ACK", b"CSeq: one ACK"),
    "CSeq over 2**31": ACK.replace(b"CSeq: 34125 ACK", b"CSeq: 2147483648 ACK"),
    "CSeq of another method": ACK.replace(b"CSeq: 34125 ACK", b"CSeq: 34125 INVITE"),
    "CSeq without method": ACK.replace(b"CSeq: 34125 ACK", b"CSeq: 34125"),
    "two Call-IDs": ACK.replace(b"Max-Forwards: 70", b"Call-ID: other"),
    "unterminated quote in From": ACK.replace(b'From: "Alice"', b'From: "Alice'),
    "unterminated < in To": ACK.replace(
        b"To: <sip:hotline@192.0.2.10>", b"To: <sip:hotline@192.0.2.10"
    ),
    "continuation first": ACK.replace(b"\r\nVia", b"\r\n Via"),
    "header without colon": ACK.replace(b"Max-Forwards: 70", b"Max-Forwards 70"),
    "empty header name": ACK.replace(b"Max-Forwards: 70", b": 70"),
    "NUL in a value": ACK.replace(b"Max-Forwards: 70", b"Max-Forwards: 7\x000"),
    "bare CR in a value": ACK.replace(b"Max-Forwards: 70", b"Max-Forwards: 7\r0"),
    "non-ASCII header name": ACK.replace(b"Max-Forwards", "Max-Förwards".encode()),
}


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_input_raises_sip_parse_error(name: str) -> None:
    with pytest.raises(SipParseError):
        parse_message(HOSTILE[name])
    framer = StreamFramer()
    with pytest.raises(SipParseError):
        framer.feed(HOSTILE[name] + b"\r\n\r\n" + b"a" * 70_000)


def test_properties_of_a_hand_made_message_raise_sip_parse_error() -> None:
    m = SipMessage(method="BYE", uri="sip:a@b", headers=[("CSeq", "x BYE"), ("Via", "nonsense")])
    for read in (lambda: m.call_id, lambda: m.cseq, lambda: m.branch):
        with pytest.raises(SipParseError):
            read()
    assert SipMessage().branch is None


_JUNK = [b"\r\n", b"\r\n\r\n", b":", b";", b",", b'"', b"<", b">", b" ", b"\t", b"\x00"]
_JUNK += [b"\xff", b"\xc3", b"=", b"@", b"[", b"]", b"9" * 12, b"-1", b"SIP/2.0", b"\r\n ", b"\\"]


def _mutate(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        pos = rng.randrange(len(out) + 1)
        op = rng.randrange(5)
        if op == 0 and out:
            out[min(pos, len(out) - 1)] = rng.randrange(256)
        elif op == 1:
            del out[pos : pos + rng.randint(1, 20)]
        elif op == 2:
            out[pos:pos] = rng.choice(_JUNK)
        elif op == 3:
            end = min(len(out), pos + rng.randint(1, 40))
            out[pos:pos] = out[pos:end] * rng.randint(1, 3)
        else:
            del out[pos:]
    return bytes(out)


def _tolerate(read: Callable[[], object]) -> None:
    """Run `read`; a SipParseError is a fine answer, any other exception is a bug."""
    with contextlib.suppress(SipParseError):
        read()


def _uri_of(value: str) -> SipUri:
    return parse_uri(parse_name_addr(value).uri)


def _exercise(m: SipMessage) -> None:
    """Everything a user agent reads of a message: only SipParseError may come out."""
    _tolerate(lambda: m.call_id)
    _tolerate(lambda: m.cseq)
    _tolerate(lambda: m.branch)
    for name, _ in m.headers:
        _tolerate(functools.partial(m.header_values, name))
    _tolerate(lambda: [_uri_of(value) for value in m.header_values("Contact")])
    for name in ("From", "To", "Refer-To"):
        _tolerate(functools.partial(_uri_of, m.header(name) or ""))
    _tolerate(lambda: parse_auth_params(m.header("WWW-Authenticate") or ""))
    if m.is_request:
        response_to(m, 200, "OK", to_tag=new_tag())
    assert parse_message(m.to_bytes()) == m


def test_fuzzed_messages_only_raise_sip_parse_error() -> None:
    rng = random.Random(3261)
    parsed = 0
    for _ in range(3000):
        data = _mutate(rng.choice(list(SAMPLES.values())), rng)
        try:
            m = parse_message(data)
        except SipParseError:
            continue
        parsed += 1
        _exercise(m)
        framer = StreamFramer()
        try:
            framer.feed(data[: len(data) // 2])
            framer.feed(data[len(data) // 2 :])
        except SipParseError:
            pass
    assert parsed > 100  # the mutations left some messages valid

"""The status codes of RFC 3261 §8.2 and §21 that a request earns before any handler looks at it
(`voice.transports.sip.checks`), the Request-URI's number as agent routing reads it, and the
same over UDP against the shared `sip_server` (a real `hotline serve`): 420 with Unsupported,
501 with Allow, 416, 406, 505, a 400 for a malformed request whose Via can be read (once, to
a stranger too, and logged), and `sip:%2B15551230000@...;transport=udp;transport=udp` reaching
the call as +15551230000."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from tests.support.server import logged
from tests.support.sip_server import NUMBER, SipServer
from tests.test_sip_torture import Phone, in_transaction, ping, status_of
from voice.agents.directory import load_agents
from voice.transports.sip.checks import malformed_answer, refusal
from voice.transports.sip.dialog import called_user, header_user
from voice.transports.sip.message import SipParseError, parse_message
from voice.transports.sip.sdp import SdpError
from voice.transports.sip.syntax import bare_control, reason_phrase, uri_user

DATA = Path(__file__).parent / "data" / "rfc4475"


def request(
    method: str = "OPTIONS",
    uri: str = "sip:hotline@127.0.0.1",
    *extra: str,
    port: int = 5999,
    host: str = "127.0.0.1",
    call: str = "status-call",
    branch: str = "status1",
    cseq_method: str | None = None,
) -> bytes:
    lines = [
        f"{method} {uri} SIP/2.0",
        f"Via: SIP/2.0/UDP {host}:{port};branch=z9hG4bK{branch};rport",
        "Max-Forwards: 70",
        f"From: <sip:pbx@{host}>;tag=a1",
        f"To: <{uri}>",
        f"Call-ID: {call}",
        f"CSeq: 1 {cseq_method or method}",
        *extra,
        "Content-Length: 0",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def refused(data: bytes) -> tuple[int, tuple[tuple[str, str], ...]] | None:
    answer = refusal(parse_message(data))
    return None if answer is None else (answer.status, answer.headers)


def code(data: bytes) -> int | None:
    answer = refusal(parse_message(data))
    return None if answer is None else answer.status


# -- checks.refusal ----------------------------------------------------------------------------


def test_require_of_an_option_we_lack_is_420_naming_it() -> None:
    assert refused(request("OPTIONS", "sip:a@b", "Require: timer")) is None
    assert refused(request("INVITE", "sip:a@b", "Require: 100rel, timer")) == (
        420,
        (("Unsupported", "100rel"),),
    )
    # not looked at on a CANCEL or an ACK (RFC 3261 §8.2.2.3)
    assert refused(request("CANCEL", "sip:a@b", "Require: 100rel")) is None
    assert refused(request("ACK", "sip:a@b", "Require: 100rel")) is None


def test_request_uri_schemes_and_headers() -> None:
    assert code(request("OPTIONS", "im:alice@example.com")) == 416
    assert refused(request("OPTIONS", "tel:+15551230000")) is None
    assert refused(request("OPTIONS", "sips:a@b;transport=tls")) is None
    assert code(request("INVITE", "sip:a@b?Route=%3Csip:x%3E")) == 400
    assert refused(request("OPTIONS", "sip:odd?user@b")) is None  # a `?` in the user is fine


def test_accept_without_sdp_is_406_on_invite_and_options_only() -> None:
    assert code(request("INVITE", "sip:a@b", "Accept: text/plain")) == 406
    assert code(request("OPTIONS", "sip:a@b", "Accept: text/html, image/png")) == 406
    for fine in ("application/sdp", "application/*;q=0.5", "*/*", "text/plain, APPLICATION/SDP"):
        assert refused(request("INVITE", "sip:a@b", f"Accept: {fine}")) is None, fine
    assert refused(request("OPTIONS", "sip:a@b", "Accept: ")) is None  # we send no body
    assert refused(request("BYE", "sip:a@b", "Accept: text/plain")) is None


def test_what_the_grammar_forbids_is_400() -> None:
    date = "Date: Fri, 01 Jan 2010 16:00:00 EST"
    assert code(request("OPTIONS", "sip:a@b", date)) == 400
    assert refused(request("OPTIONS", "sip:a@b", "Date: Sat, 13 Nov 2010 23:29:00 GMT")) is None
    contact = "Contact: sip:user@example.com?Route=%3Csip:x%3E"
    assert code(request("REGISTER", "sip:b", contact)) == 400
    assert refused(request("REGISTER", "sip:b", "Contact: *")) is None
    assert refused(request("REGISTER", "sip:b", 'Contact: "A, B" <sip:a@b>;q=1')) is None
    assert code(request("OPTIONS", "sip:a@b").replace(b"<sip:pbx", b"Bell, A. <sip:pbx")) == 400
    assert code(request("OPTIONS", "sip:a@b").replace(b"<sip:pbx", b"(555) 12-34 <sip:pbx")) is None
    assert code(request("OPTIONS", "sip:a@b").replace(b"<sip:a@b>", b"< sip:a@b >")) == 400


def test_reason_phrases_match_their_codes() -> None:
    assert [reason_phrase(c) for c in (400, 406, 416, 420, 488, 501, 505)] == [
        "Bad Request",
        "Not Acceptable",
        "Unsupported URI Scheme",
        "Bad Extension",
        "Not Acceptable Here",
        "Not Implemented",
        "Version Not Supported",
    ]
    assert SdpError("no m= line", 400).reason == "Bad Request"
    assert SdpError("nothing common", 488).reason == "Not Acceptable Here"
    assert SdpError("a body that is not SDP", 415).reason == "Unsupported Media Type"


# -- malformed requests ------------------------------------------------------------------------


def test_a_malformed_request_with_a_readable_via_gets_400_with_its_headers() -> None:
    padding = "Subject: " + "x" * 200  # room for a Warning saying why
    data = request("OPTIONS", "sip:a@b", padding, cseq_method="INVITE")  # CSeq does not match
    with pytest.raises(SipParseError) as error:
        parse_message(data)
    answer = malformed_answer(data, error.value)
    assert answer is not None and answer.startswith(b"SIP/2.0 400 Bad Request\r\n")
    parsed = parse_message(answer)
    assert parsed.header("Via") == "SIP/2.0/UDP 127.0.0.1:5999;branch=z9hG4bKstatus1;rport"
    assert (parsed.call_id, parsed.cseq) == ("status-call", (1, "INVITE"))
    assert (parsed.header("To") or "").startswith("<sip:a@b>;tag=")
    why = "CSeq method 'INVITE' is not the request's 'OPTIONS'"
    assert parsed.header("Warning") == f'399 hotline "{why}"'


def test_what_cannot_be_answered_is_not() -> None:
    no_via = b"INVITE sip:x SIP/2.0\r\nCall-ID: x\r\n\r\n"
    response = b"SIP/2.0 4294967301 Big\r\nVia: SIP/2.0/UDP h;branch=z9hG4bKx\r\n\r\n"
    bad_via = request("OPTIONS", "sip:a@b", host="[::1")
    for data in (no_via, response, bad_via, b"\x00\xff" * 40, b"A" * 9000):
        assert malformed_answer(data, SipParseError("bad")) is None, data[:40]


def test_another_version_is_505_and_no_answer_outgrows_its_request() -> None:
    data = (DATA / "badvers.dat").read_bytes()
    with pytest.raises(SipParseError) as error:
        parse_message(data)
    answer = malformed_answer(data, error.value)
    assert answer is not None and answer.startswith(b"SIP/2.0 505 Version Not Supported")
    for path in sorted(DATA.glob("*.dat")):
        sent = path.read_bytes()
        try:
            parse_message(sent)
        except SipParseError as exc:
            reply = malformed_answer(sent, exc)
            assert reply is None or len(reply) <= len(sent) + 64, path.name


def test_control_characters_only_escaped_in_a_quoted_string() -> None:
    assert not bare_control(b'To: "BEL:\\\x07 NUL:\\\x00 DEL:\\\x7f" <sip:a@b>')
    assert bare_control(b'To: "BEL:\x07" <sip:a@b>')  # not escaped
    assert bare_control(b"To: \\\x07 <sip:a@b>")  # escaped, but outside quotes
    assert bare_control(b'To: "a\\\r" <sip:a@b>')  # CR cannot be escaped (§25.1)
    assert not bare_control("Subject: tab\tis fine")


# -- numbers -----------------------------------------------------------------------------------


def test_the_called_number_is_percent_decoded_and_survives_a_doubled_transport() -> None:
    assert uri_user("sip:%2B15551230000@pbx.example.com") == NUMBER
    assert uri_user("sips:%2B15551230000@pbx.example.com;transport=tls;transport=tls") == NUMBER
    assert uri_user("tel:%2B15551230000") == NUMBER
    assert uri_user("sip:null-%00-null@example.com") == "null-%00-null"  # kept as written
    assert uri_user("mailto:x@y") is None and uri_user("sip:example.com") is None
    assert header_user("<sip:%2B15551230000@b;transport=tls;transport=tls>") == NUMBER
    uri = "sip:%2B15551230000@127.0.0.1;transport=tls;transport=tls"
    assert called_user(parse_message(request("INVITE", uri))) == NUMBER


def test_the_decoded_number_picks_its_agent(tmp_path: Path) -> None:
    (tmp_path / "front-desk.yml").write_text(f'numbers: ["{NUMBER}"]\n')
    agents = load_agents(tmp_path)
    invite = parse_message(request("INVITE", "sip:%2B15551230000@127.0.0.1"))
    assert agents.for_number(called_user(invite)).name == "front-desk"


# -- over UDP, against the server --------------------------------------------------------------


@pytest.mark.slow
def test_the_server_answers_420_501_416_and_406(sip_server: SipServer) -> None:
    port = sip_server.port
    cases = [
        (request("OPTIONS", f"sip:hotline@127.0.0.1:{port}", "Require: 100rel"), 420),
        (request("FROBNICATE", f"sip:hotline@127.0.0.1:{port}"), 501),
        (request("OPTIONS", "im:hotline@127.0.0.1"), 416),
        (request("OPTIONS", f"sip:hotline@127.0.0.1:{port}", "Accept: text/plain"), 406),
    ]
    for n, (data, status) in enumerate(cases):
        phone = Phone(port)
        try:
            phone.send(data.replace(b"status-call", f"status-{n}".encode()))
            [answer] = phone.until_final()
            assert status_of(answer) == status, answer[:300]
            if status == 420:
                assert b"\r\nUnsupported: 100rel\r\n" in answer
            if status == 501:
                assert b"\r\nAllow: INVITE, ACK, BYE, CANCEL, OPTIONS" in answer
        finally:
            phone.close()


@pytest.mark.slow
def test_a_strangers_malformed_request_is_answered_400_once_and_logged(
    sip_server: SipServer,
) -> None:
    server, port = sip_server.server, sip_server.port
    phone = Phone(port, host="127.0.0.8")  # a stranger: valid requests would get 403
    mark = server.log_mark()
    try:
        bad = request("OPTIONS", "sip:a@b", host="127.0.0.8", call="bad-1", cseq_method="BYE")
        phone.send(bad)
        [answer] = phone.until_final()
        assert answer.startswith(b"SIP/2.0 400 Bad Request\r\n")
        assert b"Call-ID: bad-1\r\n" in answer
        phone.send(ping(port, "after-bad"))  # answered once; and the way in is still shut
        [pong] = phone.until_final()
        assert status_of(pong) == 403 and b"Call-ID: ping-after-bad" in pong, pong[:200]
    finally:
        phone.close()
    asyncio.run(logged(server, "sip: malformed request from ('127.0.0.8'", since=mark))


@pytest.mark.slow
def test_a_percent_encoded_number_reaches_the_call_as_the_number(sip_server: SipServer) -> None:
    server, port = sip_server.server, sip_server.port
    uri = f"sip:%2B15551230000@127.0.0.1:{port};transport=udp;transport=udp"
    phone = Phone(port)
    sdp = "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
    sdp += "m=audio 9 RTP/AVP 0\r\n"
    data = request("INVITE", uri, "Content-Type: application/sdp", call="pct-call")
    data = data.replace(
        b"Content-Length: 0\r\n\r\n", f"Content-Length: {len(sdp)}\r\n\r\n{sdp}".encode()
    )
    data = data.replace(b"pbx@127.0.0.1", b"percent@127.0.0.1")
    try:
        phone.send(data)
        phone.until_final("INVITE", lowest=180)  # rung: admitted, callee and all
        listed = httpx.get(f"{server.url}/calls").json()["calls"]
        [call] = [c for c in listed if c["transport"] == "sip" and c["caller"] == "percent"]
        assert call["callee"] == NUMBER
        phone.send(in_transaction(parse_message(data), "CANCEL"))
        seen = phone.until_final("INVITE")
        assert 487 in [status_of(d) for d in seen], seen
        phone.send(
            in_transaction(parse_message(data), "ACK", to=parse_message(seen[-1]).header("To"))
        )
    finally:
        phone.close()

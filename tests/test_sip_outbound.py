"""Calls Hotline places over SIP (`POST /calls/outbound`, transport sip) through trunks that are
real SIP peers on loopback: Debian's baresip as the callee's phone (it answers, talks, plays a
voicemail greeting and its beep while recording what it hears, rings until cancelled, rejects
busy), a scripted user agent server over real UDP for what a phone does not do on cue (digest
challenges, 603, strays and garbage, early media), and a port where nothing listens. The
server's call records and webhooks say how each call went."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from starlette.routing import Route
from typer.testing import CliRunner

from pipeline.transport import SAMPLE_RATE
from tests.support.baresip import Baresip, baresip_installed
from tests.support.outbound_apis import OutboundApis
from tests.support.outbound_calls import Hooks, asterisk
from tests.support.poll import until
from tests.support.scripted_uas import OPAQUE, REALM, ScriptedUas, md5
from tests.support.server import Server, free_port, logged, start_server, stop_server
from tests.support.speech import concat, heard, silence, utterance, words
from voice.audio import read_wav
from voice.cli.main import app as cli
from voice.transports.sip.message import parse_auth_params, parse_name_addr

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not baresip_installed(), reason="baresip missing (make test installs it)"),
]

OURS = "+15551110000"  # the trunks' caller id
CUSTOMER = "+15557654321"
GREETING = "Hi, Acme here about your spring order."
VOICEMAIL = "Hi, this is Acme about your spring order. Please call us back."
HOOK_SECRET = "sip-outbound-webhook-secret-9e2f"
TRUNK_USER, TRUNK_PASSWORD = "hotline", "trunk-secret-4b7c"
SURVEY = f"""
name: survey
instructions: You call customers to ask how their spring order went.
greeting: "{GREETING}"
builtin_tools: []
voicemail: "{VOICEMAIL}"
"""


@dataclass
class Dialler:
    server: Server
    phone: int  # the trunk "phone": baresip's SIP port
    scripted: int  # the trunk "scripted": the scripted UAS's port (it challenges)
    hooks: Hooks


@pytest.fixture(scope="module")
def dialler(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dialler]:
    hooks = Hooks(HOOK_SECRET)
    phone, scripted, nowhere = free_port(), free_port(), free_port()
    agents = tmp_path_factory.mktemp("agents")
    (agents / "survey.yaml").write_text(SURVEY, encoding="utf-8")
    trunks = [
        {"name": "phone", "host": f"127.0.0.1:{phone}", "from_number": OURS},
        {
            "name": "scripted",
            "host": f"127.0.0.1:{scripted}",
            "username": TRUNK_USER,
            "password": TRUNK_PASSWORD,
            "from_number": OURS,
        },
        {"name": "nowhere", "host": f"127.0.0.1:{nowhere}"},  # nothing listens there
        {"name": "unnamed", "host": "no-such-trunk.invalid"},  # RFC 6761: never resolves
    ]
    receiver = Route("/hooks/call-ended", hooks.receive, methods=["POST"])
    with OutboundApis("", "", extra_routes=[receiver]) as api:
        server = start_server(
            {
                "HOTLINE_SIP__ENABLED": "true",
                "HOTLINE_SIP__PORT": str(free_port()),
                "HOTLINE_SIP__TRUNKS": json.dumps(trunks),
                "HOTLINE_AGENTS__DIR": str(agents),
                "HOTLINE_OUTBOUND__CALLS_PER_SECOND": "20",
                "HOTLINE_WEBHOOK__URL": f"{api.url}/hooks/call-ended",
                "HOTLINE_WEBHOOK__SECRET": HOOK_SECRET,
            }
        )
        yield Dialler(server, phone, scripted, hooks)
        code = stop_server(server)
        assert code == 0, "\n".join(server.log[-40:])
    assert not any(TRUNK_PASSWORD in line for line in server.log)


async def place(dialler: Dialler, **body: Any) -> dict[str, Any]:
    order = {"agent": "survey", "transport": "sip", **body}
    async with httpx.AsyncClient() as client:
        response = await client.post(f"{dialler.server.url}/calls/outbound", json=order)
    assert response.status_code == 202, response.text
    placed: dict[str, Any] = response.json()
    return placed


async def record_once(dialler: Dialler, call_id: str, check: Any, within_s: float = 20) -> Any:
    """The call's record (`GET /calls/{id}`) once `check(record)` holds."""

    async def look() -> dict[str, Any] | None:
        async with httpx.AsyncClient() as client:
            found = await client.get(f"{dialler.server.url}/calls/{call_id}")
        record: dict[str, Any] = found.json()
        return record if found.status_code == 200 and check(record) else None

    return await until(look, f"call {call_id}'s record", within_s, every_s=0.1)


def scripted(dialler: Dialler, callee: str) -> str:
    """The scripted UAS's `callee` (its script) as a SIP URI."""
    return f"sip:{callee}@127.0.0.1:{dialler.scripted}"


def ended(record: dict[str, Any]) -> bool:
    return record.get("state") in ("ended", "failed")


def phone(tmp_path: Path, speech: np.ndarray, user: str, answer: bool, port: int) -> Baresip:
    callee = Baresip(tmp_path / user, speech, user=user, answer=answer, sip_port=port)
    callee.start()
    assert callee.sip_port == port, "baresip's port was taken: the trunk points elsewhere"
    return callee


async def test_an_answered_call_talks_like_an_inbound_one_and_ends_with_the_callees_bye(
    dialler: Dialler, tmp_path: Path
) -> None:
    speech = concat(silence(4000), utterance("The delivery came on time."), silence(30_000))
    callee = phone(tmp_path, speech, CUSTOMER, True, dialler.phone)
    try:
        metadata = {"campaign": "spring", "customer": 42}
        placed = await place(dialler, to=CUSTOMER, metadata=metadata)
        call_id = placed["call_id"]
        expected = {"transport": "sip", "status": "calling", "direction": "outbound"}
        assert {k: placed[k] for k in expected} == expected
        assert (placed["from"], placed["to"], placed["trunk"]) == (OURS, CUSTOMER, "phone")
        await callee.wait_logged("Call established")
        call = await record_once(dialler, call_id, lambda r: r.get("records"))
        assert (call["direction"], call["transport"], call["agent"]) == (
            "outbound",
            "sip",
            "survey",
        )
        assert (call["caller"], call["callee"], call["metadata"]) == (OURS, CUSTOMER, metadata)
        assert call["history"][0]["content"] == GREETING
        assert "delivery" in call["records"][0]["caller_text"].lower()
        outcome = call["outcome"]
        assert (outcome["cause"], outcome["sip_status"], outcome["trunk"]) == (
            "answered",
            200,
            "phone",
        )
        assert 0 <= outcome["progress_ms"] <= outcome["answer_ms"]
        mark = dialler.server.log_mark()
        await callee.command("hangup")
        await logged(dialler.server, f"call {call_id}: hang-up (caller hung up (BYE))", since=mark)
        done = await record_once(dialler, call_id, ended)
        assert (done["state"], done["end_reason"]) == ("ended", "caller hung up (BYE)")
    finally:
        callee.stop()
    dump = callee.heard()
    assert dump is not None
    greeting = read_wav(dump, rate=SAMPLE_RATE)[: 4 * SAMPLE_RATE]
    assert {"acme", "spring", "order"} & words(heard(greeting))
    document = await until(lambda: dialler.hooks.documents.get(call_id), "its webhook", 20)
    assert document["call"]["outcome"]["cause"] == "answered"


async def test_a_voicemail_hears_the_message_after_its_beep_then_our_bye(
    dialler: Dialler, tmp_path: Path
) -> None:
    """baresip plays Allison's voicemail greeting and Asterisk's beep while it records what it
    hears: what it recorded after the beep is the agent's voicemail message."""
    opening = concat(silence(300), asterisk("vm-intro"), silence(400), asterisk("beep"))
    callee = phone(tmp_path, concat(opening, silence(20_000)), "voicemail", True, dialler.phone)
    try:
        to = f"sip:voicemail@127.0.0.1:{dialler.phone}"
        placed = await place(dialler, to=to, machine_detection=True)
        done = await record_once(dialler, placed["call_id"], ended, within_s=40)
        assert done["end_reason"] == "voicemail: message left"
        assert done["answered_by"]["result"] == "machine"
        await callee.wait_logged("session closed")  # our BYE
    finally:
        callee.stop()
    dump = callee.heard()
    assert dump is not None
    after_beep = read_wav(dump, rate=SAMPLE_RATE)[len(opening) :]
    left = words(heard(after_beep))
    assert len({"acme", "spring", "order", "call", "back"} & left) >= 3, left


async def test_a_phone_that_rings_is_cancelled_at_the_ring_timeout_or_by_the_api_or_is_busy(
    dialler: Dialler, tmp_path: Path
) -> None:
    callee = phone(tmp_path, silence(1000), "desk", False, dialler.phone)
    desk = f"sip:desk@127.0.0.1:{dialler.phone}"
    try:
        timed_out = await place(dialler, to=desk, ring_timeout_s=1)
        done = await record_once(dialler, timed_out["call_id"], ended)
        outcome = done["outcome"]
        assert (done["state"], outcome["cause"], outcome["sip_status"]) == (
            "failed",
            "no_answer",
            487,
        )
        assert done["end_reason"] == "never connected: no answer (487 Request Terminated)"
        assert outcome["progress_ms"] is not None  # it rang (180) before
        # the API hangs up while it rings: CANCEL
        cancelled = await place(dialler, to=desk)
        await until(lambda: sum("Incoming call" in line for line in callee.log) >= 2, "ringing")
        async with httpx.AsyncClient() as client:
            url = f"{dialler.server.url}/calls/{cancelled['call_id']}/hangup"
            hung_up = await client.post(url)
        assert hung_up.json()["status"] == "cancelling", hung_up.text
        done = await record_once(dialler, cancelled["call_id"], ended)
        assert (done["outcome"]["cause"], done["outcome"]["sip_status"]) == ("cancelled", 487)
        assert done["end_reason"] == "hung up through the API before the answer"
        # the phone rejects it: busy
        busy = await place(dialler, to=desk)
        await until(lambda: sum("Incoming call" in line for line in callee.log) >= 3, "ringing")
        await callee.command("hangup")
        done = await record_once(dialler, busy["call_id"], ended)
        assert (done["outcome"]["cause"], done["outcome"]["sip_status"]) == ("busy", 486)
        assert done["end_reason"] == "never connected: busy (486 Rejected)"
    finally:
        callee.stop()
    document = await until(lambda: dialler.hooks.documents.get(busy["call_id"]), "webhook", 20)
    assert (document["call"]["state"], document["call"]["outcome"]["cause"]) == ("failed", "busy")
    assert document["call"]["end_category"] == "setup_failed"


@pytest.mark.parametrize("status", [401, 407])
async def test_a_digest_challenge_is_answered_once_with_the_trunks_credentials(
    dialler: Dialler, status: int
) -> None:
    async with ScriptedUas(dialler.scripted, TRUNK_USER, TRUNK_PASSWORD) as uas:
        uri = f"sip:challenge-{status}@127.0.0.1:{dialler.scripted}"
        placed = await place(dialler, to=uri, trunk="scripted")
        done = await record_once(dialler, placed["call_id"], ended)
        first, second = uas.requests("INVITE")
        acks = uas.requests("ACK")
    # each refusal's ACK in its transaction: the INVITE's branch and CSeq, the answer's To tag
    assert [(a.branch, a.header("CSeq")) for a in acks] == [
        (first.branch, "1 ACK"),
        (second.branch, "2 ACK"),
    ]
    assert all(parse_name_addr(a.header("To") or "").tag for a in acks)
    # the INVITE again: same Call-ID and From tag, CSeq + 1, a new branch, the credentials
    assert (second.call_id, second.header("From")) == (first.call_id, first.header("From"))
    assert (second.header("CSeq"), second.branch != first.branch) == ("2 INVITE", True)
    header = "Authorization" if status == 401 else "Proxy-Authorization"
    scheme, fields = parse_auth_params(second.header(header) or "")
    assert (scheme, first.uri, second.uri) == ("Digest", uri, uri)
    ha1, ha2 = md5(f"{TRUNK_USER}:{REALM}:{TRUNK_PASSWORD}"), md5(f"INVITE:{uri}")
    common = {"username": TRUNK_USER, "realm": REALM, "nonce": uas.nonces[0], "uri": uri}
    if status == 401:  # qop=auth offered: counted, with our cnonce, and the opaque echoed
        cnonce = fields["cnonce"]
        response = md5(f"{ha1}:{uas.nonces[0]}:00000001:{cnonce}:auth:{ha2}")
        extra = {"qop": "auth", "nc": "00000001", "cnonce": cnonce, "opaque": OPAQUE}
    else:  # RFC 2069: no qop
        response, extra = md5(f"{ha1}:{uas.nonces[0]}:{ha2}"), {}
    assert len(fields.get("cnonce", "12345678")) >= 8
    assert fields == {**common, "response": response, "algorithm": "MD5", **extra}
    assert second.header("Authorization" if status == 407 else "Proxy-Authorization") is None
    assert (done["outcome"]["cause"], done["outcome"]["sip_status"]) == ("busy", 486)


async def test_a_decline_is_rejected_and_strays_and_garbage_are_logged_and_dropped(
    dialler: Dialler,
) -> None:
    mark = dialler.server.log_mark()
    async with ScriptedUas(dialler.scripted, TRUNK_USER, TRUNK_PASSWORD):
        declined = await place(dialler, to=scripted(dialler, "decline"), trunk="scripted")
        strays = await place(dialler, to=scripted(dialler, "strays"), trunk="scripted")
        done = await record_once(dialler, declined["call_id"], ended)
        assert (done["outcome"]["cause"], done["outcome"]["sip_status"]) == ("rejected", 603)
        assert done["end_reason"] == "never connected: rejected (603 Decline)"
        done = await record_once(dialler, strays["call_id"], ended)
    assert (done["outcome"]["cause"], done["outcome"]["sip_status"]) == ("no_answer", 480)
    await logged(
        dialler.server,
        "answers no request of ours",  # the 200 of nobody's branch
        "not our INVITE",  # our branch, another CSeq
        "malformed message",  # not SIP
        since=mark,
    )


async def test_a_2xx_is_acked_end_to_end_and_our_bye_ends_the_call(dialler: Dialler) -> None:
    """RFC 3261 §13.2.2.4: the 2xx's ACK is a new transaction (a new branch) with the INVITE's
    CSeq number, sent to the dialog (the answer's To tag, its Contact as Request-URI); the
    calls API's hang-up is a BYE in that dialog, with the next CSeq."""
    async with ScriptedUas(dialler.scripted, TRUNK_USER, TRUNK_PASSWORD) as uas:
        placed = await place(dialler, to=scripted(dialler, "answer"), trunk="scripted")
        call = await record_once(dialler, placed["call_id"], lambda r: r.get("state") == "active")
        await until(uas.rtp_came.is_set, "the call's RTP at the callee")  # ten packets
        async with httpx.AsyncClient() as client:
            await client.post(f"{dialler.server.url}/calls/{placed['call_id']}/hangup")
        done = await record_once(dialler, placed["call_id"], ended)
        [invite], [ack], [bye] = (uas.requests(m) for m in ("INVITE", "ACK", "BYE"))
    assert (
        call["outcome"]["cause"] == "answered" and done["end_reason"] == "hung up through the API"
    )
    contact = f"sip:answer@127.0.0.1:{dialler.scripted}"
    assert (ack.uri, ack.header("CSeq"), ack.branch != invite.branch) == (contact, "1 ACK", True)
    assert (bye.uri, bye.header("CSeq"), bye.call_id) == (contact, "2 BYE", invite.call_id)
    their_tag = parse_name_addr(ack.header("To") or "").tag
    assert their_tag and parse_name_addr(bye.header("To") or "").tag == their_tag
    assert ack.header("From") == bye.header("From") == invite.header("From")


async def test_early_media_flows_once_a_183_brings_sdp(dialler: Dialler) -> None:
    async with ScriptedUas(dialler.scripted, TRUNK_USER, TRUNK_PASSWORD) as uas:
        placed = await place(dialler, to=scripted(dialler, "early"), trunk="scripted")
        done = await record_once(dialler, placed["call_id"], ended)
    assert uas.rtp_came.is_set(), f"{uas.rtp_packets} RTP packets before the answer"
    outcome = done["outcome"]
    assert (outcome["cause"], outcome["early_media"]) == ("busy", True)
    assert outcome["progress_ms"] is not None and outcome["answer_ms"] is None


@pytest.mark.parametrize(
    ("trunk", "why"),
    [("nowhere", "port unreachable"), ("unnamed", "cannot resolve no-such-trunk.invalid")],
)
async def test_a_trunk_that_cannot_be_reached_is_unreachable_at_once(
    dialler: Dialler, trunk: str, why: str
) -> None:
    """Nothing listens: the ICMP port unreachable says so (not Timer B, 32 s later); a name
    that does not resolve."""
    placed = await place(dialler, to=CUSTOMER, trunk=trunk)
    done = await record_once(dialler, placed["call_id"], ended)
    outcome = done["outcome"]
    assert (outcome["cause"], outcome["sip_status"]) == ("unreachable", None)
    assert why in outcome["sip_reason"]
    assert done["end_reason"].startswith("never connected: unreachable")


async def test_the_ring_timeouts_cancel_is_the_invites_own(dialler: Dialler) -> None:
    """RFC 3261 §9.1: the CANCEL repeats the INVITE's Request-URI, Call-ID, From, To (no tag),
    CSeq number and top Via (so its branch); the 487 that follows is ACKed in the INVITE's
    transaction."""
    async with ScriptedUas(dialler.scripted, TRUNK_USER, TRUNK_PASSWORD) as uas:
        placed = await place(
            dialler, to=scripted(dialler, "ring"), trunk="scripted", ring_timeout_s=0.3
        )
        done = await record_once(dialler, placed["call_id"], ended)
        [invite], [cancel], [ack] = (uas.requests(m) for m in ("INVITE", "CANCEL", "ACK"))
    assert (done["outcome"]["cause"], done["outcome"]["sip_status"]) == ("no_answer", 487)
    same = ("From", "To", "Call-ID", "Via")
    assert [cancel.header(h) for h in same] == [invite.header(h) for h in same]
    assert (cancel.uri, cancel.header("CSeq")) == (invite.uri, "1 CANCEL")
    assert (ack.branch, ack.header("CSeq")) == (invite.branch, "1 ACK")


def test_hotline_dial_places_a_sip_call_through_a_trunk(dialler: Dialler) -> None:
    command = ["dial", "--to", CUSTOMER, "--agent", "survey", "--transport", "sip"]
    command += ["--trunk", "nowhere", "--ring-timeout", "5", "--url", dialler.server.url]
    placed = CliRunner().invoke(cli, command)
    assert placed.exit_code == 0, placed.output
    assert placed.output.startswith("call ") and f": sip rings {CUSTOMER} from " in placed.output


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ({"to": CUSTOMER, "trunk": "elsewhere"}, "trunk: no trunk 'elsewhere'"),
        ({"to": "not a number", "trunk": "phone"}, "to: 'not a number' is neither"),
        ({"to": CUSTOMER, "from": OURS, "transport": "twilio", "trunk": "phone"}, "trunk: only"),
    ],
)
async def test_a_bad_sip_request_is_422(dialler: Dialler, body: dict[str, Any], said: str) -> None:
    async with httpx.AsyncClient() as client:
        order = {"agent": "survey", "transport": "sip", **body}
        response = await client.post(f"{dialler.server.url}/calls/outbound", json=order)
    assert response.status_code == 422, response.text
    assert said in response.json()["error"]

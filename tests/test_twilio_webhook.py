"""Twilio's voice webhook on a server with an auth token and room for one call."""

from __future__ import annotations

import base64
import json
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from urllib.parse import quote

import httpx
import pytest
import websockets

from tests.support.poll import until
from tests.support.server import Server, logged, start_server, stop_server
from voice.server.settings import TelephonySettings
from voice.transports.phone.twilio import twilio_signature

pytestmark = pytest.mark.slow

TOKEN = "test-auth-token-0123456789abcdef"
SILENCE = base64.b64encode(b"\xff" * 160).decode()  # 20 ms of μ-law silence
FORM = {
    "CallSid": "CA0123456789abcdef0123456789abcdef",
    "AccountSid": "AC0123456789abcdef0123456789abcdef",
    "From": "+15550100001",
    "To": "+15550100002",
    "CallStatus": "ringing",
    "Direction": "inbound",
}


@pytest.fixture(scope="module")
def signed_server() -> Iterator[Server]:
    running = start_server(
        {"HOTLINE_TELEPHONY__TWILIO_AUTH_TOKEN": TOKEN, "HOTLINE_MAX_CALLS": "1"}
    )
    yield running
    stop_server(running)


def post_webhook(server: Server, signature: str | None) -> httpx.Response:
    headers = {} if signature is None else {"X-Twilio-Signature": signature}
    return httpx.post(f"{server.url}/twilio/voice", data=FORM, headers=headers, timeout=10)


def test_a_signed_webhook_connects_the_call_to_the_media_stream(signed_server: Server) -> None:
    response = post_webhook(
        signed_server, twilio_signature(TOKEN, f"{signed_server.url}/twilio/voice", FORM)
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/xml")
    root = ET.fromstring(response.text)
    stream = root.find("./Connect/Stream")
    assert stream is not None
    assert stream.get("url") == signed_server.url.replace("http://", "ws://") + "/twilio/stream"
    parameters = {p.get("name"): p.get("value") for p in stream.findall("Parameter")}
    token = parameters.pop("token")
    assert parameters == {"from": FORM["From"], "to": FORM["To"], "call_sid": FORM["CallSid"]}
    assert token and TOKEN not in token  # a single-use stream token, not the secret


def webhook_token(server: Server, call_sid: str) -> str:
    """The stream token a signed webhook hands out for `call_sid`."""
    form = {**FORM, "CallSid": call_sid}
    signature = twilio_signature(TOKEN, f"{server.url}/twilio/voice", form)
    response = httpx.post(
        f"{server.url}/twilio/voice", data=form, headers={"X-Twilio-Signature": signature}
    )
    stream = ET.fromstring(response.text).find("./Connect/Stream")
    assert stream is not None, response.text
    return next(
        str(p.get("value")) for p in stream.findall("Parameter") if p.get("name") == "token"
    )


async def stream_outcome(server: Server, call_sid: str, token: str | None, **headers: str) -> str:
    """What happens to a stream that starts with this call SID and token: "admitted" (the server
    lists the call), or how the server closed it."""
    url = server.url.replace("http://", "ws://") + "/twilio/stream"
    try:
        async with websockets.connect(url, additional_headers=headers) as phone:
            await phone.send(json.dumps(start_message(call_sid, token)))
            async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:

                async def admitted() -> bool:  # the server admits, or closes the socket
                    if await call_state(http, call_sid) == "active":
                        return True
                    await phone.send(json.dumps(media_message()))
                    return False

                async def ended() -> bool:
                    return await call_state(http, call_sid) == "ended"

                done: bool = await until(admitted, f"call {call_sid} admitted or refused")
                await phone.close()
                # the line is free again before the next test call
                done = await until(ended, f"call {call_sid} ended once its stream closed")
                assert done
                return "admitted"
    except websockets.ConnectionClosed as closed:
        return f"closed {closed.rcvd.code if closed.rcvd else None}"
    except websockets.InvalidStatus as refused:
        return f"handshake {refused.response.status_code}"


async def call_state(http: httpx.AsyncClient, call_id: str) -> str | None:
    response = await http.get(f"/calls/{quote(call_id, safe='')}")
    return str(response.json()["state"]) if response.status_code == 200 else None


async def test_a_stream_needs_a_fresh_token_for_its_own_call(signed_server: Server) -> None:
    sid = "CA" + "1" * 32
    mark = signed_server.log_mark()
    token = webhook_token(signed_server, sid)
    assert await stream_outcome(signed_server, "CA" + "2" * 32, token) == "closed 1008"
    assert await stream_outcome(signed_server, sid, None) == "closed 1008"
    assert await stream_outcome(signed_server, sid, token[:-2] + "xx") == "closed 1008"
    assert await stream_outcome(signed_server, sid, token) == "admitted"
    assert await stream_outcome(signed_server, sid, token) == "closed 1008"  # single use
    await logged(
        signed_server,
        "stream token is for another call",
        "stream token already used",
        since=mark,
    )
    log = "\n".join(signed_server.log)
    assert token not in log and TOKEN not in log


async def test_a_forged_handshake_signature_is_refused_and_a_real_one_admitted(
    signed_server: Server,
) -> None:
    sid = "CA" + "3" * 32
    url = signed_server.url.replace("http://", "ws://") + "/twilio/stream"
    forged = twilio_signature("not-the-token", url, {})
    token = webhook_token(signed_server, sid)
    outcome = await stream_outcome(signed_server, sid, token, **{"X-Twilio-Signature": forged})
    assert outcome == "handshake 403"
    signed = twilio_signature(TOKEN, url, {})
    outcome = await stream_outcome(signed_server, sid, token, **{"X-Twilio-Signature": signed})
    assert outcome == "admitted"


async def test_a_reused_or_malformed_call_sid_is_refused(signed_server: Server) -> None:
    sid = "CA" + "4" * 32
    assert await stream_outcome(signed_server, sid, webhook_token(signed_server, sid)) == (
        "admitted"
    )
    again = webhook_token(signed_server, sid)  # Twilio would never send an ended call's SID
    assert await stream_outcome(signed_server, sid, again) == "closed 1008"
    forged_log_line = "CA1\nINFO forged"
    mark = signed_server.log_mark()
    assert await stream_outcome(signed_server, forged_log_line, None) == "closed 1008"
    await logged(signed_server, "stream for call 'CA1\\nINFO forged' refused", since=mark)
    assert not [line for line in signed_server.log if line.startswith("INFO forged")]


@pytest.mark.parametrize("signature", [None, "", "bm90IHRoZSBzaWduYXR1cmU=", "x" * 500])
def test_missing_or_wrong_signatures_are_refused(
    signed_server: Server, signature: str | None
) -> None:
    assert post_webhook(signed_server, signature).status_code == 403


def test_a_signature_for_other_parameters_is_refused(signed_server: Server) -> None:
    forged = twilio_signature(TOKEN, f"{signed_server.url}/twilio/voice", {**FORM, "To": "+1999"})
    assert post_webhook(signed_server, forged).status_code == 403


async def test_at_capacity_the_webhook_rejects_the_call_politely(signed_server: Server) -> None:
    url = signed_server.url.replace("http://", "ws://") + "/twilio/stream"
    sid = "CAfedcba9876543210fedcba9876543210"
    token = webhook_token(signed_server, sid)
    async with websockets.connect(url) as phone:  # takes the server's only line
        await phone.send(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}))
        await phone.send(json.dumps(start_message(sid, token)))
        async with httpx.AsyncClient(base_url=signed_server.url, timeout=10) as http:

            async def admitted() -> bool:
                if (await http.get("/healthz")).json()["active_calls"] == 1:
                    return True
                await phone.send(json.dumps(media_message()))
                return False

            taken: bool = await until(admitted, "the server to admit the first call")
            assert taken
            signature = twilio_signature(TOKEN, f"{signed_server.url}/twilio/voice", FORM)
            response = await http.post(
                "/twilio/voice", data=FORM, headers={"X-Twilio-Signature": signature}
            )
    assert response.status_code == 200
    root = ET.fromstring(response.text)
    busy = TelephonySettings().busy_message
    assert [(child.tag, child.text) for child in root] == [("Say", busy), ("Hangup", None)]


def start_message(call_sid: str, token: str | None) -> dict[str, object]:
    parameters = {"from": FORM["From"], "to": FORM["To"]}
    return {
        "event": "start",
        "sequenceNumber": "1",
        "streamSid": "MZ0123456789abcdef0123456789abcdef",
        "start": {
            "accountSid": FORM["AccountSid"],
            "streamSid": "MZ0123456789abcdef0123456789abcdef",
            "callSid": call_sid,
            "tracks": ["inbound"],
            "customParameters": parameters if token is None else {**parameters, "token": token},
            "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
        },
    }


def media_message() -> dict[str, object]:
    return {
        "event": "media",
        "sequenceNumber": "2",
        "streamSid": "MZ0123456789abcdef0123456789abcdef",
        "media": {"track": "inbound", "chunk": "1", "timestamp": "20", "payload": SILENCE},
    }


def test_the_stream_ends_in_a_signed_question_that_hangs_up_a_call_not_transferred(
    signed_server: Server,
) -> None:
    """`<Connect action>`: when the bot's stream ends, Twilio asks what next. A call the agent
    did not put through (or one this server never saw) is hung up; the question must be signed
    like every webhook."""
    response = post_webhook(
        signed_server, twilio_signature(TOKEN, f"{signed_server.url}/twilio/voice", FORM)
    )
    connect = ET.fromstring(response.text).find("./Connect")
    assert connect is not None
    action = connect.get("action")
    assert action == f"{signed_server.url}/twilio/after-stream"

    after = {**FORM, "CallStatus": "in-progress"}
    signed = {"X-Twilio-Signature": twilio_signature(TOKEN, action, after)}
    answer = httpx.post(action, data=after, headers=signed, timeout=10)
    assert answer.status_code == 200
    assert [verb.tag for verb in ET.fromstring(answer.text)] == ["Hangup"]

    forged = {"X-Twilio-Signature": twilio_signature("not-the-token", action, after)}
    assert httpx.post(action, data=after, headers=forged, timeout=10).status_code == 403
    bad_sid = {**after, "CallSid": "../../etc"}
    signed = {"X-Twilio-Signature": twilio_signature(TOKEN, action, bad_sid)}
    refused = httpx.post(action, data=bad_sid, headers=signed, timeout=10)
    assert refused.status_code == 400
    assert [verb.tag for verb in ET.fromstring(refused.text)] == ["Hangup"]

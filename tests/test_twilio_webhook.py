"""Twilio's voice webhook on a server with an auth token and room for one call."""

from __future__ import annotations

import base64
import json
import xml.etree.ElementTree as ET
from collections.abc import Iterator

import httpx
import pytest
import websockets

from tests.conftest import Server, start_server, stop_server
from voice.twilio import twilio_signature

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
    assert parameters == {"from": FORM["From"], "to": FORM["To"], "call_sid": FORM["CallSid"]}


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
    async with websockets.connect(url) as phone:  # takes the server's only line
        await phone.send(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}))
        await phone.send(json.dumps(start_message()))
        async with httpx.AsyncClient(base_url=signed_server.url, timeout=10) as http:
            for _ in range(100):  # bounded wait for the server to admit the call
                if (await http.get("/healthz")).json()["active_calls"] == 1:
                    break
                await phone.send(json.dumps(media_message()))
            signature = twilio_signature(TOKEN, f"{signed_server.url}/twilio/voice", FORM)
            response = await http.post(
                "/twilio/voice", data=FORM, headers={"X-Twilio-Signature": signature}
            )
    assert response.status_code == 200
    root = ET.fromstring(response.text)
    assert root.find("./Connect") is None
    assert root.find("./Say") is not None or root.find("./Reject") is not None
    assert root.find("./Hangup") is not None or root.find("./Reject") is not None


def start_message() -> dict[str, object]:
    return {
        "event": "start",
        "sequenceNumber": "1",
        "streamSid": "MZ0123456789abcdef0123456789abcdef",
        "start": {
            "accountSid": FORM["AccountSid"],
            "streamSid": "MZ0123456789abcdef0123456789abcdef",
            "callSid": "CAfedcba9876543210fedcba9876543210",
            "tracks": ["inbound"],
            "customParameters": {"from": FORM["From"], "to": FORM["To"]},
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

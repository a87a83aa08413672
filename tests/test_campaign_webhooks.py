"""Campaigns over Telnyx and Vonage, their dials settled by the providers' call events as they
come (`POST /telnyx/status`, the Dial's `webhook_url`; `POST /vonage/status`, the create's
`event_url`), not when the media stream fails to start: a real `hotline serve` with a real Redis
against the fake Telnyx and Vonage APIs (tests/support/outbound_apis.py, which check every
create's body), the test playing each provider's webhook delivery, signed as it signs: Telnyx
ed25519 over `{timestamp}|{body}` with a key of the test's own, Vonage a JWT (HS256, the
signature secret) with the body's `payload_hash`. One number is busy, then not answered; one
rejects. Bad, stale, tampered and missing signatures are 403 and logged. Waits are polls with
deadlines; no latency is asserted."""

from __future__ import annotations

import base64
import hashlib
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from tests.support.outbound_apis import OutboundApis, Received
from tests.support.poll import wait_until
from tests.support.redis_server import RedisServer
from tests.support.server import LogMark, Server, start_server, stop_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

PINNED = datetime(2026, 3, 10, 15, 0, tzinfo=UTC).timestamp()  # inside 09:00-20:00 UTC
OURS = "+15551110000"
BUSY_THEN_NOTHING, REJECTS = "+15557650011", "+15557650012"
API_KEY, CONNECTION = "KEY-telnyx-campaign-7d1e", "conn-4411"
VONAGE_APP = "aaaaaaaa-bbbb-4ccc-8ddd-0123456789cd"
VONAGE_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
VONAGE_PEM = VONAGE_KEY.private_bytes(
    serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
).decode()
VONAGE_SECRET = "vonage-signature-secret-0123456789abcdef"
SIGNER = Ed25519PrivateKey.generate()
PUBLIC_KEY = base64.b64encode(
    SIGNER.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
).decode()


@dataclass
class Dialler:
    server: Server
    apis: OutboundApis


@pytest.fixture(scope="module")
def dialler(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Dialler]:
    agents = tmp_path_factory.mktemp("agents")
    (agents / "reminder.yaml").write_text("name: reminder\ninstructions: Remind.\n", "utf-8")
    fakes = OutboundApis(
        "",
        "",
        telnyx_api_key=API_KEY,
        telnyx_connection_id=CONNECTION,
        vonage_application_id=VONAGE_APP,
        vonage_public_key=VONAGE_KEY.public_key(),
    )
    with fakes as api:
        server = start_server(
            {
                "HOTLINE_REDIS_URL": redis_server.url,
                "HOTLINE_AGENTS__DIR": str(agents),
                "HOTLINE_CALL_CONTROL__TELNYX_API_KEY": API_KEY,
                "HOTLINE_CALL_CONTROL__TELNYX_CONNECTION_ID": CONNECTION,
                "HOTLINE_CALL_CONTROL__TELNYX_API_URL": api.telnyx_url,
                "HOTLINE_OUTBOUND__TELNYX_PUBLIC_KEY": PUBLIC_KEY,
                "HOTLINE_CALL_CONTROL__VONAGE_APPLICATION_ID": VONAGE_APP,
                "HOTLINE_CALL_CONTROL__VONAGE_PRIVATE_KEY": VONAGE_PEM,
                "HOTLINE_CALL_CONTROL__VONAGE_API_URL": api.vonage_url,
                "HOTLINE_OUTBOUND__VONAGE_SIGNATURE_SECRET": VONAGE_SECRET,
                "HOTLINE_OUTBOUND__CALLS_PER_SECOND": "20",
                "HOTLINE_CAMPAIGNS__CLOCK_OFFSET_S": repr(PINNED - time.time()),
                "HOTLINE_CAMPAIGNS__TICK_S": "0.2",
                "HOTLINE_CAMPAIGNS__CHECK_S": "0.3",
            }
        )
        yield Dialler(server, api)
        assert stop_server(server) == 0, "\n".join(server.log[-40:])
    assert not any(API_KEY in line or VONAGE_SECRET in line for line in server.log)


def hangup(dial: Received, cause: str, event_type: str = "call.hangup") -> dict[str, Any]:
    """Telnyx's event for the call `dial` placed (its documented shape)."""
    call_id = dial.answer["data"]["call_control_id"]
    payload = {"call_control_id": call_id, "connection_id": CONNECTION, "state": "hangup"}
    payload |= {"from": dial.body["from"], "to": dial.body["to"], "hangup_source": "callee"}
    payload |= {"hangup_cause": cause, "sip_hangup_cause": "486" if cause == "user_busy" else ""}
    data = {"record_type": "event", "event_type": event_type, "id": "0ccc7b54", "payload": payload}
    return {"data": {**data, "occurred_at": "2026-03-10T15:00:01.000000Z"}}


def deliver(
    dial: Received, event: dict[str, Any], signer: Ed25519PrivateKey = SIGNER, age_s: float = 0
) -> httpx.Response:
    """POST `event` to the dial's webhook_url, signed as Telnyx signs."""
    body = json.dumps(event).encode()
    timestamp = str(int(time.time() - age_s))
    signature = base64.b64encode(signer.sign(timestamp.encode() + b"|" + body)).decode()
    headers = {"telnyx-signature-ed25519": signature, "telnyx-timestamp": timestamp}
    headers["content-type"] = "application/json"
    return httpx.post(dial.body["webhook_url"], content=body, headers=headers, timeout=10)


def vonage_event(dial: Received, status: str) -> dict[str, Any]:
    """Vonage's event for the call `dial` created (its documented shape)."""
    numbers = {"from": dial.body["from"]["number"], "to": dial.body["to"][0]["number"]}
    event = {**numbers, "uuid": dial.answer["uuid"], "status": status, "direction": "outbound"}
    event |= {"conversation_uuid": dial.answer["conversation_uuid"]}
    return {**event, "timestamp": "2026-03-10T15:00:01.000Z"}


def vonage_deliver(
    dial: Received,
    event: dict[str, Any],
    secret: str = VONAGE_SECRET,
    tampered: bool = False,
    age_s: float = 0,
) -> httpx.Response:
    """POST `event` to the call's event_url with Vonage's JWT (HS256, payload_hash)."""
    body = json.dumps(event, separators=(",", ":")).encode()
    digest = hashlib.sha256(body).hexdigest()
    claims = {"iat": int(time.time() - age_s), "jti": str(uuid.uuid4()), "iss": "Vonage"}
    claims |= {"payload_hash": digest, "api_key": "a1b2c3d4", "application_id": VONAGE_APP}
    token = jwt.encode(claims, secret, algorithm="HS256")
    if tampered:
        body = body.replace(b'"busy"', b'"completed"')
    headers = {"Authorization": f"Bearer {token}", "content-type": "application/json"}
    return httpx.post(dial.body["event_url"][0], content=body, headers=headers, timeout=10)


def number_of(dial: Received) -> str:
    to = dial.body["to"]
    return str(to) if isinstance(to, str) else "+" + to[0]["number"]


def dials(dialler: Dialler, to: str, count: int) -> list[Received]:
    def found() -> list[Received] | None:
        made = [r for r in dialler.apis.created if r.api == "telnyx" and number_of(r) == to]
        return made if len(made) >= count else None

    return wait_until(found, f"{count} call(s) to {to}", within_s=20)


def start(dialler: Dialler, transport: str) -> str:
    """A campaign of two rows over `transport`; its id, once the fakes took both first calls."""
    body = {
        "agent": "reminder",
        "transport": transport,
        "from": OURS,
        "retry": {"busy": 3, "no_answer": 1, "backoff_s": 0.2},
        "rows": [{"to": BUSY_THEN_NOTHING}, {"to": REJECTS}],
    }
    created = httpx.post(f"{dialler.server.url}/campaigns", json=body, timeout=30)
    assert created.status_code == 201, created.text
    return str(created.json()["campaign_id"])


def check_ended(dialler: Dialler, campaign_id: str) -> None:
    """Busy, then not answered (2 calls); rejected (1 call, failed)."""
    server = dialler.server

    def ended() -> dict[str, Any] | None:
        found = httpx.get(f"{server.url}/campaigns/{campaign_id}", timeout=10).json()
        return found if found["state"] == "ended" else None

    final = wait_until(ended, "the campaign to end", within_s=20)
    rows = {r["to"]: r for r in final["rows"]}
    assert rows[BUSY_THEN_NOTHING]["outcomes"] == ["busy", "no_answer"]
    assert rows[BUSY_THEN_NOTHING]["status"] == "no_answer"
    assert (rows[REJECTS]["status"], rows[REJECTS]["attempts"]) == ("failed", 1)


def refusals_logged(server: Server, mark: LogMark, provider: str, count: int) -> None:
    said = f"{provider} status: bad, stale or missing signature"
    wait_until(
        lambda: sum(said in line for line in server.log[mark.line :]) >= count,
        f"the {provider} refusals logged",
    )


def test_telnyx_call_events_settle_a_campaign_s_dials_at_once(dialler: Dialler) -> None:
    server = dialler.server
    campaign_id = start(dialler, "telnyx")
    first, rejected = dials(dialler, BUSY_THEN_NOTHING, 1)[0], dials(dialler, REJECTS, 1)[0]
    assert first.body["webhook_url"].startswith(f"{server.url}/telnyx/status?campaign=")
    assert first.body["webhook_url_method"] == "POST"

    mark = server.log_mark()
    stranger = Ed25519PrivateKey.generate()
    assert deliver(first, hangup(first, "user_busy"), stranger).status_code == 403
    assert deliver(first, hangup(first, "user_busy"), age_s=600).status_code == 403
    unsigned = httpx.post(first.body["webhook_url"], json=hangup(first, "user_busy"), timeout=10)
    assert unsigned.status_code == 403
    refusals_logged(server, mark, "telnyx", 3)
    assert deliver(rejected, hangup(rejected, "", "call.initiated")).status_code == 200
    assert deliver(first, hangup(first, "user_busy")).status_code == 200
    assert deliver(rejected, hangup(rejected, "call_rejected")).status_code == 200
    again = dials(dialler, BUSY_THEN_NOTHING, 2)[1]  # busy: retried after its backoff
    assert deliver(again, hangup(again, "timeout")).status_code == 200
    assert deliver(first, hangup(first, "timeout")).status_code == 200  # late: changes nothing
    check_ended(dialler, campaign_id)
    assert len(dials(dialler, BUSY_THEN_NOTHING, 2)) == 2


def test_vonage_call_events_settle_a_campaign_s_dials_at_once(dialler: Dialler) -> None:
    server = dialler.server
    before = len(dialler.apis.created)
    campaign_id = start(dialler, "vonage")

    def made() -> list[Received]:
        return [r for r in dialler.apis.created[before:] if r.api == "vonage"]

    wait_until(lambda: len(made()) >= 2, "both Vonage calls")
    first = next(r for r in made() if number_of(r) == BUSY_THEN_NOTHING)
    rejected = next(r for r in made() if number_of(r) == REJECTS)
    assert first.body["event_url"][0].startswith(f"{server.url}/vonage/status?campaign=")
    assert first.body["event_method"] == "POST"

    mark = server.log_mark()
    busy = vonage_event(first, "busy")
    assert vonage_deliver(first, busy, secret="not-the-signature-secret-0000000").status_code == 403
    assert vonage_deliver(first, busy, tampered=True).status_code == 403
    assert vonage_deliver(first, busy, age_s=600).status_code == 403
    unsigned = httpx.post(first.body["event_url"][0], json=busy, timeout=10)
    assert unsigned.status_code == 403
    refusals_logged(server, mark, "vonage", 4)
    assert vonage_deliver(rejected, vonage_event(rejected, "ringing")).status_code == 200
    assert vonage_deliver(first, busy).status_code == 200
    assert vonage_deliver(rejected, vonage_event(rejected, "rejected")).status_code == 200
    wait_until(lambda: len(made()) >= 3, "the busy number called again")
    again = made()[2]
    assert number_of(again) == BUSY_THEN_NOTHING
    assert vonage_deliver(again, vonage_event(again, "unanswered")).status_code == 200
    check_ended(dialler, campaign_id)

"""Transfers and key presses on Telnyx and Vonage calls (`voice.agents.transfer`), against fakes
of the two REST APIs on a real loopback server (tests/support/provider_apis.py): each test
asserts on what the fake received, as the provider would see it."""

from __future__ import annotations

import base64
import json
import logging
import socket
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from pydantic import SecretStr

from pipeline.tools import Transfer
from tests.support.provider_apis import ProviderApis, Received, sip_invite_headers
from voice.agents.transfer import (
    HEADER_VALUE_BYTES,
    CallControl,
    CallControlError,
    CallControlSettings,
)

TELNYX_KEY = "KEY0123456789ABCDEF_telnyxsecretvalue"
VONAGE_APP = str(uuid.uuid4())
TELNYX_CALL = "v3:S_AwERIkXuL9vqBSvluFUDxUdIQRk4R_gz6OPajNQNrlcX2R"  # Telnyx ids hold ":"
VONAGE_CALL = "63f61863-4a51-4f6b-86e1-46edebcf9356"
SUMMARY = "Reason: wants a refund\nCaller: my order never came\nAgent: let me get someone"


def _pem(key: rsa.RSAPrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


@pytest.fixture(scope="module")
def vonage_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture
async def apis(vonage_key: rsa.RSAPrivateKey) -> AsyncIterator[ProviderApis]:
    fake = ProviderApis(
        telnyx_api_key=TELNYX_KEY,
        vonage_application_id=VONAGE_APP,
        vonage_public_key=vonage_key.public_key(),
    )
    async with fake:
        fake.add_call(TELNYX_CALL)
        fake.add_call(VONAGE_CALL)
        yield fake


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as shared:
        yield shared


def _settings(apis: ProviderApis, key: rsa.RSAPrivateKey, **changes: Any) -> CallControlSettings:
    values: dict[str, Any] = {
        "telnyx_api_key": SecretStr(TELNYX_KEY),
        "telnyx_api_url": apis.telnyx_url,
        "vonage_application_id": VONAGE_APP,
        "vonage_private_key": SecretStr(_pem(key)),
        "vonage_api_url": apis.vonage_url,
        "timeout_s": 5.0,
    }
    return CallControlSettings(**{**values, **changes})


@pytest.fixture
def control(
    apis: ProviderApis, client: httpx.AsyncClient, vonage_key: rsa.RSAPrivateKey
) -> CallControl:
    return CallControl(_settings(apis, vonage_key), client)


def _only(apis: ProviderApis) -> Received:
    assert len(apis.received) == 1, apis.received
    assert apis.received[0].acted
    return apis.received[0]


def _is_uuid(text: object) -> bool:
    return isinstance(text, str) and str(uuid.UUID(text)) == text


# -- Telnyx ------------------------------------------------------------------------------------


async def test_telnyx_transfer_to_a_number(apis: ProviderApis, control: CallControl) -> None:
    await control.transfer("telnyx", TELNYX_CALL, Transfer("+15551230001"))

    seen = _only(apis)
    assert seen.method == "POST"
    assert seen.path == f"/v2/calls/{TELNYX_CALL}/actions/transfer"
    assert seen.headers["authorization"] == f"Bearer {TELNYX_KEY}"
    assert seen.headers["content-type"] == "application/json"
    assert set(seen.body) == {"to", "command_id"}
    assert seen.body["to"] == "+15551230001"
    assert _is_uuid(seen.body["command_id"])
    assert seen.status == 200


async def test_telnyx_warm_transfer_to_sip_carries_reason_and_summary(
    apis: ProviderApis, control: CallControl
) -> None:
    target = "sip:desk@pbx.example.com"
    await control.transfer("telnyx", TELNYX_CALL, Transfer(target, "wants a refund", SUMMARY))

    body = _only(apis).body
    assert set(body) == {"to", "command_id", "custom_headers", "target_leg_client_state"}
    assert body["to"] == target
    assert body["custom_headers"] == [
        {"name": "X-Hotline-Reason", "value": "wants a refund"},
        {
            "name": "X-Hotline-Summary",
            "value": "Reason: wants a refund | Caller: my order never came"
            " | Agent: let me get someone",
        },
    ]
    state = json.loads(base64.b64decode(body["target_leg_client_state"], validate=True))
    assert state == {"reason": "wants a refund", "summary": SUMMARY}


async def test_telnyx_warm_transfer_to_a_number_sends_no_sip_headers(
    apis: ProviderApis, control: CallControl
) -> None:
    await control.transfer("telnyx", TELNYX_CALL, Transfer("+442071234567", "billing", ""))

    body = _only(apis).body
    assert set(body) == {"to", "command_id", "target_leg_client_state"}
    assert json.loads(base64.b64decode(body["target_leg_client_state"])) == {"reason": "billing"}


async def test_telnyx_digits_go_as_given(apis: ProviderApis, control: CallControl) -> None:
    await control.send_digits("telnyx", TELNYX_CALL, "12w#W3*")

    seen = _only(apis)
    assert (seen.method, seen.path) == ("POST", f"/v2/calls/{TELNYX_CALL}/actions/send_dtmf")
    assert seen.headers["authorization"] == f"Bearer {TELNYX_KEY}"
    assert set(seen.body) == {"digits", "command_id"}
    assert seen.body["digits"] == "12w#W3*"
    assert _is_uuid(seen.body["command_id"])


async def test_telnyx_5xx_is_retried_once_with_the_same_command_id(
    apis: ProviderApis, control: CallControl
) -> None:
    apis.fail_next("telnyx", 500)
    await control.transfer("telnyx", TELNYX_CALL, Transfer("+15551230001"))

    first, second = apis.received
    assert (first.status, second.status) == (500, 200)
    assert first.body == second.body  # the same command_id: Telnyx acts on it once
    assert apis.accepted == [second]


async def test_telnyx_repeated_command_is_not_acted_on_twice(
    apis: ProviderApis, client: httpx.AsyncClient
) -> None:
    body = {"digits": "1", "command_id": str(uuid.uuid4())}
    url = f"{apis.telnyx_url}/calls/{TELNYX_CALL}/actions/send_dtmf"
    headers = {"Authorization": f"Bearer {TELNYX_KEY}"}
    for _ in range(2):
        assert (await client.post(url, json=body, headers=headers)).status_code == 200
    assert len(apis.received) == 2
    assert len(apis.accepted) == 1


async def test_telnyx_5xx_twice_fails_naming_the_status(
    apis: ProviderApis, control: CallControl
) -> None:
    apis.fail_next("telnyx", 500, times=2)
    with pytest.raises(CallControlError) as caught:
        await control.send_digits("telnyx", TELNYX_CALL, "1")

    assert caught.value.status == 500
    assert "HTTP 500" in str(caught.value)
    assert "Unexpected error" in str(caught.value)
    assert len(apis.received) == 2
    assert apis.accepted == []


async def test_telnyx_bad_api_key(
    apis: ProviderApis, client: httpx.AsyncClient, vonage_key: rsa.RSAPrivateKey
) -> None:
    wrong = "KEY_wrong_but_secret_0123456789"
    control = CallControl(_settings(apis, vonage_key, telnyx_api_key=SecretStr(wrong)), client)
    with pytest.raises(CallControlError) as caught:
        await control.transfer("telnyx", TELNYX_CALL, Transfer("+15551230001"))

    error = caught.value
    assert (error.provider, error.status, error.code) == ("telnyx", 401, "10009")
    assert "HTTP 401" in str(error)
    assert "Authentication failed" in str(error)
    assert wrong not in str(error)
    assert len(apis.received) == 1  # a 4xx is not retried


async def test_telnyx_not_found_gives_the_providers_detail(
    apis: ProviderApis, control: CallControl
) -> None:
    apis.fail_next("telnyx", 404)
    with pytest.raises(CallControlError) as caught:
        await control.transfer("telnyx", TELNYX_CALL, Transfer("+15551230001"))

    assert caught.value.status == 404
    assert "Resource not found: The requested resource or URL could not be found." in str(
        caught.value
    )
    assert len(apis.received) == 1


async def test_telnyx_ended_call(apis: ProviderApis, control: CallControl) -> None:
    apis.hang_up(TELNYX_CALL)
    with pytest.raises(CallControlError) as caught:
        await control.transfer("telnyx", TELNYX_CALL, Transfer("+15551230001"))

    assert (caught.value.status, caught.value.code) == (422, "90018")
    assert "Call has already ended" in str(caught.value)


# -- Vonage ------------------------------------------------------------------------------------


def _vonage_claims(seen: Received, key: rsa.RSAPrivateKey) -> dict[str, Any]:
    scheme, token = seen.headers["authorization"].split(" ")
    assert scheme == "Bearer"
    assert jwt.get_unverified_header(token)["alg"] == "RS256"
    claims: dict[str, Any] = jwt.decode(token, key.public_key(), algorithms=["RS256"])
    return claims


async def test_vonage_transfer_to_a_number(
    apis: ProviderApis, control: CallControl, vonage_key: rsa.RSAPrivateKey
) -> None:
    await control.transfer("vonage", VONAGE_CALL, Transfer("+15551230001", "billing", SUMMARY))

    seen = _only(apis)
    assert (seen.method, seen.path, seen.status) == ("PUT", f"/v1/calls/{VONAGE_CALL}", 204)
    assert seen.headers["content-type"] == "application/json"
    assert seen.body == {
        "action": "transfer",
        "destination": {
            "type": "ncco",
            "ncco": [
                {"action": "connect", "endpoint": [{"type": "phone", "number": "15551230001"}]}
            ],
        },
    }
    claims = _vonage_claims(seen, vonage_key)
    assert set(claims) == {"application_id", "iat", "exp", "jti"}
    assert claims["application_id"] == VONAGE_APP
    assert claims["exp"] > claims["iat"]
    assert _is_uuid(claims["jti"])
    assert seen.claims == claims  # what the fake verified


async def test_vonage_warm_transfer_to_sip_puts_the_summary_in_x_headers(
    apis: ProviderApis, control: CallControl
) -> None:
    target = "sips:desk@pbx.example.com"
    await control.transfer("vonage", VONAGE_CALL, Transfer(target, "wants a refund", SUMMARY))

    endpoint = _only(apis).body["destination"]["ncco"][0]["endpoint"][0]
    assert endpoint == {
        "type": "sip",
        "uri": target,
        "headers": {
            "Hotline-Reason": "wants a refund",
            "Hotline-Summary": "Reason: wants a refund | Caller: my order never came"
            " | Agent: let me get someone",
        },
    }
    assert set(sip_invite_headers(endpoint)) == {"X-Hotline-Reason", "X-Hotline-Summary"}


async def test_vonage_cold_transfer_to_sip_has_no_headers(
    apis: ProviderApis, control: CallControl
) -> None:
    await control.transfer("vonage", VONAGE_CALL, Transfer("sip:desk@pbx.example.com"))

    endpoint = _only(apis).body["destination"]["ncco"][0]["endpoint"][0]
    assert endpoint == {"type": "sip", "uri": "sip:desk@pbx.example.com"}


async def test_vonage_digits_pause_with_p(
    apis: ProviderApis, control: CallControl, vonage_key: rsa.RSAPrivateKey
) -> None:
    await control.send_digits("vonage", VONAGE_CALL, "1w2W#*")

    seen = _only(apis)
    assert (seen.method, seen.path) == ("PUT", f"/v1/calls/{VONAGE_CALL}/dtmf")
    assert seen.body == {"digits": "1p2pp#*"}
    assert _vonage_claims(seen, vonage_key)["application_id"] == VONAGE_APP


async def test_vonage_bad_jwt(apis: ProviderApis, client: httpx.AsyncClient) -> None:
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    control = CallControl(_settings(apis, stranger), client)
    with pytest.raises(CallControlError) as caught:
        await control.send_digits("vonage", VONAGE_CALL, "1")

    assert (caught.value.provider, caught.value.status) == ("vonage", 401)
    assert "HTTP 401" in str(caught.value)
    assert "Unauthorized: You did not provide correct credentials." in str(caught.value)
    assert apis.accepted == []


async def test_vonage_jwt_for_another_application(
    apis: ProviderApis, client: httpx.AsyncClient, vonage_key: rsa.RSAPrivateKey
) -> None:
    other = _settings(apis, vonage_key, vonage_application_id=str(uuid.uuid4()))
    with pytest.raises(CallControlError) as caught:
        await CallControl(other, client).transfer("vonage", VONAGE_CALL, Transfer("+15551230001"))
    assert caught.value.status == 401


async def test_vonage_unknown_call_gives_the_providers_detail(
    apis: ProviderApis, control: CallControl
) -> None:
    gone = str(uuid.uuid4())
    with pytest.raises(CallControlError) as caught:
        await control.transfer("vonage", gone, Transfer("+15551230001"))

    assert caught.value.status == 404
    assert f"Not Found: Call {gone} was not found" in str(caught.value)


async def test_vonage_5xx_is_not_retried(apis: ProviderApis, control: CallControl) -> None:
    apis.fail_next("vonage", 500)
    with pytest.raises(CallControlError) as caught:
        await control.transfer("vonage", VONAGE_CALL, Transfer("+15551230001"))

    assert caught.value.status == 500
    assert len(apis.received) == 1  # a second transfer could dial twice


async def test_vonage_refusal_names_the_invalid_parameter(
    apis: ProviderApis, control: CallControl
) -> None:
    long_uri = "sip:" + "a" * 60 + "@pbx.example.com"  # Vonage takes 50 characters at most
    with pytest.raises(CallControlError) as caught:
        await control.transfer("vonage", VONAGE_CALL, Transfer(long_uri))

    assert caught.value.status == 400
    assert "destination.ncco[0].endpoint[0].uri" in str(caught.value)


async def test_vonage_key_from_a_file(
    apis: ProviderApis,
    client: httpx.AsyncClient,
    vonage_key: rsa.RSAPrivateKey,
    tmp_path: Path,
) -> None:
    path = tmp_path / "private.key"
    path.write_text(_pem(vonage_key))
    settings = _settings(
        apis, vonage_key, vonage_private_key=None, vonage_private_key_file=str(path)
    )
    control = CallControl(settings, client)
    assert control.supports("vonage")

    await control.send_digits("vonage", VONAGE_CALL, "9")
    assert _only(apis).body == {"digits": "9"}


async def test_vonage_unusable_key_is_named_not_shown(
    apis: ProviderApis, client: httpx.AsyncClient, vonage_key: rsa.RSAPrivateKey, tmp_path: Path
) -> None:
    not_a_key = "-----BEGIN PRIVATE KEY-----\nc2VjcmV0LW5vdC1hLWtleQ==\n-----END PRIVATE KEY-----"
    bad = CallControl(_settings(apis, vonage_key, vonage_private_key=SecretStr(not_a_key)), client)
    with pytest.raises(CallControlError) as caught:
        await bad.send_digits("vonage", VONAGE_CALL, "1")
    assert "not an unencrypted PEM private key" in str(caught.value)
    assert "c2VjcmV0" not in str(caught.value)

    absent = str(tmp_path / "absent.key")
    missing = _settings(apis, vonage_key, vonage_private_key=None, vonage_private_key_file=absent)
    with pytest.raises(CallControlError, match="cannot read the private key file"):
        await CallControl(missing, client).send_digits("vonage", VONAGE_CALL, "1")
    assert apis.received == []


# -- both --------------------------------------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port  # nothing listens there now


@pytest.mark.parametrize("provider", ["telnyx", "vonage"])
async def test_unreachable_api(
    provider: str, client: httpx.AsyncClient, vonage_key: rsa.RSAPrivateKey
) -> None:
    base = f"http://127.0.0.1:{_closed_port()}"
    settings = CallControlSettings(
        telnyx_api_key=SecretStr(TELNYX_KEY),
        telnyx_api_url=f"{base}/v2",
        vonage_application_id=VONAGE_APP,
        vonage_private_key=SecretStr(_pem(vonage_key)),
        vonage_api_url=base,
    )
    with pytest.raises(CallControlError) as caught:
        await CallControl(settings, client).transfer(provider, "call-1", Transfer("+15551230001"))

    assert caught.value.status is None
    assert "cannot reach 127.0.0.1" in str(caught.value)
    assert "ConnectError" in str(caught.value)


@pytest.mark.parametrize("provider", ["telnyx", "vonage"])
async def test_no_answer_in_time(
    provider: str,
    apis: ProviderApis,
    client: httpx.AsyncClient,
    vonage_key: rsa.RSAPrivateKey,
) -> None:
    apis.stall_next(provider, times=2)
    control = CallControl(_settings(apis, vonage_key, timeout_s=0.2), client)
    call = TELNYX_CALL if provider == "telnyx" else VONAGE_CALL
    with pytest.raises(CallControlError) as caught:
        await control.send_digits(provider, call, "1")

    assert caught.value.status is None
    assert "no answer within 0.2 s" in str(caught.value)
    # Telnyx's command_id makes a second try safe; Vonage's request may have been acted on.
    expected_tries = 2 if provider == "telnyx" else 1
    await apis.stop()  # answers the stalled requests, and waits until they are recorded
    assert len(apis.received) == expected_tries


async def test_supports_needs_credentials(client: httpx.AsyncClient) -> None:
    bare = CallControl(CallControlSettings(), client)
    assert not bare.supports("telnyx")
    assert not bare.supports("vonage")
    assert not bare.supports("twilio")

    half = CallControl(CallControlSettings(vonage_application_id=VONAGE_APP), client)
    assert not half.supports("vonage")  # no private key
    keyed = CallControlSettings(
        telnyx_api_key=SecretStr("KEY"),
        vonage_application_id=VONAGE_APP,
        vonage_private_key_file="/etc/hotline/private.key",
    )
    assert CallControl(keyed, client).supports("telnyx")
    assert CallControl(keyed, client).supports("vonage")
    assert not CallControl(keyed, client).supports("twilio")


async def test_refused_before_sending(apis: ProviderApis, client: httpx.AsyncClient) -> None:
    bare = CallControl(CallControlSettings(telnyx_api_url=apis.telnyx_url), client)
    with pytest.raises(CallControlError, match="not configured"):
        await bare.transfer("telnyx", TELNYX_CALL, Transfer("+15551230001"))
    with pytest.raises(CallControlError, match="cannot be transferred here"):
        await bare.transfer("twilio", "CA123", Transfer("+15551230001"))

    control = CallControl(CallControlSettings(telnyx_api_key=SecretStr(TELNYX_KEY)), client)
    with pytest.raises(CallControlError, match="neither a"):
        await control.transfer("telnyx", TELNYX_CALL, Transfer("5551230001"))
    with pytest.raises(CallControlError, match="use 1 to 64"):
        await control.send_digits("telnyx", TELNYX_CALL, "1; DROP")
    assert apis.received == []


async def test_a_long_summary_is_cut_for_the_sip_header(
    apis: ProviderApis, control: CallControl
) -> None:
    summary = "Reason: help\n" + "\n".join(f"Caller: line {i} – ça va" for i in range(60))
    await control.transfer("telnyx", TELNYX_CALL, Transfer("sip:desk@pbx.example.com", "", summary))

    headers = {h["name"]: h["value"] for h in _only(apis).body["custom_headers"]}
    assert set(headers) == {"X-Hotline-Summary"}  # no reason given: no reason header
    value = headers["X-Hotline-Summary"]
    assert len(value.encode()) <= HEADER_VALUE_BYTES
    assert value.startswith("Reason: help | Caller: line 0 – ça va")
    assert value.endswith("…")
    assert "\n" not in value


async def test_secrets_never_reach_logs_or_errors(
    apis: ProviderApis,
    client: httpx.AsyncClient,
    vonage_key: rsa.RSAPrivateKey,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    control = CallControl(_settings(apis, vonage_key), client)
    messages: list[str] = []
    await control.transfer("telnyx", TELNYX_CALL, Transfer("+15551230001"))
    await control.send_digits("vonage", VONAGE_CALL, "1")
    for provider, call in (("telnyx", TELNYX_CALL), ("vonage", VONAGE_CALL)):
        apis.fail_next(provider, 500, times=2)
        with pytest.raises(CallControlError) as caught:
            await control.transfer(provider, call, Transfer("sip:desk@pbx.example.com", "x", "y"))
        messages.append(str(caught.value))
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    with pytest.raises(CallControlError) as caught:
        await CallControl(_settings(apis, stranger), client).send_digits("vonage", VONAGE_CALL, "1")
    messages.append(str(caught.value))

    tokens = [r.headers["authorization"].split(" ", 1)[1] for r in apis.received]
    assert TELNYX_KEY in tokens
    pem_body = "".join(_pem(vonage_key).splitlines()[1:-1])
    secrets = [*set(tokens), pem_body[:40], pem_body[-40:]]
    text = caplog.text + "\n".join(messages) + "\n".join(repr(r.args) for r in caplog.records)
    assert "refused, HTTP 500" in caplog.text  # the failures were logged
    for secret in secrets:
        assert secret not in text


# -- the fakes themselves ----------------------------------------------------------------------


async def test_the_fakes_refuse_what_the_documents_do_not_allow(
    apis: ProviderApis, client: httpx.AsyncClient, vonage_key: rsa.RSAPrivateKey
) -> None:
    telnyx = f"{apis.telnyx_url}/calls/{TELNYX_CALL}/actions/transfer"
    auth = {"Authorization": f"Bearer {TELNYX_KEY}"}
    misspelt = await client.post(telnyx, json={"to": "+15551230001", "too": "x"}, headers=auth)
    assert misspelt.status_code == 422
    assert misspelt.json()["errors"][0]["source"] == {"pointer": "/too"}
    missing = await client.post(telnyx, json={"command_id": "c1"}, headers=auth)
    assert (missing.status_code, missing.json()["errors"][0]["code"]) == (422, "10004")
    not_json = await client.post(telnyx, content=b"to=+15551230001", headers=auth)
    assert not_json.status_code == 415

    def token(**claims: Any) -> dict[str, str]:
        now = int(time.time())
        base = {"application_id": VONAGE_APP, "iat": now, "exp": now + 60, "jti": "j1"}
        signed = jwt.encode({**base, **claims}, vonage_key, algorithm="RS256")
        return {"Authorization": f"Bearer {signed}"}

    vonage = f"{apis.vonage_url}/v1/calls/{VONAGE_CALL}"
    connect = {"action": "connect", "endpoint": [{"type": "phone", "number": "+15551230001"}]}
    body = {"action": "transfer", "destination": {"type": "ncco", "ncco": [connect]}}
    plus = await client.put(vonage, json=body, headers=token())
    assert plus.status_code == 400
    assert plus.json()["invalid_parameters"][0]["name"] == "destination.ncco[0].endpoint[0].number"
    expired = await client.put(vonage, json=body, headers=token(exp=int(time.time()) - 10))
    assert expired.status_code == 401
    no_jti = await client.put(f"{vonage}/dtmf", json={"digits": "1"}, headers=token(jti=None))
    assert no_jti.status_code == 401
    pause_w = await client.put(f"{vonage}/dtmf", json={"digits": "1w2"}, headers=token())
    assert pause_w.status_code == 400  # Vonage pauses with p
    assert apis.accepted == []

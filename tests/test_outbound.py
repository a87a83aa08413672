"""Placing calls (`POST /calls/outbound`, `hotline dial`) against a real `hotline serve` and
faithful fakes of Twilio's Calls API, Telnyx's Dial and Vonage's createCall
(tests/support/outbound_apis.py): the exact request Hotline sends, then the media stream the
provider would open with what it was given (Twilio's TwiML, Telnyx's stream URL, Vonage's
NCCO), played by the emulated phone, a turn spoken and answered, and the call's record and
webhook; with machine detection, who answered (a recorded voicemail greeting and beep, a
"Hello."); refusals (401, 422, 502, 503, 429) reach no provider or name its error."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from starlette.routing import Route
from typer.testing import CliRunner
from websockets.asyncio.client import connect

from tests.support.outbound_apis import OutboundApis
from tests.support.outbound_calls import (
    Hooks,
    VonageLeg,
    answer,
    asterisk,
    one_turn,
    refused_stream,
    screened_call,
    stream_of,
    telnyx_answers,
)
from tests.support.poll import wait_until
from tests.support.server import Server, logged, start_server, stop_server
from tests.support.speech import concat, silence, utterance
from voice.cli.main import app as cli
from voice.devtools.turns import CallResult

pytestmark = pytest.mark.slow

API_TOKEN = "outbound-api-token-7d1e"
AUTH = {"Authorization": f"Bearer {API_TOKEN}"}
ACCOUNT_SID = "AC" + "5" * 32
TWILIO_TOKEN = "twilio-auth-token-0c9b"
HOOK_SECRET = "outbound-webhook-secret-44a1"
TELNYX_KEY = "KEY0123-telnyx-outbound"
TELNYX_APP = "1494404757140276705"  # the Call Control app (connection) that places calls
VONAGE_APP = "aaaaaaaa-bbbb-4ccc-8ddd-0123456789ab"
VONAGE_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
VONAGE_PEM = VONAGE_KEY.private_bytes(
    serialization.Encoding.PEM,
    serialization.PrivateFormat.PKCS8,
    serialization.NoEncryption(),
).decode()
OURS = "+15551110000"  # the number Hotline calls from (the survey agent's own line)
CUSTOMER = "+15557654321"  # routed by number, this would reach the default agent
BLOCKED = "+2125550100"  # the account's geographic permissions do not allow it
GREETING = "Hi, Acme here about your order."
VOICEMAIL = "Hi, this is Acme about your spring order. Please call us back."
SCREENED = {"to": CUSTOMER, "from": OURS, "agent": "survey", "machine_detection": True}
SURVEY = f"""
name: survey
numbers: ["{OURS}"]
instructions: You call customers to ask how their spring order went.
greeting: "{GREETING}"
builtin_tools: []
voicemail: "{VOICEMAIL}"
"""
CALLS_PER_SECOND = 3


@pytest.fixture(scope="module")
def hooks() -> Hooks:
    return Hooks(HOOK_SECRET)


@pytest.fixture(scope="module")
def apis(hooks: Hooks) -> Iterator[OutboundApis]:
    receiver = Route("/hooks/call-ended", hooks.receive, methods=["POST"])
    with OutboundApis(
        ACCOUNT_SID,
        TWILIO_TOKEN,
        telnyx_api_key=TELNYX_KEY,
        telnyx_connection_id=TELNYX_APP,
        vonage_application_id=VONAGE_APP,
        vonage_public_key=VONAGE_KEY.public_key(),
        blocked={BLOCKED},
        extra_routes=[receiver],
    ) as api:
        yield api


@pytest.fixture(scope="module")
def dialer(apis: OutboundApis, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    agents = tmp_path_factory.mktemp("agents")
    (agents / "survey.yaml").write_text(SURVEY, encoding="utf-8")
    running = start_server(
        {
            "HOTLINE_API_TOKEN": API_TOKEN,
            "HOTLINE_MAX_CALLS": "1",
            "HOTLINE_AGENTS__DIR": str(agents),
            "HOTLINE_CALL_CONTROL__TWILIO_ACCOUNT_SID": ACCOUNT_SID,
            "HOTLINE_CALL_CONTROL__TWILIO_AUTH_TOKEN": TWILIO_TOKEN,
            "HOTLINE_CALL_CONTROL__TWILIO_API_URL": apis.url,
            "HOTLINE_CALL_CONTROL__TELNYX_API_KEY": TELNYX_KEY,
            "HOTLINE_CALL_CONTROL__TELNYX_CONNECTION_ID": TELNYX_APP,
            "HOTLINE_CALL_CONTROL__TELNYX_API_URL": apis.telnyx_url,
            "HOTLINE_CALL_CONTROL__VONAGE_APPLICATION_ID": VONAGE_APP,
            "HOTLINE_CALL_CONTROL__VONAGE_PRIVATE_KEY": VONAGE_PEM,
            "HOTLINE_CALL_CONTROL__VONAGE_API_URL": apis.vonage_url,
            "HOTLINE_OUTBOUND__CALLS_PER_SECOND": str(CALLS_PER_SECOND),
            "HOTLINE_WEBHOOK__URL": f"{apis.url}/hooks/call-ended",
            "HOTLINE_WEBHOOK__SECRET": HOOK_SECRET,
        }
    )
    yield running
    assert stop_server(running) == 0, "\n".join(running.log[-40:])


def place(server: Server, body: dict[str, Any], headers: dict[str, str] = AUTH) -> httpx.Response:
    return httpx.post(f"{server.url}/calls/outbound", json=body, headers=headers, timeout=30)


def test_a_placed_call_is_answered_by_the_requested_agent(
    dialer: Server, apis: OutboundApis, hooks: Hooks
) -> None:
    metadata = {"campaign": "spring", "customer": 42, "tags": ["vip"]}
    asked = {"to": CUSTOMER, "from": OURS, "agent": "survey", "metadata": metadata}
    response = place(dialer, asked)
    assert response.status_code == 202, response.text
    placed = response.json()
    [sent] = apis.created
    sid = sent.answer["sid"]
    assert placed == {
        "call_id": sid,
        "transport": "twilio",
        "status": "queued",
        "direction": "outbound",
        "to": CUSTOMER,
        "from": OURS,
        "agent": "survey",
    }
    # The request Twilio got: its account's path, Basic auth, the form and nothing else.
    assert sent.path == f"/2010-04-01/Accounts/{ACCOUNT_SID}/Calls.json"
    assert (sent.username, sent.password) == (ACCOUNT_SID, TWILIO_TOKEN)
    assert sent.content_type.startswith("application/x-www-form-urlencoded")
    assert set(sent.body) == {"To", "From", "Twiml"}
    assert (sent.body["To"], sent.body["From"]) == (CUSTOMER, OURS)
    url, action, parameters = stream_of(sent.body["Twiml"])
    base = dialer.url.removeprefix("http://")
    assert url == f"ws://{base}/twilio/stream"
    assert action == f"http://{base}/twilio/after-stream"
    assert set(parameters) == {"from", "to", "outbound", "direction", "token"}
    assert (parameters["from"], parameters["to"]) == (OURS, CUSTOMER)
    assert parameters["direction"] == "outbound"
    # Twilio rings, the customer answers: Twilio opens the stream with that TwiML. While that
    # call is in progress, the server (one call at most) has no room for another.
    speech = utterance("The delivery came on time.")
    result, busy = asyncio.run(answer(dialer, url, sid, parameters, speech, asked, AUTH))
    assert busy.status_code == 503, busy.text
    assert busy.json()["error"] == "no call can be admitted now (capacity)"
    assert busy.headers["retry-after"] == "1"
    assert len(apis.received) == 1  # the refused call never reached Twilio
    [turn] = result.turns
    assert turn.reply_start is not None, "the turn got no reply"
    call = httpx.get(f"{dialer.url}/calls/{sid}", headers=AUTH, timeout=10).json()
    assert (call["direction"], call["agent"], call["metadata"]) == ("outbound", "survey", metadata)
    assert (call["transport"], call["caller"], call["callee"]) == ("twilio", OURS, CUSTOMER)
    assert call["history"][0]["content"] == GREETING  # the survey agent's, not the default's
    [record] = call["records"]
    assert "delivery" in record["caller_text"].lower() and record["reply_text"]
    document = wait_until(lambda: hooks.documents.get(sid), "the call's webhook", within_s=20)
    assert (document["call"]["direction"], document["call"]["metadata"]) == ("outbound", metadata)
    # The stream token is single use: the same stream again is refused.
    assert asyncio.run(refused_stream(url, ACCOUNT_SID, sid, parameters)) == 1008


def test_a_telnyx_call_is_dialled_and_its_stream_answered(
    dialer: Server, apis: OutboundApis
) -> None:
    """Telnyx's Dial with the media stream on it; the stream Telnyx opens (from the URL Hotline
    gave it) becomes the outbound call, with the agent and metadata asked for."""
    metadata = {"campaign": "telnyx"}
    asked = {"to": CUSTOMER, "from": OURS, "agent": "survey", "transport": "telnyx"}
    response = place(dialer, {**asked, "metadata": metadata})
    assert response.status_code == 202, response.text
    sent = apis.created[-1]
    call_id = sent.answer["data"]["call_control_id"]
    assert response.json()["call_id"] == call_id
    assert (sent.api, sent.path, sent.password) == ("telnyx", "/v2/calls", TELNYX_KEY)
    assert sent.content_type.startswith("application/json")
    url = sent.body.pop("stream_url")
    assert sent.body == {
        "connection_id": TELNYX_APP,
        "to": CUSTOMER,
        "from": OURS,
        "stream_track": "inbound_track",
        "stream_bidirectional_mode": "rtp",
        "stream_bidirectional_codec": "PCMU",
    }
    parts = urlsplit(url)
    assert (parts.scheme, parts.netloc, parts.path) == ("ws", dialer.url[7:], "/telnyx/stream")
    assert set(parse_qs(parts.query)) == {"outbound", "token"}
    speech = utterance("The delivery came on time.")
    result = asyncio.run(telnyx_answers(url, call_id, OURS, CUSTOMER, speech))
    [turn] = result.turns
    assert turn.reply_start is not None, "the turn got no reply"
    call = httpx.get(f"{dialer.url}/calls/{call_id}", headers=AUTH, timeout=10).json()
    assert (call["direction"], call["agent"], call["metadata"]) == ("outbound", "survey", metadata)
    assert (call["transport"], call["caller"], call["callee"]) == ("telnyx", OURS, CUSTOMER)
    assert call["history"][0]["content"] == GREETING


def test_a_vonage_call_is_created_and_its_websocket_answered(
    dialer: Server, apis: OutboundApis
) -> None:
    """createCall with an inline NCCO connecting to the media stream; the websocket leg Vonage
    opens becomes the outbound call, under the uuid Vonage answered with."""
    metadata = {"campaign": "vonage"}
    asked = {"to": CUSTOMER, "from": OURS, "agent": "survey", "transport": "vonage"}
    response = place(dialer, {**asked, "metadata": metadata})
    assert response.status_code == 202, response.text
    sent = apis.created[-1]
    call_id = sent.answer["uuid"]
    assert response.json()["call_id"] == call_id
    assert (sent.api, sent.path, sent.username) == ("vonage", "/v1/calls", VONAGE_APP)
    assert sent.body["to"] == [{"type": "phone", "number": CUSTOMER[1:]}]
    assert sent.body["from"] == {"type": "phone", "number": OURS[1:]}
    [connect_action] = sent.body["ncco"]
    [endpoint] = connect_action["endpoint"]
    assert (connect_action["action"], endpoint["type"]) == ("connect", "websocket")
    assert endpoint["content-type"] == "audio/l16;rate=16000"
    headers = endpoint["headers"]
    assert set(headers) == {"from", "to", "outbound", "direction"}
    url = endpoint["uri"]
    assert set(parse_qs(urlsplit(url).query)) == {"outbound", "token"}
    speech = utterance("The delivery came on time.")

    async def answered() -> CallResult:
        async with connect(url, compression=None, open_timeout=10) as socket:
            return await one_turn(VonageLeg(socket, headers), call_id, speech)

    [turn] = asyncio.run(answered()).turns
    assert turn.reply_start is not None, "the turn got no reply"
    call = httpx.get(f"{dialer.url}/calls/{call_id}", headers=AUTH, timeout=10).json()
    assert (call["direction"], call["agent"], call["metadata"]) == ("outbound", "survey", metadata)
    assert (call["transport"], call["caller"], call["callee"]) == ("vonage", OURS, CUSTOMER)


def test_the_api_token_is_required(dialer: Server, apis: OutboundApis) -> None:
    before = len(apis.received)
    asked = {"to": CUSTOMER, "from": OURS, "agent": "survey"}
    assert place(dialer, asked, headers={}).status_code == 401
    wrong = {"Authorization": "Bearer not-the-token"}
    assert place(dialer, asked, headers=wrong).status_code == 401
    assert len(apis.received) == before


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (
            {"to": CUSTOMER, "from": OURS, "agent": "survey", "colour": "red"},
            "colour: unknown field",
        ),
        ({"to": "5557654321", "from": OURS, "agent": "survey"}, "to: '5557654321' is not a phone"),
        ({"to": CUSTOMER, "from": OURS, "agent": "nobody"}, "agent: no agent 'nobody'"),
        ({"to": CUSTOMER, "agent": "survey"}, "from: required"),
        ({"to": CUSTOMER, "from": OURS, "agent": "survey", "transport": "fax"}, "transport:"),
        ({"to": CUSTOMER, "from": OURS, "agent": "survey", "trunk": "pbx"}, "trunk: only with"),
        ({"to": CUSTOMER, "from": OURS, "agent": "survey", "metadata": [1]}, "metadata:"),
    ],
)
def test_a_bad_request_is_422_naming_the_field(
    dialer: Server, apis: OutboundApis, body: dict[str, Any], said: str
) -> None:
    before = len(apis.received)
    response = place(dialer, body)
    assert response.status_code == 422, response.text
    assert said in response.json()["error"]
    assert len(apis.received) == before


def test_a_machine_gets_the_agent_s_voicemail_after_its_beep(
    dialer: Server, apis: OutboundApis, hooks: Hooks
) -> None:
    """Allison's voicemail greeting, then Asterisk's beep: the record says machine, the agent's
    message is said after the beep has ended (by the phone's own clock), and the call ends."""
    opening = concat(silence(300), asterisk("vm-intro"), silence(400), asterisk("beep"))
    answered, call = screened_call(dialer, AUTH, apis, SCREENED, opening)
    assert answered.server_ended, "the call did not end after the message"
    assert answered.media_at, "no message was said"
    assert min(answered.media_at) > answered.sent_by(len(opening))  # none before the beep ended
    answered_by = call["answered_by"]
    assert answered_by["result"] == "machine", answered_by
    assert abs(answered_by["beep_ms"] - len(opening) / 16) <= 200, answered_by  # 16 kHz
    assert call["records"] == []  # no LLM turn on a machine
    assert [m["content"] for m in call["history"]] == [VOICEMAIL]
    assert call["end_reason"] == "voicemail: message left"
    document = wait_until(lambda: hooks.documents.get(call["call_id"]), "its webhook", within_s=20)
    assert document["call"]["answered_by"] == answered_by


def test_a_person_is_greeted_once_they_said_hello(dialer: Server, apis: OutboundApis) -> None:
    """Allison's "Hello.": the record says human, the greeting is the answer to it (nothing is
    played before it ended, and it is no turn of its own), and the next words are a turn."""
    hello, speech = concat(silence(300), asterisk("hello")), utterance("The delivery came on time.")
    body = {**SCREENED, "voicemail": None}
    answered, call = screened_call(dialer, AUTH, apis, body, hello, [speech], linger_s=0)
    assert answered.first_heard is not None and answered.first_heard > answered.sent_by(len(hello))
    [turn] = answered.turns
    assert turn.reply_start is not None, "the turn got no reply"
    assert (call["answered_by"]["result"], call["answered_by"]["beep_ms"]) == ("human", None)
    assert call["history"][0]["content"] == GREETING
    [record] = call["records"]  # the "Hello." was answered by the greeting, not by a turn
    assert "delivery" in record["caller_text"].lower(), record
    assert "hello" not in record["caller_text"].lower(), record


def test_a_machine_taken_for_a_person_gets_the_message_after_its_beep(
    dialer: Server, apis: OutboundApis
) -> None:
    """ "Hello.", a pause, a beep: greeted as a person until the beep, then left the message."""
    opening = concat(silence(300), asterisk("hello"), silence(1500), asterisk("beep"))
    answered, call = screened_call(dialer, AUTH, apis, SCREENED, opening)
    assert answered.server_ended, "the call did not end after the message"
    assert max(answered.media_at) > answered.sent_by(len(opening))  # the message, after the beep
    answered_by = call["answered_by"]
    assert (answered_by["result"], answered_by["revised"]) == ("machine", True), answered_by
    assert call["records"] == []  # no LLM turn
    assert call["history"][-1]["content"] == VOICEMAIL
    assert call["end_reason"] == "voicemail: message left"


def test_twilio_refusing_a_call_is_a_502_with_its_code(dialer: Server, apis: OutboundApis) -> None:
    mark = dialer.log_mark()
    response = place(dialer, {"to": BLOCKED, "from": OURS, "agent": "survey"})
    assert response.status_code == 502, response.text
    refused = response.json()
    assert (refused["provider"], refused["provider_code"]) == ("twilio", "21215")
    assert refused["provider_status"] == 400
    assert "code 21215" in refused["error"] and "Account not authorized to call" in refused["error"]
    asyncio.run(logged(dialer, "Twilio refused it (HTTP 400, code 21215)", since=mark))
    assert not any(TWILIO_TOKEN in line for line in dialer.log)


def test_hotline_dial_places_a_call_and_says_a_refusal_in_one_line(
    dialer: Server, apis: OutboundApis
) -> None:
    command = ["dial", "--to", CUSTOMER, "--from", OURS, "--agent", "survey", "--url", dialer.url]
    placed = CliRunner().invoke(cli, command, env={"HOTLINE_API_TOKEN": API_TOKEN})
    assert placed.exit_code == 0, placed.output
    sid = apis.created[-1].answer["sid"]
    assert placed.output.startswith(f"call {sid}: twilio rings {CUSTOMER} from {OURS}")
    command[2] = BLOCKED
    refused = CliRunner().invoke(cli, command, env={"HOTLINE_API_TOKEN": API_TOKEN})
    assert refused.exit_code == 1
    assert "HTTP 502" in refused.output and "code 21215" in refused.output
    assert "Traceback" not in refused.output
    command[2], command[-2:-2] = CUSTOMER, ["--voicemail", "Call us back."]  # no screening
    unscreened = CliRunner().invoke(cli, command, env={"HOTLINE_API_TOKEN": API_TOKEN})
    assert unscreened.exit_code == 1 and "needs machine_detection" in unscreened.output


def test_a_burst_beyond_the_calls_per_second_is_refused(dialer: Server, apis: OutboundApis) -> None:
    """Last in the module: it spends the budget (the tests before may have spent some)."""
    before = len(apis.created)
    asked = {"to": CUSTOMER, "from": OURS, "agent": "survey"}

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=dialer.url, headers=AUTH, timeout=30) as http:
            return list(
                await asyncio.gather(*(http.post("/calls/outbound", json=asked) for _ in range(8)))
            )

    answers = asyncio.run(burst())
    statuses = sorted(r.status_code for r in answers)
    placed = statuses.count(202)
    assert 429 in statuses and set(statuses) <= {202, 429}, statuses
    assert placed <= CALLS_PER_SECOND + 1, statuses  # + what refilled during the burst
    assert len(apis.created) - before == placed  # a refused call never reached Twilio
    too_fast = next(r for r in answers if r.status_code == 429)
    assert int(too_fast.headers["retry-after"]) >= 1
    assert "calls per second" in too_fast.json()["error"]


def test_the_basic_credentials_sent_are_the_account_s(apis: OutboundApis) -> None:
    """The fake itself refuses other credentials with Twilio's 20003."""
    wrong = base64.b64encode(f"{ACCOUNT_SID}:wrong".encode()).decode()
    response = httpx.post(
        f"{apis.url}/2010-04-01/Accounts/{ACCOUNT_SID}/Calls.json",
        data={"To": CUSTOMER, "From": OURS, "Twiml": "<Response/>"},
        headers={"Authorization": f"Basic {wrong}"},
    )
    assert response.status_code == 401
    assert response.json()["code"] == 20003

"""Fakes of the providers' REST APIs for placing calls (Twilio's Calls resource, Telnyx's Dial):
one real HTTP server on a free loopback port (Starlette under uvicorn, in a thread), started as
a context manager:

    with OutboundApis(account_sid=SID, auth_token=TOKEN) as apis:
        ... HOTLINE_CALL_CONTROL__TWILIO_API_URL=apis.url
        ... HOTLINE_CALL_CONTROL__TELNYX_API_URL=apis.telnyx_url

"Create a Call resource" (https://www.twilio.com/docs/voice/api/call-resource):
`POST /2010-04-01/Accounts/{AccountSid}/Calls.json`, HTTP Basic auth (the account SID and its
auth token), a form-encoded body with `To`, `From` and one of `Url`, `Twiml`, `ApplicationSid`.
201 with the call resource as JSON (`sid` "CA" + 32 hex, `status` "queued", `direction`
"outbound-api", ...). Errors as Twilio's JSON `{"code", "message", "more_info", "status"}`:
401 code 20003 (bad credentials), 400 code 21201 (no `To`), 21213 (no `From`), 21211 (an
invalid `To`), 21205 (no `Url`, `Twiml` or `ApplicationSid`), 21215 (a number the account's
geographic permissions do not allow, here any `To` in `blocked`), 12100 (a `Twiml` that is not
XML with a `<Response>` root, or over 4 000 characters).

Telnyx Dial (https://developers.telnyx.com/api-reference/call-commands/dial): `POST /v2/calls`,
`Authorization: Bearer <API key>`, JSON with `connection_id` (this Call Control app's), `to`,
`from` required; 200 `{"data": {"call_control_id": "v3:…", "call_leg_id", "call_session_id",
"is_alive": false, "record_type": "call"}}`. Errors as `{"errors": [{"code", "title",
"detail"}]}`: 401 code 10009, 422 code 10004 (a missing field) or 10015 (a bad value).

Vonage createCall (https://developer.vonage.com/en/api/voice): `POST /v1/calls`, `Authorization:
Bearer <JWT>` (RS256, verified with the application's public key; `application_id`, `iat`,
`exp`, `jti` required), JSON with `to` (one phone endpoint), `from` (a phone endpoint) and an
inline `ncco` whose `connect` has one `websocket` endpoint (`uri` ws(s)://, `content-type`
audio/l16 at 8 or 16 kHz, `headers` of strings); 201 `{"uuid", "status": "started",
"direction": "outbound", "conversation_uuid"}`. Errors in RFC 7807 form: 401, 400 with
`invalid_parameters`.

Stricter than the real APIs in one way, as tests/support/provider_apis.py is: a field the
documents do not list is refused (Twilio 400 code 20001, Telnyx 422 code 10015) instead of
ignored, so a misspelt field fails a test. Every request is in `received`; the calls created
are in `created`.
"""

from __future__ import annotations

import base64
import json
import re
import socket
import threading
import uuid
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any
from urllib.parse import parse_qsl

import jwt
import uvicorn
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPublicKey
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from tests.support.outbound_bodies import (
    Refused,
    telnyx_call,
    telnyx_error,
    vonage_call,
    vonage_error,
)
from tests.support.poll import wait_until

CREATE_CALL_FIELDS = {  # the documented form fields of "Create a Call resource"
    "To", "From", "Method", "FallbackUrl", "FallbackMethod", "StatusCallback",
    "StatusCallbackEvent", "StatusCallbackMethod", "SendDigits", "Timeout", "Record",
    "RecordingChannels", "RecordingStatusCallback", "RecordingStatusCallbackMethod",
    "SipAuthUsername", "SipAuthPassword", "MachineDetection", "MachineDetectionTimeout",
    "RecordingStatusCallbackEvent", "Trim", "CallerId", "MachineDetectionSpeechThreshold",
    "MachineDetectionSpeechEndThreshold", "MachineDetectionSilenceTimeout", "AsyncAmd",
    "AsyncAmdStatusCallback", "AsyncAmdStatusCallbackMethod", "Byoc", "CallReason",
    "CallToken", "RecordingTrack", "TimeLimit", "Url", "Twiml", "ApplicationSid",
}  # fmt: skip
E164 = re.compile(r"\+[1-9]\d{1,14}")
TWIML_CHARS = 4000


@dataclass(frozen=True)
class Received:
    """One request as the fake saw it: its body (Twilio's form, one value a field, or Telnyx's
    JSON), the credentials (Basic user and password, or the bearer key as `password`), and
    what it answered."""

    api: str  # "twilio" or "telnyx"
    path: str
    body: dict[str, Any]
    username: str | None
    password: str | None
    content_type: str
    status: int
    answer: dict[str, Any]


def twilio_error(status: int, code: int, message: str) -> JSONResponse:
    body = {
        "code": code,
        "message": message,
        "more_info": f"https://www.twilio.com/docs/errors/{code}",
        "status": status,
    }
    return JSONResponse(body, status_code=status)


@dataclass
class OutboundApis:
    account_sid: str
    auth_token: str
    telnyx_api_key: str = ""
    telnyx_connection_id: str = ""
    vonage_application_id: str = ""
    vonage_public_key: RSAPublicKey | None = None
    blocked: set[str] = field(default_factory=set)  # numbers the account may not call (21215)
    extra_routes: list[BaseRoute] = field(default_factory=list)  # e.g. a webhook receiver
    received: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _port: int = 0
    _server: uvicorn.Server | None = None
    _thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    @property
    def telnyx_url(self) -> str:
        return f"{self.url}/v2"

    @property
    def created(self) -> list[Received]:
        with self.lock:
            return [r for r in self.received if r.status in (200, 201)]

    @property
    def vonage_url(self) -> str:
        return self.url

    def __enter__(self) -> OutboundApis:
        route = Route("/2010-04-01/Accounts/{account}/Calls.json", self._create, methods=["POST"])
        dial = Route("/v2/calls", self._telnyx_dial, methods=["POST"])
        vonage = Route("/v1/calls", self._vonage_create, methods=["POST"])
        app = Starlette(routes=[route, dial, vonage, *self.extra_routes])
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self._port = sock.getsockname()[1]
        config = uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False)
        server = self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]})
        self._thread.start()
        wait_until(lambda: server.started, "the fake Twilio API to start")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)

    async def _create(self, request: Request) -> Response:
        raw = (await request.body()).decode()
        form_pairs = parse_qsl(raw, keep_blank_values=True)
        form = dict(form_pairs)
        username, password = _basic(request.headers.get("authorization", ""))
        content_type = request.headers.get("content-type", "")
        try:
            if (username, password) != (self.account_sid, self.auth_token):
                raise Refused(twilio_error(401, 20003, "Authenticate"))
            if request.path_params["account"] != self.account_sid:
                raise Refused(twilio_error(401, 20003, "Authenticate"))
            if not content_type.startswith("application/x-www-form-urlencoded"):
                raise Refused(twilio_error(400, 20001, "The body must be form-encoded"))
            if len(form) != len(form_pairs):
                raise Refused(twilio_error(400, 20001, "A parameter was given twice"))
            response = self._call(form)
        except Refused as refused:
            response = refused.response
        self._note("twilio", request, form, (username, password), response)
        return response

    def _note(
        self,
        api: str,
        request: Request,
        body: dict[str, Any],
        credentials: tuple[str | None, str | None],
        response: JSONResponse,
    ) -> None:
        answer: dict[str, Any] = json.loads(bytes(response.body))
        content_type = request.headers.get("content-type", "")
        seen = Received(
            api, request.url.path, body, *credentials, content_type, response.status_code, answer
        )
        with self.lock:
            self.received.append(seen)

    async def _telnyx_dial(self, request: Request) -> Response:
        raw = await request.body()
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        try:
            if scheme != "Bearer" or not key or key != self.telnyx_api_key:
                raise Refused(telnyx_error(401, "10009", "Authentication failed"))
            if not isinstance(body, dict):
                raise Refused(telnyx_error(422, "10015", "The body must be a JSON object."))
            response = telnyx_call(body, self.telnyx_connection_id)
        except Refused as refused:
            response = refused.response
        self._note("telnyx", request, body if isinstance(body, dict) else {}, (None, key), response)
        return response

    async def _vonage_create(self, request: Request) -> Response:
        raw = await request.body()
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        claims: dict[str, Any] = {}
        try:
            claims = self._vonage_claims(scheme, token)
            if not isinstance(body, dict):
                raise Refused(vonage_error(400, "Bad Request", [("body", "not an object")]))
            response = vonage_call(body)
        except Refused as refused:
            response = refused.response
        app = str(claims.get("application_id")) if claims else None
        self._note(
            "vonage", request, body if isinstance(body, dict) else {}, (app, token), response
        )
        return response

    def _vonage_claims(self, scheme: str, token: str) -> dict[str, Any]:
        if scheme != "Bearer" or not token or self.vonage_public_key is None:
            raise Refused(vonage_error(401, "Unauthorized"))
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                self.vonage_public_key,
                algorithms=["RS256"],
                options={"require": ["application_id", "iat", "exp", "jti"]},
            )
        except jwt.PyJWTError:
            raise Refused(vonage_error(401, "Unauthorized")) from None
        if claims["application_id"] != self.vonage_application_id:
            raise Refused(vonage_error(401, "Unauthorized"))
        return claims

    def _call(self, form: dict[str, str]) -> JSONResponse:
        unknown = sorted(set(form) - CREATE_CALL_FIELDS)
        if unknown:
            raise Refused(twilio_error(400, 20001, f"Unknown parameter '{unknown[0]}'"))
        to, from_ = form.get("To"), form.get("From")
        if not to:
            raise Refused(twilio_error(400, 21201, "No 'To' number is specified"))
        if not from_:
            raise Refused(twilio_error(400, 21213, "No 'From' number is specified"))
        if E164.fullmatch(to) is None:
            message = f"The 'To' number {to} is not a valid phone number."
            raise Refused(twilio_error(400, 21211, message))
        if not any(form.get(name) for name in ("Url", "Twiml", "ApplicationSid")):
            raise Refused(twilio_error(400, 21205, "Url parameter is required."))
        if "Twiml" in form:
            _check_twiml(form["Twiml"])
        if to in self.blocked:
            message = (
                f"Account not authorized to call {to}. Perhaps you need to enable some "
                "international permissions: https://www.twilio.com/console/voice/calls/"
                "geo-permissions/low-risk"
            )
            raise Refused(twilio_error(400, 21215, message))
        sid = "CA" + uuid.uuid4().hex
        uri = f"/2010-04-01/Accounts/{self.account_sid}/Calls/{sid}.json"
        call = {
            "sid": sid,
            "account_sid": self.account_sid,
            "to": to,
            "to_formatted": to,
            "from": from_,
            "from_formatted": from_,
            "status": "queued",
            "direction": "outbound-api",
            "api_version": "2010-04-01",
            "parent_call_sid": None,
            "start_time": None,
            "end_time": None,
            "duration": None,
            "price": None,
            "price_unit": "USD",
            "answered_by": None,
            "queue_time": "0",
            "uri": uri,
        }
        return JSONResponse(call, status_code=201)


def _check_twiml(twiml: str) -> None:
    if len(twiml) > TWIML_CHARS:
        raise Refused(twilio_error(400, 12100, "Document parse failure: Twiml is too long"))
    try:
        root = ET.fromstring(twiml)
    except ET.ParseError as exc:
        raise Refused(twilio_error(400, 12100, f"Document parse failure: {exc}")) from None
    if root.tag != "Response":
        raise Refused(twilio_error(400, 12100, "Document parse failure: no <Response>"))


def _basic(header: str) -> tuple[str | None, str | None]:
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        return None, None
    try:
        user, _, password = base64.b64decode(encoded, validate=True).decode().partition(":")
    except (ValueError, UnicodeDecodeError):
        return None, None
    return user, password

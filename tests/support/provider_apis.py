"""Fakes of the Telnyx and Vonage REST endpoints that steer a live call: a real HTTP server on a
free loopback port (Starlette under uvicorn), started as an async context manager:

    async with ProviderApis(telnyx_api_key=KEY, vonage_application_id=APP,
                            vonage_public_key=public_key) as apis:
        apis.add_call("v3:abc")      # a live call either API may be asked about
        ... CallControlSettings(telnyx_api_url=apis.telnyx_url, vonage_api_url=apis.vonage_url)

Telnyx Call Control (https://developers.telnyx.com/api-reference/call-commands/transfer-call,
.../send-dtmf): `POST /v2/calls/{call_control_id}/actions/transfer|send_dtmf`, `Authorization:
Bearer <API key>`, JSON; 200 `{"data": {"result": "ok"}}`. Errors as `{"errors": [{"code",
"title", "detail", "source"?}]}`: 401 code 10009, 422 code 10004 (a missing field) or 10015,
415 code 10014, 404 code 10005, 500 code 10007; a call that is not live answers 422 code 90018
"Call has already ended". A repeated `command_id` on a call is answered 200 and not acted on.

Vonage Voice API (https://developer.vonage.com/en/api/voice): `PUT /v1/calls/{uuid}` (transfer
to an inline NCCO) answers 204, `PUT /v1/calls/{uuid}/dtmf` answers 200 `{"message": "DTMF
sent", "uuid"}`. `Authorization: Bearer <JWT>`, verified (RS256) with the application's public
key, with `application_id` (this application's), `iat`, `exp` and `jti` required. Errors in RFC
7807 form `{"type", "title", "detail", "instance"}` (https://developer.vonage.com/en/api-errors):
401 unauthorized, 400 with `invalid_parameters` for a bad body, 404 for a call that is not live.

Both are stricter than the real APIs in one way: a body field the documents do not list is
refused (the real ones may ignore it), so a misspelt field fails a test instead of silently
doing nothing. `fail_next` makes the next requests of one API fail with a given status (after
the credentials are checked); `stall_next` leaves them unanswered until the fake stops (for
timeouts). Every request is in `received`; the ones acted on are in `accepted`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import json
import re
import socket
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import jwt
import uvicorn
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPublicKey
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

TELNYX_TRANSFER_FIELDS = {  # the transfer command's documented body
    "to", "from", "from_display_name", "audio_url", "media_name", "client_state",
    "target_leg_client_state", "command_id", "custom_headers", "sip_headers",
    "sip_auth_username", "sip_auth_password", "sip_transport_protocol", "early_media",
    "timeout_secs", "time_limit_secs", "answering_machine_detection",
    "answering_machine_detection_config", "media_encryption", "mute_dtmf",
    "park_after_unbridge", "record", "record_channels", "record_format", "record_max_length",
    "record_timeout_secs", "record_track", "record_trim", "record_custom_file_name",
    "sound_modifications", "webhook_url", "webhook_url_method",
}  # fmt: skip
TELNYX_DTMF_FIELDS = {"digits", "duration_millis", "client_state", "command_id"}
TELNYX_TITLES = {
    401: ("10009", "Authentication failed", "The required authentication headers were either"
          " invalid or not included in the request."),
    404: ("10005", "Resource not found", "The requested resource or URL could not be found."),
    415: ("10014", "Unsupported Media Type",
          "The request failed because the server does not support the media type."),
    422: ("10015", "Bad Request", "The request failed because it was not well-formed."),
    429: ("10011", "Too many requests",
          "You have exceeded the maximum number of allowed requests."),
    500: ("10007", "Unexpected error", "An unexpected error occured."),
}  # fmt: skip
VONAGE_ERRORS = {
    400: ("bad-request", "Bad Request", "The request body did not validate."),
    401: ("unauthorized", "Unauthorized", "You did not provide correct credentials."),
    403: ("forbidden", "Forbidden", "Your account does not have permission to perform this"
          " action"),
    404: ("not-found", "Not Found", "The requested resource does not exist, or you do not have"
          " access to it"),
    429: ("rate-limit", "Too Many Requests", "The request was rate limited"),
    500: ("internal-error", "Internal Server Error", "Something went wrong."),
}  # fmt: skip
E164 = re.compile(r"\+[1-9]\d{1,14}")
VONAGE_NUMBER = re.compile(r"[1-9]\d{6,14}")
SIP_URI = re.compile(r"sips?:\S+")
TELNYX_DIGITS = re.compile(r"[0-9A-Da-d*#wW]+")
VONAGE_DIGITS = re.compile(r"[0-9#*p]+")


@dataclass(frozen=True)
class Received:
    """One request as the fake saw it (header names lower-case; `body` as parsed JSON, or the
    text when it is not JSON); `claims` are a Vonage JWT's once verified."""

    api: str  # "telnyx" or "vonage"
    method: str
    path: str
    headers: Mapping[str, str]
    body: Any
    status: int = 0  # what the fake answered
    claims: Mapping[str, Any] | None = None
    acted: bool = False  # False for a refusal, and for a repeated Telnyx command_id


class _Refused(Exception):
    def __init__(self, response: Response) -> None:
        self.response = response


@dataclass
class ProviderApis:
    telnyx_api_key: str
    vonage_application_id: str
    vonage_public_key: RSAPublicKey
    calls: set[str] = field(default_factory=set)  # live calls, either provider
    received: list[Received] = field(default_factory=list)
    _failures: dict[str, list[int]] = field(default_factory=dict)
    _stalls: dict[str, int] = field(default_factory=dict)
    _release: asyncio.Event = field(default_factory=asyncio.Event)
    _commands: set[tuple[str, str]] = field(default_factory=set)  # (call, Telnyx command_id)
    _port: int = 0
    _server: uvicorn.Server | None = None
    _socket: socket.socket | None = None

    # -- what a test uses ---------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    @property
    def telnyx_url(self) -> str:
        return f"{self.url}/v2"

    @property
    def vonage_url(self) -> str:
        return self.url

    @property
    def accepted(self) -> list[Received]:
        """The requests acted on, oldest first (a repeated Telnyx command is answered 200 but
        not acted on, as Telnyx documents for `command_id`)."""
        return [r for r in self.received if r.acted]

    def add_call(self, call_id: str | None = None) -> str:
        call_id = call_id or str(uuid.uuid4())
        self.calls.add(call_id)
        return call_id

    def hang_up(self, call_id: str) -> None:
        self.calls.discard(call_id)

    def fail_next(self, api: str, status: int, times: int = 1) -> None:
        """Answer `api`'s next `times` requests with `status`, in that API's error shape."""
        self._failures.setdefault(api, []).extend([status] * times)

    def stall_next(self, api: str, times: int = 1) -> None:
        """Leave `api`'s next `times` requests unanswered until the fake stops (then 503)."""
        self._stalls[api] = self._stalls.get(api, 0) + times

    # -- serving ----------------------------------------------------------------------

    async def __aenter__(self) -> ProviderApis:
        app = Starlette(
            routes=[
                Route("/v2/calls/{call_id}/actions/{action}", self._telnyx, methods=["POST"]),
                Route("/v1/calls/{call_id}", self._vonage_transfer, methods=["PUT"]),
                Route("/v1/calls/{call_id}/dtmf", self._vonage_dtmf, methods=["PUT"]),
            ]
        )
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self._port = sock.getsockname()[1]
        config = uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False)
        config.load()
        server = uvicorn.Server(config)
        server.lifespan = config.lifespan_class(config)  # what Server.serve would set
        await server.startup(sockets=[sock])  # listening once this returns: no polling
        self._server, self._socket = server, sock
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()

    async def stop(self) -> None:
        """Answer the stalled requests (503), wait for every request in hand to be answered and
        recorded, and stop listening. Again: nothing."""
        self._release.set()
        server, sock = self._server, self._socket
        self._server = self._socket = None
        if server is not None:
            await server.shutdown(sockets=[sock] if sock else None)
        if sock is not None:
            sock.close()

    # -- Telnyx -----------------------------------------------------------------------

    async def _telnyx(self, request: Request) -> Response:
        call_id, action = request.path_params["call_id"], request.path_params["action"]
        return await self._serve("telnyx", request, lambda r: self._telnyx_act(r, call_id, action))

    def _telnyx_act(self, seen: Received, call_id: str, action: str) -> tuple[Response, bool]:
        body = seen.body
        if not isinstance(body, dict):
            raise _Refused(_telnyx_error(422, detail="The body must be a JSON object."))
        if action == "transfer":
            _telnyx_fields(body, TELNYX_TRANSFER_FIELDS, required=("to",))
            _telnyx_transfer_body(body)
        elif action == "send_dtmf":
            _telnyx_fields(body, TELNYX_DTMF_FIELDS, required=("digits",))
            _telnyx_dtmf_body(body)
        else:
            raise _Refused(_telnyx_error(404))
        if call_id not in self.calls:
            raise _Refused(
                _telnyx_error(
                    422,
                    code="90018",
                    title="Call has already ended",
                    detail="This call is no longer active and can't receive commands.",
                )
            )
        command_id, repeat = body.get("command_id"), False
        if isinstance(command_id, str):  # Telnyx ignores a repeated command_id on a call
            repeat = (call_id, command_id) in self._commands
            self._commands.add((call_id, command_id))
        return JSONResponse({"data": {"result": "ok"}}), not repeat

    # -- Vonage -----------------------------------------------------------------------

    async def _vonage_transfer(self, request: Request) -> Response:
        call_id = request.path_params["call_id"]

        def act(seen: Received) -> tuple[Response, bool]:
            _vonage_transfer_body(seen.body)
            self._vonage_live(call_id)
            return Response(status_code=204), True

        return await self._serve("vonage", request, act)

    async def _vonage_dtmf(self, request: Request) -> Response:
        call_id = request.path_params["call_id"]

        def act(seen: Received) -> tuple[Response, bool]:
            body = seen.body
            if not isinstance(body, dict):
                raise _Refused(_vonage_error(400, [("body", "must be a JSON object")]))
            _vonage_fields(body, {"digits"}, "")
            digits = body.get("digits")
            if not isinstance(digits, str) or VONAGE_DIGITS.fullmatch(digits) is None:
                raise _Refused(_vonage_error(400, [("digits", "must be 0-9, *, # and p")]))
            self._vonage_live(call_id)
            return JSONResponse({"message": "DTMF sent", "uuid": call_id}), True

        return await self._serve("vonage", request, act)

    def _vonage_live(self, call_id: str) -> None:
        if call_id not in self.calls:
            raise _Refused(_vonage_error(404, detail=f"Call {call_id} was not found"))

    def _vonage_claims(self, headers: Mapping[str, str]) -> dict[str, Any]:
        """The JWT's claims, once its signature, `exp` and this application's id check out."""
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme != "Bearer" or not token:
            raise _Refused(_vonage_error(401))
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                self.vonage_public_key,
                algorithms=["RS256"],
                options={"require": ["application_id", "iat", "exp", "jti"]},
            )
        except jwt.PyJWTError:
            raise _Refused(_vonage_error(401)) from None
        if claims["application_id"] != self.vonage_application_id:
            raise _Refused(_vonage_error(401))
        if not isinstance(claims["jti"], str) or not claims["jti"]:
            raise _Refused(_vonage_error(401))
        return claims

    # -- shared -----------------------------------------------------------------------

    async def _serve(
        self, api: str, request: Request, act: Callable[[Received], tuple[Response, bool]]
    ) -> Response:
        raw = await request.body()
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        seen = Received(api, request.method, request.url.path, dict(request.headers), body)
        if self._stalls.get(api):
            self._stalls[api] -= 1
            await self._release.wait()
            self.received.append(dataclasses.replace(seen, status=503))
            return Response(status_code=503)
        claims, acted = None, False
        try:
            if api == "telnyx":
                if seen.headers.get("authorization") != f"Bearer {self.telnyx_api_key}":
                    raise _Refused(_telnyx_error(401))
            else:
                claims = self._vonage_claims(seen.headers)
            self._fail_if_told(api)
            if not seen.headers.get("content-type", "").startswith("application/json"):
                wrong_type = _telnyx_error(415) if api == "telnyx" else None
                raise _Refused(wrong_type or _vonage_error(400, detail="Invalid Content-Type."))
            response, acted = act(seen)
        except _Refused as refused:
            response = refused.response
        self.received.append(
            dataclasses.replace(seen, status=response.status_code, claims=claims, acted=acted)
        )
        return response

    def _fail_if_told(self, api: str) -> None:
        pending = self._failures.get(api)
        if pending:
            status = pending.pop(0)
            raise _Refused(_telnyx_error(status) if api == "telnyx" else _vonage_error(status))


# -- body checks, as the documents describe the bodies -------------------------------------


def _telnyx_error(
    status: int,
    *,
    code: str | None = None,
    title: str | None = None,
    detail: str | None = None,
    pointer: str | None = None,
) -> JSONResponse:
    known_code, known_title, known_detail = TELNYX_TITLES.get(status, ("10007", "Error", ""))
    error: dict[str, Any] = {
        "code": code or known_code,
        "title": title or known_title,
        "detail": detail or known_detail,
    }
    if pointer is not None:
        error["source"] = {"pointer": pointer}
    return JSONResponse({"errors": [error]}, status_code=status)


def _telnyx_fields(body: dict[str, Any], allowed: set[str], required: tuple[str, ...]) -> None:
    for name in required:
        if name not in body:
            raise _Refused(
                _telnyx_error(
                    422,
                    code="10004",
                    title="Missing required parameter",
                    detail=f"The '{name}' parameter is required.",
                    pointer=f"/{name}",
                )
            )
    for name in body:
        if name not in allowed:
            raise _Refused(
                _telnyx_error(422, detail=f"Unknown parameter '{name}'.", pointer=f"/{name}")
            )


def _telnyx_invalid(name: str, why: str) -> _Refused:
    return _Refused(_telnyx_error(422, detail=f"'{name}' {why}.", pointer=f"/{name}"))


def _telnyx_transfer_body(body: dict[str, Any]) -> None:
    to = body["to"]
    if not isinstance(to, str) or not (E164.fullmatch(to) or SIP_URI.fullmatch(to)):
        raise _telnyx_invalid("to", "must be a +E.164 number or a SIP URI")
    for name in ("command_id", "client_state", "target_leg_client_state"):
        if name in body and not isinstance(body[name], str):
            raise _telnyx_invalid(name, "must be a string")
    for name in ("client_state", "target_leg_client_state"):
        if name in body:
            try:
                base64.b64decode(body[name], validate=True)
            except (binascii.Error, ValueError):
                raise _telnyx_invalid(name, "must be a valid Base-64 encoded string") from None
    headers = body.get("custom_headers", [])
    if not isinstance(headers, list):
        raise _telnyx_invalid("custom_headers", "must be an array")
    for header in headers:
        if (
            not isinstance(header, dict)
            or set(header) != {"name", "value"}
            or not all(isinstance(v, str) and v for v in header.values())
        ):
            raise _telnyx_invalid("custom_headers", "items must be {name, value} strings")


def _telnyx_dtmf_body(body: dict[str, Any]) -> None:
    digits = body["digits"]
    if not isinstance(digits, str) or TELNYX_DIGITS.fullmatch(digits) is None:
        raise _telnyx_invalid("digits", "must be 0-9, A-D, *, # and w/W pauses")
    millis = body.get("duration_millis", 250)
    if not isinstance(millis, int) or not 100 <= millis <= 500:
        raise _telnyx_invalid("duration_millis", "must be 100 to 500")
    if "command_id" in body and not isinstance(body["command_id"], str):
        raise _telnyx_invalid("command_id", "must be a string")


def _vonage_error(
    status: int,
    invalid: list[tuple[str, str]] | None = None,
    *,
    detail: str | None = None,
) -> JSONResponse:
    kind, title, known_detail = VONAGE_ERRORS.get(status, ("error", "Error", ""))
    problem: dict[str, Any] = {
        "type": f"https://developer.nexmo.com/api-errors#{kind}",
        "title": title,
        "detail": detail or known_detail,
        "instance": str(uuid.uuid4()),
    }
    if invalid:
        problem["invalid_parameters"] = [{"name": n, "reason": r} for n, r in invalid]
    return JSONResponse(problem, status_code=status, media_type="application/problem+json")


def _vonage_fields(body: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = [name for name in body if name not in allowed]
    if unknown:
        raise _Refused(
            _vonage_error(400, [(f"{where}{n}", "is not a known field") for n in unknown])
        )


def _vonage_transfer_body(body: Any) -> None:
    def bad(name: str, why: str) -> _Refused:
        return _Refused(_vonage_error(400, [(name, why)]))

    if not isinstance(body, dict):
        raise bad("body", "must be a JSON object")
    _vonage_fields(body, {"action", "destination"}, "")
    if body.get("action") != "transfer":
        raise bad("action", "must be transfer")  # hangup, mute...: not used here
    destination = body.get("destination")
    if not isinstance(destination, dict):
        raise bad("destination", "is required")
    _vonage_fields(destination, {"type", "ncco", "url"}, "destination.")
    if destination.get("type") != "ncco":
        raise bad("destination.type", "must be ncco")
    ncco = destination.get("ncco")
    if not isinstance(ncco, list) or not ncco:
        raise bad("destination.ncco", "must be a non-empty array")
    for index, action in enumerate(ncco):
        where = f"destination.ncco[{index}]"
        if not isinstance(action, dict) or not isinstance(action.get("action"), str):
            raise bad(where, "must be an object with an action")
        if action["action"] == "connect":
            _vonage_connect(action, where)


def _vonage_connect(action: dict[str, Any], where: str) -> None:
    """The NCCO `connect` action (https://developer.vonage.com/en/voice/voice-api/ncco-reference
    #connect), with one phone or SIP endpoint."""

    def bad(name: str, why: str) -> _Refused:
        return _Refused(_vonage_error(400, [(f"{where}.{name}", why)]))

    known = {"action", "endpoint", "from", "randomFromNumber", "eventType", "timeout", "limit",
             "machineDetection", "advanced_machine_detection", "eventUrl", "eventMethod",
             "ringbackTone"}  # fmt: skip
    _vonage_fields(action, known, f"{where}.")
    endpoints = action.get("endpoint")
    if not isinstance(endpoints, list) or len(endpoints) != 1:
        raise bad("endpoint", "must be an array of one endpoint")
    endpoint = endpoints[0]
    if not isinstance(endpoint, dict):
        raise bad("endpoint[0]", "must be an object")
    kind = endpoint.get("type")
    if kind == "phone":
        _vonage_fields(endpoint, {"type", "number", "dtmfAnswer", "onAnswer"}, f"{where}.")
        number = endpoint.get("number")
        if not isinstance(number, str) or VONAGE_NUMBER.fullmatch(number) is None:
            raise bad("endpoint[0].number", "must be 7 to 15 digits, E.164 without +")
    elif kind == "sip":
        _vonage_fields(endpoint, {"type", "uri", "headers", "standard_headers"}, f"{where}.")
        uri = endpoint.get("uri")
        if not isinstance(uri, str) or SIP_URI.fullmatch(uri) is None or len(uri) > 50:
            raise bad("endpoint[0].uri", "must be a SIP URI of at most 50 characters")
        headers = endpoint.get("headers", {})
        if not isinstance(headers, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
        ):
            raise bad("endpoint[0].headers", "must be an object of strings")
    else:
        raise bad("endpoint[0].type", "must be phone or sip here")


def sip_invite_headers(endpoint: Mapping[str, Any]) -> dict[str, str]:
    """The X- headers Vonage puts on the INVITE for a SIP endpoint's `headers`."""
    return {f"X-{k}": v for k, v in dict(endpoint.get("headers", {})).items()}

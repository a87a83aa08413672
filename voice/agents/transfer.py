"""Putting a call through to a person, and pressing keys on its line, through the provider's REST
API: Telnyx Call Control and the Vonage Voice API (Twilio's calls are steered by TwiML,
elsewhere). Hotline's call id is the provider's: Telnyx's `call_control_id`, Vonage's call
`uuid`.

Telnyx (bearer API key, JSON bodies, `{"data": {"result": "ok"}}` on success, errors as
`{"errors": [{"code", "title", "detail"}]}`):

- transfer: `POST {telnyx_api_url}/calls/{call_control_id}/actions/transfer` with `to` (the
  +E.164 number or SIP URI, as given). A warm transfer's reason and summary go in
  `target_leg_client_state` (base64 of `{"reason", "summary"}` JSON; it rides on every webhook
  of the new leg, for whoever handles those), and, for a SIP target, in `custom_headers`
  `X-Hotline-Reason` / `X-Hotline-Summary` on the INVITE. The call's own `client_state` is left
  alone: Hotline's media stream reads it. `from` is left out (Telnyx then presents the number
  the caller dialled).
  https://developers.telnyx.com/api-reference/call-commands/transfer-call
- keys: `POST .../calls/{call_control_id}/actions/send_dtmf` with `digits`; Telnyx takes `w`
  (0.5 s) and `W` (1 s) pauses itself, so digits go as they are. `duration_millis` is left to
  Telnyx's default. (The endpoint list:
  https://developers.telnyx.com/docs/voice/programmable-voice/voice-api-commands-and-resources;
  the fields as Telnyx's OpenAPI gives them, in its generated SDK: team-telnyx/telnyx-python,
  src/telnyx/types/calls/action_send_dtmf_params.py.)
- every command carries a fresh `command_id`; Telnyx ignores a repeated one for the same call.
- auth and errors: https://developers.telnyx.com/development/api-fundamentals/authentication,
  https://developers.telnyx.com/development/api-fundamentals/api-errors (an ended call answers
  422, code 90018 "Call has already ended": https://developers.telnyx.com/api/errors/90018).

Vonage (Voice API reference https://developer.vonage.com/en/api/voice, from its OpenAPI
document; bearer JWT, RS256, signed with the application's private key, with the claims
`application_id`, `iat`, `exp`, `jti`, as Vonage's own JWT library makes them,
https://developer.vonage.com/en/getting-started/concepts/authentication; errors in RFC 7807
form with `title` and `detail`, https://developer.vonage.com/en/api-errors):

- transfer (`updateCall`): `PUT {vonage_api_url}/v1/calls/{uuid}` with
  `{"action": "transfer", "destination": {"type": "ncco", "ncco": [connect]}}`, the connect's
  one endpoint `{"type": "phone", "number": "15551230001"}` (E.164 without the "+") or
  `{"type": "sip", "uri": ..., "headers": {...}}`; Vonage sends each SIP `headers` key as
  `X-<key>`, so the reason and summary go as `Hotline-Reason` / `Hotline-Summary`. Answers 204.
  The connect's `from` is left out (no Vonage number is known here).
  https://developer.vonage.com/en/voice/voice-api/code-snippets/controlling-conversations/transfer-a-call-inline-ncco,
  https://developer.vonage.com/en/voice/voice-api/ncco-reference (connect)
- keys (`startDTMF`): `PUT .../v1/calls/{uuid}/dtmf` with `{"digits": ...}`; Vonage takes 0-9,
  *, # and `p`, a half-second pause (https://developer.vonage.com/en/voice/voice-api/guides/dtmf;
  Vonage's Python SDK checks `^[0-9#*p]+$`), so `w` becomes `p` and `W` becomes `pp`.

Retries: a command is sent again once, at most, only when sending it twice cannot act twice.
Telnyx: after a 5xx, a timeout or a transport error, with the same `command_id` (Telnyx drops
the repeat if the first one got through). Vonage has no such key, and a repeated transfer or
key press would dial or press again, so only when the request never left: the connection could
not be made. A 4xx is never retried. The caller is waiting, so there is one retry, at once.

The API key and the JWT are never logged nor put in an error's message; nor are the keys
pressed (they may be a PIN), only how many.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote, urlsplit

import httpx
import jwt
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPrivateKey
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from pydantic import BaseModel, SecretStr

from pipeline.tools import Transfer

log = logging.getLogger(__name__)

PROVIDERS = ("telnyx", "vonage")
E164 = re.compile(r"\+[1-9][0-9]{6,14}")  # whole string
SIP_URI = re.compile(r"sips?:[^\s]+", re.IGNORECASE)  # whole string
DIGITS = re.compile(r"[0-9*#wW]{1,64}")  # whole string; w: half a second, W: a second
REASON_HEADER = "Hotline-Reason"  # X- prefixed on the wire
SUMMARY_HEADER = "Hotline-Summary"
HEADER_VALUE_BYTES = 480  # of a SIP header's value (many SIP stacks cap a header at 1 KiB)
JWT_LIFETIME_S = 300
_ERROR_TEXT_CHARS = 300  # of an error body that is not the provider's JSON


class CallControlSettings(BaseModel):
    """The providers' REST credentials (the server nests this as `call_control`). A provider
    without its credentials is not supported: its transfers and key presses are refused."""

    telnyx_api_key: SecretStr | None = None
    telnyx_api_url: str = "https://api.telnyx.com/v2"
    telnyx_connection_id: str | None = None  # the Call Control app placing outbound calls
    vonage_application_id: str | None = None
    vonage_private_key: SecretStr | None = None  # PEM text
    vonage_private_key_file: str | None = None  # or a path to the PEM file
    vonage_api_url: str = "https://api.nexmo.com"
    # Twilio's REST API, to place outbound calls (voice/outbound/): the account SID and its auth
    # token (HTTP Basic); unset token: HOTLINE_TELEPHONY__TWILIO_AUTH_TOKEN.
    twilio_account_sid: str | None = None
    twilio_auth_token: SecretStr | None = None
    twilio_api_url: str = "https://api.twilio.com"
    timeout_s: float = 5.0  # per request


class CallControlError(Exception):
    """A transfer or key press the provider did not take. The message says what failed (the
    status and the provider's own title and detail); it never holds a credential."""

    def __init__(
        self,
        message: str,
        *,
        provider: str,
        status: int | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.provider = provider
        self.status = status  # the HTTP status; None: no answer (timeout, unreachable)
        self.code = code  # the provider's error code, when it gives one (Telnyx's "90018")


@dataclass(frozen=True)
class _Command:
    provider: str
    what: str  # "transfer of call X to Y", for messages
    method: str
    url: str
    body: dict[str, Any]
    idempotent: bool  # sending it twice acts once


class CallMover(Protocol):
    """Who puts a call of a transport through to a person: Telnyx's and Vonage's REST APIs
    (`CallControl`), SIP's REFER (`voice.server.routes.sip`)."""

    def supports(self, transport: str) -> bool: ...

    async def transfer(self, transport: str, call_id: str, transfer: Transfer) -> str | None:
        """Once the transfer is under way (its outcome, if known); CallControlError if not."""
        ...


class CallControl:
    """Transfers and key presses for Telnyx and Vonage calls, over a shared `httpx` client."""

    def __init__(self, settings: CallControlSettings, client: httpx.AsyncClient) -> None:
        self.settings = settings
        self._client = client
        self._vonage_key: RSAPrivateKey | None = None  # read on first use

    def supports(self, provider: str) -> bool:
        """Whether `provider`'s calls can be transferred (its credentials are configured)."""
        s = self.settings
        if provider == "telnyx":
            return s.telnyx_api_key is not None and bool(s.telnyx_api_key.get_secret_value())
        if provider == "vonage":
            key_given = bool(s.vonage_private_key and s.vonage_private_key.get_secret_value())
            return bool(s.vonage_application_id) and (key_given or bool(s.vonage_private_key_file))
        return False

    async def transfer(self, provider: str, call_id: str, transfer: Transfer) -> None:
        """Ask the provider to put call `call_id` through to `transfer.target` (+E.164 or a
        sip:/sips: URI). Returns once the provider has accepted the command (the new leg then
        rings); raises `CallControlError` if it did not."""
        self._check(provider, call_id)
        target = transfer.target.strip()
        what = f"{provider} transfer of call {call_id} to {target}"
        is_sip = SIP_URI.fullmatch(target) is not None
        if is_sip:
            scheme, rest = target.split(":", 1)
            target = f"{scheme.lower()}:{rest}"
        if not is_sip and E164.fullmatch(target) is None:
            raise CallControlError(
                f"{what}: the target is neither a +E.164 number nor a sip:/sips: URI",
                provider=provider,
            )
        if provider == "telnyx":
            command = _Command(
                provider,
                what,
                "POST",
                self._telnyx_url(call_id, "transfer"),
                _telnyx_transfer(target, is_sip, transfer),
                idempotent=True,
            )
        else:
            command = _Command(
                provider,
                what,
                "PUT",
                f"{self._vonage_base()}/v1/calls/{_path(call_id)}",
                _vonage_transfer(target, is_sip, transfer),
                idempotent=False,
            )
        await self._send(command)
        log.info("%s: accepted", what)

    async def send_digits(self, provider: str, call_id: str, digits: str) -> None:
        """Press `digits` (0-9, *, #; w waits half a second, W a second) on call `call_id`'s
        line; raises `CallControlError` if the provider did not take them."""
        self._check(provider, call_id)
        what = f"{provider} key presses ({len(digits)} keys) on call {call_id}"
        if DIGITS.fullmatch(digits) is None:
            raise CallControlError(f"{what}: use 1 to 64 of 0-9, *, #, w and W", provider=provider)
        if provider == "telnyx":
            body: dict[str, Any] = {"digits": digits, "command_id": str(uuid.uuid4())}
            command = _Command(
                provider, what, "POST", self._telnyx_url(call_id, "send_dtmf"), body, True
            )
        else:
            vonage_digits = digits.replace("W", "pp").replace("w", "p")
            url = f"{self._vonage_base()}/v1/calls/{_path(call_id)}/dtmf"
            command = _Command(provider, what, "PUT", url, {"digits": vonage_digits}, False)
        await self._send(command)
        log.info("%s: sent", what)

    # -- sending ---------------------------------------------------------------------------

    def _check(self, provider: str, call_id: str) -> None:
        if provider not in PROVIDERS:
            raise CallControlError(
                f"{provider} calls cannot be transferred here (only {', '.join(PROVIDERS)})",
                provider=provider,
            )
        if not self.supports(provider):
            raise CallControlError(
                f"{provider} call control is not configured (no credentials)", provider=provider
            )
        if not call_id:
            raise CallControlError(f"{provider}: the call has no id", provider=provider)

    def _telnyx_url(self, call_id: str, action: str) -> str:
        base = self.settings.telnyx_api_url.rstrip("/")
        return f"{base}/calls/{_path(call_id)}/actions/{action}"

    def _vonage_base(self) -> str:
        return self.settings.vonage_api_url.rstrip("/")

    async def _send(self, command: _Command) -> None:
        for attempt in (1, 2):
            token = self._token(command.provider)
            headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
            retry = False
            try:
                response = await self._client.request(
                    command.method,
                    command.url,
                    json=command.body,
                    headers=headers,
                    timeout=self.settings.timeout_s,
                )
            except httpx.TimeoutException as exc:
                never_sent = isinstance(exc, httpx.ConnectTimeout | httpx.PoolTimeout)
                retry = command.idempotent or never_sent
                error = CallControlError(
                    f"{command.what}: no answer within {self.settings.timeout_s:g} s"
                    f" ({type(exc).__name__})",
                    provider=command.provider,
                )
            except httpx.TransportError as exc:
                retry = command.idempotent or isinstance(exc, httpx.ConnectError)
                host = urlsplit(command.url).netloc
                error = CallControlError(
                    _redact(
                        f"{command.what}: cannot reach {host} ({type(exc).__name__}: {exc})",
                        token,
                    ),
                    provider=command.provider,
                )
            else:
                if response.is_success:
                    return
                error = _status_error(command, response, token)
                retry = command.idempotent and response.status_code >= 500
            if not retry or attempt == 2:
                log.warning("%s", error)
                raise error
            log.warning("%s; trying once more", error)

    def bearer(self, provider: str) -> str:
        """The bearer credential of `provider`'s REST API (Telnyx's key, a fresh Vonage JWT),
        for other requests than these (voice/outbound/ places calls with it)."""
        return self._token(provider)

    def _token(self, provider: str) -> str:
        if provider == "telnyx":
            assert self.settings.telnyx_api_key is not None  # checked by supports()
            return self.settings.telnyx_api_key.get_secret_value()
        now = int(time.time())
        claims = {
            "application_id": self.settings.vonage_application_id,
            "iat": now,
            "exp": now + JWT_LIFETIME_S,
            "jti": str(uuid.uuid4()),
        }
        return jwt.encode(claims, self._vonage_private_key(), algorithm="RS256")

    def _vonage_private_key(self) -> RSAPrivateKey:
        if self._vonage_key is not None:
            return self._vonage_key
        s = self.settings
        try:
            if s.vonage_private_key and s.vonage_private_key.get_secret_value():
                pem = s.vonage_private_key.get_secret_value().encode()
                where = "vonage_private_key"
            else:
                assert s.vonage_private_key_file is not None  # checked by supports()
                pem = Path(s.vonage_private_key_file).expanduser().read_bytes()
                where = f"the file {s.vonage_private_key_file}"
        except OSError as exc:
            raise CallControlError(
                f"vonage: cannot read the private key file ({exc.strerror})", provider="vonage"
            ) from None
        try:
            key = load_pem_private_key(pem, password=None)
        except (ValueError, TypeError):
            raise CallControlError(
                f"vonage: {where} is not an unencrypted PEM private key", provider="vonage"
            ) from None
        if not isinstance(key, RSAPrivateKey):
            raise CallControlError(f"vonage: {where} is not an RSA key", provider="vonage")
        self._vonage_key = key
        return key


# -- the providers' bodies ---------------------------------------------------------------------


def _telnyx_transfer(target: str, is_sip: bool, transfer: Transfer) -> dict[str, Any]:
    body: dict[str, Any] = {"to": target, "command_id": str(uuid.uuid4())}
    warm = {k: v for k, v in (("reason", transfer.reason), ("summary", transfer.summary)) if v}
    if warm:
        state = json.dumps(warm, separators=(",", ":"), ensure_ascii=False)
        body["target_leg_client_state"] = base64.b64encode(state.encode()).decode("ascii")
    headers = _sip_headers(transfer) if is_sip else {}
    if headers:
        body["custom_headers"] = [{"name": f"X-{k}", "value": v} for k, v in headers.items()]
    return body


def _vonage_transfer(target: str, is_sip: bool, transfer: Transfer) -> dict[str, Any]:
    endpoint: dict[str, Any]
    if is_sip:
        endpoint = {"type": "sip", "uri": target}
        headers = _sip_headers(transfer)
        if headers:
            endpoint["headers"] = headers
    else:
        endpoint = {"type": "phone", "number": target.removeprefix("+")}
    connect = {"action": "connect", "endpoint": [endpoint]}
    return {"action": "transfer", "destination": {"type": "ncco", "ncco": [connect]}}


def _sip_headers(transfer: Transfer) -> dict[str, str]:
    """The warm transfer's reason and summary as SIP header values (without the X- prefix):
    one line each, control characters gone, at most `HEADER_VALUE_BYTES` of UTF-8."""
    values = {REASON_HEADER: _header_value(transfer.reason)}
    values[SUMMARY_HEADER] = _header_value(transfer.summary)
    return {name: value for name, value in values.items() if value}


def _header_value(text: str) -> str:
    lines = ["".join(c if c.isprintable() else " " for c in line) for line in text.splitlines()]
    value = " | ".join(" ".join(line.split()) for line in lines if line.strip())
    if len(value.encode()) <= HEADER_VALUE_BYTES:
        return value
    cut = value.encode()[: HEADER_VALUE_BYTES - len("…".encode())]
    return cut.decode(errors="ignore").rstrip() + "…"


def _path(call_id: str) -> str:
    return quote(call_id, safe=":")  # a Telnyx id holds ":"; nothing may leave the path


# -- errors ------------------------------------------------------------------------------------


def _status_error(command: _Command, response: httpx.Response, token: str) -> CallControlError:
    """The provider's refusal: its status, then its errors' titles and details."""
    status = response.status_code
    code: str | None = None
    parts: list[str] = []
    try:
        data = response.json()
    except ValueError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("errors"), list):  # Telnyx
        for item in data["errors"]:
            if isinstance(item, dict):
                parts.append(_title_detail(item))
                if code is None and item.get("code") is not None:
                    code = str(item["code"])
    elif isinstance(data, dict) and ("title" in data or "detail" in data):  # Vonage, RFC 7807
        parts.append(_title_detail(data))
        if isinstance(data.get("invalid_parameters"), list):
            parts.extend(
                f"{p.get('name')}: {p.get('reason')}"
                for p in data["invalid_parameters"]
                if isinstance(p, dict)
            )
    else:
        text = " ".join(response.text.split())[:_ERROR_TEXT_CHARS]
        if text:
            parts.append(text)
    said = "; ".join(part for part in parts if part) or response.reason_phrase
    if code is not None:
        said += f" (code {code})"
    message = _redact(f"{command.what}: refused, HTTP {status}: {said}", token)
    return CallControlError(message, provider=command.provider, status=status, code=code)


def _title_detail(item: dict[str, Any]) -> str:
    title, detail = str(item.get("title") or ""), str(item.get("detail") or "")
    return f"{title}: {detail}" if title and detail and detail != title else title or detail


def _redact(text: str, secret: str) -> str:
    """Belt and braces: nothing a provider echoes back carries our credential."""
    return text.replace(secret, "[redacted]") if secret else text

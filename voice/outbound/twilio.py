"""Placing a call through Twilio's REST API (https://www.twilio.com/docs/voice/api/call-resource,
"Create a Call resource"):

`POST {twilio_api_url}/2010-04-01/Accounts/{AccountSid}/Calls.json`, HTTP Basic auth with the
account SID and its auth token, a form-encoded body: `To`, `From`, `Twiml` (the instructions
run once the call is answered, inline: at most 4 000 characters) and, when set,
`StatusCallback`. Twilio answers 201 with the call resource as JSON (`sid` "CA…", `status`
"queued", …); errors are JSON `{"code", "message", "more_info", "status"}` (20003 for bad
credentials, 21211 for an invalid `To`, …).

A create is never retried: a second request would ring the number twice. The auth token is
never logged nor put in an error's message.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import quote

import httpx
from pydantic import SecretStr

from voice.agents.transfer import CallControlSettings
from voice.outbound.placed import DialError, PlacedCall, Provider, placed, post_create, redact

log = logging.getLogger(__name__)

TWILIO = Provider("twilio", "Twilio")
TWIML_CHARS = 4000  # Twilio's limit on the Twiml parameter
_ERROR_TEXT_CHARS = 300


class TwilioCalls:
    """Creates Twilio calls over a shared `httpx` client."""

    def __init__(
        self,
        settings: CallControlSettings,
        client: httpx.AsyncClient,
        fallback_token: SecretStr | None = None,
    ) -> None:
        """`fallback_token`: the auth token when `settings` has none (the webhooks' one)."""
        self.settings = settings
        self._client = client
        self._token = settings.twilio_auth_token or fallback_token

    @property
    def configured(self) -> bool:
        """Whether calls can be placed: an account SID and an auth token are set."""
        token = self._token.get_secret_value() if self._token is not None else ""
        return bool(self.settings.twilio_account_sid) and bool(token)

    async def create(
        self, to: str, from_: str, twiml: str, status_callback: str | None = None
    ) -> PlacedCall:
        """Ask Twilio to ring `to` from `from_` and run `twiml` once answered; DialError if it
        did not take the call."""
        if not self.configured:
            raise DialError(
                "Twilio is not configured: set HOTLINE_CALL_CONTROL__TWILIO_ACCOUNT_SID and "
                "HOTLINE_CALL_CONTROL__TWILIO_AUTH_TOKEN",
                provider="twilio",
            )
        if len(twiml) > TWIML_CHARS:
            raise DialError(f"the TwiML is over {TWIML_CHARS} characters", provider="twilio")
        assert self._token is not None and self.settings.twilio_account_sid is not None
        sid, secret = self.settings.twilio_account_sid, self._token.get_secret_value()
        base = self.settings.twilio_api_url.rstrip("/")
        url = f"{base}/2010-04-01/Accounts/{quote(sid, safe='')}/Calls.json"
        form = {"To": to, "From": from_, "Twiml": twiml}
        if status_callback:
            form["StatusCallback"] = status_callback
        what = f"twilio call to {to}"
        response = await post_create(
            self._client,
            TWILIO,
            what,
            url,
            secret,
            self.settings.timeout_s,
            data=form,
            auth=(sid, secret),
            headers={"Accept": "application/json"},
        )
        if not response.is_success:
            raise _refusal(what, response, secret)
        return placed(TWILIO, what, response, _sid_and_status, "a call sid")


def _sid_and_status(data: Any) -> tuple[str, str]:
    return str(data["sid"]), str(data.get("status") or "queued")


def _refusal(what: str, response: httpx.Response, secret: str) -> DialError:
    """Twilio's error: its HTTP status, code and message."""
    status, code = response.status_code, None
    try:
        data = response.json()
    except ValueError:
        data = None
    if isinstance(data, dict) and data.get("message"):
        said = str(data["message"])
        code = str(data["code"]) if data.get("code") is not None else None
    else:
        said = " ".join(response.text.split())[:_ERROR_TEXT_CHARS] or response.reason_phrase
    coded = f", code {code}" if code is not None else ""
    message = redact(f"{what}: Twilio refused it (HTTP {status}{coded}): {said}", secret)
    log.warning("%s", message)
    return DialError(message, provider="twilio", status=status, code=code)

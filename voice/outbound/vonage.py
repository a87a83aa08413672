"""Placing a call through the Vonage Voice API (https://developer.vonage.com/en/api/voice,
`createCall`; the NCCO `connect` to a websocket:
https://developer.vonage.com/en/voice/voice-api/ncco-reference#connect):

`POST {vonage_api_url}/v1/calls`, `Authorization: Bearer <JWT>` (the application's, as for
transfers), JSON: `to` `[{"type": "phone", "number"}]` and `from` `{"type": "phone",
"number"}` (E.164 without the "+"), and an inline `ncco` that connects the answered call to the
media stream Hotline answers for inbound calls too: one `websocket` endpoint, `uri`
wss://…/vonage/stream (the stream token and dial id in its query), `content-type`
`audio/l16;rate=16000`, and `headers` (the numbers and the dial id), which Vonage echoes in its
first websocket message; for a campaign's call `event_url` (voice/campaigns/status.py).
Vonage answers 201 `{"uuid", "status": "started", "direction": "outbound",
"conversation_uuid"}`; errors in RFC 7807 form (`title`, `detail`, `invalid_parameters`).

The websocket leg cannot name the call (its headers were written before the call had a uuid),
so the call's id is the `uuid` Vonage answered with, kept with the dial. Never retried; the JWT
is never logged.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx

from voice.agents.transfer import CallControl, CallControlError
from voice.outbound.placed import DialError, PlacedCall, Provider, placed, post_create

log = logging.getLogger(__name__)

VONAGE = Provider("vonage", "Vonage")
CONTENT_TYPE = "audio/l16;rate=16000"  # what VonageProtocol speaks


class VonageCalls:
    """Creates Vonage calls, signing with the call-control application's key."""

    def __init__(self, control: CallControl, client: httpx.AsyncClient) -> None:
        self.control = control
        self._client = client

    @property
    def configured(self) -> bool:
        return self.control.supports("vonage")

    async def create(
        self,
        to: str,
        from_: str,
        stream_url: str,
        headers: dict[str, str],
        event_url: str | None = None,
    ) -> PlacedCall:
        """Ask Vonage to ring `to` from `from_` and connect the answered call to `stream_url`
        (with `headers`), its events to `event_url` (else the application's); DialError if
        it did not take the call."""
        if not self.configured:
            raise DialError(
                "Vonage is not configured: set HOTLINE_CALL_CONTROL__VONAGE_APPLICATION_ID and "
                "HOTLINE_CALL_CONTROL__VONAGE_PRIVATE_KEY_FILE",
                provider="vonage",
            )
        what = f"vonage call to {to}"
        try:
            token = self.control.bearer("vonage")
        except CallControlError as exc:
            raise DialError(f"{what}: {exc}", provider="vonage") from None
        endpoint = {"type": "websocket", "uri": stream_url, "content-type": CONTENT_TYPE}
        body = {
            "to": [{"type": "phone", "number": to.removeprefix("+")}],
            "from": {"type": "phone", "number": from_.removeprefix("+")},
            "ncco": [{"action": "connect", "endpoint": [{**endpoint, "headers": headers}]}],
        }
        if event_url is not None:
            body |= {"event_url": [event_url], "event_method": "POST"}
        url = f"{self.control.settings.vonage_api_url.rstrip('/')}/v1/calls"
        response = await post_create(
            self._client,
            VONAGE,
            what,
            url,
            token,
            self.control.settings.timeout_s,
            json=body,
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
        )
        if not response.is_success:
            raise _refusal(what, response, token)
        return placed(VONAGE, what, response, _uuid_and_status, "a call uuid")


def _uuid_and_status(data: Any) -> tuple[str, str]:
    return str(data["uuid"]), str(data.get("status") or "started")


def _refusal(what: str, response: httpx.Response, token: str) -> DialError:
    """Vonage's problem document: its title, detail and invalid parameters."""
    status = response.status_code
    try:
        data: Any = response.json()
    except ValueError:
        data = None
    parts: list[str] = []
    if isinstance(data, dict):
        title, detail = str(data.get("title") or ""), str(data.get("detail") or "")
        parts.append(f"{title}: {detail}" if title and detail else title or detail)
        invalid = data.get("invalid_parameters")
        for item in invalid if isinstance(invalid, list) else []:
            if isinstance(item, dict):
                parts.append(f"{item.get('name')}: {item.get('reason')}")
    said = "; ".join(p for p in parts if p) or " ".join(response.text.split())[:300]
    message = f"{what}: Vonage refused it (HTTP {status}): {said or response.reason_phrase}"
    message = message.replace(token, "[redacted]")
    log.warning("%s", message)
    return DialError(message, provider="vonage", status=status)

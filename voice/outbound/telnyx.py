"""Placing a call through Telnyx Call Control's Dial command
(https://developers.telnyx.com/api-reference/call-commands/dial, media streaming on dial:
https://developers.telnyx.com/docs/voice/programmable-voice/media-streaming):

`POST {telnyx_api_url}/calls`, `Authorization: Bearer <API key>`, JSON: `connection_id` (the
Call Control app), `to`, `from`, and the media stream Hotline answers for inbound calls too:
`stream_url` (wss://…/telnyx/stream, with the stream token and the dial id in its query),
`stream_track` `inbound_track`, `stream_bidirectional_mode` `rtp` and
`stream_bidirectional_codec` `PCMU`; for a campaign's call `webhook_url` (where its call
events, `call.hangup` among them, go: voice/campaigns/status.py). Telnyx answers 200
`{"data": {"call_control_id", …}}`; errors as `{"errors": [{"code", "title", "detail"}]}`.

Never retried (a second Dial rings twice); the API key is never logged nor put in a message.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx

from voice.agents.transfer import CallControlSettings
from voice.outbound.placed import DialError, PlacedCall, Provider, placed, post_create

log = logging.getLogger(__name__)

TELNYX = Provider("telnyx", "Telnyx")


class TelnyxCalls:
    """Dials Telnyx calls over a shared `httpx` client."""

    def __init__(self, settings: CallControlSettings, client: httpx.AsyncClient) -> None:
        self.settings = settings
        self._client = client

    @property
    def configured(self) -> bool:
        """Whether calls can be placed: an API key and a connection id are set."""
        key = self.settings.telnyx_api_key
        return bool(key and key.get_secret_value()) and bool(self.settings.telnyx_connection_id)

    async def create(
        self, to: str, from_: str, stream_url: str, webhook_url: str | None = None
    ) -> PlacedCall:
        """Ask Telnyx to ring `to` from `from_` and stream the answered call to `stream_url`
        (its call events to `webhook_url`, else the connection's); DialError if it did not
        take the call."""
        if not self.configured:
            raise DialError(
                "Telnyx is not configured: set HOTLINE_CALL_CONTROL__TELNYX_API_KEY and "
                "HOTLINE_CALL_CONTROL__TELNYX_CONNECTION_ID",
                provider="telnyx",
            )
        assert self.settings.telnyx_api_key is not None
        key = self.settings.telnyx_api_key.get_secret_value()
        url = f"{self.settings.telnyx_api_url.rstrip('/')}/calls"
        body = {
            "connection_id": self.settings.telnyx_connection_id,
            "to": to,
            "from": from_,
            "stream_url": stream_url,
            "stream_track": "inbound_track",
            "stream_bidirectional_mode": "rtp",
            "stream_bidirectional_codec": "PCMU",
        }
        if webhook_url is not None:
            body |= {"webhook_url": webhook_url, "webhook_url_method": "POST"}
        what = f"telnyx call to {to}"
        response = await post_create(
            self._client,
            TELNYX,
            what,
            url,
            key,
            self.settings.timeout_s,
            json=body,
            headers={"Authorization": f"Bearer {key}", "Accept": "application/json"},
        )
        if not response.is_success:
            raise _refusal(what, response, key)
        return placed(TELNYX, what, response, _call_control_id, "a call_control_id")


def _call_control_id(data: Any) -> tuple[str, str]:
    return str(data["data"]["call_control_id"]), "queued"


def _refusal(what: str, response: httpx.Response, key: str) -> DialError:
    """Telnyx's errors: the HTTP status, then each error's code, title and detail."""
    status, code, parts = response.status_code, None, []
    try:
        data: Any = response.json()
    except ValueError:
        data = None
    errors = data.get("errors") if isinstance(data, dict) else None
    for item in errors if isinstance(errors, list) else []:
        if isinstance(item, dict):
            title, detail = str(item.get("title") or ""), str(item.get("detail") or "")
            parts.append(f"{title}: {detail}" if title and detail else title or detail)
            if code is None and item.get("code") is not None:
                code = str(item["code"])
    said = "; ".join(p for p in parts if p) or " ".join(response.text.split())[:300]
    coded = f", code {code}" if code is not None else ""
    message = f"{what}: Telnyx refused it (HTTP {status}{coded}): {said or response.reason_phrase}"
    message = message.replace(key, "[redacted]")
    log.warning("%s", message)
    return DialError(message, provider="telnyx", status=status, code=code)

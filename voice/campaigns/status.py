"""How a campaign's dial ended, as the provider reports it, settling the dial at once:

- `POST /twilio/status`: Twilio's status callback
  (https://www.twilio.com/docs/voice/api/call-resource#statuscallback), form encoded and signed
  (`X-Twilio-Signature` over the URL and the sorted parameters, checked as the voice webhook's
  is, with the auth token that placed the call), when the call ends: `CallStatus` `busy`,
  `no-answer`, `failed` or `canceled`.
- `POST /telnyx/status`: Telnyx's call events (the Dial's `webhook_url`), JSON, signed with
  ed25519 (voice/outbound/webhooks.py, `HOTLINE_OUTBOUND__TELNYX_PUBLIC_KEY`): `call.hangup`
  with `hangup_cause` `user_busy`, `timeout`, `call_rejected`… (`rules.TELNYX_HANGUP`); other
  events are taken and ignored.
- `POST /vonage/status`: Vonage's call events (the create's `event_url`), JSON, with a JWT
  (HS256, the signature secret, `HOTLINE_OUTBOUND__VONAGE_SIGNATURE_SECRET`; its
  `payload_hash` the body's): `status` `busy`, `timeout`, `unanswered`, `rejected`, `failed`,
  `cancelled`, `completed` (`rules.VONAGE_STATUS`); the others are taken and ignored.

`completed` (answered; Telnyx: any other cause) makes the runner read the call's record, which
says who answered. The URL names the campaign, the row and the hold of that dial
(`?campaign=&row=&claim=`, part of what Twilio signs), so a report of an earlier dial of the
same row changes nothing. 2xx either way (a report sent again is no error); 403, logged, for a
bad signature or when nothing is configured to check one with."""

from __future__ import annotations

import logging
import time
from urllib.parse import parse_qsl

from fastapi import APIRouter, Request, Response

from voice.campaigns.rules import TELNYX_HANGUP, VONAGE_STATUS
from voice.campaigns.runner import CampaignRunner
from voice.cluster.records import RegistryUnavailable
from voice.cluster.store import REDIS_UNREACHABLE
from voice.outbound.webhooks import (
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    telnyx_event,
    telnyx_signature_is_valid,
    vonage_event,
    vonage_signature_is_valid,
)
from voice.server.api import error, read_body
from voice.server.routes.phone import public_url
from voice.server.settings import Settings
from voice.transports.phone.twilio import signature_is_valid

log = logging.getLogger(__name__)

status_api = APIRouter()
_AWAY: tuple[type[Exception], ...] = (*REDIS_UNREACHABLE, RegistryUnavailable)


@status_api.post("/twilio/status", response_model=None)
async def twilio_status(request: Request) -> Response:
    settings: Settings = request.app.state.settings
    body = await read_body(request, settings.max_body_bytes)
    params = dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
    token = settings.call_control.twilio_auth_token or settings.telephony.twilio_auth_token
    if token is None:
        return error(403, "twilio status: no Twilio auth token is configured to check it with")
    url = public_url(request, settings)
    if not signature_is_valid(
        token.get_secret_value(), url, params, request.headers.get("x-twilio-signature")
    ):
        log.warning("twilio status: bad or missing signature for %s", url)
        return Response(status_code=403)
    call_id, status = params.get("CallSid", ""), params.get("CallStatus", "")
    return await _reported(request, "twilio", call_id, status, 204)


@status_api.post("/telnyx/status", response_model=None)
async def telnyx_status(request: Request) -> Response:
    settings: Settings = request.app.state.settings
    body = await read_body(request, settings.max_body_bytes)
    key = settings.outbound.telnyx_public_key
    if not key:
        return error(403, "telnyx status: no Telnyx public key is configured to check it with")
    headers = request.headers
    signature, timestamp = headers.get(SIGNATURE_HEADER), headers.get(TIMESTAMP_HEADER)
    if not telnyx_signature_is_valid(key, body, signature, timestamp, time.time()):
        log.warning("telnyx status: bad, stale or missing signature for %s", request.url.path)
        return Response(status_code=403)
    event = telnyx_event(body)
    if event is None:
        return error(400, "telnyx status: not a Telnyx call event")
    if event.event_type != "call.hangup":
        return Response(status_code=200)  # call.initiated, call.answered…: not asked for
    status = TELNYX_HANGUP.get(event.hangup_cause, "completed")
    return await _reported(request, f"telnyx ({event.hangup_cause})", event.call_id, status, 200)


@status_api.post("/vonage/status", response_model=None)
async def vonage_status(request: Request) -> Response:
    settings: Settings = request.app.state.settings
    body = await read_body(request, settings.max_body_bytes)
    secret = settings.outbound.vonage_signature_secret
    if secret is None or not secret.get_secret_value():
        return error(403, "vonage status: no Vonage signature secret is configured to check it")
    authorization = request.headers.get("authorization")
    if not vonage_signature_is_valid(secret.get_secret_value(), body, authorization, time.time()):
        log.warning("vonage status: bad, stale or missing signature for %s", request.url.path)
        return Response(status_code=403)
    event = vonage_event(body)
    if event is None:
        return error(400, "vonage status: not a Vonage call event")
    call_id, said = event
    status = VONAGE_STATUS.get(said)
    if status is None:
        return Response(status_code=200)  # started, ringing, answered…: not asked for
    return await _reported(request, "vonage", call_id, status, 200)


async def _reported(
    request: Request, provider: str, call_id: str, status: str, ok: int
) -> Response:
    """Settle the dial the URL names with what the provider said (`status`, Twilio's words)."""
    query = request.query_params
    campaign, row, claim = query.get("campaign"), query.get("row"), query.get("claim")
    if not (campaign and row and claim):
        log.info("%s status: call %s %s (no campaign's)", provider, call_id[:64], status[:20])
        return Response(status_code=ok)
    runner: CampaignRunner = request.app.state.campaigns
    try:
        taken = await runner.provider_reported(campaign, row, claim, call_id, status)
    except _AWAY as exc:
        said = f"{provider} status: call {call_id[:64]} {status[:20]} not recorded: {exc}"
        log.error("%s", said)
        return error(503, "campaigns unavailable: Redis unreachable", {"Retry-After": "1"})
    log.info(
        "%s status: call %s %s (campaign %s row %s)%s",
        provider,
        call_id[:64],
        status[:20],
        campaign[:20],
        row[:8],
        "" if taken else ": nothing to do",
    )
    return Response(status_code=ok)

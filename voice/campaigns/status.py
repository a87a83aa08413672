"""`POST /twilio/status`: Twilio's status callback for the calls a campaign places
(https://www.twilio.com/docs/voice/api/call-resource#statuscallback). Twilio POSTs it, form
encoded and signed (`X-Twilio-Signature` over the URL and the sorted parameters, checked as the
voice webhook's is, with the auth token that placed the call), when the call ends: `CallStatus`
`busy`, `no-answer`, `failed` or `canceled` settle the dial at once; `completed` (answered)
makes the runner read the call's record, which says who answered.

The URL names the campaign, the row and the hold of that dial (`?campaign=&row=&claim=`, part
of what Twilio signs), so a report of an earlier dial of the same row changes nothing. 204 to
Twilio either way (a report it sent again is no error); 403 for a bad signature or when no auth
token is configured to check one."""

from __future__ import annotations

import logging
from urllib.parse import parse_qsl

from fastapi import APIRouter, Request, Response

from voice.campaigns.runner import CampaignRunner
from voice.cluster.records import RegistryUnavailable
from voice.cluster.store import REDIS_UNREACHABLE
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
    query = request.query_params
    campaign, row, claim = query.get("campaign"), query.get("row"), query.get("claim")
    call_id, status = params.get("CallSid", ""), params.get("CallStatus", "")
    if not (campaign and row and claim):
        log.info("twilio status: call %s %s (no campaign's)", call_id[:64], status[:20])
        return Response(status_code=204)
    runner: CampaignRunner = request.app.state.campaigns
    try:
        taken = await runner.provider_reported(campaign, row, claim, call_id, status)
    except _AWAY as exc:
        log.error("twilio status: call %s %s not recorded: %s", call_id[:64], status[:20], exc)
        return error(503, "campaigns unavailable: Redis unreachable", {"Retry-After": "1"})
    log.info(
        "twilio status: call %s %s (campaign %s row %s)%s",
        call_id[:64],
        status[:20],
        campaign[:20],
        row[:8],
        "" if taken else ": nothing to do",
    )
    return Response(status_code=204)

"""One dial of a campaign row, by the worker that holds it: its calling hours and the
do-not-call list looked at first, then the call placed as `POST /calls/outbound` places one
(the row's variables in its metadata, its agent's words and voicemail rendered with them), and
what the provider said noted on the row. A call the provider took is then the row's until its
outcome comes (`voice.campaigns.runner`)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from voice.agents.variables import render
from voice.campaigns.campaign import Campaign
from voice.campaigns.store import Claimed
from voice.cluster.records import RegistryUnavailable
from voice.cluster.store import REDIS_UNREACHABLE
from voice.outbound.dialer import NotPlaceable, TooFast
from voice.outbound.placed import DialError
from voice.outbound.request import BadRequest, OutboundRequest
from voice.server.call_records import CallsFull

if TYPE_CHECKING:
    from voice.campaigns.runner import CampaignRunner

log = logging.getLogger(__name__)

STATUS_PATHS = {"twilio": "/twilio/status", "telnyx": "/telnyx/status", "vonage": "/vonage/status"}
FULL_RETRY_S = 2.0  # a dial the cluster could not admit (full, draining) is due again then


def call_metadata(claim: Claimed) -> dict[str, Any]:
    """What the placed call carries into its record and post-call webhook."""
    return {
        "campaign_id": claim.campaign_id,
        "row": int(claim.row),
        "attempt": claim.attempts,
        "variables": dict(claim.variables),
    }


def order_of(campaign: Campaign, claim: Claimed) -> OutboundRequest:
    """The row's call, as `POST /calls/outbound` would take it."""
    head = campaign.head
    fields: dict[str, Any] = {
        "to": claim.to,
        "agent": head.agent,
        "transport": head.transport,
        "metadata": call_metadata(claim),
        "machine_detection": head.machine_detection,
    }
    for name, value in (("from", head.from_), ("trunk", head.trunk)):
        if value is not None:
            fields[name] = value
    if head.ring_timeout_s is not None:
        fields["ring_timeout_s"] = head.ring_timeout_s
    if campaign.voicemail_given:
        message = head.voicemail
        fields["voicemail"] = render(message, claim.variables) if message else message
    return OutboundRequest.model_validate(fields)


def status_callback(campaign: Campaign, claim: Claimed) -> str | None:
    """Where the provider reports how this dial ended: Hotline's own route, naming the row and
    the hold (so a late report of an earlier dial is told apart). None over SIP (its calls end
    in their records)."""
    path = STATUS_PATHS.get(campaign.head.transport)
    if path is None:
        return None
    query = {"campaign": claim.campaign_id, "row": claim.row, "claim": claim.token}
    return f"{campaign.base_url.rstrip('/')}{path}?{urlencode(query)}"


async def dial(runner: CampaignRunner, campaign: Campaign, claim: Claimed) -> None:
    """Dial the held row, or give it back (closed hours, the call rate, Redis away)."""
    store, now = runner.store, time.time()
    opens = runner.due_at(campaign, claim.timezone, now)
    if opens > now:  # its hours closed since it fell due
        await store.release(claim, opens, "hours", now)
        return
    if await runner.dnc.listed(claim.to):
        log.info(
            "campaign %s: row %s: %s is on the do-not-call list",
            campaign.campaign_id,
            claim.row,
            claim.to,
        )
        await runner.settle(campaign, claim.row, claim.token, "dnc", counted=False)
        return
    try:
        order = order_of(campaign, claim)
    except ValueError as exc:  # pydantic's ValidationError too: a row the request let through
        error = {"error": f"not a call Hotline can place: {exc}"[:500]}
        await runner.settle(campaign, claim.row, claim.token, "failed", fields=error)
        return
    ready = runner.board.agents.named(order.agent, order.metadata) if runner.board.agents else None
    voicemail = ready.agent.voicemail if ready is not None else None
    callback = status_callback(campaign, claim)
    try:
        placed = await runner.dialer.place(order, campaign.base_url, voicemail, callback)
    except TooFast as exc:
        runner.rate_until[runner.dialer.rate_key(order.transport, order.trunk)] = now + exc.wait_s
        await store.release(claim, now + exc.wait_s, "rate", now)
        return
    except RegistryUnavailable:
        await store.release(claim, now + 1.0, "redis", now)
        return
    except CallsFull as exc:  # a SIP call is admitted as it is placed: later, not failed
        log.info("campaign %s: row %s: not now (%s)", claim.campaign_id, claim.row, exc.reason)
        await store.release(claim, now + FULL_RETRY_S, "capacity", now)
        return
    except (NotPlaceable, DialError, BadRequest) as exc:  # BadRequest: a trunk gone since
        fields = {"error": str(exc)[:500]}
        await runner.settle(campaign, claim.row, claim.token, "failed", fields=fields)
        return
    log.info(
        "campaign %s: row %s: call %s to %s placed (attempt %d)",
        campaign.campaign_id,
        claim.row,
        placed.call_id,
        claim.to,
        claim.attempts,
    )
    await note_placed(runner, claim, placed.call_id)


async def note_placed(runner: CampaignRunner, claim: Claimed, call_id: str) -> None:
    """Write down the call the provider took, retrying while Redis is away, until the hold's
    lease would run out (after that the row may be taken again: the status callback, which
    names the hold, still settles it)."""
    deadline = time.monotonic() + runner.settings.lease_s * 0.8
    delay = 0.05
    while True:
        now = time.time()
        try:
            await runner.store.placed(claim, call_id, now + runner.settings.check_s, now)
            return
        except REDIS_UNREACHABLE as exc:
            if time.monotonic() + delay > deadline:
                log.error(
                    "campaign %s: row %s: call %s not noted: %s",
                    claim.campaign_id,
                    claim.row,
                    call_id,
                    exc,
                )
                return
            await asyncio.sleep(delay)  # Redis away: writes wait (bounded)
            delay = min(delay * 2, 1.0)

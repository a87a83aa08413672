"""The campaign runner: one task on every worker (started by the lifespan) that takes the
cluster's campaigns forward, together with the others, through Redis alone.

Each tick (`tick_s`, or at once when woken) it visits every live campaign:
- rows in flight whose time is past: a row still `dialling` means its holder's lease ran out
  (the worker died): it is due again, its attempt not counted; a `ringing` row's call is
  looked at (by one worker at a time) in the call records: ended there, it is settled as
  answered or machine (`answered_by`); not there by `no_answer_after_s`, as not answered;
- while the campaign runs, this worker is not full or draining and the provider's calls per
  second allow: due rows are claimed (each by one worker, within the campaign's concurrency
  counted in Redis) and dialled (`voice.campaigns.dialling`);
- a stopped campaign's queued rows become `stopped`; an ended campaign's `campaign.ended`
  webhook is queued (by one worker).

Outcomes (`settle`) come from the dial itself (refused, do-not-call), from the provider's
status callback (`voice.campaigns.status`: busy, no answer, failed) or from the call record
(over SIP every outcome: the record's `outcome.cause`, busy, no_answer, rejected…);
retries are due after their backoff, moved into the callee's calling hours.

Redis outages: the runner logs once, waits for the next tick and goes on; rows held by no one
any more are taken again when their leases end."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import TYPE_CHECKING

from redis.exceptions import RedisError

from voice.campaigns.campaign import CAMPAIGN_ENDED, Campaign, ended_document
from voice.campaigns.dialling import dial
from voice.campaigns.dnc import DoNotCall
from voice.campaigns.hours import zone
from voice.campaigns.rules import TWILIO_UNANSWERED, outcome_of_record
from voice.campaigns.settings import CampaignSettings
from voice.campaigns.store import CampaignStore, Claimed
from voice.cluster.records import TERMINAL_STATES, RegistryUnavailable
from voice.cluster.store import REDIS_UNREACHABLE, not_cancelled
from voice.cluster.webhooks import WebhookOutbox
from voice.outbound.dialer import Dialer
from voice.server.after_call import call_url

if TYPE_CHECKING:
    from voice.server.calls import Switchboard

log = logging.getLogger(__name__)

_EXPIRED_PER_TICK = 200  # rows in flight looked at per campaign and tick
_NOTIFY_HOLD_S = 60.0  # one worker's turn to queue the campaign.ended webhook
_AWAY: tuple[type[Exception], ...] = (*REDIS_UNREACHABLE, RegistryUnavailable)
_REDIS: tuple[type[Exception], ...] = (*REDIS_UNREACHABLE, RedisError)


class CampaignRunner:
    """This worker's share of running the cluster's campaigns."""

    def __init__(
        self,
        store: CampaignStore,
        dialer: Dialer,
        board: Switchboard,
        settings: CampaignSettings,
        worker_id: str,
        outbox: WebhookOutbox | None = None,
        public_url: str | None = None,
    ) -> None:
        self.store, self.dialer, self.board = store, dialer, board
        self.dnc = DoNotCall(store.redis, store.prefix)
        self.settings, self.worker_id, self.outbox = settings, worker_id, outbox
        self.public_url = public_url
        answer_s = board.settings.outbound.answer_within_s
        self.no_answer_after_s = settings.no_answer_after_s or answer_s + 30.0
        self.rate_until: dict[str, float] = {}  # provider -> no call before (its rate)
        self._campaigns: dict[str, Campaign] = {}
        self._dials: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self._healthy = True

    def wake(self) -> None:
        """Visit the campaigns now (one was created or resumed here)."""
        self._wake.set()

    def due_at(self, campaign: Campaign, timezone: str, earliest: float) -> float:
        """The first moment at or after `earliest` inside the campaign's calling hours in
        `timezone` (the hours are read on the clock shifted by `clock_offset_s`)."""
        offset = self.settings.clock_offset_s
        return campaign.window.next_open(earliest + offset, zone(timezone)) - offset

    async def run(self) -> None:
        """Visit the live campaigns every tick, forever (until cancelled)."""
        try:
            while not_cancelled():
                self._wake.clear()
                try:
                    for campaign_id in await self.store.live():
                        await self._visit_safely(campaign_id)
                    self._up()
                except REDIS_UNREACHABLE as exc:
                    self._down(exc)
                except RedisError:
                    log.exception("campaigns: a Redis command failed")
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.settings.tick_s):
                        await self._wake.wait()
        finally:
            for task in self._dials:
                task.cancel()
            await asyncio.gather(*self._dials, return_exceptions=True)

    async def campaign(self, campaign_id: str) -> Campaign | None:
        """The campaign (its unchanging part, kept once read); None if there is none."""
        found = self._campaigns.get(campaign_id)
        if found is None:
            found = Campaign.of(campaign_id, await self.store.meta(campaign_id))
            if found is not None:
                self._campaigns[campaign_id] = found
        return found

    async def _visit_safely(self, campaign_id: str) -> None:
        """Visit one campaign; a bug in one is logged, and the others go on."""
        try:
            await self._visit(campaign_id)
        except _REDIS:
            raise
        except Exception:
            log.exception("campaign %s: the runner failed on it", campaign_id)

    async def _visit(self, campaign_id: str) -> None:
        meta = await self.store.meta(campaign_id)
        if not meta:  # expired, or deleted by hand
            await self.store.forget(campaign_id)
            self._campaigns.pop(campaign_id, None)
            return
        campaign = await self.campaign(campaign_id)
        if campaign is None:
            return  # still being created
        state, now = meta.get("state"), time.time()
        if state == "stopped" and await self.store.sweep(campaign_id, now) == 2:
            state = "ended"
        if state == "ended":
            await self._announce_end(campaign)
            return
        await self._reap(campaign, now)
        if state == "running":
            await self._claim_some(campaign, now)

    async def _reap(self, campaign: Campaign, now: float) -> None:
        """Rows in flight whose lease or next look is past."""
        c = campaign.campaign_id
        for row in await self.store.expired(c, now, _EXPIRED_PER_TICK):
            data = await self.store.row(c, row)
            status, token = data.get("status"), data.get("token", "")
            if status == "dialling" and await self.store.retake(c, row, token, now):
                worker = data.get("worker", "?")
                log.warning("campaign %s: row %s: lease of %s ran out; due again", c, row, worker)
            elif status == "ringing" and await self.store.take_look(
                c, row, now, now + self.settings.check_s
            ):
                await self._look(campaign, row, data, now)

    async def _look(self, campaign: Campaign, row: str, data: dict[str, str], now: float) -> None:
        """Settle a ringing row whose call has ended (or never came)."""
        call_id, token = data.get("call_id", ""), data.get("token", "")
        try:
            found = await self.board.sessions.get_call(call_id) if call_id else None
        except RegistryUnavailable:
            return
        if found is not None:
            record = found[0]
            if record.state not in TERMINAL_STATES:
                return  # talking
            fields = {"end_reason": record.end_reason or record.state}
            if record.answered_by:
                fields["answered_by"] = json.dumps(record.answered_by, separators=(",", ":"))
            outcome = outcome_of_record(record.answered_by, record.outcome)
            await self.settle(campaign, row, token, outcome, fields=fields)
        elif data.get("provider_status") == "completed":
            error = "answered, but its media stream never started"
            await self.settle(campaign, row, token, "failed", fields={"error": error})
        elif now >= float(data.get("placed_at") or now) + self.no_answer_after_s:
            error = "no status from the provider and no media stream"
            await self.settle(campaign, row, token, "no_answer", fields={"error": error})

    async def _claim_some(self, campaign: Campaign, now: float) -> None:
        """Claim due rows within the concurrency and dial each in a task of its own."""
        c, head = campaign.campaign_id, campaign.head
        provider = self.dialer.rate_key(head.transport, head.trunk)  # SIP: the trunk's
        if self.rate_until.get(provider, 0.0) > now or await self.board.refusal() is not None:
            return
        free = campaign.head.concurrency - await self.store.in_flight(c)
        if free <= 0:
            return
        for row in await self.store.due_rows(c, now, free):
            wait_s = await self.dialer.rate.wait_s(provider)
            if wait_s > 0:
                self.rate_until[provider] = now + wait_s
                return
            claim = await self.store.claim(c, row, now, self.settings.lease_s, self.worker_id)
            if isinstance(claim, int):
                if claim < 0:
                    return  # paused, stopped, or the concurrency is reached
                continue
            self._spawn(campaign, claim)

    def _spawn(self, campaign: Campaign, claim: Claimed) -> None:
        task = asyncio.create_task(self._dial(campaign, claim), name=f"dial-{claim.to}")
        self._dials.add(task)
        task.add_done_callback(self._dials.discard)

    async def _dial(self, campaign: Campaign, claim: Claimed) -> None:
        try:
            await dial(self, campaign, claim)
        except asyncio.CancelledError:
            raise
        except _AWAY as exc:
            c, row = claim.campaign_id, claim.row
            log.warning("campaign %s: row %s: %s; its lease will run out", c, row, exc)
        except Exception:  # the lease runs out and another dial comes: never silent
            log.exception("campaign %s: row %s: the dial failed", claim.campaign_id, claim.row)

    async def settle(
        self,
        campaign: Campaign,
        row: str,
        token: str,
        outcome: str,
        *,
        counted: bool = True,
        took: bool = False,
        fields: dict[str, str] | None = None,
    ) -> int:
        """What the dial held by `token` came to: the row is done, or due again after the
        retry's backoff, inside its calling hours. 0 if that dial was settled already."""
        c, now = campaign.campaign_id, time.time()
        data = await self.store.row(c, row)
        attempts = int(data.get("attempts") or 0)
        retry_s = campaign.head.retry.retry_in(outcome, attempts) if counted else None
        timezone = data.get("timezone") or campaign.head.timezone
        due_at = None if retry_s is None else self.due_at(campaign, timezone, now + retry_s)
        settled = await self.store.settle(
            c, row, token, outcome, due_at, now, counted=counted, took=took, fields=fields
        )
        if settled:
            then = "done" if due_at is None else f"again in {due_at - now:.1f} s"
            said = f"{outcome} after {attempts} attempts, {then}"
            log.info("campaign %s: row %s: %s", c, row, said)
        if settled == 2:
            log.info("campaign %s: ended", c)
            self.wake()
        return settled

    async def provider_reported(
        self, campaign_id: str, row: str, token: str, call_id: str, status: str
    ) -> bool:
        """The provider's status callback for one dial (Twilio's CallStatus); whether it was
        one this campaign waits for."""
        campaign = await self.campaign(campaign_id)
        if campaign is None or not row.isdigit():
            return False
        outcome = TWILIO_UNANSWERED.get(status)
        if outcome is not None:
            fields = {"call_id": call_id, "call_status": status}
            settled = await self.settle(campaign, row, token, outcome, took=True, fields=fields)
            return bool(settled)
        if status == "completed":  # answered: its record says by whom, once it has ended
            noted = await self.store.provider_status(campaign_id, row, token, status, time.time())
            self.wake()
            return noted
        return False  # queued, ringing, in-progress: not asked for

    async def _announce_end(self, campaign: Campaign) -> None:
        """Queue the ended campaign's webhook (one worker does), then let it go."""
        c, retention = campaign.campaign_id, self.settings.retention_s
        if self.outbox is None:
            await self.store.finished(c, "none", retention)
            self._campaigns.pop(c, None)
            return
        if not await self.store.claim_notify(c, time.time(), _NOTIFY_HOLD_S):
            return
        url = call_url(c, self.public_url).replace("/calls/", "/campaigns/")
        document = await ended_document(self.store, c, url)
        try:
            await self.outbox.enqueue(c, document, event=CAMPAIGN_ENDED, wait_s=10.0)
        except (RegistryUnavailable, ValueError) as exc:
            log.error("campaign %s: the campaign.ended webhook was not queued: %s", c, exc)
            return
        await self.store.finished(c, "sent", retention)
        self._campaigns.pop(c, None)
        log.info("campaign %s: campaign.ended webhook queued", c)

    def _up(self) -> None:
        if not self._healthy:
            log.info("campaigns: Redis reachable again")
        self._healthy = True

    def _down(self, exc: BaseException) -> None:
        if self._healthy:
            log.warning("campaigns: Redis unreachable (%s); campaigns wait", exc)
        self._healthy = False

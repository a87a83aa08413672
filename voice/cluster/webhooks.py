"""Post-call webhooks: a signed JSON document POSTed to the operator's URL, kept in Redis until
the receiver has it, retried with backoff for a bounded time, its outcome kept for a while.

`WebhookOutbox.enqueue` stores a delivery in Redis and returns its id; from then on it survives
any worker: `WebhookOutbox.run` (on every worker, as many as there are) takes due deliveries,
POSTs them and records what happened. Each request carries

- `X-Hotline-Signature: t=<unix>,v1=<hex>`, made by `voice.agents.http_tools.sign`, so tools
  and webhooks are signed alike (check it with `voice.agents.http_tools.verify`). Every attempt
  is signed afresh, with the time it is sent; the body is the same bytes each time.
- `X-Hotline-Delivery: <delivery id>`, the same on every attempt: delivery is at least once (a
  worker that dies mid-send leaves its attempt to be sent again), so receivers de-duplicate by it.
- `X-Hotline-Event: call.ended`, `X-Hotline-Call-Id`, `Content-Type: application/json`.

Answers: 2xx is `delivered`; 408, 429, 5xx, a timeout or a broken connection is tried again
after a backoff (`first_retry_s`, doubling up to `max_retry_s`, minus up to a quarter of jitter,
and never sooner than a `Retry-After` asks); any other status (400, 401, 404, a redirect, which
is not followed) is `failed` at once, since sending the same body again will not change the
answer. After a failed attempt, a delivery enqueued `give_up_after_s` ago or more is `failed`;
the last retry is moved up to that moment, so there always is one attempt at the deadline.

Keys (prefix `p`). Every key is in the Redis Cluster slot `{p}`, so one script can claim a
delivery and move it in the due set atomically:
  {p}:webhooks:due        sorted set: delivery id -> when it may next be taken (unix seconds):
                          its next attempt, or, while a worker holds it, the end of that lease
  {p}:webhook:<id>        hash: state (pending | delivered | failed), call_id, event, body (the
                          exact bytes that are signed; dropped once the outcome is final),
                          attempts, enqueued_at, last_attempt_at, last_status, last_error,
                          delivered_at / failed_at, claim (the token of the last claim), worker

Claiming is the due set itself: a script takes the deliveries whose time has come, counts the
attempt and pushes each one's score to now + `lease_s` under a fresh claim token, in one step,
so two workers never hold the same attempt. A worker that finishes writes the outcome only if
its token is still the delivery's (a script again); one that crashed writes nothing, and the
delivery falls due when the lease ends, to be taken by any worker. No per-worker in-flight set
is kept, so a dead worker leaves nothing behind to clean up. The lease is longer than a send can
take (`timeout_s`); workers' clocks are assumed to agree within the rest of it (NTP).

A final outcome is kept `retention_s` (EXPIRE), without its body; a pending delivery expires
`give_up_after_s + retention_s` after it was enqueued, whatever happens. One slot holds every
delivery, so in a Redis Cluster one node carries the webhook traffic: small next to the calls.

Redis outages, as in `voice.cluster.registry` ("writes wait, reads fail, loops retry"):
`enqueue` retries until the delivery is stored (bounded by `wait_s` if given), `outcome` raises
`RegistryUnavailable`, and `run` logs, waits and goes on; an attempt already sent waits to
record its outcome. When nothing is due, `run` sleeps until the next due time, at most
`POLL_S`, so deliveries enqueued by other workers are seen; one enqueued here wakes it at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import httpx
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from voice.agents.http_tools import CALL_ID_HEADER, SIGNATURE_HEADER, sign
from voice.cluster.records import RegistryUnavailable
from voice.cluster.store import REDIS_UNREACHABLE, Args, not_cancelled, text
from voice.cluster.webhook_http import Answer, Outcome, post
from voice.cluster.webhook_settings import WebhookSettings as WebhookSettings  # re-exported
from voice.cluster.webhook_store import (
    CLAIM,
    ENQUEUE,
    FINISH,
    MAX_BODY_BYTES,
    delivery_key,
    due_key,
    json_body,
)

log = logging.getLogger(__name__)

DELIVERY_HEADER = "X-Hotline-Delivery"
EVENT_HEADER = "X-Hotline-Event"
CALL_ENDED = "call.ended"
POLL_S = 1.0  # the longest `run` sleeps before looking at the due set again
JITTER = 0.25  # a retry comes up to this fraction of its backoff sooner
_RETRYABLE = frozenset({408, 429})


@dataclass(frozen=True)
class _Claimed:
    delivery_id: str
    call_id: str
    event: str
    body: bytes
    enqueued_at: float
    attempts: int
    token: str


class WebhookOutbox:
    """Deliveries of this cluster (prefix `prefix`) to `settings.url`: `enqueue` one, `run`
    the delivery loop (on any number of workers), read its `outcome`."""

    def __init__(
        self,
        redis: aioredis.Redis,
        prefix: str,
        settings: WebhookSettings,
        client: httpx.AsyncClient,
        worker_id: str,
        clock: Callable[[], float] = time.time,
        on_outcome: Callable[[Outcome], None] | None = None,
    ) -> None:
        """`on_outcome` is told what each attempt came to (`Outcome`), once it is recorded."""
        if settings.url is None or settings.secret is None:
            raise ValueError("no webhook URL is configured: there is nothing to deliver")
        self.redis, self.settings, self.worker_id = redis, settings, worker_id
        self.healthy = True  # Redis answered the last command
        self._prefix, self._client, self._clock = prefix, client, clock
        self._on_outcome = on_outcome
        self._url, self._secret = str(settings.url), settings.secret.get_secret_value().encode()
        self._due = due_key(prefix)
        self._wake = asyncio.Event()
        self._running = False
        self._enqueue = redis.register_script(ENQUEUE)
        self._claim_script = redis.register_script(CLAIM)
        self._finish = redis.register_script(FINISH)

    def __repr__(self) -> str:  # never the secret
        return f"WebhookOutbox(worker={self.worker_id!r}, prefix={self._prefix!r})"

    # -- enqueue and outcome -------------------------------------------------------------------

    async def enqueue(
        self,
        call_id: str,
        document: Mapping[str, Any],
        *,
        event: str = CALL_ENDED,
        wait_s: float | None = None,
    ) -> str:
        """Store a delivery of `document` (as compact UTF-8 JSON) and return its id; once this
        returns it is in Redis. While Redis is unreachable this retries, until stored or, with
        `wait_s`, until `wait_s` has passed (then `RegistryUnavailable`: nothing was stored).
        ValueError if `document` is not JSON or its body is over `MAX_BODY_BYTES`."""
        body = json_body(document)
        if len(body) > MAX_BODY_BYTES:
            raise ValueError(f"a webhook body is at most {MAX_BODY_BYTES} bytes, not {len(body)}")
        delivery_id = uuid.uuid4().hex
        now = self._clock()
        fields = {"state": "pending", "call_id": call_id, "event": event, "body": body.decode()}
        fields |= {"attempts": "0", "enqueued_at": repr(now)}
        expire_s = int(self.settings.give_up_after_s + self.settings.retention_s) + 1
        args: Args = [delivery_id, repr(now), expire_s, *(p for kv in fields.items() for p in kv)]
        keys = [self._due, delivery_key(self._prefix, delivery_id)]
        try:
            async with asyncio.timeout(wait_s):
                await self._until_written(lambda: self._enqueue(keys=keys, args=args))
        except TimeoutError:
            raise RegistryUnavailable(f"webhook for call {call_id} not stored") from None
        self._wake.set()
        return delivery_id

    async def outcome(self, delivery_id: str) -> dict[str, Any] | None:
        """What became of a delivery; None if unknown or past retention. `RegistryUnavailable`
        while Redis is unreachable."""
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.hgetall(delivery_key(self._prefix, delivery_id))
                pipe.zscore(self._due, delivery_id)
                raw, score = await pipe.execute()
        except REDIS_UNREACHABLE as exc:
            self._down(exc)
            raise RegistryUnavailable(str(exc)) from exc
        self._up()
        if not raw:
            return None
        data = {text(k): text(v) for k, v in raw.items()}

        def number(name: str) -> float | None:
            value = data.get(name, "")
            return float(value) if value else None

        status = data.get("last_status", "")
        return {
            "delivery_id": delivery_id,
            "call_id": data.get("call_id"),
            "event": data.get("event"),
            "state": data.get("state"),
            "attempts": int(data.get("attempts", "0")),
            "last_status": int(status) if status else None,
            "last_error": data.get("last_error") or None,
            "enqueued_at": number("enqueued_at"),
            "last_attempt_at": number("last_attempt_at"),
            "next_attempt_at": float(score) if score is not None else None,
            "delivered_at": number("delivered_at"),
            "failed_at": number("failed_at"),
        }

    # -- the delivery loop ---------------------------------------------------------------------

    async def run(self) -> None:
        """Deliver, forever (until cancelled): take due deliveries, POST them, record each
        outcome or the next attempt. Cancelling it drops the sends in flight; their leases run
        out and any worker sends them again."""
        if self._running:
            raise RuntimeError("this outbox is already running")
        self._running = True
        sending: set[asyncio.Task[None]] = set()

        def done(task: asyncio.Task[None]) -> None:
            sending.discard(task)
            self._wake.set()

        outage_s = 0.0
        try:
            while not_cancelled():
                self._wake.clear()
                free = self.settings.concurrency - len(sending)
                try:
                    claimed = await self._claim(free) if free > 0 else []
                    wait_s = POLL_S if free <= 0 or claimed else await self._until_due()
                except REDIS_UNREACHABLE as exc:
                    self._down(exc)
                    outage_s = min(POLL_S, max(0.05, outage_s * 2))
                    await asyncio.sleep(outage_s)
                    continue
                except RedisError:
                    log.exception("webhook: could not take due deliveries")
                    await asyncio.sleep(POLL_S)
                    continue
                self._up()
                outage_s = 0.0
                for delivery in claimed:
                    task = asyncio.create_task(self._attempt(delivery))
                    sending.add(task)
                    task.add_done_callback(done)
                if claimed and len(claimed) < free:
                    continue  # look again: some may have gone to another worker
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait_s):
                        await self._wake.wait()
        finally:
            self._running = False
            for task in sending:
                task.cancel()
            await asyncio.gather(*sending, return_exceptions=True)

    async def _claim(self, limit: int) -> list[_Claimed]:
        now = self._clock()
        due = await self.redis.zrangebyscore(self._due, "-inf", repr(now), start=0, num=limit)
        ids = [text(cast(str, i)) for i in due]
        if not ids:
            return []
        token = f"{self.worker_id}:{uuid.uuid4().hex[:12]}"
        keys = [self._due, *(delivery_key(self._prefix, i) for i in ids)]
        args = [repr(now), repr(now + self.settings.lease), token, self.worker_id, *ids]
        rows = await self._claim_script(keys=keys, args=args)
        return [
            _Claimed(
                delivery_id=text(row[0]),
                call_id=text(row[1] or ""),
                event=text(row[2] or CALL_ENDED),
                body=row[3].encode() if isinstance(row[3], str) else bytes(row[3] or b""),
                enqueued_at=float(row[4] or now),
                attempts=int(row[5]),
                token=token,
            )
            for row in rows
        ]

    async def _until_due(self) -> float:
        """Seconds until the next delivery falls due (or a lease ends), at most `POLL_S`."""
        first = await self.redis.zrange(self._due, 0, 0, withscores=True)
        if not first:
            return POLL_S
        return min(POLL_S, max(0.01, float(first[0][1]) - self._clock()))

    async def _attempt(self, delivery: _Claimed) -> None:
        try:
            answer = await self._send(delivery)
            await self._settle(delivery, answer)
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug must not end the loop; the lease sends it again
            log.exception("webhook: delivery %s failed unexpectedly", delivery.delivery_id)

    async def _send(self, delivery: _Claimed) -> Answer:
        headers = {
            SIGNATURE_HEADER: sign(self._secret, delivery.body, int(time.time())),
            DELIVERY_HEADER: delivery.delivery_id,
            EVENT_HEADER: delivery.event,
            CALL_ID_HEADER: delivery.call_id,
        }
        return await post(
            self._client, self._url, delivery.body, headers, self.settings.timeout_s, self._clock
        )

    async def _settle(self, delivery: _Claimed, answer: Answer) -> None:
        """Decide what the answer means, log it, record it."""
        settings, now, status = self.settings, self._clock(), answer.status
        fields = {"last_status": "" if status is None else str(status)}
        fields["last_error"] = answer.error or ""
        next_at: float | None = None
        what = f"HTTP {status}" if status is not None else (answer.error or "no answer")
        kind: Outcome = "retried"
        if status is not None and 200 <= status < 300:
            fields |= {"state": "delivered", "delivered_at": repr(now)}
            outcome, kind = f"delivered ({what})", "delivered"
        elif status is not None and not (status in _RETRYABLE or status >= 500):
            fields |= {"state": "failed", "failed_at": repr(now)}
            outcome, kind = f"failed ({what}), not retried", "rejected"
        else:
            deadline = delivery.enqueued_at + settings.give_up_after_s
            if now >= deadline:
                fields |= {"state": "failed", "failed_at": repr(now)}
                outcome, kind = f"{what}; gave up after {delivery.attempts} attempts", "given_up"
            else:
                backoff = settings.first_retry_s * 2 ** min(delivery.attempts - 1, 60)
                delay = min(settings.max_retry_s, backoff) * (1 - JITTER * random.random())
                delay = max(delay, answer.retry_after_s or 0.0)
                next_at = min(now + delay, deadline)
                outcome = f"{what}; next attempt in {next_at - now:.2f} s"
        log_at = logging.INFO if fields.get("state") == "delivered" else logging.WARNING
        log.log(
            log_at,
            "webhook: call %s, delivery %s, attempt %d: %s",
            delivery.call_id,
            delivery.delivery_id,
            delivery.attempts,
            outcome,
        )
        keys = [self._due, delivery_key(self._prefix, delivery.delivery_id)]
        args: Args = [
            delivery.delivery_id,
            delivery.token,
            "" if next_at is None else repr(next_at),
            settings.retention_s,
            *(p for kv in fields.items() for p in kv),
        ]
        if not await self._until_written(lambda: self._finish(keys=keys, args=args)):
            log.warning(
                "webhook: delivery %s was taken again meanwhile; its outcome is recorded there",
                delivery.delivery_id,
            )
            kind = "superseded"
        if self._on_outcome is not None:
            self._on_outcome(kind)

    async def _until_written(self, write: Callable[[], Any]) -> Any:
        """`await write()`, again and again while Redis is unreachable ("writes wait")."""
        delay = 0.05
        while True:
            try:
                result = await write()
            except REDIS_UNREACHABLE as exc:
                self._down(exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, POLL_S)
                continue
            self._up()
            return result

    def _up(self) -> None:
        if not self.healthy:
            log.info("webhook: Redis reachable again")
        self.healthy = True

    def _down(self, exc: BaseException) -> None:
        if self.healthy:
            log.warning("webhook: Redis unreachable (%s); deliveries wait", exc)
        self.healthy = False

"""Post-call webhooks (`voice.cluster.webhooks`) against a real `redis-server` and a real HTTP
receiver (Starlette under uvicorn on a free loopback port) that checks every signature with
`voice.agents.http_tools.verify`.

Every test gets its own key prefix on the module's Redis; the outage test has a Redis of its
own to stop and start; the crash test runs two real `hotline serve` workers and SIGKILLs one.
Waits poll the receiver or an outcome (`tests.support.poll.until`), bounded; no duration is
asserted, only orderings the design promises (a retry comes no sooner than the receiver's
Retry-After; a crashed worker's delivery goes out again no sooner than its lease).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from pipeline.llm.client import ChatMessage
from pipeline.records import TurnRecord
from tests.support.media_line import serving_on_loopback
from tests.support.poll import PollTimeout, until
from tests.support.redis_server import RedisServer
from tests.support.server import free_port, start_server, stop_server
from voice.agents.http_tools import verify
from voice.cluster.records import RegistrySettings, RegistryUnavailable, WorkerInfo
from voice.cluster.registry import CallRegistry
from voice.cluster.store import connect
from voice.cluster.webhook_store import MAX_BODY_BYTES, delivery_key, due_key, json_body
from voice.cluster.webhooks import WebhookOutbox, WebhookSettings
from voice.devtools.twilio_call import place_twilio_call
from voice.server.after_call import AfterCall, fitted
from voice.server.call_records import CallRecord

pytestmark = pytest.mark.timeout(60)

SECRET = "whsec-test-0123456789"
WAIT_S = 15.0  # generous: a loaded 2-core runner
DOCUMENT: dict[str, Any] = {
    "event": "call.ended",
    "call_id": "call-1",
    "caller": "+15551230000",
    "state": "ended",
    "turns": [{"caller_text": "Bonjour, ça va ?", "reply_text": "Très bien."}],
}


# -- the receiver ------------------------------------------------------------------------------


@dataclass
class Received:
    delivery_id: str
    event: str
    call_id: str
    headers: dict[str, str]
    body: bytes
    signed: bool  # the signature verified
    at: float  # time.time() on arrival
    path: str  # /hooks, or /hooks/<worker> (the live crash test gives each worker its own)


@dataclass
class Receiver:
    """Records every request; answers the scripted `answers` in turn, then 200. The next
    `hold` requests wait for `release` before they are answered."""

    port: int = 0
    received: list[Received] = field(default_factory=list)
    answers: list[tuple[int, dict[str, str]]] = field(default_factory=list)
    hold: int = 0
    release: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks"

    def fail(self, *statuses: int, headers: dict[str, str] | None = None) -> None:
        self.answers += [(status, headers or {}) for status in statuses]

    async def arrived(self, count: int, within_s: float = WAIT_S) -> list[Received]:
        """The requests received, once there are `count` of them (fails with those there)."""

        def enough() -> list[Received] | None:
            return list(self.received) if len(self.received) >= count else None

        try:
            got: list[Received] | None = await until(
                enough, f"{count} request(s) at the receiver", within_s
            )
        except PollTimeout as timeout:
            seen = [(r.path, r.delivery_id, r.signed) for r in self.received]
            raise AssertionError(f"{timeout}; it received {seen}") from None
        assert got is not None
        return got

    async def handle(self, request: Request) -> Response:
        raw = await request.body()
        headers = dict(request.headers)
        signature = headers.get("x-hotline-signature", "")
        seen = Received(
            delivery_id=headers.get("x-hotline-delivery", ""),
            event=headers.get("x-hotline-event", ""),
            call_id=headers.get("x-hotline-call-id", ""),
            headers=headers,
            body=raw,
            signed=verify(SECRET.encode(), signature, raw, now=time.time()),
            at=time.time(),
            path=request.url.path,
        )
        self.received.append(seen)
        if not seen.signed:
            return PlainTextResponse("bad signature", status_code=401)
        if self.hold:
            self.hold -= 1
            await self.release.wait()
        status, extra = self.answers.pop(0) if self.answers else (200, {})
        return PlainTextResponse(f"answer {status}", status_code=status, headers=extra)


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    state = Receiver()
    routes = [Route(path, state.handle, methods=["POST"]) for path in ("/hooks", "/hooks/{who}")]
    app = Starlette(routes=routes)
    async with serving_on_loopback(app, log_level="warning", timeout_graceful_shutdown=5) as port:
        state.port = port
        try:
            yield state
        finally:
            state.release.set()  # held requests end, so shutdown does not wait on them


# -- outboxes ----------------------------------------------------------------------------------


@dataclass
class Worker:
    outbox: WebhookOutbox
    task: asyncio.Task[None] | None
    outcomes: list[str]  # what each attempt came to, as `on_outcome` was told (metrics)

    async def told(self, count: int) -> list[str]:
        """The attempts' outcomes once `count` were reported (each after its answer is
        recorded, so a moment after `settled` sees it in Redis)."""
        return await until(
            lambda: self.outcomes if len(self.outcomes) >= count else None,
            f"{count} outcome(s) reported",
            WAIT_S,
        )

    async def crash(self) -> None:
        """Stop its loop where it is, sends in flight and all (as a killed process would)."""
        assert self.task is not None and not self.task.done()
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


Start = Callable[..., Awaitable[Worker]]


@pytest.fixture
async def start(redis_server: RedisServer, receiver: Receiver) -> AsyncIterator[Start]:
    """Starts a worker's outbox (its own Redis and HTTP clients) on this test's prefix, with
    tiny backoffs; stops them all at the end, checking that no loop ended by itself."""
    prefix = f"test-{uuid.uuid4().hex[:8]}"
    workers: list[Worker] = []
    closers: list[Callable[[], Awaitable[None]]] = []

    async def start_(
        worker_id: str = "a",
        *,
        run: bool = True,
        redis_url: str | None = None,
        clock: Callable[[], float] = time.time,
        **changes: Any,
    ) -> Worker:
        options: dict[str, Any] = {
            "url": receiver.url,
            "secret": SECRET,
            "timeout_s": 5.0,
            "first_retry_s": 0.05,
            "max_retry_s": 0.2,
        }
        settings = WebhookSettings(**(options | changes))
        url = redis_url or redis_server.url
        client = connect(RegistrySettings(redis_url=url, socket_timeout_s=0.5))
        http = httpx.AsyncClient()
        closers.extend([client.aclose, http.aclose])
        outcomes: list[str] = []
        outbox = WebhookOutbox(
            client, prefix, settings, http, worker_id, clock=clock, on_outcome=outcomes.append
        )
        worker = Worker(outbox, asyncio.create_task(outbox.run()) if run else None, outcomes)
        workers.append(worker)
        return worker

    yield start_
    for worker in workers:
        if worker.task is not None and not worker.task.cancelled():
            assert not worker.task.done(), f"run() ended: {worker.task.result()}"
            worker.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker.task
    for close in closers:
        await close()


@dataclass
class Seen:
    """A delivery's outcome as a poll sees it: true once `ready`, shown as the outcome (so a
    poll that times out says what the outcome last was)."""

    outcome: dict[str, Any] | None
    ready: bool

    def __bool__(self) -> bool:
        return self.ready

    def __repr__(self) -> str:
        return repr(self.outcome)


async def outcome_once(
    outbox: WebhookOutbox, delivery_id: str, ready: Callable[[dict[str, Any]], bool], what: str
) -> dict[str, Any]:
    """The delivery's outcome, once `ready(outcome)`; fails with the last outcome seen."""

    async def check() -> Seen:
        outcome = await outbox.outcome(delivery_id)
        return Seen(outcome, outcome is not None and ready(outcome))

    seen: Seen = await until(check, f"delivery {delivery_id}: {what}", WAIT_S)
    assert seen.outcome is not None
    return seen.outcome


async def answered_once(outbox: WebhookOutbox, delivery_id: str) -> dict[str, Any]:
    """The outcome once the first attempt's answer is recorded."""
    return await outcome_once(
        outbox, delivery_id, lambda o: o["last_status"] is not None, "an answer recorded"
    )


async def settled(outbox: WebhookOutbox, delivery_id: str) -> dict[str, Any]:
    """The outcome once it is final (`delivered` or `failed`)."""
    return await outcome_once(
        outbox, delivery_id, lambda o: o["state"] != "pending", "delivered or failed"
    )


# -- settings ----------------------------------------------------------------------------------


def test_a_url_needs_a_secret_named_by_its_environment_variable() -> None:
    with pytest.raises(ValueError, match="HOTLINE_WEBHOOK__SECRET"):
        WebhookSettings(url="https://example.com/hooks")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="HOTLINE_WEBHOOK__SECRET"):
        WebhookSettings(url="https://example.com/hooks", secret="")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="lease_s"):
        WebhookSettings(timeout_s=10, lease_s=5)
    assert WebhookSettings().url is None  # no webhook: the default
    configured = WebhookSettings(url="https://example.com/h", secret=SECRET)  # type: ignore[arg-type]
    assert SECRET not in repr(configured) and configured.lease > configured.timeout_s


async def test_no_outbox_without_a_url() -> None:
    async with httpx.AsyncClient() as http:
        with pytest.raises(ValueError, match="no webhook URL"):
            WebhookOutbox(aioredis.Redis(), "p", WebhookSettings(), http, "a")


# -- deliveries --------------------------------------------------------------------------------


async def test_a_delivery_arrives_signed_with_the_exact_body_and_headers(
    start: Start, receiver: Receiver
) -> None:
    a = await start("a")
    delivery_id = await a.outbox.enqueue("call-1", DOCUMENT)
    outcome = await settled(a.outbox, delivery_id)

    [got] = receiver.received
    assert got.signed
    assert got.body == json.dumps(DOCUMENT, separators=(",", ":"), ensure_ascii=False).encode()
    assert got.body == json_body(DOCUMENT) and json.loads(got.body) == DOCUMENT
    assert (got.delivery_id, got.event, got.call_id) == (delivery_id, "call.ended", "call-1")
    assert got.headers["content-type"] == "application/json"
    assert got.headers["user-agent"].startswith("Hotline/")
    assert got.headers["x-hotline-signature"].startswith("t=")
    assert outcome["state"] == "delivered"
    assert (outcome["attempts"], outcome["last_status"], outcome["last_error"]) == (1, 200, None)
    assert outcome["call_id"] == "call-1" and outcome["delivery_id"] == delivery_id
    assert outcome["delivered_at"] is not None and outcome["failed_at"] is None
    assert outcome["next_attempt_at"] is None  # out of the due set

    # A final outcome is kept for the retention time, without its body.
    key = delivery_key(a.outbox._prefix, delivery_id)
    assert not await a.outbox.redis.hexists(key, "body")
    assert 0 < await a.outbox.redis.ttl(key) <= a.outbox.settings.retention_s
    assert await a.outbox.outcome("no-such-delivery") is None


async def test_a_document_that_is_too_big_or_not_json_is_refused_at_enqueue(
    start: Start,
) -> None:
    a = await start("a", run=False)
    with pytest.raises(ValueError, match="at most"):
        await a.outbox.enqueue("call-1", {"blob": "x" * MAX_BODY_BYTES})
    with pytest.raises(ValueError, match="JSON"):
        await a.outbox.enqueue("call-1", {"when": object()})
    with pytest.raises(ValueError, match="JSON"):
        await a.outbox.enqueue("call-1", {"score": float("nan")})
    assert await a.outbox.redis.zcard(due_key(a.outbox._prefix)) == 0
    # Just under the limit is fine.
    room = MAX_BODY_BYTES - len(json_body({"blob": ""}))
    assert await a.outbox.enqueue("call-1", {"blob": "x" * room})


async def test_a_receiver_failing_twice_gets_the_third_attempt(
    start: Start, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    receiver.fail(503, 503)
    a = await start("a")
    with caplog.at_level(logging.INFO, "voice.cluster.webhooks"):
        delivery_id = await a.outbox.enqueue("call-2", DOCUMENT)
        outcome = await settled(a.outbox, delivery_id)

    assert (outcome["state"], outcome["attempts"], outcome["last_status"]) == ("delivered", 3, 200)
    assert [r.delivery_id for r in receiver.received] == [delivery_id] * 3
    assert all(r.signed for r in receiver.received)
    assert len({r.body for r in receiver.received}) == 1  # the same bytes, re-signed each time
    lines = [r.getMessage() for r in caplog.records if r.name == "voice.cluster.webhooks"]
    attempts = [line for line in lines if delivery_id in line]
    assert len(attempts) == 3, lines  # one line per attempt
    assert all("call-2" in line for line in attempts)
    assert "HTTP 503" in attempts[0] and "delivered" in attempts[2]
    assert SECRET not in caplog.text
    assert await a.told(3) == ["retried", "retried", "delivered"]


async def test_a_429_retry_after_is_honoured(start: Start, receiver: Receiver) -> None:
    receiver.fail(429, headers={"Retry-After": "1"})
    a = await start("a")
    delivery_id = await a.outbox.enqueue("call-3", DOCUMENT)
    outcome = await settled(a.outbox, delivery_id)
    assert (outcome["state"], outcome["attempts"]) == ("delivered", 2)
    first, second = receiver.received
    assert second.at - first.at >= 1.0  # not before the receiver said (tiny backoff otherwise)


async def test_a_timeout_is_retried(start: Start, receiver: Receiver) -> None:
    receiver.hold = 1  # the first request is never answered in time
    a = await start("a", timeout_s=0.3)
    delivery_id = await a.outbox.enqueue("call-4", DOCUMENT)
    outcome = await settled(a.outbox, delivery_id)
    assert (outcome["state"], outcome["attempts"], outcome["last_status"]) == ("delivered", 2, 200)
    assert [r.delivery_id for r in receiver.received] == [delivery_id] * 2


async def test_a_400_fails_at_once(start: Start, receiver: Receiver) -> None:
    receiver.fail(400)
    a = await start("a")
    delivery_id = await a.outbox.enqueue("call-5", DOCUMENT)
    outcome = await settled(a.outbox, delivery_id)
    assert (outcome["state"], outcome["attempts"], outcome["last_status"]) == ("failed", 1, 400)
    assert outcome["last_error"] == "HTTP 400: answer 400"
    assert outcome["failed_at"] is not None and outcome["delivered_at"] is None
    assert len(receiver.received) == 1
    assert await a.told(1) == ["rejected"]


async def test_retrying_gives_up_after_the_bounded_time(start: Start, receiver: Receiver) -> None:
    """The outbox's clock jumps a day ahead between two failed attempts."""
    receiver.fail(*[503] * 10)
    ahead = [0.0]
    give_up_s = 24 * 3600

    def clock() -> float:
        return time.time() + ahead[0]

    a = await start("a", clock=clock, first_retry_s=60.0, max_retry_s=120.0)
    delivery_id = await a.outbox.enqueue("call-6", DOCUMENT)
    pending = await answered_once(a.outbox, delivery_id)
    assert pending["state"] == "pending" and pending["last_status"] == 503
    assert pending["next_attempt_at"] > pending["last_attempt_at"] + 60 * 0.75 - 1e-6  # backoff

    ahead[0] = give_up_s + 60.0
    outcome = await settled(a.outbox, delivery_id)
    assert (outcome["state"], outcome["attempts"], outcome["last_status"]) == ("failed", 2, 503)
    assert outcome["failed_at"] - outcome["enqueued_at"] >= give_up_s
    assert len(receiver.received) == 2
    assert await a.told(2) == ["retried", "given_up"]


async def test_an_unreachable_receiver_is_retried_until_given_up(start: Start) -> None:
    closed = f"http://127.0.0.1:{free_port()}/hooks"
    a = await start("a", url=closed, give_up_after_s=0.5)
    delivery_id = await a.outbox.enqueue("call-7", DOCUMENT)
    outcome = await settled(a.outbox, delivery_id)
    assert outcome["state"] == "failed" and outcome["attempts"] >= 2
    assert outcome["last_status"] is None
    assert outcome["last_error"] == "the receiver could not be reached"


# -- several workers ---------------------------------------------------------------------------


async def test_a_worker_that_crashes_mid_send_leaves_it_to_another_after_the_lease(
    start: Start, receiver: Receiver
) -> None:
    receiver.hold = 1
    a = await start("a", timeout_s=2.0, lease_s=2.5)
    delivery_id = await a.outbox.enqueue("call-8", DOCUMENT)
    await receiver.arrived(1)  # a's send is in flight
    lease_until = await a.outbox.redis.zscore(due_key(a.outbox._prefix), delivery_id)
    await a.crash()

    b = await start("b", timeout_s=2.0, lease_s=2.5)
    await receiver.arrived(2)
    outcome = await settled(b.outbox, delivery_id)

    first, second = receiver.received
    assert first.delivery_id == second.delivery_id == delivery_id  # the receiver de-duplicates
    assert first.body == second.body and second.signed
    assert lease_until is not None and second.at >= lease_until  # not before a's lease ended
    assert (outcome["state"], outcome["attempts"], outcome["last_status"]) == ("delivered", 2, 200)


async def test_an_answer_after_the_lease_is_superseded_by_the_worker_that_took_it(
    start: Start, receiver: Receiver
) -> None:
    """A's send is held past its lease (B's clock is past it), B takes the delivery and it is
    delivered; A's late answer is then not recorded, and reported as superseded."""
    receiver.hold = 1
    a = await start("a")
    delivery_id = await a.outbox.enqueue("call-13", DOCUMENT)
    await receiver.arrived(1)  # a's send is in flight, unanswered
    b = await start("b", clock=lambda: time.time() + a.outbox.settings.lease + 1.0)
    await receiver.arrived(2)
    assert await b.told(1) == ["delivered"]
    receiver.release.set()  # a's answer comes now, too late
    assert await a.told(1) == ["superseded"]
    outcome = await settled(a.outbox, delivery_id)
    assert (outcome["state"], outcome["attempts"], outcome["last_status"]) == ("delivered", 2, 200)


async def test_two_workers_never_send_the_same_attempt(start: Start, receiver: Receiver) -> None:
    a, b = await start("a", concurrency=4), await start("b", concurrency=4)
    ids = await asyncio.gather(
        *(
            (a if n % 2 else b).outbox.enqueue(f"call-{n}", {**DOCUMENT, "call_id": f"call-{n}"})
            for n in range(20)
        )
    )
    outcomes = [await settled(a.outbox, delivery_id) for delivery_id in ids]

    assert [o["state"] for o in outcomes] == ["delivered"] * 20
    assert [o["attempts"] for o in outcomes] == [1] * 20  # each claimed once, and final
    assert sorted(r.delivery_id for r in receiver.received) == sorted(ids)
    assert all(r.signed for r in receiver.received)
    by_id = {r.delivery_id: json.loads(r.body)["call_id"] for r in receiver.received}
    assert by_id == {d: f"call-{n}" for n, d in enumerate(ids)}


LEASE_S = 3.0  # the live crash test's HOTLINE_WEBHOOK__LEASE_S (over its 2 s timeout)


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_a_killed_workers_delivery_is_sent_again_by_another_after_its_lease(
    redis_server: RedisServer, receiver: Receiver
) -> None:
    """Two real `hotline serve` workers on one Redis. A call ends on X; X's delivery reaches the
    receiver, which holds it unanswered; X is SIGKILLed. Y sends the same delivery (same id,
    same bytes, signed) once X's lease has ended, not before, and the outcome in Redis becomes
    delivered. Each worker posts to its own path, so the receiver knows who sent. Y is stopped
    (SIGSTOP) until X's attempt has arrived, so X is the one that sends first."""
    prefix = f"crash-{uuid.uuid4().hex[:8]}"

    def env(who: str) -> dict[str, str]:
        return {
            "HOTLINE_REDIS_URL": redis_server.url,
            "HOTLINE_SESSIONS__KEY_PREFIX": prefix,
            "HOTLINE_WEBHOOK__URL": f"{receiver.url}/{who}",
            "HOTLINE_WEBHOOK__SECRET": SECRET,
            "HOTLINE_WEBHOOK__TIMEOUT_S": "2",
            "HOTLINE_WEBHOOK__LEASE_S": str(LEASE_S),
        }

    receiver.hold = 1  # X's attempt is never answered
    x, y = await asyncio.gather(
        asyncio.to_thread(start_server, env("x")), asyncio.to_thread(start_server, env("y"))
    )
    client = connect(RegistrySettings(redis_url=redis_server.url, socket_timeout_s=2.0))
    try:
        y.process.send_signal(signal.SIGSTOP)
        stream = x.url.replace("http://", "ws://") + "/twilio/stream"
        call = await place_twilio_call(stream, [])  # connects, then hangs up: the call ends on X
        first = (await receiver.arrived(1))[0]
        lease_until = await client.zscore(due_key(prefix), first.delivery_id)
        x.process.kill()  # SIGKILL, its send in flight
        assert await asyncio.to_thread(x.process.wait, 10) == -signal.SIGKILL
        y.process.send_signal(signal.SIGCONT)

        first, second = (await receiver.arrived(2, within_s=LEASE_S + WAIT_S))[:2]
        async with httpx.AsyncClient() as http:
            settings = WebhookSettings.model_validate({"url": receiver.url, "secret": SECRET})
            reader = WebhookOutbox(client, prefix, settings, http, "reader")  # reads outcomes
            outcome = await settled(reader, first.delivery_id)
    finally:
        if y.process.poll() is None:
            y.process.send_signal(signal.SIGCONT)
        if x.process.poll() is None:
            x.process.kill()
        code = await asyncio.to_thread(stop_server, y)
        await client.aclose()
    # Not before X's lease ended: the lease X took in Redis, and as measured from X's attempt
    # (which came a moment after X took it).
    after_s = second.at - first.at
    again = f"attempt 2 ({second.path}) {after_s:.2f} s after attempt 1 ({first.path})"
    assert after_s >= LEASE_S - 0.5, f"{again}: before the {LEASE_S:g} s lease ended"
    assert lease_until is not None and second.at >= lease_until, (second.at, lease_until)
    assert (first.path, second.path) == ("/hooks/x", "/hooks/y"), again
    assert first.call_id == second.call_id == call.call_id and first.event == "call.ended"
    assert first.delivery_id == second.delivery_id  # what the receiver de-duplicates on
    assert first.signed and second.signed and first.body == second.body
    assert json.loads(second.body)["call"]["call_id"] == call.call_id
    assert (outcome["state"], outcome["attempts"], outcome["last_status"]) == ("delivered", 2, 200)
    assert len(receiver.received) == 2
    assert code == 0, "\n".join(y.log[-40:])


# -- Redis -------------------------------------------------------------------------------------


async def test_a_redis_outage_does_not_end_the_loop(
    start: Start, receiver: Receiver, tmp_path: Path
) -> None:
    own = RedisServer(data_dir=tmp_path)
    own.start()
    try:
        a = await start("a", redis_url=own.url)
        before = await a.outbox.enqueue("call-9", DOCUMENT)
        assert (await settled(a.outbox, before))["state"] == "delivered"

        own.stop()
        enqueueing = asyncio.create_task(a.outbox.enqueue("call-10", DOCUMENT))  # waits

        await until(lambda: not a.outbox.healthy, "the outbox to see Redis down", WAIT_S)
        with pytest.raises(RegistryUnavailable):
            await a.outbox.outcome(before)  # reads fail
        with pytest.raises(RegistryUnavailable):
            await a.outbox.enqueue("call-11", DOCUMENT, wait_s=0.2)  # bounded, nothing stored
        assert a.task is not None and not a.task.done() and not enqueueing.done()

        own.start()  # same port, same append-only file
        during = await asyncio.wait_for(enqueueing, WAIT_S)
        outcome = await settled(a.outbox, during)
        assert (outcome["state"], outcome["attempts"]) == ("delivered", 1)
        assert (await settled(a.outbox, before))["state"] == "delivered"  # kept across restart
        assert a.outbox.healthy and not a.task.done()
        assert [r.call_id for r in receiver.received] == ["call-9", "call-10"]
    finally:
        own.stop()


async def test_an_idle_loop_does_not_spin(start: Start, receiver: Receiver) -> None:
    """Nothing due for a while (a Retry-After far ahead): a few Redis commands a second."""
    receiver.fail(503, headers={"Retry-After": "3600"})
    a = await start("a")
    delivery_id = await a.outbox.enqueue("call-12", DOCUMENT)
    pending = await answered_once(a.outbox, delivery_id)
    assert pending["next_attempt_at"] > pending["last_attempt_at"] + 3000  # the Retry-After
    stats = a.outbox.redis
    before = int((await stats.info("stats"))["total_commands_processed"])
    await asyncio.sleep(1.5)  # an observation window, not a synchronisation
    after = int((await stats.info("stats"))["total_commands_processed"])
    assert after - before < 30, after - before  # a spinning loop would make thousands
    assert len(receiver.received) == 1


# -- a long call's document ----------------------------------------------------------------------


def long_call(turns: int, words: int) -> CallRecord:
    """An ended call of `turns` turns, each of `words` words each way."""
    records = [
        TurnRecord(
            turn=n,
            caller_text=f"caller turn {n}: " + "word " * words,
            reply_text=f"reply turn {n}: " + "answer " * words,
            generated_text=f"reply turn {n}: " + "answer " * words,
            interrupted=False,
            effort=None,
            service_tier_requested=None,
            service_tier_served=None,
            reason="test",
            timings_ms={"first_audio": 600.0},
        )
        for n in range(1, turns + 1)
    ]
    history = [
        ChatMessage(role, f"{role} turn {n}: " + "said " * words)
        for n in range(1, turns + 1)
        for role in ("user", "assistant")
    ]
    return CallRecord(
        call_id=f"CA{uuid.uuid4().hex}",
        transport="twilio",
        caller="+15551230000",
        callee="+15559870000",
        started_at=time.time() - 3600,
        ended_at=time.time(),
        wants_human=False,
        experiment=None,
        arm=None,
        end_reason="stop: stream stopped",
        records=tuple(records),
        history=tuple(history),
    )


@pytest.fixture
async def sessions(redis_server: RedisServer) -> AsyncIterator[CallRegistry]:
    settings = RegistrySettings(redis_url=redis_server.url, key_prefix=f"t-{uuid.uuid4().hex[:8]}")
    registry = await CallRegistry.open(settings, WorkerInfo("a"))
    yield registry
    await registry.close()


async def test_a_long_calls_document_goes_truncated_signed_and_links_the_whole(
    start: Start, receiver: Receiver, sessions: CallRegistry
) -> None:
    a = await start("a")
    after = AfterCall(sessions, None, a.outbox, public_url="https://voice.example.com/")
    record = long_call(turns=600, words=100)  # about 2 MB
    whole: dict[str, Any] = {"event": "call.ended", "call": record.detail(), "recording": None}
    assert len(json_body(whole)) > 2 * MAX_BODY_BYTES
    await after.finish(record)
    await receiver.arrived(1)

    [got] = receiver.received
    assert got.signed and got.call_id == record.call_id and got.event == "call.ended"
    assert got.delivery_id == after.webhook_deliveries[record.call_id]
    assert 0.9 * MAX_BODY_BYTES < len(got.body) <= MAX_BODY_BYTES  # cut to fit, not far below
    document = json.loads(got.body)
    truncation = document.pop("truncation")
    assert document.pop("truncated") is True
    assert truncation["url"] == f"https://voice.example.com/calls/{record.call_id}"
    assert (truncation["bytes"], truncation["limit"]) == (len(json_body(whole)), MAX_BODY_BYTES)
    # Turns left out of the middle: the first and the last kept, counted, the gap placed.
    records = document["call"]["records"]
    cut = truncation["records"]
    assert cut["kept"] == len(records) and cut["kept"] + cut["left_out"] == 600
    assert 0 < cut["after"] < len(records)
    head, tail = records[: cut["after"]], records[cut["after"] :]
    assert [r["turn"] for r in head] == list(range(1, len(head) + 1))
    assert [r["turn"] for r in tail] == list(range(601 - len(tail), 601))
    history = document["call"]["history"]
    cut = truncation["history"]
    assert cut["kept"] == len(history) and cut["kept"] + cut["left_out"] == 1200
    assert history[0]["content"].startswith("user turn 1:")
    assert history[-1]["content"].startswith("assistant turn 600:")
    # Everything else is as it was.
    for name in ("records", "history"):
        del document["call"][name], whole["call"][name]
    assert document == whole


async def test_a_short_calls_document_goes_whole(
    start: Start, receiver: Receiver, sessions: CallRegistry
) -> None:
    a = await start("a")
    after = AfterCall(sessions, None, a.outbox)
    record = long_call(turns=3, words=5)
    await after.finish(record)
    await receiver.arrived(1)
    document = json.loads(receiver.received[0].body)
    assert document == {"event": "call.ended", "call": record.detail(), "recording": None}
    assert "truncated" not in document


def test_fitting_keeps_both_ends_of_each_list_and_never_passes_the_limit() -> None:
    document = {"event": "call.ended", "call": long_call(turns=50, words=20).detail()}
    size = len(json_body(document))
    assert fitted(document, size, "/calls/x") is document  # it fits: the same document
    for limit in (size - 1, size // 2, size // 10, 2_000):
        cut = fitted(document, limit, "/calls/x")
        assert len(json_body(cut)) <= limit
        for name, count in (("records", 50), ("history", 100)):
            kept, left_out = cut["truncation"][name]["kept"], cut["truncation"][name]["left_out"]
            assert kept == len(cut["call"][name]) and kept + left_out == count
            assert left_out > 0 or limit == size - 1

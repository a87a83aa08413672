"""Two Hotline workers on one real `redis-server`: the cluster as callers and the API see it.

Workers A and B (real `hotline serve` processes, API token set, cluster limit 5, heartbeat
0.5 s, worker TTL 1.5 s) are started once for the module on a Redis with an append-only file;
the destructive tests (SIGKILL, SIGTERM) start a worker of their own next to them. The caller is
the faithful Twilio phone (`voice.devtools.phone_caller.TwilioPhone`) speaking natural test
speech. Waits are on conditions, bounded; the only timing asserted is the issue's "lost within
twice the
worker TTL" after a SIGKILL.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import re
import signal
import subprocess
import time
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
import numpy as np
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.support.redis_server import RedisServer
from tests.support.server import Server, start_server
from tests.support.speech import concat, piper, silence
from voice.devtools.phone_caller import DEFAULT_CALLEE, DEFAULT_CALLER, TwilioPhone, twilio_sid
from voice.devtools.turns import first_audible_after, silent_for_after, voiced_span
from voice.transports.phone.twilio import (
    CALLEE_PARAMETER,
    CALLER_PARAMETER,
    SIGNATURE_HEADER,
    twilio_signature,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

TOKEN = "cluster-api-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TWILIO_TOKEN = "cluster-twilio-auth-token"
HEARTBEAT_S, TTL_S = 0.5, 1.5
CLUSTER_LIMIT = 5
OUTAGE_S = 5.0

FIRST = "Please book a table for two people tonight."
SECOND = "What will the weather be like in Paris tomorrow?"
THIRD = "Thank you, that is all for today."

T = TypeVar("T")


def utterance(text: str) -> np.ndarray:
    return concat(silence(300), piper(text), silence(200))


@dataclass
class Worker:
    server: Server
    worker_id: str

    @property
    def url(self) -> str:
        return self.server.url

    def ws(self, path: str) -> str:
        return self.server.url.replace("http://", "ws://") + path

    def http(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, headers=AUTH, timeout=10)


def start_worker(redis: RedisServer) -> Worker:
    server = start_server(
        {
            "HOTLINE_REDIS_URL": redis.url,
            "HOTLINE_API_TOKEN": TOKEN,
            "HOTLINE_TELEPHONY__TWILIO_AUTH_TOKEN": TWILIO_TOKEN,
            "HOTLINE_SESSIONS__HEARTBEAT_S": str(HEARTBEAT_S),
            "HOTLINE_SESSIONS__WORKER_TTL_S": str(TTL_S),
            "HOTLINE_SESSIONS__CLUSTER_LIMIT": str(CLUSTER_LIMIT),
        }
    )
    found = [m for line in server.log if (m := re.search(r"Hotline ready: worker (\S+),", line))]
    assert found, "\n".join(server.log[-40:])
    return Worker(server, found[0].group(1))


def stop_worker(worker: Worker) -> int:
    process = worker.server.process
    if process.poll() is None:
        process.terminate()
        try:
            return process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait()


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    # An append-only file, fsynced on every write: a restart keeps what was written.
    server = RedisServer(data_dir=tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def workers(redis_server: RedisServer) -> Iterator[tuple[Worker, Worker]]:
    with ThreadPoolExecutor(2) as pool:
        started = list(pool.map(lambda _: start_worker(redis_server), range(2)))
    a, b = started
    assert a.worker_id != b.worker_id
    yield a, b
    codes = [stop_worker(w) for w in (a, b)]
    assert codes == [0, 0], "\n".join(a.server.log[-30:] + b.server.log[-30:])


@pytest.fixture
def extra_worker(redis_server: RedisServer) -> Iterator[Worker]:
    """A fresh third worker for a test that kills or drains it."""
    worker = start_worker(redis_server)
    yield worker
    if worker.server.process.poll() is None:
        worker.server.process.kill()
        worker.server.process.wait()


# -- helpers ---------------------------------------------------------------------------------


def signed(worker: Worker, form: dict[str, str]) -> dict[str, str]:
    """Twilio's signature header for a webhook `form` posted to `worker`."""
    url = worker.url + "/twilio/voice"
    return {SIGNATURE_HEADER: twilio_signature(TWILIO_TOKEN, url, form)}


async def eventually(check: Callable[[], Awaitable[T | None]], timeout_s: float, what: str) -> T:
    """The first truthy `check()`; fails after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await check()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        await asyncio.sleep(0.05)


async def new_phone(worker: Worker, socket: ClientConnection) -> TwilioPhone:
    """A Twilio phone whose stream carries a token (any worker issues it, for any worker)."""
    call_sid = twilio_sid("CA")
    async with worker.http() as http:
        asked = {"provider": "twilio", "call_id": call_sid}
        token = (await http.post("/phone/stream-token", json=asked)).json()["token"]
    numbers = {CALLER_PARAMETER: DEFAULT_CALLER, CALLEE_PARAMETER: DEFAULT_CALLEE}
    return TwilioPhone(socket, call_sid, twilio_sid("AC"), {**numbers, "token": token})


@contextlib.asynccontextmanager
async def phone_call(worker: Worker) -> AsyncIterator[TwilioPhone]:
    """A Twilio media stream to `worker`, its 20 ms clock running; hangs up at the end."""
    async with connect(worker.ws("/twilio/stream"), compression=None, open_timeout=10) as socket:
        phone = await new_phone(worker, socket)
        await phone.open()
        parts = [asyncio.create_task(phone.run()), asyncio.create_task(phone.listen())]
        try:
            yield phone
        finally:
            with contextlib.suppress(ConnectionClosed):
                await phone.hang_up()
            for part in parts:
                part.cancel()
            await asyncio.gather(*parts, return_exceptions=True)


async def speak(phone: TwilioPhone, text: str, timeout_s: float = 40.0) -> tuple[float, float]:
    """Say `text` as one turn; when its reply started and stopped playing at the phone."""
    pcm = utterance(text)
    sent = await phone.say(pcm)
    speech_end = sent[voiced_span(pcm)[1]] + 0.02
    start = await phone.hear(first_audible_after(speech_end), timeout_s)
    assert start is not None, f"no reply to {text!r}"
    stop = await phone.hear(silent_for_after(start, 2.0), timeout_s)
    assert stop is not None, f"the reply to {text!r} never ended"
    return start, stop


async def listed(http: httpx.AsyncClient, call_id: str) -> dict[str, Any] | None:
    response = await http.get("/calls")
    assert response.status_code == 200, response.text
    calls = {c["call_id"]: c for c in response.json()["calls"]}
    return calls.get(call_id)


async def recorded(http: httpx.AsyncClient, call_id: str) -> dict[str, Any] | None:
    """The call as listed, once its record (written just after admission) is in Redis."""
    call = await listed(http, call_id)
    return call if call is not None and call["transport"] else None


async def detail(http: httpx.AsyncClient, call_id: str) -> dict[str, Any]:
    response = await http.get(f"/calls/{call_id}")
    assert response.status_code == 200, response.text
    found: dict[str, Any] = response.json()
    return found


def has_state(http: httpx.AsyncClient, call_id: str, state: str) -> Callable[[], Awaitable[Any]]:
    async def check() -> dict[str, Any] | None:
        found = await detail(http, call_id)
        return found if found["state"] == state else None

    return check


def has_turns(http: httpx.AsyncClient, call_id: str, turns: int) -> Callable[[], Awaitable[Any]]:
    async def check() -> dict[str, Any] | None:
        found = await detail(http, call_id)
        return found if len(found["records"]) >= turns else None

    return check


async def open_stream(worker: Worker) -> tuple[ClientConnection, TwilioPhone]:
    """A raw Twilio media stream that sends `connected` and `start`, then nothing."""
    socket = await connect(worker.ws("/twilio/stream"), compression=None, open_timeout=10)
    return socket, await new_phone(worker, socket)


async def refused(socket: ClientConnection, timeout_s: float = 10.0) -> int | None:
    """The close code once the server closes the socket."""
    await asyncio.wait_for(socket.wait_closed(), timeout_s)
    return socket.close_code


def words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower()))


def caller_words(record: dict[str, Any]) -> set[str]:
    return words(str(record["caller_text"]))


# -- the tests -------------------------------------------------------------------------------


def test_token_unknown_calls_and_bad_bodies_on_both_workers(workers: tuple[Worker, ...]) -> None:
    for worker in workers:
        with httpx.Client(base_url=worker.url, timeout=10) as http:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
                for method, path in (
                    ("GET", "/calls"),
                    ("GET", "/calls/no-such-call"),
                    ("POST", "/calls/no-such-call/hangup"),
                    ("POST", "/calls/no-such-call/say"),
                ):
                    response = http.request(method, path, headers=headers, json={"text": "hi"})
                    assert response.status_code == 401, (worker.worker_id, method, path)
                    assert response.headers["www-authenticate"] == "Bearer"

            http.headers.update(AUTH)
            assert http.get("/calls").json() == {"calls": []}
            assert http.get("/calls/no-such-call").status_code == 404
            assert http.post("/calls/no-such-call/hangup").status_code == 404
            assert http.post("/calls/no-such-call/say", json={"text": "hello"}).status_code == 404
            for body in (b"{oops", b"[]", b'{"text": 3}', b'{"text": "  "}', b"{}", b"\xff"):
                response = http.post("/calls/no-such-call/say", content=body)
                assert response.status_code == 400, (worker.worker_id, body)
                assert "error" in response.json()


async def test_live_websocket_needs_the_token_and_a_known_call(workers: tuple[Worker, ...]) -> None:
    for worker in workers:
        for url, headers in (
            (worker.ws("/calls/no-such-call/live"), {}),
            (worker.ws("/calls/no-such-call/live?token=wrong"), {}),
            (worker.ws("/calls/no-such-call/live"), AUTH),  # authorized, unknown call
        ):
            with pytest.raises(InvalidStatus) as rejected:
                async with connect(url, additional_headers=headers, open_timeout=10):
                    pass
            assert rejected.value.response.status_code == 403, url


async def test_a_call_on_a_is_listed_watched_told_and_hung_up_from_b(
    workers: tuple[Worker, Worker],
) -> None:
    a, b = workers
    events: list[tuple[float, dict[str, Any]]] = []

    async def watch(live: ClientConnection) -> None:
        async for message in live:
            events.append((time.monotonic(), json.loads(message)))

    def seen(kind: str, **fields: Any) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            return any(
                e["type"] == kind and all(e.get(k) == v for k, v in fields.items())
                for _, e in events
            )

        return check

    async with a.http() as http_a, b.http() as http_b, phone_call(a) as phone:
        call_id = phone.call_sid
        on_b = await eventually(lambda: recorded(http_b, call_id), 10, "the call listed on B")
        assert on_b["worker_id"] == a.worker_id
        assert (on_b["state"], on_b["transport"], on_b["caller"]) == (
            "active",
            "twilio",
            DEFAULT_CALLER,
        )
        assert (await listed(http_a, call_id) or {}).get("worker_id") == a.worker_id

        live_url = b.ws(f"/calls/{call_id}/live")
        async with connect(live_url, additional_headers=AUTH, open_timeout=10) as live:
            watcher = asyncio.create_task(watch(live))
            await eventually(seen("state", state="active"), 10, "B's watcher caught up")

            _, reply_end = await speak(phone, FIRST)
            await eventually(seen("turn"), 10, "the turn event on B")
            caller_said = [
                (at, e) for at, e in events if e["type"] == "transcript" and e["role"] == "caller"
            ]
            assert caller_said and {"table", "tonight"} <= words(caller_said[0][1]["text"])
            # Live: B relayed what the caller said before the reply to it had finished playing.
            assert caller_said[0][0] < reply_end
            assert await seen("transcript", role="bot", turn=1)()
            turn_events = [e for _, e in events if e["type"] == "turn"]
            assert turn_events[0]["record"]["turn"] == 1

            # A malformed say is refused before it travels; a good one reaches A and is spoken.
            bad = await http_b.post(f"/calls/{call_id}/say", content=b'{"text": 7}')
            assert bad.status_code == 400
            asked_at = time.monotonic()
            said = await http_b.post(f"/calls/{call_id}/say", json={"text": "One moment please."})
            assert said.status_code == 200, said.text
            assert said.json() == {"call_id": call_id, "status": "speaking"}
            assert await phone.hear(first_audible_after(asked_at), 20) is not None

            hung = await http_b.post(f"/calls/{call_id}/hangup")
            assert hung.status_code == 200, hung.text
            assert hung.json() == {"call_id": call_id, "status": "hung up"}
            await asyncio.wait_for(phone.hung_up.wait(), 10)
            assert phone.socket.close_code == 1000
            assert phone.socket.protocol.close_rcvd_then_sent, "A closed the caller's socket"

            await asyncio.wait_for(watcher, 10)  # the live socket ends with the call
            assert live.close_code == 1000

        ended = await eventually(has_state(http_b, call_id, "ended"), 10, "ended, seen from B")
        assert ended["worker_id"] == a.worker_id and ended["ended_at"] is not None
        assert [r["turn"] for r in ended["records"]] == [1]
        assert await listed(http_b, call_id) is None
        assert (await http_b.post(f"/calls/{call_id}/hangup")).status_code == 404

    states = [e["state"] for _, e in events if e["type"] == "state"]
    assert states == ["active", "ended"]
    print(f"\nlive events on B: {[e['type'] for _, e in events]}")


async def test_a_caller_who_hangs_up_before_any_mark_still_leaves_the_turn(
    workers: tuple[Worker, Worker],
) -> None:
    a, b = workers
    async with b.http() as http_b:
        async with phone_call(a) as phone:
            call_id = phone.call_sid
            pcm = utterance(FIRST)
            sent = await phone.say(pcm)
            speech_end = sent[voiced_span(pcm)[1]] + 0.02
            assert await phone.hear(first_audible_after(speech_end), 40) is not None
            assert not phone.marks_echoed  # mid first sentence: the phone echoed no mark yet
        # leaving the block sent `stop`: the caller hung up while the reply was playing
        ended = await eventually(has_state(http_b, call_id, "ended"), 10, "the call ended")
        [record] = ended["records"]  # read back from Redis by the other worker
        assert {"table", "tonight"} <= caller_words(record)
        assert record["interrupted"] and record["reply_text"] == ""
        assert record["generated_text"].startswith("You said")
        assert ended["end_reason"] == "stop: stream stopped"


async def test_each_turn_is_one_live_event(workers: tuple[Worker, Worker]) -> None:
    a, b = workers
    async with b.http() as http_b, phone_call(a) as phone:
        call_id = phone.call_sid
        await speak(phone, FIRST)
        await eventually(has_turns(http_b, call_id, 1), 10, "the turn in the registry")
    types: list[str] = []
    async with connect(b.ws(f"/calls/{call_id}/live"), additional_headers=AUTH) as live:
        async for message in live:  # a late watcher replays the call, up to its end
            types.append(json.loads(message)["type"])
    assert types.count("turn") == 1, types


async def test_twenty_simultaneous_admissions_across_two_workers_admit_exactly_five(
    workers: tuple[Worker, Worker],
) -> None:
    a, b = workers
    opened = await asyncio.gather(*(open_stream(w) for w in (a, b) for _ in range(10)))
    closes = [asyncio.create_task(refused(socket, 60)) for socket, _ in opened]
    try:
        await asyncio.gather(*(phone.open() for _, phone in opened))  # all at once
        async with b.http() as http_b:

            async def settled() -> list[dict[str, Any]] | None:
                calls = (await http_b.get("/calls")).json()["calls"]
                closed = sum(task.done() for task in closes)
                enough = closed >= 20 - CLUSTER_LIMIT and len(calls) >= CLUSTER_LIMIT
                return calls if enough else None

            calls = await eventually(settled, 20, "15 refused and 5 admitted")
        codes = [task.result() for task in closes if task.done()]
        assert codes == [1013] * (20 - CLUSTER_LIMIT)
        admitted = {
            phone.call_sid
            for (_, phone), task in zip(opened, closes, strict=True)
            if not task.done()
        }
        assert admitted == {c["call_id"] for c in calls}
        per_worker = [sum(c["worker_id"] == w.worker_id for c in calls) for w in (a, b)]
        print(f"\nadmitted per worker (A, B): {per_worker}")
        assert sum(per_worker) == CLUSTER_LIMIT
    finally:
        for socket, _ in opened:
            await socket.close()
        for task in closes:
            task.cancel()
    async with a.http() as http_a, b.http() as http_b:
        for http in (http_a, http_b):
            await eventually(functools.partial(_no_calls, http), 20, "all admitted calls released")


async def _no_calls(http: httpx.AsyncClient) -> bool:
    return bool((await http.get("/calls")).json()["calls"] == [])


async def test_sigkill_marks_the_call_lost_within_twice_the_ttl_with_every_finished_turn(
    workers: tuple[Worker, Worker], extra_worker: Worker
) -> None:
    _, b = workers
    c = extra_worker
    async with c.http() as http_c, b.http() as http_b, phone_call(c) as phone:
        call_id = phone.call_sid
        for text in (FIRST, SECOND):
            await speak(phone, text)
        finished = await eventually(has_turns(http_c, call_id, 2), 10, "two turns done on C")
        on_b = await eventually(lambda: recorded(http_b, call_id), 10, "the call listed on B")
        assert on_b["worker_id"] == c.worker_id

        killed = time.time()  # C's last heartbeat came before this
        c.server.process.send_signal(signal.SIGKILL)
        lost = await eventually(has_state(http_b, call_id, "lost"), 4 * TTL_S + 5, "lost")
        # Timed by the reaper's own record (the same wall clock), not by this poll.
        took = lost["ended_at"] - killed
        print(f"\ncall marked lost {took:.2f} s after SIGKILL (TTL {TTL_S} s)")
        assert took <= 2 * TTL_S, f"marked lost {took:.2f} s after SIGKILL (TTL {TTL_S} s)"
        assert await asyncio.to_thread(c.server.process.wait, 10) == -signal.SIGKILL

    assert lost["worker_id"] == c.worker_id and lost["ended_at"] is not None
    assert lost["records"] == finished["records"]  # every turn finished before the kill, in order
    assert [r["turn"] for r in lost["records"]] == [1, 2]
    assert {"table", "tonight"} <= caller_words(lost["records"][0])
    assert {"weather", "tomorrow"} <= caller_words(lost["records"][1])
    async with b.http() as http_b:
        assert await listed(http_b, call_id) is None
        assert (await http_b.post(f"/calls/{call_id}/hangup")).status_code == 404
        states = []
        async with connect(b.ws(f"/calls/{call_id}/live"), additional_headers=AUTH) as live:
            async for message in live:  # a late watcher replays the call up to its end
                event = json.loads(message)
                if event["type"] == "state":
                    states.append(event["state"])
        assert states == ["active", "lost"]


async def test_sigterm_drains_one_worker_while_the_other_still_admits(
    workers: tuple[Worker, Worker], extra_worker: Worker
) -> None:
    _, b = workers
    d = extra_worker
    async with d.http() as http_d, b.http() as http_b:
        async with phone_call(d) as phone:
            call_id = phone.call_sid
            await speak(phone, FIRST)
            d.server.process.send_signal(signal.SIGTERM)

            async def draining() -> bool:
                return (await http_d.get("/readyz")).status_code == 503

            await eventually(draining, 10, "D's /readyz says draining")
            ready = await http_d.get("/readyz")
            assert ready.json() == {"status": "draining", "active_calls": 1}
            assert "\nhotline_draining 1.0\n" in (await http_d.get("/metrics")).text
            offer = await http_d.post("/offer", json={"sdp": "v=0", "type": "offer"})
            assert offer.status_code == 503
            form = {"CallSid": "CAx", "From": "+1"}
            webhook = await http_d.post("/twilio/voice", data=form, headers=signed(d, form))
            assert ET.fromstring(webhook.text).find("Hangup") is not None
            socket, late = await open_stream(d)
            async with socket:
                await late.open()
                assert await refused(socket) == 1013

            # B goes on: ready, its webhook answers with a stream, and it admits a call.
            assert (await http_b.get("/readyz")).status_code == 200
            form = {"CallSid": "CAy", "From": "+1"}
            webhook = await http_b.post("/twilio/voice", data=form, headers=signed(b, form))
            assert ET.fromstring(webhook.text).find("Connect/Stream") is not None
            socket, other = await open_stream(b)
            async with socket:
                await other.open()
                on_b = await eventually(lambda: recorded(http_b, other.call_sid), 10, "on B")
                assert on_b["worker_id"] == b.worker_id
            await eventually(lambda: _gone(http_b, other.call_sid), 10, "B's call ended")

            # The call in progress on D goes on to its end.
            await speak(phone, THIRD)
            assert (await listed(http_b, call_id) or {}).get("worker_id") == d.worker_id
        code = await asyncio.to_thread(d.server.process.wait, 30)
        assert code == 0, "\n".join(d.server.log[-30:])
        ended = await eventually(has_state(http_b, call_id, "ended"), 10, "ended, seen from B")
        assert [r["turn"] for r in ended["records"]] == [1, 2]


async def _gone(http: httpx.AsyncClient, call_id: str) -> bool:
    return await listed(http, call_id) is None


async def test_a_redis_outage_mid_call_loses_no_turn(
    workers: tuple[Worker, Worker], redis_server: RedisServer
) -> None:
    a, b = workers
    async with a.http() as http_a, b.http() as http_b, phone_call(a) as phone:
        call_id = phone.call_sid
        await speak(phone, FIRST)
        await eventually(has_turns(http_b, call_id, 1), 10, "turn 1 in Redis")

        redis_server.stop()
        stopped = time.monotonic()
        try:

            async def unavailable() -> bool:
                return (await http_b.get("/calls")).status_code == 503

            await eventually(unavailable, 10, "B's registry reads fail while Redis is down")
            during = asyncio.create_task(speak(phone, SECOND))  # spoken during the outage
            # Redis stays down OUTAGE_S: a duration of the scenario, not a wait for a condition.
            await asyncio.sleep(max(0.0, stopped + OUTAGE_S - time.monotonic()))
        finally:
            redis_server.start()
        restarted = time.monotonic()
        print(f"\nRedis was down for {restarted - stopped:.1f} s")
        reply_start, _ = await during  # the call went on: a reply to the turn spoken then
        print(f"reply to the turn spoken during the outage began {reply_start - stopped:.1f} s in")
        local = await detail(http_a, call_id)
        assert [r["turn"] for r in local["records"]] == [1, 2]

        await speak(phone, THIRD)  # and after it
        # A re-registers its call; nobody marked it lost; every turn is in the stream, in order.
        on_b = await eventually(lambda: recorded(http_b, call_id), 10, "the call listed on B")
        assert (on_b["worker_id"], on_b["state"]) == (a.worker_id, "active")
        found = await eventually(has_turns(http_b, call_id, 3), 10, "three turns in Redis")
        assert found["state"] == "active"
    assert [r["turn"] for r in found["records"]] == [1, 2, 3]
    expected = [{"table", "tonight"}, {"weather", "tomorrow"}, {"thank"}]
    for record, words in zip(found["records"], expected, strict=True):
        assert words <= caller_words(record), record["caller_text"]
    async with b.http() as http_b:
        ended = await eventually(has_state(http_b, call_id, "ended"), 10, "ended, seen from B")
        assert ended["records"] == found["records"]
    lost = f"call {call_id} lost"
    assert not [line for w in workers for line in w.server.log if lost in line]

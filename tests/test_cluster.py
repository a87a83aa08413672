"""Two Hotline workers on one real `redis-server`: the cluster as callers and the API see it.

Workers A and B (real `hotline serve` processes, API token set, cluster limit 5, heartbeat
0.5 s, worker TTL 1.5 s, SIP on a port of their own) are started once for the module on a Redis
with an append-only file; the destructive tests (SIGKILL, SIGTERM) start a worker of their own
next to them. The caller is the faithful Twilio phone (`voice.devtools.phone_caller.TwilioPhone`)
speaking natural test speech, or a raw SIP trunk (`sip_call`: one INVITE over UDP). Waits are on
conditions, bounded; the only timing asserted is the issue's "lost within twice the worker TTL"
after a SIGKILL.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import re
import signal
import socket
import subprocess
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import redis.asyncio
from aiortc import RTCPeerConnection
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.support.poll import PollTimeout, until
from tests.support.redis_server import RedisServer
from tests.support.server import Server, free_port, logged, start_server
from tests.support.speech import utterance, words
from voice.cluster.store import call_keys
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

# Short turns: each is spoken, echoed back ("You said: ...") and followed by 2 s of silence.
FIRST = "Book a table for tonight."
SECOND = "The weather tomorrow?"
THIRD = "Thank you."
RETRY_AFTER = "5"  # what a refused SIP INVITE and WebRTC offer say, in seconds


@dataclass
class Worker:
    server: Server
    worker_id: str
    sip_port: int | None = None

    @property
    def url(self) -> str:
        return self.server.url

    def ws(self, path: str) -> str:
        return self.server.url.replace("http://", "ws://") + path

    def http(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, headers=AUTH, timeout=10)


def start_worker(redis: RedisServer, sip: bool = False) -> Worker:
    """A worker of the cluster; with `sip`, answering SIP (UDP and TCP) on a port of its own."""
    sip_port = free_port() if sip else None
    env = {
        "HOTLINE_REDIS_URL": redis.url,
        "HOTLINE_API_TOKEN": TOKEN,
        "HOTLINE_TELEPHONY__TWILIO_AUTH_TOKEN": TWILIO_TOKEN,
        "HOTLINE_SESSIONS__HEARTBEAT_S": str(HEARTBEAT_S),
        "HOTLINE_SESSIONS__WORKER_TTL_S": str(TTL_S),
        "HOTLINE_SESSIONS__CLUSTER_LIMIT": str(CLUSTER_LIMIT),
    }
    if sip_port is not None:
        env |= {"HOTLINE_SIP__ENABLED": "true", "HOTLINE_SIP__PORT": str(sip_port)}
    server = start_server(env)
    found = [m for line in server.log if (m := re.search(r"Hotline ready: worker (\S+),", line))]
    assert found, "\n".join(server.log[-40:])
    return Worker(server, found[0].group(1), sip_port)


def stop_workers(*workers: Worker) -> list[int]:
    """SIGTERM every worker still running at once, then each one's exit code."""
    for worker in workers:
        if worker.server.process.poll() is None:
            worker.server.process.terminate()
    codes = []
    for worker in workers:
        try:
            codes.append(worker.server.process.wait(30))
        except subprocess.TimeoutExpired:
            worker.server.process.kill()
            codes.append(worker.server.process.wait())
    return codes


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
        started = list(pool.map(lambda _: start_worker(redis_server, sip=True), range(2)))
    a, b = started
    assert a.worker_id != b.worker_id
    yield a, b
    codes = stop_workers(a, b)
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


def caller_words(record: dict[str, Any]) -> set[str]:
    return words(str(record["caller_text"]))


async def sdp_offer() -> str:
    """A real WebRTC offer (aiortc's, one audio section), as a browser would post it."""
    pc = RTCPeerConnection()
    pc.addTransceiver("audio")
    await pc.setLocalDescription(await pc.createOffer())
    sdp: str = pc.localDescription.sdp
    await pc.close()
    return sdp


async def offer(worker: Worker, sdp: str) -> httpx.Response:
    async with worker.http() as http:
        return await http.post("/offer", json={"sdp": sdp, "type": "offer"})


def refused_offer(response: httpx.Response, reason: str) -> bool:
    """The README's refusal of an offer: 503, when to try again, and why, as JSON."""
    assert response.status_code == 503, response.text
    assert response.headers.get("retry-after") == RETRY_AFTER, dict(response.headers)
    assert response.json() == {"error": f"call refused: {reason}"}
    return True


# -- a raw SIP trunk -------------------------------------------------------------------------


@dataclass
class SipAnswer:
    status: int
    reason: str
    method: str  # of its CSeq
    headers: dict[str, str]  # lower-case names, the first value of each

    @staticmethod
    def parse(data: bytes) -> SipAnswer | None:
        text = data.decode("utf-8", "replace")
        if not text.startswith("SIP/2.0 "):
            return None  # a request from the server
        head = text.split("\r\n\r\n", 1)[0].split("\r\n")
        _, status, reason = head[0].split(" ", 2)
        headers: dict[str, str] = {}
        for line in head[1:]:
            name, _, value = line.partition(":")
            headers.setdefault(name.strip().lower(), value.strip())
        return SipAnswer(int(status), reason, headers["cseq"].split()[-1], headers)

    @property
    def to_tag(self) -> str | None:
        return (
            self.headers["to"].split(";tag=")[1].split(";")[0]
            if ";tag=" in self.headers["to"]
            else None
        )


class _Inbox(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.answers: list[SipAnswer] = []

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        if (answer := SipAnswer.parse(data)) is not None:
            self.answers.append(answer)


async def sip_call(worker: Worker) -> SipAnswer:
    """One INVITE to `worker` over UDP from loopback, as a SIP trunk sends it; the final answer
    (ACKed). An answered call (200) is hung up at once with a BYE, which must get 200."""
    assert worker.sip_port is not None
    loop = asyncio.get_running_loop()
    transport, inbox = await loop.create_datagram_endpoint(_Inbox, local_addr=("127.0.0.1", 0))
    media = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # the offered RTP port; unread
    media.bind(("127.0.0.1", 0))
    here = f"127.0.0.1:{transport.get_extra_info('sockname')[1]}"
    call = uuid.uuid4().hex
    sdp = (
        "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
        f"m=audio {media.getsockname()[1]} RTP/AVP 0\r\n"
    )

    def send(
        method: str, branch: str, cseq: int, to_tag: str | None = None, body: str = ""
    ) -> None:
        to = "<sip:+15550002@127.0.0.1>" + (f";tag={to_tag}" if to_tag else "")
        transport.sendto(
            (
                f"{method} sip:+15550002@127.0.0.1:{worker.sip_port} SIP/2.0\r\n"
                f"Via: SIP/2.0/UDP {here};branch=z9hG4bK{call}{branch};rport\r\n"
                f"Max-Forwards: 70\r\nFrom: <sip:+15550001@127.0.0.1>;tag=trunk\r\nTo: {to}\r\n"
                f"Call-ID: {call}\r\nCSeq: {cseq} {method}\r\nContact: <sip:trunk@{here}>\r\n"
                + ("Content-Type: application/sdp\r\n" if body else "")
                + f"Content-Length: {len(body)}\r\n\r\n{body}"
            ).encode(),
            ("127.0.0.1", worker.sip_port),
        )

    async def final(method: str) -> SipAnswer:
        def found() -> SipAnswer | None:
            return next((r for r in inbox.answers if r.method == method and r.status >= 200), None)

        try:
            answer: SipAnswer | None = await until(found, f"a final answer to the {method}")
            assert answer is not None
            return answer
        except PollTimeout as timeout:
            seen = [(r.status, r.reason, r.method) for r in inbox.answers]
            raise AssertionError(f"{timeout}; answers that came: {seen}") from None

    try:
        send("INVITE", "i", 1, body=sdp)
        answer = await final("INVITE")
        if answer.status >= 300:
            send("ACK", "i", 1, answer.to_tag)  # a refusal's ACK: the INVITE's own transaction
        else:
            send("ACK", "a", 1, answer.to_tag)
            send("BYE", "b", 2, answer.to_tag)
            bye = await final("BYE")
            assert bye.status == 200, (bye.status, bye.reason)
        return answer
    finally:
        transport.close()
        media.close()


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


async def test_a_call_is_watched_on_its_worker_before_its_record_is_in_redis(
    workers: tuple[Worker, Worker], redis_server: RedisServer
) -> None:
    """The registry writes a call's record in the background, so for a moment (longer under
    load) Redis does not have it yet while the worker lists the call as active. Its worker lets
    the console watch it all the same; the other worker, which knows the call only through
    Redis, still refuses it."""
    a, b = workers
    async with a.http() as http_a, phone_call(a) as phone:
        call_id = phone.call_sid

        async def active_on_a() -> bool:
            response = await http_a.get(f"/calls/{call_id}")
            return response.status_code == 200 and response.json()["state"] == "active"

        await until(active_on_a, "the call active on A")
        store = redis.asyncio.Redis(port=redis_server.port)
        try:
            assert await store.delete(call_keys("hotline", call_id)[0]) == 1  # not written yet
        finally:
            await store.aclose()
        async with connect(a.ws(f"/calls/{call_id}/live"), additional_headers=AUTH) as live:
            first = json.loads(await asyncio.wait_for(live.recv(), 10))
            assert (first["type"], first["state"]) == ("state", "active")
        with pytest.raises(InvalidStatus) as refused:
            async with connect(b.ws(f"/calls/{call_id}/live"), additional_headers=AUTH):
                pass
        assert refused.value.response.status_code == 403


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
        on_b = await until(lambda: recorded(http_b, call_id), "the call listed on B")
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
            await until(seen("state", state="active"), "B's watcher caught up")

            _, reply_end = await speak(phone, FIRST)
            await until(seen("turn"), "the turn event on B")
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

        ended = await until(has_state(http_b, call_id, "ended"), "ended, seen from B")
        assert ended["worker_id"] == a.worker_id and ended["ended_at"] is not None
        assert [r["turn"] for r in ended["records"]] == [1]
        assert await listed(http_b, call_id) is None
        assert (await http_b.post(f"/calls/{call_id}/hangup")).status_code == 404

    states = [e["state"] for _, e in events if e["type"] == "state"]
    assert states == ["active", "ended"]
    live_types = [e["type"] for _, e in events]
    print(f"\nlive events on B: {live_types}")
    assert live_types.count("turn") == 1  # each turn is one live event
    replayed: list[str] = []
    async with connect(b.ws(f"/calls/{call_id}/live"), additional_headers=AUTH) as late:
        async for message in late:  # a late watcher replays the call, up to its end
            replayed.append(json.loads(message)["type"])
    assert replayed == live_types


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
        ended = await until(has_state(http_b, call_id, "ended"), "the call ended")
        [record] = ended["records"]  # read back from Redis by the other worker
        assert {"table", "tonight"} <= caller_words(record)
        assert record["interrupted"] and record["reply_text"] == ""
        assert record["generated_text"].startswith("You said")
        assert ended["end_reason"] == "stop: stream stopped"


async def test_a_stream_token_replayed_on_either_worker_is_refused(
    workers: tuple[Worker, Worker],
) -> None:
    """README "Security": a stream token's nonce is claimed in Redis, so a replay is refused on
    every worker: closed with 1008 and logged there (`stream for call … refused: …`)."""
    a, b = workers
    socket, phone = await open_stream(a)
    async with socket, b.http() as http_b:
        await phone.open()
        on_b = await until(lambda: recorded(http_b, phone.call_sid), "the call admitted on A")
        assert on_b["worker_id"] == a.worker_id
        for worker in (b, a):  # the same start message, token and all, again
            mark = worker.server.log_mark()
            async with connect(worker.ws("/twilio/stream"), compression=None) as replayed:
                again = TwilioPhone(replayed, phone.call_sid, phone.account_sid, phone.parameters)
                await again.open()
                assert await refused(replayed) == 1008, worker.worker_id
            refusal = f"stream for call {phone.call_sid!r} refused: stream token already used"
            await logged(worker.server, refusal, since=mark)
        assert (await listed(http_b, phone.call_sid) or {}).get("worker_id") == a.worker_id
        assert not socket.close_code  # the call the token was issued for goes on


async def test_twenty_simultaneous_admissions_across_two_workers_admit_exactly_five(
    workers: tuple[Worker, Worker],
) -> None:
    a, b = workers
    sdp = await sdp_offer()
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

            calls = await until(settled, "15 refused and 5 admitted", within_s=20)
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

        # The cluster is full (each worker is far under its own limit of 8): README "Cluster"
        # and "SIP trunks": a WebRTC offer gets 503, a SIP INVITE 486 Busy Here, on both.
        answers = await asyncio.gather(*(offer(w, sdp) for w in (a, b)))
        assert all(refused_offer(answer, "cluster_full") for answer in answers)
        for worker in (a, b):
            busy = await sip_call(worker)
            assert (busy.status, busy.reason) == (486, "Busy Here"), worker.worker_id
            await webhook_turned_away(worker)  # TwiML rejection, never a stream to refuse later
        async with b.http() as http_b:
            listed_now = {c["call_id"] for c in (await http_b.get("/calls")).json()["calls"]}
        assert listed_now == admitted  # the refusals left nothing admitted

        # One call ends: a SIP call is admitted again (and hung up at once).
        ending = next(i for i, task in enumerate(closes) if not task.done())
        await opened[ending][0].close()
        async with b.http() as http_b:

            async def one_free() -> bool:
                return len((await http_b.get("/calls")).json()["calls"]) < CLUSTER_LIMIT

            await until(one_free, "a place freed in the cluster")
        answered = await sip_call(b)
        assert (answered.status, answered.reason) == (200, "OK")
    finally:
        for socket, _ in opened:
            await socket.close()
        for task in closes:
            task.cancel()
    async with a.http() as http_a, b.http() as http_b:
        for http in (http_a, http_b):
            await until(
                functools.partial(_no_calls, http), "all admitted calls released", within_s=20
            )


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
        finished = await until(has_turns(http_c, call_id, 2), "two turns done on C")
        on_b = await until(lambda: recorded(http_b, call_id), "the call listed on B")
        assert on_b["worker_id"] == c.worker_id

        killed = time.time()  # C's last heartbeat came before this
        c.server.process.send_signal(signal.SIGKILL)
        lost = await until(has_state(http_b, call_id, "lost"), "lost", within_s=4 * TTL_S + 5)
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
            await until(lambda: recorded(http_d, call_id), "the call in progress on D")
            d.server.process.send_signal(signal.SIGTERM)

            async def draining() -> bool:
                return (await http_d.get("/readyz")).status_code == 503

            await until(draining, "D's /readyz says draining")
            ready = await http_d.get("/readyz")
            assert ready.json() == {"status": "draining", "active_calls": 1}
            assert "\nhotline_draining 1.0\n" in (await http_d.get("/metrics")).text
            assert refused_offer(await offer(d, await sdp_offer()), "draining")
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
                on_b = await until(lambda: recorded(http_b, other.call_sid), "on B")
                assert on_b["worker_id"] == b.worker_id
            await until(lambda: _gone(http_b, other.call_sid), "B's call ended")

            # The call in progress on D goes on to its end.
            await speak(phone, THIRD)
            assert (await listed(http_b, call_id) or {}).get("worker_id") == d.worker_id
        code = await asyncio.to_thread(d.server.process.wait, 30)
        assert code == 0, "\n".join(d.server.log[-30:])
        ended = await until(has_state(http_b, call_id, "ended"), "ended, seen from B")
        [record] = ended["records"]  # the turn spoken while D drained
        assert {"thank"} <= caller_words(record), record["caller_text"]


async def _gone(http: httpx.AsyncClient, call_id: str) -> bool:
    return await listed(http, call_id) is None


async def webhook_turned_away(worker: Worker) -> None:
    """README "Cluster": a Twilio call that may not be admitted is turned away in the webhook's
    TwiML (`<Say>` and `<Hangup/>`), not connected to a stream that is then refused."""
    form = {"CallSid": twilio_sid("CA"), "From": "+15550001111"}
    async with worker.http() as http:
        answer = await http.post("/twilio/voice", data=form, headers=signed(worker, form))
    assert answer.status_code == 200, answer.text
    twiml = ET.fromstring(answer.text)
    assert twiml.find("Connect") is None, answer.text
    assert [child.tag for child in twiml] == ["Say", "Hangup"], answer.text


async def new_calls_refused_on(worker: Worker) -> None:
    """README "Redis outage": new calls are refused (fail closed): a WebRTC offer 503 with
    Retry-After, a Twilio webhook turned away in TwiML, a Twilio stream (its webhook passed
    before the outage) closed 1013, try again later (its token cannot be claimed: not the
    caller's fault, so not 1008), a SIP INVITE
    `503 Service Unavailable` with Retry-After."""
    assert refused_offer(await offer(worker, await sdp_offer()), "redis_unavailable")
    await webhook_turned_away(worker)
    mark = worker.server.log_mark()
    socket, phone = await open_stream(worker)
    async with socket:
        await phone.open()
        assert await refused(socket) == 1013
    why = "the call registry is unavailable to check the stream token"
    await logged(worker.server, f"stream for call {phone.call_sid!r} refused: {why}", since=mark)
    unavailable = await sip_call(worker)
    assert (unavailable.status, unavailable.reason) == (503, "Service Unavailable")
    assert unavailable.headers.get("retry-after") == RETRY_AFTER, unavailable.headers


async def test_a_redis_outage_mid_call_loses_no_turn(
    workers: tuple[Worker, Worker], redis_server: RedisServer
) -> None:
    a, b = workers
    async with a.http() as http_a, b.http() as http_b, phone_call(a) as phone:
        call_id = phone.call_sid
        await until(lambda: recorded(http_b, call_id), "the call in Redis")
        # (a turn written before an outage is kept: test_registry.py, with the same Redis AOF)
        redis_server.stop()
        stopped = time.monotonic()
        try:

            async def unavailable() -> bool:
                return (await http_b.get("/calls")).status_code == 503

            await until(unavailable, "B's registry reads fail while Redis is down")
            during = asyncio.create_task(speak(phone, SECOND))  # spoken during the outage
            await new_calls_refused_on(b)  # fail closed, at the HTTP and the SIP edge
            # Redis stays down OUTAGE_S: a duration of the scenario, not a wait for a condition.
            await asyncio.sleep(max(0.0, stopped + OUTAGE_S - time.monotonic()))
        finally:
            redis_server.start()
        restarted = time.monotonic()
        print(f"\nRedis was down for {restarted - stopped:.1f} s")
        reply_start, _ = await during  # the call went on: a reply to the turn spoken then
        print(f"reply to the turn spoken during the outage began {reply_start - stopped:.1f} s in")
        # (its record is A's once the reply has played out: on a busy runner, after `speak`)
        local = await until(has_turns(http_a, call_id, 1), "the turn recorded on A")
        assert [r["turn"] for r in local["records"]] == [1]

        await speak(phone, THIRD)  # and after it
        # A re-registers its call; nobody marked it lost; every turn is in the stream, in order.
        on_b = await until(lambda: recorded(http_b, call_id), "the call listed on B")
        assert (on_b["worker_id"], on_b["state"]) == (a.worker_id, "active")
        found = await until(has_turns(http_b, call_id, 2), "both turns in Redis")
        assert found["state"] == "active"
        answered = await sip_call(b)  # and new calls are admitted again
        assert (answered.status, answered.reason) == (200, "OK")
    assert [r["turn"] for r in found["records"]] == [1, 2]
    expected = [{"weather", "tomorrow"}, {"thank"}]
    for record, said in zip(found["records"], expected, strict=True):
        assert said <= caller_words(record), record["caller_text"]
    async with b.http() as http_b:
        ended = await until(has_state(http_b, call_id, "ended"), "ended, seen from B")
        assert ended["records"] == found["records"]
    lost = f"call {call_id} lost"
    sessions = [line for w in workers for line in w.server.log if "sessions:" in line]
    assert not [line for line in sessions if lost in line], sorted(sessions)[-12:]

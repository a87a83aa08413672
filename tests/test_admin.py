"""The API token, call control, metrics, readiness and draining on SIGTERM."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import time
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from tempfile import TemporaryDirectory

import httpx
import pytest
from click.testing import Result
from fastapi.routing import APIRoute
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from tests.support.poll import until
from tests.support.redis_server import RedisServer
from tests.support.server import Server, start_server, stop_server
from tests.support.speech import utterance, words
from voice.audio import write_wav
from voice.cli.main import app as cli
from voice.cluster.records import RegistrySettings, WorkerInfo
from voice.cluster.registry import CallRegistry
from voice.devtools.phone_caller import twilio_sid
from voice.devtools.twilio_call import place_twilio_call
from voice.server.routes.calls import calls_api
from voice.server.routes.experiments import experiments_api

pytestmark = pytest.mark.slow

TOKEN = "s3cret-api-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
DRAIN_S = 8.0  # the guarded server's HOTLINE_DRAIN_TIMEOUT_S, which the drain test waits out


@dataclass
class Guarded:
    """The module's server with the API token, on the module's Redis (a call's record outlives
    the server). The drain test ends it; a test that runs after that one on the same pytest
    worker (xdist's work stealing can put one there) gets a new one."""

    env: dict[str, str]
    running: Server

    def server(self) -> Server:
        if self.running.process.poll() is not None:
            self.running = start_server(self.env)
        return self.running


@pytest.fixture(scope="module")
def guarded_servers(redis_server: RedisServer) -> Iterator[Guarded]:
    env = {
        "HOTLINE_API_TOKEN": TOKEN,
        "HOTLINE_REDIS_URL": redis_server.url,
        "HOTLINE_DRAIN_TIMEOUT_S": str(DRAIN_S),
    }
    servers = Guarded(env, start_server(env))
    yield servers
    if servers.running.process.poll() is None:
        assert stop_server(servers.running) == 0, "\n".join(servers.running.log[-40:])


@pytest.fixture
def guarded(guarded_servers: Guarded) -> Server:
    return guarded_servers.server()


def concrete(path: str) -> str:
    """A route's path with each parameter given a value (a call or experiment that is not
    there: the token is checked before the route looks)."""
    return path.replace("{call_id}", "x").replace("{name}", "x")


# What README "Calls and operations" and "Security" promise a token for, and every route of the
# calls and experiments routers (so a route added there is covered without editing this list).
PROMISED = [
    ("POST", "/offer"),
    ("POST", "/admin/drain"),
    ("POST", "/phone/stream-token"),
    ("GET", "/calls"),
    ("GET", "/calls/ended"),
    ("GET", "/calls/x"),
    ("GET", "/calls/x/recording"),
    ("POST", "/calls/x/hangup"),
    ("POST", "/calls/x/say"),
    ("POST", "/calls/x/transfer"),
    ("POST", "/calls/x/listen"),
    ("GET", "/experiments"),
]
ROUTED = [
    (method, concrete(route.path))
    for router in (calls_api, experiments_api)
    for route in router.routes
    if isinstance(route, APIRoute)
    for method in sorted(route.methods or ())
]
GUARDED_ROUTES = list(dict.fromkeys(PROMISED + ROUTED))


@pytest.mark.parametrize(("method", "path"), GUARDED_ROUTES)
def test_the_api_token_is_required(guarded: Server, method: str, path: str) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        response = httpx.request(method, guarded.url + path, headers=headers, json={}, timeout=10)
        assert response.status_code == 401, (headers, response.status_code, response.text)
        assert response.headers["www-authenticate"] == "Bearer"
        assert response.json() == {"error": "missing or wrong bearer token"}
    if path == "/admin/drain":
        return  # the right token would drain the module's server
    # The right token gets past the check, to a route that is there (not FastAPI's own 404
    # or 405): so a 401 above was the token check's, not a route's that does not exist.
    allowed = httpx.request(method, guarded.url + path, headers=AUTH, json={}, timeout=10)
    assert allowed.status_code not in (401, 405), (allowed.status_code, allowed.text)
    if allowed.status_code == 404:  # an unknown call or experiment, said by the route itself
        assert "error" in allowed.json(), allowed.text


def test_unknown_calls_are_404_and_malformed_control_bodies_400(guarded: Server) -> None:
    with httpx.Client(base_url=guarded.url, headers=AUTH, timeout=10) as http:
        assert http.get("/calls").json() == {"calls": []}
        assert http.get("/calls/no-such-call").status_code == 404
        assert http.post("/calls/no-such-call/hangup").status_code == 404
        assert http.post("/calls/no-such-call/say", json={"text": "hello"}).status_code == 404
        for body in (b"{oops", b"[]", b'{"text": 3}', b'{"text": "  "}', b"{}"):
            response = http.post("/calls/no-such-call/say", content=body)
            assert response.status_code == 400, body
            assert "error" in response.json()
        long = http.post("/calls/no-such-call/say", json={"text": "Hello. " * 300})
        assert long.status_code == 413 and "2000 characters" in long.json()["error"]


def test_metrics_and_readiness(guarded: Server) -> None:
    with httpx.Client(base_url=guarded.url, timeout=10) as http:
        assert http.get("/readyz").json() == {"status": "ready", "active_calls": 0}
        text = http.get("/metrics").text
    assert "hotline_active_calls 0.0" in text
    assert "hotline_turn_latency_seconds" in text


def hotline_cli(*args: str, token: str | None = None) -> Result:
    """A client command of the real CLI, in this process (HOTLINE_API_TOKEN as given)."""
    env = {"HOTLINE_API_TOKEN": token}  # None: not set for the command
    return CliRunner().invoke(cli, list(args), env=env)


def test_client_commands_without_the_token_say_so_in_one_line(
    guarded: Server, tmp_path: Path
) -> None:
    """`call`, `bench` and `experiments` on a secured server, without the token: a
    line naming the refusal and the way out, never a traceback (issue 27, item 1)."""
    wav = tmp_path / "hello.wav"
    write_wav(wav, utterance("Hello there."))
    commands = [
        ("call", "--wav", str(wav), "--out", str(tmp_path / "reply.wav"), "--url", guarded.url),
        ("bench", "--url", guarded.url, "--calls", "1", "--turns", "1", "--out", str(wav)),
        ("experiments", "stop", "--url", guarded.url),
    ]
    for command in commands:
        result = hotline_cli(*command, token="wrong-token")
        assert result.exit_code in (1, 2) and isinstance(result.exception, SystemExit), (
            command,
            result.output,
        )
        refused = [line for line in result.output.splitlines() if "HTTP 401" in line]
        assert len(refused) == 1, (command, result.output)
        assert "missing or wrong bearer token" in refused[0] and "--token" in refused[0]
        assert "Traceback" not in result.output and "wrong-token" not in result.output


def test_hotline_call_with_the_token_prints_the_servers_turn_record(guarded: Server) -> None:
    """With HOTLINE_API_TOKEN, `hotline call` gets through /offer and `GET /calls/{id}`: the
    turn table shows what the server heard and its timings (it printed them empty when that
    401 was swallowed)."""
    with TemporaryDirectory() as scratch:
        wav = Path(scratch) / "question.wav"
        write_wav(wav, utterance("Do you open on Sundays?"))
        reply = Path(scratch) / "reply.wav"  # not the default, in the working directory
        command = ("call", "--wav", str(wav), "--out", str(reply), "--url", guarded.url)
        result = hotline_cli(*command, token=TOKEN)
        assert result.exit_code == 0, result.output
        assert reply.stat().st_size > 44  # the reply's audio: more than a WAV header
    assert "sundays" in result.output.lower(), result.output  # the server's record of the turn
    assert re.search(r"stt=\d+", result.output), result.output


async def test_say_speaks_into_a_call_and_turn_metrics_count(server: Server) -> None:
    stream = server.url.replace("http://", "ws://") + "/twilio/stream"
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
        before = budgeted_turns((await http.get("/metrics")).text)
        sid = twilio_sid("CA")  # the session server is shared: find this call by its id
        # The caller waits 3 s of quiet after a reply before its next turn: the said sentence
        # starts within that (with the 0.8 s default a loaded runner could let the caller speak
        # first, and its turn cut the sentence before any of it was heard).
        speech = [utterance("Hello there."), utterance("Thank you.")]
        call = asyncio.create_task(place_twilio_call(stream, speech, call_sid=sid, quiet_s=3.0))
        await turns_done(http, sid, 1)
        response = await http.post(f"/calls/{sid}/say", json={"text": "This is a test."})
        assert response.status_code == 200
        result = await call
        detail = (await http.get(f"/calls/{sid}")).json()
        metrics = (await http.get("/metrics")).text
    said = {"role": "assistant", "content": "This is a test.", "source": "operator"}
    assert said in detail["history"]
    assert result.turns[-1].reply_start is not None
    assert 'hotline_turn_latency_seconds_count{part="first_audio"}' in metrics
    assert 'hotline_turn_decisions_total{taken="planned"}' in metrics
    first = detail["records"][0]  # turns counted by the service tier the provider served
    assert first["service_tier_requested"] in ("priority", "default")  # the tiers' service tiers
    assert f'service_tier_served="{first["service_tier_served"]}"' in metrics
    # Each budgeted turn of this call is counted under what its record says: first audio within
    # the budget or not (the adaptive controller plans for its p90, so either can happen).
    records = detail["records"]
    assert records[0]["budget_ms"] and "first_audio" in records[0]["timings_ms"]
    outcomes = Counter(
        str(record["timings_ms"]["first_audio"] <= record["budget_ms"]).lower()
        for record in records
        if record["budget_ms"] and "first_audio" in record["timings_ms"]
    )
    after = budgeted_turns(metrics)
    for within, turns in outcomes.items():
        assert after.get(within, 0.0) - before.get(within, 0.0) >= turns, (within, before, after)


def budgeted_turns(metrics: str) -> dict[str, float]:
    """`hotline_turns_budgeted_total` by its `within` label, from a /metrics page."""
    return {
        sample.labels["within"]: sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name == "hotline_turns_budgeted_total"
    }


async def turns_done(http: httpx.AsyncClient, call_id: str, turns: int) -> None:
    """Once the call in progress `call_id` has `turns` finished turns (fails with what the
    calls API last listed)."""

    async def listed() -> list[dict[str, object]]:
        return list((await http.get("/calls")).json()["calls"])

    def reached(calls: list[dict[str, object]]) -> bool:
        return any(c["call_id"] == call_id and int(str(c["turns"])) >= turns for c in calls)

    async def check() -> list[dict[str, object]] | None:
        calls = await listed()
        return calls if reached(calls) else None

    found: list[dict[str, object]] | None = await until(
        check, f"call {call_id} at {turns} finished turn(s)", within_s=30
    )
    assert found is not None


async def test_sigterm_drains_refuses_new_calls_and_cuts_calls_at_the_timeout(
    guarded: Server, redis_server: RedisServer
) -> None:
    """SIGTERM while a call is talking: new calls are refused, the call goes on (a turn of it is
    answered while draining, and it is not cut before HOTLINE_DRAIN_TIMEOUT_S), then the server
    hangs it up (the caller's socket closes before its script is over), records why, keeps the
    turns that were finished and exits 0."""
    stream = guarded.url.replace("http://", "ws://") + "/twilio/stream"
    speech = [
        utterance("Please book a table for two."),
        utterance("Thanks, that is all."),
        *[utterance("And one more question, please.")] * 6,  # more than the drain leaves time for
    ]
    async with httpx.AsyncClient(base_url=guarded.url, headers=AUTH, timeout=10) as http:
        sid, asked = twilio_sid("CA"), {"provider": "twilio"}
        token = (await http.post("/phone/stream-token", json={**asked, "call_id": sid})).json()
        placed = place_twilio_call(
            stream, speech, parameters={"token": token["token"]}, call_sid=sid
        )
        call = asyncio.create_task(placed)
        await turns_done(http, sid, 1)
        guarded.process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()

        async def not_ready() -> httpx.Response | None:
            ready = await http.get("/readyz")
            return ready if ready.status_code == 503 else None

        ready: httpx.Response | None = await until(not_ready, "/readyz answering 503 after SIGTERM")
        assert ready is not None and ready.json()["status"] == "draining"
        assert "\nhotline_draining 1.0\n" in (await http.get("/metrics")).text
        offer = await http.post("/offer", json={"sdp": "v=0", "type": "offer"})
        assert offer.status_code == 503
        webhook = await http.post("/twilio/voice", data={"CallSid": "CAx", "From": "+1"})
        assert ET.fromstring(webhook.text).find("Hangup") is not None
        result = await call  # returns once the server has ended the stream
    ended = time.monotonic()
    try:
        code = await asyncio.to_thread(guarded.process.wait, 30)
    except subprocess.TimeoutExpired:
        guarded.process.kill()
        raise
    assert code == 0, "\n".join(guarded.log[-40:])
    # Not cut before the timeout, and served meanwhile: a reply began after the SIGTERM (on a
    # loaded runner the caller may already have said its second turn by the time the first
    # one's record is seen and the signal sent); then cut: the caller had turns left to say.
    assert ended - signalled >= DRAIN_S, (ended - signalled, DRAIN_S)
    answered_while_draining = [
        t for t in result.turns if t.reply_start is not None and t.reply_start > signalled
    ]
    assert answered_while_draining, [
        (t.speech_end - signalled, t.reply_start) for t in result.turns
    ]
    spoken = len(result.turns)
    assert spoken < len(speech), f"all {spoken} turns were said: not cut at the drain timeout"
    # The record (in Redis, after the server is gone): ended by the server, and why; the turns
    # finished before the cut are kept (a caller turn followed by another was answered to its
    # end: the caller speaks again only after the reply), the first one what was said first.
    registry = await CallRegistry.open(
        RegistrySettings(redis_url=redis_server.url), WorkerInfo("t")
    )
    try:
        found = await registry.get_call(sid)
    finally:
        await registry.close()
    assert found is not None
    record, turns = found
    assert (record.state, record.end_reason) == ("ended", "server shutdown")
    finished = [t for t in result.turns[:-1] if t.reply_start is not None]
    assert len(turns) >= len(finished) >= 1, [t["caller_text"] for t in turns]
    assert {"book", "table", "two"} <= words(turns[0]["caller_text"]), turns[0]["caller_text"]

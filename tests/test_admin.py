"""The API token, call control, metrics, readiness and draining on SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.server import Server, start_server, stop_server
from tests.support.speech import concat, piper, silence
from voice.devtools.phone_caller import twilio_sid
from voice.devtools.twilio_call import place_twilio_call

pytestmark = pytest.mark.slow

TOKEN = "s3cret-api-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def utterance(text: str) -> np.ndarray:
    return concat(silence(300), piper(text), silence(200))


@pytest.fixture(scope="module")
def guarded() -> Iterator[Server]:
    running = start_server({"HOTLINE_API_TOKEN": TOKEN})
    yield running
    if running.process.poll() is None:
        stop_server(running)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/calls"),
        ("GET", "/calls/x"),
        ("POST", "/offer"),
        ("POST", "/admin/drain"),
        ("POST", "/calls/x/hangup"),
        ("POST", "/calls/x/say"),
    ],
)
@pytest.mark.parametrize(
    "headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}]
)
def test_the_api_token_is_required(
    guarded: Server, method: str, path: str, headers: dict[str, str]
) -> None:
    response = httpx.request(method, guarded.url + path, headers=headers, json={}, timeout=10)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert "error" in response.json()


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


async def test_say_speaks_into_a_call_and_turn_metrics_count(server: Server) -> None:
    stream = server.url.replace("http://", "ws://") + "/twilio/stream"
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
        before = budgeted_turns((await http.get("/metrics")).text)
        call = asyncio.create_task(
            place_twilio_call(stream, [utterance("Hello there."), utterance("Thank you.")])
        )
        call_id = await wait_for_turns(http, 1)
        response = await http.post(f"/calls/{call_id}/say", json={"text": "This is a test."})
        assert response.status_code == 200
        result = await call
        detail = (await http.get(f"/calls/{call_id}")).json()
        metrics = (await http.get("/metrics")).text
    assert {"role": "assistant", "content": "This is a test."} in detail["history"]
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


async def wait_for_turns(http: httpx.AsyncClient, turns: int) -> str:
    """The id of the one call in progress, once it has `turns` turns (bounded wait)."""
    for _ in range(400):
        calls = (await http.get("/calls")).json()["calls"]
        if calls and calls[0]["turns"] >= turns:
            return str(calls[0]["call_id"])
        await asyncio.sleep(0.05)
    raise AssertionError("no call reached its first turn")


async def test_sigterm_drains_refuses_new_calls_and_exits_0(guarded: Server) -> None:
    stream = guarded.url.replace("http://", "ws://") + "/twilio/stream"
    async with httpx.AsyncClient(base_url=guarded.url, headers=AUTH, timeout=10) as http:
        sid, asked = twilio_sid("CA"), {"provider": "twilio"}
        token = (await http.post("/phone/stream-token", json={**asked, "call_id": sid})).json()
        speech = [utterance("Please book a table for two."), utterance("Thanks, that is all.")]
        placed = place_twilio_call(
            stream, speech, parameters={"token": token["token"]}, call_sid=sid
        )
        call = asyncio.create_task(placed)
        await wait_for_turns(http, 1)
        guarded.process.send_signal(signal.SIGTERM)
        for _ in range(100):  # bounded wait for the worker to notice
            if (await http.get("/readyz")).status_code == 503:
                break
            await asyncio.sleep(0.05)
        ready = await http.get("/readyz")
        assert ready.status_code == 503 and ready.json()["status"] == "draining"
        assert "\nhotline_draining 1.0\n" in (await http.get("/metrics")).text
        offer = await http.post("/offer", json={"sdp": "v=0", "type": "offer"})
        assert offer.status_code == 503
        webhook = await http.post("/twilio/voice", data={"CallSid": "CAx", "From": "+1"})
        assert ET.fromstring(webhook.text).find("Hangup") is not None
        result = await call  # the call in progress goes on to its end
    assert len(result.turns) == 2 and result.turns[1].reply_start is not None
    try:
        code = await asyncio.to_thread(guarded.process.wait, 30)
    except subprocess.TimeoutExpired:
        guarded.process.kill()
        raise
    assert code == 0

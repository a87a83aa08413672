"""Campaigns' pure parts (calling hours, retry rules, variables in an agent's words, the request
checks) and the row moves of the store on the in-process Redis a lone worker uses (fakeredis
runs the same Lua): a lease that runs out, a stale report, retries, a stop, the end, once."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime

import fakeredis
import pytest

from voice.agents.agent import Agent
from voice.agents.variables import personalised, render
from voice.campaigns.hours import BadZone, Window, zone
from voice.campaigns.request import BadCampaign, parse_campaign
from voice.campaigns.rules import RetryRules, outcome_of_record
from voice.campaigns.store import CampaignStore, Claimed


def at(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def test_calling_hours_are_the_callee_s() -> None:
    window = Window.of("09:00", "20:00")
    tokyo, new_york = zone("Asia/Tokyo"), zone("America/New_York")
    noon_utc = at("2026-03-10T12:00:00+00:00")  # 21:00 in Tokyo, 08:00 in New York
    assert window.next_open(noon_utc, tokyo) == at("2026-03-11T09:00:00+09:00")
    assert window.next_open(noon_utc, new_york) == at("2026-03-10T09:00:00-04:00")
    assert window.next_open(at("2026-03-10T15:00:00+00:00"), new_york) == at(
        "2026-03-10T15:00:00+00:00"
    )  # 11:00 there: open now
    # The night of the clocks going forward (8 March 2026 in New York): 09:00 is EDT.
    assert window.next_open(at("2026-03-08T03:00:00-05:00"), new_york) == at(
        "2026-03-08T09:00:00-04:00"
    )
    overnight = Window.of("21:00", "02:00")
    utc = zone("UTC")
    assert overnight.next_open(at("2026-03-10T23:30:00+00:00"), utc) == at("2026-03-10T23:30:00Z")
    assert overnight.next_open(at("2026-03-11T01:59:00+00:00"), utc) == at("2026-03-11T01:59:00Z")
    assert overnight.next_open(at("2026-03-11T02:00:00+00:00"), utc) == at("2026-03-11T21:00:00Z")
    for bad in ("Mars/Base", "../etc/passwd", "", "x" * 100):
        with pytest.raises(BadZone):
            zone(bad)
    with pytest.raises(ValueError, match="same time"):
        Window.of("09:00", "09:00")


def test_retries_back_off_and_stop_at_their_maximum() -> None:
    rules = RetryRules(busy=3, no_answer=2, machine=2, backoff_s=60)
    assert [rules.retry_in("busy", n) for n in (1, 2, 3)] == [60, 120, None]
    assert [rules.retry_in("no_answer", n) for n in (1, 2)] == [60, None]
    assert rules.retry_in("machine", 1) == 60 and rules.retry_in("machine", 2) is None
    assert rules.retry_in("answered", 1) is None and rules.retry_in("failed", 1) is None
    assert outcome_of_record({"result": "machine", "basis": "beep"}) == "machine"
    assert outcome_of_record({"result": "human"}) == outcome_of_record(None) == "answered"
    assert outcome_of_record({"result": "unknown", "basis": "timeout"}) == "answered"
    sip = {"busy": "busy", "no_answer": "no_answer", "rejected": "failed", "failed": "failed"}
    sip |= {"unreachable": "failed", "cancelled": "failed"}
    for cause, outcome in sip.items():
        assert outcome_of_record(None, {"cause": cause, "sip_status": 486}) == outcome
    machine = {"result": "machine", "basis": "beep"}
    assert outcome_of_record(machine, {"cause": "answered"}) == "machine"


def test_variables_fill_the_agent_s_words_and_nothing_else() -> None:
    variables = {"name": "Ada\nLovelace", "time": "3 pm"}
    text = 'Hi {name}, at {time}. {missing} {other|there} {"json": 1} {0} {name.upper}'
    assert (
        render(text, variables)
        == 'Hi Ada Lovelace, at 3 pm. {missing} there {"json": 1} {0} {name.upper}'
    )
    agent = Agent(
        name="reminder",
        instructions="Remind {name|the customer} of {time}.",
        greeting="Hi {name}!",
        voicemail="Call us, {name}.",
    )
    metadata = {"campaign_id": "c", "variables": variables}
    done = personalised(agent, metadata)
    assert (done.instructions, done.greeting) == (
        "Remind Ada Lovelace of 3 pm.",
        "Hi Ada Lovelace!",
    )
    assert done.voicemail == "Call us, Ada Lovelace." and agent.greeting == "Hi {name}!"
    assert personalised(agent, {"variables": "not a mapping"}) is agent
    assert personalised(agent, None) is agent


def test_a_campaign_request_names_each_problem_and_normalises_numbers() -> None:
    def body(**fields: object) -> bytes:
        return json.dumps({"agent": "reminder", "from": "+15551110000", **fields}).encode()

    spec = parse_campaign(
        body(rows=[{"to": "+1 (555) 010-0001", "variables": {"vip": True, "n": 3}}]),
        ["reminder"],
        10,
    )
    assert spec.rows[0].to == "+15550100001" and spec.rows[0].timezone == "UTC"
    assert spec.rows[0].variables == {"vip": "true", "n": "3"}
    with pytest.raises(BadCampaign) as refused:
        parse_campaign(body(rows=[{"to": "1"}] * 30), ["reminder"], 100)
    said = str(refused.value)
    assert said.startswith("rows[0].to: '1' is not a phone number") and "not checked" in said
    for bad, status in ((b"[1]", 400), (b"{", 400), (b"[" * 100 + b"]" * 100, 400)):
        with pytest.raises(BadCampaign) as refused:
            parse_campaign(bad, ["reminder"], 10)
        assert refused.value.status == status
    row = [{"to": "+15550100001"}]
    over_sip = {"agent": "reminder", "transport": "sip", "trunk": "pbx", "ring_timeout_s": 20}
    sip = parse_campaign(json.dumps({**over_sip, "rows": row}).encode(), ["reminder"], 10)
    assert (sip.head.from_, sip.head.trunk, sip.head.ring_timeout_s) == (None, "pbx", 20)
    for wrong, said in (
        ({"trunk": "pbx"}, "trunk: only with transport sip"),
        ({"transport": "sip", "ring_timeout_s": 0}, "ring_timeout_s: "),
    ):
        with pytest.raises(BadCampaign, match=said):
            parse_campaign(body(rows=row, **wrong), ["reminder"], 10)
    no_from = json.dumps({"agent": "reminder", "rows": row}).encode()
    with pytest.raises(BadCampaign, match="from: required"):
        parse_campaign(no_from, ["reminder"], 10)


def spec_of(rows: int) -> object:
    body = {"agent": "default", "from": "+15551110000", "concurrency": 1}
    body |= {
        "retry": {"busy": 2, "backoff_s": 5},
        "rows": [{"to": f"+1555030{i:04d}"} for i in range(rows)],
    }
    return parse_campaign(json.dumps(body).encode(), ["default"], 10)


def test_rows_move_atomically_through_their_leases_and_outcomes() -> None:
    async def run() -> None:
        store = CampaignStore(fakeredis.FakeAsyncRedis(decode_responses=True), "unit")
        c = await store.create(spec_of(2), [100.0, 100.0], "http://hotline")  # type: ignore[arg-type]
        assert await store.due_rows(c, 99.0, 5) == []
        held = await store.claim(c, "0", 100.0, 3.0, "worker-a")
        assert isinstance(held, Claimed) and held.attempts == 1 and held.to == "+15550300000"
        assert await store.claim(c, "1", 100.0, 3.0, "worker-b") == -1  # concurrency 1
        # worker-a dies: its lease runs out, the row is due again, its attempt not counted.
        assert await store.retake(c, "0", held.token, 102.0) == 0  # not yet
        assert await store.retake(c, "0", held.token, 103.0) == 1
        row = await store.row(c, "0")
        assert (row["status"], row["attempts"], row["retaken"]) == ("queued", "0", "1")
        again = await store.claim(c, "0", 103.0, 3.0, "worker-b")
        assert isinstance(again, Claimed) and again.attempts == 1
        assert await store.settle(c, "0", held.token, "busy", 110.0, 104.0) == 0  # stale hold
        assert await store.placed(again, "CA1", 104.0, 103.5)
        assert await store.settle(c, "0", again.token, "busy", 110.0, 104.0) == 1
        assert await store.settle(c, "0", again.token, "busy", 110.0, 104.0) == 0  # once
        row = await store.row(c, "0")
        assert (row["status"], row["next_at"], row["outcomes"]) == ("queued", "110.0", "busy")
        meta = await store.meta(c)
        assert (meta["n:queued"], meta["dials"], meta["dialled"]) == ("2", "1", "1")
        assert await store.change_state(c, "stop") == "stopped"
        assert await store.change_state(c, "resume") == "stopped"
        assert await store.sweep(c, 105.0) == 2  # nothing in flight: it has ended
        meta = await store.meta(c)
        assert (meta["state"], meta["ended_as"], meta["n:stopped"]) == ("ended", "stopped", "2")
        assert await store.claim_notify(c, 106.0, 60.0)
        assert not await store.claim_notify(c, 107.0, 60.0)  # one worker sends it
        await store.finished(c, "sent", 3600)
        assert await store.live() == []

    asyncio.run(run())

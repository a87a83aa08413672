"""Campaigns (issue 28 item 3) on two real `hotline serve` workers sharing one real Redis,
against the faithful fake of Twilio's Calls API, which plays each number's far end by script
and reports each call's end to Hotline's status callback (tests/support/campaign_twilio.py);
a few calls are answered by the emulated phone, so the agent's greeting is really spoken with
the row's variables.

Both workers are told it is Tuesday 10 March 2026, 15:00 UTC (`HOTLINE_CAMPAIGNS__CLOCK_OFFSET_S`,
the clock of calling hours only): New York, London and Paris are inside 09:00-20:00; Tokyo,
Sydney and Los Angeles are not, and wait for their own 09:00. Waits are polls on what the API,
the fake or the log show, with deadlines; no latency is asserted (the one time bound, a retry
after its backoff, is a lower bound)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.routing import Route
from typer.testing import CliRunner

from tests.support.campaign_twilio import CampaignTwilio, Webhooks
from tests.support.poll import wait_until
from tests.support.redis_server import RedisServer
from tests.support.server import Server, start_server, stop_server
from voice.cli.main import app as cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

TOKEN = "campaign-api-token-51f0"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ACCOUNT_SID = "AC" + "7" * 32
TWILIO_TOKEN = "campaign-twilio-token-90ab"
HOOK_SECRET = "campaign-webhook-secret-3c2d"
OURS = "+15551110000"
PINNED = datetime(2026, 3, 10, 15, 0, tzinfo=UTC).timestamp()  # what the workers' hours read
OFFSET_S = PINNED - time.time()
BACKOFF_S = 1.0
GREETING = "Hi {name}, this is Acme about your appointment at {appointment_time}."
REMINDER = f"""
name: reminder
numbers: ["{OURS}"]
instructions: "You remind {{name|the customer}} of their appointment at {{appointment_time}}."
greeting: "{GREETING}"
builtin_tools: []
"""


def number(i: int) -> str:
    return f"+1555020{i:04d}"


def row(i: int, timezone: str | None = None, **variables: str) -> dict[str, Any]:
    found: dict[str, Any] = {"to": number(i), "variables": {"name": f"Caller {i}", **variables}}
    return found | ({"timezone": timezone} if timezone else {})


# The 30 rows: what each dial comes to, and how the row ends (status, attempts).
SCRIPT = {
    **{i: ["answer"] for i in (0, 1)},
    **{i: ["busy", "answer"] for i in (2, 3)},
    **{i: ["busy"] for i in (*range(4, 10), 20)},
    **{i: ["no-answer"] for i in range(10, 16)},
    **{i: ["failed"] for i in range(16, 20)},
    **{i: ["busy", "no-answer"] for i in (28, 29)},
}
ENDS = {
    **{i: ("answered", 1) for i in (0, 1)},
    **{i: ("answered", 2) for i in (2, 3)},
    **{i: ("busy", 2) for i in range(4, 10)},
    **{i: ("no_answer", 2) for i in (*range(10, 16), 28, 29)},
    **{i: ("failed", 1) for i in range(16, 20)},
    20: ("dnc", 1),  # put on the list while its first dial rang
    **{i: ("dnc", 0) for i in (21, 22, 23)},  # on the list from the start
}
NIGHT = {24: "Asia/Tokyo", 25: "Asia/Tokyo", 26: "Australia/Sydney", 27: "America/Los_Angeles"}
OPENS_H = {"Asia/Tokyo": 9, "Australia/Sydney": 7, "America/Los_Angeles": 1}  # after PINNED
DAY = ("America/New_York", "Europe/Paris", None)  # None: the campaign's, Europe/London


@pytest.fixture(scope="module")
def webhooks() -> Webhooks:
    return Webhooks(HOOK_SECRET)


@pytest.fixture(scope="module")
def twilio(webhooks: Webhooks) -> Iterator[CampaignTwilio]:
    receiver = Route("/hooks", webhooks.receive, methods=["POST"])
    script = {number(i): plan for i, plan in SCRIPT.items()}
    with CampaignTwilio(
        ACCOUNT_SID, TWILIO_TOKEN, extra_routes=[receiver], script=script, create_delay_s=0.3
    ) as api:
        yield api


@pytest.fixture(scope="module")
def workers(
    redis_server: RedisServer, twilio: CampaignTwilio, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Server, Server]]:
    agents = tmp_path_factory.mktemp("agents")
    (agents / "reminder.yaml").write_text(REMINDER, encoding="utf-8")
    env = {
        "HOTLINE_REDIS_URL": redis_server.url,
        "HOTLINE_API_TOKEN": TOKEN,
        "HOTLINE_AGENTS__DIR": str(agents),
        "HOTLINE_CALL_CONTROL__TWILIO_ACCOUNT_SID": ACCOUNT_SID,
        "HOTLINE_CALL_CONTROL__TWILIO_AUTH_TOKEN": TWILIO_TOKEN,
        "HOTLINE_CALL_CONTROL__TWILIO_API_URL": twilio.url,
        "HOTLINE_OUTBOUND__CALLS_PER_SECOND": "20",
        "HOTLINE_WEBHOOK__URL": f"{twilio.url}/hooks",
        "HOTLINE_WEBHOOK__SECRET": HOOK_SECRET,
        "HOTLINE_SESSIONS__HEARTBEAT_S": "0.5",
        "HOTLINE_SESSIONS__WORKER_TTL_S": "1.5",
        "HOTLINE_CAMPAIGNS__CLOCK_OFFSET_S": repr(OFFSET_S),
        "HOTLINE_CAMPAIGNS__TICK_S": "0.2",
        "HOTLINE_CAMPAIGNS__LEASE_S": "3",
        "HOTLINE_CAMPAIGNS__CHECK_S": "0.5",
        "HOTLINE_CAMPAIGNS__MAX_ROWS": "40",
        "HOTLINE_CAMPAIGNS__MAX_BODY_BYTES": "100000",
    }
    with ThreadPoolExecutor(2) as pool:
        a, b = pool.map(lambda _: start_server(env), range(2))
    yield a, b
    for server in (a, b):
        if server.process.poll() is None:
            assert stop_server(server) == 0, "\n".join(server.log[-40:])


def api(server: Server, method: str, path: str, body: object = None) -> httpx.Response:
    return httpx.request(method, f"{server.url}{path}", json=body, headers=AUTH, timeout=30)


def campaign(server: Server, campaign_id: str) -> dict[str, Any]:
    found = api(server, "GET", f"/campaigns/{campaign_id}")
    assert found.status_code == 200, found.text
    return found.json()


def ended(server: Server, campaign_id: str, within_s: float = 30) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        found = campaign(server, campaign_id)
        return found if found["state"] == "ended" else None

    return wait_until(check, f"campaign {campaign_id} to end", within_s=within_s)


def tcp_ports(server: Server) -> set[int]:
    """The local ports of the server process's TCP sockets (its connections to the fake)."""
    pid, inodes = server.process.pid, set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    lines = Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]
    return {int(f[1].rsplit(":", 1)[1], 16) for f in map(str.split, lines) if f[9] in inodes}


def call_webhook(webhooks: Webhooks, call_id: str) -> dict[str, Any] | None:
    found = [d for _, d in webhooks.of_event("call.ended") if d["call"]["call_id"] == call_id]
    return found[0] if found else None


def start_thirty(b: Server, twilio: CampaignTwilio) -> str:
    """The do-not-call list, then the campaign of 30 rows (through b); its id."""
    listed = api(b, "POST", "/dnc", {"numbers": ["+1 (555) 020-0021", number(22), number(23)]})
    assert listed.status_code == 200 and listed.json()["added"] == 3, listed.text

    async def list_20() -> None:  # while row 20's first dial rings, it goes on the list
        async with httpx.AsyncClient(headers=AUTH) as client:
            added = await client.post(f"{b.url}/dnc", json={"numbers": [number(20)]})
            assert added.status_code == 200

    twilio.on_placed[number(20)] = list_20
    rows = [row(i, NIGHT.get(i) or DAY[i % 3]) for i in range(30)]
    rows[0]["variables"] |= {"name": "Ada", "appointment_time": "3 pm"}
    rows[1]["variables"] |= {"name": "Grace", "appointment_time": "10 am"}
    body = {
        "name": "spring reminders",
        "agent": "reminder",
        "from": OURS,
        "rows": rows,
        "concurrency": 6,
        "timezone": "Europe/London",
        "retry": {"busy": 2, "no_answer": 2, "machine": 2, "backoff_s": BACKOFF_S},
    }
    made = api(b, "POST", "/campaigns", body)  # its calls' URLs are b's: a is the one to die
    assert made.status_code == 201, made.text
    assert made.json()["waiting_for_hours"] == len(NIGHT)
    return str(made.json()["campaign_id"])


def check_rows(found: dict[str, Any], twilio: CampaignTwilio) -> None:
    """Every row ended as the rules say, dialled exactly as often as it counts, one dial at a
    time and after the backoff; the night rows never, waiting for their 09:00."""
    by_row = {r["row"]: r for r in found["rows"]}
    for i, (status, attempts) in ENDS.items():
        seen = by_row[i]
        calls = twilio.dialled(number(i))
        assert (seen["status"], seen["attempts"], len(calls)) == (status, attempts, attempts), seen
        for first, then in itertools.pairwise(calls):  # one at a time, after backoff
            assert first.reported_at is not None and then.created_at >= first.reported_at
            assert then.created_at - first.reported_at >= BACKOFF_S
    assert by_row[2]["outcomes"] == ["busy", "answered"]
    assert by_row[28]["outcomes"] == ["busy", "no_answer"]
    assert by_row[20]["outcomes"] == ["busy"]
    for i, timezone in NIGHT.items():
        assert twilio.dialled(number(i)) == []
        assert (by_row[i]["status"], by_row[i]["waiting"]) == ("queued", "hours")
        opens_at = PINNED + OPENS_H[timezone] * 3600 - OFFSET_S
        assert by_row[i]["next_at"] == pytest.approx(opens_at, abs=1e-3)
    assert len(twilio.calls) == sum(attempts for _, attempts in ENDS.values())
    assert twilio.aborted >= 1  # a's create never was: its lease ran out, b dialled the row
    assert sum(r["retaken"] for r in found["rows"]) >= twilio.aborted
    unreported = [call for call in twilio.calls if call.callback_status != 204]
    assert not unreported, unreported  # with what broke the fake's side of each, if anything
    progress = found["progress"]
    assert (progress["answered"], progress["busy"], progress["no_answer"]) == (4, 6, 8)
    assert (progress["failed"], progress["dnc"], progress["attempts"]) == (4, 4, 39)
    assert progress["dialled"] == 39  # calls Twilio took (each once, whoever noted it)


def check_answered(b: Server, webhooks: Webhooks, found: dict[str, Any]) -> None:
    """The answered calls: the greeting said with the row's variables; the webhook has the row."""
    by_row = {r["row"]: r for r in found["rows"]}
    for i, name, at in ((0, "Ada", "3 pm"), (1, "Grace", "10 am")):
        call_id = by_row[i]["call_id"]
        call = api(b, "GET", f"/calls/{call_id}").json()
        expected = GREETING.format(name=name, appointment_time=at)
        assert call["history"][0]["content"] == expected
        metadata = call["metadata"]
        assert (metadata["campaign_id"], metadata["row"]) == (found["campaign_id"], i)
        hook = wait_until(lambda c=call_id: call_webhook(webhooks, c), "the call's webhook")
        assert hook["call"]["metadata"]["variables"]["name"] == name


def campaign_ended_hook(webhooks: Webhooks, campaign_id: str) -> tuple[dict[str, str], Any]:
    def check() -> tuple[dict[str, str], Any] | None:
        hooks = webhooks.of_event("campaign.ended")
        found = [(h, d) for h, d in hooks if d["campaign"]["campaign_id"] == campaign_id]
        return found[0] if found else None

    return wait_until(check, "the campaign.ended webhook", within_s=20)


def test_thirty_numbers_on_two_workers_one_killed_halfway(
    workers: tuple[Server, Server], twilio: CampaignTwilio, webhooks: Webhooks
) -> None:
    a, b = workers
    campaign_id = start_thirty(b, twilio)

    def a_dialling() -> bool:  # halfway, while Twilio is answering one of a's creates
        placed = any("placed (attempt" in line for line in a.log)
        return len(twilio.calls) >= 12 and placed and bool(twilio.pending & tcp_ports(a))

    wait_until(a_dialling, "worker a to be placing a call, halfway", within_s=30)
    a.process.kill()  # SIGKILL: its leases and calls in flight are left to b

    def day_rows_done() -> dict[str, Any] | None:
        found = campaign(b, campaign_id)
        done = found["progress"]["remaining"] == len(NIGHT) and not found["progress"]["in_flight"]
        return found if done else None

    found = wait_until(day_rows_done, "every day row to be done", within_s=60)
    check_rows(found, twilio)
    check_answered(b, webhooks, found)
    stopped = api(b, "POST", f"/campaigns/{campaign_id}/stop")
    assert stopped.json() == {"campaign_id": campaign_id, "state": "stopped"}
    final = ended(b, campaign_id)
    assert final["ended_as"] == "stopped" and final["progress"]["stopped"] == len(NIGHT)
    headers, document = campaign_ended_hook(webhooks, campaign_id)
    assert headers["x-hotline-call-id"] == campaign_id and webhooks.refused == 0
    assert document["campaign"]["ended_as"] == "stopped"
    assert {r["row"]: r["status"] for r in document["rows"]} == {
        r["row"]: r["status"] for r in final["rows"]
    }


def test_a_paused_campaign_dials_nothing_until_resumed(
    workers: tuple[Server, Server], twilio: CampaignTwilio, webhooks: Webhooks, tmp_path: Path
) -> None:
    _, b = workers
    numbers = [number(i) for i in range(40, 43)]
    twilio.script |= {n: ["failed"] for n in [*numbers, number(43)]}
    csv = tmp_path / "calls.csv"
    csv.write_text("to,name,appointment_time\n" + "".join(f"{n},Pat,9 am\n" for n in numbers))
    argv = ["campaign", "run", str(csv), "--agent", "reminder", "--from", OURS]
    argv += ["--concurrency", "1", "--timezone", "Europe/London", "--url", b.url]
    result = CliRunner().invoke(cli, [*argv, "--token", TOKEN])
    assert result.exit_code == 0, result.output
    campaign_id = result.output.split()[1].rstrip(":")
    paused = api(b, "POST", f"/campaigns/{campaign_id}/pause")
    assert paused.json()["state"] == "paused"
    assert api(b, "POST", f"/campaigns/{campaign_id}/pause").json()["state"] == "paused"
    wait_until(lambda: campaign(b, campaign_id)["progress"]["in_flight"] == 0, "in flight ends")
    before = sum(len(twilio.dialled(n)) for n in numbers)
    # Another campaign runs meanwhile, on the same runner: once it has ended, the paused one
    # has been visited too, and nothing of it was dialled.
    other = {"agent": "reminder", "from": OURS, "rows": [{"to": number(43)}]}
    other_id = api(b, "POST", "/campaigns", {**other, "timezone": "Europe/Paris"}).json()
    assert ended(b, other_id["campaign_id"])["progress"]["failed"] == 1
    assert sum(len(twilio.dialled(n)) for n in numbers) == before <= 1
    assert campaign(b, campaign_id)["state"] == "paused"
    assert api(b, "POST", f"/campaigns/{campaign_id}/resume").json()["state"] == "running"
    final = ended(b, campaign_id)
    assert final["ended_as"] == "completed" and final["progress"]["failed"] == 3
    assert [len(twilio.dialled(n)) for n in numbers] == [1, 1, 1]
    assert api(b, "POST", f"/campaigns/{campaign_id}/resume").status_code == 409
    argv = ["campaign", "status", campaign_id, "--rows", "--url", b.url, "--token", TOKEN]
    shown = CliRunner().invoke(cli, argv)
    assert shown.exit_code == 0 and "ended (completed)" in shown.output, shown.output
    assert "3 failed" in shown.output and shown.output.count(" failed ") == 3
    _, document = campaign_ended_hook(webhooks, campaign_id)
    assert document["campaign"]["ended_as"] == "completed" and len(document["rows"]) == 3


def test_bad_campaigns_are_refused_with_what_is_wrong(workers: tuple[Server, Server]) -> None:
    _, b = workers
    good = {"agent": "reminder", "from": OURS, "rows": [{"to": number(50)}]}
    cases = [
        ({**good, "agent": "nobody"}, 422, "agent: no agent 'nobody'"),
        ({**good, "rows": [{"to": "555"}]}, 422, "rows[0].to: '555' is not a phone number"),
        ({**good, "rows": [{"to": number(50), "timezone": "Mars/Base"}]}, 422, "rows[0].timezone"),
        ({**good, "rows": [{"to": number(50)}, {"to": "+1 555 020 0050"}]}, 422, "rows[1].to"),
        ({**good, "window": {"start": "9am"}}, 422, "window.start"),
        ({**good, "rows": [{"to": number(i)} for i in range(41)]}, 422, "more than the 40"),
        ({**good, "colour": "red"}, 422, "colour: unknown field"),
        ({**good, "rows": []}, 422, "rows: required"),
        ({**good, "voicemail": "Call us"}, 422, "voicemail: needs machine_detection"),
        ({**good, "rows": [{"to": number(50), "variables": {"a b": "x"}}]}, 422, "not a name"),
        ({**good, "name": "x" * 200_000}, 413, "body larger than 100000 bytes"),
    ]
    for body, status, said in cases:
        refused = api(b, "POST", "/campaigns", body)
        assert (refused.status_code, said in refused.json()["error"]) == (status, True), said
    unauthorised = httpx.post(f"{b.url}/campaigns", json=good, timeout=10)
    assert unauthorised.status_code == 401
    assert api(b, "GET", "/campaigns/0123456789abcdef").status_code == 404
    assert api(b, "POST", "/campaigns/0123456789abcdef/stop").status_code == 404
    assert api(b, "POST", "/dnc", {"numbers": ["12"]}).status_code == 422
    assert api(b, "POST", "/dnc", {"numbers": ["+1 555 020 0099"]}).status_code == 200
    assert api(b, "GET", "/dnc?number=%2B15550200099").json()["listed"] is True
    forged = httpx.post(
        f"{b.url}/twilio/status?campaign=x&row=0&claim=y",
        data={"CallSid": "CA" + "0" * 32, "CallStatus": "busy"},
        headers={"X-Twilio-Signature": "forged"},
    )
    assert forged.status_code == 403
    page = httpx.get(f"{b.url}/console/campaigns", headers=AUTH, timeout=10)
    assert page.status_code == 200 and "Campaigns" in page.text
    made = api(b, "POST", "/campaigns", {**good, "rows": [{"to": number(51)}]})
    assert made.status_code == 201, made.text
    listed = api(b, "GET", "/campaigns").json()["campaigns"]
    assert made.json()["campaign_id"] in [c["campaign_id"] for c in listed]
    assert all("progress" in c for c in listed)
    api(b, "POST", f"/campaigns/{made.json()['campaign_id']}/stop")


def test_calls_per_second_are_counted_across_workers(redis_server: RedisServer) -> None:
    """Two workers' budgets in one Redis: the second sees what the first took."""
    import redis.asyncio as aioredis

    from voice.outbound.rate import ClusterCallRate

    async def run() -> None:
        client = aioredis.from_url(redis_server.url, decode_responses=True)
        now = [1000.0]
        one, two = (ClusterCallRate(client, "rate-test", 2.0, lambda: now[0]) for _ in range(2))
        assert [await one.take("twilio"), await two.take("twilio")] == [None, None]
        assert await two.take("twilio") == pytest.approx(0.5)
        assert await one.wait_s("twilio") == pytest.approx(0.5)
        assert await one.take("telnyx") is None  # its own budget
        now[0] += 0.5
        assert await two.take("twilio") is None
        await client.aclose()

    asyncio.run(run())

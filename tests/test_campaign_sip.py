"""A campaign dialled over SIP (`"transport": "sip"`) by a real `hotline serve` with a real Redis,
through a trunk that is the scripted user agent server over real UDP (tests/support/
scripted_uas.py): one number is busy (486) and answers on its retry, one declines (603), one
rings until the campaign's ring timeout (CANCEL, 487). Each row is settled from its call's
record (`outcome.cause`), as the rules say: busy retried, declined failed, no answer not
retried after its last attempt. The answered call really talks (our RTP reaches the UAS) and
is hung up through the API. Waits are polls with deadlines; no latency is asserted."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from tests.support.poll import until
from tests.support.redis_server import RedisServer
from tests.support.scripted_uas import ScriptedUas
from tests.support.server import Server, free_port, start_server, stop_server
from voice.cli.main import app as cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

PINNED = datetime(2026, 3, 10, 15, 0, tzinfo=UTC).timestamp()  # inside 09:00-20:00 UTC
OURS = "+15551110000"
BUSY_THEN_ANSWER, DECLINES, RINGS = "+15557650001", "+15557650002", "+15557650003"
REMINDER = """
name: reminder
instructions: "You remind {name|the customer} of their appointment."
greeting: "Hi {name}, this is Acme about your appointment."
builtin_tools: []
"""


@dataclass
class Dialler:
    server: Server
    trunk_port: int


@pytest.fixture(scope="module")
def dialler(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Dialler]:
    agents = tmp_path_factory.mktemp("agents")
    (agents / "reminder.yaml").write_text(REMINDER, encoding="utf-8")
    port = free_port()
    trunks = [{"name": "pbx", "host": f"127.0.0.1:{port}", "from_number": OURS}]
    server = start_server(
        {
            "HOTLINE_REDIS_URL": redis_server.url,
            "HOTLINE_AGENTS__DIR": str(agents),
            "HOTLINE_SIP__ENABLED": "true",
            "HOTLINE_SIP__PORT": str(free_port()),
            "HOTLINE_SIP__TRUNKS": json.dumps(trunks),
            "HOTLINE_OUTBOUND__CALLS_PER_SECOND": "20",
            "HOTLINE_CAMPAIGNS__CLOCK_OFFSET_S": repr(PINNED - time.time()),
            "HOTLINE_CAMPAIGNS__TICK_S": "0.2",
            "HOTLINE_CAMPAIGNS__CHECK_S": "0.3",
        }
    )
    yield Dialler(server, port)
    assert stop_server(server) == 0, "\n".join(server.log[-40:])


async def api(server: Server, method: str, path: str, body: object = None) -> httpx.Response:
    async with httpx.AsyncClient(timeout=30) as client:
        return await client.request(method, f"{server.url}{path}", json=body)


async def rows(server: Server, campaign_id: str) -> dict[str, dict[str, Any]]:
    found = await api(server, "GET", f"/campaigns/{campaign_id}")
    assert found.status_code == 200, found.text
    return {r["to"]: r for r in found.json()["rows"]}


def campaign_body(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "agent": "reminder",
        "transport": "sip",
        "trunk": "pbx",
        "ring_timeout_s": 1,
        "retry": {"busy": 2, "no_answer": 1, "backoff_s": 0.2},
        "rows": [
            {"to": BUSY_THEN_ANSWER, "variables": {"name": "Ada"}},
            {"to": DECLINES},
            {"to": RINGS},
        ],
    }
    return {**body, **changes}


async def test_a_sip_campaign_retries_busy_fails_a_decline_and_gives_up_on_no_answer(
    dialler: Dialler,
) -> None:
    server = dialler.server
    plays = {BUSY_THEN_ANSWER: ["busy", "answer"], DECLINES: ["decline"], RINGS: ["ring"]}
    async with ScriptedUas(dialler.trunk_port, plays=plays) as uas:
        created = await api(server, "POST", "/campaigns", campaign_body())
        assert created.status_code == 201, created.text
        campaign_id = created.json()["campaign_id"]

        async def answered_call() -> str | None:
            row = (await rows(server, campaign_id))[BUSY_THEN_ANSWER]
            if row["attempts"] < 2 or not row["call_id"]:
                return None
            call = await api(server, "GET", f"/calls/{row['call_id']}")
            active = call.status_code == 200 and call.json().get("state") == "active"
            return str(row["call_id"]) if active and uas.rtp_packets >= 10 else None

        call_id = await until(answered_call, "the retry to be answered and talk", 30, every_s=0.1)
        hung_up = await api(server, "POST", f"/calls/{call_id}/hangup")
        assert hung_up.status_code == 200, hung_up.text

        async def done() -> dict[str, Any] | None:
            found = await api(server, "GET", f"/campaigns/{campaign_id}")
            return found.json() if found.json()["state"] == "ended" else None

        final = await until(done, "the campaign to end", 30, every_s=0.1)
    by_number = {r["to"]: r for r in final["rows"]}
    answered = by_number[BUSY_THEN_ANSWER]
    assert (answered["status"], answered["outcomes"]) == ("answered", ["busy", "answered"])
    assert answered["call_id"] == call_id
    declined = by_number[DECLINES]
    assert (declined["status"], declined["attempts"]) == ("failed", 1)
    assert "603" in declined["end_reason"]
    rang = by_number[RINGS]
    assert (rang["status"], rang["outcomes"]) == ("no_answer", ["no_answer"])
    assert final["trunk"] == "pbx"
    invites = [m.uri for m in uas.requests("INVITE")]
    assert sum(BUSY_THEN_ANSWER in (uri or "") for uri in invites) == 2
    assert len(uas.requests("CANCEL")) == 1


async def test_sip_campaigns_name_a_trunk_that_is_one(dialler: Dialler, tmp_path: Path) -> None:
    wrong = await api(dialler.server, "POST", "/campaigns", campaign_body(trunk="nope"))
    assert wrong.status_code == 422, wrong.text
    assert "no trunk 'nope'" in wrong.json()["error"]
    twilio = await api(dialler.server, "POST", "/campaigns", campaign_body(transport="twilio"))
    assert twilio.status_code == 422
    assert "trunk: only with transport sip" in twilio.text
    csv = tmp_path / "calls.csv"
    csv.write_text("to\n+15550300001\n")
    argv = ["campaign", "run", str(csv), "--agent", "reminder", "--transport", "sip"]
    argv += ["--trunk", "nope", "--url", dialler.server.url]
    said = await asyncio.to_thread(CliRunner().invoke, cli, argv)  # no --from: the trunk's
    assert said.exit_code != 0 and "no trunk 'nope'" in said.output, said.output

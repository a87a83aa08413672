"""`hotline test`: the shipped scenarios pass against the example agents, and each kind of
expectation fails against a deliberately broken copy of them.

One real server (embedded simulator, piper, whisper, SIP on, an API token, the testing API's
tool mocks allowed) for the module, on copies of the example agents plus two broken ones; the
calls go over the emulated Twilio phone, and two shipped scenarios once more over SIP (UDP, TCP)
and Vonage; the order lookup goes over the real HTTP tool path to the runner's signed mock
endpoint. All the scenarios run once, together, four calls at a time, beside one more call
whose tool mocks are set through the server's testing API (after strangers were refused); the
tests read their rows."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from tests.support.server import Server, start_server, stop_server
from voice.agents.http_tools import SIGNATURE_HEADER, sign
from voice.audio import write_wav
from voice.cli.main import app
from voice.evals.calls import CallWatch, call_record, turn_audio
from voice.evals.checks import Outcome
from voice.evals.lines import Target, place_call
from voice.evals.mocks import MockTools
from voice.evals.report import Row, result_text, rows, write_junit
from voice.evals.runner import Attempt, Prepared, prepare, run_suite
from voice.evals.scenario import Mock, Scenario, Turn, load_scenarios

DEPLOY_AGENTS = Path(__file__).resolve().parent.parent / "deploy" / "agents"
SHIPPED = DEPLOY_AGENTS / "tests"
TOKEN = "evals-api-token-" + "7" * 24  # the module server's HOTLINE_API_TOKEN
# With an API token, Twilio's webhooks must be signed: the run signs them with this.
TWILIO = "evals-twilio-auth-" + "5" * 14


def _edit(path: Path, into: Path, **changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    data.update(changes)
    (into / path.name.replace(".yaml", "-broken.yaml")).write_text(yaml.safe_dump(data))
    return data


def _broken_agents(agents: Path) -> None:
    """The receptionist without its front desk and with a greeting that says "closed"; the
    order line with its tool under another name and no end_call."""
    for path in DEPLOY_AGENTS.glob("*.yaml"):
        shutil.copy(path, agents)
    receptionist = DEPLOY_AGENTS / "receptionist.yaml"
    billing = yaml.safe_load(receptionist.read_text())["transfer"]["targets"]["billing"]
    _edit(
        receptionist,
        agents,
        name="receptionist-broken",
        numbers=["+15551239901"],
        webrtc=False,
        greeting="Acme Dental is closed today, how can I help?",
        transfer={"default": "billing", "targets": {"billing": billing}},
    )
    orders = DEPLOY_AGENTS / "order-status.yaml"
    tool = yaml.safe_load(orders.read_text())["tools"][0]
    tool.update(name="order_lookup", url="http://127.0.0.1:9/nothing-listens-here")
    tool.pop("headers")
    _edit(
        orders,
        agents,
        name="order-status-broken",
        numbers=["+15559879901"],
        builtin_tools=[],
        tools=[tool],
    )


def _broken_scenarios(into: Path) -> None:
    """The receptionist's and the order line's shipped scenarios, pointed at the broken agents;
    the order one `strict`, with a budget its goodbye turn cannot meet."""
    _edit(SHIPPED / "receptionist.yaml", into, agent="receptionist-broken", judge=None)
    spoken, goodbye = yaml.safe_load((SHIPPED / "order-status.yaml").read_text())["turns"]
    goodbye["expect"]["budget_ms"] = 1
    _edit(
        SHIPPED / "order-status.yaml",
        into,
        agent="order-status-broken",
        strict=True,
        turns=[spoken, goodbye],
    )


def _over(into: Path, path: Path, transport: str, **changes: Any) -> None:
    """The shipped scenario at `path`, placed over `transport` (named `<stem>-<transport>`)."""
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    data.update(name=f"{path.stem}-{transport}", transport=transport, **changes)
    (into / f"{path.stem}-{transport}.yaml").write_text(yaml.safe_dump(data))


@dataclass
class Probe:
    """A call whose tool mocks were set through the testing API: what each request got, and
    the server's record of the call."""

    call_id: str = ""
    statuses: dict[str, int] = field(default_factory=dict)
    record: dict[str, Any] = field(default_factory=dict)


async def _probe_mocks(url: str, prepared: Prepared) -> Probe:
    """One keypad call to the order line over Twilio; once answered, strangers try to set its
    mocks (no token, a wrong one), then the token's holder (a tool the agent lacks, a call
    that does not exist, the real one, once more)."""
    probe = Probe()
    body = {"mocks": {"order_status": {"answer": {"order": "11223344", "status": "delivered"}}}}

    class Probing(CallWatch):
        async def answered(self) -> None:
            path = f"/calls/{self.call_id}/mocks"
            tries: dict[str, tuple[str, dict[str, Any], str | None]] = {
                "no token": (path, body, None),
                "wrong token": (path, body, TOKEN[:-1] + "8"),
                "unknown tool": (path, {"mocks": {"order_lookup": {}}}, TOKEN),
                "unknown call": ("/calls/CA0000/mocks", body, TOKEN),
                "set": (path, body, TOKEN),
                "again": (path, body, TOKEN),
            }
            async with httpx.AsyncClient(base_url=url) as http:
                for name, (where, sent, token) in tries.items():
                    headers = {"Authorization": f"Bearer {token}"} if token else {}
                    response = await http.put(where, json=sent, headers=headers)
                    probe.statuses[name] = response.status_code
            await super().answered()

    async def nothing(call_id: str) -> None:
        return None

    scenario = Scenario(agent="order-status", name="probe", turns=[Turn(keys="11223344#")])
    target = Target(url, TOKEN, twilio_auth_token=TWILIO)
    call = await place_call(target, scenario, "+15559870000", [None], Probing(url, TOKEN, nothing))
    probe.call_id, probe.record = call.call_id, await call_record(url, call.call_id, TOKEN)
    return probe


@dataclass
class Run:
    server: Server
    prepared: Prepared
    scenarios: list[Scenario]
    table: list[Row]
    agents: Path
    probe: Probe


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    base = tmp_path_factory.mktemp("evals")
    agents, broken, transports = base / "agents", base / "broken", base / "transports"
    for folder in (agents, broken, transports):
        folder.mkdir()
    _broken_agents(agents)
    _broken_scenarios(broken)
    _over(transports, SHIPPED / "receptionist.yaml", "sip")
    _over(transports, SHIPPED / "receptionist.yaml", "vonage")
    _over(transports, SHIPPED / "order-status-keypad.yaml", "sip", sip_transport="tcp")
    scenarios = load_scenarios(SHIPPED) + load_scenarios(broken) + load_scenarios(transports)
    prepared = prepare(scenarios, agents, base / "work")
    assert prepared.sip_port is not None  # a SIP scenario: the server takes SIP calls
    env = {"HOTLINE_API_TOKEN": TOKEN, "HOTLINE_TELEPHONY__TWILIO_AUTH_TOKEN": TWILIO}
    env["HOTLINE_TESTING__ALLOW_MOCKS"] = "true"
    server = start_server({**prepared.server_env(), **env})
    try:
        target = prepared.target(server.url)
        target.token, target.twilio_auth_token = TOKEN, TWILIO

        async def calls() -> tuple[list[Attempt], Probe]:
            # Four calls at a time: all eight at once starved the other test workers of CPU.
            suite = run_suite(scenarios, prepared, target, parallel=4)
            return await asyncio.gather(suite, _probe_mocks(server.url, prepared))

        attempts, probe = asyncio.run(calls())
        yield Run(server, prepared, scenarios, rows(attempts), agents, probe)
    finally:
        prepared.close()
        stop_server(server)


def _rows(run: Run, scenario: str, status: str | None = None) -> dict[str, Row]:
    return {
        f"{r.where}: {r.expectation}": r
        for r in run.table
        if r.scenario == scenario and (status is None or r.status == status)
    }


@pytest.mark.slow
def test_the_shipped_scenarios_pass(run: Run) -> None:
    for scenario in ("receptionist", "order-status", "order-status-keypad"):
        mine = _rows(run, scenario)
        assert not _rows(run, scenario, "fail"), mine
        assert len(_rows(run, scenario, "pass")) >= 2, mine
    # The lookup went over the real HTTP tool path, signed, to the mock the scenario names.
    asked = [(r.tool, r.arguments) for r in run.prepared.mocks.requests]
    assert ("order_status", {"order_number": "12345678"}) in asked
    assert ("order_status", {"order_number": "87654321"}) in asked  # keyed in


@pytest.mark.slow
def test_the_scenarios_pass_over_sip_and_vonage(run: Run) -> None:
    for scenario in ("receptionist-sip", "receptionist-vonage", "order-status-keypad-sip"):
        mine = _rows(run, scenario)
        assert not _rows(run, scenario, "fail"), mine
        assert len(_rows(run, scenario, "pass")) >= 2, mine
    # The transfers went by REFER and by Vonage's API (the run's), read from the call record.
    for scenario in ("receptionist-sip", "receptionist-vonage"):
        assert "call: transferred to front_desk" in _rows(run, scenario, "pass")
    # Keys over SIP (RFC 4733), answered by the mock of the call the server listed as SIP's.
    keyed = [r for r in run.prepared.mocks.requests if r.arguments == {"order_number": "87654321"}]
    assert len(keyed) == 2 and {r.call_id[:2] for r in keyed} != {"CA"}, keyed
    # The keypad scenario's `sip_transport: tcp` put its SIP on a TCP connection.
    assert any(" over TCP (+15555550123 to +15559870000" in line for line in run.server.log)


@pytest.mark.slow
def test_the_testing_api_sets_one_calls_mocks_for_the_token_holder_only(run: Run) -> None:
    assert run.probe.statuses == {
        "no token": 401,
        "wrong token": 401,
        "unknown tool": 400,
        "unknown call": 404,
        "set": 200,
        "again": 409,  # once a call
    }
    records = run.probe.record["records"]
    tools = [(t["name"], json.loads(t["arguments"])) for r in records for t in r["tools"]]
    assert tools == [("order_status", {"order_number": "11223344"})], records
    assert "delivered" in " ".join(r["reply_text"] for r in records), records
    # The server answered it: the tool's URL (the runner's endpoint) was never asked.
    assert not [r for r in run.prepared.mocks.requests if r.call_id == run.probe.call_id]


@pytest.mark.slow
def test_a_renamed_tool_fails_the_tool_and_reply_checks(run: Run) -> None:
    failed = _rows(run, "order-status-broken", "fail")
    tool = failed["turn 1: tool order_status called with order_number='12345678'"]
    assert "order_lookup(" in tool.detail  # what it called instead
    assert "turn 1: reply contains 'shipped'" in failed
    assert "turn 1: reply matches /eta friday/" in failed
    assert "sorry" in failed["turn 1: reply avoids 'sorry'"].detail.lower()


@pytest.mark.slow
def test_an_agent_that_cannot_hang_up_fails_ended(run: Run) -> None:
    failed = _rows(run, "order-status-broken", "fail")
    assert "turn 2: tool end_call called" in failed
    assert "call: the agent ended the call" in failed


@pytest.mark.slow
def test_a_missing_transfer_target_fails(run: Run) -> None:
    row = _rows(run, "receptionist-broken")["call: transferred to front_desk"]
    assert row.status == "fail"
    assert "no transfer target 'front_desk' (targets: billing)" in row.detail
    assert "transferred to sip:billing@pbx.example.com" in row.detail


@pytest.mark.slow
def test_a_forbidden_word_fails(run: Run) -> None:
    row = _rows(run, "receptionist-broken")["call: reply avoids 'closed'"]
    assert row.status == "fail"
    assert "closed today" in row.detail


@pytest.mark.slow
def test_a_late_reply_fails_only_a_strict_scenario(run: Run) -> None:
    late = _rows(run, "order-status-broken")["turn 2: reply heard within budget"]
    assert late.status == "fail" and "(budget 1 ms)" in late.detail
    shipped = [r for r in run.table if not r.scenario.endswith("-broken")]
    budget = [r for r in shipped if r.expectation == "reply heard within budget"]
    assert budget and all(r.status in ("pass", "warn") for r in budget)


@pytest.mark.slow
def test_the_judge_is_skipped_with_the_simulator(run: Run) -> None:
    judge = _rows(run, "receptionist")["call: judge"]
    assert judge.status == "skip" and "embedded simulator" in judge.detail


@pytest.mark.slow
def test_junit_lists_the_failures(run: Run, tmp_path: Path) -> None:
    write_junit(run.table, tmp_path / "junit.xml")
    root = ET.parse(tmp_path / "junit.xml").getroot()
    failures = [case for case in root.iter("testcase") if case.find("failure") is not None]
    assert (
        int(root.get("failures", ""))
        == len(failures)
        == len([r for r in run.table if r.status == "fail"])
    )
    names = {(c.get("classname"), c.get("name")) for c in failures}
    assert ("receptionist-broken", "call: reply avoids 'closed'") in names
    suites = {s.get("name"): s for s in root.iter("testsuite")}
    assert suites["receptionist"].get("failures") == "0"


@pytest.mark.slow
def test_the_command_exits_non_zero_on_failure(run: Run, tmp_path: Path) -> None:
    scenarios = tmp_path / "scenarios"
    scenarios.mkdir()
    shutil.copy(SHIPPED / "receptionist.yaml", scenarios)
    _edit(SHIPPED / "receptionist.yaml", scenarios, agent="receptionist-broken", judge=None)
    # Mocks against a running server: set on the call through its testing API.
    (scenarios / "mocked.yaml").write_text(
        "agent: order-status\n"
        "mocks: {order_status: {answer: {order: '55667788', status: out for delivery}}}\n"
        "turns:\n"
        "  - keys: '55667788#'\n"
        "    expect: {tool_called: {name: order_status}, reply_contains: [out for delivery]}\n"
    )
    junit = tmp_path / "junit.xml"
    argv = ["test", str(scenarios), "--url", run.server.url, "--agents", str(run.agents)]
    argv += ["--token", TOKEN, "--auth-token", TWILIO, "--parallel", "3", "--junit", str(junit)]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 1, result.output
    root = ET.parse(junit).getroot()
    suites = {s.get("name"): s.get("failures") for s in root.iter("testsuite")}
    assert suites["receptionist"] == "0" and suites["receptionist-broken"] != "0", suites
    assert suites["mocked"] == "0", result.output
    asked = [r.arguments for r in run.prepared.mocks.requests]
    assert {"order_number": "55667788"} not in asked  # the server answered it


def test_repeats_mark_a_check_that_both_passed_and_failed_flaky() -> None:
    scenario = Scenario(agent="receptionist", name="s", turns=[Turn(say="hi")])
    attempts = [
        Attempt(scenario, i, [Outcome("s", 0, "reply contains 'hi'", status, f"heard {i}")])
        for i, status in enumerate(["pass", "fail", "pass"])
    ]
    [row] = rows(attempts)
    assert (row.status, row.passed, row.runs, row.flaky) == ("fail", 2, 3, True)
    assert result_text(row) == "FAIL 2/3 flaky" and row.detail == "heard 1"


def test_a_wav_turn_plays_the_file(tmp_path: Path) -> None:
    tone = (np.sin(np.arange(8000) / 5) * 8000).astype(np.int16)
    write_wav(tmp_path / "caller.wav", tone)
    assert np.array_equal(turn_audio(Turn(wav=Path("caller.wav")), tmp_path), tone)


def test_the_mock_endpoint_answers_only_signed_requests_of_its_calls() -> None:
    mocks = MockTools(b"secret")
    scenario = Scenario(
        agent="a", name="s", turns=[Turn(say="hi")], mocks={"lookup": Mock(answer={"ok": 1})}
    )
    mocks.expect_call("CA1", scenario)
    try:
        body = json.dumps({"call_id": "CA1", "tool": "lookup", "arguments": {}}).encode()
        signed = {SIGNATURE_HEADER: sign(b"secret", body, int(time.time()))}
        url = mocks.url_for("lookup")
        assert httpx.post(url, content=body, headers=signed).json() == {"ok": 1}
        assert httpx.post(url, content=body).status_code == 401
        other = httpx.post(mocks.url_for("other"), content=body, headers=signed)
        assert other.status_code == 404 and "no mock for the other tool" in other.text
    finally:
        mocks.close()

"""`hotline test`: the shipped scenarios pass against the example agents, and each kind of
expectation fails against a deliberately broken copy of them.

One real server (embedded simulator, piper, whisper, SIP on) for the module, on copies of the
example agents plus two broken ones; the calls go over the emulated Twilio phone, and two
shipped scenarios once more over SIP and Vonage; the order lookup goes over the real HTTP tool
path to the runner's signed mock endpoint. All the scenarios run once, together, every call at
once; the tests read their rows."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
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
from voice.evals.calls import turn_audio
from voice.evals.checks import Outcome
from voice.evals.mocks import MockTools
from voice.evals.report import Row, result_text, rows, write_junit
from voice.evals.runner import Attempt, Prepared, prepare, run_suite
from voice.evals.scenario import Mock, Scenario, Turn, load_scenarios

DEPLOY_AGENTS = Path(__file__).resolve().parent.parent / "deploy" / "agents"
SHIPPED = DEPLOY_AGENTS / "tests"


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


def _over(into: Path, path: Path, transport: str) -> None:
    """The shipped scenario at `path`, placed over `transport` (named `<stem>-<transport>`)."""
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    data.update(name=f"{path.stem}-{transport}", transport=transport)
    (into / f"{path.stem}-{transport}.yaml").write_text(yaml.safe_dump(data))


@dataclass
class Run:
    server: Server
    prepared: Prepared
    scenarios: list[Scenario]
    table: list[Row]
    agents: Path


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
    _over(transports, SHIPPED / "order-status-keypad.yaml", "sip")
    scenarios = load_scenarios(SHIPPED) + load_scenarios(broken) + load_scenarios(transports)
    prepared = prepare(scenarios, agents, base / "work")
    assert prepared.sip_port is not None  # a SIP scenario: the server takes SIP calls
    server = start_server(prepared.server_env())
    try:
        target = prepared.target(server.url)
        # Four calls at a time: all eight at once starved the other test workers of CPU.
        attempts = asyncio.run(run_suite(scenarios, prepared, target, parallel=4))
        yield Run(server, prepared, scenarios, rows(attempts), agents)
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


def test_keys_over_webrtc_are_refused_naming_file_and_field(tmp_path: Path) -> None:
    keyed = tmp_path / "keyed.yaml"
    keyed.write_text("agent: receptionist\ntransport: webrtc\nturns:\n  - keys: '1'\n")
    result = CliRunner().invoke(app, ["test", str(keyed)])
    assert result.exit_code == 2
    assert f"{keyed}: turns[0].keys: a WebRTC call has no keypad (transport: webrtc)" in (
        result.output
    )


def test_the_transport_option_overrides_every_scenario(tmp_path: Path) -> None:
    assert {s.transport for s in load_scenarios(SHIPPED, "sip")} == {"sip"}
    assert {s.transport for s in load_scenarios(SHIPPED)} == {"twilio"}
    result = CliRunner().invoke(app, ["test", str(SHIPPED), "--transport", "webrtc"])
    assert result.exit_code == 2
    keypad = SHIPPED / "order-status-keypad.yaml"
    expected = f"{keypad}: turns[0].keys: a WebRTC call has no keypad (--transport webrtc)"
    assert expected in result.output.splitlines(), result.output


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
    junit = tmp_path / "junit.xml"
    argv = ["test", str(scenarios), "--url", run.server.url, "--agents", str(run.agents)]
    result = CliRunner().invoke(app, [*argv, "--parallel", "2", "--junit", str(junit)])
    assert result.exit_code == 1, result.output
    root = ET.parse(junit).getroot()
    suites = {s.get("name"): s.get("failures") for s in root.iter("testsuite")}
    assert suites["receptionist"] == "0" and suites["receptionist-broken"] != "0", suites


def test_a_bad_scenario_file_names_file_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "agent: receptionist\n"
        "turns:\n"
        "  - say: hello\n"
        "    expect: {reply_contain: [hi], tool_called: {nam: end_call}}\n"
        "  - keys: 12a\n"
        "  - {say: hi, keys: '1'}\n"
        "  - {say: hi, expect: {reply_matches: '(unclosed'}}\n"
        "timeout: 3\n"
    )
    result = CliRunner().invoke(app, ["test", str(bad)])
    assert result.exit_code == 2
    lines = set(result.output.splitlines())
    assert {
        f"{bad}: turns[0].expect.reply_contain: unknown field (did you mean 'reply_contains'?)",
        f"{bad}: turns[0].expect.tool_called[0].nam: unknown field (did you mean 'name'?)",
        f"{bad}: turns[0].expect.tool_called[0].name: required",
        f"{bad}: turns[1].keys: keypad digits are 0-9, * and # (at most 32)",
        f"{bad}: turns[2]: a turn has one of say, wav or keys (this one has ['say', 'keys'])",
        f"{bad}: timeout: unknown field",
    } <= lines, result.output
    assert any(
        line.startswith(f"{bad}: turns[3].expect.reply_matches: not a regular") for line in lines
    )


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


def test_a_missing_agents_directory_is_an_error(tmp_path: Path) -> None:
    argv = ["test", str(SHIPPED), "--agents", str(tmp_path / "none")]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2
    assert f"{tmp_path / 'none'}: not a directory of agent files" in result.output

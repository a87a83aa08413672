"""`hotline test` as a command: scenario files refused naming file and field, a run on a server
of its own (started in the command's own process, its SIP over TLS with a certificate made for
the run), and the testing API that sets tool mocks on a running server, refused unless the
server allows it (the mocks set for real: tests/test_evals.py)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from voice.cli.main import app
from voice.evals.scenario import load_scenarios
from voice.server.app import create_app
from voice.server.settings import Settings

SHIPPED = Path(__file__).resolve().parent.parent / "deploy" / "agents" / "tests"


@pytest.mark.slow
def test_a_run_serves_its_agents_in_process_and_calls_over_sip_tls(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOTLINE_SIMULATOR__REPLIES", "short")  # as tests/support/server.py has it
    keypad = SHIPPED / "order-status-keypad.yaml"
    argv = ["test", str(keypad), "--transport", "sip", "--sip-transport", "tls"]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    assert "3 pass" in result.output, result.output
    # The server ran in this process (its log is this process's) and took the call over TLS.
    started = [r.getMessage() for r in caplog.records if r.name.startswith("voice.server")]
    assert any(" over TLS (+15555550123 to +15559870000" in line for line in started), started


async def test_the_testing_api_is_off_unless_allowed_and_needs_an_api_token() -> None:
    body = {"mocks": {"order_status": {"answer": {"status": "shipped"}}}}
    allowed = {"allow_mocks": True}
    for settings, status in [
        (Settings(api_token=None, testing={"allow_mocks": False}), 404),
        (Settings(api_token="right-token", testing={"allow_mocks": False}), 404),
        (Settings(api_token=None, testing=allowed), 403),  # never open to anyone
        (Settings(api_token="right-token", testing=allowed), 401),  # a wrong token
    ]:
        transport = httpx.ASGITransport(create_app(settings))
        async with httpx.AsyncClient(transport=transport, base_url="http://hotline") as http:
            wrong = {"Authorization": "Bearer wrong-token"}
            response = await http.put("/calls/CA1/mocks", json=body, headers=wrong)
        assert response.status_code == status, (settings.testing, response.text)


def test_the_sip_transport_option_overrides_every_scenario() -> None:
    scenarios = load_scenarios(SHIPPED, "sip", "tcp")
    assert {(s.transport, s.sip_transport) for s in scenarios} == {("sip", "tcp")}
    assert {s.sip_transport for s in load_scenarios(SHIPPED)} == {"udp"}


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


def test_a_missing_agents_directory_is_an_error(tmp_path: Path) -> None:
    argv = ["test", str(SHIPPED), "--agents", str(tmp_path / "none")]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2
    assert f"{tmp_path / 'none'}: not a directory of agent files" in result.output

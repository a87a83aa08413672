"""Agent files: the schema (voice/agents/agent.py) and loading a directory of them
(voice/agents/directory.py). Real files in tmp_path; no fakes needed."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from voice.agents.agent import Agent
from voice.agents.directory import AgentDirectory, AgentFileError, field_path, load_agents

DEPLOY_AGENTS = Path(__file__).resolve().parent.parent / "deploy" / "agents"
SECRET = "tok-5ecret-value-123"


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(text).lstrip(), "utf-8")
    return path


def load_error(directory: Path, default: str | None = None) -> str:
    with pytest.raises(AgentFileError) as caught:
        load_agents(directory, default)
    return str(caught.value)


# -- the shipped examples ---------------------------------------------------------------------


def test_shipped_examples_load_and_answer_their_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORDERS_TOKEN", SECRET)
    agents = load_agents(DEPLOY_AGENTS)

    assert agents.names == ["order-status", "receptionist"]
    receptionist = agents.for_number("+1 555-123-0000")
    assert receptionist.name == "receptionist"
    assert receptionist.greeting and receptionist.instructions
    assert set(receptionist.transfer.targets) == {"front_desk", "billing"}
    assert receptionist.transfer.default == "front_desk"
    assert receptionist.transfer.targets["billing"].to == "sip:billing@pbx.example.com"
    assert "transfer_to_human" in receptionist.builtin_tools
    assert agents.for_webrtc() is receptionist

    orders = agents.for_number("+15559870000")
    assert orders.name == "order-status"
    [tool] = orders.http_tools
    assert tool.name == "order_status"
    assert tool.headers["Authorization"] == f"Bearer {SECRET}"
    assert tool.parameters["required"] == ["order_number"]
    assert orders.policy is not None and orders.policy.budget_ms == 1000
    assert agents.for_number("+15550000000") is agents.default


def test_shipped_order_example_needs_its_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ORDERS_TOKEN", raising=False)
    message = load_error(DEPLOY_AGENTS)
    assert "order-status.yaml: tools[0].headers.Authorization:" in message
    assert "ORDERS_TOKEN is not set" in message


# -- a minimal agent and its defaults ---------------------------------------------------------


def test_name_defaults_to_the_file_stem_and_other_files_are_ignored(tmp_path: Path) -> None:
    write(tmp_path, "front-desk.yml", 'numbers: ["+15551230000"]\n')
    write(tmp_path, "README.md", "not: an agent\n")
    agents = load_agents(tmp_path)
    assert agents.names == ["front-desk"]
    agent = agents.for_number("+15551230000")
    assert agent.name == "front-desk"
    assert agent.builtin_tools == ["end_call"]  # no transfer targets: no transfer_to_human
    assert agent.instructions is None and agent.voice is None and agent.policy is None


def test_transfer_targets_add_transfer_to_human_and_default_to_the_first(tmp_path: Path) -> None:
    write(
        tmp_path,
        "desk.yaml",
        """
        transfer:
          targets:
            sales: {to: "+44 20 7946 0000"}
            support: {to: "sips:support@pbx.example.com"}
        """,
    )
    agent = load_agents(tmp_path).get("desk")
    assert agent is not None
    assert agent.builtin_tools == ["end_call", "transfer_to_human"]
    assert agent.transfer.default == "sales"
    assert agent.transfer.targets["sales"].to == "+442079460000"


def test_voice_path_is_taken_from_the_file_directory(tmp_path: Path) -> None:
    (tmp_path / "voices").mkdir()
    (tmp_path / "voices" / "anna.onnx").write_bytes(b"model")
    (tmp_path / "voices" / "anna.onnx.json").write_text("{}")
    write(tmp_path, "anna.yaml", "voice: voices/anna.onnx\n")
    write(tmp_path, "joe.yaml", "voice: en_US-joe-medium\n")
    agents = load_agents(tmp_path)
    anna, joe = agents.get("anna"), agents.get("joe")
    assert anna is not None and joe is not None
    assert anna.voice == str(tmp_path / "voices" / "anna.onnx")
    assert joe.voice == "en_US-joe-medium"


# -- every rule: the message names the file and the field -------------------------------------

BAD_FILES = [
    pytest.param(
        """
        transfer:
          targets:
            billing: {to: billing}
        """,
        "transfer.targets.billing.to",
        "not a phone number (E.164) or SIP URI: 'billing'",
        id="transfer-to",
    ),
    pytest.param(
        'numbers: ["+15551230000", "555-1234"]\n',
        "numbers[1]",
        "not a phone number (E.164",
        id="number-not-e164",
    ),
    pytest.param(
        "numbers: [+15551230000]\n",
        "numbers[0]",
        "write a phone number in quotes",
        id="number-unquoted",
    ),
    pytest.param(
        'numbers: ["+15551230000", "+1 555 123 0000"]\n',
        "numbers",
        "+15551230000 is listed twice",
        id="number-twice",
    ),
    pytest.param("name: Front Desk\n", "name", "lowercase letters", id="agent-name"),
    pytest.param(
        """
        transfer:
          default: billing
          targets:
            front_desk: {to: "+15551230001"}
        """,
        "transfer.default",
        "'billing' is not one of the targets (front_desk)",
        id="transfer-default",
    ),
    pytest.param(
        "builtin_tools: [transfer_to_human]\n",
        "builtin_tools",
        "transfer_to_human needs at least one target",
        id="transfer-without-targets",
    ),
    pytest.param(
        "builtin_tools: [end_call, hang_up]\n",
        "builtin_tools[1]",
        "'transfer_to_human', 'end_call' or 'send_dtmf'",
        id="unknown-builtin",
    ),
    pytest.param(
        """
        tools:
          - {name: lookup, description: a, url: "https://a.example.com/"}
          - {name: lookup, description: b, url: "https://b.example.com/"}
        """,
        "tools",
        "two tools are named 'lookup'",
        id="tool-names-unique",
    ),
    pytest.param(
        """
        tools:
          - {name: end_call, description: hang up, url: "https://a.example.com/"}
        """,
        "tools[0].name",
        "'end_call' is a built-in tool's name",
        id="tool-name-builtin",
    ),
    pytest.param(
        """
        tools:
          - name: lookup
            description: look up
            url: "https://a.example.com/"
            parameters: {type: string}
        """,
        "tools[0].parameters",
        "type: object",
        id="tool-parameters-object",
    ),
    pytest.param(
        """
        tools:
          - {name: lookup, description: look up, url: "not a url"}
        """,
        "tools[0].url",
        "URL",
        id="tool-url",
    ),
    pytest.param(
        "tools:\n  - {name: lookup, url: 'https://a.example.com/'}\n",
        "tools[0].description",
        "required",
        id="tool-description-missing",
    ),
    pytest.param("voice: voices/missing.onnx\n", "voice", "not found", id="voice-missing"),
    pytest.param("voice: alto\n", "voice", "path to a piper .onnx file", id="voice-not-onnx"),
    pytest.param(
        "policy: {policy: fixed}\n", "policy", "a fixed policy needs an effort", id="policy"
    ),
    pytest.param(
        "holding: {phrase: wait, after_ms: -1}\n",
        "holding.after_ms",
        "greater than or equal to 0",
        id="holding",
    ),
    pytest.param('voicemail: ""\n', "voicemail", "at least 1 character", id="voicemail-empty"),
    pytest.param(
        f"voicemail: {'x' * 2001}\n", "voicemail", "at most 2000 characters", id="voicemail-long"
    ),
]


@pytest.mark.parametrize(("text", "where", "what"), BAD_FILES)
def test_each_rule_names_file_and_field(tmp_path: Path, text: str, where: str, what: str) -> None:
    path = write(tmp_path, "desk.yaml", text)
    message = load_error(tmp_path)
    assert message.startswith(f"{path}: {where}: "), message
    assert what in message, message


def test_the_message_reads_as_documented(tmp_path: Path) -> None:
    agents = tmp_path / "deploy" / "agents"
    agents.mkdir(parents=True)
    write(agents, "receptionist.yaml", "transfer: {targets: {billing: {to: billing}}}\n")
    message = load_error(agents)
    assert message == (
        f"{agents}/receptionist.yaml: transfer.targets.billing.to: "
        "not a phone number (E.164) or SIP URI: 'billing'"
    )


@pytest.mark.parametrize(
    ("text", "where", "hint"),
    [
        ("greting: Hello\n", "greting", "'greeting'"),
        (
            "transfer: {targets: {desk: {to: '+15551230001', descripton: x}}}\n",
            "transfer.targets.desk.descripton",
            "'description'",
        ),
        ("transfer: {tragets: {}}\n", "transfer.tragets", "'targets'"),
        ("transfer: {transfer: {}}\n", "transfer.transfer", ""),  # no "did you mean 'transfer'"
        ("greeting: Hi\nsummary: x\n", "summary", ""),
        ("holding: {phrase: wait, afterms: 300}\n", "holding.afterms", "'after_ms'"),
        ("policy: {policy: adaptive, budget: 900}\n", "policy.budget", "'budget_ms'"),
        (
            "tools: [{name: a, description: a, url: 'https://a.example.com/', timeout: 2}]\n",
            "tools[0].timeout",
            "'timeout_s'",
        ),
    ],
)
def test_unknown_field_is_rejected_by_name(
    tmp_path: Path, text: str, where: str, hint: str
) -> None:
    path = write(tmp_path, "desk.yaml", text)
    message = load_error(tmp_path)
    assert message.startswith(f"{path}: {where}: unknown field"), message
    assert message.endswith(f"unknown field (did you mean {hint}?)" if hint else "unknown field")
    assert len(message.splitlines()) == 1


def test_every_problem_in_every_file_is_reported_once(tmp_path: Path) -> None:
    a = write(tmp_path, "a.yaml", "numbers: ['nope']\ngreting: hi\n")
    b = write(tmp_path, "b.yaml", "transfer: {default: x}\n")
    problems = load_error(tmp_path).splitlines()
    assert len(problems) == 3, problems
    assert sum(line.startswith(f"{a}: ") for line in problems) == 2
    assert problems[-1].startswith(f"{b}: transfer.default: ")


# -- the file itself --------------------------------------------------------------------------


def test_yaml_syntax_error_gives_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "desk.yaml", "name: desk\ngreeting: [unclosed\nwebrtc: true\n")
    message = load_error(tmp_path)
    assert message.startswith(f"{path}: line ")
    assert "line 3" in message or "line 4" in message  # where the parser gave up


@pytest.mark.parametrize(
    ("text", "what"),
    [("- a\n- b\n", "a list"), ("", "empty"), ("just words\n", "a str")],
)
def test_file_that_is_not_a_mapping(tmp_path: Path, text: str, what: str) -> None:
    path = write(tmp_path, "desk.yaml", text)
    assert load_error(tmp_path) == f"{path}: the file is {what}, not a mapping of agent fields"


def test_a_key_given_twice_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, "desk.yaml", "greeting: Hello\nwebrtc: true\ngreeting: Hi\n")
    message = load_error(tmp_path)
    assert message == f"{path}: line 3, column 1: key 'greeting' is given twice"


# -- ${NAME} in HTTP tool headers -------------------------------------------------------------

TOOL_WITH_HEADERS = """
    tools:
      - name: lookup
        description: look up
        url: "https://a.example.com/"
        headers:
          Authorization: "Bearer ${HOTLINE_TEST_TOKEN}"
          X-Tenant: "${HOTLINE_TEST_TENANT}-eu"
    """


def test_headers_are_read_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOTLINE_TEST_TOKEN", SECRET)
    monkeypatch.setenv("HOTLINE_TEST_TENANT", "acme")
    write(tmp_path, "desk.yaml", TOOL_WITH_HEADERS)
    agent = load_agents(tmp_path).get("desk")
    assert agent is not None
    assert agent.http_tools[0].headers == {
        "Authorization": f"Bearer {SECRET}",
        "X-Tenant": "acme-eu",
    }
    assert SECRET not in repr(agent) and SECRET not in str(agent.http_tools[0])


def test_a_missing_variable_is_named_and_no_value_is_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOTLINE_TEST_TOKEN", SECRET)
    monkeypatch.delenv("HOTLINE_TEST_TENANT", raising=False)
    path = write(tmp_path, "desk.yaml", TOOL_WITH_HEADERS)
    message = load_error(tmp_path)
    assert message == (
        f"{path}: tools[0].headers.X-Tenant: environment variable HOTLINE_TEST_TENANT is not set"
    )


def test_no_secret_in_errors_of_other_fields(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOTLINE_TEST_TOKEN", SECRET)
    monkeypatch.setenv("HOTLINE_TEST_TENANT", SECRET)
    write(tmp_path, "desk.yaml", TOOL_WITH_HEADERS + "transfer: {default: nobody}\n")
    message = load_error(tmp_path)
    assert "transfer.default" in message
    assert SECRET not in message


# -- which agent answers ----------------------------------------------------------------------


def test_unknown_number_and_webrtc_get_the_built_in_default(tmp_path: Path) -> None:
    write(tmp_path, "desk.yaml", 'numbers: ["+15551230000"]\ninstructions: Be brief.\n')
    agents = load_agents(tmp_path)
    for agent in (agents.for_number("+15559999999"), agents.for_number(None), agents.for_webrtc()):
        assert agent.name == "default"
        assert agent.instructions is None and agent.greeting is None
        assert agent.voice is None and agent.policy is None
        assert agent.builtin_tools == [] and agent.http_tools == []
        assert agent.transfer.targets == {}
    assert agents.for_number("+1 (555) 123-0000").name == "desk"


def test_a_named_default_answers_what_no_agent_claims(tmp_path: Path) -> None:
    write(tmp_path, "desk.yaml", 'numbers: ["+15551230000"]\n')
    write(tmp_path, "main.yaml", "greeting: Hello\n")
    agents = load_agents(tmp_path, default="main")
    assert agents.for_number("+15559999999").name == "main"
    assert agents.for_webrtc().name == "main"
    assert agents.for_number("+15551230000").name == "desk"


def test_webrtc_agent_answers_the_softphone(tmp_path: Path) -> None:
    write(tmp_path, "desk.yaml", "webrtc: true\n")
    write(tmp_path, "main.yaml", "greeting: Hello\n")
    assert load_agents(tmp_path, default="main").for_webrtc().name == "desk"


def test_a_default_that_does_not_exist_is_an_error(tmp_path: Path) -> None:
    write(tmp_path, "desk.yaml", "greeting: Hello\n")
    assert load_error(tmp_path, default="main") == (
        f"{tmp_path}: no agent is named 'main' (agents: desk)"
    )


def test_empty_directory_has_only_the_default(tmp_path: Path) -> None:
    agents = load_agents(tmp_path)
    assert agents.names == [] and agents.get("default") is None
    assert agents.for_number("+15551230000") == Agent.default()


def test_missing_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(AgentFileError, match="not a directory of agent files"):
        load_agents(tmp_path / "absent")


def test_directory_built_in_code_routes_like_a_loaded_one() -> None:
    desk = Agent(name="desk", numbers=["+15551230000"])
    agents = AgentDirectory({"desk": desk})
    assert agents.for_number("+1-555-123-0000") is desk
    assert agents.for_number("anonymous").name == "default"


# -- conflicts between files ------------------------------------------------------------------


def test_two_agents_with_one_name(tmp_path: Path) -> None:
    write(tmp_path, "desk.yaml", "greeting: Hello\n")
    second = write(tmp_path, "front.yaml", "name: desk\n")
    assert load_error(tmp_path) == f"{second}: name: 'desk' is taken by {tmp_path / 'desk.yaml'}"


def test_one_number_claimed_by_two_agents(tmp_path: Path) -> None:
    first = write(tmp_path, "a.yaml", 'numbers: ["+15551230000"]\n')
    second = write(tmp_path, "b.yaml", 'numbers: ["+15550000000", "+1 555 123 0000"]\n')
    assert load_error(tmp_path) == (f"{second}: numbers[1]: +15551230000 is claimed by {first} too")


def test_two_webrtc_agents(tmp_path: Path) -> None:
    first = write(tmp_path, "a.yaml", "webrtc: true\n")
    second = write(tmp_path, "b.yaml", "webrtc: true\n")
    assert load_error(tmp_path) == f"{second}: webrtc: {first} has it too (one agent at most)"


def test_the_built_in_agents_name_is_reserved(tmp_path: Path) -> None:
    path = write(tmp_path, "default.yaml", "greeting: Hello\n")
    assert load_error(tmp_path) == f"{path}: name: 'default' is the built-in agent's name"


def test_field_path() -> None:
    assert field_path(("tools", 0, "headers", "Authorization")) == "tools[0].headers.Authorization"
    assert field_path((0,)) == "[0]"
    assert field_path(()) == ""


def test_a_number_written_without_plus_reaches_its_agent(tmp_path: Path) -> None:
    """Vonage writes numbers as E.164 without the "+"."""
    (tmp_path / "a.yaml").write_text('name: a\nnumbers: ["+447700900001"]\n', encoding="utf-8")
    agents = load_agents(tmp_path)
    assert agents.for_number("447700900001").name == "a"
    assert agents.for_number("+44 7700 900001").name == "a"
    assert agents.for_number("447700900002").name == "default"

"""A directory of agent files, and which agent answers a call.

`load_agents(directory)` reads every ``*.yaml`` / ``*.yml`` file there (one `Agent` each; its
name defaults to the file's stem) and checks them together: names unique, each called number
claimed by one agent at most, at most one agent for the browser softphone. Everything wrong,
in every file, comes back as one `AgentFileError`, a line a problem, each naming the file and
the field (``deploy/agents/receptionist.yaml: transfer.targets.billing.to: ...``). Messages
carry what a field holds only where it cannot be a secret: header values never appear.

`AgentDirectory.for_number(callee)` is the agent whose numbers hold the called number; anything
else gets the default agent: the one named at load, or `Agent.default()` (the server's own
settings, as before agent files existed).
"""

from __future__ import annotations

import difflib
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from types import UnionType
from typing import Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from voice.agents.agent import DEFAULT_AGENT, Agent, normalise_number


class AgentFileError(ValueError):
    """What is wrong with the agent files: one line a problem, each naming file and field."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


class AgentDirectory:
    """The agents of a directory, by name, by called number, and for the browser softphone."""

    def __init__(self, agents: Mapping[str, Agent], default: Agent | None = None) -> None:
        self.agents: Mapping[str, Agent] = dict(agents)
        self.default: Agent = default if default is not None else Agent.default()
        self._by_number = {n: agent for agent in self.agents.values() for n in agent.numbers}
        self._webrtc = next((agent for agent in self.agents.values() if agent.webrtc), None)

    @property
    def names(self) -> list[str]:
        """The file agents' names, sorted (the built-in default is not among them)."""
        return sorted(self.agents)

    def get(self, name: str) -> Agent | None:
        """The file agent named ``name``."""
        return self.agents.get(name)

    def for_number(self, callee: str | None) -> Agent:
        """The agent answering ``callee`` (E.164; spaces and dashes ignored, and the "+" may be
        missing, as Vonage writes numbers), else the default."""
        if callee is None:
            return self.default
        number = normalise_number(callee)
        if number.isdigit():
            number = "+" + number
        return self._by_number.get(number, self.default)

    def for_webrtc(self) -> Agent:
        """The agent with ``webrtc: true``, else the default."""
        return self._webrtc or self.default


def load_agents(directory: Path, default: str | None = None) -> AgentDirectory:
    """The agents of every ``*.yaml``/``*.yml`` file in ``directory``; ``default`` names the
    one that answers calls no agent claims (None: `Agent.default()`). `AgentFileError` lists
    everything wrong."""
    if not directory.is_dir():
        raise AgentFileError([f"{directory}: not a directory of agent files"])
    files = sorted(p for p in directory.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
    problems: list[str] = []
    loaded: list[tuple[Path, Agent]] = []
    for path in files:
        agent = _load_file(path, problems)
        if agent is not None:
            loaded.append((path, agent))

    agents: dict[str, Agent] = {}
    sources: dict[str, Path] = {}
    numbers: dict[str, Path] = {}
    webrtc: Path | None = None
    for path, agent in loaded:
        if agent.name == DEFAULT_AGENT:
            problems.append(f"{path}: name: {DEFAULT_AGENT!r} is the built-in agent's name")
            continue
        if agent.name in sources:
            problems.append(f"{path}: name: {agent.name!r} is taken by {sources[agent.name]}")
            continue
        agents[agent.name] = agent
        sources[agent.name] = path
        for i, number in enumerate(agent.numbers):
            if number in numbers:
                claimed = numbers[number]
                problems.append(f"{path}: numbers[{i}]: {number} is claimed by {claimed} too")
            else:
                numbers[number] = path
        if agent.webrtc:
            if webrtc is not None:
                problems.append(f"{path}: webrtc: {webrtc} has it too (one agent at most)")
            else:
                webrtc = path

    chosen = Agent.default()
    if default is not None:
        if default in agents:
            chosen = agents[default]
        elif not problems:  # with problems, the agent may be the one that failed
            known = ", ".join(sorted(agents)) or "none"
            problems.append(f"{directory}: no agent is named {default!r} (agents: {known})")
    if problems:
        raise AgentFileError(problems)
    return AgentDirectory(agents, chosen)


class _UniqueKeyLoader(yaml.SafeLoader):
    """A safe loader that refuses a key given twice in one mapping (the second would win)."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Hashable, Any]:
    loader.flatten_mapping(node)
    seen: set[Hashable] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if isinstance(key, Hashable) and key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} is given twice", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=True)


_UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _construct_mapping,
)


def _load_file(path: Path, problems: list[str]) -> Agent | None:
    try:
        data = yaml.load(path.read_text("utf-8"), Loader=_UniqueKeyLoader)
    except OSError as exc:
        problems.append(f"{path}: cannot read: {exc.strerror or exc}")
        return None
    except UnicodeDecodeError:
        problems.append(f"{path}: not UTF-8 text")
        return None
    except yaml.YAMLError as exc:
        problems.append(f"{path}: {_yaml_problem(exc)}")
        return None
    if not isinstance(data, dict):
        kind = "empty" if data is None else f"a {type(data).__name__}"
        problems.append(f"{path}: the file is {kind}, not a mapping of agent fields")
        return None
    data.setdefault("name", path.stem)
    try:
        return Agent.model_validate(data, context={"base_dir": path.parent})
    except ValidationError as exc:
        problems.extend(f"{path}: {line}" for line in _validation_problems(exc))
        return None


def _yaml_problem(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        what = exc.problem or exc.context or "invalid YAML"
        if mark is not None:
            return f"line {mark.line + 1}, column {mark.column + 1}: {what}"
        return str(what)
    return f"invalid YAML: {type(exc).__name__}"


def field_path(loc: Sequence[int | str]) -> str:
    """Pydantic's ``loc`` as a path in the file: ``('tools', 0, 'url')`` -> ``tools[0].url``."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path


def _validation_problems(exc: ValidationError) -> list[str]:
    lines = []
    for error in exc.errors(include_input=False, include_url=False):
        if error["type"] == "default_factory_not_called":
            continue  # a consequence of another field's error, reported on its own
        where = field_path(error["loc"])
        lines.append(f"{where}: {_message(error)}" if where else _message(error))
    return lines


def _fields_at(loc: Sequence[int | str]) -> list[str]:
    """The field names (as a file spells them) of the model found at ``loc`` in an agent."""
    kind: Any = Agent
    for part in loc:
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            fields = {
                info.alias or name: info.annotation for name, info in kind.model_fields.items()
            }
            kind = fields.get(str(part))
        else:  # a list's index or a dict's key: the item type
            kind = (get_args(kind) or (None,))[-1]
        if get_origin(kind) in (Union, UnionType):  # X | None: X
            kind = next((arg for arg in get_args(kind) if arg is not type(None)), None)
    if isinstance(kind, type) and issubclass(kind, BaseModel):
        return sorted(info.alias or name for name, info in kind.model_fields.items())
    return []


def _message(error: ErrorDetails) -> str:
    if error["type"] == "extra_forbidden":
        key = str(error["loc"][-1])
        close = difflib.get_close_matches(key, _fields_at(error["loc"][:-1]), n=1)
        return "unknown field" + (f" (did you mean {close[0]!r}?)" if close else "")
    if error["type"] == "missing":
        return "required"
    message = error["msg"]
    return message.removeprefix("Value error, ")


__all__ = ["DEFAULT_AGENT", "AgentDirectory", "AgentFileError", "field_path", "load_agents"]

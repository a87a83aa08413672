"""Scenario files: a scripted caller for one agent, and what the agent must do (`hotline test`).

One YAML file a scenario, kept beside the agents (``deploy/agents/tests/*.yaml``)::

    agent: order-status                # the agent file's name; the call goes to its first number
    transport: sip                     # optional: twilio (default), telnyx, vonage, sip, webrtc
    sip_transport: tls                 # optional, SIP only: udp (default), tcp or tls
    caller: "+15555550123"             # optional: the caller's number
    mocks:                             # optional: a tool's answer, fixed (no order system needed)
      order_status: {answer: {order: "12345678", status: shipped}}
    turns:
      - say: "My order number is 1 2 3 4 5 6 7 8."     # piper speaks it, over 8 kHz mu-law
        expect:
          tool_called: {name: order_status, arguments: {order_number: "12345678"}}
          reply_contains: [shipped]
      - keys: "0"                      # or keypad digits; or `wav: caller.wav` (beside the file)
    expect: {ended: true}              # over the whole call
    judge: "The agent reads the order's status back."   # a rubric for a real model

Every model forbids unknown fields; `load_scenarios` names the file and the field of every
problem, as `voice.agents.directory` does for agent files.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Self, Union, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from voice.agents.directory import _UniqueKeyLoader, _yaml_problem, field_path
from voice.agents.mocked_tools import ToolMock

_KEYS = re.compile(r"^[0-9*#]{1,32}$")

Transport = Literal["twilio", "telnyx", "vonage", "sip", "webrtc"]
TRANSPORTS: tuple[Transport, ...] = ("twilio", "telnyx", "vonage", "sip", "webrtc")
SipTransport = Literal["udp", "tcp", "tls"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _listed(value: object) -> object:
    return [value] if isinstance(value, dict) else value


class ToolExpected(_Strict):
    """A tool the agent must call: its name, and arguments it must include (a subset match)."""

    name: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)


class Expect(_Strict):
    """What a turn (or, under the scenario's `expect`, the whole call) must show."""

    tool_called: Annotated[list[ToolExpected], BeforeValidator(_listed)] = Field(
        default_factory=list
    )  # one tool, or a list of them
    no_tool: bool = False  # no tool was called
    transferred_to: str | None = None  # a transfer target's name, or the number / SIP URI
    ended: bool | None = None  # the agent ended the call (True) or did not (False)
    reply_contains: list[str] = Field(default_factory=list)  # words, any case
    reply_avoids: list[str] = Field(default_factory=list)
    reply_matches: str | None = None  # a regular expression, searched, any case
    budget_ms: float | None = Field(default=None, gt=0)  # default: the turn's own budget

    @field_validator("reply_matches")
    @classmethod
    def _compiles(cls, pattern: str | None) -> str | None:
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"not a regular expression: {exc}") from None
        return pattern


class Turn(_Strict):
    """One thing the caller does: say a text, play a WAV file, or press keys."""

    say: str | None = Field(default=None, min_length=1)
    wav: Path | None = None
    keys: str | None = None
    expect: Expect = Field(default_factory=Expect)

    @field_validator("keys")
    @classmethod
    def _keypad(cls, keys: str | None) -> str | None:
        if keys is not None and not _KEYS.match(keys):
            raise ValueError("keypad digits are 0-9, * and # (at most 32)")
        return keys

    @model_validator(mode="after")
    def _one_kind(self) -> Self:
        given = [k for k in ("say", "wav", "keys") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"a turn has one of say, wav or keys (this one has {given or 'none'})")
        return self

    def what(self) -> str:
        """The turn in a line, for the report."""
        if self.say is not None:
            return f"say {self.say!r}"
        if self.wav is not None:
            return f"play {self.wav.name}"
        return f"press {self.keys}"


Mock = ToolMock  # a tool's fixed answer: what the runner's endpoint or the server answers


class Scenario(_Strict):
    """A scripted call to one agent, and what must happen in it."""

    agent: str = Field(min_length=1)
    name: str = ""  # default: the file's stem
    caller: str | None = Field(default=None, pattern=r"^\+[0-9]{8,15}$")
    number: str | None = None  # the number called; default: the agent's first number
    transport: Transport = "twilio"  # how the call is placed (`hotline test --transport` overrides)
    sip_transport: SipTransport = "udp"  # a SIP call's (`--sip-transport` overrides)
    strict: bool = False  # a reply heard after its budget fails the scenario (else a warning)
    mocks: dict[str, Mock] = Field(default_factory=dict)
    turns: list[Turn] = Field(min_length=1, max_length=20)
    expect: Expect = Field(default_factory=Expect)
    judge: str | None = Field(default=None, min_length=1)
    path: Path = Field(default=Path("."), exclude=True)


class ScenarioFileError(ValueError):
    """What is wrong with scenario files: one line a problem, each naming file and field."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


def scenario_files(where: Path) -> list[Path]:
    """The scenario files of a directory (``*.yaml``/``*.yml``), or the one file named."""
    if where.is_file():
        return [where]
    if not where.is_dir():
        raise ScenarioFileError([f"{where}: no such file or directory"])
    return sorted(p for p in where.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())


def load_scenarios(
    where: Path, transport: Transport | None = None, sip_transport: SipTransport | None = None
) -> list[Scenario]:
    """Every scenario in `where` (a directory or one file), each placed over `transport` when
    given (else its own), a SIP call over `sip_transport` when given; `ScenarioFileError` lists
    every problem of every file."""
    problems: list[str] = []
    scenarios = [
        s for p in scenario_files(where) if (s := _load(p, problems, transport)) is not None
    ]
    if sip_transport is not None:
        scenarios = [s.model_copy(update={"sip_transport": sip_transport}) for s in scenarios]
    if not problems and not scenarios:
        problems.append(f"{where}: no scenario files (*.yaml)")
    names: dict[str, Path] = {}
    for scenario in scenarios:
        if scenario.name in names:
            problems.append(
                f"{scenario.path}: name: {scenario.name!r} is taken by {names[scenario.name]}"
            )
        names[scenario.name] = scenario.path
    if problems:
        raise ScenarioFileError(problems)
    return scenarios


def _load(path: Path, problems: list[str], transport: Transport | None) -> Scenario | None:
    try:
        data = yaml.load(path.read_text("utf-8"), Loader=_UniqueKeyLoader)
    except (OSError, UnicodeDecodeError) as exc:
        problems.append(f"{path}: cannot read: {exc}")
        return None
    except yaml.YAMLError as exc:
        problems.append(f"{path}: {_yaml_problem(exc)}")
        return None
    if not isinstance(data, dict):
        problems.append(f"{path}: the file is not a mapping of scenario fields")
        return None
    if "path" in data:
        problems.append(f"{path}: path: unknown field")
        return None
    data.setdefault("name", path.stem)
    try:
        scenario = Scenario.model_validate({**data, "path": path})
    except ValidationError as exc:
        problems.extend(f"{path}: {line}" for line in _validation_problems(exc))
        return None
    if transport is not None:
        scenario = scenario.model_copy(update={"transport": transport})
    for i, turn in enumerate(scenario.turns):
        if turn.wav is not None and not (path.parent / turn.wav).is_file():
            problems.append(f"{path}: turns[{i}].wav: no such file {path.parent / turn.wav}")
        if turn.keys is not None and scenario.transport == "webrtc":
            given = "--transport webrtc" if transport is not None else "transport: webrtc"
            problems.append(f"{path}: turns[{i}].keys: a WebRTC call has no keypad ({given})")
    return scenario


def _validation_problems(exc: ValidationError) -> list[str]:
    lines = []
    for error in exc.errors(include_input=False, include_url=False):
        where = field_path(error["loc"])
        if error["type"] == "extra_forbidden":
            close = difflib.get_close_matches(
                str(error["loc"][-1]), _fields_at(error["loc"][:-1]), 1, 0.7
            )
            message = "unknown field" + (f" (did you mean {close[0]!r}?)" if close else "")
        elif error["type"] == "missing":
            message = "required"
        else:
            message = error["msg"].removeprefix("Value error, ")
        lines.append(f"{where}: {message}" if where else message)
    return lines


def _fields_at(loc: Sequence[int | str]) -> list[str]:
    """The field names of the model found at `loc` in a scenario (for "did you mean")."""
    kind: Any = Scenario
    for part in loc:
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            kind = (
                kind.model_fields[str(part)].annotation if str(part) in kind.model_fields else None
            )
        elif get_origin(kind) is not None:
            kind = (get_args(kind) or (None,))[-1]
        if get_origin(kind) in (Union, UnionType):
            kind = next(
                (a for a in get_args(kind) if isinstance(a, type) and issubclass(a, BaseModel)),
                None,
            )
    if isinstance(kind, type) and issubclass(kind, BaseModel):
        return [name for name in kind.model_fields if name != "path"]
    return []

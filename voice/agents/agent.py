"""An agent: who answers a call. One YAML file each (`voice.agents.directory` loads them).

An agent says which called numbers it answers (and whether the browser softphone reaches it),
what the model is told (``instructions``), what it says first (``greeting``), its voice, its
latency policy, the tools it may use (built-in and HTTP), where a call may be put through to a
person (``transfer``), and what it says while a slow tool runs (``holding``). Every override is
optional: None means "the server's setting". Every model forbids unknown fields, so a typo in a
file is an error, not a setting silently ignored.

Validation reads two things from the pydantic validation context, both optional:
``base_dir`` (a relative voice path is taken from there; default: the working directory) and
``environ`` (where ``${NAME}`` in HTTP tool headers is read; default: ``os.environ``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
)

from pipeline.llm.routing import Policy
from pipeline.tts import BUNDLED_VOICE, voice_files
from voice.agents.http_tools import HttpToolConfig
from voice.recordings.settings import RecordingMode

BuiltinTool = Literal["transfer_to_human", "end_call", "send_dtmf"]
BUILTIN_TOOLS: tuple[BuiltinTool, ...] = ("transfer_to_human", "end_call", "send_dtmf")
DEFAULT_AGENT = "default"  # the built-in agent's name (no file may take it)

_E164 = re.compile(r"^\+[0-9]{8,15}$")
_SIP_URI = re.compile(r"^sips?:[^\s@]+(@[^\s@]+)?$", re.IGNORECASE)
_PUNCTUATION = re.compile(r"[\s\-.()]")
_ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_AGENT_NAME = re.compile(r"^[a-z0-9-]{1,64}$")
_TARGET_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def normalise_number(number: str) -> str:
    """``number`` without spaces, dashes, dots and parentheses (``+1 555-123`` -> ``+1555123``)."""
    return _PUNCTUATION.sub("", number)


def _unquoted_number(value: object) -> object:
    # YAML reads an unquoted +15551230000 as the integer 15551230000.
    if isinstance(value, int) and not isinstance(value, bool):
        raise ValueError(f"write a phone number in quotes ('+{value}'): YAML read it as a number")
    return value


def _e164(value: str) -> str:
    number = normalise_number(value)
    if not _E164.match(number):
        raise ValueError(f"not a phone number (E.164: '+' and 8-15 digits): {value!r}")
    return number


def destination(value: str) -> str:
    """A number (E.164) or SIP URI to put a call through to; ValueError if it is neither."""
    if _SIP_URI.match(value.strip()):
        return value.strip()
    number = normalise_number(value)
    if _E164.match(number):
        return number
    raise ValueError(f"not a phone number (E.164) or SIP URI: {value!r}")


PhoneNumber = Annotated[str, BeforeValidator(_unquoted_number), AfterValidator(_e164)]
"""A called number in E.164 (``+`` and 8-15 digits), stored without punctuation."""

Destination = Annotated[str, BeforeValidator(_unquoted_number), AfterValidator(destination)]
"""Where a transfer goes: an E.164 number or a ``sip:``/``sips:`` URI."""


def _expand_environment(value: str, info: ValidationInfo) -> str:
    """``${NAME}`` replaced from the environment; a missing one is named (never a value)."""
    context = info.context if isinstance(info.context, Mapping) else {}
    environ: Mapping[str, str] = context.get("environ", os.environ)
    missing = [name for name in _ENV_REFERENCE.findall(value) if name not in environ]
    if missing:
        raise ValueError(f"environment variable {missing[0]} is not set")
    return _ENV_REFERENCE.sub(lambda match: environ[match.group(1)], value)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)


class AgentHttpTool(HttpToolConfig):
    """An HTTP tool as an agent file declares it: `HttpToolConfig` with its header values'
    ``${NAME}`` read from the environment, a name no built-in tool has, and an object schema
    for its arguments. Its repr masks header values (they are often secrets)."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    headers: dict[str, Annotated[str, AfterValidator(_expand_environment)]] = Field(
        default_factory=dict,
        description='Extra request headers, e.g. {"Authorization": "Bearer ${ORDERS_TOKEN}"}; '
        "${NAME} is read from the environment when the file loads.",
    )

    @field_validator("name")
    @classmethod
    def _not_builtin(cls, name: str) -> str:
        if name in BUILTIN_TOOLS:
            raise ValueError(f"{name!r} is a built-in tool's name; give this tool another")
        return name

    @field_validator("parameters")
    @classmethod
    def _object_schema(cls, parameters: dict[str, Any]) -> dict[str, Any]:
        if parameters.get("type") != "object":
            raise ValueError("must be a JSON schema of an object (type: object)")
        if not isinstance(parameters.get("properties", {}), dict):
            raise ValueError("properties must be a mapping of argument names to schemas")
        return parameters

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        for name, value in super().__repr_args__():
            if name == "headers":
                yield name, {key: "***" for key in self.headers}
            else:
                yield name, value


class AgentPolicy(Policy):
    """`Policy` as an agent file gives it (unknown fields are errors)."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)


class TransferTarget(_Strict):
    """A person (or queue) a call may be put through to."""

    to: Destination = Field(description="E.164 number or sip:/sips: URI.")
    description: str = Field(default="", description="Who this is, for the model.")


class Transfers(_Strict):
    """Where the agent may put a call through to a person."""

    targets: dict[str, TransferTarget] = Field(default_factory=dict)
    default: str | None = Field(
        default=None,
        validate_default=True,
        description="The target when the model names none; absent: the first target.",
    )
    warm: bool = Field(default=False, description="Hand the person a summary of the call.")

    @field_validator("targets")
    @classmethod
    def _target_names(cls, targets: dict[str, TransferTarget]) -> dict[str, TransferTarget]:
        for name in targets:
            if not _TARGET_NAME.match(name):
                raise ValueError(f"target name {name!r}: use letters, digits, '_' and '-'")
        return targets

    @field_validator("default")
    @classmethod
    def _default_is_target(cls, default: str | None, info: ValidationInfo) -> str | None:
        targets = info.data.get("targets")
        if targets is None:  # targets failed validation: that error says enough
            return default
        if default is None:
            return next(iter(targets), None)
        if default not in targets:
            known = ", ".join(targets) or "none"
            raise ValueError(f"{default!r} is not one of the targets ({known})")
        return default


class Holding(_Strict):
    """What the agent says when a tool has run longer than ``after_ms``."""

    phrase: str = Field(default="One moment, please.", min_length=1)
    after_ms: float = Field(default=400, ge=0)


def _default_builtin_tools(data: dict[str, Any]) -> list[BuiltinTool]:
    transfer = data.get("transfer")
    if isinstance(transfer, Transfers) and transfer.targets:
        return ["end_call", "transfer_to_human"]
    return ["end_call"]


class Agent(_Strict):
    """Who answers a call. Fields left out mean the server's own setting."""

    name: str = Field(description="Unique among the agent files: [a-z0-9-]+.")
    description: str = Field(default="", description="For people; the model never sees it.")
    numbers: list[PhoneNumber] = Field(
        default_factory=list, description="Called numbers (E.164) this agent answers."
    )
    webrtc: bool = Field(default=False, description="The browser softphone reaches this agent.")
    instructions: str | None = Field(default=None, min_length=1, description="System prompt.")
    greeting: str | None = Field(default=None, min_length=1, description="Said first.")
    voice: str | None = Field(
        default=None, description=f"Piper voice: {BUNDLED_VOICE!r} or a path to a .onnx file."
    )
    policy: AgentPolicy | None = Field(default=None, description="Tier and effort choice.")
    transfer: Transfers = Field(default_factory=Transfers)
    builtin_tools: list[BuiltinTool] = Field(
        default_factory=_default_builtin_tools,
        description="Absent: end_call, and transfer_to_human when there are transfer targets.",
    )
    http_tools: list[AgentHttpTool] = Field(default_factory=list, alias="tools")
    holding: Holding | None = Field(
        default_factory=Holding, description="None: say nothing while a tool runs."
    )
    recording: RecordingMode | None = Field(
        default=None,
        description="on, off, or announce (the notice is said first, then recording starts).",
    )
    recording_notice: str | None = Field(
        default=None, min_length=1, description="What announce says before recording."
    )
    voicemail: str | None = Field(
        default=None,
        min_length=1,
        max_length=2000,
        description="Left after the beep when a call placed with machine_detection reaches a "
        "machine and the request gives no message; absent: hang up without one.",
    )

    @classmethod
    def default(cls) -> Agent:
        """The agent a call gets when no file claims it: the server's settings, no tools."""
        return cls(name=DEFAULT_AGENT, builtin_tools=[])

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not _AGENT_NAME.match(name):
            raise ValueError(f"{name!r}: use lowercase letters, digits and '-' (at most 64)")
        return name

    @field_validator("numbers")
    @classmethod
    def _numbers_once(cls, numbers: list[str]) -> list[str]:
        seen: set[str] = set()
        for number in numbers:
            if number in seen:
                raise ValueError(f"{number} is listed twice")
            seen.add(number)
        return numbers

    @field_validator("voice")
    @classmethod
    def _voice_exists(cls, voice: str | None, info: ValidationInfo) -> str | None:
        if voice is None or voice == BUNDLED_VOICE:
            return voice
        context = info.context if isinstance(info.context, Mapping) else {}
        path = Path(voice).expanduser()
        if not path.is_absolute():
            path = Path(context.get("base_dir", ".")) / path
        try:
            model, _ = voice_files(str(path))
        except (ValueError, FileNotFoundError) as exc:
            raise ValueError(str(exc)) from None
        return str(model)

    @field_validator("builtin_tools")
    @classmethod
    def _builtins(cls, tools: list[BuiltinTool], info: ValidationInfo) -> list[BuiltinTool]:
        if len(set(tools)) != len(tools):
            raise ValueError(f"a built-in tool is listed twice: {tools}")
        transfer = info.data.get("transfer")
        if (
            "transfer_to_human" in tools
            and isinstance(transfer, Transfers)
            and not transfer.targets
        ):
            raise ValueError("transfer_to_human needs at least one target in transfer.targets")
        return tools

    @field_validator("http_tools")
    @classmethod
    def _tool_names_once(cls, tools: list[AgentHttpTool]) -> list[AgentHttpTool]:
        names = [tool.name for tool in tools]
        for name in names:
            if names.count(name) > 1:
                raise ValueError(f"two tools are named {name!r}")
        return tools

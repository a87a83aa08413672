"""Tools the LLM may call in the middle of a turn: what a call offers (`Toolbox`, each tool a
`ToolSpec`), one call the model made (`ToolCall`) and what it gave back (`ToolResult`).

The conversation runs the calls a reply asks for and sends their results back in the same turn
(`pipeline.conversation`). What a tool does lives at the edge (`voice/agents/`): HTTP endpoints,
and the built-ins that act on the call itself. Those return a `CallAction` with their result
(put the caller through to a person, hang up, press keys), which the conversation carries out
once the reply before it has been heard.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class ToolSpec:
    """A tool as the model sees it: a name, what it is for, and its arguments' JSON schema."""

    name: str
    description: str
    parameters: Mapping[str, Any] = field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )

    def chat(self) -> dict[str, Any]:
        """The Chat Completions `tools` entry."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": dict(self.parameters),
            },
        }

    def responses(self) -> dict[str, Any]:
        """The Responses API `tools` entry."""
        return {
            "type": "function",
            "name": self.name,
            "description": self.description,
            "parameters": dict(self.parameters),
        }


class ToolArgumentsError(ValueError):
    """The model's arguments are not a JSON object."""


@dataclass(frozen=True)
class ToolCall:
    """One call the model made: its id (Chat `tool_calls[].id`, Responses `call_id`), the
    tool's name, and the arguments as the JSON text the model wrote."""

    id: str
    name: str
    arguments: str

    def parsed(self) -> dict[str, Any]:
        """The arguments as a dict; `ToolArgumentsError` if they are not a JSON object."""
        try:
            value = json.loads(self.arguments or "{}")
        except json.JSONDecodeError as exc:
            raise ToolArgumentsError(f"arguments are not JSON: {exc.msg}") from exc
        if not isinstance(value, dict):
            raise ToolArgumentsError("arguments must be a JSON object")
        return value


@dataclass(frozen=True)
class Transfer:
    """Put the caller through to a person at `target` (a phone number or SIP URI)."""

    target: str
    reason: str = ""
    summary: str = ""  # what the person should know: the call so far (a warm transfer)


@dataclass(frozen=True)
class EndCall:
    """Hang up once the goodbye has been heard."""

    reason: str = ""


@dataclass(frozen=True)
class SendDigits:
    """Press keypad keys on the line (to steer an IVR): 0-9, *, #, and w for a half-second
    wait."""

    digits: str


CallAction = Transfer | EndCall | SendDigits


class ActionFailed(Exception):
    """Raised by whoever carries out a `CallAction` that could not be done (a provider refused
    the transfer): `reason` goes into the history in place of the tool's result, and `say` is
    told to the caller."""

    def __init__(self, reason: str, say: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.say = say


@dataclass(frozen=True)
class ToolResult:
    """What a call gave back: `output` is what the model reads (JSON text). `ok` is False for
    an error the model should speak about (a timeout, a refusal, bad arguments)."""

    call: ToolCall
    output: str
    ok: bool = True
    started_at: float = 0.0  # monotonic, when the tool was started
    ended_at: float = 0.0  # monotonic, when its result was in
    action: CallAction | None = None  # what the call must do once the reply has been heard

    @property
    def ms(self) -> float:
        return round((self.ended_at - self.started_at) * 1e3, 1)

    @staticmethod
    def error(call: ToolCall, message: str, started_at: float, ended_at: float) -> ToolResult:
        return ToolResult(
            call, json.dumps({"error": message}), ok=False, started_at=started_at, ended_at=ended_at
        )


@dataclass(frozen=True)
class ToolContext:
    """What a tool may know of the call it runs in."""

    call_id: str
    caller: str | None = None  # the caller's number or identity, if known
    callee: str | None = None  # the number they called
    transcript: Sequence[tuple[str, str]] = ()  # (role, text) of the call so far, as heard


class Toolbox(Protocol):
    """A call's tools: the specs the model is offered, and how to run one call.

    `run` never raises for a tool's own failure: it returns `ToolResult.error` (an unknown
    tool, bad arguments, a timeout, an HTTP error), so the model can say so. Cancelling it
    (the caller spoke over the reply) cancels what can be cancelled."""

    def specs(self) -> Sequence[ToolSpec]: ...

    async def run(self, call: ToolCall, context: ToolContext) -> ToolResult: ...

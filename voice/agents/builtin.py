"""The built-in tools: what the model may do to the call itself.

- `transfer_to_human`: put the caller through to a person (`Transfer`), with a short digest of
  the call for them when the transfer is warm;
- `end_call`: hang up once the goodbye has been heard (`EndCall`);
- `send_dtmf`: press keypad keys, to steer a phone menu on the line (`SendDigits`).

Each returns its `CallAction` with its result; the conversation carries it out after the reply
before it has been heard. They are built from plain values (`builtin_tools`), so they do not
depend on how an agent file spells its settings.
"""

from __future__ import annotations

import json
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.tools import (
    CallAction,
    EndCall,
    SendDigits,
    ToolArgumentsError,
    ToolCall,
    ToolContext,
    ToolResult,
    ToolSpec,
    Transfer,
)

DIGITS = re.compile(r"[0-9*#wW]{1,32}")  # whole string; w: wait half a second
SUMMARY_CHARS = 600  # the most a warm transfer's summary holds
SUMMARY_LINES = 6  # of the call's last lines
_REASON_CHARS = 200
_SPEAKERS = {
    "caller": "Caller",
    "user": "Caller",
    "bot": "Agent",
    "assistant": "Agent",
    "agent": "Agent",
}


class _Invalid(Exception):
    """The call cannot be done as asked; the message is for the model."""


@dataclass(frozen=True)
class _Done:
    output: dict[str, Any]
    action: CallAction


class BuiltinTool(ABC):
    """One built-in tool: `spec` for the model, `run` for one call."""

    spec: ToolSpec

    @property
    def name(self) -> str:
        return self.spec.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec.name!r})"

    async def run(self, call: ToolCall, context: ToolContext) -> ToolResult:
        started = time.monotonic()
        try:
            done = self._act(call.parsed(), context)
        except ToolArgumentsError as exc:
            message = f"the arguments for {self.spec.name} are not valid: {exc}"
            return ToolResult.error(call, message, started, time.monotonic())
        except _Invalid as exc:
            return ToolResult.error(call, str(exc), started, time.monotonic())
        output = json.dumps(done.output, separators=(",", ":"), ensure_ascii=False)
        return ToolResult(
            call, output, started_at=started, ended_at=time.monotonic(), action=done.action
        )

    @abstractmethod
    def _act(self, arguments: dict[str, Any], context: ToolContext) -> _Done: ...


def _text(
    arguments: dict[str, Any], key: str, *, required: bool = False, strip: bool = True
) -> str:
    value = arguments.get(key)
    if value is None:
        if required:
            raise _Invalid(f"{key} is required")
        return ""
    if not isinstance(value, str):
        raise _Invalid(f"{key} must be a string")
    return value.strip() if strip else value


def _one_line(text: str) -> str:
    return " ".join(text.split())


def warm_summary(reason: str, transcript: Sequence[tuple[str, str]]) -> str:
    """What the person taking a transfer is told: the reason, then the call's last few lines
    (caller and agent), the newest last; at most `SUMMARY_CHARS` characters."""
    reason = _one_line(reason)
    if len(reason) > _REASON_CHARS:
        reason = reason[: _REASON_CHARS - 1] + "…"
    head = f"Reason: {reason}" if reason else "Reason: not given"
    room = SUMMARY_CHARS - len(head)
    lines: list[str] = []
    for role, said in reversed(transcript):
        speaker = _SPEAKERS.get(role.lower())
        text = _one_line(said)
        if speaker is None or not text:
            continue
        line = f"{speaker}: {text}"
        if len(line) + 1 > room:
            keep = room - len(speaker) - 4  # "\n", ": ", "…"
            if not lines and keep >= 40:  # the newest line alone is too long: keep its end
                lines.append(f"{speaker}: …{text[-keep:]}")
            break
        lines.append(line)
        room -= len(line) + 1
        if len(lines) == SUMMARY_LINES:
            break
    return "\n".join([head, *reversed(lines)])


class TransferToHuman(BuiltinTool):
    """`transfer_to_human`: `targets` maps a name the model picks to (number or SIP URI,
    description); `default_target` is used when the model names none (or the only target);
    `warm` adds a summary of the call for the person."""

    def __init__(
        self,
        targets: Mapping[str, tuple[str, str]],
        default_target: str | None = None,
        warm: bool = False,
    ) -> None:
        if default_target is not None and default_target not in targets:
            raise ValueError(
                f"the default transfer target {default_target!r} is not one of the targets"
                f" ({', '.join(targets) or 'none'})"
            )
        self.targets = dict(targets)
        self.default_target = default_target
        if default_target is None and len(self.targets) == 1:
            self.default_target = next(iter(self.targets))
        self.warm = warm
        self.spec = self._make_spec()

    def _make_spec(self) -> ToolSpec:
        properties: dict[str, Any] = {
            "reason": {
                "type": "string",
                "description": "Why the caller needs a person, in one short sentence (the person"
                " taking the call is told).",
            }
        }
        required = ["reason"]
        if self.targets:
            who = "; ".join(
                f"{name}: {description}" if description else name
                for name, (_, description) in self.targets.items()
            )
            described = f"Who to put the caller through to. {who}."
            if self.default_target is not None:
                described += f" If unsure, leave it out: {self.default_target} takes the call."
            else:
                required.append("target")
            properties["target"] = {
                "type": "string",
                "enum": list(self.targets),
                "description": described,
            }
        return ToolSpec(
            name="transfer_to_human",
            description=(
                "Put the caller through to a person. Use it when the caller asks for a human, or"
                " when they need help you cannot give. First tell the caller, in one short"
                " sentence, that you are transferring them; the transfer starts once they have"
                " heard it, and ends your part of the call."
            ),
            parameters={"type": "object", "properties": properties, "required": required},
        )

    def _act(self, arguments: dict[str, Any], context: ToolContext) -> _Done:
        if not self.targets:
            raise _Invalid("no one to transfer to is configured")
        reason = _text(arguments, "reason")
        name = _text(arguments, "target") or self.default_target
        valid = ", ".join(self.targets)
        if name is None:
            raise _Invalid(f"say which target to transfer to: one of {valid}")
        if name not in self.targets:
            raise _Invalid(f"there is no transfer target named {name!r}; the targets are: {valid}")
        to, _ = self.targets[name]
        summary = warm_summary(reason, context.transcript) if self.warm else ""
        return _Done(
            {"status": "transferring", "to": name},
            Transfer(target=to, reason=reason, summary=summary),
        )


class EndCallTool(BuiltinTool):
    """`end_call`: hang up after the goodbye."""

    spec = ToolSpec(
        name="end_call",
        description=(
            "Hang up. Use it only when the conversation is over: the caller has said goodbye,"
            " asked to end the call, or there is nothing left to do. Say goodbye first; the call"
            " ends once the caller has heard it."
        ),
        parameters={
            "type": "object",
            "properties": {
                "reason": {
                    "type": "string",
                    "description": "Why the call is ending, e.g. 'caller said goodbye'.",
                }
            },
            "required": ["reason"],
        },
    )

    def _act(self, arguments: dict[str, Any], context: ToolContext) -> _Done:
        return _Done({"status": "ending"}, EndCall(reason=_text(arguments, "reason")))


class SendDtmf(BuiltinTool):
    """`send_dtmf`: press keypad keys on the line."""

    spec = ToolSpec(
        name="send_dtmf",
        description=(
            "Press keys on the phone keypad, to answer an automated phone menu on the line"
            " (e.g. 'press 1 for sales'). Digits 0-9, * and #; put w between keys to wait half"
            " a second. Up to 32 characters."
        ),
        parameters={
            "type": "object",
            "properties": {
                "digits": {
                    "type": "string",
                    "pattern": "^[0-9*#wW]{1,32}$",
                    "description": "The keys to press in order, e.g. '1', '1234#', '2w5'.",
                }
            },
            "required": ["digits"],
        },
    )

    def _act(self, arguments: dict[str, Any], context: ToolContext) -> _Done:
        digits = _text(arguments, "digits", required=True, strip=False)
        if DIGITS.fullmatch(digits) is None:
            raise _Invalid(
                f"the digits {digits[:40]!r} cannot be dialled: use 1 to 32 of 0-9, *, # and w"
                " (a half-second wait)"
            )
        return _Done({"status": "sent", "digits": digits}, SendDigits(digits))


BUILTIN_NAMES = ("transfer_to_human", "end_call", "send_dtmf")


def builtin_tools(
    names: Sequence[str],
    targets: Mapping[str, tuple[str, str]] | None = None,
    default_target: str | None = None,
    warm: bool = False,
) -> list[BuiltinTool]:
    """The built-ins `names` asks for, in its order. `targets` (name -> (number or SIP URI,
    description)), `default_target` and `warm` are `transfer_to_human`'s. An unknown or
    repeated name, or a default target that is not a target, raises ValueError."""
    unknown = [name for name in names if name not in BUILTIN_NAMES]
    if unknown:
        raise ValueError(
            f"no built-in tool named {', '.join(map(repr, unknown))};"
            f" the built-ins are: {', '.join(BUILTIN_NAMES)}"
        )
    repeated = sorted({name for name in names if list(names).count(name) > 1})
    if repeated:
        raise ValueError(f"built-in tools named more than once: {', '.join(repeated)}")
    tools: list[BuiltinTool] = []
    for name in names:
        if name == "transfer_to_human":
            tools.append(TransferToHuman(targets or {}, default_target, warm))
        elif name == "end_call":
            tools.append(EndCallTool())
        else:
            tools.append(SendDtmf())
    return tools

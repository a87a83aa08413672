"""What the tier simulator does with tools (OpenAI function calling), deterministically.

The tool exchange already in a request's input is checked as OpenAI checks it (`tool_outputs`:
each result answers an earlier call, each call is answered before the next message, or the
request is a 400). Then `tool_reply` decides:

- the latest input is tool results: say what they came to, one sentence each
  (`result_sentence`), and call nothing;
- else, from the caller's latest words: ask for a person (``transfer_to_human``), say goodbye
  (``end_call``), or name order numbers (a tool whose name has "order" in it: one call each,
  after "Let me look that up."); numbers may be spoken digit by digit (`spoken_numbers`);
- else nothing: the simulator answers as it does without tools.

How the calls are streamed is `voice.llm_sim.wire`'s business (`PlannedCall`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from voice.llm_sim.requests import BadRequest, OfferedTool, text_of
from voice.llm_sim.wire import PlannedCall

TRANSFER_WORDS = frozenset(
    ["transfer", "agent", "agents", "person", "human", "representative", "operator"]
)
GOODBYE_WORDS = frozenset(["goodbye", "bye"])
LOOKING = "Let me look that up."
_DIGITS = {
    w: str(i)
    for i, w in enumerate(
        ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    )
}
_REPEATS = {"double": 2, "triple": 3}


@dataclass(frozen=True)
class ToolOutput:
    """One tool result in the input, with the name of the call it answers."""

    name: str
    output: str


@dataclass(frozen=True)
class ToolReply:
    """What the model says (``text``, maybe "") and the calls it makes after it."""

    text: str
    calls: list[PlannedCall]


def tool_outputs(items: Any, api: Literal["chat", "responses"]) -> list[ToolOutput]:
    """Check the tool exchange in ``messages`` (Chat) or ``input`` (Responses) as OpenAI does;
    the results the input ends with (none if it ends otherwise)."""
    if not isinstance(items, list):
        return []  # a plain string input, or already refused by parse_messages
    param = "messages" if api == "chat" else "input"
    names: dict[str, str] = {}  # call id -> tool name
    waiting: dict[str, int] = {}  # call id not yet answered -> index of the message calling
    trailing: list[ToolOutput] = []
    for i, item in enumerate(items):
        calls, answers, message = _read_item(item, i, api)
        # Chat: a call is answered before the next message, its own or another; Responses: a
        # function_call item may follow another (parallel calls), a message may not
        if waiting and (message or (calls and api == "chat")):
            raise _unanswered(waiting, api)
        if message or calls:
            trailing = []
        for call_id, name in calls:
            names[call_id], waiting[call_id] = name, i
        for call_id, output in answers:
            if call_id not in names:
                if api == "chat":
                    raise BadRequest(
                        "Invalid parameter: messages with role 'tool' must be a response to a "
                        "preceeding message with 'tool_calls'.",
                        f"{param}[{i}].role",
                    )
                raise BadRequest(
                    f"No tool call found for function call output with call_id {call_id}.", param
                )
            waiting.pop(call_id, None)
            trailing.append(ToolOutput(names[call_id], output))
    if waiting:
        raise _unanswered(waiting, api)
    return trailing


def _read_item(
    item: Any, i: int, api: Literal["chat", "responses"]
) -> tuple[list[tuple[str, str]], list[tuple[str, str]], bool]:
    """One input item: the calls it makes, the results it gives, and whether it is a message."""
    if not isinstance(item, dict):
        return [], [], False
    if api == "chat":
        p = f"messages[{i}]"
        if item.get("role") == "tool":
            call_id = item.get("tool_call_id")
            if not isinstance(call_id, str):
                raise BadRequest(
                    f"Missing required parameter: '{p}.tool_call_id'.",
                    f"{p}.tool_call_id",
                    "missing_required_parameter",
                )
            return [], [(call_id, text_of(item.get("content")))], False
        raw = item.get("tool_calls") if item.get("role") == "assistant" else None
        calls = [_chat_call(c, f"{p}.tool_calls[{j}]") for j, c in enumerate(raw or [])]
        return calls, [], not calls
    kind = item.get("type")
    if kind == "function_call":
        fields = [item.get(k) for k in ("call_id", "name", "arguments")]
        if not all(isinstance(f, str) for f in fields):
            what = "a function_call needs a call_id, a name and arguments"
            raise BadRequest(f"Invalid 'input[{i}]': {what}.", f"input[{i}]")
        return [(str(fields[0]), str(fields[1]))], [], False
    if kind == "function_call_output":
        call_id = item.get("call_id")
        if not isinstance(call_id, str):
            raise BadRequest(
                f"Missing required parameter: 'input[{i}].call_id'.",
                f"input[{i}].call_id",
                "missing_required_parameter",
            )
        return [], [(call_id, text_of(item.get("output")))], False
    return [], [], "role" in item


def _chat_call(call: Any, param: str) -> tuple[str, str]:
    function = call.get("function") if isinstance(call, dict) else None
    if (
        not isinstance(function, dict)
        or not isinstance(call.get("id"), str)
        or not isinstance(function.get("name"), str)
        or not isinstance(function.get("arguments"), str)
    ):
        what = "expected an id, and a function with a name and arguments"
        raise BadRequest(f"Invalid '{param}': {what}.", param)
    return call["id"], function["name"]


def _unanswered(waiting: dict[str, int], api: Literal["chat", "responses"]) -> BadRequest:
    ids = ", ".join(waiting)
    if api == "chat":
        return BadRequest(
            "An assistant message with 'tool_calls' must be followed by tool messages responding "
            "to each 'tool_call_id'. The following tool_call_ids did not have response "
            f"messages: {ids}",
            f"messages[{min(waiting.values())}].role",
        )
    return BadRequest(f"No tool output found for function call {ids}.", "input")


# ---------------------------------------------------------------- what the model says and calls


def tool_reply(
    heard: str,
    offered: Sequence[OfferedTool],
    outputs: Sequence[ToolOutput],
    parallel: bool = True,
) -> ToolReply | None:
    """The reply when tools are involved; None to answer as without tools. ``heard``: the
    caller's latest words; ``outputs``: the tool results the input ends with."""
    if outputs:
        return ToolReply(" ".join(result_sentence(o.name, o.output) for o in outputs), [])
    names = {t.name: t for t in offered}
    words = set(re.findall(r"[a-z']+", heard.lower()))
    if words & TRANSFER_WORDS and "transfer_to_human" in names:
        return ToolReply("", [PlannedCall.of("transfer_to_human", {"reason": heard})])
    if words & GOODBYE_WORDS and "end_call" in names:
        return ToolReply("", [PlannedCall.of("end_call", {"reason": "the caller said goodbye"})])
    numbers = list(dict.fromkeys(n for n in spoken_numbers(heard) if len(n) >= 3))
    order = next((t for t in offered if "order" in t.name.lower()), None)
    if numbers and order is not None:
        calls = [PlannedCall.of(order.name, {order.argument(): n}) for n in numbers]
        return ToolReply(LOOKING, calls if parallel else calls[:1])
    return None


def spoken_numbers(text: str) -> list[str]:
    """The numbers in a transcript, as digit strings, in order: numerals ("4512", "4,512"), and
    digits said one by one, as numerals or words ("4 5 1 2", "four five one two", "4-5-1-2",
    "double seven", "four oh five")."""
    tokens = re.findall(r"\d{1,3}(?:,\d{3})+(?!\d)|\d+|[a-z]+|[^\sa-z\d]", text.lower())
    numbers: list[str] = []
    run: list[str] = []  # digits said one by one
    repeat = 1

    def flush() -> None:
        if run:
            numbers.append("".join(run))
            run.clear()

    for token in tokens:
        digit = _DIGITS.get(token, token if len(token) == 1 and token.isdigit() else None)
        if digit is None and token in ("oh", "o") and run:
            digit = "0"
        if digit is not None:
            run.append(digit * repeat)
            repeat = 1
        elif token in _REPEATS:
            repeat = _REPEATS[token]
        elif token in (",", "-"):
            continue  # "4, 5, 1, 2" and "4-5-1-2" are one number
        else:
            flush()
            repeat = 1
            if token[0].isdigit():
                numbers.append(token.replace(",", ""))
    flush()
    return numbers


def result_sentence(tool: str, output: str) -> str:
    """One tool result, said: an error, a transfer, a goodbye, or the result's fields in order
    ({"order": "4512", "status": "shipped"} -> "Order 4512: status shipped.")."""
    spoken = tool.replace("_", " ")
    try:
        value: Any = json.loads(output)
    except ValueError:
        value = output
    if isinstance(value, dict) and "error" in value:
        return _sentence(f"Sorry, I couldn't {spoken}: {_say(value['error'])}")
    if tool == "transfer_to_human":
        return "I'm putting you through to a person now."
    if tool == "end_call":
        return "Thank you for calling. Goodbye."
    if isinstance(value, dict):
        if not value:
            return _sentence(f"{spoken}: done")
        (key, first), *rest = value.items()
        head = f"{_key(key)} {_say(first)}"
        return _sentence(f"{head}: {_say(dict(rest))}" if rest else head)
    return _sentence(f"{spoken}: {_say(value)}")


def _key(key: Any) -> str:
    return str(key).replace("_", " ")


def _say(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return "none"
    if isinstance(value, list):
        return ", ".join(_say(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{_key(k)} {_say(v)}" for k, v in value.items())
    return " ".join(str(value).split())


def _sentence(text: str) -> str:
    text = text.rstrip(" .!?")
    return text[:1].upper() + text[1:] + "."

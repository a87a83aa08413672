"""How the tier simulator reads a request: `json_body`, `required_field`, `optional_field` and
`parse_messages` raise `BadRequest`, which the simulator answers with a 400 error body; what it
understood is a `SimulatedRequest`, with the function tools it offers (`parse_tools`). What the
input says of earlier tool calls is read in `voice.llm_sim.tools`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from starlette.requests import Request

JSON = dict[str, Any]
_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


@dataclass(frozen=True)
class OfferedTool:
    """A function the request offers the model."""

    name: str
    parameters: JSON
    description: str | None = None
    strict: bool | None = None

    def argument(self) -> str:
        """The argument to put a number in: the first required one, else the first listed."""
        required = self.parameters.get("required")
        if isinstance(required, list) and required and isinstance(required[0], str):
            return required[0]
        properties = self.parameters.get("properties")
        if isinstance(properties, dict) and properties:
            return str(next(iter(properties)))
        return "order_number"


@dataclass
class SimulatedRequest:
    """What the simulator understood of one request (for tests and debugging)."""

    api: Literal["chat", "responses"]
    model: str
    messages: list[tuple[str, str]]  # (role, text), instructions first as "system"
    service_tier: str | None  # as requested; None when the field was absent
    effort: str | None  # as requested; None when the field was absent
    max_tokens: int | None
    stream: bool
    profile: str
    tools: list[OfferedTool] = field(default_factory=list)  # the function tools offered
    parallel_tool_calls: bool = True


class BadRequest(Exception):
    """A malformed request: the simulator answers 400 with an OpenAI error body."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message, self.param, self.code = message, param, code


def text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [p.get("text") for p in content if isinstance(p, dict)]
        return " ".join(t for t in texts if isinstance(t, str))
    return ""


def parse_messages(items: Any, param: str) -> list[tuple[str, str]]:
    if not isinstance(items, list) or not items:
        raise BadRequest(f"Invalid '{param}': expected a non-empty array.", param, "invalid_value")
    out: list[tuple[str, str]] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise BadRequest(f"Invalid '{param}[{i}]': expected an object.", f"{param}[{i}]")
        role = item.get("role")
        if role is None and param == "input":
            continue  # tool outputs, reasoning items...: no caller text
        if role not in ("system", "developer", "user", "assistant", "tool"):
            raise BadRequest(f"Invalid value for '{param}[{i}].role'.", f"{param}[{i}].role")
        out.append((str(role), text_of(item.get("content"))))
    return out


def optional_field(body: JSON, key: str, kind: type, label: str | None = None) -> Any:
    """An optional field of the given JSON type (bool is not an int here)."""
    value = body.get(key)
    if value is None or (isinstance(value, kind) and (kind is bool or not isinstance(value, bool))):
        return value
    raise BadRequest(f"Invalid type for '{label or key}': expected {kind.__name__}.", label or key)


def required_field(body: JSON, key: str) -> Any:
    if body.get(key) is None:
        raise BadRequest(f"Missing required parameter: '{key}'.", key, "missing_required_parameter")
    return body[key]


async def json_body(request: Request) -> JSON:
    try:
        body = json.loads(await request.body())
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise BadRequest(
            "We could not parse the JSON body of your request. (HINT: This likely means you "
            "aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, "
            "but what was sent was not valid JSON.)"
        )
    return body


def _bad_tools(index: int, what: str) -> BadRequest:
    return BadRequest(f"Invalid 'tools[{index}]': {what}.", "tools", "invalid_value")


def parse_tools(value: Any, api: Literal["chat", "responses"]) -> list[OfferedTool]:
    """The function tools of a request (Chat: ``{"type": "function", "function": {...}}``;
    Responses: ``{"type": "function", "name": ...}``); anything malformed is a 400."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise BadRequest("Invalid type for 'tools': expected an array.", "tools", "invalid_type")
    offered: list[OfferedTool] = []
    for i, entry in enumerate(value):
        if not isinstance(entry, dict) or entry.get("type") != "function":
            raise _bad_tools(i, "expected an object with type 'function'")
        spec = entry.get("function") if api == "chat" else entry
        if not isinstance(spec, dict):
            raise _bad_tools(i, "missing 'function'")
        name, parameters = spec.get("name"), spec.get("parameters", {})
        description, strict = spec.get("description"), spec.get("strict")
        if not isinstance(name, str) or not _TOOL_NAME.match(name):
            raise _bad_tools(i, "the name must be 1-64 letters, digits, '_' or '-'")
        if not isinstance(parameters, dict):
            raise _bad_tools(i, "'parameters' must be a JSON schema object")
        if not isinstance(description, str | None) or not isinstance(strict, bool | None):
            raise _bad_tools(i, "'description' must be a string and 'strict' a boolean")
        offered.append(OfferedTool(name, parameters, description, strict))
    return offered

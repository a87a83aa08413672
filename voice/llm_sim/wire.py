"""OpenAI wire shapes for the tier simulator: what `voice.llm_sim.simulator` sends back.

One simulated generation is a `Plan`, timed on the event loop's monotonic clock. This module turns
it into Chat Completions responses and chunks (ending in ``[DONE]``), Responses API objects and
the Responses event sequence, usage blocks, error bodies and SSE framing. Streamed events come as
``(due time, bytes)`` pairs; the simulator paces them. Requests are read the other way: `json_body`,
`required_field`, `optional_field` and `parse_messages` raise `BadRequest`, which the simulator
answers with a 400 error body.
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from starlette.requests import Request

JSON = dict[str, Any]

REASONING_TEXT = "the caller wants a short friendly answer so keep it brief and spoken"


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


# ---------------------------------------------------------------- the timeline of one reply


@dataclass
class Plan:
    """One simulated generation, timed on the event loop's monotonic clock."""

    request: SimulatedRequest
    instructions: str | None
    reported_tier: str
    effort: str
    reasoning_tokens: int
    deltas: list[str]
    finish_reason: Literal["stop", "length"]
    prompt_tokens: int
    start: float
    ttft_s: float
    token_s: float
    created: int = field(default_factory=lambda: int(time.time()))
    ident: str = field(default_factory=lambda: uuid.uuid4().hex[:24])

    @property
    def text(self) -> str:
        return "".join(self.deltas)

    def first_token_at(self) -> float:
        return self.start + self.ttft_s

    def visible_at(self, index: int) -> float:
        """When visible token ``index`` is due: after every reasoning token, at the tier's rate."""
        return self.first_token_at() + (self.reasoning_tokens + index) * self.token_s

    def end_at(self) -> float:
        return self.visible_at(max(len(self.deltas) - 1, 0))


# ---------------------------------------------------------------- wire format (OpenAI shapes)


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> JSON:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def status_error(status: int, profile: str) -> JSON:
    if status == 429:
        return error_body(
            f"Rate limit reached on the simulated '{profile}' tier. Please try again later.",
            "requests",
            code="rate_limit_exceeded",
        )
    if status == 503:
        return error_body(
            f"The simulated '{profile}' tier is overloaded. Please try again later.",
            "server_error",
            code="server_overloaded",
        )
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return error_body(f"Simulated failure (HTTP {status}) on the '{profile}' tier.", kind)


def sse(data: JSON | str, event: str | None = None) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


def _chat_usage(plan: Plan) -> JSON:
    completion = plan.reasoning_tokens + len(plan.deltas)
    return {
        "prompt_tokens": plan.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": plan.prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": plan.reasoning_tokens,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def chat_completion(plan: Plan) -> JSON:
    message: JSON = {"role": "assistant", "content": plan.text, "refusal": None, "annotations": []}
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": plan.finish_reason}
    return {
        "id": f"chatcmpl-{plan.ident}",
        "object": "chat.completion",
        "created": plan.created,
        "model": plan.request.model,
        "choices": [choice],
        "usage": _chat_usage(plan),
        "service_tier": plan.reported_tier,
        "system_fingerprint": "fp_hotline_sim",
    }


def chat_events(plan: Plan, include_usage: bool, reasoning_field: str) -> list[tuple[float, bytes]]:
    def chunk(delta: JSON, finish: str | None = None, usage: JSON | None = None) -> bytes:
        choices = (
            []
            if usage
            else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
        )
        body: JSON = {
            "id": f"chatcmpl-{plan.ident}",
            "object": "chat.completion.chunk",
            "created": plan.created,
            "model": plan.request.model,
            "service_tier": plan.reported_tier,
            "system_fingerprint": "fp_hotline_sim",
            "choices": choices,
        }
        if include_usage:
            body["usage"] = usage
        return sse(body)

    start = plan.first_token_at()
    events = [(start, chunk({"role": "assistant", "content": "", "refusal": None}))]
    if reasoning_field != "none":
        words = itertools.cycle(REASONING_TEXT.split())
        for i in range(plan.reasoning_tokens):
            events.append((start + i * plan.token_s, chunk({reasoning_field: " " + next(words)})))
    events += [(plan.visible_at(i), chunk({"content": d})) for i, d in enumerate(plan.deltas)]
    end = plan.end_at()
    events.append((end, chunk({}, plan.finish_reason)))
    if include_usage:
        events.append((end, chunk({}, usage=_chat_usage(plan))))
    events.append((end, sse("[DONE]")))
    return events


def _text_part(text: str) -> JSON:
    return {"type": "output_text", "annotations": [], "logprobs": [], "text": text}


def _reasoning_item(plan: Plan) -> JSON:
    return {"id": f"rs_{plan.ident}", "type": "reasoning", "summary": []}


def _message_item(plan: Plan, final: bool) -> JSON:
    status = (
        "in_progress"
        if not final
        else "completed"
        if plan.finish_reason == "stop"
        else "incomplete"
    )
    parts = [_text_part(plan.text)] if final else []
    item = {"id": f"msg_{plan.ident}", "type": "message", "role": "assistant"}
    return {**item, "status": status, "content": parts}


def response_object(plan: Plan, final: bool) -> JSON:
    complete = plan.finish_reason == "stop"
    output: list[JSON] = []
    usage: JSON | None = None
    if final:
        output = [_reasoning_item(plan)] if plan.reasoning_tokens else []
        if plan.deltas:
            output.append(_message_item(plan, final=True))
        out_tokens = plan.reasoning_tokens + len(plan.deltas)
        usage = {
            "input_tokens": plan.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": out_tokens,
            "output_tokens_details": {"reasoning_tokens": plan.reasoning_tokens},
            "total_tokens": plan.prompt_tokens + out_tokens,
        }
    status = "in_progress" if not final else "completed" if complete else "incomplete"
    return {
        "id": f"resp_{plan.ident}",
        "object": "response",
        "created_at": plan.created,
        "completed_at": plan.created + round(plan.end_at() - plan.start) if final else None,
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": None if complete or not final else {"reason": "max_output_tokens"},
        "instructions": plan.instructions,
        "max_output_tokens": plan.request.max_tokens,
        "max_tool_calls": None,
        "model": plan.request.model,
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": {"effort": plan.effort, "summary": None},
        "service_tier": plan.reported_tier,
        "temperature": 1.0,
        "text": {"format": {"type": "text"}, "verbosity": "medium"},
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": usage,
        "user": None,
        "metadata": {},
    }


def response_events(plan: Plan) -> list[tuple[float, bytes]]:
    events: list[tuple[float, bytes]] = []
    seq = itertools.count()

    def emit(at: float, kind: str, **fields: Any) -> None:
        events.append((at, sse({"type": kind, "sequence_number": next(seq), **fields}, kind)))

    started = response_object(plan, final=False)
    emit(plan.start, "response.created", response=started)
    emit(plan.start, "response.in_progress", response=started)
    index = 0
    if plan.reasoning_tokens:
        item = _reasoning_item(plan)
        emit(plan.first_token_at(), "response.output_item.added", output_index=0, item=item)
        emit(plan.visible_at(0), "response.output_item.done", output_index=0, item=item)
        index = 1
    if plan.deltas:
        first, end, text = plan.visible_at(0), plan.end_at(), plan.text
        at = {"output_index": index, "item_id": f"msg_{plan.ident}", "content_index": 0}
        item = _message_item(plan, final=False)
        emit(first, "response.output_item.added", output_index=index, item=item)
        emit(first, "response.content_part.added", part=_text_part(""), **at)
        for i, delta in enumerate(plan.deltas):
            emit(plan.visible_at(i), "response.output_text.delta", delta=delta, logprobs=[], **at)
        emit(end, "response.output_text.done", text=text, logprobs=[], **at)
        emit(end, "response.content_part.done", part=_text_part(text), **at)
        item = _message_item(plan, final=True)
        emit(end, "response.output_item.done", output_index=index, item=item)
    done = "response.completed" if plan.finish_reason == "stop" else "response.incomplete"
    emit(plan.end_at(), done, response=response_object(plan, final=True))
    return events


# ---------------------------------------------------------------- request parsing


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

"""OpenAI wire shapes for the tier simulator: what `voice.llm_sim.simulator` sends back.

One simulated generation is a `Plan`, timed on the event loop's monotonic clock: visible text,
then the tool calls it makes (`PlannedCall`), one token at a time. This module turns it into
Chat Completions responses and chunks (ending in ``[DONE]``), Responses API objects and the
Responses event sequence, usage blocks, error bodies and SSE framing. Streamed events come as
``(due time, bytes)`` pairs; the simulator paces them. Requests are read the other way, in
`voice.llm_sim.requests`.
"""

from __future__ import annotations

import itertools
import json
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from voice.llm_sim.requests import JSON, SimulatedRequest

REASONING_TEXT = "the caller wants a short friendly answer so keep it brief and spoken"
FinishReason = Literal["stop", "length", "tool_calls"]


# ---------------------------------------------------------------- the timeline of one reply


@dataclass(frozen=True)
class PlannedCall:
    """One tool call of a simulated reply: the tool's name, and its arguments' JSON text in the
    pieces it is streamed in (about a token each, after one token for the call's start)."""

    name: str
    pieces: tuple[str, ...]

    @staticmethod
    def of(name: str, arguments: JSON) -> PlannedCall:
        text = json.dumps(arguments, separators=(",", ":"), ensure_ascii=False)
        return PlannedCall(name, tuple(re.findall(r"\s*(?:\w+|[^\w\s]+)|\s+", text)))

    @property
    def arguments(self) -> str:
        return "".join(self.pieces)

    @property
    def tokens(self) -> int:
        return 1 + len(self.pieces)

    def cut(self, tokens: int) -> PlannedCall:
        """The call as far as ``tokens`` output tokens go (a token cap)."""
        return PlannedCall(self.name, self.pieces[: max(tokens - 1, 0)])


def fit_calls(calls: list[PlannedCall], tokens: int) -> tuple[list[PlannedCall], bool]:
    """The calls as far as ``tokens`` output tokens go, and whether any was cut short."""
    kept: list[PlannedCall] = []
    for call in calls:
        if tokens > 0:
            kept.append(call.cut(tokens))
        tokens -= call.tokens
    return kept, tokens < 0


@dataclass
class Plan:
    """One simulated generation, timed on the event loop's monotonic clock."""

    request: SimulatedRequest
    instructions: str | None
    reported_tier: str
    effort: str
    reasoning_tokens: int
    deltas: list[str]
    finish_reason: FinishReason
    prompt_tokens: int
    start: float
    ttft_s: float
    token_s: float
    calls: list[PlannedCall] = field(default_factory=list)  # after the text
    created: int = field(default_factory=lambda: int(time.time()))
    ident: str = field(default_factory=lambda: uuid.uuid4().hex[:24])

    @property
    def text(self) -> str:
        return "".join(self.deltas)

    def first_token_at(self) -> float:
        return self.start + self.ttft_s

    @property
    def output_tokens(self) -> int:
        """Visible text and tool calls (reasoning not included)."""
        return len(self.deltas) + sum(c.tokens for c in self.calls)

    def visible_at(self, index: int) -> float:
        """When output token ``index`` is due (text first, then tool calls): after every
        reasoning token, at the tier's rate."""
        return self.first_token_at() + (self.reasoning_tokens + index) * self.token_s

    def text_end_at(self) -> float:
        return self.visible_at(max(len(self.deltas) - 1, 0))

    def end_at(self) -> float:
        return self.visible_at(max(self.output_tokens - 1, 0))

    def call_id(self, index: int) -> str:
        return f"call_{self.ident}_{index}"


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
    completion = plan.reasoning_tokens + plan.output_tokens
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


def _chat_call(plan: Plan, index: int) -> JSON:
    call = plan.calls[index]
    function = {"name": call.name, "arguments": call.arguments}
    return {"id": plan.call_id(index), "type": "function", "function": function}


def chat_completion(plan: Plan) -> JSON:
    content = plan.text if plan.deltas or not plan.calls else None
    message: JSON = {"role": "assistant", "content": content, "refusal": None, "annotations": []}
    if plan.calls:
        message["tool_calls"] = [_chat_call(plan, i) for i in range(len(plan.calls))]
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
    content = "" if plan.deltas or not plan.calls else None
    events = [(start, chunk({"role": "assistant", "content": content, "refusal": None}))]
    if reasoning_field != "none":
        words = itertools.cycle(REASONING_TEXT.split())
        for i in range(plan.reasoning_tokens):
            events.append((start + i * plan.token_s, chunk({reasoning_field: " " + next(words)})))
    events += [(plan.visible_at(i), chunk({"content": d})) for i, d in enumerate(plan.deltas)]
    token = len(plan.deltas)
    for i, call in enumerate(plan.calls):
        # the first fragment names the call; its arguments follow, a piece a token
        named = {"index": i, "id": plan.call_id(i), "type": "function"}
        named["function"] = {"name": call.name, "arguments": ""}
        events.append((plan.visible_at(token), chunk({"tool_calls": [named]})))
        for piece in call.pieces:
            token += 1
            fragment = {"index": i, "function": {"arguments": piece}}
            events.append((plan.visible_at(token), chunk({"tool_calls": [fragment]})))
        token += 1
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
    cut = plan.finish_reason == "length" and not plan.calls  # the cap fell in the text
    status = "in_progress" if not final else "incomplete" if cut else "completed"
    parts = [_text_part(plan.text)] if final else []
    item = {"id": f"msg_{plan.ident}", "type": "message", "role": "assistant"}
    return {**item, "status": status, "content": parts}


def _call_item(plan: Plan, index: int, final: bool) -> JSON:
    call = plan.calls[index]
    cut = plan.finish_reason == "length" and index == len(plan.calls) - 1
    status = "in_progress" if not final else "incomplete" if cut else "completed"
    item = {"id": f"fc_{plan.ident}_{index}", "type": "function_call", "status": status}
    arguments = call.arguments if final else ""
    return {**item, "arguments": arguments, "call_id": plan.call_id(index), "name": call.name}


def _echoed_tools(request: SimulatedRequest) -> list[JSON]:
    """The function tools as a response lists them."""
    return [
        {
            "type": "function",
            "name": t.name,
            "description": t.description,
            "parameters": t.parameters,
            "strict": True if t.strict is None else t.strict,
        }
        for t in request.tools
    ]


def response_object(plan: Plan, final: bool) -> JSON:
    complete = plan.finish_reason != "length"
    output: list[JSON] = []
    usage: JSON | None = None
    if final:
        output = [_reasoning_item(plan)] if plan.reasoning_tokens else []
        if plan.deltas:
            output.append(_message_item(plan, final=True))
        output += [_call_item(plan, i, final=True) for i in range(len(plan.calls))]
        out_tokens = plan.reasoning_tokens + plan.output_tokens
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
        "parallel_tool_calls": plan.request.parallel_tool_calls,
        "previous_response_id": None,
        "reasoning": {"effort": plan.effort, "summary": None},
        "service_tier": plan.reported_tier,
        "temperature": 1.0,
        "text": {"format": {"type": "text"}, "verbosity": "medium"},
        "tool_choice": "auto",
        "tools": _echoed_tools(plan.request),
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": usage,
        "user": None,
        "metadata": {},
    }


def response_events(plan: Plan) -> list[tuple[float, bytes]]:
    events: list[tuple[float, bytes]] = []
    seq = itertools.count()

    def emit(due: float, kind: str, **fields: Any) -> None:
        events.append((due, sse({"type": kind, "sequence_number": next(seq), **fields}, kind)))

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
        first, end, text = plan.visible_at(0), plan.text_end_at(), plan.text
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
        index += 1
    token = len(plan.deltas)
    for i, call in enumerate(plan.calls):
        out, due = index + i, plan.visible_at(token)
        at = {"output_index": out, "item_id": f"fc_{plan.ident}_{i}"}
        emit(due, "response.output_item.added", output_index=out, item=_call_item(plan, i, False))
        for piece in call.pieces:
            token += 1
            due = plan.visible_at(token)
            emit(due, "response.function_call_arguments.delta", delta=piece, **at)
        token += 1
        emit(due, "response.function_call_arguments.done", arguments=call.arguments, **at)
        emit(due, "response.output_item.done", output_index=out, item=_call_item(plan, i, True))
    done = "response.completed" if plan.finish_reason != "length" else "response.incomplete"
    emit(plan.end_at(), done, response=response_object(plan, final=True))
    return events

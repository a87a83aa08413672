"""Streaming LLM client for any OpenAI-compatible provider (Chat Completions or Responses).

``LLMClient.stream(history)`` returns an `LLMStream`: an async iterator of the visible text
deltas of one reply, which records as it goes when the request was sent, when the first visible
token arrived, the service tier the provider says served it (``service_tier_served``) and the
reasoning/output token counts. Errors are `pipeline.llm.errors.LLMError`.

With ``tools`` (`pipeline.tools.ToolSpec`), the reply may also call them: the stream still
yields only visible text (a model may say "Let me look that up." first), and the calls are in
``tool_calls`` once it has ended (``finish_reason`` "tool_calls"). Their results go back as
history: the assistant message carrying ``tool_calls``, then one ``role="tool"`` message each.
Closing the stream (``aclose()``, leaving ``async with``, or cancelling the task that iterates
it) closes the HTTP response, so the provider stops generating.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field
from types import EllipsisType, TracebackType
from typing import Any, Literal, cast

import openai
from openai import AsyncOpenAI, AsyncStream, omit
from openai.types.chat import ChatCompletionChunk, ChatCompletionMessageParam
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseCreatedEvent,
    ResponseErrorEvent,
    ResponseFailedEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionCallArgumentsDoneEvent,
    ResponseFunctionToolCall,
    ResponseIncompleteEvent,
    ResponseInProgressEvent,
    ResponseInputParam,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseStreamEvent,
    ResponseTextDeltaEvent,
)

from pipeline.llm.connections import open_connection, provider_client
from pipeline.llm.errors import LLMError, status_error
from pipeline.llm.settings import LLMSettings
from pipeline.tools import ToolCall, ToolSpec


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One message of the history. An assistant message may carry the ``tool_calls`` it made
    (its ``content`` may then be ""); a ``role="tool"`` message is one call's result: its
    output as ``content``, the call's id as ``tool_call_id``. ``source``: who spoke an
    assistant message the caller heard: None for the bot's own reply, "operator" for a
    supervisor's message, "announcement" for a fixed text (the greeting, the recording notice);
    never sent to the model, and no part of equality."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    source: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.tool_calls and self.role != "assistant":
            raise ValueError(f"a {self.role} message cannot carry tool calls")
        if (self.role == "tool") != (self.tool_call_id is not None):
            raise ValueError("a tool message, and only a tool message, names its tool_call_id")


class LLMClient:
    """One shared client per process; each `stream()` is one reply."""

    def __init__(self, settings: LLMSettings, base_url: str | None = None) -> None:
        url = base_url or settings.base_url
        if not url:
            raise ValueError(
                "no LLM base URL: start the embedded simulator or set HOTLINE_LLM__BASE_URL"
            )
        self.settings = settings
        self.base_url = url
        self._openai = provider_client(settings, url)
        # Loaded now, not on the loop in the first caller's turn (the SDK's lazy import: 35 ms+).
        _ = self._openai.responses if settings.api == "responses" else self._openai.chat.completions

    def stream(
        self,
        history: Sequence[ChatMessage],
        *,
        service_tier: str | EllipsisType | None = ...,
        effort: str | EllipsisType | None = ...,
        max_output_tokens: int | None = None,
        tools: Sequence[ToolSpec] = (),
        instructions: str | None = None,
    ) -> LLMStream:
        """Start a reply to ``history`` (user/assistant/tool turns; the system prompt is added:
        ``instructions`` when given, else the settings' ``system_prompt``).

        ``...`` (the default) takes the tier and effort from the settings; None sends none.
        ``tools`` are offered to the model (parallel calls allowed); none: no tools field.
        The request goes out on the first iteration (or on entering ``async with``).
        """
        s = self.settings
        return LLMStream(
            self._openai,
            s,
            history,
            service_tier=s.service_tier if isinstance(service_tier, EllipsisType) else service_tier,
            effort=s.reasoning_effort if isinstance(effort, EllipsisType) else effort,
            max_output_tokens=max_output_tokens or s.max_output_tokens,
            tools=tools,
            instructions=instructions,
        )

    async def connect(self) -> bool:
        """Open a connection to the provider now (`pipeline.llm.connections`)."""
        return await open_connection(self._openai, self.settings.connect_timeout_s + 1)

    async def aclose(self) -> None:
        await self._openai.close()


@dataclass
class _CallParts:
    """A tool call as its fragments arrive."""

    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)

    def call(self) -> ToolCall:
        return ToolCall(
            self.id or f"call_{uuid.uuid4().hex[:24]}", self.name, "".join(self.arguments)
        )


class LLMStream:
    """Visible text deltas of one reply; attributes fill in as the stream proceeds.

    ``tool_calls`` is complete once the stream has ended; ``first_tool_call_at`` is when the
    first fragment of one arrived, and ``on_tool_call`` (if set) is called then, once: a reply
    that only calls tools has answered by that time, though it yields no text.
    """

    def __init__(
        self,
        client: AsyncOpenAI,
        settings: LLMSettings,
        history: Sequence[ChatMessage],
        *,
        service_tier: str | None,
        effort: str | None,
        max_output_tokens: int,
        tools: Sequence[ToolSpec] = (),
        instructions: str | None = None,
    ) -> None:
        self.api = settings.api
        self.model = settings.model
        self.service_tier_requested = service_tier
        self.effort = effort
        self.max_output_tokens = max_output_tokens
        self.requested_at = time.monotonic()  # reset when the request is actually sent
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.deltas = 0  # visible deltas received
        self.prompt_tokens: int | None = None  # as the provider counted them
        self.service_tier_served: str | None = None  # as echoed by the provider
        self.reasoning_tokens: int | None = None
        self.output_tokens: int | None = None  # reasoning tokens included
        self.finish_reason: str | None = None  # "stop", "length", "tool_calls", ...
        self.finished = False
        self.text = ""  # visible text so far
        self.tool_calls: list[ToolCall] = []  # complete when the stream has ended
        self.first_tool_call_at: float | None = None
        self.on_tool_call: Callable[[], None] | None = None  # called at the first fragment
        self._calls: dict[int, _CallParts] = {}  # by Chat index or Responses output_index
        self._completed_calls: list[ToolCall] | None = None  # as listed by response.completed
        self._client = client
        self._system_prompt = settings.system_prompt if instructions is None else instructions
        self._tools = list(tools)
        self._history = list(history)
        self._sdk_stream: AsyncStream[Any] | None = None
        self._closed = False
        self._deltas = self._run()

    def __aiter__(self) -> LLMStream:
        return self

    async def __anext__(self) -> str:
        return await self._deltas.__anext__()

    async def __aenter__(self) -> LLMStream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop the reply: close the HTTP stream (the provider sees the disconnect)."""
        self._closed = True
        if self._sdk_stream is not None:
            await self._sdk_stream.close()
        if not getattr(self._deltas, "ag_running", False):  # else its own task is finishing it
            await self._deltas.aclose()

    async def _run(self) -> AsyncGenerator[str, None]:
        try:
            self.requested_at = time.monotonic()
            if self.api == "chat":
                chat = await self._open_chat()
                self._sdk_stream = chat
                async for chunk in chat:
                    if text := self._read_chunk(chunk):
                        yield self._visible(text)
            else:
                events = await self._open_responses()
                self._sdk_stream = events
                async for event in events:
                    if text := self._read_event(event):
                        yield self._visible(text)
            self.tool_calls = self._completed_calls or [
                parts.call() for _, parts in sorted(self._calls.items())
            ]
            self.finished = True
        except openai.APIStatusError as exc:
            if not self._closed:
                raise status_error(exc) from exc
        except openai.APIError as exc:  # connection errors, timeouts, errors inside the stream
            if not self._closed:
                raise LLMError(None, exc.message) from exc
        finally:
            if self._sdk_stream is not None:
                await self._sdk_stream.close()

    def _visible(self, text: str) -> str:
        self.last_token_at = time.monotonic()
        if self.first_token_at is None:
            self.first_token_at = self.last_token_at
        self.deltas += 1
        self.text += text
        return text

    def _tool_fragment(self, index: int) -> _CallParts:
        """A fragment of tool call ``index`` arrived: its parts so far."""
        if self.first_tool_call_at is None:
            self.first_tool_call_at = time.monotonic()
            if self.on_tool_call is not None:
                self.on_tool_call()
        return self._calls.setdefault(index, _CallParts())

    async def _open_chat(self) -> AsyncStream[ChatCompletionChunk]:
        messages: list[ChatCompletionMessageParam] = []
        if self._system_prompt:
            messages.append({"role": "system", "content": self._system_prompt})
        messages += [_chat_message(m) for m in self._history]
        service_tier, tools = self.service_tier_requested, self._tools
        return await self._client.chat.completions.create(
            model=self.model,
            messages=messages,
            stream=True,
            stream_options={"include_usage": True},
            max_completion_tokens=self.max_output_tokens,
            service_tier=omit if service_tier is None else cast(Any, service_tier),
            reasoning_effort=omit if self.effort is None else cast(Any, self.effort),
            tools=cast(Any, [t.chat() for t in tools]) if tools else omit,
            parallel_tool_calls=True if tools else omit,
        )

    async def _open_responses(self) -> AsyncStream[ResponseStreamEvent]:
        items: ResponseInputParam = [i for m in self._history for i in _response_items(m)]
        service_tier, tools = self.service_tier_requested, self._tools
        return await self._client.responses.create(
            model=self.model,
            input=items,
            instructions=self._system_prompt or omit,
            stream=True,
            store=False,
            max_output_tokens=self.max_output_tokens,
            service_tier=omit if service_tier is None else cast(Any, service_tier),
            reasoning=omit if self.effort is None else {"effort": cast(Any, self.effort)},
            tools=cast(Any, [t.responses() for t in tools]) if tools else omit,
            parallel_tool_calls=True if tools else omit,
        )

    def _read_chunk(self, chunk: ChatCompletionChunk) -> str:
        """Record what the chunk says; return its visible text (reasoning fields are skipped)."""
        if chunk.service_tier:
            self.service_tier_served = chunk.service_tier
        if chunk.usage is not None:
            self.output_tokens = chunk.usage.completion_tokens
            self.prompt_tokens = chunk.usage.prompt_tokens
            details = chunk.usage.completion_tokens_details
            if details is not None and details.reasoning_tokens is not None:
                self.reasoning_tokens = details.reasoning_tokens
        text = ""
        for choice in chunk.choices:
            if choice.index == 0:
                text += choice.delta.content or ""
                self.finish_reason = choice.finish_reason or self.finish_reason
                for fragment in choice.delta.tool_calls or ():
                    parts = self._tool_fragment(fragment.index)
                    parts.id = parts.id or fragment.id or ""
                    if fragment.function is not None:
                        parts.name = parts.name or fragment.function.name or ""
                        if fragment.function.arguments:
                            parts.arguments.append(fragment.function.arguments)
        return text

    def _read_event(self, event: ResponseStreamEvent) -> str:
        if isinstance(event, ResponseTextDeltaEvent):
            return event.delta
        if isinstance(event, ResponseOutputItemAddedEvent | ResponseOutputItemDoneEvent):
            if isinstance(event.item, ResponseFunctionToolCall):
                parts = self._tool_fragment(event.output_index)
                parts.id, parts.name = event.item.call_id, event.item.name
                parts.arguments = [event.item.arguments] if event.item.arguments else []
            return ""
        if isinstance(event, ResponseFunctionCallArgumentsDeltaEvent):
            self._tool_fragment(event.output_index).arguments.append(event.delta)
            return ""
        if isinstance(event, ResponseFunctionCallArgumentsDoneEvent):
            self._tool_fragment(event.output_index).arguments = [event.arguments]
            return ""
        if isinstance(event, ResponseErrorEvent):
            raise LLMError(None, event.message)
        if isinstance(event, ResponseFailedEvent):
            error = event.response.error
            raise LLMError(None, error.message if error else "the response failed")
        if isinstance(
            event,
            ResponseCreatedEvent
            | ResponseInProgressEvent
            | ResponseCompletedEvent
            | ResponseIncompleteEvent,
        ):
            self._read_response(event.response)
        if isinstance(event, ResponseCompletedEvent):
            calls = [o for o in event.response.output if isinstance(o, ResponseFunctionToolCall)]
            if calls:
                self._completed_calls = [ToolCall(c.call_id, c.name, c.arguments) for c in calls]
            self.finish_reason = "tool_calls" if calls else "stop"
        elif isinstance(event, ResponseIncompleteEvent):
            details = event.response.incomplete_details
            reason = details.reason if details else None
            self.finish_reason = "length" if reason == "max_output_tokens" else reason
        return ""

    def _read_response(self, response: Response) -> None:
        if response.service_tier:
            self.service_tier_served = response.service_tier
        if response.usage is not None:
            self.output_tokens = response.usage.output_tokens
            self.prompt_tokens = response.usage.input_tokens
            self.reasoning_tokens = response.usage.output_tokens_details.reasoning_tokens


def _chat_message(m: ChatMessage) -> ChatCompletionMessageParam:
    """One history message as Chat Completions sends it."""
    if m.role == "tool":
        return {"role": "tool", "tool_call_id": m.tool_call_id or "", "content": m.content}
    if m.role == "assistant" and m.tool_calls:
        calls: list[Any] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in m.tool_calls
        ]
        return {"role": "assistant", "content": m.content or None, "tool_calls": calls}
    return cast(ChatCompletionMessageParam, {"role": m.role, "content": m.content})


def _response_items(m: ChatMessage) -> list[Any]:
    """One history message as Responses input items: a tool result is a function call's
    output; an assistant's text (if any) comes before the function calls it made."""
    if m.role == "tool":
        return [{"type": "function_call_output", "call_id": m.tool_call_id, "output": m.content}]
    text = [{"role": m.role, "content": m.content}] if m.content or not m.tool_calls else []
    calls = [
        {"type": "function_call", "call_id": c.id, "name": c.name, "arguments": c.arguments}
        for c in m.tool_calls
    ]
    return text + calls


def estimate_prompt_tokens(
    history: Sequence[ChatMessage], system_prompt: str = "", tools: Sequence[ToolSpec] = ()
) -> int:
    """Roughly how many tokens a prompt is (4 characters a token, 4 per message or tool call,
    the tools' schemas included), for planning."""
    texts = [system_prompt, *(m.content for m in history)]
    texts += [c.name + c.arguments for m in history for c in m.tool_calls]
    texts += [json.dumps(t.chat(), separators=(",", ":")) for t in tools]
    return sum(len(t) // 4 + 4 for t in texts if t) + 3

"""Streaming LLM client for any OpenAI-compatible provider (Chat Completions or Responses).

``LLMClient.stream(history)`` returns an `LLMStream`: an async iterator of the visible text
deltas of one reply, which records as it goes when the request was sent, when the first visible
token arrived, the service tier the provider says served it (``service_tier_served``) and the
reasoning/output token counts. Errors are `pipeline.llm.errors.LLMError`.
Closing the stream (``aclose()``, leaving ``async with``, or cancelling the task that iterates
it) closes the HTTP response, so the provider stops generating.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
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
    ResponseIncompleteEvent,
    ResponseInProgressEvent,
    ResponseInputParam,
    ResponseStreamEvent,
    ResponseTextDeltaEvent,
)

from pipeline.llm.errors import LLMError, status_error
from pipeline.llm.settings import LLMSettings


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: Literal["system", "user", "assistant"]
    content: str


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
        self._openai = AsyncOpenAI(
            base_url=url,
            api_key=settings.api_key.get_secret_value(),
            timeout=openai.Timeout(settings.timeout_s, connect=settings.connect_timeout_s),
            max_retries=settings.max_retries,
        )

    def stream(
        self,
        history: Sequence[ChatMessage],
        *,
        service_tier: str | EllipsisType | None = ...,
        effort: str | EllipsisType | None = ...,
        max_output_tokens: int | None = None,
    ) -> LLMStream:
        """Start a reply to ``history`` (user/assistant turns; the system prompt is added).

        ``...`` (the default) takes the tier and effort from the settings; None sends none.
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
        )

    async def aclose(self) -> None:
        await self._openai.close()


class LLMStream:
    """Visible text deltas of one reply; attributes fill in as the stream proceeds."""

    def __init__(
        self,
        client: AsyncOpenAI,
        settings: LLMSettings,
        history: Sequence[ChatMessage],
        *,
        service_tier: str | None,
        effort: str | None,
        max_output_tokens: int,
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
        self.finish_reason: str | None = None  # "stop", "length", ...
        self.finished = False
        self.text = ""  # visible text so far
        self._client = client
        self._system_prompt = settings.system_prompt
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

    async def _open_chat(self) -> AsyncStream[ChatCompletionChunk]:
        messages: list[ChatCompletionMessageParam] = []
        if self._system_prompt:
            messages.append({"role": "system", "content": self._system_prompt})
        for m in self._history:
            if m.role == "user":
                messages.append({"role": "user", "content": m.content})
            elif m.role == "assistant":
                messages.append({"role": "assistant", "content": m.content})
            else:
                messages.append({"role": "system", "content": m.content})
        service_tier = self.service_tier_requested
        return await self._client.chat.completions.create(
            model=self.model,
            messages=messages,
            stream=True,
            stream_options={"include_usage": True},
            max_completion_tokens=self.max_output_tokens,
            service_tier=omit if service_tier is None else cast(Any, service_tier),
            reasoning_effort=omit if self.effort is None else cast(Any, self.effort),
        )

    async def _open_responses(self) -> AsyncStream[ResponseStreamEvent]:
        items: ResponseInputParam = [{"role": m.role, "content": m.content} for m in self._history]
        service_tier = self.service_tier_requested
        return await self._client.responses.create(
            model=self.model,
            input=items,
            instructions=self._system_prompt or omit,
            stream=True,
            store=False,
            max_output_tokens=self.max_output_tokens,
            service_tier=omit if service_tier is None else cast(Any, service_tier),
            reasoning=omit if self.effort is None else {"effort": cast(Any, self.effort)},
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
        return text

    def _read_event(self, event: ResponseStreamEvent) -> str:
        if isinstance(event, ResponseTextDeltaEvent):
            return event.delta
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
            self.finish_reason = "stop"
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


def estimate_prompt_tokens(history: Sequence[ChatMessage], system_prompt: str = "") -> int:
    """Roughly how many tokens a prompt is (4 characters a token, 4 per message), for planning."""
    texts = [system_prompt, *(m.content for m in history)]
    return sum(len(t) // 4 + 4 for t in texts if t) + 3

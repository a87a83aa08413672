"""Streaming LLM client for any OpenAI-compatible provider (Chat Completions or Responses).

``LLMClient.stream(history)`` returns an `LLMStream`: an async iterator of the visible text
deltas of one reply, which records as it goes when the request was sent, when the first visible
token arrived, the tier the provider says it used and the reasoning/output token counts.
Closing the stream (``aclose()``, leaving ``async with``, or cancelling the task that iterates
it) closes the HTTP response, so the provider stops generating.
"""

from __future__ import annotations

import datetime
import email.utils
import math
import time
from collections.abc import AsyncGenerator, Mapping, Sequence
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
from pydantic import BaseModel, Field, SecretStr

from pipeline.controller import FAST_TIER, STANDARD_TIER, TierOption

DEFAULT_SYSTEM_PROMPT = (
    "You are a friendly voice assistant talking with a caller on the phone. Everything you "
    "write is spoken aloud by a text-to-speech voice, so answer in plain spoken sentences: no "
    "markdown, lists, emoji, links or symbols. Keep each reply short, one to three sentences, "
    "and ask at most one question at a time. Say numbers, dates and times the way a person "
    "would say them. If you did not understand the caller, ask them to repeat."
)


class LLMTier(TierOption):
    """A tier the calls may use: the controller's view of it plus where and how to reach it.

    Connection fields left unset are taken from `LLMSettings` (base URL, key, model, API).
    """

    base_url: str | None = Field(default=None, description="None: LLMSettings.base_url.")
    api_key: SecretStr | None = Field(default=None, description="None: LLMSettings.api_key.")
    model: str | None = Field(default=None, description="None: LLMSettings.model.")
    api: Literal["chat", "responses"] | None = Field(
        default=None, description="None: LLMSettings.api."
    )


def default_tiers() -> list[LLMTier]:
    """The provider's fast (premium) tier first, then its standard tier, on one base URL."""
    return [LLMTier(**FAST_TIER.model_dump()), LLMTier(**STANDARD_TIER.model_dump())]


class LLMSettings(BaseModel):
    """Which provider and model to call, and how (env prefix ``HOTLINE_LLM__`` in the server)."""

    base_url: str | None = Field(
        default=None, description="OpenAI-compatible base URL; None: the embedded simulator."
    )
    api_key: SecretStr = SecretStr("sk-hotline-simulated")
    model: str = "hotline-sim"
    api: Literal["chat", "responses"] = Field(
        default="chat", description="Chat Completions or the Responses API."
    )
    # What `LLMClient.stream()` sends when the caller names no tier or effort (tools, tests).
    # Calls never rely on these: each turn's tier and effort come from the controller's plan.
    service_tier: str | None = Field(
        default="priority", description="Requested tier; None: send no service_tier."
    )
    reasoning_effort: str | None = Field(
        default="low", description="Reasoning effort; None: send no reasoning field."
    )
    max_output_tokens: int = Field(
        default=160, gt=0, description="Cap on generated tokens, reasoning tokens included."
    )
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    tiers: list[LLMTier] = Field(
        default_factory=default_tiers,
        min_length=1,
        description="Tiers in fallback order; a turn that fails on one falls back to the next.",
    )
    first_token_grace_ms: float = Field(
        default=750.0,
        ge=0,
        description="A request with no first token this long after the plan's first-token "
        "deadline counts as failed: the turn falls back to the next tier.",
    )
    connect_timeout_s: float = Field(default=3.0, gt=0, description="TCP/TLS connect timeout.")
    timeout_s: float = Field(
        default=30.0, gt=0, description="Longest wait for the provider's next bytes."
    )
    max_retries: int = Field(
        default=0, ge=0, description="SDK retries with backoff; 0 leaves fallback to the caller."
    )


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: Literal["system", "user", "assistant"]
    content: str


EFFORT_PARAMS = ("reasoning_effort", "reasoning.effort")


class LLMError(Exception):
    """The provider failed: HTTP status (None for connection errors and timeouts) and why.

    ``retry_after_s``: how long the provider asked us to wait (its ``Retry-After`` header, in
    seconds or as an HTTP date, or ``retry-after-ms``); ``param``: the request field its error
    body names.
    """

    def __init__(
        self,
        status: int | None,
        message: str,
        *,
        retry_after_s: float | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(f"HTTP {status}: {message}" if status is not None else message)
        self.status = status
        self.message = message
        self.retry_after_s = retry_after_s
        self.param = param

    @property
    def effort_unsupported(self) -> bool:
        """A 400 refusing the reasoning effort (the model does not take it), not the request."""
        if self.status != 400:
            return False
        text = self.message.lower()
        return (
            self.param in EFFORT_PARAMS
            or any(p in text for p in EFFORT_PARAMS)
            or "reasoning effort" in text
        )


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
        self.requested_tier = service_tier
        self.effort = effort
        self.max_output_tokens = max_output_tokens
        self.requested_at = time.monotonic()  # reset when the request is actually sent
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.deltas = 0  # visible deltas received
        self.prompt_tokens: int | None = None  # as the provider counted them
        self.service_tier: str | None = None  # as echoed by the provider
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
                raise _status_error(exc) from exc
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
        return await self._client.chat.completions.create(
            model=self.model,
            messages=messages,
            stream=True,
            stream_options={"include_usage": True},
            max_completion_tokens=self.max_output_tokens,
            service_tier=omit if self.requested_tier is None else cast(Any, self.requested_tier),
            reasoning_effort=omit if self.effort is None else cast(Any, self.effort),
        )

    async def _open_responses(self) -> AsyncStream[ResponseStreamEvent]:
        items: ResponseInputParam = [{"role": m.role, "content": m.content} for m in self._history]
        return await self._client.responses.create(
            model=self.model,
            input=items,
            instructions=self._system_prompt or omit,
            stream=True,
            store=False,
            max_output_tokens=self.max_output_tokens,
            service_tier=omit if self.requested_tier is None else cast(Any, self.requested_tier),
            reasoning=omit if self.effort is None else {"effort": cast(Any, self.effort)},
        )

    def _read_chunk(self, chunk: ChatCompletionChunk) -> str:
        """Record what the chunk says; return its visible text (reasoning fields are skipped)."""
        if chunk.service_tier:
            self.service_tier = chunk.service_tier
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
            self.service_tier = response.service_tier
        if response.usage is not None:
            self.output_tokens = response.usage.output_tokens
            self.prompt_tokens = response.usage.input_tokens
            self.reasoning_tokens = response.usage.output_tokens_details.reasoning_tokens


def _status_error(exc: openai.APIStatusError) -> LLMError:
    body = exc.body
    message = exc.message
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        message = str(body["message"])
    retry_after = retry_after_s(exc.response.headers)
    return LLMError(exc.status_code, message, retry_after_s=retry_after, param=exc.param)


def retry_after_s(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds the provider asks us to wait: ``retry-after-ms``, else ``Retry-After`` (seconds
    or an HTTP date; ``now`` is the wall-clock time it is measured from). None: no usable one."""
    if (ms := _seconds(headers.get("retry-after-ms"))) is not None:
        return ms / 1000.0
    value = headers.get("retry-after")
    if value is None:
        return None
    if (seconds := _seconds(value)) is not None:
        return seconds
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # an HTTP date is GMT
        when = when.replace(tzinfo=datetime.UTC)
    return max(when.timestamp() - (time.time() if now is None else now), 0.0)


def _seconds(value: str | None) -> float | None:
    try:
        seconds = float(value) if value is not None else math.nan
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def estimate_prompt_tokens(history: Sequence[ChatMessage], system_prompt: str = "") -> int:
    """Roughly how many tokens a prompt is (4 characters a token, 4 per message), for planning."""
    texts = [system_prompt, *(m.content for m in history)]
    return sum(len(t) // 4 + 4 for t in texts if t) + 3

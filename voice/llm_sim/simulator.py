"""OpenAI-compatible tier simulator: Hotline's embedded default LLM.

No model runs here. Each request is answered with ``You said: <the caller's words>.``, a
scripted answer and, by default, sentences as a real model's spoken replies run on (40-60 words
in 2-4 sentences: `SimulatorSettings.replies`; "short" stops after the answer). With tools it
answers with tool calls or what their results came to (`voice.llm_sim.tools`). Replies are
paced like a real provider: the profile chosen by ``service_tier`` sets
the time to first token and the output speed; the reasoning effort adds hidden reasoning tokens,
"generated" at that speed before the first visible token. Streams are what the ``openai`` SDK
parses: Chat Completions chunks ending in ``[DONE]``, and the Responses event sequence.

The app reads its settings on every request, so a test may change them while it runs
(for instance ``settings.profiles["fast"].fail_status = 503``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from voice.llm_sim.replies import heard_words, reply_words
from voice.llm_sim.requests import (
    BadRequest,
    json_body,
    optional_field,
    parse_messages,
    parse_tools,
    required_field,
)
from voice.llm_sim.requests import SimulatedRequest as SimulatedRequest  # re-exported
from voice.llm_sim.settings import (
    DEFAULT_ANSWERS as DEFAULT_ANSWERS,
)
from voice.llm_sim.settings import (
    STARTUP_NOTICE as STARTUP_NOTICE,
)
from voice.llm_sim.settings import (
    SimulatorSettings as SimulatorSettings,
)
from voice.llm_sim.settings import (
    TierProfile as TierProfile,
)
from voice.llm_sim.tools import ToolOutput, tool_outputs, tool_reply
from voice.llm_sim.wire import (
    FinishReason,
    Plan,
    chat_completion,
    chat_events,
    error_body,
    fit_calls,
    response_events,
    response_object,
    status_error,
)

log = logging.getLogger(__name__)


@dataclass
class SimulatorStats:
    """Counters kept by a simulator app (see `simulator_stats`)."""

    requests: int = 0
    errors_injected: int = 0
    streams_started: int = 0
    streams_completed: int = 0
    streams_cancelled: int = 0
    last_request: SimulatedRequest | None = None
    _changed: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_until(
        self, predicate: Callable[[SimulatorStats], bool], timeout_s: float = 5.0
    ) -> None:
        """Wait until ``predicate(stats)`` holds; TimeoutError after ``timeout_s``."""
        async with asyncio.timeout(timeout_s):
            while not predicate(self):
                await self._changed.wait()


# ---------------------------------------------------------------- the app


class _Simulator:
    """Per-app state: settings (read live), stats, random source, failure counts."""

    def __init__(self, settings: SimulatorSettings) -> None:
        self.settings = settings
        self.stats = SimulatorStats()
        self.rng = random.Random(settings.seed)
        self.failures: dict[str, int] = {}
        self.seen: dict[str, int] = {}  # requests per profile

    def profile_for(self, service_tier: str | None) -> str:
        if service_tier is None:
            return self.settings.default_profile
        if service_tier not in self.settings.service_tiers:
            allowed = ", ".join(repr(t) for t in self.settings.service_tiers)
            raise BadRequest(
                f"Invalid value for 'service_tier': {service_tier!r}. Supported values are: "
                f"{allowed}.",
                "service_tier",
                "invalid_value",
            )
        return self.settings.service_tiers[service_tier]

    def plan(
        self,
        request: SimulatedRequest,
        instructions: str | None = None,
        outputs: Sequence[ToolOutput] = (),
    ) -> Plan:
        """Time the reply; ``outputs``: the tool results the input ends with."""
        s = self.settings
        profile = s.profiles[request.profile]
        effort = request.effort or s.default_effort
        if effort not in s.reasoning_tokens:
            param = "reasoning_effort" if request.api == "chat" else "reasoning.effort"
            allowed = ", ".join(repr(e) for e in s.reasoning_tokens)
            raise BadRequest(
                f"Invalid value for '{param}': {effort!r}. Supported values are: {allowed}.",
                param,
                "invalid_value",
            )
        if request.max_tokens is not None and request.max_tokens < 1:
            param = "max_completion_tokens" if request.api == "chat" else "max_output_tokens"
            raise BadRequest(f"Invalid '{param}': integer below minimum value 1.", param)
        heard = heard_words(request.messages)
        replied = tool_reply(heard, request.tools, outputs, request.parallel_tool_calls)
        words = reply_words(heard, s) if replied is None else replied.text.split()
        cap = request.max_tokens if request.max_tokens is not None else 1 << 30
        reasoning = min(s.reasoning_tokens[effort], cap)
        visible = min(len(words), cap - reasoning)
        calls, cut = fit_calls(replied.calls if replied else [], cap - reasoning - visible)
        finish: FinishReason = "stop"
        if visible < len(words) or cut:
            finish = "length"
        elif calls:
            finish = "tool_calls"
        prompt_tokens = sum(len(text.split()) + 4 for _, text in request.messages) + 3
        ttft_ms = profile.ttft_ms + self.rng.uniform(-profile.jitter_ms, profile.jitter_ms)
        if profile.prefill_tokens_per_s:
            ttft_ms += 1000.0 * prompt_tokens / profile.prefill_tokens_per_s
        self.stats.requests += 1
        self.stats.last_request = request
        self.stats.notify()
        return Plan(
            request=request,
            instructions=instructions,
            reported_tier=profile.reported_as,
            effort=effort,
            reasoning_tokens=reasoning,
            deltas=[w if i == 0 else " " + w for i, w in enumerate(words[:visible])],
            finish_reason=finish,
            prompt_tokens=prompt_tokens,
            start=asyncio.get_running_loop().time(),
            ttft_s=max(ttft_ms, 0.0) / 1000.0,
            token_s=1.0 / profile.tokens_per_s,
            calls=calls,
        )

    def injected_failure(self, profile_name: str) -> Response | None:
        profile = self.settings.profiles[profile_name]
        used = self.failures.get(profile_name, 0)
        self.seen[profile_name] = seen = self.seen.get(profile_name, 0) + 1
        if (
            profile.fail_status is None
            or seen <= profile.fail_after
            or (profile.fail_times is not None and used >= profile.fail_times)
        ):
            return None
        if self.rng.random() >= profile.fail_probability:
            return None
        self.failures[profile_name] = used + 1
        self.stats.errors_injected += 1
        self.stats.notify()
        body = status_error(profile.fail_status, profile_name)
        return JSONResponse(body, profile.fail_status, headers={"x-request-id": "req_simfail"})

    async def reply(self, plan: Plan, stream: bool, events: list[tuple[float, bytes]]) -> Response:
        headers = {"x-request-id": f"req_{plan.ident}"}
        if (failure := self.injected_failure(plan.request.profile)) is not None:
            return failure
        if not stream:
            await _sleep_until(plan.end_at())
            body = (
                chat_completion(plan)
                if plan.request.api == "chat"
                else response_object(plan, final=True)
            )
            return JSONResponse(body, headers=headers)
        return StreamingResponse(
            self._tracked(_paced(events)),
            media_type="text/event-stream; charset=utf-8",
            headers={**headers, "cache-control": "no-cache"},
        )

    async def _tracked(self, events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """Count the stream as completed or cancelled (client gone: Starlette cancels us)."""
        stats, completed = self.stats, False
        stats.streams_started += 1
        stats.notify()
        try:
            async for chunk in events:
                yield chunk
            completed = True
        finally:
            if completed:
                stats.streams_completed += 1
            else:
                stats.streams_cancelled += 1
                log.debug("simulated stream stopped: the client went away")
            stats.notify()


async def _sleep_until(deadline: float) -> None:
    delay = deadline - asyncio.get_running_loop().time()
    if delay > 0:
        await asyncio.sleep(delay)


async def _paced(events: list[tuple[float, bytes]]) -> AsyncIterator[bytes]:
    """Send each event at its absolute due time, batching those already due."""
    loop, i = asyncio.get_running_loop(), 0
    while i < len(events):
        await _sleep_until(events[i][0])
        now, batch = loop.time(), bytearray()
        while i < len(events) and events[i][0] <= now:
            batch += events[i][1]
            i += 1
        yield bytes(batch)


async def _chat(request: Request) -> Response:
    sim: _Simulator = request.app.state.simulator
    body = await json_body(request)
    model = required_field(body, "model")
    given = required_field(body, "messages")
    messages = parse_messages(given, "messages")
    tools, outputs = parse_tools(body.get("tools"), "chat"), tool_outputs(given, "chat")
    parallel = optional_field(body, "parallel_tool_calls", bool) is not False
    cap = optional_field(body, "max_completion_tokens", int)
    cap = optional_field(body, "max_tokens", int) if cap is None else cap
    tier = optional_field(body, "service_tier", str)
    stream = bool(optional_field(body, "stream", bool))
    include_usage = bool((optional_field(body, "stream_options", dict) or {}).get("include_usage"))
    effort = optional_field(body, "reasoning_effort", str)
    profile = sim.profile_for(tier)
    req = SimulatedRequest(
        "chat", str(model), messages, tier, effort, cap, stream, profile, tools, parallel
    )
    plan = sim.plan(req, outputs=outputs)
    events = chat_events(plan, include_usage, sim.settings.stream_reasoning_as) if stream else []
    return await sim.reply(plan, stream, events)


async def _responses(request: Request) -> Response:
    sim: _Simulator = request.app.state.simulator
    body = await json_body(request)
    model = required_field(body, "model")
    given = required_field(body, "input")
    messages = [("user", given)] if isinstance(given, str) else parse_messages(given, "input")
    tools, outputs = parse_tools(body.get("tools"), "responses"), tool_outputs(given, "responses")
    parallel = optional_field(body, "parallel_tool_calls", bool) is not False
    instructions = optional_field(body, "instructions", str)
    if instructions:
        messages.insert(0, ("system", instructions))
    cap = optional_field(body, "max_output_tokens", int)
    tier = optional_field(body, "service_tier", str)
    stream = bool(optional_field(body, "stream", bool))
    effort = optional_field(
        optional_field(body, "reasoning", dict) or {}, "effort", str, "reasoning.effort"
    )
    profile = sim.profile_for(tier)
    req = SimulatedRequest(
        "responses", str(model), messages, tier, effort, cap, stream, profile, tools, parallel
    )
    plan = sim.plan(req, instructions, outputs)
    return await sim.reply(plan, stream, response_events(plan) if stream else [])


async def _models(request: Request) -> Response:
    sim: _Simulator = request.app.state.simulator
    model = {"id": sim.settings.model, "object": "model", "created": 0, "owned_by": "hotline"}
    return JSONResponse({"object": "list", "data": [model]})


async def _bad_request(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, BadRequest)
    return JSONResponse(error_body(exc.message, "invalid_request_error", exc.param, exc.code), 400)


@contextlib.asynccontextmanager
async def _lifespan(app: Starlette) -> AsyncIterator[None]:
    log.warning(STARTUP_NOTICE)
    yield


def create_simulator_app(settings: SimulatorSettings | None = None) -> Starlette:
    """The simulator as an ASGI app. Its counters: `simulator_stats(app)`."""
    routes = [
        Route("/v1/chat/completions", _chat, methods=["POST"]),
        Route("/v1/responses", _responses, methods=["POST"]),
        Route("/v1/models", _models, methods=["GET"]),
    ]
    handlers: dict[Any, Callable[[Request, Exception], Awaitable[Response]]] = {
        BadRequest: _bad_request
    }
    app = Starlette(routes=routes, exception_handlers=handlers, lifespan=_lifespan)
    app.state.simulator = _Simulator(settings or SimulatorSettings())
    return app


def simulator_stats(app: Starlette) -> SimulatorStats:
    sim: _Simulator = app.state.simulator
    return sim.stats


def change_tier(app: Starlette, name: str, **changes: Any) -> TierProfile:
    """Change a tier profile of a running simulator from its next request on (a slowdown, a
    burst of 429s: ``fail_status=429, fail_times=5``); its failure counters start again."""
    sim: _Simulator = app.state.simulator
    profile = sim.settings.profiles[name]
    changed = TierProfile.model_validate({**profile.model_dump(), **changes})
    sim.settings.profiles[name] = changed
    sim.failures.pop(name, None)
    sim.seen.pop(name, None)
    return changed


def simulator_settings(app: Starlette) -> SimulatorSettings:
    """The live settings of a simulator app (changes apply to the next request)."""
    sim: _Simulator = app.state.simulator
    return sim.settings

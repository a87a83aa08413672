"""Each turn's LLM request: planned by the controller, with fallback and hedging across tiers.

```
TierRouter (one a process: a client per tier, one shared Controller)
  .for_call(policy, experiment, arm, instructions=, tools=) -> CallRouter (one a call)
    .reply(history, zero) -> RoutedReply (one a turn): plan -> request -> deltas, tool_calls
```

A call's ``instructions`` (its agent's system prompt; None: the settings' ``system_prompt``) and
``tools`` go with every request of every turn. A request that calls a tool has answered at the
first fragment of the call, even without text: it wins the turn like one that spoke.

A `RoutedReply` plans the turn when it is made (the time already spent since the end of the
caller's speech counts against the budget), then on iteration sends the request and yields the
visible text. Each request is read by its own task into a queue, so the time of every token
is taken as it arrives, whatever the consumer (TTS) is doing. Before the first token:

- a capacity or availability failure (HTTP 408/409/429/5xx, a connection error or timeout, or
  no first token ``first_token_grace_ms`` after the plan's first-token deadline) is reported to
  the controller, with the provider's ``Retry-After`` if it sent one, and the controller rests
  that tier (at least that long); the turn is planned again on the tiers not yet tried and
  sent again, within the same turn.
- a 400 refusing the reasoning effort (its error names ``reasoning_effort`` or
  ``reasoning.effort``, as param or in the message: the model does not take that effort) is
  reported too, and the controller never plans that (tier, effort) again in this process; the
  turn is planned again at once, the same tier included (with the efforts it still offers).
  The attempt is recorded as ``refused``.
- other errors (any other 400, 401, ...) are not retried: they reach the caller.
- with a hedge in the plan, the hedge request is fired at the first-token deadline; whichever
  speaks first is kept, the other is cancelled and reported as censored (it waited this long).

After the turn, ``finish(timings)`` gives the controller what the request that spoke took and
returns the turn's `Decision` (`pipeline.llm.decision`) for the turn record. Each request is an
`Attempt` (`pipeline.llm.attempt`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Literal

from pydantic import BaseModel, Field, model_validator

from pipeline.llm.attempt import Attempt
from pipeline.llm.client import ChatMessage, LLMClient, LLMStream, estimate_prompt_tokens
from pipeline.llm.controller import Controller, TurnContext, TurnPlan
from pipeline.llm.decision import AttemptKind, AttemptResult, Decision
from pipeline.llm.errors import LLMError
from pipeline.llm.estimates import TurnOutcome
from pipeline.llm.settings import LLMSettings
from pipeline.llm.tiers import LLMTier
from pipeline.tools import ToolCall, ToolSpec

log = logging.getLogger(__name__)


def retryable(status: int | None) -> bool:
    """A failure another tier may not have: capacity, availability, or no answer at all."""
    return status is None or status in (408, 409, 429) or status >= 500


class Policy(BaseModel):
    """How a call's turns choose tier and effort: adaptive within a budget, or fixed."""

    policy: Literal["adaptive", "fixed"] = "adaptive"
    budget_ms: float | None = Field(
        default=None, gt=0, description="Voice-to-voice budget; None: the controller's default."
    )
    effort: str | None = Field(default=None, description="Fixed arms: the effort every turn.")
    tier: str | None = Field(default=None, description="Fixed arms: the tier (None: the first).")

    @model_validator(mode="after")
    def _fixed_has_effort(self) -> Policy:
        if self.policy == "fixed" and self.effort is None:
            raise ValueError("a fixed policy needs an effort")
        return self


class TierRouter:
    """The process's tiers, their clients and the controller they all teach."""

    def __init__(
        self, settings: LLMSettings, controller: Controller, base_url: str | None = None
    ) -> None:
        self.settings = settings
        self.controller = controller
        self.tiers: list[LLMTier] = list(settings.tiers)
        self.clients: dict[str, LLMClient] = {}
        for tier in self.tiers:
            override = {
                "model": tier.model or settings.model,
                "api": tier.api or settings.api,
                "api_key": tier.api_key or settings.api_key,
            }
            url = tier.base_url or base_url or settings.base_url
            self.clients[tier.name] = LLMClient(settings.model_copy(update=override), url)

    def for_call(
        self,
        policy: Policy,
        experiment: str | None = None,
        arm: str | None = None,
        *,
        instructions: str | None = None,
        tools: Sequence[ToolSpec] = (),
    ) -> CallRouter:
        return CallRouter(self, policy, experiment, arm, instructions=instructions, tools=tools)

    async def aclose(self) -> None:
        for client in self.clients.values():
            await client.aclose()


class CallRouter:
    """The router bound to one call's policy (its experiment arm), instructions and tools."""

    def __init__(
        self,
        router: TierRouter,
        policy: Policy,
        experiment: str | None,
        arm: str | None,
        *,
        instructions: str | None = None,
        tools: Sequence[ToolSpec] = (),
    ) -> None:
        self.router = router
        self.policy = policy
        self.experiment = experiment
        self.arm = arm
        self.instructions = instructions
        self.tools = tuple(tools)

    @property
    def system_prompt(self) -> str:
        """What each request is told first: the call's instructions, else the settings'."""
        if self.instructions is not None:
            return self.instructions
        return self.router.settings.system_prompt

    def context(
        self, spent_ms: float, prompt_tokens: int, tiers: Sequence[LLMTier] | None = None
    ) -> TurnContext:
        fixed = self.policy.policy == "fixed"
        return TurnContext(
            spent_ms=spent_ms,
            prompt_tokens=prompt_tokens,
            tiers_available=list(tiers if tiers is not None else self.router.tiers),
            budget_ms=self.policy.budget_ms,
            fixed_effort=self.policy.effort if fixed else None,
            fixed_tier=self.policy.tier if fixed else None,
        )

    def reply(self, history: Sequence[ChatMessage], zero: float) -> RoutedReply:
        """Plan the reply to ``history`` now; ``zero`` is the monotonic end of caller speech."""
        return RoutedReply(self, history, zero)


class RoutedReply:
    """One turn's reply: visible text deltas from whichever request speaks first."""

    def __init__(self, call: CallRouter, history: Sequence[ChatMessage], zero: float) -> None:
        self.call = call
        self.router = call.router
        self.history = list(history)
        self.zero = zero
        self.prompt_tokens = estimate_prompt_tokens(history, call.system_prompt, call.tools)
        self.plan = self.router.controller.plan(call.context(self._spent_ms(), self.prompt_tokens))
        self.filler = self.plan.filler
        self.attempts: list[Attempt] = []
        self.winner: Attempt | None = None
        self._finished = False
        self._deltas = self._run()

    # what the conversation reads, from the request that spoke (or the last one tried)
    @property
    def _current(self) -> LLMStream | None:
        attempt = self.winner or (self.attempts[-1] if self.attempts else None)
        return attempt.stream if attempt else None

    @property
    def service_tier_requested(self) -> str | None:
        return self.winner.plan.service_tier if self.winner else self.plan.service_tier

    @property
    def effort(self) -> str | None:
        return self.winner.plan.effort if self.winner else self.plan.effort

    @property
    def requested_at(self) -> float:
        return self._current.requested_at if self._current else self.zero

    @property
    def first_token_at(self) -> float | None:
        return self.winner.stream.first_token_at if self.winner else None

    @property
    def service_tier_served(self) -> str | None:
        return self.winner.stream.service_tier_served if self.winner else None

    @property
    def reasoning_tokens(self) -> int | None:
        return self.winner.stream.reasoning_tokens if self.winner else None

    @property
    def output_tokens(self) -> int | None:
        return self.winner.stream.output_tokens if self.winner else None

    @property
    def tool_calls(self) -> list[ToolCall]:
        """The tools the winning request calls (complete once its stream has ended)."""
        return self.winner.stream.tool_calls if self.winner else []

    def _spent_ms(self) -> float:
        return (time.monotonic() - self.zero) * 1e3

    def __aiter__(self) -> AsyncGenerator[str, None]:
        return self._deltas

    async def aclose(self) -> None:
        await self._deltas.aclose()
        await self._stop_all()

    def _start(self, plan: TurnPlan, kind: AttemptKind) -> Attempt:
        client = self.router.clients[plan.tier]
        stream = client.stream(
            self.history,
            service_tier=plan.service_tier,
            effort=plan.effort,
            max_output_tokens=plan.max_output_tokens,
            tools=self.call.tools,
            instructions=self.call.instructions,
        )
        attempt = Attempt(plan, stream, kind)
        attempt.task = asyncio.create_task(attempt.pump(), name=f"llm-{plan.tier}-{plan.effort}")
        self.attempts.append(attempt)
        return attempt

    async def _run(self) -> AsyncGenerator[str, None]:
        try:
            winner = await self._first_token()
            self.winner = winner
            while (item := await winner.queue.get()) is not None:
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            await self._stop_all()

    async def _first_token(self) -> Attempt:
        """Send the plan; fall back and hedge until a request speaks (or every tier failed)."""
        grace = self.router.settings.first_token_grace_ms
        plan, tried = self.plan, set[str]()
        kind: AttemptKind = "planned"
        while True:
            active = [self._start(plan, kind)]
            hedge = plan.hedge
            hedge_at = self.zero + plan.first_token_deadline_ms / 1e3 if hedge else None
            give_up_at = self.zero + (plan.first_token_deadline_ms + grace) / 1e3
            while active:
                for attempt in [a for a in active if a.settled.is_set()]:
                    if attempt.error is None:
                        return self._won(attempt, active)
                    active.remove(attempt)
                    refused = attempt.error.effort_unsupported
                    self._failed(attempt, "refused" if refused else "failed")
                    if not refused and not retryable(attempt.error.status):
                        raise attempt.error
                if not active:
                    break
                now = time.monotonic()
                # The hedge first: a loop that woke late (a busy event loop) may be past both
                # the hedge's time and the plan's give-up time, and the hedge is still owed.
                if hedge is not None and hedge_at is not None and now >= hedge_at:
                    log.info("no first token by %.0f ms: hedging", plan.first_token_deadline_ms)
                    active.append(self._start(hedge, "hedge"))
                    # the hedge is given up on by its own deadline (+ grace), not the plan's
                    hedge_give_up_at = self.zero + (hedge.first_token_deadline_ms + grace) / 1e3
                    give_up_at = max(give_up_at, hedge_give_up_at)
                    hedge = hedge_at = None
                    continue
                if now >= give_up_at:
                    for attempt in active:
                        self._failed(attempt, "timeout")
                    break
                wake = min(t for t in (give_up_at, hedge_at) if t is not None)
                waits = [asyncio.ensure_future(a.settled.wait()) for a in active]
                try:
                    await asyncio.wait(waits, timeout=wake - now, return_when="FIRST_COMPLETED")
                finally:
                    for w in waits:
                        w.cancel()
            # a tier that failed is not asked again this turn; one that refused an effort is
            tried |= {a.plan.tier for a in self.attempts if a.result != "refused"}
            plan, kind = self._replan(tried), "fallback"

    def _replan(self, tried: set[str]) -> TurnPlan:
        """Plan the turn again on the tiers not yet tried that still offer an effort."""
        controller = self.router.controller
        remaining = [
            t for t in self.router.tiers if t.name not in tried and controller.supported_efforts(t)
        ]
        last = self.attempts[-1]
        if not remaining:
            status = last.error.status if last.error else None
            asked = sorted({a.plan.tier for a in self.attempts} | tried)
            raise LLMError(status, f"every tier failed ({', '.join(asked)})")
        plan = controller.plan(self.call.context(self._spent_ms(), self.prompt_tokens, remaining))
        log.warning(
            "LLM %s/%s %s (%s); falling back to %s/%s",
            last.plan.tier,
            last.plan.effort,
            last.result,
            last.error or "no first token",
            plan.tier,
            plan.effort,
        )
        return plan

    def _won(self, winner: Attempt, others: list[Attempt]) -> Attempt:
        winner.result = "spoke"
        for attempt in others:
            if attempt is not winner and attempt.task is not None:
                attempt.result = "lost"
                attempt.task.cancel()
                waited = (time.monotonic() - attempt.started_at) * 1e3
                outcome = TurnOutcome(
                    attempt.plan.tier,
                    attempt.plan.effort,
                    waited_ms=waited,
                    prompt_tokens=self.prompt_tokens,
                )
                self.router.controller.observe(outcome)
        return winner

    def _failed(self, attempt: Attempt, result: AttemptResult) -> None:
        attempt.result = result
        if attempt.task is not None:
            attempt.task.cancel()
        error = attempt.error
        status = error.status if error else None
        log.warning(
            "LLM tier %s (%s) %s: %s",
            attempt.plan.tier,
            attempt.plan.effort,
            result,
            error or "no first token by the deadline",
        )
        outcome = TurnOutcome(
            attempt.plan.tier,
            attempt.plan.effort,
            failed=True,
            status=status,
            retry_after_s=error.retry_after_s if error else None,
            effort_unsupported=result == "refused",
        )
        # capacity or availability rests the tier, a refused effort is never planned again;
        # any other 400 is the request's fault, not the tier's
        if retryable(status) or outcome.effort_unsupported:
            self.router.controller.observe(outcome)

    async def _stop_all(self) -> None:
        for attempt in self.attempts:
            if attempt.task is not None and not attempt.task.done():
                attempt.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await attempt.task
            await attempt.stream.aclose()

    def finish(self, timings_ms: Mapping[str, float]) -> Decision | None:
        """Teach the controller what the turn took; the decision for the turn record."""
        if self._finished:
            return None
        self._finished = True
        winner = self.winner
        if winner is None:
            for attempt in self.attempts:  # cut off (barge-in) before any token came
                if attempt.result == "pending":
                    attempt.result = "lost"
                    waited = (time.monotonic() - attempt.started_at) * 1e3
                    outcome = TurnOutcome(
                        attempt.plan.tier,
                        attempt.plan.effort,
                        waited_ms=waited,
                        prompt_tokens=self.prompt_tokens,  # its prefill is no latency
                    )
                    self.router.controller.observe(outcome)
            # "failed": no request could answer; "none": the caller cut in before any did
            gave_up = bool(self.attempts) and all(
                a.result in ("failed", "timeout", "refused") for a in self.attempts
            )
            tried = [a.summary() for a in self.attempts]
            return Decision.of(self.plan, None, "failed" if gave_up else "none", tried)
        outcome = self._outcome(winner, timings_ms)
        self.router.controller.observe(outcome)
        tried = [a.summary() for a in self.attempts]
        return Decision.of(self.plan, outcome, winner.kind, tried)

    def _outcome(self, attempt: Attempt, timings_ms: Mapping[str, float]) -> TurnOutcome:
        s = attempt.stream
        ttft = None
        # the tier's time to first token: visible text or a tool call, whichever came first
        first = min(
            (t for t in (s.first_token_at, s.first_tool_call_at) if t is not None), default=None
        )
        if first is not None:
            ttft = (first - s.requested_at) * 1e3
        visible = s.deltas
        if s.output_tokens is not None and s.reasoning_tokens is not None:
            visible = max(s.output_tokens - s.reasoning_tokens, 0)
        speed = None
        if s.first_token_at is not None and s.last_token_at is not None and s.finished:
            span = s.last_token_at - s.first_token_at
            if visible >= 5 and span > 0.005:
                speed = (visible - 1) / span
        tts = None
        if "first_audio" in timings_ms and "first_sentence" in timings_ms:
            tts = timings_ms["first_audio"] - timings_ms["first_sentence"]
            # A speculative reply's first chunk may have waited, ready, for the turn to end:
            # that wait is not synthesis time.
            ready = timings_ms.get("tts_first_chunk")
            if ready is not None and timings_ms.get("endpoint", 0.0) > ready:
                tts -= timings_ms["endpoint"] - ready
        return TurnOutcome(
            tier=attempt.plan.tier,
            effort=attempt.plan.effort,
            ttft_ms=ttft,
            reasoning_tokens=s.reasoning_tokens,
            output_tokens=s.output_tokens,
            decode_tokens_per_s=speed,
            tts_first_chunk_ms=tts,
            first_audio_ms=timings_ms.get("first_audio"),
            prompt_tokens=self.prompt_tokens,
        )

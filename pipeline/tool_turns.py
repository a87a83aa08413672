"""Tool calls inside one turn: each round runs the calls a reply asked for, all at once, and
keeps what they returned, so that the turn can go on with their results and the history says
exactly what happened.

```
reply text ... tool_calls --> ToolRound: every call at once (Toolbox.run)
                                 |  longer than hold_after_ms: the holding phrase is said
                                 v
                           results --> the next request of the same turn --> reply text
```

A round cut short (the caller spoke over the reply) cancels the calls still running; each of
them is kept with an error result saying so, because a provider refuses a history in which a
tool call has no result, and because the model should know the call may not have happened.
What a built-in tool asks of the call itself (`pipeline.tools.CallAction`: put the caller
through, hang up, press keys) waits until the reply has been heard; an action the caller
interrupted is not carried out, and its result says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel, Field

from pipeline.llm.client import ChatMessage
from pipeline.speculation import Discarded
from pipeline.tools import CallAction, Toolbox, ToolCall, ToolContext, ToolResult
from pipeline.transport import PlaybackCleared, Transport

INTERRUPTED = "cancelled: the caller spoke before it finished"
NOT_DONE = "not done: the caller spoke before it could be carried out"
_OUTPUT_KEPT = 500  # characters of a tool's output kept in the turn record


class ToolSettings(BaseModel):
    """How a call uses its tools."""

    holding_phrase: str = Field(
        default="One moment, please.",
        description='Said while tools run longer than hold_after_ms ("": nothing is said).',
    )
    hold_after_ms: int = Field(default=400, ge=0, description="0: say it at once.")
    max_rounds: int = Field(
        default=4, ge=1, description="Tool rounds in one turn; the model is then asked to answer."
    )


@dataclass
class ToolRound:
    """The tool calls of one response, and what became of each."""

    text: str  # the visible text the response spoke before asking for the tools
    calls: tuple[ToolCall, ...]
    spoken_before: int  # sentences of the reply spoken before this round's calls
    results: dict[str, ToolResult] = field(default_factory=dict)  # by call id
    started_at: float = 0.0
    ended_at: float | None = None
    _tasks: dict[str, asyncio.Task[ToolResult]] = field(default_factory=dict)

    async def run(self, toolbox: Toolbox, context: ToolContext) -> list[ToolResult]:
        """Run every call at once; their results in call order. Cancelled: the calls still
        running are cancelled and kept with an error result."""
        self.started_at = time.monotonic()
        for call in self.calls:
            self._tasks[call.id] = asyncio.create_task(toolbox.run(call, context))
        try:
            outcomes = await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        except asyncio.CancelledError:
            self._settle_cancelled()
            raise
        finally:
            self.ended_at = time.monotonic()
        for call, outcome in zip(self.calls, outcomes, strict=True):
            if isinstance(outcome, BaseException):  # a toolbox should not raise; if it does
                message = f"the tool failed: {type(outcome).__name__}"
                outcome = ToolResult.error(call, message, self.started_at, self.ended_at)
            self.results[call.id] = outcome
        return [self.results[call.id] for call in self.calls]

    def _settle_cancelled(self) -> None:
        now = time.monotonic()
        for call in self.calls:
            task = self._tasks[call.id]
            if task.done() and not task.cancelled() and task.exception() is None:
                self.results[call.id] = task.result()
                continue
            task.cancel()
            self.results[call.id] = ToolResult.error(call, INTERRUPTED, self.started_at, now)

    async def cancel(self) -> None:
        """Stop the calls still running (a round whose turn was cancelled elsewhere)."""
        for task in self._tasks.values():
            task.cancel()
        for task in self._tasks.values():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    @property
    def ms(self) -> float:
        end = self.ended_at if self.ended_at is not None else time.monotonic()
        return round((end - self.started_at) * 1e3, 1) if self.started_at else 0.0

    def actions(self) -> list[CallAction]:
        return [r.action for r in self.results.values() if r.action is not None]

    def mark_not_done(self) -> None:
        """The reply before this round's actions was cut off: none of them happens."""
        for call_id, result in list(self.results.items()):
            if result.action is not None:
                self.results[call_id] = ToolResult(
                    result.call,
                    json.dumps({"error": NOT_DONE}),
                    ok=False,
                    started_at=result.started_at,
                    ended_at=result.ended_at,
                )

    def messages(self, heard: str) -> list[ChatMessage]:
        """The history of this round: the assistant's request for the tools (with what the
        caller heard of the text before it), then one result per call."""
        out = [ChatMessage(role="assistant", content=heard, tool_calls=self.calls)]
        for call in self.calls:
            result = self.results.get(call.id)
            output = result.output if result is not None else json.dumps({"error": INTERRUPTED})
            out.append(ChatMessage(role="tool", content=output, tool_call_id=call.id))
        return out

    def summary(self) -> list[dict[str, object]]:
        """Each call for the turn record: name, arguments, outcome, time, output (cut)."""
        rows: list[dict[str, object]] = []
        for call in self.calls:
            result = self.results.get(call.id)
            action = result.action if result is not None else None
            rows.append(
                {
                    "name": call.name,
                    "arguments": call.arguments,
                    "ok": result.ok if result is not None else False,
                    "ms": result.ms if result is not None else None,
                    "output": (result.output[:_OUTPUT_KEPT] if result is not None else ""),
                    "action": type(action).__name__ if action is not None else None,
                }
            )
        return rows


class ToolRunner:
    """Runs a call's tool rounds: announces each call and result (`emit`), and says the
    holding phrase while they run longer than `hold_after_ms`, once whatever the reply said
    before them has played."""

    def __init__(
        self,
        toolbox: Toolbox | None,
        settings: ToolSettings,
        transport: Transport,
        emit: Callable[[dict[str, object]], None],
    ) -> None:
        self.toolbox = toolbox
        self.settings = settings
        self.transport = transport
        self.emit = emit

    async def run(
        self,
        tool_round: ToolRound,
        turn: int,
        context: ToolContext,
        speak: Callable[[str], Awaitable[None]],
    ) -> None:
        assert self.toolbox is not None
        for call in tool_round.calls:
            event = {"type": "tool_call", "turn": turn, "name": call.name}
            self.emit({**event, "arguments": call.arguments})
        holding = asyncio.create_task(self._hold(speak))
        try:
            results = await tool_round.run(self.toolbox, context)
        finally:
            holding.cancel()
            with contextlib.suppress(asyncio.CancelledError, PlaybackCleared, Discarded):
                await holding
        for result in results:
            name, ok, ms = result.call.name, result.ok, result.ms
            event = {"type": "tool_result", "turn": turn, "name": name, "ok": ok, "ms": ms}
            self.emit({**event, "output": result.output[:_OUTPUT_KEPT]})

    async def _hold(self, speak: Callable[[str], Awaitable[None]]) -> None:
        if not self.settings.holding_phrase:
            return
        await asyncio.sleep(self.settings.hold_after_ms / 1e3)
        await self.transport.wait_played(self.transport.queued_samples)
        await speak(self.settings.holding_phrase)


def rounds_ms(rounds: Sequence[ToolRound]) -> float:
    """Time the turn spent waiting on its tools."""
    return round(sum(r.ms for r in rounds), 1)

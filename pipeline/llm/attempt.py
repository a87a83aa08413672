"""One request of a turn (`Attempt`): its plan, its stream, and the task that reads the stream
into a queue, so the time of every token is taken as it arrives, whatever the consumer is doing.

The router (`pipeline.llm.routing`) starts attempts, waits for the first to speak (visible text
or the first fragment of a tool call), and ends the others; each ends as ``spoke``, ``failed``,
``refused`` (its effort), ``timeout`` or ``lost``, and is listed in the turn's decision
(`summary()`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from pipeline.llm.client import LLMStream
from pipeline.llm.controller import TurnPlan
from pipeline.llm.decision import AttemptKind, AttemptResult, AttemptSummary
from pipeline.llm.errors import LLMError

log = logging.getLogger(__name__)


@dataclass
class Attempt:
    """One request of a turn, read by its own task."""

    plan: TurnPlan
    stream: LLMStream
    kind: AttemptKind
    started_at: float = field(default_factory=time.monotonic)
    queue: asyncio.Queue[str | Exception | None] = field(default_factory=asyncio.Queue)
    # the first delta or tool-call fragment, the end, or an error
    settled: asyncio.Event = field(default_factory=asyncio.Event)
    error: LLMError | None = None
    result: AttemptResult = "pending"
    task: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        # a reply that only calls tools has answered at its first fragment, though it says
        # nothing: it wins the turn, and no hedge or first-token timeout is due
        self.stream.on_tool_call = self.settled.set

    async def pump(self) -> None:
        try:
            async for delta in self.stream:
                self.queue.put_nowait(delta)
                self.settled.set()
            self.queue.put_nowait(None)
        except LLMError as exc:
            self.error = exc
            self.queue.put_nowait(exc)
        except Exception as exc:  # a bug or an unexpected reply: end this request, not the call
            log.exception("LLM request on %s failed unexpectedly", self.plan.tier)
            self.error = LLMError(None, f"{type(exc).__name__}: {exc}")
            self.queue.put_nowait(self.error)
        finally:
            self.settled.set()

    def summary(self) -> AttemptSummary:
        return AttemptSummary(
            tier=self.plan.tier,
            effort=self.plan.effort,
            kind=self.kind,
            result=self.result,
            status=self.error.status if self.error else None,
            error=self.error.message if self.error else None,
        )

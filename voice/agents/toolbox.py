"""One call's toolbox: the agent's tools (built-in and HTTP) behind `pipeline.tools.Toolbox`."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Protocol

from pipeline.tools import ToolCall, ToolContext, ToolResult, ToolSpec

log = logging.getLogger(__name__)


class CallTool(Protocol):
    """What the toolbox runs: `HttpTool` and `BuiltinTool` are ones."""

    @property
    def spec(self) -> ToolSpec: ...

    async def run(self, call: ToolCall, context: ToolContext) -> ToolResult: ...


class CallToolbox:
    """The tools one call offers the model, run by name. Never raises for a tool's failure
    (an unknown name, a tool that broke): the model gets an error result to speak about.
    Cancelling `run` cancels the tool."""

    def __init__(self, tools: Sequence[CallTool]) -> None:
        self._tools: dict[str, CallTool] = {}
        for tool in tools:
            name = tool.spec.name
            if name in self._tools:
                raise ValueError(f"two tools are named {name!r}")
            self._tools[name] = tool
        self._specs = tuple(tool.spec for tool in self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def specs(self) -> Sequence[ToolSpec]:
        return self._specs

    async def run(self, call: ToolCall, context: ToolContext) -> ToolResult:
        started = time.monotonic()
        tool = self._tools.get(call.name)
        if tool is None:
            names = ", ".join(self._tools) or "none"
            log.warning(
                "call %s: the model called an unknown tool %r (tool call %s)",
                context.call_id,
                call.name[:64],
                call.id,
            )
            message = f"no tool named {call.name!r}; the tools are: {names}"
            return ToolResult.error(call, message, started, time.monotonic())
        try:
            return await tool.run(call, context)
        except Exception:  # a bug in a tool: the call goes on; CancelledError is not caught
            log.exception(
                "call %s: tool %s (tool call %s) raised", context.call_id, call.name, call.id
            )
            message = f"the {call.name} tool failed unexpectedly"
            return ToolResult.error(call, message, started, time.monotonic())

"""Tool mocks set on one call through the testing API (`PUT /calls/{id}/mocks`, off unless
`HOTLINE_TESTING__ALLOW_MOCKS=true`): `hotline test --url` fixes what an HTTP tool answers on
its own call of a running server, without editing the server's agent files.

A call's toolbox is a `MockableToolbox` only when the setting is on; then its mocks can be set
once, by the worker that has the call, for HTTP tools of the call's agent (built-in tools are
Hotline's own: never mocked). A mocked tool's answer goes through what a real answer goes
through (`voice.agents.http_tools.model_output`; a status that is not 2xx becomes the same
error for the model), so only the request is left out. The mocks live and die with the call.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipeline.tools import Toolbox, ToolCall, ToolContext, ToolResult, ToolSpec
from voice.agents.http_tools import model_output
from voice.agents.runtime import ReadyAgent

log = logging.getLogger(__name__)

_ERROR_BODY_CHARS = 200  # of a mocked error answer, in the model's error (as for a real one)


class ToolMock(BaseModel):
    """A tool's fixed answer: the JSON body its service would answer, and the HTTP status."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    answer: Any = None
    status: int = Field(default=200, ge=200, le=599)


class MocksRefused(ValueError):
    """Mocks that cannot be set on this call: `code` is the HTTP status to answer."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class MockableToolbox:
    """A call's toolbox whose HTTP tools named in `mockable` may be answered by mocks instead,
    once `mock` has set them; every other call goes to `tools`."""

    def __init__(self, tools: Toolbox, mockable: Sequence[str]) -> None:
        self.tools = tools
        self.mockable = frozenset(mockable)
        self.mocks: dict[str, ToolMock] | None = None  # None: never set

    def specs(self) -> Sequence[ToolSpec]:
        return self.tools.specs()

    def mock(self, mocks: Mapping[str, ToolMock]) -> None:
        """Answer these tools from now on (MocksRefused: already set, or a tool the call's
        agent has no HTTP tool of that name)."""
        if self.mocks is not None:
            raise MocksRefused("this call's tool mocks are set already (once a call)", 409)
        unknown = sorted(set(mocks) - self.mockable)
        if unknown:
            known = ", ".join(sorted(self.mockable)) or "none"
            raise MocksRefused(
                f"no HTTP tool named {', '.join(unknown)} on this call's agent (HTTP tools: "
                f"{known})",
                400,
            )
        self.mocks = dict(mocks)

    async def run(self, call: ToolCall, context: ToolContext) -> ToolResult:
        mock = (self.mocks or {}).get(call.name)
        if mock is None:
            return await self.tools.run(call, context)
        started = time.monotonic()
        text = json.dumps(mock.answer, separators=(",", ":"), ensure_ascii=False)
        if 200 <= mock.status < 300:
            return ToolResult(call, model_output(text), started_at=started, ended_at=started)
        message = f"the {call.name} service answered with HTTP status {mock.status}"
        text = text.strip()[:_ERROR_BODY_CHARS]
        return ToolResult.error(call, f"{message}: {text}" if text else message, started, started)


def mockable(ready: ReadyAgent | None, allowed: bool) -> Toolbox | None:
    """The toolbox a call of `ready` runs with: a `MockableToolbox` when mocks are `allowed`
    and the agent has HTTP tools, else the agent's own (None: no tools)."""
    toolbox = ready.toolbox if ready is not None else None
    if not allowed or ready is None or toolbox is None or not ready.agent.http_tools:
        return toolbox
    return MockableToolbox(toolbox, [tool.name for tool in ready.agent.http_tools])


def read_mocks(given: Any) -> dict[str, ToolMock]:
    """The mocks of a request's `mocks` field (tool name -> `ToolMock` fields); MocksRefused
    (400) naming the first bad field."""
    if not isinstance(given, dict) or not given:
        raise MocksRefused("field 'mocks' must be an object of tool name -> mock", 400)
    mocks = {}
    for name, mock in given.items():
        try:
            mocks[str(name)] = ToolMock.model_validate(mock)
        except ValidationError as exc:
            first = exc.errors(include_input=False, include_url=False)[0]
            where = ".".join(str(part) for part in (name, *first["loc"]))
            raise MocksRefused(f"bad mock: {where}: {first['msg']}", 400) from None
    return mocks


def set_mocks(call_id: str, tools: Toolbox | None, given: Any) -> dict[str, Any]:
    """Set the mocks `given` (tool name -> `ToolMock` fields) on a call whose toolbox is
    `tools`: the acknowledgement the calls API answers with (`ok`, else `error` and `code`)."""
    if not isinstance(tools, MockableToolbox):
        return {"ok": False, "error": "this call has no HTTP tools that can be mocked", "code": 409}
    try:
        tools.mock(read_mocks(given))
    except MocksRefused as exc:
        return {"ok": False, "error": str(exc), "code": exc.code}
    log.warning("call %s: tools %s answered by test mocks (testing API)", call_id, sorted(given))
    return {"ok": True, "status": "mocked", "tools": sorted(given)}

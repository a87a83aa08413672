"""Checking a scenario's expectations against what happened on its call.

What the agent did is read from the server's record of the call (GET /calls/{id}): the turn
records' tool calls and `reply_text` (what the caller heard, as the server kept it, not an STT
of the reply audio), the history, the transfer and the end reason. Each scripted turn owns the
turn records that began between its start and the next turn's (a caller turn the server split
in two gives two records; one it never heard gives none). The latency is the caller's own
measure: end of its speech to the first reply audio it heard.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from voice.agents.agent import Agent, normalise_number
from voice.evals.calls import HeardTurn, ScriptedCall
from voice.evals.scenario import Expect, Scenario, ToolExpected

Status = Literal["pass", "fail", "warn", "skip"]
SHOWN_CHARS = 120  # of what was heard, in a report line


@dataclass(frozen=True)
class Outcome:
    """One expectation's result: where (turn index, None for the whole call), what, and what
    was seen."""

    scenario: str
    turn: int | None
    expectation: str
    status: Status
    detail: str = ""

    @property
    def key(self) -> tuple[str, int | None, str]:
        return self.scenario, self.turn, self.expectation


@dataclass(frozen=True)
class Scope:
    """What one turn (or the whole call) shows: its turn records, and the reply heard."""

    turn: int | None
    records: list[dict[str, Any]]
    reply: str
    caller: str = ""  # what the server heard the caller say (its STT), for the report


def turn_scopes(call: ScriptedCall, record: dict[str, Any], turns: int) -> list[Scope]:
    """Each scripted turn's records, by the wall-clock start of the turn."""
    records = [r for r in record.get("records") or [] if isinstance(r, dict)]
    starts = [t.began_at for t in call.turns] + [float("inf")] * (turns - len(call.turns))
    scopes = []
    for i in range(turns):
        end = starts[i + 1] if i + 1 < turns else float("inf")
        mine = [r for r in records if starts[i] <= float(r.get("started_at") or 0) < end]
        reply = " ".join(str(r.get("reply_text") or "") for r in mine)
        caller = " ".join(str(r.get("caller_text") or "") for r in mine)
        scopes.append(Scope(i, mine, reply, caller))
    return scopes


def call_scope(record: dict[str, Any]) -> Scope:
    """The whole call: every turn record, and every reply the history kept (greeting too)."""
    history = [m for m in record.get("history") or [] if isinstance(m, dict)]
    said = [str(m.get("content") or "") for m in history if m.get("role") == "assistant"]
    records = [r for r in record.get("records") or [] if isinstance(r, dict)]
    return Scope(None, records, " ".join(s for s in said if s))


def check(
    scenario: Scenario, expect: Expect, scope: Scope, agent: Agent, record: dict[str, Any]
) -> list[Outcome]:
    """Every expectation of `expect`, checked over `scope`."""

    def outcome(what: str, ok: bool, detail: str) -> Outcome:
        return Outcome(scenario.name, scope.turn, what, "pass" if ok else "fail", detail)

    found: list[Outcome] = []
    if scope.turn is not None and not scope.records and _expects_records(expect):
        found.append(outcome("a turn was heard", False, "the server kept no turn for it"))
    called = [t for r in scope.records for t in r.get("tools") or [] if isinstance(t, dict)]
    seen = _tools_seen(called) + (
        f" (the caller was heard: {scope.caller!r})" if scope.caller else ""
    )
    for wanted in expect.tool_called:
        ok = any(_tool_matches(wanted, t) for t in called)
        found.append(outcome(_describe_tool(wanted), ok, seen))
    if expect.no_tool:
        found.append(outcome("no tool called", not called, seen))
    if expect.transferred_to is not None:
        found.append(_transfer(scenario, scope, expect.transferred_to, agent, record))
    if expect.ended is not None:
        ended = record.get("end_category") == "agent_ended"
        why = f"end: {record.get('end_reason') or 'none'}"
        want = "the agent ended the call" if expect.ended else "the agent did not end the call"
        found.append(outcome(want, ended == expect.ended, why))
    found.extend(_reply_checks(scenario, expect, scope))
    return found


def _expects_records(expect: Expect) -> bool:
    return bool(expect.tool_called or expect.reply_contains or expect.reply_matches)


def _reply_checks(scenario: Scenario, expect: Expect, scope: Scope) -> list[Outcome]:
    heard = _shown(scope.reply)
    text = scope.reply.lower()
    found = []
    for word in expect.reply_contains:
        ok = _has_word(text, word)
        found.append(_result(scenario, scope, f"reply contains {word!r}", ok, heard))
    for word in expect.reply_avoids:
        ok = not _has_word(text, word)
        found.append(_result(scenario, scope, f"reply avoids {word!r}", ok, heard))
    if expect.reply_matches is not None:
        ok = re.search(expect.reply_matches, scope.reply, re.IGNORECASE) is not None
        found.append(_result(scenario, scope, f"reply matches /{expect.reply_matches}/", ok, heard))
    return found


def _result(scenario: Scenario, scope: Scope, what: str, ok: bool, detail: str) -> Outcome:
    return Outcome(scenario.name, scope.turn, what, "pass" if ok else "fail", detail)


def _has_word(text: str, word: str) -> bool:
    return re.search(rf"(?<!\w){re.escape(word.lower())}(?!\w)", text) is not None


def _shown(text: str) -> str:
    text = " ".join(text.split())
    shown = text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "…"
    return f"heard {shown!r}" if shown else "heard nothing"


def _describe_tool(wanted: ToolExpected) -> str:
    if not wanted.arguments:
        return f"tool {wanted.name} called"
    return f"tool {wanted.name} called with {_compact(wanted.arguments)}"


def _compact(arguments: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in arguments.items())


def _tools_seen(called: Sequence[dict[str, Any]]) -> str:
    if not called:
        return "no tool was called"
    shown = [f"{t.get('name')}({_compact(_arguments(t))})" for t in called]
    return "called " + "; ".join(shown)


def _arguments(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool call's arguments (the record keeps the model's JSON text)."""
    arguments = tool.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return {}
    return arguments if isinstance(arguments, dict) else {}


def _tool_matches(wanted: ToolExpected, tool: dict[str, Any]) -> bool:
    return tool.get("name") == wanted.name and _subset(wanted.arguments, _arguments(tool))


def _subset(wanted: Any, actual: Any) -> bool:
    """`wanted` is found in `actual`: every key of a mapping, recursively; scalars alike as text
    (a model may write 4512 or "4512")."""
    if isinstance(wanted, dict):
        return isinstance(actual, dict) and all(
            k in actual and _subset(v, actual[k]) for k, v in wanted.items()
        )
    if isinstance(wanted, list):
        return (
            isinstance(actual, list)
            and len(wanted) == len(actual)
            and all(_subset(w, a) for w, a in zip(wanted, actual, strict=True))
        )
    return str(wanted).strip().lower() == str(actual).strip().lower()


def _transfer(
    scenario: Scenario, scope: Scope, target: str, agent: Agent, record: dict[str, Any]
) -> Outcome:
    what = f"transferred to {target}"
    transfer = record.get("transfer") if isinstance(record.get("transfer"), dict) else None
    seen = f"transferred to {transfer.get('to')}" if transfer else "no transfer"
    targets = agent.transfer.targets
    wanted = targets[target].to if target in targets else target
    if target not in targets and not re.match(r"^(\+|sips?:)", target):
        known = ", ".join(sorted(targets)) or "none"
        detail = f"agent {agent.name} has no transfer target {target!r} (targets: {known}); {seen}"
        return Outcome(scenario.name, scope.turn, what, "fail", detail)
    ok = transfer is not None and normalise_number(str(transfer.get("to"))) == normalise_number(
        wanted
    )
    return Outcome(scenario.name, scope.turn, what, "pass" if ok else "fail", seen)


def latency(scenario: Scenario, expect: Expect, scope: Scope, heard: HeardTurn | None) -> Outcome:
    """The reply heard within the budget (the expectation's, else the turn's own): reported,
    and a failure only in a `strict` scenario."""
    budgets = [float(b) for r in scope.records if isinstance(b := r.get("budget_ms"), int | float)]
    budget = expect.budget_ms or (budgets[0] if budgets else None)
    measured = heard.voice_to_voice_ms if heard is not None else None
    what = "reply heard within budget"
    if measured is None:
        return Outcome(scenario.name, scope.turn, what, "skip", "no reply heard")
    if budget is None:
        return Outcome(scenario.name, scope.turn, what, "skip", f"{measured:.0f} ms, no budget")
    detail = f"{measured:.0f} ms (budget {budget:.0f} ms)"
    if measured <= budget:
        return Outcome(scenario.name, scope.turn, what, "pass", detail)
    return Outcome(scenario.name, scope.turn, what, "fail" if scenario.strict else "warn", detail)

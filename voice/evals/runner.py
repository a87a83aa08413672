"""The runner behind `hotline test`: every scenario's call, placed and checked.

`voice.evals.prepared.prepare` loads the agents (copies whose mocked tools point at the run's
`MockTools`); `run_suite` places each scenario's call over its transport (`voice.evals.lines`),
`--parallel` at a time and `--repeat` times each, and checks it (`voice.evals.checks`), against
the run's own server (`voice.evals.own_server`) or, with `hotline test --url`, one already
running (its tool mocks set on each call through its testing API).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from websockets.exceptions import WebSocketException

from pipeline.transport import PCM
from voice.evals.calls import CallWatch, call_record, turn_audio
from voice.evals.checks import Outcome, call_scope, check, latency, turn_scopes
from voice.evals.judge import judge
from voice.evals.lines import Target, place_call
from voice.evals.mocks import MocksNotSet, set_server_mocks
from voice.evals.prepared import Prepared, prepare, workdir
from voice.evals.scenario import Scenario

__all__ = [
    "Attempt",
    "Prepared",
    "Target",
    "prepare",
    "run_scenario",
    "run_suite",
    "workdir",
]


@dataclass
class Attempt:
    """One call of a scenario and what its checks found."""

    scenario: Scenario
    attempt: int
    outcomes: list[Outcome] = field(default_factory=list)


async def run_scenario(
    scenario: Scenario, prepared: Prepared, target: Target, audio: list[PCM | None], attempt: int
) -> Attempt:
    """Place `scenario`'s call once and check every expectation."""
    result = Attempt(scenario, attempt)

    def failed(what: str, detail: str) -> Attempt:
        result.outcomes.append(Outcome(scenario.name, None, what, "fail", detail))
        return result

    agent = prepared.agents.get(scenario.agent)
    if agent is None:
        known = ", ".join(prepared.agents.names) or "none"
        return failed("the agent exists", f"no agent named {scenario.agent!r} (agents: {known})")
    number = scenario.number or (agent.numbers[0] if agent.numbers else None)
    if number is None and scenario.transport != "webrtc":
        return failed("the agent answers", f"agent {agent.name} has no number: give `number`")
    try:
        watch = CallWatch(target.url, target.token, _mocks_for(scenario, prepared, target))
        call = await place_call(target, scenario, number or "", audio, watch)
        if call.rejected is not None:
            return failed("the call was answered", f"turned away: {call.rejected}")
        record = await call_record(target.url, call.call_id, target.token)
    except MocksNotSet as exc:
        return failed("the tool mocks were set", str(exc))
    except (OSError, httpx.HTTPError, WebSocketException, TimeoutError) as exc:
        return failed(
            f"the call was placed over {scenario.transport}", f"{type(exc).__name__}: {exc}"
        )
    if record.get("agent") != agent.name:
        who = f"answered by {record.get('agent')}, not {agent.name}"
        result.outcomes.append(Outcome(scenario.name, None, "the agent answered", "fail", who))
    scopes = turn_scopes(call, record, len(scenario.turns))
    for i, (turn, scope) in enumerate(zip(scenario.turns, scopes, strict=True)):
        result.outcomes.extend(check(scenario, turn.expect, scope, agent, record))
        heard = call.turns[i] if i < len(call.turns) else None
        result.outcomes.append(latency(scenario, turn.expect, scope, heard))
    result.outcomes.extend(check(scenario, scenario.expect, call_scope(record), agent, record))
    if scenario.judge is not None:
        result.outcomes.append(await judge(scenario, record, target.judge))
    return result


def _mocks_for(
    scenario: Scenario, prepared: Prepared, target: Target
) -> Callable[[str], Awaitable[None]]:
    """What a call of `scenario` does with its id once answered: the run's own server's agent
    copies point mocked tools at the run's endpoint, told the call here; another server is
    given the mocks for the call (its testing API; MocksNotSet when it refuses)."""

    async def answered(call_id: str) -> None:
        if target.own:
            prepared.mocks.expect_call(call_id, scenario)
        elif scenario.mocks:
            await set_server_mocks(target.url, target.token, call_id, scenario.mocks)

    return answered


async def run_suite(
    scenarios: Sequence[Scenario],
    prepared: Prepared,
    target: Target,
    parallel: int = 1,
    repeat: int = 1,
) -> list[Attempt]:
    """Every scenario, `repeat` times each, at most `parallel` calls at once; in file order."""
    gate = asyncio.Semaphore(max(1, parallel))

    async def one(scenario: Scenario, attempt: int, audio: list[PCM | None]) -> Attempt:
        async with gate:
            return await run_scenario(scenario, prepared, target, audio, attempt)

    runs: list[Coroutine[Any, Any, Attempt]] = []
    for scenario in scenarios:
        audio = await asyncio.to_thread(_audio, scenario)
        runs.extend(one(scenario, attempt, audio) for attempt in range(repeat))
    return list(await asyncio.gather(*runs))


def _audio(scenario: Scenario) -> list[PCM | None]:
    return [turn_audio(turn, scenario.path.parent) for turn in scenario.turns]

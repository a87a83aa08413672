"""The runner behind `hotline test`: every scenario's call, placed and checked.

`prepare` loads the agents (copies whose mocked tools point at the run's `MockTools`) and
`run_suite` places each scenario's call over the emulated Twilio phone, `--parallel` at a time
and `--repeat` times each, and checks it (`voice.evals.checks`). `serve` starts the real
server on those agent copies (`hotline serve` in a child process on a free loopback port), so a
test run is one command; `hotline test --url` runs against a server already running instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from pipeline.llm.settings import LLMSettings
from pipeline.transport import PCM
from voice.agents.directory import AgentDirectory, load_agents
from voice.devtools.phone_caller import twilio_sid
from voice.evals.calls import call_record, place_call, turn_audio
from voice.evals.checks import Outcome, call_scope, check, latency, turn_scopes
from voice.evals.judge import judge
from voice.evals.mocks import MockTools, prepare_agents
from voice.evals.scenario import Scenario

START_TIMEOUT_S = 180.0


@dataclass
class Prepared:
    """What a run needs besides a server: the agents, the mock endpoint, the signing secret."""

    agents: AgentDirectory
    agents_dir: Path  # the copies the server loads
    mocks: MockTools
    secret: str

    def server_env(self) -> dict[str, str]:
        """The environment that points a `hotline serve` at the copies and the mocks."""
        return {
            "HOTLINE_AGENTS__DIR": str(self.agents_dir),
            "HOTLINE_AGENTS__SIGNING_SECRET": self.secret,
        }


def prepare(
    scenarios: Sequence[Scenario], agents_dir: Path, workdir: Path, lookup_only: bool = False
) -> Prepared:
    """Copies of the agent files in `workdir`, mocks served; raises `AgentFileError` when the
    agents do not load. `lookup_only`: the copies are only read here, for the agents' numbers
    and transfer targets (a server given with --url has agents of its own), so no tool needs
    its headers' environment variables."""
    secret = secrets.token_hex(32)
    mocks = MockTools(secret.encode())
    copies = prepare_agents(agents_dir, list(scenarios), mocks, workdir / "agents", lookup_only)
    try:
        agents = load_agents(copies)
    except Exception:
        mocks.close()
        raise
    return Prepared(agents, copies, mocks, secret)


@dataclass
class Target:
    """The server the calls go to."""

    url: str
    token: str | None = None
    twilio_auth_token: str | None = None
    judge: LLMSettings | None = None


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
    if number is None:
        return failed("the agent answers", f"agent {agent.name} has no number: give `number`")
    call_id = twilio_sid("CA")
    prepared.mocks.expect_call(call_id, scenario)
    try:
        call = await place_call(
            target.url, scenario, number, audio, call_id, target.twilio_auth_token
        )
        if call.rejected is not None:
            return failed("the call was answered", f"turned away: {call.rejected}")
        record = await call_record(target.url, call.call_id, target.token)
    except (OSError, httpx.HTTPError, TimeoutError) as exc:
        return failed("the call was placed", f"{type(exc).__name__}: {exc}")
    if record.get("agent") != agent.name:
        answered = f"answered by {record.get('agent')}, not {agent.name}"
        result.outcomes.append(Outcome(scenario.name, None, "the agent answered", "fail", answered))
    scopes = turn_scopes(call, record, len(scenario.turns))
    for i, (turn, scope) in enumerate(zip(scenario.turns, scopes, strict=True)):
        result.outcomes.extend(check(scenario, turn.expect, scope, agent, record))
        heard = call.turns[i] if i < len(call.turns) else None
        result.outcomes.append(latency(scenario, turn.expect, scope, heard))
    result.outcomes.extend(check(scenario, scenario.expect, call_scope(record), agent, record))
    if scenario.judge is not None:
        result.outcomes.append(await judge(scenario, record, target.judge))
    return result


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


# -- a server of the run's own ---------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def serve(prepared: Prepared, log_path: Path) -> Iterator[str]:
    """`hotline serve` on the agent copies, on a free loopback port, until the block ends; its
    base URL. Its log goes to `log_path` (shown when it does not start)."""
    port = _free_port()
    env = {**os.environ, **prepared.server_env(), "PYTHONUNBUFFERED": "1"}
    env.setdefault("HOTLINE_WARM_UP", "false")
    argv = [sys.executable, "-m", "voice", "serve", "--port", str(port), "--host", "127.0.0.1"]
    url = f"http://127.0.0.1:{port}"
    with log_path.open("w") as log:
        process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_ready(process, url, log_path)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_ready(process: subprocess.Popen[bytes], url: str, log_path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while process.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        time.sleep(0.2)  # polling a child process's port: nothing else says it is up
    tail = log_path.read_text(errors="replace").splitlines()[-30:]
    raise RuntimeError("hotline serve did not start:\n" + "\n".join(tail))


def workdir() -> tempfile.TemporaryDirectory[str]:
    """A scratch directory for a run's agent copies and server log."""
    return tempfile.TemporaryDirectory(prefix="hotline-test-")

"""The runner behind `hotline test`: every scenario's call, placed and checked.

`prepare` loads the agents (copies whose mocked tools point at the run's `MockTools`) and
`run_suite` places each scenario's call over its transport (`voice.evals.lines`), `--parallel`
at a time and `--repeat` times each, and checks it (`voice.evals.checks`). `serve` starts the
real server on those agent copies (`hotline serve` in a child process on a free loopback port,
with SIP on a free port of its own when a scenario calls over SIP), so a test run is one
command; `hotline test --url` runs against a server already running instead.
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
from websockets.exceptions import WebSocketException

from pipeline.transport import PCM
from voice.agents.directory import AgentDirectory, load_agents
from voice.evals.call_control import CallControlApi
from voice.evals.calls import call_record, turn_audio
from voice.evals.checks import Outcome, call_scope, check, latency, turn_scopes
from voice.evals.judge import judge
from voice.evals.lines import Target, place_call
from voice.evals.mocks import MockTools, prepare_agents
from voice.evals.scenario import Scenario

__all__ = [
    "Attempt",
    "Prepared",
    "Target",
    "prepare",
    "run_scenario",
    "run_suite",
    "serve",
    "workdir",
]

START_TIMEOUT_S = 180.0


@dataclass
class Prepared:
    """What a run needs besides a server: the agents, the mock endpoint, the signing secret."""

    agents: AgentDirectory
    agents_dir: Path  # the copies the server loads
    mocks: MockTools
    secret: str
    sip_port: int | None = None  # a scenario calls over SIP: the port a server of the run's takes
    call_control: CallControlApi | None = None  # a Telnyx or Vonage scenario: their API, faked

    def server_env(self) -> dict[str, str]:
        """The environment that points a `hotline serve` at the copies and the mocks (and, for
        SIP scenarios, has it take SIP calls from loopback on `sip_port`)."""
        env = {
            "HOTLINE_AGENTS__DIR": str(self.agents_dir),
            "HOTLINE_AGENTS__SIGNING_SECRET": self.secret,
        }
        if self.sip_port is not None:
            env["HOTLINE_SIP__ENABLED"] = "true"
            env["HOTLINE_SIP__HOST"] = "127.0.0.1"
            env["HOTLINE_SIP__PORT"] = str(self.sip_port)
            env["HOTLINE_SIP__ALLOW"] = '["127.0.0.0/8", "::1/128"]'
        if self.call_control is not None:
            env.update(self.call_control.server_env())
        return env

    def target(self, url: str) -> Target:
        """The run's own server at `url`, with SIP and call control where this run set them up."""
        target = Target(url, sip_port=self.sip_port) if self.sip_port else Target(url)
        target.call_control = self.call_control
        return target

    def close(self) -> None:
        """Stop the run's endpoints (the mocks, the call control)."""
        self.mocks.close()
        if self.call_control is not None:
            self.call_control.close()


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
    own = not lookup_only  # the run starts a server of its own: SIP and call control for it
    sip = _free_port() if own and any(s.transport == "sip" for s in scenarios) else None
    providers = own and any(s.transport in ("telnyx", "vonage") for s in scenarios)
    return Prepared(agents, copies, mocks, secret, sip, CallControlApi() if providers else None)


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
        call = await place_call(
            target,
            scenario,
            number or "",
            audio,
            lambda call_id: prepared.mocks.expect_call(call_id, scenario),
        )
        if call.rejected is not None:
            return failed("the call was answered", f"turned away: {call.rejected}")
        record = await call_record(target.url, call.call_id, target.token)
    except (OSError, httpx.HTTPError, WebSocketException, TimeoutError) as exc:
        return failed(
            f"the call was placed over {scenario.transport}", f"{type(exc).__name__}: {exc}"
        )
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
    """A loopback port free for TCP and for UDP (SIP takes both)."""
    for _ in range(100):
        with socket.socket() as tcp, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            tcp.bind(("127.0.0.1", 0))
            port = int(tcp.getsockname()[1])
            try:
                udp.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no loopback port free for both TCP and UDP")


@contextlib.contextmanager
def serve(prepared: Prepared, log_path: Path) -> Iterator[str]:
    """`hotline serve` on the agent copies, on a free loopback port, until the block ends; its
    base URL. Its log goes to `log_path` (shown when it does not start)."""
    port = _free_port()
    while port == prepared.sip_port:
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

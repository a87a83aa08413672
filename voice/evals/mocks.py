"""Tool mocks: a scenario fixes what an HTTP tool answers, so a test needs no order system.

The seam is the tool's URL, not Hotline's tool code. The runner serves every mocked tool from a
small loopback endpoint (`MockTools`) and starts the server on copies of the agent files whose
mocked tools point there (`prepare_agents`). So a mocked tool call takes the real path end to
end: the model's call, `voice.agents.http_tools.HttpTool` signing and POSTing it, the answer's
status and size checks, the result in the history and the turn record, the model reading it.
The endpoint checks each request's `X-Hotline-Signature` as an operator's service would (a
request that is not signed with the run's secret is refused), and answers from the mocks of
the scenario whose call it is (by the `call_id` in the body). A mocked tool's `headers` are left
out of the copy: the mock needs no token, and a test run needs no ``${ORDERS_TOKEN}``.

A server given with `--url` has agent files of its own: there `set_server_mocks` fixes the
answers on each test call through the server's testing API (`PUT /calls/{id}/mocks`, which the
server allows only with `HOTLINE_TESTING__ALLOW_MOCKS=true` and the API token), and the server
answers the mocked tools itself (`voice.agents.mocked_tools`).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import yaml

from voice.agents.directory import AgentFileError
from voice.agents.http_tools import SIGNATURE_HEADER, verify
from voice.cli.client import auth_headers
from voice.evals.scenario import Mock, Scenario

MAX_BODY_BYTES = 1_000_000


@dataclass(frozen=True)
class MockRequest:
    """One tool request the endpoint answered: which call, which tool, with what arguments."""

    call_id: str
    tool: str
    arguments: dict[str, Any]


class MockTools:
    """The loopback endpoint that answers mocked tool calls, in a thread of its own (so it
    serves whichever event loop, or none, the caller runs)."""

    def __init__(self, secret: bytes) -> None:
        self.secret = secret
        self.requests: list[MockRequest] = []
        self._calls: dict[str, tuple[str, dict[str, Mock]]] = {}  # call id -> scenario, mocks
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def url_for(self, tool: str) -> str:
        return f"{self.url}/tools/{tool}"

    def expect_call(self, call_id: str, scenario: Scenario) -> None:
        """Answer the tool requests of call `call_id` from `scenario`'s mocks."""
        with self._lock:
            self._calls[call_id] = (scenario.name, dict(scenario.mocks))

    def answer(self, tool: str, body: dict[str, Any]) -> tuple[int, Any]:
        """The status and JSON to answer a request for `tool` with."""
        call_id = str(body.get("call_id", ""))
        arguments = body.get("arguments")
        with self._lock:
            self.requests.append(
                MockRequest(call_id, tool, arguments if isinstance(arguments, dict) else {})
            )
            scenario, mocks = self._calls.get(call_id, ("", {}))
        if not scenario:
            return 404, {"error": f"no scenario placed call {call_id}"}
        mock = mocks.get(tool)
        if mock is None:
            return 404, {"error": f"scenario {scenario} has no mock for the {tool} tool"}
        return mock.status, mock.answer

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class MocksNotSet(RuntimeError):
    """The server did not take a call's mocks (its answer says why)."""


async def set_server_mocks(
    url: str, token: str | None, call_id: str, mocks: dict[str, Mock]
) -> None:
    """Fix the answers of `mocks` on call `call_id` of the server at `url` (its testing API);
    MocksNotSet, with the server's reason, when it refuses."""
    body = {"mocks": {name: mock.model_dump() for name, mock in mocks.items()}}
    async with httpx.AsyncClient(timeout=10, headers=auth_headers(token)) as http:
        response = await http.put(f"{url.rstrip('/')}/calls/{call_id}/mocks", json=body)
    if response.status_code == 200:
        return
    try:
        reason = str(response.json().get("error"))
    except (ValueError, AttributeError):
        reason = response.text[:200]
    hint = " (give the server's API token: --token)" if response.status_code == 401 else ""
    raise MocksNotSet(
        f"the server refused the tool mocks: HTTP {response.status_code}: {reason}{hint}"
    )


def _handler(tools: MockTools) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            size = int(self.headers.get("Content-Length") or 0)
            if not self.path.startswith("/tools/") or size > MAX_BODY_BYTES:
                self._reply(404, {"error": "not a mocked tool"})
                return
            raw = self.rfile.read(size)
            signature = self.headers.get(SIGNATURE_HEADER, "")
            if not verify(tools.secret, signature, raw, time.time()):
                self._reply(401, {"error": "bad or missing X-Hotline-Signature"})
                return
            try:
                body = json.loads(raw)
            except ValueError:
                self._reply(400, {"error": "the body is not JSON"})
                return
            self._reply(*tools.answer(self.path.removeprefix("/tools/"), body))

        def _reply(self, status: int, value: Any) -> None:
            data = json.dumps(value).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            return  # quiet: the runner's report says what was asked

    return Handler


def prepare_agents(
    source: Path, scenarios: list[Scenario], mocks: MockTools, into: Path, every_tool: bool = False
) -> Path:
    """Copies of the agent files of `source` in `into`, each tool that a scenario mocks (with
    `every_tool`: every HTTP tool) pointed at `mocks`, its headers left out; other fields as
    they are. Returns `into`."""
    mocked: set[str] | None = {t for s in scenarios for t in s.mocks} if not every_tool else None
    if not source.is_dir():
        raise AgentFileError([f"{source}: not a directory of agent files"])
    into.mkdir(parents=True, exist_ok=True)
    for path in sorted(source.iterdir()):
        if path.suffix not in (".yaml", ".yml") or not path.is_file():
            continue
        data = yaml.safe_load(path.read_text("utf-8"))
        if isinstance(data, dict):
            data.setdefault("name", path.stem)
            _point_tools(data, mocked, mocks)
            _absolute_voice(data, path.parent)
            (into / path.name).write_text(yaml.safe_dump(data, sort_keys=False), "utf-8")
        else:  # left for the server to refuse, naming the file
            (into / path.name).write_text(path.read_text("utf-8"), "utf-8")
    return into


def _point_tools(agent: dict[str, Any], mocked: set[str] | None, mocks: MockTools) -> None:
    for tool in agent.get("tools") or []:
        if isinstance(tool, dict) and (mocked is None or tool.get("name") in mocked):
            tool["url"] = mocks.url_for(str(tool["name"]))
            tool.pop("headers", None)


def _absolute_voice(agent: dict[str, Any], base: Path) -> None:
    voice = agent.get("voice")
    if isinstance(voice, str) and (base / voice).exists():
        agent["voice"] = str((base / voice).resolve())

"""The run's own server, when `hotline test` is given no `--url`: the server's app (`create_app`,
lifespan and all: models, the embedded simulator, SIP) run by uvicorn on a loopback port of the
test command's own event loop (`serve_here`), on the run's copies of the agent files.

In the process rather than as a `hotline serve` child: no second interpreter to start (the
caller's piper voice, already loaded, is the server's too), ports bound before anyone can take
them (HTTP on a socket bound here, SIP and SIP-TLS on port 0 and read back), a start-up failure
raised with its cause, nothing left running when the command is killed. What it costs: the
caller and the server share one event loop and one GIL, so a server that blocked its loop
would also delay the caller's ear (that is a bug the server must not have anyway), and
`--parallel` calls share one core's worth of Python. Measured in the README ("Testing an
agent"). `serve_child` runs `hotline serve` in a child process instead (`--isolated`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from voice.evals.lines import Target
from voice.evals.prepared import LOOPBACK, Prepared, free_port

START_TIMEOUT_S = 180.0


class _Uvicorn(uvicorn.Server):
    """uvicorn's server, saying when it has started (or given up)."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.up = asyncio.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await super().startup(sockets)
        finally:
            self.up.set()


async def _serve(server: _Uvicorn, listening: socket.socket) -> None:
    try:
        await server.serve([listening])
    except SystemExit:  # uvicorn's answer to a lifespan that failed (its error is logged)
        raise RuntimeError("the server did not start (its error is logged above)") from None


def _settings(prepared: Prepared, port: int) -> dict[str, Any]:
    """The server's settings besides the environment's: the run's, HTTP on `port`, SIP (and
    SIP-TLS) on any free port, WebRTC on loopback, no warm-up unless asked."""
    given = prepared.server_settings()
    if "sip" in given:
        given["sip"].update(port=0, tls_port=0)
    given.update(host=LOOPBACK, port=port, webrtc={"ice_host_addresses": [LOOPBACK]})
    if "HOTLINE_WARM_UP" not in os.environ:
        given["warm_up"] = False
    return given


@contextlib.asynccontextmanager
async def serve_here(prepared: Prepared) -> AsyncIterator[Target]:
    """The server's app on a free loopback port of this event loop until the block ends: the
    target its calls go to (RuntimeError when it does not start)."""
    from voice.server.app import create_app  # the server's imports, only when one is started
    from voice.server.settings import Settings

    listening = socket.socket()
    listening.bind((LOOPBACK, 0))
    port = int(listening.getsockname()[1])
    app = create_app(Settings(**_settings(prepared, port)))
    config = uvicorn.Config(app, log_config=None, log_level="warning", access_log=False)
    server = _Uvicorn(config)
    serving = asyncio.create_task(_serve(server, listening), name="hotline-test-server")
    try:
        await asyncio.wait(
            [asyncio.ensure_future(server.up.wait()), serving],
            timeout=START_TIMEOUT_S,
            return_when=asyncio.FIRST_COMPLETED,
        )
        if serving.done():
            serving.result()  # raises why it stopped
        if not server.started:
            raise RuntimeError(f"the server did not start within {START_TIMEOUT_S:g} s")
        target = prepared.target(f"http://{LOOPBACK}:{port}")
        sip = getattr(app.state, "sip", None)
        if sip is not None:
            target.sip_port, target.sip_tls_port = sip.endpoint.port, sip.endpoint.tls_port
        yield target
    finally:
        server.should_exit = True
        with contextlib.suppress(RuntimeError):
            await serving
        listening.close()


# -- `hotline serve` in a child process (--isolated) --------------------------------------------


@contextlib.contextmanager
def serve_child(prepared: Prepared, log_path: Path) -> Iterator[Target]:
    """`hotline serve` on the agent copies, on a free loopback port, until the block ends: the
    target its calls go to. Its log goes to `log_path` (shown when it does not start)."""
    port = free_port()
    while port in (prepared.sip_port, prepared.sip_tls.port if prepared.sip_tls else None):
        port = free_port()
    env = {**os.environ, **prepared.server_env(), "PYTHONUNBUFFERED": "1"}
    env.setdefault("HOTLINE_WARM_UP", "false")
    argv = [sys.executable, "-m", "voice", "serve", "--port", str(port), "--host", LOOPBACK]
    url = f"http://{LOOPBACK}:{port}"
    with log_path.open("w") as log:
        process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_ready(process, url, log_path)
        yield prepared.target(url)
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

"""Serving the tier simulator: inside a running event loop (the server's embedded LLM, tests),
or on its own (`hotline llm-sim`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Iterator

import uvicorn
from starlette.applications import Starlette

from voice.llm_sim.settings import SimulatorSettings
from voice.llm_sim.simulator import create_simulator_app
from voice.server.quiet_uvicorn import QuietServer

log = logging.getLogger(__name__)

# How long the simulator keeps a client's idle connection (uvicorn's own 5 s closed the server's
# connection between a call's turns, whatever the client kept; `pipeline.llm.connections`).
KEEP_ALIVE_S = 600


class _EmbeddedServer(QuietServer):
    """uvicorn inside someone else's event loop (ticking once a second, `QuietServer`): leave
    the process's signal handlers alone."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@contextlib.asynccontextmanager
async def running_simulator(
    settings: SimulatorSettings | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    app: Starlette | None = None,
) -> AsyncIterator[str]:
    """Serve the simulator (or the given simulator ``app``) in the current event loop.

    Yields the base URL, e.g. ``http://127.0.0.1:41234/v1``; stops the server on exit.
    """
    if app is None:
        app = create_simulator_app(settings)
    elif settings is not None:
        raise ValueError("pass settings or app, not both")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP matters: asyncio only sets TCP_NODELAY on accepted sockets whose proto
    # says TCP; with proto 0, Nagle + delayed ACKs add ~40 ms to every request.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.setblocking(False)
    url = f"http://{f'[{host}]' if ':' in host else host}:{sock.getsockname()[1]}/v1"
    # log_config=None: leave the host's logging configuration (and access log) alone
    config = uvicorn.Config(
        app,
        log_config=None,
        lifespan="on",
        timeout_graceful_shutdown=2,
        timeout_keep_alive=KEEP_ALIVE_S,
    )
    server = _EmbeddedServer(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        async with asyncio.timeout(10):
            while not server.started:  # uvicorn offers no startup event to await
                if task.done():
                    task.result()
                    raise RuntimeError("the simulator stopped during startup")
                await asyncio.sleep(0.005)
        log.info("LLM simulator listening on %s", url)
        yield url
    finally:
        server.stop()
        try:
            await task
        finally:
            sock.close()


def serve_simulator(host: str, port: int, settings: SimulatorSettings | None = None) -> None:
    """Run the simulator until interrupted (``hotline llm-sim --port N``)."""
    log.warning("LLM simulator at http://%s:%d/v1", host, port)
    app = create_simulator_app(settings)
    config = uvicorn.Config(
        app, host=host, port=port, log_level="info", timeout_keep_alive=KEEP_ALIVE_S
    )
    QuietServer(config).run()

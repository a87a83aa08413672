"""Shared fixtures: a real `hotline serve` process on a free loopback port."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import aioice.ice
import pytest

from voice.transports.webrtc import restrict_ice_host_addresses


@pytest.fixture(scope="session", autouse=True)
def loopback_ice() -> Iterator[None]:
    """aioice leaves 127.0.0.1 out of its host candidates, and every aiortc peer the tests make
    in this process stays on loopback (servers get `HOTLINE_WEBRTC__ICE_HOST_ADDRESSES`)."""
    original = aioice.ice.get_host_addresses
    restrict_ice_host_addresses(["127.0.0.1"])
    yield
    aioice.ice.get_host_addresses = original


# Barge-in must silence the reply within 300 ms of the caller's onset (the product target,
# reported by `hotline call`). Tests allow half as much again, for a runner a third slower.
BARGE_IN_BOUND_MS = 450


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Server:
    url: str
    process: subprocess.Popen[str]
    log: list[str] = field(default_factory=list)


def start_server(extra_env: dict[str, str] | None = None, timeout_s: float = 120) -> Server:
    """Run `hotline serve` in a subprocess and return once it accepts requests."""
    port = free_port()
    env = {
        **os.environ,
        "HOTLINE_WEBRTC__ICE_HOST_ADDRESSES": '["127.0.0.1"]',
        "HOTLINE_WEBRTC__CONNECT_TIMEOUT_S": "5",
        "PYTHONUNBUFFERED": "1",
        **(extra_env or {}),
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "voice", "serve", "--port", str(port), "--log-level", "info"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    server = Server(f"http://127.0.0.1:{port}", process)
    ready = threading.Event()
    listening = f"Uvicorn running on http://127.0.0.1:{port}"  # the embedded LLM logs its own

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            server.log.append(line.rstrip())
            if listening in line:
                ready.set()
        ready.set()  # the process ended: stop waiting

    threading.Thread(target=pump, daemon=True).start()
    ready.wait(timeout_s)
    if process.poll() is not None or not any(listening in line for line in server.log):
        process.kill()
        raise RuntimeError("hotline serve did not start:\n" + "\n".join(server.log[-40:]))
    return server


async def logged(server: Server, *fragments: str, within_s: float = 10.0) -> list[str]:
    """The server's log lines holding each fragment, once they all appear (the log is read by
    a thread, so a line may arrive a moment after the server wrote it); fails after
    `within_s`."""
    deadline = time.monotonic() + within_s
    while True:
        found = [next((line for line in server.log if f in line), None) for f in fragments]
        if all(found):
            return [line for line in found if line is not None]
        missing = [f for f, line in zip(fragments, found, strict=True) if line is None]
        assert time.monotonic() < deadline, f"the server never logged {missing}"
        await asyncio.sleep(0.05)


def stop_server(server: Server) -> int:
    server.process.terminate()
    try:
        return server.process.wait(30)
    except subprocess.TimeoutExpired:
        server.process.kill()
        return server.process.wait()


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    """One Hotline server (embedded simulator, bundled models) for the call tests."""
    running = start_server()
    yield running
    code = stop_server(running)
    assert code == 0, "\n".join(running.log[-40:])


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A `serial` test is also `slow`: `make test-fast` leaves both out."""
    for item in items:
        if item.get_closest_marker("serial") is not None:
            item.add_marker(pytest.mark.slow)

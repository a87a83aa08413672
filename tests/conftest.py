"""Shared fixtures: loopback-only ICE, and one real `hotline serve` process on a free loopback
port for the call tests (its helpers live in tests/support/server.py)."""

from __future__ import annotations

import os
import resource
from collections.abc import Iterator

import aioice.ice
import pytest

from tests.support.redis_server import RedisServer
from tests.support.server import Server, start_server, stop_server
from voice.transports.webrtc import restrict_ice_host_addresses

pytest_plugins = ["tests.support.sip_server"]  # the SIP servers the SIP modules share


@pytest.fixture(scope="session", autouse=True)
def loopback_ice() -> Iterator[None]:
    """aioice leaves 127.0.0.1 out of its host candidates, and every aiortc peer the tests make
    in this process stays on loopback (servers get `HOTLINE_WEBRTC__ICE_HOST_ADDRESSES`)."""
    original = aioice.ice.get_host_addresses
    restrict_ice_host_addresses(["127.0.0.1"])
    yield
    aioice.ice.get_host_addresses = original


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    """One Hotline server (embedded simulator, bundled models) for the call tests."""
    running = start_server()
    yield running
    code = stop_server(running)
    assert code == 0, "\n".join(running.log[-40:])


def pytest_sessionfinish(session: pytest.Session) -> None:
    """With HOTLINE_TEST_STARTS_LOG set, the CPU this test process used (where the time goes)."""
    if starts := os.environ.get("HOTLINE_TEST_STARTS_LOG"):
        used = resource.getrusage(resource.RUSAGE_SELF)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(starts, "a") as out:
            out.write(f"pytest {used.ru_utime + used.ru_stime:.1f} {worker}\n")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A `serial` test is also `slow`: `make test-fast` leaves both out.

    The `slow` tests (live servers, real-time calls) run first and the unit tests last: `make
    test` hands whole files to its workers (`--dist loadfile`, so a module's servers start once),
    and a long file handed out last would leave the other workers idle at the end, where short
    tests fill the gaps instead. The sort is stable: files and tests keep their order."""
    for item in items:
        if item.get_closest_marker("serial") is not None:
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    """A real redis-server of the test module's own (a module may define its own instead)."""
    server = RedisServer()
    server.start()
    yield server
    server.stop()

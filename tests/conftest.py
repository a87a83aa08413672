"""Shared fixtures: loopback-only ICE, and one real `hotline serve` process on a free loopback
port for the call tests (its helpers live in tests/support/server.py)."""

from __future__ import annotations

import json
import os
import resource
from collections.abc import Iterator
from pathlib import Path

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


# Seconds each file took in a `make test` run (setup, calls and teardown, on 6 workers of a
# 2-core machine): the longest files are handed out first. Refresh it from a run's
# `--durations=0` when files come and go; a file not in it counts as UNLISTED_SLOW_S if it has
# `slow` tests, else as nothing.
DURATIONS = json.loads((Path(__file__).parent / "durations.json").read_text())
UNLISTED_SLOW_S = 30.0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A `serial` test is also `slow`: `make test-fast` leaves both out.

    `make test` hands whole files to its workers (`--dist loadfile --no-loadscope-reorder`, so
    a module's servers start once) in this order: the longest files first, by DURATIONS, so
    that no long file is handed out last to keep one worker busy while the others idle (xdist's
    own order, by number of tests, left the 1-test soak and transfer files to the end: a 3
    minute tail). The sort is stable: a file's tests keep their order."""
    slow_files: set[str] = set()
    for item in items:
        if item.get_closest_marker("serial") is not None:
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("slow") is not None:
            slow_files.add(_file_of(item))

    def seconds(item: pytest.Item) -> float:
        name = _file_of(item)
        listed = DURATIONS.get(name)
        if listed is not None:
            return float(listed)
        return UNLISTED_SLOW_S if name in slow_files else 0.0

    items.sort(key=lambda item: -seconds(item))


def _file_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    """A real redis-server of the test module's own (a module may define its own instead)."""
    server = RedisServer()
    server.start()
    yield server
    server.stop()

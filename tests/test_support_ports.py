"""The tests' own port picker: xdist workers draw from disjoint slices (a port one worker checked
could otherwise be bound by another worker's server before its own server binds it)."""

from __future__ import annotations

import pytest

from tests.support.server import PORTS, free_port, worker_ports


def test_workers_draw_from_disjoint_slices_of_the_range() -> None:
    slices = [worker_ports(f"gw{i}", 4) for i in range(4)]
    taken = [set(ports) for ports in slices]
    assert all(len(ports) == len(PORTS) // 4 for ports in taken)
    assert all(not (a & b) for i, a in enumerate(taken) for b in taken[i + 1 :])
    assert set().union(*taken) <= set(PORTS)


def test_one_process_alone_draws_from_the_whole_range() -> None:
    assert worker_ports(None, 1) == PORTS
    assert worker_ports("gw0", 1) == PORTS  # `-n 1`
    assert worker_ports("master", 4) == PORTS


def test_free_port_stays_in_the_workers_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw2")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "3")
    mine = worker_ports("gw2", 3)
    assert all(free_port() in mine for _ in range(20))

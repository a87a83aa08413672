"""SIP scale-out through Kamailio (deploy/kamailio/): Debian's kamailio, with the shipped config,
dispatches a real softphone's calls (baresip) over two real `hotline serve` workers, probing
each with OPTIONS. Calls land on both, each BYE finds its worker through the proxy, and a
drained worker (OPTIONS 503) gets no new INVITE while its call in progress goes on to the end.
Without probes, an INVITE that a draining worker refuses (503) or that nothing answers goes on
to the next worker (the failure route), and the caller never notices."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support.baresip import Baresip, baresip_installed
from tests.support.kamailio import Kamailio, kamailio_installed
from tests.support.poll import until
from tests.support.server import Server, free_port, logged, start_server
from tests.support.sip_server import NUMBER, stopped_cleanly
from tests.support.speech import silence

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not kamailio_installed(), reason="kamailio missing (make test installs it)"),
    pytest.mark.skipif(not baresip_installed(), reason="baresip missing (make test installs it)"),
]

ANSWERED = re.compile(r"sip: call (\w+) from ")


@dataclass
class Worker:
    server: Server
    sip_port: int

    def answered(self) -> list[str]:
        """Our ids of the SIP calls this worker answered, in order."""
        return [m.group(1) for line in list(self.server.log) if (m := ANSWERED.search(line))]

    def count(self, fragment: str) -> int:
        return sum(fragment in line for line in list(self.server.log))


async def took_it(workers: list[Worker], before: list[int]) -> Worker:
    """The worker that answered one call more than `before` (its log line may come a moment
    after the caller's "Call established")."""
    await until(lambda: sum(len(w.answered()) for w in workers) > sum(before), "the answer", 15)
    [worker] = [w for w, n in zip(workers, before, strict=True) if len(w.answered()) > n]
    return worker


def start_worker() -> Worker:
    port = free_port()
    env = {
        "HOTLINE_SIP__ENABLED": "true",
        "HOTLINE_SIP__PORT": str(port),
        "HOTLINE_SIP__ALLOW": '["127.0.0.1/32"]',  # the proxy's address
    }
    return Worker(start_server(env), port)


def draining(worker: Worker) -> bool:
    """Whether a test drained the worker (it answers /readyz 503, or is on its way out)."""
    if worker.server.process.poll() is not None:
        return True
    try:
        return httpx.get(f"{worker.server.url}/readyz").status_code == 503
    except httpx.TransportError:
        return True


def retire(worker: Worker) -> None:
    """Stop a worker and require a clean exit: a drained one exits by itself once its calls are
    over (a signal then would only race its own shutdown), any other is stopped."""
    if not draining(worker):
        stopped_cleanly(worker.server)
        return
    code = worker.server.process.wait(30)
    assert code == 0, f"a drained worker exited {code}:\n" + "\n".join(worker.server.log[-30:])


@pytest.fixture(scope="module")
def pool() -> Iterator[list[Worker]]:
    """The module's workers: a test drains one of its two, the next gets a fresh one in its
    place (and the other one again), so the module starts three, not four."""
    running: list[Worker] = []
    yield running
    for worker in running:
        retire(worker)


@pytest.fixture
def workers(pool: list[Worker]) -> list[Worker]:
    """Two workers that take calls (those of the pool that still do, and fresh ones started
    at once)."""
    for worker in [w for w in pool if draining(w)]:
        pool.remove(worker)
        retire(worker)
    with ThreadPoolExecutor(2) as executor:
        started = [executor.submit(start_worker) for _ in range(2 - len(pool))]
    pool.extend(future.result() for future in started if future.exception() is None)
    for future in started:
        if (error := future.exception()) is not None:
            raise error
    return list(pool)


@pytest.fixture
def kamailio(workers: list[Worker]) -> Iterator[Kamailio]:
    proxy = Kamailio([w.sip_port for w in workers], ping_interval_s=1)
    proxy.start()
    yield proxy
    proxy.stop()


def hung_up_by_caller(workers: list[Worker]) -> int:
    return sum(w.count("hang-up (caller hung up (BYE))") for w in workers)


async def dial(proxy: Kamailio, caller: Baresip) -> None:
    caller.start()
    await caller.command("dial", f"sip:{NUMBER}@127.0.0.1:{proxy.port}")
    await caller.wait_logged("Call established")


async def call_and_hang_up(proxy: Kamailio, workers: list[Worker], directory: Path) -> None:
    """One call through the proxy: answered, then the caller's BYE reaches the worker."""
    before = hung_up_by_caller(workers)
    caller = Baresip(directory, silence(20_000))
    try:
        await dial(proxy, caller)
        await caller.command("hangup")  # its BYE goes through the proxy (the Route set)
        await until(lambda: hung_up_by_caller(workers) > before, "the BYE at the worker", 15)
    finally:
        caller.stop()


async def test_calls_spread_over_workers_and_a_drained_worker_gets_no_new_invites(
    workers: list[Worker], kamailio: Kamailio, tmp_path: Path
) -> None:
    for worker in workers:  # both probed: OPTIONS answered 200
        await kamailio.wait_logged(f"hotline: worker {kamailio.uri(worker.sip_port)} up")
    assert set(kamailio.destinations().values()) == {"AP"}

    before = [len(w.answered()) for w in workers]  # (a worker may come from an earlier test)
    for n in range(4):
        await call_and_hang_up(kamailio, workers, tmp_path / f"caller{n}")
    counts = [len(w.answered()) - n for w, n in zip(workers, before, strict=True)]
    assert sum(counts) == 4 and min(counts) >= 1, counts  # round-robin: both take calls
    assert kamailio.count("from the last worker") == 0  # no call needed a second try

    # A long call, then its worker is drained while the call goes on.
    before = [len(w.answered()) for w in workers]
    long_call = Baresip(tmp_path / "long", silence(60_000))
    try:
        await dial(kamailio, long_call)
        drained = await took_it(workers, before)
        [other] = [w for w in workers if w is not drained]
        call_id = drained.answered()[-1]
        went_down = f"hotline: worker {kamailio.uri(drained.sip_port)} down"
        downs = kamailio.count(went_down)
        async with httpx.AsyncClient() as client:
            response = await client.post(f"{drained.server.url}/admin/drain")
            assert response.status_code == 202
            assert response.json()["active_calls"] == 1
        # its next OPTIONS is answered 503 (it is alive: its call goes on): out of rotation
        await kamailio.wait_logged(went_down, times=downs + 1)
        flags = kamailio.destinations()
        assert flags[kamailio.uri(drained.sip_port)].startswith("I"), flags
        assert flags[kamailio.uri(other.sip_port)].startswith("A"), flags

        sent_to_drained = kamailio.count(f"to {kamailio.uri(drained.sip_port)}")
        drained_lines = len(drained.server.log)
        other_before = len(other.answered())
        for n in range(3):
            await call_and_hang_up(kamailio, workers, tmp_path / f"after{n}")
        assert len(other.answered()) == other_before + 3
        assert kamailio.count(f"to {kamailio.uri(drained.sip_port)}") == sent_to_drained
        assert kamailio.count("no worker available") == 0
        assert kamailio.count("from the last worker") == 0
        new = drained.server.log[drained_lines:]
        assert not [line for line in new if "sip: call" in line or "sip: INVITE" in line], new

        # The call in progress on the drained worker goes on: re-INVITEs (hold, resume) reach
        # it through the proxy; then the worker hangs up, and its BYE reaches the caller the
        # same way (the Route set of the INVITE).
        async with httpx.AsyncClient() as client:
            detail = (await client.get(f"{drained.server.url}/calls/{call_id}")).json()
            assert detail["state"] != "ended", detail
            mark = drained.server.log_mark()
            await long_call.command("hold")
            await logged(drained.server, f"sip: call {call_id} on hold", since=mark)
            mark = drained.server.log_mark()
            await long_call.command("resume")
            await logged(drained.server, f"sip: call {call_id} resumed", since=mark)
            mark = drained.server.log_mark()
            hung_up = await client.post(f"{drained.server.url}/calls/{call_id}/hangup")
            assert hung_up.status_code == 200
        await long_call.wait_logged("session closed")
        await logged(drained.server, f"sip: call {call_id}: BYE answered 200", since=mark)
    finally:
        long_call.stop()
    # drained and idle: the worker exits by itself
    code = await asyncio.to_thread(drained.server.process.wait, 30)
    assert code == 0, "\n".join(drained.server.log[-30:])


async def test_an_invite_refused_or_unanswered_goes_on_to_the_next_worker(
    workers: list[Worker], tmp_path: Path
) -> None:
    dead = free_port()  # a worker that is gone: nothing answers there
    # No probes: the proxy learns only from the INVITEs themselves. Active from the start.
    proxy = Kamailio([*(w.sip_port for w in workers), dead], ping_interval_s=0, flags=8)
    proxy.start()
    long_call = Baresip(tmp_path / "long", silence(60_000))
    try:
        before = [len(w.answered()) for w in workers]
        await dial(proxy, long_call)
        drained = await took_it(workers, before)
        [other] = [w for w in workers if w is not drained]
        mark = drained.server.log_mark()
        async with httpx.AsyncClient() as client:
            response = await client.post(f"{drained.server.url}/admin/drain")
            assert response.status_code == 202
        await logged(drained.server, "draining: 1 calls in progress", since=mark)

        # Round-robin over three: within four calls both the draining worker and the dead
        # address are tried (unless the dead one already was), and every call lands on `other`.
        other_before = len(other.answered())
        mark = drained.server.log_mark()
        for n in range(4):
            await call_and_hang_up(proxy, workers, tmp_path / f"caller{n}")
        assert len(other.answered()) == other_before + 4
        assert proxy.count("503 from the last worker") >= 1  # the draining worker's answer
        await logged(drained.server, "sip: INVITE from 127.0.0.1 refused: draining", since=mark)
        assert proxy.count(f"to {proxy.uri(dead)}") >= 1  # tried: timed out (408), passed over
        assert proxy.count("no worker available") == 0
        # both taken out of rotation by the failure route (ds_mark_dst), the other not
        await proxy.wait_logged(f"hotline: worker {proxy.uri(drained.sip_port)} down")
        await proxy.wait_logged(f"hotline: worker {proxy.uri(dead)} down")
        assert proxy.count(f"hotline: worker {proxy.uri(other.sip_port)} down") == 0
        flags = proxy.destinations()
        assert flags[proxy.uri(drained.sip_port)].startswith("I"), flags
        assert flags[proxy.uri(dead)].startswith("I"), flags
        assert flags[proxy.uri(other.sip_port)].startswith("A"), flags
    finally:
        long_call.stop()
        proxy.stop()

"""The sessions contract, run against the in-process store and a real `redis-server`.

Every test gets its own key prefix, so one store (and one server) serves them all. Worker
heartbeats are fast (0.2 s, TTL 0.6 s); waits are on conditions, bounded.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from pipeline.records import TurnRecord
from tests.support.poll import LoopLag, until
from tests.support.redis_server import RedisServer
from voice.cluster.records import NoAck, RegisteredCall, RegistrySettings, UnknownCall, WorkerInfo
from voice.cluster.registry import CallRegistry
from voice.cluster.store import connect

pytestmark = pytest.mark.timeout(60)

HEARTBEAT_S, TTL_S = 0.2, 0.6

Open = Callable[..., Awaitable[CallRegistry]]

# `_: bool = await until(...)`: the annotation is what lets mypy solve the shared `until`'s
# type variable for an async check (tests/support/poll.py).


def turn(n: int) -> dict[str, Any]:
    return TurnRecord(
        turn=n,
        caller_text=f"question {n}",
        reply_text=f"answer {n}",
        generated_text=f"answer {n}",
        interrupted=False,
        effort="low",
        service_tier_requested="priority",
        service_tier_served="priority",
        reason="test",
        timings_ms={"endpoint": 200.0, "first_audio": 700.0 + n},
        started_at=time.time(),
    ).to_dict()


@pytest.fixture(params=["embedded", "redis"])
def settings(request: pytest.FixtureRequest) -> RegistrySettings:
    url = None if request.param == "embedded" else request.getfixturevalue("redis_server").url
    return RegistrySettings(
        redis_url=url,
        key_prefix=f"test-{uuid.uuid4().hex[:8]}",
        heartbeat_s=HEARTBEAT_S,
        worker_ttl_s=TTL_S,
        retention_s=3600,
    )


@pytest.fixture
async def open_worker(settings: RegistrySettings) -> AsyncIterator[Open]:
    """Opens `CallRegistry` for a worker (its own client) and closes them all at the end."""
    opened: list[CallRegistry] = []

    async def open_(
        worker_id: str, capacity: int = 8, start: bool = True, **changes: Any
    ) -> CallRegistry:
        sessions = await CallRegistry.open(
            settings.model_copy(update=changes),
            WorkerInfo(worker_id, f"{worker_id}:8080", capacity),
        )
        opened.append(sessions)
        if start:
            await sessions.start()
        return sessions

    yield open_
    for sessions in opened:
        await sessions.close()


async def states(sessions: CallRegistry, call_id: str) -> list[str]:
    """Every state event of an ended call, in order."""
    return [e["state"] async for e in sessions.watch(call_id) if e["type"] == "state"]


async def test_embedded_store_says_so(open_worker: Open, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, "voice.cluster.registry"):
        a = await open_worker("a")
    assert a.embedded == (a.settings.redis_url is None)
    assert ("in-process store" in caplog.text) == a.embedded
    assert a.healthy


async def test_workers_register_heartbeat_and_expire(open_worker: Open) -> None:
    a, b = await open_worker("a", capacity=3), await open_worker("b")
    workers = {w.worker_id: w for w in await b.workers()}
    assert set(workers) == {"a", "b"}
    assert (workers["a"].address, workers["a"].capacity, workers["a"].draining) == (
        "a:8080",
        3,
        False,
    )

    await a.set_draining(True)
    assert [w.draining for w in await b.workers() if w.worker_id == "a"] == [True]
    assert not (await a.admit(RegisteredCall("c1"))).accepted

    # Alive well past its TTL while it heartbeats; gone within the TTL once it stops.
    first_beat = next(w.heartbeat_at for w in await b.workers() if w.worker_id == "a")
    _: bool = await until(
        lambda: _later_heartbeat(b, "a", first_beat + 2 * TTL_S),
        "a heartbeat of a's written twice its TTL after its first",
        within_s=3 * TTL_S + 1,
    )
    await a.stop()
    stopped = time.monotonic()  # a's last heartbeat reached Redis before this
    looks: list[tuple[float, bool]] = []

    async def gone() -> bool:
        at = time.monotonic()
        present = any(w.worker_id == "a" for w in await b.workers())
        looks.append((at, present))
        return not present

    _ = await until(gone, "a gone from the workers once it stopped", within_s=TTL_S + 1)
    # Its heartbeat expires TTL_S after it was written: every look begun later misses it.
    late = [at - stopped for at, present in looks if present and at >= stopped + TTL_S]
    assert not late, f"still listed {late[-1]:.3f} s after its last heartbeat (TTL {TTL_S} s)"


async def _later_heartbeat(sessions: CallRegistry, worker_id: str, after: float) -> bool:
    return any(
        w.worker_id == worker_id and w.heartbeat_at > after for w in await sessions.workers()
    )


async def _absent(sessions: CallRegistry, worker_id: str) -> bool:
    return worker_id not in {w.worker_id for w in await sessions.workers()}


async def test_call_record_lifecycle_and_retention(open_worker: Open) -> None:
    a, b = await open_worker("a"), await open_worker("b")
    call = RegisteredCall("call-1", "twilio", caller="+15550001", callee="+15550002", arm="B")
    admission = await a.admit(call)
    assert (admission.accepted, admission.reason) == (True, "ok")
    assert await a.flush()

    [listed] = await b.active_calls()
    assert (listed.call_id, listed.worker_id, listed.state, listed.arm) == (
        "call-1",
        "a",
        "active",
        "B",
    )
    assert (listed.caller, listed.callee, listed.transport) == ("+15550001", "+15550002", "twilio")
    assert [w.active_calls for w in await b.workers() if w.worker_id == "a"] in ([0], [1])

    a.update_call("call-1", state="on_hold")
    assert await a.flush()
    found = await b.get_call("call-1")
    assert found is not None and found[0].state == "on_hold" and found[1] == []
    with pytest.raises(UnknownCall):
        a.update_call("nope", state="x")

    a.append_turn("call-1", turn(1))
    a.end_call("call-1")
    assert await a.flush()
    assert await b.active_calls() == []
    found = await b.get_call("call-1")
    assert found is not None
    record, turns = found
    assert record.state == "ended" and record.ended_at is not None
    assert record.ended_at >= record.started_at
    assert [t["turn"] for t in turns] == [1]
    assert await states(b, "call-1") == ["active", "on_hold", "ended"]
    a.append_turn("call-1", turn(2))  # a turn finished after the hang-up is kept too
    assert await a.flush()
    found = await b.get_call("call-1")
    assert found is not None and [t["turn"] for t in found[1]] == [1, 2]
    assert await b.get_call("never") is None

    prefix = a.settings.key_prefix
    for part in ("record", "turns", "events"):
        ttl = await b.redis.ttl(f"{prefix}:call:{{call-1}}:{part}")
        assert 3500 < ttl <= 3600, part


async def test_simultaneous_admissions_respect_cluster_limit(open_worker: Open) -> None:
    a = await open_worker("a", cluster_limit=5)
    b = await open_worker("b", cluster_limit=5)
    arrivals = [(a if i % 2 else b).admit(RegisteredCall(f"c{i}")) for i in range(20)]
    admissions = await asyncio.gather(*arrivals)
    assert sum(x.accepted for x in admissions) == 5
    assert {x.reason for x in admissions if not x.accepted} == {"cluster_full"}
    assert len(await a.active_calls()) == 5

    a.end_call(next(c.call_id for c in await a.active_calls() if c.worker_id == "a"))
    assert await a.flush()
    assert (await b.admit(RegisteredCall("late"))).accepted
    assert not (await b.admit(RegisteredCall("later"))).accepted


async def test_simultaneous_admissions_respect_worker_limit(open_worker: Open) -> None:
    a, b = await open_worker("a", capacity=3), await open_worker("b", capacity=3)
    admissions = await asyncio.gather(
        *(w.admit(RegisteredCall(f"c{i}-{w.worker.worker_id}")) for i in range(10) for w in (a, b))
    )
    assert sum(x.accepted for x in admissions) == 6
    assert {x.reason for x in admissions if not x.accepted} == {"worker_full"}
    owners = [c.worker_id for c in await a.active_calls()]
    assert sorted(owners) == ["a"] * 3 + ["b"] * 3
    assert not (await a.admit(RegisteredCall("c1-a"))).accepted  # already active: not twice


async def test_turns_are_appended_in_order(open_worker: Open) -> None:
    a, b = await open_worker("a"), await open_worker("b")
    await a.admit(RegisteredCall("call-1"))
    records = [turn(n) for n in range(1, 8)]
    for record in records:
        a.append_turn("call-1", record)
    assert await a.flush()
    found = await b.get_call("call-1")
    assert found is not None
    assert found[1] == records


async def test_watch_sees_events_from_another_worker(open_worker: Open) -> None:
    a, b = await open_worker("a"), await open_worker("b")
    await a.admit(RegisteredCall("call-1"))
    events: list[dict[str, Any]] = []

    async def collect() -> None:
        async for event in b.watch("call-1"):
            events.append(event)

    watcher = asyncio.create_task(collect())
    _: bool = await until(lambda: _has(events, "state"), "the watch's first event", within_s=5)
    # (live, before anything else is said)
    a.publish("call-1", {"type": "transcript", "role": "caller", "text": "hello", "final": True})
    a.append_turn("call-1", turn(1))
    a.end_call("call-1")
    await asyncio.wait_for(watcher, 5)  # the watch ends with the call
    assert [e["type"] for e in events] == ["state", "transcript", "turn", "state"]
    assert events[1]["text"] == "hello"
    assert events[2]["record"]["timings_ms"]["first_audio"] == 701.0
    assert [events[0]["state"], events[-1]["state"]] == ["active", "ended"]

    # A late watcher catches up from the start, or resumes after an id.
    assert [e["id"] async for e in b.watch("call-1")] == [e["id"] for e in events]
    assert [e["type"] async for e in b.watch("call-1", since=events[1]["id"])] == ["turn", "state"]


async def _has(events: list[dict[str, Any]], kind: str) -> bool:
    return any(e["type"] == kind for e in events)


async def test_control_reaches_the_owner_and_is_acknowledged(open_worker: Open) -> None:
    a, b = await open_worker("a"), await open_worker("b")
    await a.admit(RegisteredCall("call-1"))
    await a.admit(RegisteredCall("call-2"))
    received: list[tuple[str, str, dict[str, Any]]] = []

    async def owner() -> None:
        async for control in a.control_commands():
            received.append((control.call_id, control.command, control.args))
            await control.ack({"ok": True, "worker": a.worker.worker_id})

    # A command for a call that ends on its owner before the owner reads it: refused there.
    refused = asyncio.create_task(b.send_control("call-2", "hangup", timeout_s=3))
    inbox = f"{a.settings.key_prefix}:control:{{a}}"
    _: bool = await until(lambda: _queued(b, inbox), "the command in a's inbox", within_s=5)
    a.end_call("call-2")
    serving = asyncio.create_task(owner())
    try:
        assert await refused == {"ok": False, "error": "unknown call"}
        result = await b.send_control("call-1", "say", {"text": "one moment"}, timeout_s=3)
        assert result == {"ok": True, "worker": "a"}
        assert received == [("call-1", "say", {"text": "one moment"})]
        assert await a.send_control("call-1", "hangup", timeout_s=3) == {"ok": True, "worker": "a"}
        assert await a.flush()
        for unknown in ("nope", "call-2"):
            with pytest.raises(UnknownCall):
                await b.send_control(unknown, "hangup")
    finally:
        serving.cancel()
    with pytest.raises(NoAck):  # nobody reads the owner's commands any more
        await b.send_control("call-1", "hangup", timeout_s=0.3)


async def _queued(sessions: CallRegistry, key: str) -> bool:
    return bool(await sessions.redis.llen(key))


async def test_reapers_mark_a_dead_workers_calls_lost_exactly_once(open_worker: Open) -> None:
    a = await open_worker("a")
    b, c = await open_worker("b", start=False), await open_worker("c", start=False)
    for call_id in ("call-1", "call-2"):
        await a.admit(RegisteredCall(call_id))
        a.append_turn(call_id, turn(1))
        a.append_turn(call_id, turn(2))
    assert await a.flush()
    await a.stop()  # as good as dead: no more heartbeats
    assert await b.reap() == []  # not expired yet

    _: bool = await until(lambda: _absent(b, "a"), "a's heartbeat expired", within_s=TTL_S + 1)
    claims = await asyncio.gather(*(w.reap() for w in (b, c, b, c, b, c)))
    assert sorted(call for claim in claims for call in claim) == ["call-1", "call-2"]
    assert await b.active_calls() == []
    for call_id in ("call-1", "call-2"):
        found = await c.get_call(call_id)
        assert found is not None
        assert found[0].state == "lost" and found[0].ended_at is not None
        assert [t["turn"] for t in found[1]] == [1, 2]
        assert await states(c, call_id) == ["active", "lost"]


async def test_background_reaper_finds_a_dead_worker_within_twice_the_ttl(
    open_worker: Open,
) -> None:
    b, c = await open_worker("b"), await open_worker("c")  # two live reapers
    a = await open_worker("a")
    await a.admit(RegisteredCall("call-1"))
    a.append_turn("call-1", turn(1))
    assert await a.flush()
    async with LoopLag() as lag:  # the reapers run on this loop: a loaded runner delays them
        await a.stop()
        last_beat = a.worker.heartbeat_at  # wall clock, like the time the reaper writes
        _: bool = await until(
            lambda: _state_is(b, "call-1", "lost"), "call-1 marked lost", within_s=2 * TTL_S + 2
        )
    assert await states(c, "call-1") == ["active", "lost"]
    found = await c.get_call("call-1")
    assert found is not None and [t["turn"] for t in found[1]] == [1]
    # Timed by the registry itself (its beat and the reaper's record), not by this poll.
    assert found[0].ended_at is not None
    lost_after = found[0].ended_at - last_beat
    print(f"\nmarked lost {lost_after:.3f} s after the last heartbeat (TTL {TTL_S} s)")
    bound = 2 * TTL_S + lag.total_s
    assert lost_after <= bound, (
        f"marked lost {lost_after:.3f} s after the last heartbeat (TTL {TTL_S} s, "
        f"the loop was held up {lag.total_s:.3f} s meanwhile)"
    )


async def test_a_restarted_worker_marks_its_previous_calls_lost(open_worker: Open) -> None:
    old = await open_worker("a")
    await old.admit(RegisteredCall("call-1"))
    assert await old.flush()
    await old.stop()  # crashed; restarted at once under the same id, before any reaper ran
    new = await open_worker("a")
    assert await new.active_calls() == []
    assert await _state_is(new, "call-1", "lost")
    assert await states(new, "call-1") == ["active", "lost"]


async def _state_is(sessions: CallRegistry, call_id: str, state: str) -> bool:
    found = await sessions.get_call(call_id)
    return found is not None and found[0].state == state


@pytest.mark.parametrize("fail_open", [False, True], ids=["fails_closed", "fails_open"])
async def test_redis_outage_buffers_turns_and_admits_as_fail_open_says(
    tmp_path: Path, fail_open: bool
) -> None:
    """Turns are buffered through an outage; a new call is refused (or, with `fail_open`,
    admitted) at once: an unreachable Redis costs the admission no socket timeout."""
    server = RedisServer(data_dir=tmp_path)  # persistent: what was written survives the restart
    server.start()
    settings = RegistrySettings(
        redis_url=server.url, heartbeat_s=HEARTBEAT_S, worker_ttl_s=TTL_S, fail_open=fail_open
    )
    a = await CallRegistry.open(settings, WorkerInfo("a"))
    try:
        await a.start()
        assert (await a.admit(RegisteredCall("call-1"))).accepted
        a.append_turn("call-1", turn(1))
        assert await a.flush()

        server.stop()
        for n in (2, 3, 4):
            a.append_turn("call-1", turn(n))  # the call goes on
        a.publish("call-1", {"type": "transcript", "text": "still here"})
        _: bool = await until(lambda: _unhealthy(a), "a sees Redis down", within_s=5)
        started = time.monotonic()
        admission = await a.admit(RegisteredCall("call-2"))
        took = time.monotonic() - started
        # The bound is the registry's own: each Redis command gives up after socket_timeout_s;
        # a refused connection (the server is down) must not wait for that at all.
        assert took < settings.socket_timeout_s, f"admission took {took:.2f} s in the outage"
        assert admission.accepted == fail_open
        if not fail_open:
            assert admission.reason == "redis_unavailable"
        assert not await a.flush(0.2)
        assert a.buffered >= 4

        server.start()
        assert await a.flush(5)
        assert a.healthy
        found = await a.get_call("call-1")
        assert found is not None
        assert [t["turn"] for t in found[1]] == [1, 2, 3, 4]
        expected = ["call-1", "call-2"] if fail_open else ["call-1"]
        _ = await until(lambda: _active_ids(a, expected), f"{expected} active", within_s=5)
        assert (await a.admit(RegisteredCall("call-3"))).accepted
    finally:
        await a.close()
        server.stop()


async def test_a_full_outbox_drops_events_before_turns() -> None:
    server = RedisServer()
    server.start()
    settings = RegistrySettings(redis_url=server.url, heartbeat_s=HEARTBEAT_S, outbox_limit=4)
    a = await CallRegistry.open(settings, WorkerInfo("a"))
    try:
        await a.admit(RegisteredCall("call-1"))
        assert await a.flush()
        server.stop()
        a.publish("call-1", {"type": "transcript", "text": "dropped first"})
        for n in (1, 2, 3, 4):
            a.append_turn("call-1", turn(n))
        a.end_call("call-1")  # 6 writes for 4 places: the event goes, then the oldest turn
        server.start()
        assert await a.flush(5)
        found = await a.get_call("call-1")
        assert found is not None
        assert (found[0].state, [t["turn"] for t in found[1]]) == ("ended", [2, 3, 4])
        types = [e["type"] async for e in a.watch("call-1")]
        assert types == ["turn", "turn", "turn", "state"]
    finally:
        await a.close()
        server.stop()


async def _unhealthy(sessions: CallRegistry) -> bool:
    return not sessions.healthy


async def _active_ids(sessions: CallRegistry, expected: list[str]) -> bool:
    return sorted(c.call_id for c in await sessions.active_calls()) == expected


async def test_redis_restarted_empty_gets_the_calls_back(tmp_path: Path) -> None:
    server = RedisServer()  # no persistence: a restart forgets everything
    server.start()
    settings = RegistrySettings(redis_url=server.url, heartbeat_s=HEARTBEAT_S, worker_ttl_s=TTL_S)
    a = await CallRegistry.open(settings, WorkerInfo("a"))
    try:
        await a.start()
        await a.admit(RegisteredCall("call-1", "webrtc", arm="A"))
        assert await a.flush()
        server.stop()
        a.append_turn("call-1", turn(1))
        server.start()
        _: bool = await until(lambda: _active_ids(a, ["call-1"]), "call-1 listed again", within_s=5)
        _ = await until(lambda: _state_is(a, "call-1", "active"), "call-1 active", within_s=5)
        assert await a.flush(5)
        found = await a.get_call("call-1")
        assert found is not None
        assert (found[0].transport, found[0].arm) == ("webrtc", "A")
        assert [t["turn"] for t in found[1]] == [1]
    finally:
        await a.close()
        server.stop()


def test_cluster_and_sentinel_urls_make_clients() -> None:
    from redis.asyncio.cluster import RedisCluster

    cluster = connect(RegistrySettings(redis_url="redis://10.0.0.1:7000", cluster=True))
    assert isinstance(cluster, RedisCluster)
    sentinel = connect(RegistrySettings(redis_url="redis+sentinel://:pw@h1:26379,h2/mymaster/2"))
    pool: Any = sentinel.connection_pool
    assert (pool.service_name, pool.connection_kwargs["db"]) == ("mymaster", 2)
    assert [
        s.connection_pool.connection_kwargs["host"] for s in pool.sentinel_manager.sentinels
    ] == [
        "h1",
        "h2",
    ]
    with pytest.raises(ValueError):
        connect(RegistrySettings(redis_url="redis+sentinel://h1:26379"))

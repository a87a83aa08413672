"""A real `hotline serve` process on a free loopback port: start it, read its log, stop it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

from tests.support import zygote

# Barge-in's bound is derived from each call itself: tests/support/barge_in.py.


_handed_out: set[int] = set()
PORTS = range(10_000, 20_000)  # outside the kernel's ephemeral range, below Hotline's RTP ports


def worker_ports(worker: str | None, workers: int) -> range:
    """This test process's share of `PORTS`: each pytest-xdist worker ("gw0", "gw1", ...) draws
    from a slice of its own, so that two workers can never hand out the same port (each keeps
    its own `_handed_out`, and a port it checked may be taken by a worker's server before its
    own server binds it); one process alone (no xdist, the serial phase) has them all."""
    if not worker or not worker.startswith("gw") or not worker[2:].isdigit() or workers < 2:
        return PORTS
    size = len(PORTS) // workers
    start = PORTS.start + (int(worker[2:]) % workers) * size
    return range(start, start + size)


def free_port() -> int:
    """A port free for both TCP and UDP on loopback, outside the kernel's ephemeral range (so
    that no process binding port 0 meanwhile, e.g. a server's embedded LLM, can take it), below
    Hotline's RTP ports (20000 and up), and in this xdist worker's own share of them."""
    ports = worker_ports(
        os.environ.get("PYTEST_XDIST_WORKER"),
        int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")),
    )
    for _ in range(200):
        port = random.choice(ports)
        if port in _handed_out:
            continue
        try:
            with (
                socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp,
                socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp,
            ):
                tcp.bind(("127.0.0.1", port))
                udp.bind(("127.0.0.1", port))
        except OSError:
            continue
        _handed_out.add(port)  # never twice from this process: it may not be bound yet
        return port
    raise RuntimeError(f"no free port in {ports.start}-{ports.stop - 1}")


@dataclass(frozen=True)
class LogMark:
    """A place in a server's log, taken before an action (`server.log_mark()`): `logged(server,
    ..., since=mark)` then searches only the lines after it, so a line that an earlier test, case
    or call wrote to a shared server's log cannot satisfy the assertion."""

    line: int


WHOLE_LOG = LogMark(0)  # explicit: search every line (e.g. once the server has stopped)


@dataclass
class Server:
    url: str
    process: subprocess.Popen[str] | zygote.Forked
    log: list[str] = field(default_factory=list)

    def log_mark(self) -> LogMark:
        """Where the log ends now: take it before the action whose lines a test waits for."""
        return LogMark(len(self.log))


def start_server(extra_env: dict[str, str] | None = None, timeout_s: float = 120) -> Server:
    """Run `hotline serve` in a subprocess and return once it accepts requests (on another
    port if the one chosen was taken meanwhile by another test process)."""
    for _ in range(2):
        try:
            return _start_server(extra_env, timeout_s)
        except PortTaken:
            continue
    return _start_server(extra_env, timeout_s)


class PortTaken(RuntimeError):
    """The server's port was taken between choosing it and binding it."""


def _start_server(extra_env: dict[str, str] | None, timeout_s: float) -> Server:
    port = free_port()
    env = {
        **os.environ,
        "HOTLINE_WEBRTC__ICE_HOST_ADDRESSES": '["127.0.0.1"]',
        "HOTLINE_WEBRTC__CONNECT_TIMEOUT_S": "5",
        "HOTLINE_RECORDINGS__DIR": tempfile.mkdtemp(prefix="hotline-recordings-"),
        "PYTHONUNBUFFERED": "1",
        # The warm-up buys a first call nothing measurable here (a cold tiny.en turn took
        # 1.81 s, a warmed one 1.72 s) and costs every start 4 s: a test that times a first
        # call turns it back on.
        "HOTLINE_WARM_UP": "false",
        # The embedded LLM's short replies (about 25 words, 7 s of speech, not a real model's
        # 40-60 words): the tests are about what a call does, not how long its replies run.
        "HOTLINE_SIMULATOR__REPLIES": "short",
        **(extra_env or {}),
    }
    argv = ["serve", "--port", str(port), "--log-level", "info"]
    process: subprocess.Popen[str] | zygote.Forked
    if zygote.enabled():  # forked from a process that has imported Hotline already
        process = zygote.spawn(argv, env)
    else:
        process = subprocess.Popen(
            [sys.executable, "-m", "voice", *argv],
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
    started = time.monotonic()
    ready.wait(timeout_s)
    _account(f"{time.monotonic() - started:.1f}")
    if process.poll() is not None or not any(listening in line for line in server.log):
        process.kill()
        if any(f"('127.0.0.1', {port}): address already in use" in line for line in server.log):
            raise PortTaken(f"port {port} was taken")
        raise RuntimeError("hotline serve did not start:\n" + "\n".join(server.log[-40:]))
    return server


async def logged(
    server: Server,
    *fragments: str,
    since: LogMark | int,
    within_s: float = 10.0,
    times: int = 1,
) -> list[str]:
    """The server's log lines after `since` holding each fragment (the first such line of
    each), once each fragment is in `times` lines or more (the log is read by a thread, so a
    line may arrive a moment after the server wrote it); fails after `within_s` with what the
    log held.

    Take `since` before acting: `mark = server.log_mark()`, act, then `await logged(server,
    "...", since=mark)`. `since=WHOLE_LOG` (or `since=0`) searches every line, on purpose.
    `since` is required: a shared server's log holds earlier tests' lines."""
    start = since.line if isinstance(since, LogMark) else since
    deadline = time.monotonic() + within_s
    while True:
        lines = server.log[start:]
        found = [[line for line in lines if f in line] for f in fragments]
        if all(len(hits) >= times for hits in found):
            return [hits[0] for hits in found]
        if time.monotonic() >= deadline:
            missing = {
                f: len(hits) for f, hits in zip(fragments, found, strict=True) if len(hits) < times
            }
            raise AssertionError(
                f"the server never logged {list(missing)} {times} time(s) after line {start} "
                f"within {within_s:.0f} s (times seen: {missing}); its last lines: {lines[-8:]}"
            )
        await asyncio.sleep(0.05)


def _account(figure: str) -> None:
    """With HOTLINE_TEST_STARTS_LOG set, one line there: `figure` and the test it is for (where
    the suite's time goes: each server's start-up seconds, then its CPU seconds)."""
    if starts := os.environ.get("HOTLINE_TEST_STARTS_LOG"):
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]
        with open(starts, "a") as out:
            out.write(f"{figure} {test}\n")


def stop_server(server: Server) -> int:
    if os.environ.get("HOTLINE_TEST_STARTS_LOG"):  # the CPU the server used
        with contextlib.suppress(OSError), open(f"/proc/{server.process.pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
            _account(f"cpu {(int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK'):.1f}")
    server.process.terminate()
    try:
        return server.process.wait(30)
    except subprocess.TimeoutExpired:
        server.process.kill()
        return server.process.wait()

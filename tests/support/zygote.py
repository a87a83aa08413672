"""Test servers forked from a process that has already imported Hotline.

Importing `voice.server.app` costs about 5 s of CPU (openai, fastapi, pydantic, redis, aiortc,
numpy, opentelemetry), and the suite starts some 40 servers on 2 cores. Each pytest process
therefore starts one zygote (`python -m tests.support.zygote`) that imports Hotline once, with
no thread running, and then forks each `hotline serve` from that warm image: the child takes the
request's argv, environment and working directory, writes its log to the pipe it was handed,
and runs the CLI exactly as `python -m voice` would. The models still load in each child (after
the fork: their thread pools must be the child's own).

`spawn(argv, env, cwd)` returns a `Forked`, which has the part of `subprocess.Popen` the tests
use: `pid`, `stdout`, `poll`, `wait`, `send_signal`, `terminate`, `kill`, `returncode`
(negative for a signal, as Popen reports it). The child is the zygote's, so the zygote reaps it
and reports its exit status over the control socket.

`HOTLINE_TEST_ZYGOTE=0` turns this off: servers are started with `subprocess.Popen`.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

_MAX_MESSAGE = 1 << 20


def enabled() -> bool:
    return os.environ.get("HOTLINE_TEST_ZYGOTE", "1") != "0"


class Forked:
    """A server forked by the zygote: the part of `subprocess.Popen` the tests use."""

    def __init__(self, args: Sequence[str], pid: int, stdout: IO[str]) -> None:
        self.args = list(args)
        self.pid = pid
        self.stdout = stdout
        self.returncode: int | None = None
        self._exited = threading.Event()

    def _exit(self, code: int) -> None:
        self.returncode = code
        self._exited.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """The client side: one zygote per pytest process, started on first use."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._socket = ours
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.zygote", str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            cwd=Path(__file__).resolve().parents[2],  # where `tests` is a package
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        self._lock = threading.Lock()  # one request at a time
        self._started: list[int] = []
        self._started_event = threading.Event()
        self._children: dict[int, Forked] = {}
        self._early_exits: dict[int, int] = {}
        self._closed = threading.Event()
        threading.Thread(target=self._read, name="zygote-reader", daemon=True).start()

    def alive(self) -> bool:
        return self._process.poll() is None and not self._closed.is_set()

    def spawn(self, argv: Sequence[str], env: dict[str, str], cwd: str) -> Forked:
        read_end, write_end = os.pipe()
        try:
            with self._lock:
                self._started_event.clear()
                request = json.dumps({"argv": list(argv), "env": env, "cwd": cwd}).encode()
                socket.send_fds(self._socket, [request], [write_end])
                if not self._started_event.wait(120) or not self._started:
                    code = self._process.poll()
                    raise RuntimeError(f"the test zygote did not fork a server (exit {code})")
                pid = self._started.pop()
                log = open(read_end, encoding="utf-8", errors="replace")  # noqa: SIM115
                forked = Forked(argv, pid, log)
                read_end = -1
                self._children[pid] = forked
                if pid in self._early_exits:
                    forked._exit(self._early_exits.pop(pid))
                return forked
        finally:
            os.close(write_end)
            if read_end >= 0:
                os.close(read_end)

    def _read(self) -> None:
        try:
            while True:
                data = self._socket.recv(_MAX_MESSAGE)
                if not data:
                    break
                message = json.loads(data)
                if "started" in message:
                    self._started.append(int(message["started"]))
                    self._started_event.set()
                elif "exited" in message:
                    pid, code = int(message["exited"]), int(message["code"])
                    with contextlib.suppress(KeyError):
                        self._children[pid]._exit(code)
                        continue
                    self._early_exits[pid] = code  # before `spawn` saw its start
        except OSError:
            pass
        finally:
            self._closed.set()
            self._started_event.set()
            for child in self._children.values():  # the zygote is gone: so is their reaper
                if child.returncode is None:
                    child._exit(-int(signal.SIGKILL))


_zygote: Zygote | None = None
_zygote_lock = threading.Lock()


def zygote() -> Zygote:
    """This process's zygote (started now if it is not running)."""
    global _zygote
    with _zygote_lock:
        if _zygote is None or not _zygote.alive():
            _zygote = Zygote()
        return _zygote


def spawn(argv: Sequence[str], env: dict[str, str], cwd: str | None = None) -> Forked:
    """Fork `python -m voice` with `argv` (its arguments), `env` and `cwd` from the zygote."""
    return zygote().spawn(argv, env, cwd or os.getcwd())


# --- the zygote itself (`python -m tests.support.zygote FD`) ---------------------------------


def _serve(control: socket.socket) -> None:
    # the imports this process exists to share
    import voice.cli.main
    import voice.server.app  # noqa: F401

    if threading.active_count() != 1:  # a thread would be missing in every child
        names = [t.name for t in threading.enumerate()]
        raise RuntimeError(f"the test zygote has threads after its imports: {names}")
    woken_read, woken_write = os.pipe()
    os.set_blocking(woken_write, False)
    signal.set_wakeup_fd(woken_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(control, selectors.EVENT_READ, "control")
    selector.register(woken_read, selectors.EVENT_READ, "child")
    children: set[int] = set()
    try:
        while True:
            for key, _ in selector.select():
                if key.data == "child":
                    with contextlib.suppress(BlockingIOError):
                        os.read(woken_read, 4096)
                    _reap(control, children)
                    continue
                message, fds, _flags, _address = socket.recv_fds(control, _MAX_MESSAGE, 1)
                if not message:
                    return
                pid = os.fork()
                if pid == 0:
                    os.close(woken_read)
                    os.close(woken_write)
                    _child(control, json.loads(message), fds[0])
                children.add(pid)
                for fd in fds:
                    os.close(fd)
                control.send(json.dumps({"started": pid}).encode())
                _reap(control, children)
    finally:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)


def _reap(control: socket.socket, children: set[int]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        code = os.waitstatus_to_exitcode(status)
        control.send(json.dumps({"exited": pid, "code": code}).encode())


def _child(control: socket.socket, request: dict[str, Any], out: int) -> None:
    """In the forked child: become `python -m voice ARGV`; never returns."""
    code = 1
    try:
        control.close()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        os.close(devnull)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = ["voice", *request["argv"]]
        import numpy as np

        np.random.seed()  # the zygote's state would be every child's

        from voice.cli.main import app

        try:
            app()
            code = 0
        except SystemExit as exit_:
            if exit_.code is None or isinstance(exit_.code, int):
                code = exit_.code or 0
            else:
                print(exit_.code, file=sys.stderr)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    _serve(socket.socket(fileno=int(sys.argv[1])))

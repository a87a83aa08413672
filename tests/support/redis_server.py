"""A real `redis-server` on a free loopback port, for tests; can be stopped and restarted."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import redis

from tests.support.server import free_port

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


class RedisServer:
    """`redis-server` without persistence, or with an append-only file in `data_dir`."""

    def __init__(self, data_dir: Path | None = None) -> None:
        self.port = free_port()
        self.data_dir = data_dir
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> None:
        """Start (again, on the same port) and return once it answers PING."""
        persistence = (
            ["--dir", str(self.data_dir), "--appendonly", "yes", "--appendfsync", "always"]
            if self.data_dir is not None
            else ["--appendonly", "no"]
        )
        command = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        self.process = subprocess.Popen(
            [*command, *persistence], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        client = redis.Redis(port=self.port, socket_timeout=0.5, socket_connect_timeout=0.5)
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                try:
                    if client.ping():
                        return
                except redis.ConnectionError:
                    if self.process.poll() is not None or time.monotonic() > deadline:
                        self.stop()
                        raise RuntimeError(f"redis-server did not start on {self.port}") from None
                time.sleep(0.02)
        finally:
            client.close()

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

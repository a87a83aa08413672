"""Debian's Kamailio as the SIP dispatcher in tests: deploy/kamailio/kamailio.cfg as shipped, in
the foreground (-DD, logging to stderr with -E), on a free loopback UDP port, with a dispatcher
list of the given workers and a runtime directory of its own (its kamcmd socket)."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.poll import PollTimeout, until, wait_until
from tests.support.server import free_port

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "deploy" / "kamailio" / "kamailio.cfg"
SBIN = ("/usr/sbin", "/usr/local/sbin")  # not on every user's PATH


def _which(name: str) -> str | None:
    return shutil.which(name) or next(
        (f"{d}/{name}" for d in SBIN if Path(f"{d}/{name}").exists()), None
    )


def kamailio_installed() -> bool:
    return _which("kamailio") is not None and _which("kamcmd") is not None


@dataclass
class Kamailio:
    """One kamailio process dispatching over `workers` (SIP ports on 127.0.0.1), set 1."""

    workers: list[int]
    port: int = field(default_factory=free_port)
    ping_interval_s: int = 1  # 0: no OPTIONS probes
    # 9: inactive and probing, as in deploy/kamailio/dispatcher.list: no calls to a worker until
    # its first OPTIONS probe is answered 200. 8: active from the start.
    flags: int = 9
    process: subprocess.Popen[str] | None = None
    log: list[str] = field(default_factory=list)
    runtime: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="kam-")))

    @property
    def control(self) -> str:
        # a short path of its own: a unix socket's path must fit in 108 bytes
        return f"unix:{self.runtime}/ctl"

    @staticmethod
    def uri(port: int) -> str:
        return f"sip:127.0.0.1:{port}"

    def start(self, timeout_s: float = 15.0) -> None:
        listed = self.runtime / "dispatcher.list"
        listed.write_text(
            "".join(
                f"1 {self.uri(port)} {self.flags} 0 duid=w{i}\n"
                for i, port in enumerate(self.workers)
            ),
            encoding="utf-8",
        )
        kamailio = _which("kamailio")
        assert kamailio is not None
        defines = {
            "LISTEN": f"udp:127.0.0.1:{self.port}",
            "DISPATCHER_LIST": f'"{listed}"',
            "CTL_SOCKET": f'"{self.control}"',
            "PING_INTERVAL": str(self.ping_interval_s),
            "CHILDREN": "2",
        }
        command = [kamailio, "-DD", "-E", "-f", str(CONFIG), "-Y", str(self.runtime)]
        command += ["-m", "32", "-M", "4"]  # MB of shared and per-process memory
        for name, value in defines.items():
            command += ["-A", f"{name}={value}"]
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

        def pump() -> None:
            assert self.process is not None and self.process.stdout is not None
            for line in self.process.stdout:
                self.log.append(line.rstrip())

        threading.Thread(target=pump, daemon=True).start()
        process = self.process

        def up() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"kamailio exited {process.returncode}")
            return (self.runtime / "ctl").exists()  # made by the ctl module once it is up

        try:
            wait_until(up, "kamailio's control socket", timeout_s)
        except (PollTimeout, RuntimeError) as failed:
            self.stop()
            tail = "\n".join(self.log[-30:])
            raise RuntimeError(f"kamailio did not start ({failed}):\n{tail}") from None

    def count(self, fragment: str) -> int:
        return sum(fragment in line for line in list(self.log))

    async def wait_logged(self, fragment: str, times: int = 1, within_s: float = 15.0) -> None:
        """Until `fragment` is in `times` lines of the log (its xlog lines say what it did)."""
        try:
            await until(
                lambda: self.count(fragment) >= times, f"kamailio to log {fragment!r}", within_s
            )
        except PollTimeout as timeout:
            tail = "\n".join(self.log[-30:])
            seen = self.count(fragment)
            raise AssertionError(
                f"{timeout}; {seen} of {times} time(s); its last lines:\n{tail}"
            ) from None

    def destinations(self) -> dict[str, str]:
        """`kamcmd dispatcher.list`: each destination's URI and its flags (AP: active and
        probed; IP: inactive, probed)."""
        kamcmd = _which("kamcmd")
        assert kamcmd is not None
        listed = subprocess.run(
            [kamcmd, "-s", self.control, "dispatcher.list"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
        return dict(re.findall(r"URI: (\S+)\s+FLAGS: (\S+)", listed))

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        shutil.rmtree(self.runtime, ignore_errors=True)

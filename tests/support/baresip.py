"""Debian's baresip as a SIP caller in tests: a real softphone in its own process, speaking a WAV
file (aufile), recording what it hears (sndfile's dump of decoded audio), driven over its TCP
control socket (ctrl_tcp: netstring JSON commands: dial, hangup, send DTMF)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import socket
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.transport import PCM, SAMPLE_RATE
from tests.support.poll import PollTimeout, until, wait_until
from tests.support.server import free_port
from voice.audio import resample, write_wav

MODULES = Path("/usr/lib/baresip/modules")


class PortTaken(Exception):
    """One of baresip's ports was taken between choosing it and binding it."""


def baresip_installed() -> bool:
    return shutil.which("baresip") is not None and MODULES.is_dir()


@dataclass
class Baresip:
    """One baresip process with one account, from `directory`."""

    directory: Path
    speech: PCM  # what the caller says (16 kHz; played once from the answer on, then silence)
    local_ip: str = "127.0.0.1"
    user: str = "caller"
    answer: bool = False  # answer incoming calls at once (a person's phone, for transfers)
    auth: tuple[str, str] | None = None  # digest user and password, when challenged
    control_port: int = field(default_factory=free_port)
    sip_port: int = field(default_factory=free_port)
    process: subprocess.Popen[str] | None = None
    log: list[str] = field(default_factory=list)

    def start(self) -> None:
        """Start baresip; on a port taken meanwhile (another test process), on fresh ports."""
        for _ in range(3):
            try:
                self._start()
                return
            except PortTaken:
                self.stop()
                self.log.clear()
                self.control_port, self.sip_port = free_port(), free_port()
        raise RuntimeError("baresip found no free port in three tries")

    def _start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        dumps = self.directory / "dumps"
        dumps.mkdir(exist_ok=True)
        wav = self.directory / "say.wav"
        write_wav(wav, resample(self.speech, SAMPLE_RATE, 8000), rate=8000)  # aufile: 8 kHz
        (self.directory / "config").write_text(
            "\n".join(
                [
                    "poll_method epoll",
                    f"sip_listen {self.local_ip}:{self.sip_port}",
                    f"audio_source aufile,{wav}",
                    f"net_interface {self.local_ip}",
                    "audio_player aubridge,sink",
                    "audio_alert aubridge,sink",
                    "audio_srate 8000",
                    "audio_channels 1",
                    "rtp_tos 0",
                    f"snd_path {dumps}",
                    f"module_path {MODULES}",
                    "module g711.so",
                    "module aufile.so",
                    "module aubridge.so",
                    "module sndfile.so",
                    "module_app account.so",
                    "module_app menu.so",
                    "module_app ctrl_tcp.so",
                    f"ctrl_tcp_listen 127.0.0.1:{self.control_port}",
                    "",
                ]
            ),
            encoding="utf-8",
        )
        (self.directory / "accounts").write_text(
            f"<sip:{self.user}@{self.local_ip}:{self.sip_port}>;regint=0;audio_codecs=PCMU,PCMA"
            + (";answermode=auto" if self.answer else "")
            + (f";auth_user={self.auth[0]};auth_pass={self.auth[1]}" if self.auth else "")
            + "\n",
            encoding="utf-8",
        )
        self.process = subprocess.Popen(
            ["baresip", "-f", str(self.directory), "-v"],
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

        def listening() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"baresip exited {process.returncode}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.control_port), timeout=0.5),
            ):
                return True
            return False

        try:
            wait_until(listening, "baresip's control socket", 10)
        except (PollTimeout, RuntimeError) as failed:
            if process.poll() is not None and self.logged("Address already in use"):
                raise PortTaken from None
            tail = "\n".join(self.log[-30:])
            raise RuntimeError(f"baresip did not start ({failed}):\n{tail}") from None

    async def command(self, command: str, params: str = "") -> dict[str, object]:
        """One ctrl_tcp command and its response."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.control_port)
        try:
            body = json.dumps({"command": command, "params": params, "token": "t"}).encode()
            writer.write(str(len(body)).encode() + b":" + body + b",")
            await writer.drain()
            async with asyncio.timeout(10):
                while True:
                    length = int((await reader.readuntil(b":"))[:-1])
                    message = json.loads((await reader.readexactly(length + 1))[:-1])
                    if message.get("response"):
                        result: dict[str, object] = message
                        return result
        finally:
            writer.close()

    def logged(self, fragment: str) -> bool:
        return any(fragment in line for line in self.log)

    async def wait_logged(self, fragment: str, within_s: float = 20.0) -> None:
        """Until baresip's log has `fragment` (its own event lines: call established, closed);
        fails with its last lines."""
        try:
            await until(lambda: self.logged(fragment), f"baresip to log {fragment!r}", within_s)
        except PollTimeout as timeout:
            tail = "\n".join(self.log[-30:])
            raise AssertionError(f"{timeout}; its last lines:\n{tail}") from None

    def heard(self) -> Path | None:
        """The WAV of decoded audio baresip received (sndfile's dump), once written."""
        found = sorted((self.directory / "dumps").glob("dump-*-dec.wav"))
        return found[-1] if found else None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)

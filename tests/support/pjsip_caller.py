"""PJSIP (pjsua2, PJSIP's own Python binding from PyPI) as a real SIP caller in tests: one call
with a late offer (PJSUA_CALL_NO_SDP_OFFER: an INVITE without SDP, the answer in the ACK), PCMA
only, playing a WAV into the call and recording what it hears.

It runs in a process of its own (`PjsipCaller`: `python -m tests.support.pjsip_caller TARGET
PLAY RECORD LONGEST_S`): pjsua2 drives its own event loop and audio clock, which must not share
pytest's. It hangs up when a line comes on its stdin, then prints one JSON line: how the call
went, and the SIP messages it sent and received."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

DIRECTIONS = ("TX", "RX")  # how PJSIP's log marks a message it sent or received


@dataclass(frozen=True)
class PjsipCall:
    confirmed: bool  # the call reached CONFIRMED (the ACK went out)
    media: bool  # its audio became active
    status: int | None  # the last SIP status of the call
    messages: list[str]  # SIP messages PJSIP sent ("TX\n" and the text) and received ("RX\n...")

    def message(self, direction: str, first_line: str) -> str:
        """The first message sent ("TX") or received ("RX") whose start line begins so."""
        for text in self.messages:
            if text.startswith(direction) and _start_line(text).startswith(first_line):
                return text
        seen = [(text[:2], _start_line(text)) for text in self.messages]
        raise AssertionError(f"no {direction} {first_line!r} among {seen}")


def _start_line(logged: str) -> str:
    lines = logged.splitlines()
    return lines[1] if len(lines) > 1 else ""


def body(logged: str) -> str:
    """The body of a logged SIP message ('' when it has none)."""
    text = "\n".join(logged.splitlines()[1:])
    _, _, rest = text.partition("\n\n")
    return rest.split("--end msg--")[0].strip()


class PjsipCaller:
    """The caller's process: `start` dials; `hang_up` ends the call and returns how it went."""

    def __init__(self, target: str, play: Path, record: Path, longest_s: float = 60.0) -> None:
        self.args = [target, str(play), str(record), str(longest_s)]
        self.longest_s = longest_s
        self.process: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.support.pjsip_caller",
            *self.args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=Path(__file__).parents[2],
        )

    async def hang_up(self) -> PjsipCall:
        process = self.process
        assert process is not None and process.stdin is not None, "start() first"
        process.stdin.write(b"hangup\n")
        with contextlib.suppress(ConnectionError):
            await process.stdin.drain()
        out, err = await asyncio.wait_for(process.communicate(), self.longest_s + 30)
        lines = [line for line in out.decode().splitlines() if line.startswith("{")]
        if not lines:
            raise AssertionError(f"pjsua2 caller exited {process.returncode}: {err[-2000:]!r}")
        return PjsipCall(**json.loads(lines[-1]))

    def kill(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.kill()


def recorded(record: Path) -> npt.NDArray[np.int16]:
    """What the caller heard (16 kHz): PJSIP writes the WAV header's lengths only when its
    recorder is destroyed, which the caller's process skips (below), so the data is read as it
    follows the 44-byte header."""
    return np.frombuffer(record.read_bytes()[44:], dtype=np.int16)


def _hung_up() -> bool:
    """The test asked for the hang-up (a line on stdin, or stdin closed)."""
    ready, _, _ = select.select([sys.stdin], [], [], 0)
    return bool(ready)


def _run(target: str, play: str, record: str, seconds: float) -> None:
    import pjsua2 as pj  # type: ignore[import-not-found]

    messages: list[str] = []

    class Messages(pj.LogWriter):  # type: ignore[misc]
        def write(self, entry: Any) -> None:
            # "22:09:43.106  pjsua_core.c  ....TX 573 bytes Request msg INVITE/cseq=...:\n...";
            # a "!" in place of a dot marks a line logged after a gap
            head, _, text = str(entry.msg).partition("\n")
            words = head.split()
            if len(words) > 2 and (direction := words[2].lstrip(".!")) in DIRECTIONS:
                messages.append(f"{direction}\n{text}")

    endpoint = pj.Endpoint()
    endpoint.libCreate()
    config = pj.EpConfig()
    config.uaConfig.threadCnt = 0
    config.uaConfig.mainThreadOnly = True
    writer = Messages()
    config.logConfig.writer = writer
    config.logConfig.level = config.logConfig.consoleLevel = 4
    config.logConfig.msgLogging = True
    config.medConfig.noVad = True
    endpoint.libInit(config)
    transport = pj.TransportConfig()
    transport.boundAddress = transport.publicAddress = "127.0.0.1"
    endpoint.transportCreate(pj.PJSIP_TRANSPORT_UDP, transport)
    endpoint.libStart()
    endpoint.audDevManager().setNullDev()  # no sound card: the conference bridge's clock
    for codec in endpoint.codecEnum2():
        endpoint.codecSetPriority(codec.codecId, 255 if codec.codecId.startswith("PCMA") else 0)
    account_config = pj.AccountConfig()
    account_config.idUri = "sip:pjsip-caller@127.0.0.1"
    account_config.mediaConfig.transportConfig.boundAddress = "127.0.0.1"
    account = pj.Account()
    account.create(account_config)
    player = pj.AudioMediaPlayer()
    player.createPlayer(play, pj.PJMEDIA_FILE_NO_LOOP)
    recorder = pj.AudioMediaRecorder()
    recorder.createRecorder(record)
    state: dict[str, Any] = {"confirmed": False, "media": False, "status": None, "over": False}

    class Call(pj.Call):  # type: ignore[misc]
        def onCallState(self, prm: Any) -> None:
            info = self.getInfo()
            state["status"] = info.lastStatusCode
            state["confirmed"] |= info.state == pj.PJSIP_INV_STATE_CONFIRMED
            state["over"] |= info.state == pj.PJSIP_INV_STATE_DISCONNECTED

        def onCallMediaState(self, prm: Any) -> None:
            info = self.getInfo()  # held: its media vector dies with it (SWIG)
            for index, media in enumerate(info.media):
                if media.type == pj.PJMEDIA_TYPE_AUDIO and (
                    media.status == pj.PJSUA_CALL_MEDIA_ACTIVE
                ):
                    audio = self.getAudioMedia(index)
                    player.startTransmit(audio)
                    audio.startTransmit(recorder)
                    state["media"] = True

    call = Call(account)
    late = pj.CallOpParam(True)
    late.opt.flag = pj.PJSUA_CALL_NO_SDP_OFFER
    call.makeCall(target, late)
    until = time.monotonic() + seconds
    while time.monotonic() < until and not state["over"] and not _hung_up():
        endpoint.libHandleEvents(20)
    if not state["over"]:
        call.hangup(pj.CallOpParam(True))
        until = time.monotonic() + 5
        while time.monotonic() < until and not state["over"]:
            endpoint.libHandleEvents(20)
    result = {k: state[k] for k in ("confirmed", "media", "status")} | {"messages": messages}
    print(json.dumps(result), flush=True)
    # pjsua2's teardown asserts (SIGABRT) when Python frees the endpoint before the call, the
    # player and the account: end here, with every object still alive.
    os._exit(0)


if __name__ == "__main__":
    _run(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]))

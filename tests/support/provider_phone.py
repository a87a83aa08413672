"""A small scripted test phone that plays a provider's part on one media websocket: the start
message(s), one 20 ms frame of caller audio every 20 ms of the absolute clock (the phone's own
timeline), every mark (Vonage: notify) echoed as soon as it arrives, and the provider's hang-up.
The message shapes come from a `Wire` per provider (tests/support/providers.py)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import numpy as np
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from tests.support.poll import PollTimeout, until
from tests.support.providers import PCM, Heard, Message, Wire
from voice.devtools.turns import voiced_span

_FRAME_S = 0.02


@dataclass
class Spoken:
    """When an utterance's speech went out (monotonic send times of its first/last voiced
    frames; `end` is after the last one)."""

    onset: float
    end: float


@dataclass
class _Utterance:
    frames: list[PCM]
    first: int
    last: int
    done: asyncio.Future[Spoken]
    sent: list[float] = field(default_factory=list)


class TestPhone:
    """The provider's side of one media websocket, scripted by the test."""

    __test__ = False  # not a test class

    def __init__(self, socket: ClientConnection, wire: Wire) -> None:
        self.socket = socket
        self.wire = wire
        self.heard: list[Heard] = []
        self.echoed: list[tuple[float, str]] = []
        self.withheld: list[str] = []  # marks heard while echoes were held, never echoed
        self._holding = False
        self.closed = asyncio.Event()
        self._lock = asyncio.Lock()
        self._mic: list[_Utterance] = []
        self._stopped = False
        self._tasks: list[asyncio.Task[None]] = []

    async def send(self, build: Callable[[], Message | None]) -> None:
        """Build and send one message; built under the lock so sequence numbers stay in order."""
        async with self._lock:
            if self._stopped:
                return
            message = build()
            if message is not None:
                await self.socket.send(message)

    async def send_last(self, build: Callable[[], Message | None]) -> None:
        """Send one message and nothing after it: no more audio, echoes or hang-up. A server
        that refuses the message may close at once with the rest of it unread, which resets the
        connection; a write of ours after that reset would make the client drop the server's
        close frame unread (a close code of 1006 instead of the one the server sent)."""
        async with self._lock:
            if self._stopped:
                return
            self._stopped = True
            message = build()
            if message is not None:
                await self.socket.send(message)

    def hold_echoes(self) -> None:
        """From now on, echo no mark: as if the audio before it had not played yet when the
        caller cut in. Every echo sent so far went out before anything said after this call,
        so the server has counted each of them before it can hear the caller cut in."""
        self._holding = True

    @contextlib.asynccontextmanager
    async def call(self, hang_up: bool = True) -> AsyncIterator[TestPhone]:
        """Open the stream, run the clock and the ear; on exit hang up as the provider does
        (unless `hang_up` is False: then the socket just closes) if still connected."""
        for message in self.wire.opening():
            await self.socket.send(message)
        self._tasks = [asyncio.create_task(self._clock()), asyncio.create_task(self._listen())]
        try:
            yield self
        finally:
            with contextlib.suppress(ConnectionClosed):
                if hang_up:
                    await self.send(self.wire.hang_up)
                self._stopped = True
                await self.socket.close()
            for task in self._tasks:
                task.cancel()
            results = await asyncio.gather(*self._tasks, return_exceptions=True)
            for result in results:
                if isinstance(result, Exception):
                    raise result

    def say(self, pcm: PCM) -> asyncio.Future[Spoken]:
        """Queue an utterance (16 kHz) on the microphone."""
        first, last = voiced_span(pcm)
        done: asyncio.Future[Spoken] = asyncio.get_running_loop().create_future()
        self._mic.append(_Utterance(self.wire.wire_frames(pcm), first, last, done))
        return done

    async def _clock(self) -> None:
        """One frame every 20 ms of the absolute clock: the microphone, else silence."""
        start = time.monotonic()
        tick = 0
        silent = np.zeros(self.wire.frame_samples, dtype=np.int16)
        with contextlib.suppress(ConnectionClosed):
            while not self._stopped:
                delay = start + tick * _FRAME_S - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                tick += 1
                frame = silent
                if self._mic:
                    spoken = self._mic[0]
                    frame = spoken.frames[len(spoken.sent)]
                    spoken.sent.append(time.monotonic())
                    if len(spoken.sent) == len(spoken.frames):
                        self._mic.pop(0)
                        onset, last = spoken.sent[spoken.first], spoken.sent[spoken.last]
                        spoken.done.set_result(Spoken(onset, last + _FRAME_S))
                await self.send(lambda frame=frame: self.wire.media(frame))

    async def _listen(self) -> None:
        try:
            async for raw in self.socket:
                heard = self.wire.read(raw, time.monotonic())
                self.heard.append(heard)
                if heard.kind == "mark" and self._holding:
                    self.withheld.append(heard.name)
                elif heard.kind == "mark":
                    self.echoed.append((time.monotonic(), heard.name))  # before a hold can come
                    await self.send(lambda name=heard.name: self.wire.echo(name))
                elif heard.kind == "clear":
                    self._holding = False  # what was held was cleared, unheard
                    for message in self.wire.on_clear():
                        await self.send(lambda message=message: message)
        except ConnectionClosed:
            pass
        finally:
            self.closed.set()

    async def wait(self, what: str, test: Callable[[Heard], bool], within_s: float) -> Heard:
        """The first message heard that passes `test` (already heard, or a later one); fails
        at once if the socket closes first, or after `within_s` with the kinds heard so far."""

        def check() -> list[Heard]:
            found = [h for h in self.heard if test(h)][:1]
            if not found and self.closed.is_set():
                raise AssertionError(f"the socket closed before {what}")
            return found

        try:
            (found,) = await until(check, what, within_s, every_s=0.02)
            return found
        except PollTimeout as timeout:
            kinds = Counter(h.kind for h in self.heard)
            raise AssertionError(f"{timeout}; heard so far: {dict(kinds)}") from None

    def after(self, kind: str, at: float) -> list[Heard]:
        return [h for h in self.heard if h.kind == kind and h.at > at]

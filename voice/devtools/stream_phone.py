"""The provider's side of a phone media websocket, as a scripted caller plays it: what Twilio,
Telnyx and Vonage share (`voice.devtools.phone_caller` is Twilio's, `voice.devtools.provider_phones`
Telnyx's and Vonage's; each only builds and reads its own messages).

The phone sends one 20 ms frame of the caller's microphone every 20 ms of the absolute clock and
a key press when one is queued. The server's audio goes into a playout buffer that the phone
plays at its wire rate; a mark comes back only once everything queued before it has played, and
a clear empties the buffer and sends every pending mark back at once. Times are taken at the
phone, from what it *played* (`Ear`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Coroutine
from typing import Any

import numpy as np
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from pipeline.transport import PCM
from voice.audio import rms
from voice.devtools.microphone import Microphone
from voice.devtools.turns import AUDIBLE_RMS, Ear, FrameTest

log = logging.getLogger(__name__)

Message = str | bytes


class StreamPhone:
    """One provider media websocket, the phone's end: the caller's microphone and the speaker.
    Subclasses say how the provider's messages look (`open`, `media_message`, `dtmf_message`,
    `mark_message`, `stop_message`, `receive`)."""

    wire_rate = 8000

    def __init__(self, socket: ClientConnection, line_noise_dbfs: float | None = None) -> None:
        self.socket = socket
        self.frame_samples = self.wire_rate // 50  # 20 ms
        self.ear = Ear(self.wire_rate)  # played frames, as voice/devtools/turns.py measures
        self.marks_echoed: list[tuple[float, str]] = []
        self.hung_up = asyncio.Event()
        self._stopped = False
        self._send_lock = asyncio.Lock()
        self.mic = Microphone(self.wire_rate, line_noise_dbfs)
        self._playout: deque[PCM] = deque()
        self._fed: list[bool] = []  # per tick played: whether the buffer had audio for it
        self._queued = 0  # reply samples received (the position after the last one)
        self._played = 0  # reply samples whose playing has finished
        self._playing = 0  # samples in the frame playing now
        self._marks: deque[tuple[int, str]] = deque()  # (position, name) waiting to be played

    # -- what each provider says its own way ---------------------------------------------------

    async def open(self) -> None:
        """The provider's first messages."""
        raise NotImplementedError

    def media_message(self, frame: PCM, now: float) -> Message:
        raise NotImplementedError

    def dtmf_message(self, digit: str) -> Message | None:
        return None

    def mark_message(self, name: str) -> Message:
        raise NotImplementedError

    def stop_message(self) -> Message | None:
        return None  # the socket simply closes

    async def receive(self, raw: Message, at: float) -> None:
        """One server message: its audio to `queue_audio`, marks to `mark_received`, a clear to
        `cleared`."""
        raise NotImplementedError

    # -- the caller's side ----------------------------------------------------------------

    def say(self, pcm: PCM) -> asyncio.Future[list[float]]:
        """Queue an utterance (16 kHz); the future gives the time each 20 ms frame was sent."""
        return self.mic.say(pcm)

    def press(self, digits: str) -> asyncio.Future[None]:
        """Queue key presses, one per 20 ms; the future is done once all went."""
        return self.mic.press(digits)

    async def hang_up(self) -> None:
        """Say so (where the provider does) and close, as the provider does when the caller
        hangs up."""
        stop = self.stop_message()
        if not self.hung_up.is_set() and stop is not None:
            with contextlib.suppress(ConnectionClosed):
                await self.send(stop, last=True)
        await self.socket.close()

    async def send(self, message: Message, last: bool = False) -> None:
        async with self._send_lock:
            if self._stopped:
                return  # nothing follows the provider's stop
            self._stopped = last
            await self.socket.send(message)

    async def hear(self, predicate: FrameTest, within_s: float) -> float | None:
        """Wait for `predicate` over the played frames; None on timeout or hang-up."""
        return await self.ear.wait_or_hang_up(predicate, within_s, self.hung_up)

    # -- the clock: one 20 ms frame each way ------------------------------------------------

    async def run(self) -> None:
        """Tick every 20 ms of the absolute clock until the socket closes."""
        start = time.monotonic()
        tick = 0
        try:
            while True:
                delay = start + tick * 0.02 - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                await self._tick(time.monotonic())
                tick += 1
        except ConnectionClosed:
            pass
        finally:
            self.hung_up.set()

    async def _tick(self, now: float) -> None:
        self._played += self._playing  # the frame started last tick has finished playing
        self._playing = 0
        while self._marks and self._marks[0][0] <= self._played:
            await self._echo(self._marks.popleft()[1])
        self._play_next(now)
        await self.send(self.media_message(self.mic.next_frame(now), now))
        if (pressed := self.mic.next_key()) is not None:
            digit, done = pressed
            key = self.dtmf_message(digit)
            if key is not None:
                await self.send(key)
            if done is not None and not done.done():
                done.set_result(None)

    def _play_next(self, now: float) -> None:
        """Start playing the next 20 ms of the playout buffer (silence when it runs dry)."""
        size = self.frame_samples
        frame = np.zeros(size, dtype=np.int16)
        filled = 0
        while filled < size and self._playout:
            head = self._playout[0]
            take = min(size - filled, len(head))
            frame[filled : filled + take] = head[:take]
            filled += take
            if take == len(head):
                self._playout.popleft()
            else:
                self._playout[0] = head[take:]
        self._playing = filled
        self._fed.append(filled > 0)
        self.ear.record(now, filled > 0 and rms(frame) > AUDIBLE_RMS, frame)

    async def _echo(self, name: str) -> None:
        await self.send(self.mark_message(name))
        self.marks_echoed.append((time.monotonic(), name))

    # -- what the server sends --------------------------------------------------------------

    async def listen(self) -> None:
        """Receive the server's messages until the socket closes."""
        try:
            async for raw in self.socket:
                await self.receive(raw, time.monotonic())
        except ConnectionClosed:
            pass
        finally:
            self.hung_up.set()

    def queue_audio(self, pcm: PCM) -> None:
        """Reply audio at the wire rate, played after what is queued."""
        self._playout.append(pcm)
        self._queued += len(pcm)

    async def mark_received(self, name: str) -> None:
        """A mark: echoed once what was queued before it has played."""
        if self._queued == self._played:
            await self._echo(name)  # nothing left to play: straight back
        else:
            self._marks.append((self._queued, name))

    async def cleared(self) -> None:
        """Empty the playout buffer; every pending mark goes back at once."""
        self._playout.clear()
        self._playing = 0
        self._queued = self._played
        while self._marks:
            await self._echo(self._marks.popleft()[1])


async def talk(
    phone: StreamPhone, linger_s: float, conversation: Coroutine[Any, Any, None]
) -> bool:
    """Run the phone's clock and ear and the caller's `conversation` until it ends (and then
    `linger_s` more) or the server hangs up, then hang up; True if the server ended the stream
    first."""
    clock = asyncio.create_task(phone.run())
    ear = asyncio.create_task(phone.listen())
    script = asyncio.create_task(conversation)
    ended = asyncio.create_task(phone.hung_up.wait())
    try:
        await asyncio.wait({script, ended}, return_when=asyncio.FIRST_COMPLETED)
        for part in (script, clock, ear):
            if part.done():
                part.result()  # a failure in the phone itself is raised, not hidden
        server_ended = not script.done()
        if not server_ended and linger_s > 0:
            await asyncio.wait({ended}, timeout=linger_s)
            server_ended = ended.done()
        if server_ended:
            log.info("the server ended the stream")
        await phone.hang_up()
        return server_ended
    finally:
        for task in (script, ended, clock, ear):
            task.cancel()
        await asyncio.gather(script, ended, clock, ear, return_exceptions=True)

"""What an `RtpSession` hands its callbacks in a test: audio frames and keys, awaitable until
enough has come."""

from __future__ import annotations

import asyncio

from voice.audio import PCM

WAIT_S = 5.0


class Inbox:
    """A session's `on_audio` and `on_dtmf`, kept; `frames(n)` waits (up to `WAIT_S`) for n."""

    def __init__(self) -> None:
        self.audio: list[PCM] = []
        self.digits: list[str] = []
        self._arrived = asyncio.Event()

    def on_audio(self, pcm: PCM, at: float) -> None:
        self.audio.append(pcm)
        self._arrived.set()

    def on_dtmf(self, digit: str, at: float) -> None:
        self.digits.append(digit)
        self._arrived.set()

    async def frames(self, count: int) -> list[PCM]:
        async with asyncio.timeout(WAIT_S):
            while len(self.audio) < count:
                self._arrived.clear()
                await self._arrived.wait()
        return self.audio

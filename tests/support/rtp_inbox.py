"""What an `RtpSession` hands its callbacks in a test: audio frames and keys, awaitable until
enough has come."""

from __future__ import annotations

from tests.support.poll import PollTimeout, until
from voice.audio import PCM

WAIT_S = 5.0


class Inbox:
    """A session's `on_audio` and `on_dtmf`, kept; `frames(n)` waits (up to `WAIT_S`) for n."""

    def __init__(self) -> None:
        self.audio: list[PCM] = []
        self.digits: list[str] = []

    def on_audio(self, pcm: PCM, at: float) -> None:
        self.audio.append(pcm)

    def on_dtmf(self, digit: str, at: float) -> None:
        self.digits.append(digit)

    async def frames(self, count: int) -> list[PCM]:
        """Every frame so far, once there are `count`; fails with how many came."""
        try:
            await until(lambda: len(self.audio) >= count, f"{count} frames", WAIT_S, 0.002)
        except PollTimeout as timeout:
            raise AssertionError(f"{timeout}; {len(self.audio)} came") from None
        return self.audio

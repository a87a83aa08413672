"""Early media on a call we place (RFC 3960, the gateway model): once a provisional answer (183
Session Progress, or a 180 with SDP) says where the callee's side takes RTP, RTP flows both ways
before the answer. What comes in (ringback, a carrier's announcement) is counted, not heard by the
agent: the conversation starts at the answer. What goes out is silence, every 20 ms paced by the
absolute clock, as during a call: gateways and NATs expect media both ways from the first SDP,
and some drop a session whose RTP never starts."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import numpy as np

from pipeline.transport import PCM
from voice.transports.sip.rtp import RtpSession

log = logging.getLogger(__name__)

_FRAME_S = 0.02
_WIRE_FRAME = 160  # 20 ms at 8 kHz


class EarlyMedia:
    """The RTP of one placed call before its answer."""

    def __init__(self, rtp: RtpSession) -> None:
        self.rtp = rtp
        self.frames_in = 0  # 20 ms frames heard (ringback, announcements)
        self.started_at: float | None = None
        self._sender: asyncio.Task[None] | None = None

    def start(self, remote: tuple[str, int]) -> None:
        """RTP to `remote` (the provisional answer's SDP) from now on; again: it moved."""
        self.rtp.remote = remote
        if self._sender is None:
            self.started_at = time.monotonic()
            self._sender = asyncio.create_task(self._send_silence(), name="early-media")

    def heard(self, pcm: PCM, at: float) -> None:
        """A frame from the callee's side before the answer."""
        self.frames_in += 1

    async def stop(self) -> None:
        """Stop sending (the answer's media takes over, or the call failed)."""
        if self._sender is not None:
            self._sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sender
            self._sender = None

    async def _send_silence(self) -> None:
        silence = np.zeros(_WIRE_FRAME, dtype=np.int16)
        start, sent = time.monotonic(), 0
        while True:
            due = start + sent * _FRAME_S
            now = time.monotonic()
            if due > now:
                await asyncio.sleep(due - now)
            elif now - due > 0.2:  # the loop stalled: start again from now, not a burst
                start, sent = now, 0
            sent += 1
            self.rtp.send_frame(silence)

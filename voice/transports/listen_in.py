"""Listen-in: a supervisor hears a call live, both sides mixed, over WebRTC from the worker that
owns the call.

`ListenIn` is an `AudioTap` on the call's transport and an outbound audio track: caller audio is
mixed in as it arrives, reply audio when it plays (a phone's reply frames are sent ahead of
their time; they wait here until then), and a barge-in drops what had not played. It holds at
most `_MAX_HELD_S` of each side, so a listener whose track falls behind hears the call late by
no more than that, and never costs the call memory.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque

import numpy as np
from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection, RTCSessionDescription

from pipeline.transport import FRAME_SAMPLES, PCM, SAMPLE_RATE, Taps
from voice.transports.webrtc import PacedAudioTrack, take_samples

log = logging.getLogger(__name__)

_MAX_HELD_S = 0.5


class _Side:
    """One side's samples waiting to be mixed, oldest first."""

    def __init__(self) -> None:
        self.chunks: deque[PCM] = deque()
        self.held = 0

    def add(self, pcm: PCM) -> None:
        self.chunks.append(pcm)
        self.held += int(pcm.size)
        while self.held > _MAX_HELD_S * SAMPLE_RATE and self.chunks:
            self.held -= int(self.chunks.popleft().size)

    def take(self, count: int) -> PCM:
        out, filled = take_samples(self.chunks, count)
        self.held -= filled
        return out

    def clear(self) -> None:
        self.chunks.clear()
        self.held = 0


class ListenIn(PacedAudioTrack):
    """Both sides of one call, mixed, as a 16 kHz audio track (and the tap that feeds it)."""

    def __init__(self, call_id: str) -> None:
        super().__init__()
        self.call_id = call_id
        self._caller = _Side()
        self._heard = _Side()
        self._scheduled: deque[tuple[float, PCM]] = deque()  # reply audio not playing yet

    # -- AudioTap ----------------------------------------------------------------------------

    def caller(self, pcm: PCM, at: float) -> None:
        self._caller.add(pcm)

    def heard(self, pcm: PCM, at: float) -> None:
        self._scheduled.append((at, pcm))

    def cut(self, at: float) -> None:
        self._scheduled = deque((t, pcm) for t, pcm in self._scheduled if t < at)
        self._heard.clear()

    # -- track -------------------------------------------------------------------------------

    def next_frame(self) -> PCM:
        now = time.monotonic()
        while self._scheduled and self._scheduled[0][0] <= now:
            self._heard.add(self._scheduled.popleft()[1])
        mixed = self._caller.take(FRAME_SAMPLES).astype(np.int32)
        mixed += self._heard.take(FRAME_SAMPLES)
        return np.clip(mixed, -32768, 32767).astype(np.int16)


async def answer_listener(
    listen: ListenIn, offer_sdp: str, ice_servers: list[RTCIceServer]
) -> RTCPeerConnection:
    """A peer connection that sends `listen`'s track to the supervisor's offer; its local
    description is the answer. ValueError if the offer is unusable."""
    pc = RTCPeerConnection(RTCConfiguration(iceServers=ice_servers))
    try:
        await pc.setRemoteDescription(RTCSessionDescription(sdp=offer_sdp, type="offer"))
        if not any(t.kind == "audio" for t in pc.getTransceivers()):
            raise ValueError("the offer has no audio section")
        pc.addTrack(listen)  # on the supervisor's (receive-only) audio transceiver
        await pc.setLocalDescription(await pc.createAnswer())
    except Exception as exc:  # aiortc raises many kinds on bad SDP
        await pc.close()
        raise ValueError(f"malformed SDP offer: {exc}") from exc
    return pc


class Listeners:
    """The supervisors listening to one call: each a peer connection fed by its own tap."""

    def __init__(
        self, call_id: str, taps: Taps, ice_servers: list[RTCIceServer], limit: int = 4
    ) -> None:
        self.call_id = call_id
        self.taps = taps
        self.ice_servers = ice_servers
        self.limit = limit
        self._peers: dict[ListenIn, RTCPeerConnection] = {}
        self._dropping: set[asyncio.Future[None]] = set()
        self._closed = False

    def __len__(self) -> int:
        return len(self._peers)

    async def add(self, offer_sdp: str, connect_timeout_s: float = 20.0) -> str:
        """Answer a supervisor's offer (the answer SDP); ValueError if the offer is unusable,
        the call has ended, or `limit` supervisors already listen."""
        if self._closed:
            raise ValueError("the call has ended")
        if len(self._peers) >= self.limit:
            raise ValueError(f"{self.limit} supervisors already listen to this call")
        listen = ListenIn(self.call_id)
        pc = await answer_listener(listen, offer_sdp, self.ice_servers)
        self._peers[listen] = pc
        self.taps.add(listen)

        @pc.on("connectionstatechange")
        async def changed() -> None:
            if pc.connectionState in ("failed", "closed"):
                await self._drop(listen)

        def give_up() -> None:
            if pc.connectionState != "connected" and listen in self._peers:
                log.info("call %s: a listener never connected", self.call_id)
                task = asyncio.ensure_future(self._drop(listen))
                self._dropping.add(task)
                task.add_done_callback(self._dropping.discard)

        asyncio.get_running_loop().call_later(connect_timeout_s, give_up)
        log.info("call %s: a supervisor listens in (%d)", self.call_id, len(self._peers))
        return str(pc.localDescription.sdp)

    async def _drop(self, listen: ListenIn) -> None:
        pc = self._peers.pop(listen, None)
        if pc is None:
            return
        self.taps.remove(listen)
        listen.stop()
        await pc.close()
        log.info("call %s: a supervisor stopped listening", self.call_id)

    async def close(self) -> None:
        """The call ended: every listener's connection is closed."""
        self._closed = True
        for listen in list(self._peers):
            await self._drop(listen)

"""A scripted WebRTC caller (aiortc): speaks utterances, records the reply, measures latency.

Used by `hotline call`, the tests and the benchmark. Every time is taken at the caller:
voice-to-voice latency runs from the moment the last sample of an utterance was sent to the
first audible reply frame received. The turns themselves are `voice.devtools.turns.converse`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Coroutine, Sequence
from typing import Any

import av
import httpx
import numpy as np
from aiortc import MediaStreamTrack, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError

from pipeline.transport import FRAME_SAMPLES, PCM, SAMPLE_RATE
from voice.audio import rms
from voice.devtools.turns import (
    AUDIBLE_RMS,
    CallerTurn,
    CallResult,
    Ear,
    FrameTest,
    barge_in_stop_ms,
    converse,
)
from voice.transports.webrtc import PacedAudioTrack, shorten_jitter_buffer


class CallerMicrophone(PacedAudioTrack):
    """The caller's voice: queued utterances, then silence, paced by the absolute clock."""

    def __init__(self) -> None:
        super().__init__()
        self._script: list[tuple[PCM, asyncio.Future[list[float]]]] = []
        self._offset = 0
        self._sent: list[float] = []

    def say(self, pcm: PCM) -> asyncio.Future[list[float]]:
        """Queue an utterance; the future gives the time each of its 20 ms frames was sent."""
        future: asyncio.Future[list[float]] = asyncio.get_running_loop().create_future()
        self._script.append((pcm, future))
        return future

    def next_frame(self) -> PCM:
        samples = np.zeros(FRAME_SAMPLES, dtype=np.int16)
        if self._script:
            pcm, future = self._script[0]
            piece = pcm[self._offset : self._offset + FRAME_SAMPLES]
            samples[: piece.size] = piece
            self._sent.append(time.monotonic())
            self._offset += FRAME_SAMPLES
            if self._offset >= pcm.size:
                if not future.done():
                    future.set_result(self._sent)
                self._script.pop(0)
                self._offset = 0
                self._sent = []
        return samples


class _TrackEar(Ear):
    """Receives the reply track: keeps the audio and when each frame was audible. `hung_up` is
    set when the track ends or the connection closes: the server ended the call."""

    def __init__(self) -> None:
        super().__init__()
        self.hung_up = asyncio.Event()

    async def listen(self, track: MediaStreamTrack) -> None:
        resampler = av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)
        try:
            while True:
                frame = await track.recv()
                assert isinstance(frame, av.AudioFrame)
                now = time.monotonic()
                for out in resampler.resample(frame):
                    pcm = out.to_ndarray().reshape(-1).astype(np.int16, copy=False)
                    self.record(now, rms(pcm) > AUDIBLE_RMS, pcm)
        except MediaStreamError:
            self.hung_up.set()


class WebRTCLine:
    """The caller's end of a WebRTC call, as the turn loop uses it."""

    def __init__(self, mic: CallerMicrophone, ear: _TrackEar) -> None:
        self.mic = mic
        self.ear = ear

    def say(self, pcm: PCM) -> asyncio.Future[list[float]]:
        return self.mic.say(pcm)

    async def hear(self, predicate: FrameTest, within_s: float) -> float | None:
        return await self.ear.wait_or_hang_up(predicate, within_s, self.ear.hung_up)

    async def press(self, digits: str) -> None:
        raise NotImplementedError("the WebRTC caller has no keypad")


async def _offer(pc: RTCPeerConnection, url: str, token: str | None) -> str:
    """Send the offer to the server's `/offer` (with the API token, if given), apply its
    answer; gives the call's id. httpx.HTTPStatusError if the server refuses it."""
    await pc.setLocalDescription(await pc.createOffer())
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(timeout=30, headers=headers) as http:
        response = await http.post(
            f"{url.rstrip('/')}/offer",
            json={"sdp": pc.localDescription.sdp, "type": pc.localDescription.type},
        )
        response.raise_for_status()
        answer = response.json()
    await pc.setRemoteDescription(RTCSessionDescription(sdp=answer["sdp"], type="answer"))
    return str(answer["call_id"])


async def _until_hung_up(script: Coroutine[Any, Any, None], hung_up: asyncio.Event) -> None:
    """Run the caller's script until it ends or the server hangs up (then at once: a closed
    connection takes no more of the caller's words)."""
    talking = asyncio.ensure_future(script)
    ended = asyncio.ensure_future(hung_up.wait())
    try:
        await asyncio.wait({talking, ended}, return_when=asyncio.FIRST_COMPLETED)
        if talking.done():
            talking.result()  # a failure in the script is raised, not hidden
    finally:
        for task in (talking, ended):
            task.cancel()
        await asyncio.gather(talking, ended, return_exceptions=True)


class WebRTCCall:
    """One WebRTC call, the caller's end: its id, the line to speak on, the data channel's
    events."""

    def __init__(self, call_id: str, line: WebRTCLine, events: list[dict[str, object]]) -> None:
        self.call_id, self.line, self.events = call_id, line, events

    async def talk(self, script: Coroutine[Any, Any, None]) -> None:
        """Run the caller's `script` until it ends or the server hangs up."""
        await _until_hung_up(script, self.line.ear.hung_up)


@contextlib.asynccontextmanager
async def open_webrtc_call(url: str, token: str | None = None) -> AsyncIterator[WebRTCCall]:
    """Call the Hotline server at `url` (with its API token, if it has one): the offer sent,
    its answer applied; the call until the block ends, then the peer connection closed.
    httpx.HTTPStatusError if the server refuses the offer."""
    pc = RTCPeerConnection()
    mic = CallerMicrophone()
    ear = _TrackEar()
    events: list[dict[str, object]] = []
    listeners: list[asyncio.Task[None]] = []
    pc.addTrack(mic)
    shorten_jitter_buffer(pc)
    channel = pc.createDataChannel("events")

    @channel.on("message")
    def on_message(message: str | bytes) -> None:
        if isinstance(message, str):
            events.append(json.loads(message))

    @pc.on("connectionstatechange")
    def on_state() -> None:
        if pc.connectionState in ("closed", "failed"):
            ear.hung_up.set()

    @pc.on("track")
    def on_track(track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            listeners.append(asyncio.create_task(ear.listen(track)))

    try:
        call_id = await _offer(pc, url, token)
        yield WebRTCCall(call_id, WebRTCLine(mic, ear), events)
    finally:
        await pc.close()
        for task in listeners:
            task.cancel()


async def place_call(
    url: str,
    utterances: Sequence[PCM],
    *,
    barge_in_after_ms: float | None = None,
    reply_timeout_s: float = 30.0,
    quiet_s: float = 0.8,
    token: str | None = None,
    opening_wait_s: float | None = None,
) -> CallResult:
    """Call the Hotline server at `url` (with its API token, if it has one) and speak
    `utterances`, one turn each.

    Each utterance is spoken after the previous reply has finished (`quiet_s` of silence); with
    `opening_wait_s`, the first after what the server says first (`converse`'s).
    With `barge_in_after_ms`, the last utterance is spoken that long after the previous reply
    started instead, interrupting it.
    """
    turns: list[CallerTurn] = []
    async with open_webrtc_call(url, token) as call:
        script = converse(
            call.line,
            utterances,
            turns,
            barge_in_after_ms=barge_in_after_ms,
            reply_timeout_s=reply_timeout_s,
            quiet_s=quiet_s,
            opening_wait_s=opening_wait_s,
        )
        await call.talk(script)
    result = CallResult(call.call_id, turns, call.line.ear.audio(), call.events)
    if barge_in_after_ms is not None:
        result.barge_in_stop_ms = barge_in_stop_ms(turns)
    return result

"""A scripted WebRTC caller (aiortc): speaks utterances, records the reply, measures latency.

Used by `hotline call`, the tests and the benchmark. Every time is taken at the caller:
voice-to-voice latency runs from the moment the last sample of an utterance was sent to the
first audible reply frame received.
"""

from __future__ import annotations

import asyncio
import fractions
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import av
import httpx
import numpy as np
from aiortc import MediaStreamTrack, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError

from pipeline.transport import FRAME_SAMPLES, PCM, SAMPLE_RATE
from voice.audio import rms
from voice.transports.webrtc import PacedAudioTrack, shorten_jitter_buffer

log = logging.getLogger(__name__)

AUDIBLE_RMS = 300.0  # int16 RMS above which a received 20 ms frame counts as reply audio
_TIME_BASE = fractions.Fraction(1, SAMPLE_RATE)


def voiced_span(pcm: PCM) -> tuple[int, int]:
    """Indices of the first and last audible 20 ms frames of an utterance (its speech)."""
    loud = [
        i
        for i in range(0, max(1, len(pcm)), FRAME_SAMPLES)
        if rms(pcm[i : i + FRAME_SAMPLES]) > AUDIBLE_RMS
    ]
    if not loud:
        return 0, max(0, (len(pcm) - 1) // FRAME_SAMPLES)
    return loud[0] // FRAME_SAMPLES, loud[-1] // FRAME_SAMPLES


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


@dataclass
class CallerTurn:
    """One utterance and the reply it got, timed at the caller."""

    onset: float  # monotonic: first audible frame of the utterance sent
    speech_end: float  # monotonic: last audible frame sent
    reply_start: float | None = None  # first audible reply frame received after speech_end
    reply_stop: float | None = None  # reply audio went silent (for an interrupted reply)

    @property
    def voice_to_voice_ms(self) -> float | None:
        if self.reply_start is None:
            return None
        return round((self.reply_start - self.speech_end) * 1e3, 1)


@dataclass
class CallResult:
    call_id: str
    turns: list[CallerTurn]
    reply_audio: PCM  # everything received, 16 kHz mono
    events: list[dict[str, object]] = field(default_factory=list)
    barge_in_stop_ms: float | None = None  # caller onset -> reply audio stopped

    def transcripts(self, role: str) -> list[str]:
        return [
            str(e["text"])
            for e in self.events
            if e.get("type") == "transcript" and e.get("role") == role
        ]

    def records(self) -> list[dict[str, object]]:
        return [e["record"] for e in self.events if e.get("type") == "turn"]  # type: ignore[misc]


FrameTest = Callable[[list[tuple[float, bool]]], float | None]


class _Ear:
    """Receives the reply track: keeps the audio and when each frame was audible."""

    def __init__(self) -> None:
        self.frames: list[tuple[float, bool]] = []  # (received at, audible)
        self.chunks: list[PCM] = []
        self.changed = asyncio.Event()

    async def listen(self, track: MediaStreamTrack) -> None:
        resampler = av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)
        try:
            while True:
                frame = await track.recv()
                assert isinstance(frame, av.AudioFrame)
                now = time.monotonic()
                for out in resampler.resample(frame):
                    pcm = out.to_ndarray().reshape(-1).astype(np.int16, copy=False)
                    self.chunks.append(pcm)
                    self.frames.append((now, rms(pcm) > AUDIBLE_RMS))
                self.changed.set()
        except MediaStreamError:
            pass

    async def wait_for(self, predicate: FrameTest, within_s: float) -> float | None:
        """Wait until `predicate(frames)` returns a time; None after `within_s` seconds."""
        deadline = time.monotonic() + within_s
        while True:
            found = predicate(self.frames)
            if found is not None:
                return found
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), remaining)
            except TimeoutError:
                return None


def first_audible_after(t: float) -> FrameTest:
    def find(frames: list[tuple[float, bool]]) -> float | None:
        for at, audible in frames:
            if at > t and audible:
                return at
        return None

    return find


def silent_for_after(t: float, quiet_s: float) -> FrameTest:
    """The start of the first silent stretch of `quiet_s` seconds that begins after `t`."""

    def find(frames: list[tuple[float, bool]]) -> float | None:
        start: float | None = None
        for at, audible in frames:
            if at <= t:
                continue
            if audible:
                start = None
            elif start is None:
                start = at
            elif at - start >= quiet_s:
                return start
        return None

    return find


async def place_call(
    url: str,
    utterances: Sequence[PCM],
    *,
    barge_in_after_ms: float | None = None,
    reply_timeout_s: float = 30.0,
    quiet_s: float = 0.8,
) -> CallResult:
    """Call the Hotline server at `url` and speak `utterances`, one turn each.

    Each utterance is spoken after the previous reply has finished (`quiet_s` of silence).
    With `barge_in_after_ms`, the last utterance is spoken that long after the previous reply
    started instead, interrupting it.
    """
    pc = RTCPeerConnection()
    mic = CallerMicrophone()
    ear = _Ear()
    events: list[dict[str, object]] = []
    listeners: list[asyncio.Task[None]] = []
    pc.addTrack(mic)
    shorten_jitter_buffer(pc)
    channel = pc.createDataChannel("events")

    @channel.on("message")
    def on_message(message: str | bytes) -> None:
        if isinstance(message, str):
            events.append(json.loads(message))

    @pc.on("track")
    def on_track(track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            listeners.append(asyncio.create_task(ear.listen(track)))

    turns: list[CallerTurn] = []
    call_id = ""
    try:
        await pc.setLocalDescription(await pc.createOffer())
        async with httpx.AsyncClient(timeout=30) as http:
            response = await http.post(
                f"{url.rstrip('/')}/offer",
                json={"sdp": pc.localDescription.sdp, "type": pc.localDescription.type},
            )
            response.raise_for_status()
            answer = response.json()
        call_id = answer["call_id"]
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer["sdp"], type="answer"))
        for index, pcm in enumerate(utterances):
            interrupting = (
                barge_in_after_ms is not None and index == len(utterances) - 1 and bool(turns)
            )
            if interrupting and barge_in_after_ms is not None:
                previous = turns[-1]
                if previous.reply_start is not None:
                    delay = previous.reply_start + barge_in_after_ms / 1e3 - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)  # the script's own timing, not a synchronisation
            sent = await mic.say(pcm)
            first, last = voiced_span(pcm)
            onset, speech_end = sent[first], sent[last] + FRAME_SAMPLES / SAMPLE_RATE
            turn = CallerTurn(onset=onset, speech_end=speech_end)
            turns.append(turn)
            if interrupting:
                previous = turns[-2]
                previous.reply_stop = await ear.wait_for(silent_for_after(onset, 0.25), 5.0)
            turn.reply_start = await ear.wait_for(first_audible_after(speech_end), reply_timeout_s)
            if turn.reply_start is None:
                log.warning("no reply heard within %.0f s", reply_timeout_s)
                break
            next_interrupts = barge_in_after_ms is not None and index == len(utterances) - 2
            if not next_interrupts:
                await ear.wait_for(silent_for_after(turn.reply_start, quiet_s), reply_timeout_s)
    finally:
        await pc.close()
        for task in listeners:
            task.cancel()
    audio = np.concatenate(ear.chunks) if ear.chunks else np.zeros(0, dtype=np.int16)
    result = CallResult(call_id, turns, audio, events)
    if barge_in_after_ms is not None and len(turns) >= 2 and turns[-2].reply_stop is not None:
        result.barge_in_stop_ms = round((turns[-2].reply_stop - turns[-1].onset) * 1e3, 1)
    return result

"""A faithful Twilio caller: plays Twilio's part of a Media Stream against a Hotline server.

Used by `hotline call --twilio`, the tests and the benchmark (through
`voice.devtools.twilio_call.place_twilio_call`) and by the soak. Like Twilio it sends
`connected`, `start`, then one 20 ms μ-law `media` message every 20 ms of the absolute clock,
`dtmf` when a key is pressed and `stop` on hang-up. The server's `media` goes into a playout
buffer that the phone plays at 8000 samples a second; a `mark` comes back only once everything
queued before it has played, and `clear` empties the buffer and sends every pending mark back at
once. Times are taken at the phone, from what it *played*: voice-to-voice latency runs from the
end of the caller's last audible frame to the first audible reply frame played.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
import time
import uuid
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from pipeline.transport import FRAME_SAMPLES, PCM, SAMPLE_RATE
from voice.audio import StreamResampler, mulaw_decode, mulaw_encode, rms
from voice.devtools.turns import (
    AUDIBLE_RMS,
    CallerTurn,
    CallResult,
    Ear,
    FrameTest,
    barge_in_stop_ms,
)

log = logging.getLogger(__name__)

PHONE_RATE = 8000
PHONE_FRAME = 160  # 20 ms of μ-law at 8 kHz
_FRAME_S = PHONE_FRAME / PHONE_RATE
DEFAULT_CALLER = "+15555550100"  # fictional numbers (555-0100 to 555-0199)
DEFAULT_CALLEE = "+15555550199"


def twilio_sid(prefix: str) -> str:
    """A Twilio-shaped SID: two letters and 32 hex digits."""
    return prefix + uuid.uuid4().hex


@dataclass(frozen=True)
class ServerMessage:
    """One message the server sent, with the monotonic time the phone received it."""

    at: float
    message: dict[str, Any]

    @property
    def event(self) -> str:
        return str(self.message.get("event"))


@dataclass
class PhoneCallResult(CallResult):
    """What the phone heard and everything the server sent it."""

    stream_sid: str = ""
    received: list[ServerMessage] = field(default_factory=list)
    marks_echoed: list[tuple[float, str]] = field(default_factory=list)  # (sent at, name)
    playback: list[tuple[float, bool]] = field(default_factory=list)  # (played at, audible)
    fed: list[bool] = field(default_factory=list)  # per playback tick: the buffer had audio
    violations: list[str] = field(default_factory=list)  # what Twilio would have refused
    rejected: str | None = None  # the webhook's TwiML turned the call away (what it said)
    # After the server ended the stream: the verb `<Connect action>` answered (Dial, Hangup),
    # and the number or SIP URI a `<Dial>` put the caller through to.
    after_stream: str | None = None
    transferred_to: str | None = None

    def events_named(self, event: str) -> list[ServerMessage]:
        return [m for m in self.received if m.event == event]


class TwilioPhone:
    """Twilio's side of one Media Stream: the caller's microphone and the phone's speaker."""

    def __init__(
        self,
        socket: ClientConnection,
        call_sid: str,
        account_sid: str,
        parameters: Mapping[str, str],
    ) -> None:
        self.socket = socket
        self.call_sid = call_sid
        self.account_sid = account_sid
        self.stream_sid = twilio_sid("MZ")
        self.parameters = dict(parameters)
        self.ear = Ear()  # played frames, in the shape voice/devtools/turns.py measures
        self.received: list[ServerMessage] = []
        self.marks_echoed: list[tuple[float, str]] = []
        self.violations: list[str] = []
        self.hung_up = asyncio.Event()
        self._sequence = 0
        self._stopped = False
        self._chunk = 0
        self._started_at = time.monotonic()
        self._send_lock = asyncio.Lock()
        self._mic: deque[tuple[list[PCM], asyncio.Future[list[float]], list[float]]] = deque()
        self._keys: deque[tuple[str, asyncio.Future[None] | None]] = deque()
        self._playout: deque[PCM] = deque()
        self._fed: list[bool] = []  # per tick played: whether the buffer had audio for it
        self._queued = 0  # reply samples received (the position after the last one)
        self._played = 0  # reply samples whose playing has finished
        self._playing = 0  # samples in the frame playing now
        self._marks: deque[tuple[int, str]] = deque()  # (position, name) waiting to be played
        self._to_reply_rate = StreamResampler(PHONE_RATE, SAMPLE_RATE)

    # -- the caller's side ----------------------------------------------------------------

    def say(self, pcm: PCM) -> asyncio.Future[list[float]]:
        """Queue an utterance (16 kHz); the future gives the time each 20 ms frame was sent."""
        narrow = StreamResampler(SAMPLE_RATE, PHONE_RATE)(pcm, last=True)
        count = max(1, -(-len(pcm) // FRAME_SAMPLES))
        frames = [np.zeros(PHONE_FRAME, dtype=np.int16) for _ in range(count)]
        for i, frame in enumerate(frames):
            piece = narrow[i * PHONE_FRAME : (i + 1) * PHONE_FRAME]
            frame[: len(piece)] = piece
        future: asyncio.Future[list[float]] = asyncio.get_running_loop().create_future()
        self._mic.append((frames, future, []))
        return future

    def press(self, digits: str) -> asyncio.Future[None]:
        """Queue key presses, one `dtmf` message per 20 ms; the future is done once all went."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if not digits:
            done.set_result(None)
        for i, digit in enumerate(digits):
            self._keys.append((digit, done if i == len(digits) - 1 else None))
        return done

    async def open(self) -> None:
        """Twilio's first two messages: `connected`, then `start`."""
        await self.socket.send(
            json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"})
        )
        self._started_at = time.monotonic()
        await self._send(
            "start",
            {
                "accountSid": self.account_sid,
                "streamSid": self.stream_sid,
                "callSid": self.call_sid,
                "tracks": ["inbound"],
                "customParameters": self.parameters,
                "mediaFormat": {
                    "encoding": "audio/x-mulaw",
                    "sampleRate": PHONE_RATE,
                    "channels": 1,
                },
            },
        )

    async def hang_up(self) -> None:
        """Send `stop` and close, as Twilio does when the caller hangs up."""
        if not self.hung_up.is_set():
            with contextlib.suppress(ConnectionClosed):
                await self._send("stop", {"accountSid": self.account_sid, "callSid": self.call_sid})
        await self.socket.close()

    async def _send(self, event: str, body: dict[str, Any]) -> None:
        async with self._send_lock:
            if self._stopped:
                return  # nothing follows `stop`
            self._stopped = event == "stop"
            self._sequence += 1
            message = {"event": event, "sequenceNumber": str(self._sequence), event: body}
            message["streamSid"] = self.stream_sid
            await self.socket.send(json.dumps(message))

    # -- the clock: one 20 ms frame each way ------------------------------------------------

    async def run(self) -> None:
        """Tick every 20 ms of the absolute clock until the socket closes."""
        start = time.monotonic()
        tick = 0
        try:
            while True:
                delay = start + tick * _FRAME_S - time.monotonic()
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
        self._chunk += 1
        media = {
            "track": "inbound",
            "chunk": str(self._chunk),
            "timestamp": str(round((now - self._started_at) * 1e3)),
            "payload": base64.b64encode(mulaw_encode(self._next_mic_frame(now))).decode("ascii"),
        }
        await self._send("media", media)
        if self._keys:
            digit, done = self._keys.popleft()
            await self._send("dtmf", {"track": "inbound_track", "digit": digit})
            if done is not None and not done.done():
                done.set_result(None)

    def _next_mic_frame(self, now: float) -> PCM:
        if not self._mic:
            return np.zeros(PHONE_FRAME, dtype=np.int16)
        frames, future, sent = self._mic[0]
        frame = frames[len(sent)]
        sent.append(now)
        if len(sent) == len(frames):
            self._mic.popleft()
            if not future.done():
                future.set_result(sent)
        return frame

    def _play_next(self, now: float) -> None:
        """Start playing the next 20 ms of the playout buffer (silence when it runs dry)."""
        frame = np.zeros(PHONE_FRAME, dtype=np.int16)
        filled = 0
        while filled < PHONE_FRAME and self._playout:
            head = self._playout[0]
            take = min(PHONE_FRAME - filled, len(head))
            frame[filled : filled + take] = head[:take]
            filled += take
            if take == len(head):
                self._playout.popleft()
            else:
                self._playout[0] = head[take:]
        self._playing = filled
        self._fed.append(filled > 0)
        self.ear.record(now, rms(frame) > AUDIBLE_RMS, self._to_reply_rate(frame))

    async def _echo(self, name: str) -> None:
        await self._send("mark", {"name": name})
        self.marks_echoed.append((time.monotonic(), name))

    # -- what the server sends --------------------------------------------------------------

    async def listen(self) -> None:
        """Receive the server's messages until the socket closes."""
        try:
            async for raw in self.socket:
                await self._receive(raw, time.monotonic())
        except ConnectionClosed:
            pass
        finally:
            self.hung_up.set()

    async def _receive(self, raw: str | bytes, at: float) -> None:
        if isinstance(raw, bytes):
            self.violations.append("binary message")
            return
        try:
            message = json.loads(raw)
        except json.JSONDecodeError:
            self.violations.append(f"not JSON: {raw[:80]!r}")
            return
        if not isinstance(message, dict):
            self.violations.append(f"not a JSON object: {raw[:80]!r}")
            return
        self.received.append(ServerMessage(at, message))
        event = message.get("event")
        if message.get("streamSid") != self.stream_sid:
            self.violations.append(f"{event} for stream {message.get('streamSid')!r}")
            return
        if event == "media":
            self._queue_media(message.get("media"))
        elif event == "mark":
            mark = message.get("mark")
            name = mark.get("name") if isinstance(mark, dict) else None
            if not isinstance(name, str):
                self.violations.append("mark without a name")
            elif self._queued == self._played:
                await self._echo(name)  # nothing left to play: straight back
            else:
                self._marks.append((self._queued, name))
        elif event == "clear":
            self._playout.clear()
            self._playing = 0
            self._queued = self._played
            while self._marks:
                await self._echo(self._marks.popleft()[1])
        else:
            self.violations.append(f"unknown event {event!r}")

    def _queue_media(self, media: object) -> None:
        payload = media.get("payload") if isinstance(media, dict) else None
        if not isinstance(payload, str):
            self.violations.append("media without a payload")
            return
        try:
            pcm = mulaw_decode(base64.b64decode(payload, validate=True))
        except (binascii.Error, ValueError):
            self.violations.append("media payload is not base64")
            return
        self._playout.append(pcm)
        self._queued += len(pcm)

    async def hear(self, predicate: FrameTest, within_s: float) -> float | None:
        """Wait for `predicate` over the played frames; None on timeout or hang-up."""
        return await self.ear.wait_or_hang_up(predicate, within_s, self.hung_up)

    def result(self, turns: list[CallerTurn], barge_in: bool) -> PhoneCallResult:
        result = PhoneCallResult(
            self.call_sid,
            turns,
            self.ear.audio(),
            stream_sid=self.stream_sid,
            received=self.received,
            marks_echoed=self.marks_echoed,
            playback=list(self.ear.frames),
            fed=list(self._fed),
            violations=self.violations,
        )
        if barge_in:
            result.barge_in_stop_ms = barge_in_stop_ms(turns)
        return result

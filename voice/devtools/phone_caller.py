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

import base64
import binascii
import json
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from websockets.asyncio.client import ClientConnection

from pipeline.transport import PCM
from voice.audio import mulaw_decode, mulaw_encode
from voice.devtools.stream_phone import StreamPhone
from voice.devtools.turns import CallerTurn, CallResult, barge_in_stop_ms

log = logging.getLogger(__name__)

PHONE_RATE = 8000
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


class TwilioPhone(StreamPhone):
    """Twilio's side of one Media Stream: the caller's microphone and the phone's speaker.
    Every server message is kept (`received`), and what Twilio would refuse is noted
    (`violations`)."""

    def __init__(
        self,
        socket: ClientConnection,
        call_sid: str,
        account_sid: str,
        parameters: Mapping[str, str],
        line_noise_dbfs: float | None = None,
    ) -> None:
        super().__init__(socket, line_noise_dbfs)
        self.call_sid = call_sid
        self.account_sid = account_sid
        self.stream_sid = twilio_sid("MZ")
        self.parameters = dict(parameters)
        self.received: list[ServerMessage] = []
        self.violations: list[str] = []
        self._sequence = 0
        self._chunk = 0
        self._started_at = time.monotonic()

    def _message(self, event: str, body: dict[str, Any]) -> str:
        self._sequence += 1
        message = {"event": event, "sequenceNumber": str(self._sequence), event: body}
        message["streamSid"] = self.stream_sid
        return json.dumps(message)

    async def open(self) -> None:
        """Twilio's first two messages: `connected`, then `start`."""
        await self.send(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}))
        self._started_at = time.monotonic()
        start = {
            "accountSid": self.account_sid,
            "streamSid": self.stream_sid,
            "callSid": self.call_sid,
            "tracks": ["inbound"],
            "customParameters": self.parameters,
            "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": PHONE_RATE, "channels": 1},
        }
        await self.send(self._message("start", start))

    def media_message(self, frame: PCM, now: float) -> str:
        self._chunk += 1
        media = {
            "track": "inbound",
            "chunk": str(self._chunk),
            "timestamp": str(round((now - self._started_at) * 1e3)),
            "payload": base64.b64encode(mulaw_encode(frame)).decode("ascii"),
        }
        return self._message("media", media)

    def dtmf_message(self, digit: str) -> str:
        return self._message("dtmf", {"track": "inbound_track", "digit": digit})

    def mark_message(self, name: str) -> str:
        return self._message("mark", {"name": name})

    def stop_message(self) -> str:
        return self._message("stop", {"accountSid": self.account_sid, "callSid": self.call_sid})

    async def receive(self, raw: str | bytes, at: float) -> None:
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
            else:
                await self.mark_received(name)
        elif event == "clear":
            await self.cleared()
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
        self.queue_audio(pcm)

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

"""Fake phone-provider wires for the phone-route tests: what Twilio, Telnyx and Vonage each send
and expect on a media websocket (a `Wire` per provider builds the messages a test phone sends
and reads the server's replies; sample shapes as in tests/test_protocols.py)."""

from __future__ import annotations

import base64
import json
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.transport import FRAME_SAMPLES
from voice.audio import StreamResampler, mulaw_encode

_OVERSIZED = 70 * 1024  # uvicorn's websocket limit is 64 KiB

Message = str | bytes
PCM = np.ndarray


# -- what each provider sends and expects ----------------------------------------------------


@dataclass(frozen=True)
class Heard:
    """One server message as the phone received it (monotonic arrival time)."""

    at: float
    kind: str  # "media", "mark", "clear" or "other"
    name: str = ""  # the mark's name
    raw: Message = ""


class Wire:
    """One provider's messages for one call; JSON protocols share most of it."""

    route = ""
    transport = ""
    frame_samples = 160  # at the wire rate
    wire_rate = 8000

    def __init__(self) -> None:
        self.call_id = ""

    def opening(self) -> list[Message]:
        raise NotImplementedError

    def media(self, frame: PCM) -> Message:
        raise NotImplementedError

    def echo(self, name: str) -> Message:
        raise NotImplementedError

    def hang_up(self) -> Message | None:
        return None  # the socket simply closes

    def on_clear(self) -> list[Message]:
        return []

    def read(self, raw: Message, at: float) -> Heard:
        raise NotImplementedError

    def bad_before_start(self) -> dict[str, Message]:
        """Unusable messages before the start, each with what the server's log should say."""
        raise NotImplementedError

    def bad_in_call(self) -> dict[str, Message]:
        raise NotImplementedError

    def oversized(self) -> Message:
        raise NotImplementedError

    def wire_frames(self, pcm: PCM) -> list[PCM]:
        """16 kHz audio as the phone's 20 ms wire frames (the last one padded)."""
        narrow = StreamResampler(16_000, self.wire_rate)(pcm, last=True)
        count = max(1, -(-len(pcm) // FRAME_SAMPLES))
        frames = [np.zeros(self.frame_samples, dtype=np.int16) for _ in range(count)]
        for i, frame in enumerate(frames):
            piece = narrow[i * self.frame_samples : (i + 1) * self.frame_samples]
            frame[: len(piece)] = piece
        return frames


def _mulaw_b64(frame: PCM) -> str:
    return base64.b64encode(mulaw_encode(frame)).decode("ascii")


class JsonWire(Wire):
    """Twilio and Telnyx: JSON text both ways, base64 μ-law at 8 kHz."""

    def read(self, raw: Message, at: float) -> Heard:
        if isinstance(raw, bytes):
            return Heard(at, "other", raw=raw)
        message: dict[str, Any] = json.loads(raw)
        event = message.get("event")
        if event == "media" and isinstance(message.get("media", {}).get("payload"), str):
            return Heard(at, "media", raw=raw)
        if event == "mark":
            return Heard(at, "mark", str(message["mark"]["name"]), raw)
        if event == "clear":
            return Heard(at, "clear", raw=raw)
        return Heard(at, "other", raw=raw)

    def oversized(self) -> Message:
        """A media message with far more than 20 ms of (valid) audio in it."""
        return json.dumps({"event": "media", "media": {"payload": "/w==" * (_OVERSIZED // 4)}})


class TwilioWire(JsonWire):
    route = "/twilio/stream"
    transport = "twilio"

    def __init__(self) -> None:
        super().__init__()
        self.call_id = "CA" + uuid.uuid4().hex
        self.stream_sid = "MZ" + uuid.uuid4().hex
        self.sequence = 0

    def _message(self, event: str, body: dict[str, Any]) -> str:
        self.sequence += 1
        return json.dumps(
            {
                "event": event,
                "sequenceNumber": str(self.sequence),
                event: body,
                "streamSid": self.stream_sid,
            }
        )

    def opening(self) -> list[Message]:
        start = {
            "accountSid": "AC" + uuid.uuid4().hex,
            "streamSid": self.stream_sid,
            "callSid": self.call_id,
            "tracks": ["inbound"],
            "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
            "customParameters": {"from": "+15555550100", "to": "+15555550199"},
        }
        connected = json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"})
        return [connected, self._message("start", start)]

    def media(self, frame: PCM) -> Message:
        return self._message("media", {"track": "inbound", "payload": _mulaw_b64(frame)})

    def echo(self, name: str) -> Message:
        return self._message("mark", {"name": name})

    def hang_up(self) -> Message | None:
        return self._message("stop", {"callSid": self.call_id})

    def read(self, raw: Message, at: float) -> Heard:
        heard = super().read(raw, at)
        if heard.kind != "other" and json.loads(raw).get("streamSid") != self.stream_sid:
            return Heard(at, "other", raw=raw)  # Twilio needs the stream on every message
        return heard

    def bad_before_start(self) -> dict[str, Message]:
        media = {"event": "media", "streamSid": self.stream_sid, "media": {"payload": "/w=="}}
        return {
            "not JSON": "hello?",
            "before start": json.dumps({"event": "media", **media}),
            "binary message": b"\xff" * 160,
            "missing field event": json.dumps({"streamSid": self.stream_sid}),
        }

    def bad_in_call(self) -> dict[str, Message]:
        return {
            "not JSON": "{not json",
            "unknown event": json.dumps({"event": "transcript", "streamSid": self.stream_sid}),
            "not valid base64": json.dumps(
                {"event": "media", "streamSid": self.stream_sid, "media": {"payload": "@@@@"}}
            ),
            "binary message": bytes(mulaw_encode(np.zeros(160, dtype=np.int16))),
        }


class TelnyxWire(JsonWire):
    route = "/telnyx/stream"
    transport = "telnyx"

    def __init__(self) -> None:
        super().__init__()
        self.call_id = "v3:" + uuid.uuid4().hex
        self.stream_id = str(uuid.uuid4()).upper()
        self.sequence = 0

    def _next(self) -> str:
        self.sequence += 1
        return str(self.sequence)

    def opening(self) -> list[Message]:
        start = {
            "event": "start",
            "sequence_number": self._next(),
            "start": {
                "user_id": str(uuid.uuid4()),
                "call_control_id": self.call_id,
                "call_session_id": str(uuid.uuid4()),
                "from": "+13122010094",
                "to": "+13122123456",
                "media_format": {"encoding": "PCMU", "sample_rate": 8000, "channels": 1},
            },
            "stream_id": self.stream_id,
        }
        return [json.dumps({"event": "connected", "version": "1.0.0"}), json.dumps(start)]

    def media(self, frame: PCM) -> Message:
        sequence = self._next()
        media = {
            "track": "inbound",
            "chunk": str(int(sequence) - 1),
            "timestamp": str((int(sequence) - 2) * 20),
            "payload": _mulaw_b64(frame),
        }
        return json.dumps(
            {
                "event": "media",
                "sequence_number": sequence,
                "media": media,
                "stream_id": self.stream_id,
            }
        )

    def echo(self, name: str) -> Message:
        return json.dumps(
            {
                "event": "mark",
                "sequence_number": self._next(),
                "stream_id": self.stream_id,
                "mark": {"name": name},
            }
        )

    def hang_up(self) -> Message | None:
        return json.dumps(
            {
                "event": "stop",
                "sequence_number": self._next(),
                "stop": {"call_control_id": self.call_id},
                "stream_id": self.stream_id,
            }
        )

    def bad_before_start(self) -> dict[str, Message]:
        media = {"payload": _mulaw_b64(np.zeros(160, dtype=np.int16))}
        return {
            "not JSON": "hello?",
            "before start": json.dumps(
                {"event": "media", "sequence_number": "1", "media": media, "stream_id": "x"}
            ),
            "binary message": b"\xff" * 160,
            "missing field event": json.dumps({"stream_id": self.stream_id}),
        }

    def bad_in_call(self) -> dict[str, Message]:
        # No sequence numbers: a rejected message must not leave a gap in the phone's sequence.
        return {
            "not JSON": "{not json",
            "unknown event": json.dumps({"event": "transcription", "stream_id": self.stream_id}),
            "not valid base64": json.dumps(
                {"event": "media", "stream_id": self.stream_id, "media": {"payload": "@@@@"}}
            ),
            "binary message": bytes(mulaw_encode(np.zeros(160, dtype=np.int16))),
        }


class VonageWire(Wire):
    route = "/vonage/stream"
    transport = "vonage"
    frame_samples = 320
    wire_rate = 16_000

    def __init__(self) -> None:
        super().__init__()
        self.call_id = str(uuid.uuid4())

    def opening(self) -> list[Message]:
        connected = {
            "event": "websocket:connected",
            "content-type": "audio/l16;rate=16000",
            "uuid": self.call_id,
            "from": "447700900000",
            "to": "447700900001",
        }
        return [json.dumps(connected)]

    def media(self, frame: PCM) -> Message:
        return np.asarray(frame, dtype="<i2").tobytes()

    def echo(self, name: str) -> Message:
        return json.dumps({"event": "websocket:notify", "payload": {"name": name}})

    def on_clear(self) -> list[Message]:
        return [json.dumps({"event": "websocket:cleared"})]

    def read(self, raw: Message, at: float) -> Heard:
        if isinstance(raw, bytes):
            return Heard(at, "media" if len(raw) == 640 else "other", raw=raw)
        message: dict[str, Any] = json.loads(raw)
        action = message.get("action")
        if action == "notify" and isinstance(message.get("payload"), dict):
            return Heard(at, "mark", str(message["payload"].get("name")), raw)
        if action == "clear":
            return Heard(at, "clear", raw=raw)
        return Heard(at, "other", raw=raw)

    def bad_before_start(self) -> dict[str, Message]:
        return {
            "not JSON": "hello?",
            "before websocket:connected": json.dumps({"event": "websocket:dtmf", "digit": "1"}),
            "audio before websocket:connected": b"\x00" * 640,
            "missing field event": json.dumps({"content-type": "audio/l16;rate=16000"}),
        }

    def bad_in_call(self) -> dict[str, Message]:
        return {
            "not JSON": "{not json",
            "unknown event": json.dumps({"event": "websocket:media:update"}),
            "odd length": b"\x00" * 641,
        }

    def oversized(self) -> Message:
        return b"\x00" * _OVERSIZED  # an audio message far beyond one frame

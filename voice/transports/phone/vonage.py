"""Vonage Voice API websockets, the wire protocol only (no sockets, no event loop).

Audio travels both ways as binary messages of raw 16-bit little-endian linear PCM, mono, 20 ms
each (640 bytes). Control travels as JSON text: Vonage's first message is
`{"event": "websocket:connected", "content-type": "audio/l16;rate=16000", ...}` with the
NCCO endpoint's `headers` echoed at the top level (that is where the call's uuid and numbers
come from, when the answer NCCO puts them there); `websocket:dtmf` carries `digit`. We send
`{"action": "clear"}` (acknowledged by `websocket:cleared`) and, as marks,
`{"action": "notify", "payload": {...}}`, which Vonage answers with `websocket:notify` and the
same payload once the audio queued before it has played. Vonage sends no stop message: the
socket simply closes.
"""

from __future__ import annotations

import json
import uuid

import numpy as np

from voice.transports.phone.wire import (
    PCM,
    Dtmf,
    Ignored,
    MarkPlayed,
    Media,
    ProtocolError,
    Start,
    WireEvent,
    json_message,
    object_field,
    text_field,
)

_CALL_ID_HEADERS = ("uuid", "call_uuid", "conversation_uuid")


class VonageProtocol:
    """One Vonage websocket call leg, L16 at 16 kHz (the NCCO's `audio/l16;rate=16000`).

    An 8 kHz leg is refused rather than followed: transports size their resamplers from
    `wire_rate` before the first message arrives.
    """

    name = "vonage"
    wire_rate = 16_000
    frame_samples = 320
    # Vonage takes exactly 20 ms per binary message.
    frames_per_message = 1
    supports_marks = True

    def __init__(self) -> None:
        self.started = False

    def parse(self, message: str | bytes) -> list[WireEvent]:
        if isinstance(message, bytes):
            if not self.started:
                raise ProtocolError("audio before websocket:connected")
            if len(message) % 2:
                raise ProtocolError(f"L16 audio of odd length {len(message)}")
            return [Media(np.frombuffer(message, dtype="<i2").astype(np.int16))]
        data = json_message(message)
        event = text_field(data, "event")
        if event == "websocket:connected":
            return [self._connected(data)]
        if not self.started:
            raise ProtocolError(f"{event!r} before websocket:connected")
        if event == "websocket:dtmf":
            digit = data.get("digit")
            if not isinstance(digit, str | int) or isinstance(digit, bool):
                raise ProtocolError("websocket:dtmf without a digit")
            return [Dtmf(str(digit))]
        if event == "websocket:notify":
            return [MarkPlayed(text_field(object_field(data, "payload"), "name"))]
        if event == "websocket:cleared":
            return [Ignored("cleared")]
        raise ProtocolError(f"unknown event {event!r}")

    def _connected(self, data: dict[str, object]) -> Start:
        if self.started:
            raise ProtocolError("second websocket:connected")
        content_type = text_field(data, "content-type")
        if content_type.replace(" ", "").lower() != f"audio/l16;rate={self.wire_rate}":
            raise ProtocolError(f"unsupported content-type {content_type!r}")
        self.started = True
        headers = {
            key: value
            for key, value in data.items()
            if key not in ("event", "content-type") and isinstance(value, str)
        }
        call_id = next((headers[k] for k in _CALL_ID_HEADERS if headers.get(k)), None)
        call_id = call_id or f"vonage-{uuid.uuid4().hex}"
        return Start(
            call_id=call_id,
            stream_id=call_id,
            caller=headers.get("from"),
            callee=headers.get("to"),
            parameters=headers,
            sample_rate=self.wire_rate,
        )

    def media(self, pcm: PCM) -> bytes:
        """One 20 ms binary frame; a shorter last piece is padded with silence."""
        if len(pcm) > self.frame_samples:
            raise ValueError(f"Vonage frames hold {self.frame_samples} samples, not {len(pcm)}")
        frame = np.zeros(self.frame_samples, dtype="<i2")
        frame[: len(pcm)] = pcm
        return frame.tobytes()

    def mark(self, name: str) -> str:
        return json.dumps({"action": "notify", "payload": {"name": name}})

    def clear(self) -> str:
        return json.dumps({"action": "clear"})

"""Telnyx media streaming, the wire protocol only (no sockets, no event loop).

Telnyx's messages look like Twilio's with snake_case: `connected`, then `start` (the call in
`start.call_control_id`, the stream in a top-level `stream_id`), `media` (base64 RTP payload,
PCMU at 8 kHz by default), `dtmf`, `mark`, `error` and `stop`, each with a string
`sequence_number`. Telnyx documents that media frames may arrive out of order, so media is
released in `sequence_number` order, waiting at most `REORDER_WINDOW` frames for a gap to fill.
We send `media`, `mark` and `clear` (no stream id needed); Telnyx returns a mark when the audio
before it has played, at once if nothing is queued, and returns queued marks on `clear`.
"""

from __future__ import annotations

import json
from typing import Any

from voice.transports.phone.wire import (
    PCM,
    Dtmf,
    Ignored,
    MarkPlayed,
    Media,
    ProtocolError,
    Start,
    Stop,
    WireEvent,
    decode_mulaw_payload,
    encode_mulaw_payload,
    json_message,
    object_field,
    string_map,
    text_field,
)

REORDER_WINDOW = 5  # frames (100 ms) held back waiting for a missing one before skipping it
_MULAW = ("PCMU", "audio/x-mulaw")


class TelnyxProtocol:
    """One Telnyx media stream in bidirectional RTP mode with the PCMU codec."""

    name = "telnyx"
    wire_rate = 8000
    frame_samples = 160
    supports_marks = True

    def __init__(self, reorder_window: int = REORDER_WINDOW) -> None:
        self.stream_id: str | None = None
        self.stopped = False
        self.reorder_window = reorder_window
        self.late_frames = 0  # media that arrived after its place had been given up
        self._next: int | None = None  # the sequence number released next
        self._held: dict[int, Media | None] = {}  # waiting for a gap; None: a non-media slot

    def parse(self, message: str | bytes) -> list[WireEvent]:
        data = json_message(message)
        event = text_field(data, "event")
        if self.stopped:
            raise ProtocolError(f"{event!r} after stop")
        if event == "connected":
            return [Ignored("connected")]
        if event == "start":
            return [self._start(data)]
        if self.stream_id is None:
            raise ProtocolError(f"{event!r} before start")
        if event == "media":
            media = object_field(data, "media")
            if media.get("track", "inbound") != "inbound":
                return [Ignored("outbound track")]
            frame = Media(decode_mulaw_payload(text_field(media, "payload")))
            return self._in_order(_sequence(data), frame)
        if event == "dtmf":
            return [*self._in_order(_sequence(data), None), Dtmf(text_field(data, "dtmf", "digit"))]
        if event == "mark":
            name = text_field(data, "mark", "name")
            return [*self._in_order(_sequence(data), None), MarkPlayed(name)]
        if event == "error":
            payload = data.get("payload")
            detail = payload if isinstance(payload, dict) else {}
            return [Ignored(f"error {detail.get('code')}: {detail.get('detail') or detail}")]
        if event == "stop":
            self.stopped = True
            flushed = [held for _, held in sorted(self._held.items()) if held is not None]
            self._held.clear()
            return [*flushed, Stop("stream stopped")]
        raise ProtocolError(f"unknown event {event!r}")

    def _start(self, data: dict[str, Any]) -> Start:
        if self.stream_id is not None:
            raise ProtocolError("second start")
        start = object_field(data, "start")
        media_format = object_field(start, "media_format")
        encoding = media_format.get("encoding")
        rate = media_format.get("sample_rate")
        if encoding not in _MULAW or rate != self.wire_rate:
            raise ProtocolError(f"unsupported media format {encoding!r} at {rate!r} Hz")
        parameters = string_map(start.get("custom_parameters"), "start.custom_parameters")
        if isinstance(start.get("client_state"), str):
            parameters.setdefault("client_state", start["client_state"])
        caller, callee = start.get("from"), start.get("to")
        self.stream_id = text_field(data, "stream_id")
        sequence = _sequence(data)
        self._next = None if sequence is None else sequence + 1
        return Start(
            call_id=text_field(start, "call_control_id"),
            stream_id=self.stream_id,
            caller=caller if isinstance(caller, str) else None,
            callee=callee if isinstance(callee, str) else None,
            parameters=parameters,
            sample_rate=self.wire_rate,
        )

    def _in_order(self, sequence: int | None, frame: Media | None) -> list[WireEvent]:
        """Media released in sequence order; other events only fill their slot."""
        if sequence is None:
            return [] if frame is None else [frame]
        if self._next is None:
            self._next = sequence
        if sequence < self._next:
            if frame is None:
                return []
            self.late_frames += 1
            return [Ignored("late media")]
        self._held[sequence] = frame
        released: list[WireEvent] = []
        while self._held:
            if self._next not in self._held:
                if len(self._held) <= self.reorder_window:
                    break
                self._next = min(self._held)  # give up on the gap
            held = self._held.pop(self._next)
            self._next += 1
            if held is not None:
                released.append(held)
        return released

    def media(self, pcm: PCM) -> str:
        return json.dumps({"event": "media", "media": {"payload": encode_mulaw_payload(pcm)}})

    def mark(self, name: str) -> str:
        return json.dumps({"event": "mark", "mark": {"name": name}})

    def clear(self) -> str:
        return json.dumps({"event": "clear"})


def _sequence(data: dict[str, Any]) -> int | None:
    """The message's `sequence_number` (a decimal string), None where Telnyx left it out."""
    value = data.get("sequence_number")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ProtocolError("sequence_number is not a number")
    try:
        return int(value)
    except ValueError:
        raise ProtocolError(f"sequence_number {value!r} is not a number") from None

"""What Twilio's and Telnyx's media streams share: one base, `JsonMediaProtocol`, for the
protocols that carry a call as JSON text events with base64 μ-law payloads. Nothing here touches
a socket or the event loop.

Telnyx modelled its media streaming on Twilio Media Streams, so both send `connected`, then one
`start` (the call, the stream, the media format and custom parameters), then `media`, `dtmf`,
`mark` and finally `stop`, and both take `media`, `mark` and `clear` back. A provider's subclass
holds only what differs on its wire: field names, accepted encodings, where its start message
keeps the stream id and the numbers, how outbound messages are addressed, and any events or
ordering of its own (Telnyx's `error`, its `sequence_number` reordering).

Vonage is not one of these: its audio travels as binary L16 frames and its control events are
`websocket:*` JSON, so `vonage.py` builds on `wire.py` alone.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from typing import Any, ClassVar

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


class JsonMediaProtocol(ABC):
    """One call's JSON media stream: `connected` is ignored, `start` comes once and before
    anything else, nothing may follow `stop`, and only the inbound track's audio is heard.

    Subclasses set the `WireProtocol` attributes and the start message's field names below, and
    say where the stream id and the caller's numbers are (`_stream_id`, `_parties`).
    """

    name: str
    wire_rate: int
    frame_samples: int
    frames_per_message: int
    supports_marks: bool

    media_format_field: ClassVar[str]  # the object in `start` that names encoding and rate
    sample_rate_field: ClassVar[str]  # the rate's key inside that object
    encodings: ClassVar[tuple[str, ...]]  # the names μ-law goes by on this wire
    parameters_field: ClassVar[str]  # the custom parameters' object in `start`
    call_id_field: ClassVar[str]  # the call's id in `start`

    def __init__(self) -> None:
        self.stream_id: str | None = None
        self.stopped = False

    # -- inbound ---------------------------------------------------------------------------

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
            return self._release(data, frame)
        if event == "dtmf":
            return [*self._release(data, None), Dtmf(text_field(data, "dtmf", "digit"))]
        if event == "mark":
            name = text_field(data, "mark", "name")
            return [*self._release(data, None), MarkPlayed(name)]
        if event == "stop":
            self.stopped = True
            return [*self._flush(), Stop("stream stopped")]
        return self._other_event(event, data)

    def _start(self, data: dict[str, Any]) -> Start:
        if self.stream_id is not None:
            raise ProtocolError("second start")
        start = object_field(data, "start")
        media_format = object_field(start, self.media_format_field)
        encoding = media_format.get("encoding")
        rate = media_format.get(self.sample_rate_field)
        if encoding not in self.encodings or rate != self.wire_rate:
            raise ProtocolError(f"unsupported media format {encoding!r} at {rate!r} Hz")
        parameters = self._parameters(start)
        caller, callee = self._parties(start, parameters)
        call_id = text_field(start, self.call_id_field)
        stream_id = self._stream_id(data, start)
        self._started(data)
        # Only a start that was read whole starts the stream: one refused (no call id, say)
        # leaves room for a correct one.
        self.stream_id = stream_id
        return Start(
            call_id=call_id,
            stream_id=stream_id,
            caller=caller,
            callee=callee,
            parameters=parameters,
            sample_rate=self.wire_rate,
        )

    def _parameters(self, start: dict[str, Any]) -> dict[str, str]:
        """The start message's custom parameters (absent: none)."""
        field = self.parameters_field
        return string_map(start.get(field), f"start.{field}")

    @abstractmethod
    def _parties(
        self, start: dict[str, Any], parameters: dict[str, str]
    ) -> tuple[str | None, str | None]:
        """The caller's and the callee's numbers, where this provider's start carries them."""

    @abstractmethod
    def _stream_id(self, data: dict[str, Any], start: dict[str, Any]) -> str:
        """The stream's id from the start message (`data`, its `start` object inside)."""

    def _started(self, data: dict[str, Any]) -> None:
        """Per-stream state the start message sets once the stream id is known (none here)."""
        return None

    def _release(self, data: dict[str, Any], frame: Media | None) -> list[WireEvent]:
        """What this message lets out now, `frame` being its audio (None for other events):
        here everything at once, in arrival order."""
        return [] if frame is None else [frame]

    def _flush(self) -> list[WireEvent]:
        """What is still held back when the stream stops (nothing here)."""
        return []

    def _other_event(self, event: str, data: dict[str, Any]) -> list[WireEvent]:
        """An event after start that the shared vocabulary does not know."""
        raise ProtocolError(f"unknown event {event!r}")

    # -- outbound --------------------------------------------------------------------------

    def media(self, pcm: PCM) -> str:
        payload = encode_mulaw_payload(pcm)
        return self._message("media", media={"payload": payload})

    def mark(self, name: str) -> str:
        return self._message("mark", mark={"name": name})

    def clear(self) -> str:
        return self._message("clear")

    def _message(self, event: str, **body: object) -> str:
        return json.dumps({"event": event, **self._address(), **body})

    def _address(self) -> dict[str, str]:
        """The fields that address an outbound message to this stream (none here)."""
        return {}

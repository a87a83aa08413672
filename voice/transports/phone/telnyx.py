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

from typing import Any

from voice.transports.phone.json_media import JsonMediaProtocol
from voice.transports.phone.wire import (
    Ignored,
    Media,
    ProtocolError,
    WireEvent,
    text_field,
)

REORDER_WINDOW = 5  # frames (100 ms) held back waiting for a missing one before skipping it


class TelnyxProtocol(JsonMediaProtocol):
    """One Telnyx media stream in bidirectional RTP mode with the PCMU codec.

    The numbers are `start.from` and `start.to`; a string `start.client_state` joins the custom
    parameters unless one of them has that name. Our messages carry no stream id.
    """

    name = "telnyx"
    wire_rate = 8000
    frame_samples = 160
    # Telnyx takes RTP media of 20 ms to 30 s per message; one of 100 ms is a fifth of them.
    frames_per_message = 5
    supports_marks = True

    media_format_field = "media_format"
    sample_rate_field = "sample_rate"
    encodings = ("PCMU", "audio/x-mulaw")
    parameters_field = "custom_parameters"
    call_id_field = "call_control_id"

    def __init__(self, reorder_window: int = REORDER_WINDOW) -> None:
        super().__init__()
        self.reorder_window = reorder_window
        self.late_frames = 0  # media that arrived after its place had been given up
        self._next: int | None = None  # the sequence number released next
        self._held: dict[int, Media | None] = {}  # waiting for a gap; None: a non-media slot

    def _parameters(self, start: dict[str, Any]) -> dict[str, str]:
        parameters = super()._parameters(start)
        if isinstance(start.get("client_state"), str):
            parameters.setdefault("client_state", start["client_state"])
        return parameters

    def _parties(
        self, start: dict[str, Any], parameters: dict[str, str]
    ) -> tuple[str | None, str | None]:
        caller, callee = start.get("from"), start.get("to")
        return (
            caller if isinstance(caller, str) else None,
            callee if isinstance(callee, str) else None,
        )

    def _stream_id(self, data: dict[str, Any], start: dict[str, Any]) -> str:
        return text_field(data, "stream_id")

    def _started(self, data: dict[str, Any]) -> None:
        sequence = _sequence(data)
        self._next = None if sequence is None else sequence + 1

    def _release(self, data: dict[str, Any], frame: Media | None) -> list[WireEvent]:
        return self._in_order(_sequence(data), frame)

    def _flush(self) -> list[WireEvent]:
        flushed: list[WireEvent] = [
            held for _, held in sorted(self._held.items()) if held is not None
        ]
        self._held.clear()
        return flushed

    def _other_event(self, event: str, data: dict[str, Any]) -> list[WireEvent]:
        if event != "error":
            return super()._other_event(event, data)
        payload = data.get("payload")
        detail = payload if isinstance(payload, dict) else {}
        return [Ignored(f"error {detail.get('code')}: {detail.get('detail') or detail}")]

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

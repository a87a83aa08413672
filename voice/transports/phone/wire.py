"""What every phone media stream shares, whatever the provider (Twilio, Telnyx, Vonage): the
inbound events a websocket transport gets from a protocol's `parse()`, `ProtocolError`, the
`WireProtocol` shape the transport drives, and the JSON and μ-law payload helpers the protocols
parse with. Nothing here touches a socket or the event loop.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from voice.audio import mulaw_decode, mulaw_encode

PCM = npt.NDArray[np.int16]


# -- what every phone protocol hands its transport -----------------------------------------


@dataclass(frozen=True)
class Start:
    """The provider's stream began: who is calling whom, and the audio's rate on the wire."""

    call_id: str
    stream_id: str
    caller: str | None
    callee: str | None
    parameters: dict[str, str] = field(default_factory=dict)
    sample_rate: int = 8000


@dataclass(frozen=True, eq=False)
class Media:
    """Caller audio decoded to int16 at the protocol's wire rate (not yet resampled)."""

    pcm: PCM


@dataclass(frozen=True)
class Dtmf:
    """A key the caller pressed."""

    digit: str


@dataclass(frozen=True)
class MarkPlayed:
    """The provider says playback reached this mark (or dropped it with a clear)."""

    name: str


@dataclass(frozen=True)
class Stop:
    """The provider ended the stream (the caller hung up or the call was redirected)."""

    reason: str


@dataclass(frozen=True)
class Ignored:
    """A known message that needs no action, such as Twilio's `connected`."""

    what: str


WireEvent = Start | Media | Dtmf | MarkPlayed | Stop | Ignored


class ProtocolError(ValueError):
    """The provider (or someone pretending to be it) sent something this protocol rejects."""


class WireProtocol(Protocol):
    """One call's side of a provider's websocket protocol, driven by a websocket transport.

    `parse` keeps per-stream state (started, stream id, reordering); outbound audio is int16 at
    `wire_rate`, in messages of `frame_samples` (20 ms) up to `frames_per_message` times that.
    """

    name: str
    wire_rate: int
    frame_samples: int
    frames_per_message: int
    supports_marks: bool

    def parse(self, message: str | bytes) -> list[WireEvent]: ...

    def media(self, pcm: PCM) -> str | bytes: ...

    def mark(self, name: str) -> str | None: ...

    def clear(self) -> str | bytes: ...


# -- JSON helpers shared with the other JSON protocols -------------------------------------


def json_message(message: str | bytes) -> dict[str, Any]:
    """A text websocket message as a JSON object; ProtocolError for anything else."""
    if not isinstance(message, str):
        raise ProtocolError("binary message where JSON text was expected")
    try:
        parsed = json.loads(message)
    except json.JSONDecodeError as error:
        raise ProtocolError(f"not JSON: {error}") from None
    if not isinstance(parsed, dict):
        raise ProtocolError("JSON message is not an object")
    return parsed


def text_field(obj: Mapping[str, Any], *path: str) -> str:
    """The string at `path` inside nested objects; ProtocolError if missing or not a string."""
    value: Any = obj
    for key in path:
        if not isinstance(value, Mapping) or key not in value:
            raise ProtocolError(f"missing field {'.'.join(path)}")
        value = value[key]
    if not isinstance(value, str):
        raise ProtocolError(f"field {'.'.join(path)} is not a string")
    return value


def object_field(obj: Mapping[str, Any], key: str) -> dict[str, Any]:
    """The JSON object under `key`; ProtocolError if missing or not an object."""
    value = obj.get(key)
    if not isinstance(value, dict):
        raise ProtocolError(f"missing object {key!r}")
    return value


def string_map(value: object, what: str) -> dict[str, str]:
    """A JSON object of string values (custom parameters); absent means empty."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise ProtocolError(f"{what} is not an object of strings")
    return {str(k): v for k, v in value.items()}


def decode_mulaw_payload(payload: str) -> PCM:
    """Base64 μ-law (no headers) to int16; ProtocolError for invalid base64."""
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError("media payload is not valid base64") from None
    return mulaw_decode(data)


def encode_mulaw_payload(pcm: PCM) -> str:
    """int16 samples to base64 μ-law text."""
    return base64.b64encode(mulaw_encode(pcm)).decode("ascii")

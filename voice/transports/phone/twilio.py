"""Twilio Media Streams, the wire protocol only: messages in and out, TwiML, webhook signatures.

What every phone protocol shares is in `wire.py`. Nothing here touches a socket or the event
loop, so each message shape is a plain unit test.

Message shapes follow Twilio's "Media Streams - WebSocket Messages" page: `connected` (no
`sequenceNumber`), then `start`, `media`, `dtmf`, `mark`, `stop`, each with `streamSid` and a
string `sequenceNumber`; audio is base64 μ-law at 8 kHz. We send `media`, `mark` and `clear`,
each carrying `streamSid`. Twilio echoes a mark once the audio queued before it has played, and
`clear` empties its buffer and sends the pending marks back at once.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping
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

CALLER_PARAMETER = "from"  # <Parameter> names `stream_twiml` callers use for the numbers
CALLEE_PARAMETER = "to"
SIGNATURE_HEADER = "X-Twilio-Signature"
STREAM_TOKEN_PARAMETER = "token"  # the `<Parameter>` (or `?token=`) that admits a stream
_NOT_XML_SAFE = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff\ufffe\uffff]")


# -- Twilio Media Streams ------------------------------------------------------------------


class TwilioProtocol:
    """One Twilio Media Stream (bidirectional, from `<Connect><Stream>`)."""

    name = "twilio"
    wire_rate = 8000
    frame_samples = 160
    supports_marks = True

    def __init__(self) -> None:
        self.stream_sid: str | None = None
        self.stopped = False

    def parse(self, message: str | bytes) -> list[WireEvent]:
        data = json_message(message)
        event = text_field(data, "event")
        if self.stopped:
            raise ProtocolError(f"{event!r} after stop")
        if event == "connected":
            return [Ignored("connected")]
        if event == "start":
            return [self._start(data)]
        if self.stream_sid is None:
            raise ProtocolError(f"{event!r} before start")
        if event == "media":
            media = object_field(data, "media")
            if media.get("track", "inbound") != "inbound":
                return [Ignored("outbound track")]
            return [Media(decode_mulaw_payload(text_field(media, "payload")))]
        if event == "dtmf":
            return [Dtmf(text_field(data, "dtmf", "digit"))]
        if event == "mark":
            return [MarkPlayed(text_field(data, "mark", "name"))]
        if event == "stop":
            self.stopped = True
            return [Stop("stream stopped")]
        raise ProtocolError(f"unknown event {event!r}")

    def _start(self, data: dict[str, Any]) -> Start:
        if self.stream_sid is not None:
            raise ProtocolError("second start")
        start = object_field(data, "start")
        media_format = object_field(start, "mediaFormat")
        encoding = media_format.get("encoding")
        rate = media_format.get("sampleRate")
        if encoding != "audio/x-mulaw" or rate != self.wire_rate:
            raise ProtocolError(f"unsupported media format {encoding!r} at {rate!r} Hz")
        parameters = string_map(start.get("customParameters"), "start.customParameters")
        self.stream_sid = text_field(start, "streamSid")
        return Start(
            call_id=text_field(start, "callSid"),
            stream_id=self.stream_sid,
            caller=parameters.get(CALLER_PARAMETER),
            callee=parameters.get(CALLEE_PARAMETER),
            parameters=parameters,
            sample_rate=self.wire_rate,
        )

    def _sid(self) -> str:
        if self.stream_sid is None:
            raise RuntimeError("nothing can be sent to Twilio before its start message")
        return self.stream_sid

    def media(self, pcm: PCM) -> str:
        payload = encode_mulaw_payload(pcm)
        return json.dumps(
            {"event": "media", "streamSid": self._sid(), "media": {"payload": payload}}
        )

    def mark(self, name: str) -> str:
        return json.dumps({"event": "mark", "streamSid": self._sid(), "mark": {"name": name}})

    def clear(self) -> str:
        return json.dumps({"event": "clear", "streamSid": self._sid()})


# -- TwiML ---------------------------------------------------------------------------------


def _twiml(response: ET.Element) -> str:
    return '<?xml version="1.0" encoding="UTF-8"?>' + ET.tostring(response, encoding="unicode")


def xml_safe(text: str) -> str:
    """`text` without control characters (C0 and DEL) and what XML 1.0 cannot carry at all
    (surrogates, U+FFFE, U+FFFF), so that a hostile webhook parameter keeps TwiML parseable."""
    return _NOT_XML_SAFE.sub("", text)


def stream_twiml(stream_url: str, parameters: Mapping[str, str]) -> str:
    """Answer a call by connecting it to a bidirectional stream, carrying `parameters`."""
    response = ET.Element("Response")
    url = xml_safe(stream_url)
    stream = ET.SubElement(ET.SubElement(response, "Connect"), "Stream", url=url)
    for name, value in parameters.items():
        ET.SubElement(stream, "Parameter", name=xml_safe(name), value=xml_safe(value))
    return _twiml(response)


def reject_twiml(message: str) -> str:
    """Turn a call away politely: say `message` (whitespace runs made one space), then hang up."""
    response = ET.Element("Response")
    words = (xml_safe(word) for word in message.split())
    ET.SubElement(response, "Say").text = " ".join(word for word in words if word)
    ET.SubElement(response, "Hangup")
    return _twiml(response)


# -- webhook signatures --------------------------------------------------------------------


def twilio_signature(auth_token: str, url: str, params: Mapping[str, str]) -> str:
    """Twilio's `X-Twilio-Signature`: base64 HMAC-SHA1 of the full URL followed by every POST
    parameter's name and value, sorted by name, keyed with the account's auth token."""
    signed = url + "".join(name + params[name] for name in sorted(params))
    digest = hmac.new(auth_token.encode(), signed.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode("ascii")


def signature_is_valid(
    auth_token: str, url: str, params: Mapping[str, str], signature: str | None
) -> bool:
    """Whether `signature` is Twilio's for this request (constant-time; missing is invalid)."""
    if not signature:
        return False
    expected = twilio_signature(auth_token, url, params)
    return hmac.compare_digest(expected.encode(), signature.encode())

"""Twilio Media Streams, the wire protocol only: messages in and out, TwiML, webhook signatures.

What every phone protocol shares is in `wire.py`, what Twilio's and Telnyx's JSON media streams
share in `json_media.py`. Nothing here touches a socket or the event loop, so each message shape
is a plain unit test.

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
import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from voice.transports.phone.json_media import JsonMediaProtocol
from voice.transports.phone.wire import text_field

CALLER_PARAMETER = "from"  # <Parameter> names `stream_twiml` callers use for the numbers
CALLEE_PARAMETER = "to"
SIGNATURE_HEADER = "X-Twilio-Signature"
STREAM_TOKEN_PARAMETER = "token"  # the `<Parameter>` (or `?token=`) that admits a stream
_NOT_XML_SAFE = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff\ufffe\uffff]")


# -- Twilio Media Streams ------------------------------------------------------------------


class TwilioProtocol(JsonMediaProtocol):
    """One Twilio Media Stream (bidirectional, from `<Connect><Stream>`).

    The numbers come from the `<Parameter>`s `stream_twiml` was given; every message we send
    names the stream's `streamSid`.
    """

    name = "twilio"
    wire_rate = 8000
    frame_samples = 160
    # Twilio plays a media message of any length; one of 100 ms is a fifth of the messages.
    frames_per_message = 5
    supports_marks = True

    media_format_field = "mediaFormat"
    sample_rate_field = "sampleRate"
    encodings = ("audio/x-mulaw",)
    parameters_field = "customParameters"
    call_id_field = "callSid"

    @property
    def stream_sid(self) -> str | None:
        """Twilio's name for the stream id: `start.streamSid`, None before the start message."""
        return self.stream_id

    @stream_sid.setter
    def stream_sid(self, value: str | None) -> None:
        self.stream_id = value

    def _parties(
        self, start: dict[str, Any], parameters: dict[str, str]
    ) -> tuple[str | None, str | None]:
        return parameters.get(CALLER_PARAMETER), parameters.get(CALLEE_PARAMETER)

    def _stream_id(self, data: dict[str, Any], start: dict[str, Any]) -> str:
        return text_field(start, "streamSid")

    def _address(self) -> dict[str, str]:
        if self.stream_id is None:
            raise RuntimeError("nothing can be sent to Twilio before its start message")
        return {"streamSid": self.stream_id}


# -- TwiML ---------------------------------------------------------------------------------


def _twiml(response: ET.Element) -> str:
    return '<?xml version="1.0" encoding="UTF-8"?>' + ET.tostring(response, encoding="unicode")


def xml_safe(text: str) -> str:
    """`text` without control characters (C0 and DEL) and what XML 1.0 cannot carry at all
    (surrogates, U+FFFE, U+FFFF), so that a hostile webhook parameter keeps TwiML parseable."""
    return _NOT_XML_SAFE.sub("", text)


def stream_twiml(
    stream_url: str, parameters: Mapping[str, str], action_url: str | None = None
) -> str:
    """Answer a call by connecting it to a bidirectional stream, carrying `parameters`. With
    `action_url`, Twilio asks that URL what to do next when the stream ends (`<Connect
    action>`): put the caller through to a person (`dial_twiml`), or hang up."""
    response = ET.Element("Response")
    url = xml_safe(stream_url)
    connect = ET.SubElement(response, "Connect")
    if action_url is not None:
        connect.set("action", xml_safe(action_url))
    stream = ET.SubElement(connect, "Stream", url=url)
    for name, value in parameters.items():
        ET.SubElement(stream, "Parameter", name=xml_safe(name), value=xml_safe(value))
    return _twiml(response)


def dial_twiml(target: str, headers: Mapping[str, str] | None = None) -> str:
    """Put the caller through to `target`: a phone number (`<Dial><Number>`) or a SIP URI
    (`<Dial><Sip>`, `headers` passed as Twilio's custom `X-` SIP headers in the URI)."""
    response = ET.Element("Response")
    dial = ET.SubElement(response, "Dial")
    if target.startswith(("sip:", "sips:")):
        query = "&".join(
            f"{quote(name, safe='-')}={quote(value, safe='')}"
            for name, value in (headers or {}).items()
        )
        uri = f"{target}{'&' if '?' in target else '?'}{query}" if query else target
        ET.SubElement(dial, "Sip").text = xml_safe(uri)
    else:
        ET.SubElement(dial, "Number").text = xml_safe(target)
    return _twiml(response)


def hangup_twiml() -> str:
    response = ET.Element("Response")
    ET.SubElement(response, "Hangup")
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

"""Telnyx's and Vonage's side of a media websocket, for `hotline call --telnyx/--vonage`.

A Telnyx or Vonage call reaches Hotline when the operator's call-control app answers the call
with a stream URL that carries a single-use stream token (`POST /phone/stream-token`). The
caller here does the same: it asks for the token with the API token (or, where the server has
stream tokens off, opens the plain stream route), then plays the provider's part:
- **Telnyx**: JSON both ways, base64 μ-law at 8 kHz; `connected`, then `start` with the numbers
  in `start.from`/`start.to`; every message carries a `sequence_number`; `stop` on hang-up.
- **Vonage**: `websocket:connected` with the numbers as top-level `from`/`to` (the NCCO
  endpoint's headers), then 640-byte binary frames of 16 kHz L16 both ways; marks are
  `notify` actions answered with `websocket:notify`, a clear is acknowledged with
  `websocket:cleared`; the socket simply closes on hang-up.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any, Literal

import httpx
import numpy as np
from websockets.asyncio.client import ClientConnection, connect

from pipeline.transport import PCM
from voice.audio import mulaw_decode, mulaw_encode
from voice.devtools.stream_phone import Message, StreamPhone, talk
from voice.devtools.turns import CallerTurn, CallResult, converse
from voice.server.urls import websocket_url

Provider = Literal["telnyx", "vonage"]


class TelnyxPhone(StreamPhone):
    """Telnyx's side of one media stream."""

    def __init__(self, socket: ClientConnection, caller: str, callee: str) -> None:
        super().__init__(socket)
        self.call_id = "v3:" + uuid.uuid4().hex  # a call_control_id's shape
        self.stream_id = str(uuid.uuid4())
        self.caller, self.callee = caller, callee
        self._sequence = 0

    def _message(self, event: str, body: dict[str, Any] | None = None) -> str:
        self._sequence += 1
        message: dict[str, Any] = {"event": event, "sequence_number": str(self._sequence)}
        if body is not None:
            message[event] = body
        message["stream_id"] = self.stream_id
        return json.dumps(message)

    async def open(self) -> None:
        await self.send(json.dumps({"event": "connected", "version": "1.0.0"}))
        start = {
            "call_control_id": self.call_id,
            "call_session_id": str(uuid.uuid4()),
            "from": self.caller,
            "to": self.callee,
            "media_format": {"encoding": "PCMU", "sample_rate": 8000, "channels": 1},
        }
        await self.send(self._message("start", start))

    def media_message(self, frame: PCM, now: float) -> str:
        payload = base64.b64encode(mulaw_encode(frame)).decode("ascii")
        return self._message("media", {"track": "inbound", "payload": payload})

    def dtmf_message(self, digit: str) -> str:
        return self._message("dtmf", {"digit": digit})

    def mark_message(self, name: str) -> str:
        return self._message("mark", {"name": name})

    def stop_message(self) -> str:
        return self._message("stop", {"call_control_id": self.call_id})

    async def receive(self, raw: Message, at: float) -> None:
        message = _json_object(raw)
        event = message.get("event")
        body = message.get(event) if isinstance(event, str) else None
        if event == "media" and isinstance(body, dict) and isinstance(body.get("payload"), str):
            with contextlib.suppress(binascii.Error, ValueError):  # not audio: nothing played
                self.queue_audio(mulaw_decode(base64.b64decode(body["payload"], validate=True)))
        elif event == "mark" and isinstance(body, dict) and isinstance(body.get("name"), str):
            await self.mark_received(body["name"])
        elif event == "clear":
            await self.cleared()


class VonagePhone(StreamPhone):
    """Vonage's side of one websocket call leg (L16 at 16 kHz)."""

    wire_rate = 16_000

    def __init__(self, socket: ClientConnection, caller: str, callee: str) -> None:
        super().__init__(socket)
        self.call_id = str(uuid.uuid4())
        self.caller, self.callee = caller, callee

    async def open(self) -> None:
        connected = {
            "event": "websocket:connected",
            "content-type": "audio/l16;rate=16000",
            "uuid": self.call_id,
            "from": self.caller,
            "to": self.callee,
        }
        await self.send(json.dumps(connected))

    def media_message(self, frame: PCM, now: float) -> bytes:
        return np.asarray(frame, dtype="<i2").tobytes()

    def dtmf_message(self, digit: str) -> str:
        return json.dumps({"event": "websocket:dtmf", "digit": digit, "duration": 100})

    def mark_message(self, name: str) -> str:
        return json.dumps({"event": "websocket:notify", "payload": {"name": name}})

    async def receive(self, raw: Message, at: float) -> None:
        if isinstance(raw, bytes):
            self.queue_audio(np.frombuffer(raw[: len(raw) // 2 * 2], dtype="<i2").astype(np.int16))
            return
        message = _json_object(raw)
        payload = message.get("payload")
        if message.get("action") == "notify" and isinstance(payload, dict):
            await self.mark_received(str(payload.get("name")))
        elif message.get("action") == "clear":
            await self.cleared()
            await self.send(json.dumps({"event": "websocket:cleared"}))


def _json_object(raw: Message) -> dict[str, Any]:
    """A server message as a JSON object; {} for anything else (the phone ignores it)."""
    try:
        message = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return {}
    return message if isinstance(message, dict) else {}


async def stream_url(
    base_url: str, provider: Provider, call_id: str, headers: dict[str, str]
) -> str:
    """Where the provider's stream goes: the URL with a stream token for `call_id` that the
    server issues (with the API token in `headers`), or the plain route where stream tokens
    are off (409). httpx.HTTPStatusError when the server refuses the token."""
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=10) as http:
        response = await http.post(
            "/phone/stream-token", json={"provider": provider, "call_id": call_id}
        )
    if response.status_code == 409:
        return f"{websocket_url(base_url.rstrip('/'))}/{provider}/stream"
    response.raise_for_status()
    return str(response.json()["stream_url"])


def provider_call_id(provider: Provider) -> str:
    """A fresh call id in the provider's shape: Telnyx's `call_control_id`, Vonage's `uuid`."""
    return "v3:" + uuid.uuid4().hex if provider == "telnyx" else str(uuid.uuid4())


@contextlib.asynccontextmanager
async def provider_stream(
    base_url: str,
    provider: Provider,
    *,
    caller: str,
    callee: str,
    headers: dict[str, str] | None = None,
    call_id: str | None = None,
) -> AsyncIterator[TelnyxPhone | VonagePhone]:
    """The provider's media stream to Hotline at `base_url` for a call from `caller` to
    `callee` (`call_id`, default a fresh one), opened as the provider opens it (a stream token
    first); the phone, its first messages sent, until the block ends."""
    call_id = call_id or provider_call_id(provider)
    url = await stream_url(base_url, provider, call_id, headers or {})
    async with connect(url, compression=None, open_timeout=10) as socket:
        phone = (TelnyxPhone if provider == "telnyx" else VonagePhone)(socket, caller, callee)
        phone.call_id = call_id
        await phone.open()
        yield phone


async def place_provider_call(
    base_url: str,
    provider: Provider,
    utterances: Sequence[PCM],
    *,
    caller: str,
    callee: str,
    headers: dict[str, str] | None = None,
    quiet_s: float = 0.8,
    dtmf: str = "",
    opening_wait_s: float | None = None,
) -> CallResult:
    """Call Hotline at `base_url` as Telnyx or Vonage would, from `caller` to `callee`, and
    speak `utterances` (16 kHz), one turn each (`converse`'s turn-taking); then hang up."""
    turns: list[CallerTurn] = []
    async with provider_stream(
        base_url, provider, caller=caller, callee=callee, headers=headers
    ) as phone:
        script = converse(
            phone, utterances, turns, quiet_s=quiet_s, dtmf=dtmf, opening_wait_s=opening_wait_s
        )
        await talk(phone, 0.0, script)
    return CallResult(phone.call_id, turns, phone.ear.audio())

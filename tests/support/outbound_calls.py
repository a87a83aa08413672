"""The provider's side of a placed call in tests: Twilio's TwiML read back, the media stream
each provider opens once the call is answered (one turn spoken, or a scripted opening: a person's
"Hello?", a voicemail greeting and its beep), and the post-call webhook's receiver."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from pipeline.transport import FRAME_SAMPLES, PCM
from tests.support.outbound_apis import OutboundApis
from tests.support.poll import until
from tests.support.server import Server
from voice.agents.http_tools import SIGNATURE_HEADER, verify
from voice.audio import read_wav
from voice.devtools.phone_caller import PhoneCallResult, TwilioPhone, twilio_sid
from voice.devtools.provider_phones import TelnyxPhone, VonagePhone
from voice.devtools.stream_phone import StreamPhone, talk
from voice.devtools.turn_bench.sources import ASTERISK_SOUNDS, sources_dir
from voice.devtools.turns import CallerTurn, CallResult, converse, first_audible_after
from voice.devtools.twilio_call import place_twilio_call


class Hooks:
    """The post-call webhook's receiver: signed documents, by call id."""

    def __init__(self, secret: str) -> None:
        self.secret = secret
        self.documents: dict[str, dict[str, Any]] = {}

    async def receive(self, request: Request) -> Response:
        raw = await request.body()
        if not verify(
            self.secret.encode(), request.headers.get(SIGNATURE_HEADER, ""), raw, time.time()
        ):
            return JSONResponse({"error": "bad signature"}, status_code=401)
        document = json.loads(raw)
        self.documents[document["call"]["call_id"]] = document
        return JSONResponse({"ok": True})


def asterisk(name: str) -> PCM:
    """One of Asterisk's recorded prompts (Allison: "vm-intro", "beep", "hello"), fetched as
    `hotline amd-bench` fetches them."""
    return read_wav(sources_dir() / ASTERISK_SOUNDS / f"{name}.wav")


def twilio_stream(created: Any) -> tuple[str, str, dict[str, str]]:
    """The placed call's sid, its stream's URL and parameters, from the create Twilio got
    (`OutboundApis.created`)."""
    url, _, parameters = stream_of(created.body["Twiml"])
    return created.answer["sid"], url, parameters


def stream_of(twiml: str) -> tuple[str, str | None, dict[str, str]]:
    """The `<Connect><Stream>`'s URL, the `<Connect action>` and the `<Parameter>`s."""
    root = ET.fromstring(twiml)
    stream = root.find("Connect/Stream")
    connect_verb = root.find("Connect")
    assert stream is not None and connect_verb is not None, twiml
    parameters = {str(p.get("name")): str(p.get("value")) for p in stream.iter("Parameter")}
    return str(stream.get("url")), connect_verb.get("action"), parameters


async def answer(
    server: Server,
    url: str,
    sid: str,
    parameters: dict[str, str],
    speech: PCM,
    asked: dict[str, Any],
    auth: dict[str, str],
) -> tuple[PhoneCallResult, httpx.Response]:
    """Answer the placed call as Twilio would (a turn spoken), and ask for another call while
    it is in progress: the call's result, and the answer to that request."""
    call = asyncio.create_task(
        place_twilio_call(url, [speech], parameters=parameters, call_sid=sid, opening_wait_s=10)
    )
    async with httpx.AsyncClient(base_url=server.url, headers=auth, timeout=30) as http:

        async def in_progress() -> bool:
            found = await http.get(f"/calls/{sid}")
            return found.status_code == 200 and found.json()["state"] == "active"

        await until(in_progress, "the placed call to be in progress", within_s=20)
        busy = await http.post("/calls/outbound", json=asked)
    return await call, busy


async def refused_stream(
    url: str, account_sid: str, sid: str, parameters: dict[str, str]
) -> int | None:
    """Open Twilio's stream for `sid` with `parameters`; the close code the server gave."""
    start = {
        "event": "start",
        "sequenceNumber": "1",
        "streamSid": "MZ" + "0" * 32,
        "start": {
            "accountSid": account_sid,
            "streamSid": "MZ" + "0" * 32,
            "callSid": sid,
            "tracks": ["inbound"],
            "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
            "customParameters": parameters,
        },
    }
    async with asyncio.timeout(10), connect(url, compression=None) as socket:
        await socket.send(json.dumps({"event": "connected", "protocol": "Call", "version": "1"}))
        await socket.send(json.dumps(start))
        with contextlib.suppress(ConnectionClosed):  # closed with an error code: expected
            async for _ in socket:
                pass
        return socket.close_code


async def telnyx_answers(
    url: str, call_id: str, caller: str, callee: str, speech: PCM
) -> CallResult:
    """Telnyx's side of the answered call's stream: one turn, then hang up."""
    async with connect(url, compression=None, open_timeout=10) as socket:
        phone = TelnyxPhone(socket, caller, callee)
        phone.call_id = call_id
        return await one_turn(phone, call_id, speech)


async def one_turn(phone: StreamPhone, call_id: str, speech: PCM) -> CallResult:
    """Open the stream, hear the greeting out, speak `speech`, hear the reply, hang up."""
    turns: list[CallerTurn] = []
    await phone.open()
    await talk(phone, 0.0, converse(phone, [speech], turns, opening_wait_s=10))
    return CallResult(call_id, turns, phone.ear.audio())


class VonageLeg(VonagePhone):
    """Vonage's websocket leg of a placed call: its first message echoes the NCCO endpoint's
    `headers`, and nothing else names the call (no uuid)."""

    def __init__(self, socket: ClientConnection, headers: dict[str, str]) -> None:
        super().__init__(socket, headers["from"], headers["to"])
        self.headers = headers

    async def open(self) -> None:
        connected = {"event": "websocket:connected", "content-type": "audio/l16;rate=16000"}
        await self.send(json.dumps({**connected, **self.headers}))


@dataclass
class Answered:
    """A placed call answered by a scripted opening, from the phone's side: when each frame of
    the opening was sent, when each of the server's media messages arrived, the turns spoken
    after the opening, and whether the server ended the call."""

    sent: list[float]
    media_at: list[float]
    turns: list[CallerTurn]
    server_ended: bool
    first_heard: float | None  # the first audible frame the phone played

    def sent_by(self, samples: int) -> float:
        """When the opening's first `samples` (16 kHz) had all gone: its frame holding the
        last of them was sent, and 20 ms of it played."""
        return self.sent[(samples - 1) // FRAME_SAMPLES] + 0.02


async def answer_with(
    url: str,
    sid: str,
    parameters: dict[str, str],
    opening: PCM,
    then: Sequence[PCM] = (),
    linger_s: float = 20.0,
) -> Answered:
    """Answer the placed call as Twilio would, play `opening` (a person's "Hello?", a
    machine's greeting and beep) from the answer on, then speak `then` one turn each (after
    the greeting is heard out); stay on the line up to `linger_s` for the server to end it."""
    turns: list[CallerTurn] = []
    sent: list[float] = []

    async with connect(url, compression=None, open_timeout=10) as socket:
        phone = TwilioPhone(socket, sid, twilio_sid("AC"), parameters)
        await phone.open()

        async def script() -> None:
            sent.extend(await phone.say(opening))
            if then:
                await converse(phone, list(then), turns, opening_wait_s=10)

        server_ended = await talk(phone, linger_s, script())
    media_at = [m.at for m in phone.received if m.event == "media"]
    first_heard = first_audible_after(0.0)(list(phone.ear.frames))
    return Answered(sent, media_at, turns, server_ended, first_heard)


def screened_call(
    server: Server,
    auth: dict[str, str],
    apis: OutboundApis,
    body: dict[str, Any],
    opening: PCM,
    then: Sequence[PCM] = (),
    linger_s: float = 20.0,
) -> tuple[Answered, dict[str, Any]]:
    """Place `body` (a call with machine detection), answer it with `opening` (`answer_with`),
    and read the call's record back."""
    response = httpx.post(f"{server.url}/calls/outbound", json=body, headers=auth, timeout=30)
    assert response.status_code == 202, response.text
    sid, url, parameters = twilio_stream(apis.created[-1])
    answered = asyncio.run(answer_with(url, sid, parameters, opening, then, linger_s))
    call = httpx.get(f"{server.url}/calls/{sid}", headers=auth, timeout=10).json()
    return answered, call

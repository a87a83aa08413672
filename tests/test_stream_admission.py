"""Who may place a call: stream tokens on the Telnyx and Vonage routes, and lines freed from
callers that go silent (phone and WebRTC), against a real `hotline serve` with an API token.

Twilio's path (a token in the signed webhook's TwiML, a signed handshake) is tested in
test_twilio_webhook.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from aiortc import MediaStreamTrack, RTCPeerConnection, RTCSessionDescription
from av.frame import Frame
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tests.support.poll import until
from tests.support.providers import TelnyxWire, VonageWire, Wire
from tests.support.server import Server, logged, start_server, stop_server
from voice.devtools.webrtc_caller import CallerMicrophone

pytestmark = pytest.mark.slow

TOKEN = "stream-admission-api-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
IDLE_S = 1.0


@pytest.fixture(scope="module")
def guarded() -> Iterator[Server]:
    running = start_server(
        {
            "HOTLINE_API_TOKEN": TOKEN,
            "HOTLINE_TELEPHONY__MEDIA_IDLE_TIMEOUT_S": str(IDLE_S),
            "HOTLINE_WEBRTC__MEDIA_IDLE_TIMEOUT_S": str(IDLE_S),
        }
    )
    yield running
    assert stop_server(running) == 0, "\n".join(running.log[-30:])


async def stream_url(http: httpx.AsyncClient, wire: Wire) -> str:
    asked = {"provider": wire.transport, "call_id": wire.call_id}
    response = await http.post("/phone/stream-token", json=asked, headers=AUTH)
    assert response.status_code == 200, response.text
    url = str(response.json()["stream_url"])
    assert url.startswith("ws://") and url.split("?")[0].endswith(wire.route)
    return url


async def state(http: httpx.AsyncClient, call_id: str) -> dict[str, Any] | None:
    response = await http.get(f"/calls/{call_id}", headers=AUTH)
    return response.json() if response.status_code == 200 else None


async def open_and_wait(url: str, wire: Wire, http: httpx.AsyncClient) -> str:
    """Send the provider's opening, then one frame of silence every 20 ms (the phone's clock)
    until the server lists the call ("admitted") or closes the socket ("closed CODE")."""
    silence = wire.media(np.zeros(wire.frame_samples * 16_000 // wire.wire_rate, np.int16))
    try:
        async with connect(url, compression=None, open_timeout=10) as socket:
            for message in wire.opening():
                await socket.send(message)

            async def phone_clock() -> None:
                with contextlib.suppress(ConnectionClosed):
                    while True:
                        await socket.send(silence)
                        await asyncio.sleep(0.02)

            async def outcome() -> str | None:
                if socket.close_code is not None:
                    return f"closed {socket.close_code}"
                found = await state(http, wire.call_id)
                return "admitted" if found is not None and found["state"] == "active" else None

            clock = asyncio.create_task(phone_clock())
            try:
                seen: str | None = await until(outcome, "the call admitted or its socket closed")
            finally:
                clock.cancel()
            return str(seen)
    except ConnectionClosed as closed:
        return f"closed {closed.rcvd.code if closed.rcvd else None}"


@pytest.mark.parametrize("wire_type", [TelnyxWire, VonageWire])
async def test_a_stream_is_admitted_only_with_its_own_token(
    guarded: Server, wire_type: type[Wire]
) -> None:
    base = guarded.url.replace("http://", "ws://")
    mark = guarded.log_mark()  # the server is shared: only this test's refusals count
    async with httpx.AsyncClient(base_url=guarded.url, timeout=10) as http:
        anonymous = wire_type()
        assert await open_and_wait(base + anonymous.route, anonymous, http) == "closed 1008"
        other = wire_type()
        url = await stream_url(http, other)
        assert await open_and_wait(url, wire_type(), http) == "closed 1008"  # another call's
        assert await open_and_wait(url, other, http) == "admitted"
        assert await open_and_wait(url, other, http) == "closed 1008"  # used once already
    await logged(
        guarded,
        "refused: no stream token",
        "refused: stream token is for another call",
        "refused: stream token already used",
        since=mark,
    )


async def test_the_token_api_needs_the_bearer_token_and_a_real_call_id(guarded: Server) -> None:
    async with httpx.AsyncClient(base_url=guarded.url, timeout=10) as http:
        asked = {"provider": "telnyx", "call_id": "v3:abc"}
        assert (await http.post("/phone/stream-token", json=asked)).status_code == 401
        for bad in (
            {"provider": "skype", "call_id": "v3:abc"},
            {"provider": "telnyx", "call_id": "../../etc"},
            {"provider": "telnyx", "call_id": "a\nb"},
            {"provider": "telnyx"},
        ):
            response = await http.post("/phone/stream-token", json=bad, headers=AUTH)
            assert response.status_code == 400 and "error" in response.json()


async def test_a_phone_stream_that_goes_silent_is_hung_up(guarded: Server) -> None:
    wire = TelnyxWire()
    async with httpx.AsyncClient(base_url=guarded.url, timeout=10) as http:
        url = await stream_url(http, wire)
        async with connect(url, compression=None, open_timeout=10) as socket:
            for message in wire.opening():
                await socket.send(message)
            # ...and then nothing, though the socket stays open and answers pings
            await asyncio.wait_for(socket.wait_closed(), 20 * IDLE_S)
            assert socket.close_code == 1000
        detail = await state(http, wire.call_id)
        assert detail is not None and detail["state"] == "ended"
        assert detail["end_reason"] == f"no audio for {IDLE_S:.0f} s"


class FrozenMicrophone(MediaStreamTrack):
    """A microphone whose tab froze: it never yields another frame."""

    kind = "audio"

    async def recv(self) -> Frame:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_a_webrtc_caller_whose_audio_stops_is_hung_up(guarded: Server) -> None:
    pc = RTCPeerConnection()
    microphone = CallerMicrophone()
    sender = pc.addTrack(microphone)
    await pc.setLocalDescription(await pc.createOffer())
    async with httpx.AsyncClient(base_url=guarded.url, headers=AUTH, timeout=10) as http:
        offer = {"sdp": pc.localDescription.sdp, "type": "offer"}
        answer = (await http.post("/offer", json=offer)).json()
        await pc.setRemoteDescription(RTCSessionDescription(answer["sdp"], "answer"))
        call_id = answer["call_id"]
        try:
            _: bool = await until(lambda: pc.connectionState == "connected", "media connected")
            await microphone.say(np.zeros(8000, np.int16))  # half a second of audio went out
            sender.replaceTrack(FrozenMicrophone())  # the connection stays up, RTP stops

            async def ended() -> dict[str, Any] | None:
                detail = await state(http, call_id)
                return detail if detail is not None and detail["state"] == "ended" else None

            detail: dict[str, Any] | None = await until(
                ended, "the call ended for its silence", within_s=20 * IDLE_S
            )
            assert detail is not None and detail["end_reason"] == f"no audio for {IDLE_S:.0f} s"
        finally:
            await pc.close()

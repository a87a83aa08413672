"""HTTP app: softphone page, WebRTC offer/answer, calls API, health; one `Switchboard` a process."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from importlib import resources
from typing import Any

from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection, RTCSessionDescription
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse

from pipeline.llm import LLMClient
from pipeline.simulator import running_simulator
from pipeline.stt import SpeechToText
from pipeline.tts import TextToSpeech
from voice.calls import CallsFull, Switchboard
from voice.settings import Settings
from voice.webrtc import WebRTCCall, restrict_ice_host_addresses, shorten_jitter_buffer

log = logging.getLogger(__name__)


def error(status: int, message: str) -> JSONResponse:
    """A JSON error response, logged."""
    log.warning("HTTP %d: %s", status, message)
    return JSONResponse({"error": message}, status_code=status)


async def read_json_body(request: Request, limit: int) -> dict[str, Any] | JSONResponse:
    """The request body as a JSON object, or the error response to send instead."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            return error(413, f"body larger than {limit} bytes")
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return error(400, "body is not valid JSON")
    if not isinstance(data, dict):
        return error(400, "body must be a JSON object")
    return data


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: Settings = app.state.settings
    if settings.webrtc.ice_host_addresses:
        restrict_ice_host_addresses(settings.webrtc.ice_host_addresses)
    stt = SpeechToText.shared(settings.stt)
    tts = TextToSpeech.shared(settings.tts)
    if settings.warm_up:
        await asyncio.gather(asyncio.to_thread(stt.warm_up), asyncio.to_thread(tts.warm_up))
    async with contextlib.AsyncExitStack() as stack:
        base_url = settings.llm.base_url
        if base_url is None:
            base_url = await stack.enter_async_context(running_simulator(settings.simulator))
            log.warning(
                "LLM replies are SIMULATED by Hotline's tier simulator at %s. For a real provider "
                "set HOTLINE_LLM__BASE_URL, HOTLINE_LLM__API_KEY and HOTLINE_LLM__MODEL.",
                base_url,
            )
        llm = LLMClient(settings.llm, base_url=base_url)
        stack.push_async_callback(llm.aclose)
        switchboard = Switchboard(settings, stt=stt, llm=llm, tts=tts)
        app.state.switchboard = switchboard
        log.info("Hotline ready: %d calls at most", settings.max_calls)
        try:
            yield
        finally:
            await switchboard.shutdown()


def create_app(settings: Settings | None = None) -> FastAPI:
    """The Hotline server app."""
    app = FastAPI(title="Hotline", lifespan=_lifespan)
    app.state.settings = settings or Settings()

    def switchboard(request: Request) -> Switchboard:
        board: Switchboard = request.app.state.switchboard
        return board

    @app.get("/", response_class=HTMLResponse)
    async def softphone() -> HTMLResponse:
        page = resources.files("voice").joinpath("static/softphone.html").read_text("utf-8")
        return HTMLResponse(page)

    @app.get("/healthz")
    async def health(request: Request) -> dict[str, object]:
        return {"status": "ok", "active_calls": len(switchboard(request).active)}

    @app.post("/offer")
    async def offer(request: Request) -> JSONResponse:
        settings: Settings = request.app.state.settings
        data = await read_json_body(request, settings.max_body_bytes)
        if isinstance(data, JSONResponse):
            return data
        sdp, kind = data.get("sdp"), data.get("type")
        if not isinstance(sdp, str) or not sdp.strip():
            return error(400, "missing field 'sdp' (a string)")
        if kind != "offer":
            return error(400, "field 'type' must be 'offer'")
        board = switchboard(request)
        try:
            call_id = board.new_call_id()
        except CallsFull as full:
            return error(503, str(full))
        ice = [RTCIceServer(urls=url) for url in settings.webrtc.ice_servers]
        pc = RTCPeerConnection(RTCConfiguration(iceServers=ice))
        transport = WebRTCCall(call_id, pc, settings.webrtc.connect_timeout_s)
        try:
            await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
            if not any(t.kind == "audio" for t in pc.getTransceivers()):
                raise ValueError("the offer has no audio section")
            shorten_jitter_buffer(pc)
            await pc.setLocalDescription(await pc.createAnswer())
        except Exception as exc:  # aiortc raises many kinds on bad SDP
            await transport.close()
            return error(400, f"malformed SDP offer: {exc}")
        board.start(transport, "webrtc")
        answer = pc.localDescription
        return JSONResponse({"sdp": answer.sdp, "type": answer.type, "call_id": call_id})

    @app.get("/calls")
    async def calls(request: Request) -> dict[str, object]:
        board = switchboard(request)
        return {"calls": [call.summary() for call in board.active.values()]}

    @app.get("/calls/{call_id}", response_model=None)
    async def call_detail(call_id: str, request: Request) -> dict[str, object] | JSONResponse:
        call = switchboard(request).get(call_id)
        if call is None:
            return error(404, f"unknown call {call_id}")
        return call.detail()

    return app

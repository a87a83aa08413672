"""The WebRTC route: a browser's (or scripted caller's) SDP offer in, our answer and the new
call's id out; the call then runs over the peer connection."""

from __future__ import annotations

from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from voice.server.api import error, read_json_body
from voice.server.auth import require_token
from voice.server.call_records import CallsFull
from voice.server.routes import switchboard
from voice.server.settings import Settings
from voice.transports.webrtc import WebRTCTransport, shorten_jitter_buffer

webrtc_api = APIRouter()

# A refused offer (capacity, draining, Redis unreachable) says when to try again, as SIP's 503.
RETRY_AFTER_S = 5


@webrtc_api.post("/offer", dependencies=[Depends(require_token)])
async def offer(request: Request) -> JSONResponse:
    settings: Settings = request.app.state.settings
    data = await read_json_body(request, settings.max_body_bytes)
    sdp, kind = data.get("sdp"), data.get("type")
    if not isinstance(sdp, str) or not sdp.strip():
        return error(400, "missing field 'sdp' (a string)")
    if kind != "offer":
        return error(400, "field 'type' must be 'offer'")
    board = switchboard(request)
    try:
        call_id = await board.admit("webrtc")
    except CallsFull as full:
        return error(503, str(full), {"Retry-After": str(RETRY_AFTER_S)})
    pc = RTCPeerConnection(RTCConfiguration(iceServers=settings.webrtc.rtc_ice_servers()))
    webrtc = settings.webrtc
    transport = WebRTCTransport(
        call_id, pc, webrtc.connect_timeout_s, idle_timeout_s=webrtc.media_idle_timeout_s
    )
    try:
        await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
        if not any(t.kind == "audio" for t in pc.getTransceivers()):
            raise ValueError("the offer has no audio section")
        shorten_jitter_buffer(pc)
        await pc.setLocalDescription(await pc.createAnswer())
    except Exception as exc:  # aiortc raises many kinds on bad SDP
        await transport.close()
        board.release(call_id)
        return error(400, f"malformed SDP offer: {exc}")
    board.start(call_id, transport, "webrtc")
    answer = pc.localDescription
    return JSONResponse({"sdp": answer.sdp, "type": answer.type, "call_id": call_id})

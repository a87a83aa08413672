"""HTTP app: softphone page, WebRTC offer/answer, calls API, health; one `Switchboard` a process."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import socket
import time
from collections.abc import AsyncIterator
from importlib import resources
from urllib.parse import parse_qsl

from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection, RTCSessionDescription
from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from pipeline.controller import Controller
from pipeline.routing import TierRouter
from pipeline.simulator import running_simulator
from pipeline.stt import SpeechToText
from pipeline.tts import TextToSpeech
from voice import metrics
from voice.api import authorized, calls_api, error, read_json_body, unauthorized
from voice.calls import CallsFull, Switchboard
from voice.experiments import load_experiment
from voice.experiments_api import experiments_api
from voice.session_records import WorkerInfo
from voice.sessions import Sessions
from voice.settings import Settings
from voice.telephony import BadMessages, PhoneStream, ProtocolFactory, pump, wait_for_start
from voice.telnyx import TelnyxProtocol
from voice.twilio import TwilioProtocol, reject_twiml, signature_is_valid, stream_twiml
from voice.vonage import VonageProtocol
from voice.webrtc import WebRTCCall, restrict_ice_host_addresses, shorten_jitter_buffer

log = logging.getLogger(__name__)


def _rss_bytes() -> int:
    """Resident set size now (Linux /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * resource.getpagesize()
    except OSError:
        return 0


async def drain_then_exit(app: FastAPI) -> None:
    """Drain this worker's calls, then ask the server to stop (if it gave a way to)."""
    board: Switchboard = app.state.switchboard
    await board.drain()
    request_exit = getattr(app.state, "request_exit", None)
    if request_exit is not None:
        request_exit()


def public_url(request: Request, settings: Settings) -> str:
    """The URL of this request as the provider called it (for signatures and links)."""
    base = settings.telephony.public_url
    if base is None:
        proto = request.headers.get("x-forwarded-proto", request.url.scheme)
        host = request.headers.get("x-forwarded-host", request.headers.get("host", "localhost"))
        base = f"{proto}://{host}"
    url = base.rstrip("/") + request.url.path
    return f"{url}?{request.url.query}" if request.url.query else url


def xml(body: str, status: int = 200) -> Response:
    return Response(body, status_code=status, media_type="application/xml")


async def answer_phone_stream(
    websocket: WebSocket, board: Switchboard, protocol_factory: ProtocolFactory, route: str
) -> None:
    """One provider media websocket, from its start message to hang-up."""
    await websocket.accept()
    protocol = protocol_factory()
    bad = BadMessages(route)
    start = await wait_for_start(websocket, protocol, bad)
    if start is None:
        return
    try:
        call_id = await board.admit(
            protocol.name, start.call_id or None, caller=start.caller, callee=start.callee
        )
    except CallsFull as full:
        log.warning("%s: call %s refused: %s", route, start.call_id, full)
        await websocket.close(1013, "at capacity")
        return
    stream = PhoneStream(
        call_id, websocket, protocol, start, lead_s=board.settings.telephony.lead_ms / 1e3
    )
    call = board.start(call_id, stream, protocol.name, caller=start.caller, callee=start.callee)
    await pump(stream, bad)
    if call.task is not None:
        await call.task


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: Settings = app.state.settings
    if settings.webrtc.ice_host_addresses:
        restrict_ice_host_addresses(settings.webrtc.ice_host_addresses)
    stt = SpeechToText.shared(settings.stt)
    phone_stt = SpeechToText.shared(settings.phone_stt)
    tts = TextToSpeech.shared(settings.tts)
    if settings.warm_up:
        models = {id(m): m for m in (stt, phone_stt)}.values()  # one warm-up per model
        await asyncio.gather(
            *(asyncio.to_thread(m.warm_up) for m in models), asyncio.to_thread(tts.warm_up)
        )
    async with contextlib.AsyncExitStack() as stack:
        base_url = settings.llm.base_url
        if base_url is None:
            base_url = await stack.enter_async_context(running_simulator(settings.simulator))
            log.warning(
                "LLM replies are SIMULATED by Hotline's tier simulator at %s. For a real provider "
                "set HOTLINE_LLM__BASE_URL, HOTLINE_LLM__API_KEY and HOTLINE_LLM__MODEL.",
                base_url,
            )
        controller = Controller(settings.controller, clock=time.monotonic)
        router = TierRouter(settings.llm, controller, base_url=base_url)
        stack.push_async_callback(router.aclose)
        worker = WorkerInfo(
            f"{socket.gethostname()}-{os.getpid()}",
            address=f"{settings.host}:{settings.port}",
            capacity=settings.max_calls,
        )
        sessions = await Sessions.open(settings.session_settings(), worker)
        await sessions.start()
        stack.push_async_callback(sessions.close)
        switchboard = Switchboard(
            settings, stt=stt, phone_stt=phone_stt, router=router, tts=tts, sessions=sessions
        )
        if settings.experiment_file:
            await switchboard.experiments.save(load_experiment(settings.experiment_file))
        control = asyncio.create_task(switchboard.serve_control(), name="control")
        app.state.switchboard = switchboard
        log.info("Hotline ready: worker %s, %d calls at most", worker.worker_id, settings.max_calls)
        try:
            yield
        finally:
            control.cancel()
            await switchboard.shutdown()


def create_app(settings: Settings | None = None) -> FastAPI:
    """The Hotline server app."""
    app = FastAPI(title="Hotline", lifespan=_lifespan)
    app.state.settings = settings or Settings()

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return JSONResponse({"error": "internal error"}, status_code=500)

    def switchboard(request: Request) -> Switchboard:
        board: Switchboard = request.app.state.switchboard
        return board

    @app.get("/", response_class=HTMLResponse)
    async def softphone() -> HTMLResponse:
        page = resources.files("voice").joinpath("static/softphone.html").read_text("utf-8")
        return HTMLResponse(page)

    @app.get("/healthz")
    async def health(request: Request) -> dict[str, object]:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return {
            "status": "ok",
            "active_calls": len(switchboard(request).active),
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
            "rss_mb": round(_rss_bytes() / 2**20, 1),
            "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),  # Linux reports KiB
        }

    @app.get("/readyz")
    async def ready(request: Request) -> JSONResponse:
        """Readiness: 503 while draining, so load balancers send new calls elsewhere."""
        board = switchboard(request)
        status = "draining" if board.draining else "ready"
        body = {"status": status, "active_calls": len(board.active)}
        return JSONResponse(body, status_code=503 if board.draining else 200)

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        return PlainTextResponse(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    @app.post("/admin/drain")
    async def drain(request: Request) -> JSONResponse:
        """Stop admitting calls, let those in progress finish, then exit."""
        if not authorized(request):
            return unauthorized()
        board = switchboard(request)
        if not board.draining:
            task = asyncio.create_task(drain_then_exit(request.app))
            request.app.state.drain_task = task
        return JSONResponse(
            {"status": "draining", "active_calls": len(board.active)}, status_code=202
        )

    @app.post("/offer")
    async def offer(request: Request) -> JSONResponse:
        settings: Settings = request.app.state.settings
        if not authorized(request):
            return unauthorized()
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
            call_id = await board.admit("webrtc")
        except CallsFull as full:
            return error(503, str(full))
        ice = [
            RTCIceServer(urls=server)
            if isinstance(server, str)
            else RTCIceServer(server.urls, server.username, server.credential)
            for server in settings.webrtc.ice_servers
        ]
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
            board.release(call_id)
            return error(400, f"malformed SDP offer: {exc}")
        board.start(call_id, transport, "webrtc")
        answer = pc.localDescription
        return JSONResponse({"sdp": answer.sdp, "type": answer.type, "call_id": call_id})

    @app.post("/twilio/voice")
    async def twilio_voice(request: Request) -> Response:
        """Twilio's voice webhook: connect the call's audio to our media stream."""
        settings: Settings = request.app.state.settings
        body = await request.body()
        if len(body) > settings.max_body_bytes:
            return error(413, f"body larger than {settings.max_body_bytes} bytes")
        params = dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
        token = settings.telephony.twilio_auth_token
        if token is not None:
            url = public_url(request, settings)
            signature = request.headers.get("x-twilio-signature")
            if not signature_is_valid(token.get_secret_value(), url, params, signature):
                log.warning("twilio webhook: bad or missing signature for %s", url)
                return xml("<Response/>", 403)
        board = switchboard(request)
        if board.full or board.draining:
            metrics.REFUSED.labels(transport="twilio", reason="webhook").inc()
            log.warning("twilio webhook: no line free, call %s rejected", params.get("CallSid"))
            return xml(reject_twiml(settings.telephony.busy_message))
        stream_url = public_url(request, settings).split("?")[0].rsplit("/twilio/", 1)[0]
        stream_url = stream_url.replace("https://", "wss://").replace("http://", "ws://")
        parameters = {
            key: params[name]
            for key, name in (("from", "From"), ("to", "To"), ("call_sid", "CallSid"))
            if params.get(name)
        }
        return xml(stream_twiml(f"{stream_url}/twilio/stream", parameters))

    @app.websocket("/twilio/stream")
    async def twilio_stream(websocket: WebSocket) -> None:
        await answer_phone_stream(
            websocket, websocket.app.state.switchboard, TwilioProtocol, "/twilio/stream"
        )

    @app.websocket("/telnyx/stream")
    async def telnyx_stream(websocket: WebSocket) -> None:
        await answer_phone_stream(
            websocket, websocket.app.state.switchboard, TelnyxProtocol, "/telnyx/stream"
        )

    @app.websocket("/vonage/stream")
    async def vonage_stream(websocket: WebSocket) -> None:
        await answer_phone_stream(
            websocket, websocket.app.state.switchboard, VonageProtocol, "/vonage/stream"
        )

    app.include_router(calls_api)
    app.include_router(experiments_api)
    return app

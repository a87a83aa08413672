"""HTTP app: softphone page, WebRTC offer/answer, calls API, health; one `Switchboard` a process."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import resource
import socket
import time
from collections.abc import AsyncIterator
from importlib import resources
from urllib.parse import parse_qsl

import threadpoolctl
from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection, RTCSessionDescription
from fastapi import Depends, FastAPI, Request, WebSocket
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import HTTPConnection

from pipeline.controller import Controller
from pipeline.routing import TierRouter
from pipeline.stt import SpeechToText
from pipeline.tts import TextToSpeech
from voice.cluster.records import SessionsUnavailable, WorkerInfo
from voice.cluster.sessions import Sessions
from voice.experiments.arms import load_experiment
from voice.llm_sim.simulator import running_simulator
from voice.server import metrics
from voice.server.calls import CallsFull, Switchboard, valid_call_id
from voice.server.calls_api import (
    APIError,
    api_error_response,
    calls_api,
    calls_live_api,
    error,
    read_body,
    read_json_body,
    require_token,
)
from voice.server.experiments_api import experiments_api
from voice.server.settings import Settings
from voice.transports.phone.stream import (
    BadMessages,
    PhoneStream,
    ProtocolFactory,
    pump,
    wait_for_start,
)
from voice.transports.phone.telnyx import TelnyxProtocol
from voice.transports.phone.tokens import InvalidToken, StreamTokens
from voice.transports.phone.twilio import (
    STREAM_TOKEN_PARAMETER,
    TwilioProtocol,
    reject_twiml,
    signature_is_valid,
    stream_twiml,
)
from voice.transports.phone.vonage import VonageProtocol
from voice.transports.phone.wire import Start
from voice.transports.webrtc import WebRTCCall, restrict_ice_host_addresses, shorten_jitter_buffer

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


def public_url(request: HTTPConnection, settings: Settings) -> str:
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
    forged = _forged_handshake(websocket, board.settings)
    if forged is not None:
        log.warning("%s: handshake refused: %s", route, forged)
        await websocket.close(1008, "forged handshake")  # before accept: HTTP 403
        return
    await websocket.accept()
    protocol = protocol_factory()
    bad = BadMessages(route)
    start = await wait_for_start(websocket, protocol, bad)
    if start is None:
        return
    call_id = await _admit_stream(websocket, board, protocol.name, start, route)
    if call_id is None:
        return
    telephony = board.settings.telephony
    stream = PhoneStream(call_id, websocket, protocol, start, lead_s=telephony.lead_ms / 1e3)
    call = board.start(call_id, stream, protocol.name, caller=start.caller, callee=start.callee)
    await pump(stream, bad, idle_timeout_s=telephony.media_idle_timeout_s)
    if call.task is not None:
        await call.task


def _forged_handshake(websocket: WebSocket, settings: Settings) -> str | None:
    """Why a Twilio-signed handshake is not Twilio's (None if unsigned or valid). Twilio signs
    the stream URL, without parameters, as it signs a webhook; an unsigned one still needs its
    stream token."""
    signature = websocket.headers.get("x-twilio-signature")
    auth_token = settings.telephony.twilio_auth_token
    if signature is None or auth_token is None:
        return None
    url = public_url(websocket, settings).split("?")[0]
    secure = url.replace("https://", "wss://").replace("http://", "ws://")
    forms = {secure, secure.replace("wss://", "https://").replace("ws://", "http://")}
    secret = auth_token.get_secret_value()
    if any(signature_is_valid(secret, form, {}, signature) for form in forms):
        return None
    return f"X-Twilio-Signature does not match {secure}"


async def _admit_stream(
    websocket: WebSocket, board: Switchboard, provider: str, start: Start, route: str
) -> str | None:
    """The call id of an admitted stream; None once a refused one is closed (and logged)."""
    refusal = await _token_refusal(websocket, board, provider, start)
    if refusal is not None:
        metrics.REFUSED.labels(transport=provider, reason="unauthenticated").inc()
        log.warning("%s: stream for call %r refused: %s", route, start.call_id, refusal)
        await websocket.close(1008, "stream not authorised")
        return None
    try:
        return await board.admit(
            provider, start.call_id or None, caller=start.caller, callee=start.callee
        )
    except CallsFull as refused:
        log.warning("%s: call %r refused: %s", route, start.call_id, refused)
        busy = refused.reason not in ("duplicate", "bad_call_id")
        await websocket.close(1013 if busy else 1008, refused.reason)
        return None


async def _token_refusal(
    websocket: WebSocket, board: Switchboard, provider: str, start: Start
) -> str | None:
    """Why this stream's token does not admit it; None when it does (or none is needed)."""
    tokens: StreamTokens | None = websocket.app.state.stream_tokens
    if tokens is None:
        return None
    token = start.parameters.get(STREAM_TOKEN_PARAMETER) or websocket.query_params.get("token")
    try:
        grant = tokens.check(token, provider, start.call_id)
        if not await board.sessions.claim("stream-token", grant.nonce, tokens.ttl_s):
            return "stream token already used"
    except InvalidToken as exc:
        return str(exc)
    except SessionsUnavailable:
        return "the call registry is unavailable to check the stream token"
    return None


def _warn_if_exposed(settings: Settings) -> None:
    """Say loudly when a worker listens beyond this machine with nothing to keep callers out."""
    try:
        loopback = ipaddress.ip_address(settings.host).is_loopback
    except ValueError:
        loopback = settings.host == "localhost"
    if loopback:
        return
    if settings.api_token is None:
        log.warning(
            "SECURITY: listening on %s with no HOTLINE_API_TOKEN: anyone who reaches this port "
            "can place WebRTC calls and read, hang up or speak into every call",
            settings.host,
        )
    if settings.stream_secret() is None:
        log.warning(
            "SECURITY: listening on %s with no stream secret: anyone can place phone calls "
            "through /twilio/stream, /telnyx/stream and /vonage/stream (set "
            "HOTLINE_TELEPHONY__TWILIO_AUTH_TOKEN or HOTLINE_TELEPHONY__STREAM_SECRET)",
            settings.host,
        )


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: Settings = app.state.settings
    secret = settings.stream_secret()
    ttl_s = settings.telephony.stream_token_ttl_s
    app.state.stream_tokens = StreamTokens(secret, ttl_s) if secret is not None else None
    _warn_if_exposed(settings)
    if settings.webrtc.ice_host_addresses:
        restrict_ice_host_addresses(settings.webrtc.ice_host_addresses)
    # numpy's BLAS on one thread: its matrices here are small (faster-whisper's mel filter bank),
    # and OpenBLAS's idle threads spin, which doubled the CPU of every transcription (70 ms).
    threadpoolctl.threadpool_limits(1, user_api="blas")
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

    @app.post("/admin/drain", dependencies=[Depends(require_token)])
    async def drain(request: Request) -> JSONResponse:
        """Stop admitting calls, let those in progress finish, then exit."""
        board = switchboard(request)
        if not board.draining:
            task = asyncio.create_task(drain_then_exit(request.app))
            request.app.state.drain_task = task
        return JSONResponse(
            {"status": "draining", "active_calls": len(board.active)}, status_code=202
        )

    @app.post("/offer", dependencies=[Depends(require_token)])
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
            return error(503, str(full))
        ice = [
            RTCIceServer(urls=server)
            if isinstance(server, str)
            else RTCIceServer(server.urls, server.username, server.credential)
            for server in settings.webrtc.ice_servers
        ]
        pc = RTCPeerConnection(RTCConfiguration(iceServers=ice))
        webrtc = settings.webrtc
        transport = WebRTCCall(
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

    @app.post("/twilio/voice")
    async def twilio_voice(request: Request) -> Response:
        """Twilio's voice webhook: connect the call's audio to our media stream."""
        settings: Settings = request.app.state.settings
        body = await read_body(request, settings.max_body_bytes)
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
            log.warning("twilio webhook: no line free, call %r rejected", params.get("CallSid"))
            return xml(reject_twiml(settings.telephony.busy_message))
        stream_url = public_url(request, settings).split("?")[0].rsplit("/twilio/", 1)[0]
        stream_url = stream_url.replace("https://", "wss://").replace("http://", "ws://")
        parameters = {
            key: params[name]
            for key, name in (("from", "From"), ("to", "To"), ("call_sid", "CallSid"))
            if params.get(name)
        }
        tokens: StreamTokens | None = request.app.state.stream_tokens
        if tokens is not None:
            if token is None:  # an unsigned webhook must not hand out tokens to anyone
                log.warning("twilio webhook: refused, HOTLINE_TELEPHONY__TWILIO_AUTH_TOKEN unset")
                return xml("<Response/>", 403)
            call_sid = params.get("CallSid", "")
            if not valid_call_id(call_sid):
                return error(400, "the webhook has no valid CallSid")
            parameters[STREAM_TOKEN_PARAMETER] = tokens.issue("twilio", call_sid)
        return xml(stream_twiml(f"{stream_url}/twilio/stream", parameters))

    @app.post("/phone/stream-token", dependencies=[Depends(require_token)])
    async def stream_token(request: Request) -> JSONResponse:
        """A single-use token (and the stream URL carrying it) for one provider call's media
        stream: what a Telnyx or Vonage call-control app puts in the stream URL it answers with."""
        tokens: StreamTokens | None = request.app.state.stream_tokens
        if tokens is None:
            return error(409, "stream tokens are off: no secret is configured")
        data = await read_json_body(request, request.app.state.settings.max_body_bytes)
        provider, call_id = data.get("provider"), data.get("call_id")
        if provider not in ("twilio", "telnyx", "vonage"):
            return error(400, "field 'provider' must be 'twilio', 'telnyx' or 'vonage'")
        if not isinstance(call_id, str) or not valid_call_id(call_id):
            return error(400, "field 'call_id' must be the provider's call id")
        token = tokens.issue(provider, call_id)
        base = public_url(request, request.app.state.settings).rsplit("/phone/", 1)[0]
        base = base.replace("https://", "wss://").replace("http://", "ws://")
        url = f"{base}/{provider}/stream?token={token}"
        return JSONResponse({"token": token, "stream_url": url, "ttl_s": tokens.ttl_s})

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

    app.add_exception_handler(APIError, api_error_response)
    app.include_router(calls_api)
    app.include_router(calls_live_api)
    app.include_router(experiments_api)
    return app

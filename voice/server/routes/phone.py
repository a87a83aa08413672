"""Phone routes: Twilio's voice webhook, stream tokens for call-control apps, and the provider
media websockets (/twilio/stream, /telnyx/stream, /vonage/stream), each admitted by its
signature or single-use stream token and then run as a call until hang-up."""

from __future__ import annotations

import logging
from urllib.parse import parse_qsl

from fastapi import APIRouter, Depends, Request, WebSocket
from fastapi.responses import JSONResponse, Response
from starlette.requests import HTTPConnection

from voice.cluster.records import RegistryUnavailable
from voice.outbound.answered import screening_of
from voice.outbound.dials import Dial, DialBook
from voice.outbound.streams import DialRefused, call_id_of, stream_token_subject, take_dial
from voice.server import metrics
from voice.server.api import error, read_body, read_json_body
from voice.server.auth import require_token
from voice.server.call_records import CallsFull, valid_call_id
from voice.server.calls import Switchboard
from voice.server.routes import switchboard
from voice.server.settings import Settings
from voice.server.urls import http_url, websocket_url
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
    dial_twiml,
    hangup_twiml,
    reject_twiml,
    signature_is_valid,
    stream_twiml,
)
from voice.transports.phone.vonage import VonageProtocol
from voice.transports.phone.wire import Start

log = logging.getLogger(__name__)

phone_api = APIRouter()


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


async def twilio_params(request: Request) -> dict[str, str] | Response:
    """A Twilio webhook's form parameters, or the 403 answer when its signature is wrong (when
    an auth token is configured)."""
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
    return params


@phone_api.post("/twilio/voice")
async def twilio_voice(request: Request) -> Response:
    """Twilio's voice webhook: connect the call's audio to our media stream; when the stream
    ends, Twilio asks /twilio/after-stream what next."""
    settings: Settings = request.app.state.settings
    params = await twilio_params(request)
    if isinstance(params, Response):
        return params
    token = settings.telephony.twilio_auth_token
    board = switchboard(request)
    refusal = await board.refusal()  # a full cluster or no Redis: refused here, in TwiML
    if refusal is not None:
        metrics.REFUSED.labels(transport="twilio", reason="webhook").inc()
        log.warning("twilio webhook: call %r rejected (%s)", params.get("CallSid"), refusal)
        return xml(reject_twiml(settings.telephony.busy_message))
    base = public_url(request, settings).split("?")[0].rsplit("/twilio/", 1)[0]
    stream_url = websocket_url(base)
    parameters = {
        key: params[name]
        for key, name in (("from", "From"), ("to", "To"), ("call_sid", "CallSid"))
        if params.get(name)
    }
    tokens: StreamTokens | None = request.app.state.stream_tokens
    if tokens is not None:
        if token is None:  # an unsigned webhook must not hand out tokens to anyone
            log.warning(
                "twilio webhook: refused (403): HOTLINE_API_TOKEN is set, so webhooks must be "
                "signed, and HOTLINE_TELEPHONY__TWILIO_AUTH_TOKEN is unset"
            )
            return xml("<Response/>", 403)
        call_sid = params.get("CallSid", "")
        if not valid_call_id(call_sid):
            return error(400, "the webhook has no valid CallSid")
        parameters[STREAM_TOKEN_PARAMETER] = tokens.issue("twilio", call_sid)
    action = f"{base}/twilio/after-stream"
    return xml(stream_twiml(f"{stream_url}/twilio/stream", parameters, action))


@phone_api.post("/twilio/after-stream")
async def twilio_after_stream(request: Request) -> Response:
    """`<Connect action>`: the bot's stream has ended. If the agent put the caller through to
    a person, dial them (a SIP target gets the reason and a warm transfer's summary as
    `X-Hotline-Reason` and `X-Hotline-Summary` headers, cut short: Twilio carries custom SIP
    headers in the URI); else hang up."""
    params = await twilio_params(request)
    if isinstance(params, Response):
        return params
    call_sid = params.get("CallSid", "")
    if not valid_call_id(call_sid):
        log.warning("twilio after-stream: no valid CallSid")
        return xml(hangup_twiml(), 400)
    try:
        transfer = await switchboard(request).transfer_of(call_sid)
    except RegistryUnavailable:
        log.error("twilio after-stream: call %s: Redis unreachable, hanging up", call_sid)
        return xml(hangup_twiml())
    if transfer is None:
        return xml(hangup_twiml())
    log.info("call %s: Twilio puts the caller through to %s", call_sid, transfer["to"])
    headers = {
        name: " ".join(transfer.get(key, "").split())[:limit]
        for name, key, limit in (
            ("X-Hotline-Reason", "reason", 200),
            ("X-Hotline-Summary", "summary", 300),
        )
        if transfer.get(key)
    }
    return xml(dial_twiml(transfer["to"], headers))


@phone_api.post("/phone/stream-token", dependencies=[Depends(require_token)])
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
    base = websocket_url(base)
    url = f"{base}/{provider}/stream?token={token}"
    return JSONResponse({"token": token, "stream_url": url, "ttl_s": tokens.ttl_s})


@phone_api.websocket("/twilio/stream")
async def twilio_stream(websocket: WebSocket) -> None:
    await answer_phone_stream(websocket, switchboard(websocket), TwilioProtocol, "/twilio/stream")


@phone_api.websocket("/telnyx/stream")
async def telnyx_stream(websocket: WebSocket) -> None:
    await answer_phone_stream(websocket, switchboard(websocket), TelnyxProtocol, "/telnyx/stream")


@phone_api.websocket("/vonage/stream")
async def vonage_stream(websocket: WebSocket) -> None:
    await answer_phone_stream(websocket, switchboard(websocket), VonageProtocol, "/vonage/stream")


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
    admitted = await _admit_stream(websocket, board, protocol.name, start, route)
    if admitted is None:
        return
    call_id, dial = admitted
    telephony = board.settings.telephony
    stream = PhoneStream(call_id, websocket, protocol, start, lead_s=telephony.lead_ms / 1e3)
    outbound = (dial.agent, dial.metadata) if dial is not None else None
    settings = board.settings.outbound.answering
    answering = screening_of(dial, call_id, board.phone_stt, settings, board.sessions)
    call = board.start(
        call_id,
        stream,
        protocol.name,
        caller=start.caller,
        callee=start.callee,
        outbound=outbound,
        answering=answering,
    )
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
    secure = websocket_url(url)
    forms = {secure, http_url(secure)}
    secret = auth_token.get_secret_value()
    if any(signature_is_valid(secret, form, {}, signature) for form in forms):
        return None
    return f"X-Twilio-Signature does not match {secure}"


# A valid-looking token whose single use cannot be claimed (Redis unreachable): refused, fail
# closed, but with 1013 (try again later) rather than 1008 (policy), as at capacity.
TOKEN_UNCHECKED = "the call registry is unavailable to check the stream token"


async def _admit_stream(
    websocket: WebSocket, board: Switchboard, provider: str, start: Start, route: str
) -> tuple[str, Dial | None] | None:
    """The call id of an admitted stream, and the placed call it answers (voice/outbound/);
    None once a refused one is closed (and logged)."""
    refusal = await _token_refusal(websocket, board, provider, start)
    if refusal is not None:
        unchecked = refusal == TOKEN_UNCHECKED  # not the caller's fault: try again (1013)
        reason = "redis_unavailable" if unchecked else "unauthenticated"
        metrics.REFUSED.labels(transport=provider, reason=reason).inc()
        log.warning("%s: stream for call %r refused: %s", route, start.call_id, refusal)
        if unchecked:
            await websocket.close(1013, "try again later")
        else:
            await websocket.close(1008, "stream not authorised")
        return None
    try:
        book = DialBook.of(board.sessions)
        dial = await take_dial(book, provider, start, websocket.query_params)
    except DialRefused as refused:
        log.warning("%s: stream for call %r refused: %s", route, start.call_id, refused)
        await websocket.close(refused.close_code, "not an outbound call")
        return None
    try:
        call_id = await board.admit(
            provider, call_id_of(dial, start) or None, caller=start.caller, callee=start.callee
        )
        return call_id, dial
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
        subject = stream_token_subject(start, websocket.query_params)
        grant = tokens.check(token, provider, subject)
        if not await board.sessions.claim("stream-token", grant.nonce, tokens.ttl_s):
            return "stream token already used"
    except InvalidToken as exc:
        return str(exc)
    except RegistryUnavailable:
        return TOKEN_UNCHECKED
    return None

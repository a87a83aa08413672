"""The calls API, on every worker: list, inspect, watch live, hang up and speak into any call of
the cluster (through Redis when the call lives on another worker). Bearer token when set."""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import re
from typing import Any

from fastapi import APIRouter, Depends, Request, WebSocket
from fastapi.responses import JSONResponse
from starlette.websockets import WebSocketDisconnect

from voice.cluster.records import NoAck, SessionsUnavailable, UnknownCall
from voice.cluster.sessions import Sessions
from voice.server.calls import Switchboard

log = logging.getLogger(__name__)

MAX_SAY_CHARS = 2000  # about two minutes of speech: an announcement, not an audiobook

MAX_JSON_DEPTH = 64  # far beyond any body we accept, far below the parser's recursion limit
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def error(status: int, message: str) -> JSONResponse:
    """A JSON error response, logged."""
    log.warning("HTTP %d: %s", status, message)
    return JSONResponse({"error": message}, status_code=status)


class APIError(Exception):
    """A request we refuse: raised anywhere in a handler (or a dependency), answered as a JSON
    error by `api_error_response` (registered on the app)."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


async def api_error_response(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    response = error(exc.status, exc.message)
    response.headers.update(exc.headers)
    return response


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, read as a stream and never past `limit` bytes (413 at once when
    Content-Length already says it is too large)."""
    declared = request.headers.get("content-length", "")  # the server has checked its syntax
    if declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise APIError(413, f"body larger than {limit} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise APIError(413, f"body larger than {limit} bytes")
    return bytes(body)


def json_depth(body: bytes) -> int:
    """How deeply `body`'s arrays and objects nest (brackets inside strings do not count)."""
    brackets = _JSON_STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    depth = deepest = 0
    for byte in brackets:
        depth += 1 if byte in b"[{" else -1
        deepest = max(deepest, depth)
    return deepest


async def read_json_body(request: Request, limit: int) -> dict[str, Any]:
    """The request body as a JSON object (400 or 413 otherwise)."""
    body = await read_body(request, limit)
    if json_depth(body) > MAX_JSON_DEPTH:
        raise APIError(400, f"body nests JSON deeper than {MAX_JSON_DEPTH} levels")
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise APIError(400, "body is not valid JSON") from None
    except RecursionError:  # a nesting the depth count missed must not become a 500
        raise APIError(400, "body nests JSON too deeply") from None
    if not isinstance(data, dict):
        raise APIError(400, "body must be a JSON object")
    return data


def authorized(request: Request) -> bool:
    """Whether the request carries the API token (always true when none is configured)."""
    token = request.app.state.settings.api_token
    if token is None:
        return True
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    expected = token.get_secret_value().encode()
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), expected)


def require_token(request: Request) -> None:
    """The API token, as a dependency of every route that needs it (401 without it)."""
    if not authorized(request):
        raise APIError(401, "missing or wrong bearer token", {"WWW-Authenticate": "Bearer"})


calls_api = APIRouter(dependencies=[Depends(require_token)])
calls_live_api = APIRouter()  # a websocket: its token may come in the query (authorized_socket)


def _board(request: Request | WebSocket) -> Switchboard:
    board: Switchboard = request.app.state.switchboard
    return board


@calls_api.get("/calls", response_model=None)
async def list_calls(request: Request) -> dict[str, object] | JSONResponse:
    """Calls in progress on every worker."""
    try:
        calls = await _board(request).sessions.active_calls()
    except SessionsUnavailable as exc:
        return error(503, f"call registry unavailable: {exc}")
    return {"calls": [_summary(_board(request), info.__dict__) for info in calls]}


def _summary(board: Switchboard, info: dict[str, Any]) -> dict[str, Any]:
    local = board.get(str(info["call_id"]))
    return {**info, **(local.summary() if local is not None else {})}


@calls_api.get("/calls/{call_id}", response_model=None)
async def call_detail(call_id: str, request: Request) -> dict[str, object] | JSONResponse:
    """A call's record and transcript (turns), from this worker or the registry."""
    local = _board(request).get(call_id)
    if local is not None:
        return local.detail()
    try:
        found = await _board(request).sessions.get_call(call_id)
    except SessionsUnavailable as exc:
        return error(503, f"call registry unavailable: {exc}")
    if found is None:
        return error(404, f"unknown call {call_id}")
    info, turns = found
    return {**info.__dict__, "turns": len(turns), "records": turns}


@calls_live_api.websocket("/calls/{call_id}/live")
async def watch_call(websocket: WebSocket, call_id: str) -> None:
    """The call's events as JSON messages (transcripts, turn timings, state), from any worker."""
    if not authorized_socket(websocket):
        await websocket.close(1008, "missing or wrong bearer token")
        return
    sessions: Sessions = _board(websocket).sessions
    try:
        found = await sessions.get_call(call_id)
    except SessionsUnavailable:
        await websocket.close(1013, "call registry unavailable")
        return
    if found is None:
        await websocket.close(1008, f"unknown call {call_id}")
        return
    await websocket.accept()
    with contextlib.suppress(WebSocketDisconnect, RuntimeError):
        async for event in sessions.watch(call_id):
            await websocket.send_text(json.dumps(event))
        await websocket.close(1000, "call ended")


def authorized_socket(websocket: WebSocket) -> bool:
    """The API token on a websocket: the Authorization header or a `token` query parameter
    (browsers cannot set headers on websockets)."""
    token = websocket.app.state.settings.api_token
    if token is None:
        return True
    given = websocket.query_params.get("token", "")
    header = websocket.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        given = header[7:].strip()
    return hmac.compare_digest(given.encode(), token.get_secret_value().encode())


async def _control(
    request: Request, call_id: str, command: str, args: dict[str, Any]
) -> JSONResponse:
    """Run a command on the worker that owns the call, and return its acknowledgement."""
    try:
        ack = await _board(request).sessions.send_control(call_id, command, args)
    except UnknownCall:
        return error(404, f"no call {call_id} in progress")
    except NoAck:
        return error(504, f"the worker holding call {call_id} did not answer")
    except SessionsUnavailable as exc:
        return error(503, f"call registry unavailable: {exc}")
    if not ack.get("ok"):
        return error(404, str(ack.get("error", "command failed")))
    return JSONResponse({"call_id": call_id, **{k: v for k, v in ack.items() if k != "ok"}})


@calls_api.post("/calls/{call_id}/hangup")
async def hang_up(call_id: str, request: Request) -> JSONResponse:
    """End a call in progress, wherever it lives."""
    return await _control(request, call_id, "hangup", {})


@calls_api.post("/calls/{call_id}/say")
async def say(call_id: str, request: Request) -> JSONResponse:
    """Speak a text into a call in progress (cutting off any reply), wherever it lives."""
    data = await read_json_body(request, request.app.state.settings.max_body_bytes)
    text = data.get("text")
    if not isinstance(text, str) or not text.strip():
        return error(400, "field 'text' must be a non-empty string")
    if len(text) > MAX_SAY_CHARS:
        return error(413, f"field 'text' is longer than {MAX_SAY_CHARS} characters")
    return await _control(request, call_id, "say", {"text": text.strip()})

"""The calls API, on every worker: list, inspect, watch live, hang up and speak into any call of
the cluster (through Redis when the call lives on another worker). Bearer token when set."""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
from typing import Any

from fastapi import APIRouter, Depends, Request, WebSocket
from fastapi.responses import JSONResponse
from starlette.websockets import WebSocketDisconnect

from voice.cluster.records import NoAck, RegistryUnavailable, UnknownCall
from voice.cluster.registry import CallRegistry
from voice.server.api import error, read_json_body
from voice.server.auth import require_token
from voice.server.calls import Switchboard
from voice.server.routes import switchboard

log = logging.getLogger(__name__)

MAX_SAY_CHARS = 2000  # about two minutes of speech: an announcement, not an audiobook

calls_api = APIRouter(dependencies=[Depends(require_token)])
calls_live_api = APIRouter()  # a websocket: its token may come in the query (authorized_socket)


@calls_api.get("/calls", response_model=None)
async def list_calls(request: Request) -> dict[str, object] | JSONResponse:
    """Calls in progress on every worker."""
    try:
        calls = await switchboard(request).sessions.active_calls()
    except RegistryUnavailable as exc:
        return error(503, f"call registry unavailable: {exc}")
    return {"calls": [_summary(switchboard(request), info.__dict__) for info in calls]}


def _summary(board: Switchboard, info: dict[str, Any]) -> dict[str, Any]:
    local = board.get(str(info["call_id"]))
    return {**info, **(local.summary() if local is not None else {})}


@calls_api.get("/calls/{call_id}", response_model=None)
async def call_detail(call_id: str, request: Request) -> dict[str, object] | JSONResponse:
    """A call's record and transcript (turns), from this worker or the registry."""
    board = switchboard(request)
    local = board.get(call_id)
    if local is not None:
        detail = local.detail()
        webhook = await board.webhook_outcome(call_id)
        if webhook is not None:
            detail["webhook"] = {k: v for k, v in webhook.items() if k != "body"}
        return detail
    try:
        found = await switchboard(request).sessions.get_call(call_id)
    except RegistryUnavailable as exc:
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
    sessions: CallRegistry = switchboard(websocket).sessions
    try:
        found = await sessions.get_call(call_id)
    except RegistryUnavailable:
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
        ack = await switchboard(request).sessions.send_control(call_id, command, args)
    except UnknownCall:
        return error(404, f"no call {call_id} in progress")
    except NoAck:
        return error(504, f"the worker holding call {call_id} did not answer")
    except RegistryUnavailable as exc:
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

"""The calls API, on every worker: list, inspect, watch live, hang up and speak into any call of
the cluster (through Redis when the call lives on another worker). Bearer token when set."""

from __future__ import annotations

import contextlib
import json
import logging
from typing import Any

from fastapi import APIRouter, Depends, Request, WebSocket
from fastapi.responses import JSONResponse
from starlette.websockets import WebSocketDisconnect

from voice.cluster.records import NoAck, RegistryUnavailable, UnknownCall
from voice.cluster.registry import CallRegistry
from voice.recordings.calls import RecordingLocation
from voice.server.api import error, read_json_body
from voice.server.auth import authorized_socket, require_token
from voice.server.call_records import recording_view
from voice.server.calls import Switchboard
from voice.server.routes import switchboard

log = logging.getLogger(__name__)

MAX_SAY_CHARS = 2000  # about two minutes of speech: an announcement, not an audiobook

calls_api = APIRouter(dependencies=[Depends(require_token)])
calls_live_api = APIRouter()  # a websocket: its token may come in the query (authorized_socket)


@calls_api.get("/calls", response_model=None)
async def list_calls(request: Request) -> dict[str, object] | JSONResponse:
    """Calls in progress on every worker."""
    sessions = switchboard(request).sessions
    try:
        calls = await sessions.active_calls()
        turns = await sessions.turn_counts([info.call_id for info in calls])
    except RegistryUnavailable as exc:
        return error(503, f"call registry unavailable: {exc}")
    board = switchboard(request)
    return {
        "calls": [
            _summary(board, {**info.__dict__, "turns": turns.get(info.call_id)}) for info in calls
        ]
    }


@calls_api.get("/calls/ended", response_model=None)
async def ended_calls(request: Request) -> dict[str, object] | JSONResponse:
    """The calls that ended last, on every worker, newest first (`?limit=`, at most 200)."""
    try:
        limit = min(max(int(request.query_params.get("limit", "50")), 1), 200)
    except ValueError:
        return error(400, "limit must be a number")
    sessions = switchboard(request).sessions
    try:
        calls = await sessions.ended_calls(limit)
        turns = await sessions.turn_counts([info.call_id for info in calls])
    except RegistryUnavailable as exc:
        return error(503, f"call registry unavailable: {exc}")
    return {"calls": [{**info.__dict__, "turns": turns.get(info.call_id)} for info in calls]}


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
    location = RecordingLocation.of(info.recording)
    detail = {**info.__dict__, "turns": len(turns), "records": turns}
    return {**detail, "recording": recording_view(call_id, location)}


@calls_live_api.websocket("/calls/{call_id}/live")
async def watch_call(websocket: WebSocket, call_id: str) -> None:
    """The call's events as JSON messages (transcripts, turn timings, state), from any worker."""
    if not await authorized_socket(websocket):
        await websocket.close(1008, "missing or wrong bearer token")
        return
    board = switchboard(websocket)
    sessions: CallRegistry = board.sessions
    try:
        found = await sessions.get_call(call_id)
    except RegistryUnavailable:
        await websocket.close(1013, "call registry unavailable")
        return
    # A call this worker holds is known before its record reaches Redis (the registry writes in
    # the background: under load a console opened at once found nothing) or after Redis lost it.
    if found is None and board.get(call_id) is None:
        await websocket.close(1008, f"unknown call {call_id}")
        return
    await websocket.accept()
    with contextlib.suppress(WebSocketDisconnect, RuntimeError):
        async for event in sessions.watch(call_id):
            await websocket.send_text(json.dumps(event))
        await websocket.close(1000, "call ended")


async def _control(
    request: Request,
    call_id: str,
    command: str,
    args: dict[str, Any],
    timeout_s: float = 5.0,
) -> JSONResponse:
    """Run a command on the worker that owns the call, and return its acknowledgement."""
    sessions = switchboard(request).sessions
    try:
        ack = await sessions.send_control(call_id, command, args, timeout_s=timeout_s)
    except UnknownCall:
        return error(404, f"no call {call_id} in progress")
    except NoAck:
        return error(504, f"the worker holding call {call_id} did not answer")
    except RegistryUnavailable as exc:
        return error(503, f"call registry unavailable: {exc}")
    if not ack.get("ok"):
        return error(int(ack.get("code", 404)), str(ack.get("error", "command failed")))
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


@calls_api.post("/calls/{call_id}/transfer")
async def transfer(call_id: str, request: Request) -> JSONResponse:
    """Put a call in progress through to a person, wherever it lives: `target` is one of the
    agent's transfer targets by name, or a number or SIP URI (default: the agent's default
    target); the caller hears the human message first."""
    data = await read_json_body(request, request.app.state.settings.max_body_bytes)
    args: dict[str, Any] = {}
    for name in ("target", "reason"):
        value = data.get(name)
        if value is not None and (not isinstance(value, str) or len(value) > 200):
            return error(400, f"field {name!r} must be a string of at most 200 characters")
        if isinstance(value, str) and value.strip():
            args[name] = value.strip()
    return await _control(request, call_id, "transfer", args)


@calls_api.post("/calls/{call_id}/listen")
async def listen(call_id: str, request: Request) -> JSONResponse:
    """Listen in (both sides, live): a WebRTC offer (receive-only audio, candidates gathered)
    in, the answer of the worker that owns the call out; media flows from that worker."""
    data = await read_json_body(request, request.app.state.settings.max_body_bytes)
    sdp, kind = data.get("sdp"), data.get("type")
    if not isinstance(sdp, str) or not sdp.strip():
        return error(400, "missing field 'sdp' (a string)")
    if kind != "offer":
        return error(400, "field 'type' must be 'offer'")
    return await _control(request, call_id, "listen", {"sdp": sdp}, timeout_s=15.0)

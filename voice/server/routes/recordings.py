"""GET /calls/{id}/recording from any worker: the file if this worker has it, else the bucket's
copy, else the file from the worker that has it (the call's record in Redis says which), asked
over HTTP with the API token. Bearer token when set (the console's cookie also serves)."""

from __future__ import annotations

import asyncio
import logging

import httpx
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from voice.cluster.records import RegistryUnavailable
from voice.recordings.calls import RecordingLocation
from voice.recordings.recorder import CONTENT_TYPE
from voice.recordings.storage import RecordingMissing
from voice.server.api import error
from voice.server.auth import require_token
from voice.server.call_records import valid_call_id
from voice.server.routes import switchboard

log = logging.getLogger(__name__)

recordings_api = APIRouter(dependencies=[Depends(require_token)])

FORWARDED = "x-hotline-forwarded"  # a worker asking another: never asked on again


def _audio(body: bytes, call_id: str) -> Response:
    return Response(
        body,
        media_type=CONTENT_TYPE,
        headers={"Content-Disposition": f'inline; filename="{call_id}.ogg"'},
    )


@recordings_api.get("/calls/{call_id}/recording", response_model=None)
async def recording(call_id: str, request: Request) -> Response | JSONResponse:
    """A call's recording (audio/ogg: caller left, what the caller heard right)."""
    board = switchboard(request)
    recordings = board.recordings
    if recordings is None or not valid_call_id(call_id):
        return error(404, f"no recording of call {call_id}")
    local = board.get(call_id)
    location = RecordingLocation.of(local.recording) if local is not None else None
    if local is not None and location is None and local.state == "active":
        path = recordings.store.local(call_id)  # recording now: what is written so far
        if path is not None:
            return _audio(await asyncio.to_thread(path.read_bytes), call_id)
    if location is None:
        try:
            found = await board.sessions.get_call(call_id)
        except RegistryUnavailable as exc:
            return error(503, f"call registry unavailable: {exc}")
        location = RecordingLocation.of(found[0].recording) if found is not None else None
    if location is None:
        return error(404, f"no recording of call {call_id}")
    path = recordings.path(location)
    if path is not None:
        return _audio(await asyncio.to_thread(path.read_bytes), call_id)
    if location.s3_key is not None and recordings.store.bucket_configured:
        try:
            return _audio(await recordings.store.fetch(location.s3_key), call_id)
        except RecordingMissing:
            log.warning("call %s: recording %s not in the bucket", call_id, location.s3_key)
        except Exception as exc:
            log.error("call %s: the bucket could not be read: %s", call_id, exc)
    if location.worker_id == recordings.worker_id or request.headers.get(FORWARDED):
        return error(404, f"the recording of call {call_id} is gone (retention?)")
    return await _from_worker(request, call_id, location)


async def _from_worker(request: Request, call_id: str, location: RecordingLocation) -> Response:
    board = switchboard(request)
    try:
        workers = {w.worker_id: w for w in await board.sessions.workers()}
    except RegistryUnavailable as exc:
        return error(503, f"call registry unavailable: {exc}")
    owner = workers.get(location.worker_id)
    if owner is None or not owner.address:
        return error(404, f"the recording is on worker {location.worker_id}, which is not running")
    headers = {FORWARDED: "1"}
    token = request.app.state.settings.api_token
    if token is not None:
        headers["Authorization"] = f"Bearer {token.get_secret_value()}"
    client: httpx.AsyncClient = request.app.state.http
    url = f"{owner.address.rstrip('/')}/calls/{call_id}/recording"
    try:
        answer = await client.get(url, headers=headers, timeout=30.0)
    except httpx.HTTPError as exc:
        log.error(
            "call %s: worker %s did not send the recording: %s", call_id, owner.worker_id, exc
        )
        return error(502, f"worker {location.worker_id} could not be reached")
    if answer.status_code != 200:
        return error(answer.status_code, f"worker {location.worker_id}: {answer.text[:200]}")
    return _audio(answer.content, call_id)

"""GET /calls/{id}/recording from any worker: the file if this worker has it, else the bucket's
copy, else the file from the worker that has it (the call's record in Redis says which), asked
over HTTP with the API token. Bearer token when set (the console's cookie also serves).

Range requests are answered (RFC 9110 §14, the rules in `voice.server.byte_ranges`): one byte
range gets 206, one past the end 416, any other Range header the whole file (200). A worker's
finished file is served by Starlette's FileResponse (read in chunks, HEAD, ETag, If-Range); a
file still being written, ranged against its size now; the bucket's copy by a ranged GET; a file
on another worker by forwarding Range (and If-Range) and passing its answer back unchanged."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import httpx
from fastapi import APIRouter, Depends, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from starlette.types import Receive, Scope, Send

from voice.cluster.records import RegistryUnavailable
from voice.recordings.calls import RecordingLocation
from voice.recordings.recorder import CONTENT_TYPE
from voice.recordings.storage import RangeNotSatisfiable, RecordingMissing, RecordingStore
from voice.server.api import error
from voice.server.auth import require_token
from voice.server.byte_ranges import ByteRange, Unsatisfiable, content_range, parse
from voice.server.call_records import valid_call_id
from voice.server.routes import switchboard

log = logging.getLogger(__name__)

recordings_api = APIRouter(dependencies=[Depends(require_token)])

FORWARDED = "x-hotline-forwarded"  # a worker asking another: never asked on again
# What a worker passes back of another's answer (Content-Length is its own, from the body).
_PASSED_BACK = (
    "content-type",
    "content-disposition",
    "content-range",
    "accept-ranges",
    "etag",
    "last-modified",
)


def _headers(call_id: str) -> dict[str, str]:
    return {"Content-Disposition": f'inline; filename="{call_id}.ogg"', "Accept-Ranges": "bytes"}


def _unsatisfiable(call_id: str, size: int) -> Response:
    answer = error(416, f"range not satisfiable: the recording of call {call_id} is {size} bytes")
    answer.headers.update({"Content-Range": f"bytes */{size}", "Accept-Ranges": "bytes"})
    return answer


def _audio(
    body: bytes, call_id: str, asked: ByteRange | None, start: int = 0, size: int | None = None
) -> Response:
    """What was `asked` of a recording of `size` bytes (default: `body`'s), of which `body` is
    the bytes from `start`: 206 with those, 200 with all, or 416."""
    size = len(body) if size is None else size
    try:
        span = asked.span(size) if asked is not None else None
    except Unsatisfiable:
        return _unsatisfiable(call_id, size)
    first, stop = span or (0, size)
    if first < start or stop > start + len(body):
        return error(502, f"the recording of call {call_id}: other bytes came than were asked for")
    headers = _headers(call_id)
    if span is not None:
        headers["Content-Range"] = content_range(span, size)
    return Response(
        body[first - start : stop - start],
        status_code=200 if span is None else 206,
        media_type=CONTENT_TYPE,
        headers=headers,
    )


def _asked(request: Request) -> ByteRange | None:
    """The byte range asked for, for a recording with no validator to match If-Range against
    (a file still being written, the bucket's copy): with If-Range, none (the whole file)."""
    return None if "if-range" in request.headers else parse(request.headers.get("range"))


class _WholeFile(FileResponse):
    """A FileResponse sent whole: the Range header was looked at and is to be ignored."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(k, v) for k, v in scope["headers"] if k not in (b"range", b"if-range")]
        await super().__call__({**scope, "headers": headers}, receive, send)


async def _from_file(request: Request, call_id: str, path: Path) -> Response | None:
    """A finished recording from this worker's disk (None: it is gone meanwhile)."""
    try:
        found = await asyncio.to_thread(path.stat)
    except FileNotFoundError:
        return None
    asked = parse(request.headers.get("range"))
    try:
        span = asked.span(found.st_size) if asked is not None else None
    except Unsatisfiable:
        if "if-range" not in request.headers:  # with it, FileResponse decides
            return _unsatisfiable(call_id, found.st_size)
        span = (0, found.st_size)
    kind = FileResponse if span is not None else _WholeFile  # FileResponse sends the range
    return kind(path, media_type=CONTENT_TYPE, headers=_headers(call_id), stat_result=found)


def _read_now(path: Path, asked: ByteRange | None) -> tuple[bytes, int, int]:
    """Of a file still being written: the bytes asked for as it is now, where they start, and
    its size now (only those bytes are read: it grows meanwhile)."""
    with path.open("rb") as file:
        size = os.fstat(file.fileno()).st_size
        try:
            first, stop = (asked.span(size) if asked is not None else None) or (0, size)
        except Unsatisfiable:
            return b"", 0, size
        file.seek(first)
        return file.read(stop - first), first, size


async def _from_bucket(request: Request, call_id: str, store: RecordingStore, key: str) -> Response:
    """The bucket's copy (a ranged GET when a range is asked for). Raises as storage does."""
    asked = _asked(request)
    if asked is None:
        return _audio(await store.fetch(key), call_id, None)
    try:
        part = await store.fetch_range(key, asked.header)
    except RangeNotSatisfiable as exc:
        return _unsatisfiable(call_id, exc.size)
    return _audio(part.body, call_id, asked, part.start, part.size)


@recordings_api.api_route(
    "/calls/{call_id}/recording", methods=["GET", "HEAD"], response_model=None
)
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
            asked = _asked(request)
            body, start, size = await asyncio.to_thread(_read_now, path, asked)
            return _audio(body, call_id, asked, start, size)
    if location is None:
        try:
            found = await board.sessions.get_call(call_id)
        except RegistryUnavailable as exc:
            return error(503, f"call registry unavailable: {exc}")
        location = RecordingLocation.of(found[0].recording) if found is not None else None
    if location is None:
        return error(404, f"no recording of call {call_id}")
    path = recordings.path(location)
    served = await _from_file(request, call_id, path) if path is not None else None
    if served is not None:
        return served
    if location.s3_key is not None and recordings.store.bucket_configured:
        try:
            return await _from_bucket(request, call_id, recordings.store, location.s3_key)
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
    headers = {FORWARDED: "1", "Accept-Encoding": "identity"}
    for name in ("range", "if-range"):
        if name in request.headers:
            headers[name] = request.headers[name]
    token = request.app.state.settings.api_token
    if token is not None:
        headers["Authorization"] = f"Bearer {token.get_secret_value()}"
    client: httpx.AsyncClient = request.app.state.http
    url = f"{owner.address.rstrip('/')}/calls/{call_id}/recording"
    try:
        answer = await client.request(request.method, url, headers=headers, timeout=30.0)
    except httpx.HTTPError as exc:
        log.error(
            "call %s: worker %s did not send the recording: %s", call_id, owner.worker_id, exc
        )
        return error(502, f"worker {location.worker_id} could not be reached")
    if answer.status_code not in (200, 206, 416):  # a range's answers pass back unchanged
        return error(answer.status_code, f"worker {location.worker_id}: {answer.text[:200]}")
    passed = {name: answer.headers[name] for name in _PASSED_BACK if name in answer.headers}
    if request.method == "HEAD":
        passed["Content-Length"] = answer.headers.get("content-length", "0")
    return Response(answer.content, status_code=answer.status_code, headers=passed)

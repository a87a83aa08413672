"""Operations routes: the softphone page, health and readiness, Prometheus metrics, and the
drain that stops a worker once its calls have finished."""

from __future__ import annotations

import asyncio
import os
import re
import resource
from importlib import resources
from pathlib import Path

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from voice.server.auth import authorized, require_token
from voice.server.calls import Switchboard
from voice.server.resident import peak_rss_bytes, rss_bytes
from voice.server.routes import switchboard
from voice.server.routes.console import sign_in_page

ops_api = APIRouter()


def cpu_by_thread() -> dict[str, float]:
    """CPU seconds of this process's live threads by the name the OS has for them, a worker's
    number dropped ("tts_1" -> "tts"; `pipeline.scheduling.name_os_thread`): "main" is the event
    loop's thread, "other" the threads that nobody named (Whisper's and aiortc's own).
    Linux `/proc`; empty elsewhere."""
    tasks = Path("/proc/self/task")
    if not tasks.is_dir():
        return {}
    tick = os.sysconf("SC_CLK_TCK")
    main = str(os.getpid())
    totals: dict[str, float] = {}
    unnamed: str | None = None
    for task in tasks.iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue  # the thread ended meanwhile
        name = stat[stat.index("(") + 1 : stat.rindex(")")]  # a name may hold ")" itself
        after = stat[stat.rindex(")") + 2 :].split()  # from field 3, the state
        seconds = (int(after[11]) + int(after[12])) / tick  # utime, stime: fields 14 and 15
        if task.name == main:
            unnamed, key = name, "main"
        else:
            key = re.sub(r"_\d+$", "", name)
        totals[key] = totals.get(key, 0.0) + seconds
    if unnamed is not None and unnamed in totals:
        totals["other"] = totals.get("other", 0.0) + totals.pop(unnamed)
    return {key: round(value, 2) for key, value in sorted(totals.items())}


async def drain_then_exit(app: FastAPI) -> None:
    """Drain this worker's calls, then ask the server to stop (if it gave a way to)."""
    board: Switchboard = app.state.switchboard
    await board.drain()
    request_exit = getattr(app.state, "request_exit", None)
    if request_exit is not None:
        request_exit()


@ops_api.get("/", response_class=HTMLResponse)
async def softphone(request: Request) -> HTMLResponse:
    """The softphone page; with an API token set and no console session, the console's sign-in
    form, which comes back here (its calls need the session cookie)."""
    if not await authorized(request):
        return sign_in_page("/")
    page = resources.files("voice").joinpath("static/softphone.html").read_text("utf-8")
    return HTMLResponse(page)


@ops_api.get("/healthz")
async def health(request: Request) -> dict[str, object]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "status": "ok",
        "active_calls": len(switchboard(request).active),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
        "rss_mb": round(rss_bytes() / 2**20, 1),
        "peak_rss_mb": round(peak_rss_bytes() / 2**20, 1),  # since the server became ready
        "cpu_by_thread": await asyncio.to_thread(cpu_by_thread),
    }


@ops_api.get("/readyz")
async def ready(request: Request) -> JSONResponse:
    """Readiness: 503 while draining, so load balancers send new calls elsewhere."""
    board = switchboard(request)
    status = "draining" if board.draining else "ready"
    body = {"status": status, "active_calls": len(board.active)}
    return JSONResponse(body, status_code=503 if board.draining else 200)


@ops_api.get("/metrics")
async def prometheus_metrics() -> Response:
    return PlainTextResponse(generate_latest(), media_type=CONTENT_TYPE_LATEST)


@ops_api.post("/admin/drain", dependencies=[Depends(require_token)])
async def drain(request: Request) -> JSONResponse:
    """Stop admitting calls, let those in progress finish, then exit."""
    board = switchboard(request)
    if not board.draining:
        task = asyncio.create_task(drain_then_exit(request.app))
        request.app.state.drain_task = task
    return JSONResponse({"status": "draining", "active_calls": len(board.active)}, status_code=202)

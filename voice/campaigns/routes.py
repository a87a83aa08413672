"""The campaigns API (API token, like the calls API):

- `POST /campaigns`: a campaign (`voice.campaigns.request`): 201 with its id; 422 naming each
  problem; 413 over `HOTLINE_CAMPAIGNS__MAX_BODY_BYTES`; 503 while Redis is away.
- `GET /campaigns`: the latest campaigns, without their rows; `GET /campaigns/{id}`: one, with
  its progress and its rows (`?offset=&limit=`, 1000 at most, and by default).
- `POST /campaigns/{id}/pause`, `…/resume`, `…/stop`: 200 with the state after it (pausing a
  paused one changes nothing); 409 for an ended or stopped campaign.
- `POST /dnc` and `DELETE /dnc` `{"numbers": [...]}`: the do-not-call list; `GET /dnc`: its
  size, `GET /dnc?number=…`: whether a number is on it.
- `GET /console/campaigns`: the console's campaigns page (voice/static/campaigns.html)."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, JSONResponse

from voice.agents.agent import DEFAULT_AGENT
from voice.campaigns.campaign import ROWS_SHOWN, progress, summary
from voice.campaigns.dnc import DoNotCall, e164
from voice.campaigns.hours import zone
from voice.campaigns.request import BadCampaign, CampaignSpec, parse_campaign
from voice.campaigns.runner import CampaignRunner
from voice.cluster.records import RegistryUnavailable
from voice.cluster.store import REDIS_UNREACHABLE
from voice.outbound.request import BadRequest
from voice.server.api import error, read_body, read_json_body
from voice.server.auth import require_token
from voice.server.routes import switchboard
from voice.server.routes.console import console_page
from voice.server.routes.phone import public_url

log = logging.getLogger(__name__)

campaigns_api = APIRouter(dependencies=[Depends(require_token)])
campaigns_page = APIRouter()

_ID = re.compile(r"[0-9a-f]{16}")  # whole string: a campaign id
_CHANGES = ("pause", "resume", "stop")
MAX_DNC_NUMBERS = 10_000  # per request
_LISTED = 50


def _runner(request: Request) -> CampaignRunner:
    runner: CampaignRunner = request.app.state.campaigns
    return runner


def _agents(request: Request) -> list[str]:
    board = switchboard(request)
    directory = board.agents.directory if board.agents is not None else None
    return [*directory.names, directory.default.name] if directory else [DEFAULT_AGENT]


def _due_times(spec: CampaignSpec, now: float, offset: float) -> list[float]:
    """When each row may first be dialled: now, or when its calling hours open."""
    window, opens = spec.head.window.window(), {}
    for name in {row.timezone for row in spec.rows}:
        opens[name] = window.next_open(now + offset, zone(name)) - offset
    return [opens[row.timezone] for row in spec.rows]


def _sip_problem(runner: CampaignRunner, spec: CampaignSpec) -> str | None:
    """Why this worker cannot dial the campaign over SIP (None: it can, or it is not SIP)."""
    if spec.head.transport != "sip":
        return None
    sip = runner.dialer.sip
    if sip is None:
        return "transport: sip needs HOTLINE_SIP__ENABLED=true and HOTLINE_SIP__TRUNKS"
    try:
        sip.trunk(spec.head.trunk)
    except BadRequest as exc:
        return str(exc)
    return None


@campaigns_api.post("/campaigns", status_code=201, response_model=None)
async def create_campaign(request: Request) -> JSONResponse:
    """Start a campaign: its rows are dialled by every worker's runner (see the module)."""
    settings = request.app.state.settings
    body = await read_body(request, settings.campaigns.max_body_bytes)
    agents, limit = _agents(request), settings.campaigns.max_rows
    try:  # a big body is seconds of CPU: not on the event loop
        spec = await asyncio.to_thread(parse_campaign, body, agents, limit)
    except BadCampaign as exc:
        return error(exc.status, str(exc))
    runner = _runner(request)
    problem = _sip_problem(runner, spec)
    if problem is not None:
        return error(422, problem)
    now, offset = time.time(), settings.campaigns.clock_offset_s
    due = await asyncio.to_thread(_due_times, spec, now, offset)
    base = public_url(request, settings).split("?")[0].rsplit("/campaigns", 1)[0]
    try:
        campaign_id = await runner.store.create(spec, due, base)
    except REDIS_UNREACHABLE as exc:
        return error(503, f"campaigns unavailable: Redis unreachable ({exc})", {"Retry-After": "1"})
    runner.wake()
    waiting = sum(1 for at in due if at > now)
    log.info(
        "campaign %s: %d rows (%d outside their calling hours), agent %s over %s, %d at once",
        campaign_id,
        len(spec.rows),
        waiting,
        spec.head.agent,
        spec.head.transport,
        spec.head.concurrency,
    )
    answer = {"campaign_id": campaign_id, "state": "running", "rows": len(spec.rows)}
    answer |= {"waiting_for_hours": waiting, "url": f"/campaigns/{campaign_id}"}
    return JSONResponse(answer, status_code=201)


@campaigns_api.get("/campaigns", response_model=None)
async def list_campaigns(request: Request) -> JSONResponse:
    store = _runner(request).store
    try:
        ids = await store.listed(_LISTED)
        metas = [(c, await store.meta(c)) for c in ids]
    except REDIS_UNREACHABLE as exc:
        return error(503, f"campaigns unavailable: Redis unreachable ({exc})", {"Retry-After": "1"})
    return JSONResponse({"campaigns": [summary(c, m) for c, m in metas if "spec" in m]})


@campaigns_api.get("/campaigns/{campaign_id}", response_model=None)
async def get_campaign(
    request: Request, campaign_id: str, offset: int = 0, limit: int = ROWS_SHOWN
) -> JSONResponse:
    """The campaign's progress and its rows `offset`.. (`limit`, at most 1000)."""
    if _ID.fullmatch(campaign_id) is None:
        return error(404, f"no campaign {campaign_id[:40]!r}")
    if offset < 0 or not 0 < limit <= ROWS_SHOWN:
        return error(422, f"offset: at least 0; limit: 1 to {ROWS_SHOWN}")
    try:
        found = await progress(_runner(request).store, campaign_id, offset, limit)
    except REDIS_UNREACHABLE as exc:
        return error(503, f"campaigns unavailable: Redis unreachable ({exc})", {"Retry-After": "1"})
    if found is None:
        return error(404, f"no campaign {campaign_id}")
    return JSONResponse(found)


@campaigns_api.post("/campaigns/{campaign_id}/{change}", response_model=None)
async def change_campaign(request: Request, campaign_id: str, change: str) -> JSONResponse:
    """Pause, resume or stop a campaign (calls in progress go on)."""
    if change not in _CHANGES:
        return error(404, f"no such action {change[:20]!r} (pause, resume, stop)")
    if _ID.fullmatch(campaign_id) is None:
        return error(404, f"no campaign {campaign_id[:40]!r}")
    runner = _runner(request)
    try:
        state = await runner.store.change_state(campaign_id, change)
    except REDIS_UNREACHABLE as exc:
        return error(503, f"campaigns unavailable: Redis unreachable ({exc})", {"Retry-After": "1"})
    if not state:
        return error(404, f"no campaign {campaign_id}")
    wanted = {"pause": ("paused",), "resume": ("running",), "stop": ("stopped",)}[change]
    if state not in wanted:
        return error(409, f"campaign {campaign_id} is {state}: it cannot {change}")
    log.info("campaign %s: %s (%s)", campaign_id, state, change)
    runner.wake()
    return JSONResponse({"campaign_id": campaign_id, "state": state})


async def _numbers(request: Request) -> list[str] | JSONResponse:
    data = await read_json_body(request, request.app.state.settings.max_body_bytes * 8)
    given = data.get("numbers")
    if set(data) != {"numbers"} or not isinstance(given, list):
        return error(422, 'the body is {"numbers": ["+15551234567", …]}')
    if len(given) > MAX_DNC_NUMBERS:
        return error(422, f"numbers: more than {MAX_DNC_NUMBERS} in one request")
    numbers, problems = [], []
    for index, number in enumerate(given):
        try:
            numbers.append(e164(number))
        except ValueError as exc:
            problems.append(f"numbers[{index}]: {exc}")
            if len(problems) >= 20:
                break
    if problems:
        return error(422, "; ".join(problems))
    return numbers


@campaigns_api.post("/dnc", response_model=None)
async def add_to_dnc(request: Request) -> JSONResponse:
    """Put numbers on the do-not-call list (normalised to E.164)."""
    return await _change_dnc(request, add=True)


@campaigns_api.delete("/dnc", response_model=None)
async def remove_from_dnc(request: Request) -> JSONResponse:
    return await _change_dnc(request, add=False)


async def _change_dnc(request: Request, add: bool) -> JSONResponse:
    numbers = await _numbers(request)
    if isinstance(numbers, JSONResponse):
        return numbers
    dnc: DoNotCall = _runner(request).dnc
    try:
        changed = await (dnc.add(numbers) if add else dnc.remove(numbers))
        count = await dnc.count()
    except RegistryUnavailable as exc:
        return error(503, f"do-not-call list unavailable: Redis unreachable ({exc})")
    log.info("do-not-call list: %s %d numbers (%d listed)", "+" if add else "-", changed, count)
    key = "added" if add else "removed"
    return JSONResponse({key: changed, "count": count})


@campaigns_api.get("/dnc", response_model=None)
async def read_dnc(request: Request, number: str | None = None) -> JSONResponse:
    dnc: DoNotCall = _runner(request).dnc
    answer: dict[str, Any] = {}
    try:
        if number is not None:
            try:
                normalised = e164(number)
            except ValueError as exc:
                return error(422, f"number: {exc}")
            answer = {"number": normalised, "listed": await dnc.listed(normalised)}
        answer["count"] = await dnc.count()
    except RegistryUnavailable as exc:
        return error(503, f"do-not-call list unavailable: Redis unreachable ({exc})")
    return JSONResponse(answer)


@campaigns_page.get("/console/campaigns", response_class=HTMLResponse)
async def campaigns_console(request: Request) -> HTMLResponse:
    """The campaigns page of the console (it reads `GET /campaigns` with the session)."""
    return await console_page(request, "campaigns.html")

"""`POST /calls/outbound`: place a call (API token, as the rest of the calls API).

202 with the call id (the provider's, as for inbound calls) once the provider has taken the
call; 422 for a request that is not one (naming each field); 503 with Retry-After when no call
could be admitted now (this worker's or the cluster's limit, draining, Redis away); 429 with
Retry-After over the provider's calls per second; 502 when the provider refused the call or
could not be reached (its code and message); 501 for what this server cannot place. A SIP call
(voice/outbound/sip.py) is admitted at once and rung in the background: its 202 comes before
anything rings, and how it went is in its record."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from voice.agents.agent import DEFAULT_AGENT
from voice.cluster.records import RegistryUnavailable
from voice.outbound.dialer import Dialer, NotPlaceable, TooFast
from voice.outbound.placed import DialError
from voice.outbound.request import BadRequest, parse_request
from voice.server import metrics
from voice.server.api import error, read_json_body
from voice.server.auth import require_token
from voice.server.call_records import CallsFull
from voice.server.routes import switchboard
from voice.server.routes.phone import public_url

log = logging.getLogger(__name__)

outbound_api = APIRouter(dependencies=[Depends(require_token)])


@outbound_api.post("/calls/outbound", status_code=202, response_model=None)
async def place_call(request: Request) -> JSONResponse:
    """Ring `to` from `from`; once answered, `agent` talks (see voice/outbound/request.py)."""
    settings = request.app.state.settings
    data = await read_json_body(request, settings.max_body_bytes)
    board = switchboard(request)
    directory = board.agents.directory if board.agents is not None else None
    names = [*directory.names, directory.default.name] if directory else [DEFAULT_AGENT]
    try:
        order = parse_request(data, names)
    except BadRequest as exc:
        return error(422, str(exc))
    refusal = await board.refusal()
    if refusal is not None:
        metrics.REFUSED.labels(transport=order.transport, reason="outbound").inc()
        return error(503, f"no call can be admitted now ({refusal})", {"Retry-After": "1"})
    dialer: Dialer = request.app.state.dialer
    base = public_url(request, settings).split("?")[0].rsplit("/calls/", 1)[0]
    agents = board.agents  # the agent's voicemail, with the call's variables in it
    ready = agents.named(order.agent, order.metadata) if agents is not None else None
    try:
        placed = await dialer.place(order, base, ready.agent.voicemail if ready else None)
    except NotPlaceable as exc:
        return error(501, str(exc))
    except BadRequest as exc:  # a SIP trunk that is not one
        return error(422, str(exc))
    except CallsFull as exc:  # a SIP call is admitted as it is placed
        return error(503, f"no call can be admitted now ({exc.reason})", {"Retry-After": "1"})
    except TooFast as exc:
        return error(429, str(exc), {"Retry-After": dialer.rate.retry_after(exc.wait_s)})
    except RegistryUnavailable as exc:
        return error(503, f"call registry unavailable: {exc}", {"Retry-After": "1"})
    except DialError as exc:
        body = {"error": str(exc), "provider": exc.provider, "provider_status": exc.status}
        log.warning("HTTP 502: %s", exc)
        return JSONResponse({**body, "provider_code": exc.code}, status_code=502)
    through = {"trunk": placed.trunk} if placed.trunk else {}
    return JSONResponse(
        {
            "call_id": placed.call_id,
            "transport": placed.provider,
            "status": placed.status,
            "direction": "outbound",
            "to": order.to,
            "from": order.from_ or placed.caller,
            "agent": order.agent,
            **through,
        },
        status_code=202,
    )

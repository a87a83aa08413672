"""The testing API: what `hotline test --url` may do to a call of a running server, and only when
the server allows it (`HOTLINE_TESTING__ALLOW_MOCKS=true`; README "Testing an agent").

`PUT /calls/{id}/mocks` with `{"mocks": {"order_status": {"answer": {...}, "status": 200}}}`
fixes what the call's HTTP tools of those names answer (`voice.agents.mocked_tools`): once a
call, on the worker that has it (through Redis, as the calls API's commands go), for as long as
the call lasts. The refusals, in order: 404 when the setting is off (whatever the request), 403
when the server has no API token (mocks must never be open to anyone who reaches the port), 401
without the token (compared in constant time, `voice.server.auth`), 400 a bad body or a tool
the call's agent does not have, 404 no such call in progress, 409 mocks already set.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from voice.agents.mocked_tools import MocksRefused, read_mocks
from voice.server.api import APIError, error, read_json_body
from voice.server.auth import require_token
from voice.server.routes.calls import _control


async def _mocks_allowed(request: Request) -> None:
    """Off: 404, as if the route were not there; no API token configured: 403; then the token."""
    settings = request.app.state.settings
    if not settings.testing.allow_mocks:
        raise APIError(404, "tool mocks are off on this server (HOTLINE_TESTING__ALLOW_MOCKS)")
    if settings.api_token is None:
        raise APIError(403, "tool mocks need an API token: set HOTLINE_API_TOKEN")
    await require_token(request)


testing_api = APIRouter(dependencies=[Depends(_mocks_allowed)])


@testing_api.put("/calls/{call_id}/mocks")
async def mock_tools(call_id: str, request: Request) -> JSONResponse:
    """Fix what HTTP tools answer on one call in progress (once; until the call ends)."""
    data = await read_json_body(request, request.app.state.settings.max_body_bytes)
    try:
        mocks = read_mocks(data.get("mocks"))
    except MocksRefused as exc:
        return error(exc.code, str(exc))
    given = {name: mock.model_dump() for name, mock in mocks.items()}
    return await _control(request, call_id, "mocks", {"mocks": given})

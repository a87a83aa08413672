"""The supervisor console (/console): one page of plain HTML, CSS and JS (voice/static/), behind
the API token. A browser signs in once with the token (POST /console/login); from then on an
HttpOnly, SameSite=Strict cookie (an HMAC of the token, voice.server.auth) authorizes the page's
own requests to the calls API, its websocket and its listen-in offer."""

from __future__ import annotations

import html
import logging
from importlib import resources
from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import SecretStr

from voice.server.api import APIError, read_body
from voice.server.auth import CONSOLE_COOKIE, authorized, console_session, token_matches

log = logging.getLogger(__name__)

console_api = APIRouter()

_SESSION_S = 12 * 3600  # a console session lasts a working day
_LOGIN = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Hotline console: sign in</title>
<style>
body {{ font: 15px system-ui, sans-serif; background: #f4f5f7; display: grid;
  place-items: center; height: 100vh; margin: 0; color: #1d2330; }}
form {{ background: #fff; padding: 28px 32px; border-radius: 10px; width: 320px;
  box-shadow: 0 2px 12px rgba(0,0,0,.08); }}
h1 {{ font-size: 18px; margin: 0 0 16px; }}
input {{ width: 100%; box-sizing: border-box; padding: 8px; margin: 6px 0 14px;
  border: 1px solid #c8ccd4; border-radius: 6px; font: inherit; }}
button {{ padding: 8px 16px; border: 0; border-radius: 6px; background: #2456d6; color: #fff;
  font: inherit; cursor: pointer; }}
.error {{ color: #b42318; margin: 0 0 12px; }}
</style></head>
<body><form method="post" action="/console/login">
<h1>Hotline supervisor console</h1>{error}
<label for="token">API token</label>
<input id="token" name="token" type="password" autocomplete="current-password" autofocus>
<button id="sign-in" type="submit">Sign in</button>
</form></body></html>
"""


def _login_page(error: str = "", status: int = 200) -> HTMLResponse:
    message = f'<p class="error">{html.escape(error)}</p>' if error else ""
    return HTMLResponse(_LOGIN.format(error=message), status_code=status)


@console_api.get("/console", response_class=HTMLResponse)
async def console(request: Request) -> HTMLResponse:
    """The console, or its sign-in form without a session."""
    if not authorized(request):
        return _login_page()
    page = resources.files("voice").joinpath("static/console.html").read_text("utf-8")
    return HTMLResponse(page, headers={"Cache-Control": "no-store"})


@console_api.post("/console/login", response_model=None)
async def login(request: Request) -> Response:
    """Check the token from the sign-in form; on success, the session cookie."""
    try:
        body = await read_body(request, 4096)
    except APIError as exc:
        return _login_page(exc.message, exc.status)
    given = parse_qs(body.decode("utf-8", "replace")).get("token", [""])[0]
    token: SecretStr | None = request.app.state.settings.api_token
    client = request.client.host if request.client else "?"
    if token is not None and not token_matches(request, given):
        log.warning("console: wrong token from %s", client)
        return _login_page("That is not the API token.", 401)
    response = RedirectResponse("/console", status_code=303)
    if token is not None:
        response.set_cookie(
            CONSOLE_COOKIE,
            console_session(token),
            max_age=_SESSION_S,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path="/",
        )
        log.info("console: signed in from %s", client)
    return response


@console_api.post("/console/logout", response_model=None)
async def logout() -> Response:
    response = RedirectResponse("/console", status_code=303)
    response.delete_cookie(CONSOLE_COOKIE, path="/")
    return response

"""The supervisor console (/console): one page of plain HTML, CSS and JS (voice/static/), behind
the API token. A browser signs in once with the token (POST /console/login, from the console's
form or the softphone's, `sign_in_page`); from then on an HttpOnly, SameSite=Strict session
cookie (voice.server.auth: issue time, random id, signed,
refused after 12 h or once signed out) authorizes the page's own requests to the calls API, its
websocket and its listen-in offer. POST /console/logout revokes the session on every worker.

Wrong tokens are slowed per source (`SignInThrottle`): the 5th wrong one within a minute from
one address (an IPv6 /64 counts as one) locks that source out for 30 s, each later lock-out
twice as long, at most 15 min, forgotten after an hour without a wrong token. While locked
out, every sign-in from that source gets 429 with Retry-After, the right token too: it is not
even looked at."""

from __future__ import annotations

import html
import ipaddress
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from urllib.parse import parse_qs

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import SecretStr

from voice.cluster.records import RegistryUnavailable
from voice.server.api import APIError, read_body
from voice.server.auth import (
    CONSOLE_COOKIE,
    SESSION_S,
    authorized,
    issue_console_session,
    read_console_session,
    revoke_console_session,
    token_matches,
)
from voice.server.routes import switchboard
from voice.throttle import LogThrottle

log = logging.getLogger(__name__)

console_api = APIRouter()

_LOGIN = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}: sign in</title>
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
<h1>{heading}</h1>{error}
<input type="hidden" name="next" value="{next}">
<label for="token">API token</label>
<input id="token" name="token" type="password" autocomplete="current-password" autofocus>
<button id="sign-in" type="submit">Sign in</button>
</form></body></html>
"""


@dataclass
class _Source:
    failures: int = 0  # wrong tokens in the current window
    window_start: float = -math.inf
    strikes: int = 0  # lock-outs so far
    locked_until: float = 0.0
    last_failure: float = -math.inf


class SignInThrottle:
    """Wrong sign-ins per source, in this worker: `allowed` wrong tokens within `window_s`
    lock the source out for `first_lock_s`, doubling with each lock-out up to `max_lock_s`;
    a source without a wrong token for `forget_s` starts afresh. At most `max_sources` are
    remembered (the least recently failed are forgotten first). `clock`: monotonic seconds."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        *,
        allowed: int = 5,
        window_s: float = 60.0,
        first_lock_s: float = 30.0,
        max_lock_s: float = 900.0,
        forget_s: float = 3600.0,
        max_sources: int = 10_000,
    ) -> None:
        self.clock, self.allowed, self.window_s = clock, allowed, window_s
        self.first_lock_s, self.max_lock_s, self.forget_s = first_lock_s, max_lock_s, forget_s
        self.max_sources = max_sources
        self._sources: OrderedDict[str, _Source] = OrderedDict()

    def locked_for(self, source: str) -> float:
        """Seconds until `source` may try again (0: now)."""
        entry = self._sources.get(source)
        return max(0.0, entry.locked_until - self.clock()) if entry is not None else 0.0

    def failed(self, source: str) -> float:
        """A wrong token from `source`: the lock-out it starts, in seconds (0: none yet)."""
        now = self.clock()
        entry = self._sources.pop(source, None) or _Source()
        self._sources[source] = entry  # the most recent last
        while len(self._sources) > self.max_sources:
            self._sources.popitem(last=False)
        if now - entry.last_failure >= self.forget_s:
            entry.strikes = 0
        if now - entry.window_start >= self.window_s:
            entry.failures, entry.window_start = 0, now
        entry.failures += 1
        entry.last_failure = now
        if entry.failures < self.allowed:
            return 0.0
        entry.strikes += 1
        doubled = self.first_lock_s * float(2 ** min(entry.strikes - 1, 20))
        lock_s = min(doubled, self.max_lock_s)
        entry.locked_until, entry.failures, entry.window_start = now + lock_s, 0, now
        return lock_s

    def succeeded(self, source: str) -> None:
        """The right token from `source`: its wrong ones are forgiven."""
        self._sources.pop(source, None)


def source_of(host: str) -> str:
    """The source a sign-in is counted against: its address, or its /64 for IPv6 (one host's
    share of addresses)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


def _throttle(app: FastAPI) -> tuple[SignInThrottle, LogThrottle]:
    """This worker's sign-in throttle, and the budget of its log lines: at most 30 a minute
    about wrong sign-ins, all sources together (made on first use)."""
    found: tuple[SignInThrottle, LogThrottle] | None = getattr(app.state, "sign_in_throttle", None)
    if found is None:
        lines = LogThrottle(every_s=0.0, per_s=0.5, burst=30.0)
        found = app.state.sign_in_throttle = (SignInThrottle(), lines)
    return found


# The pages that sign in through the console's form, and where it sends the browser back to.
_SIGNS_IN = {
    "/console": ("Hotline console", "Hotline supervisor console"),
    "/": ("Hotline softphone", "Hotline softphone"),
}


def sign_in_page(
    next_page: str = "/console", error: str = "", status: int = 200, retry_after_s: float = 0
) -> HTMLResponse:
    """The sign-in form for `next_page` (the console or the softphone), which it returns to."""
    next_page = next_page if next_page in _SIGNS_IN else "/console"
    title, heading = _SIGNS_IN[next_page]
    message = f'<p class="error">{html.escape(error)}</p>' if error else ""
    page = _LOGIN.format(title=title, heading=heading, error=message, next=next_page)
    headers = {"Cache-Control": "no-store"}
    if retry_after_s > 0:
        headers["Retry-After"] = str(math.ceil(retry_after_s))
    return HTMLResponse(page, status_code=status, headers=headers)


def _locked_out(wait_s: float, next_page: str) -> HTMLResponse:
    return sign_in_page(
        next_page,
        f"Too many wrong tokens from your address: try again in {math.ceil(wait_s)} s.",
        429,
        wait_s,
    )


async def console_page(request: Request, name: str) -> HTMLResponse:
    """A page of the console (voice/static/`name`), or its sign-in form without a session."""
    if not await authorized(request):
        return sign_in_page("/console")
    page = resources.files("voice").joinpath(f"static/{name}").read_text("utf-8")
    return HTMLResponse(page, headers={"Cache-Control": "no-store"})


@console_api.get("/console", response_class=HTMLResponse)
async def console(request: Request) -> HTMLResponse:
    """The console, or its sign-in form without a session."""
    return await console_page(request, "console.html")


@console_api.post("/console/login", response_model=None)
async def login(request: Request) -> Response:
    """Check the token from the sign-in form; on success, a new session cookie and back to
    the page that asked (the console or the softphone). A source locked out by wrong tokens
    gets 429 before its token is read."""
    client = request.client.host if request.client else "?"
    source = source_of(client)
    throttle, budget = _throttle(request.app)
    wait_s = throttle.locked_for(source)
    if wait_s > 0:
        return _locked_out(wait_s, "/console")
    try:
        body = await read_body(request, 4096)
    except APIError as exc:
        return sign_in_page("/console", exc.message, exc.status)
    form = parse_qs(body.decode("utf-8", "replace"))
    given, back = form.get("token", [""])[0], form.get("next", ["/console"])[0]
    back = back if back in _SIGNS_IN else "/console"  # never a redirect elsewhere
    token: SecretStr | None = request.app.state.settings.api_token
    if token is not None and not token_matches(request, given):
        lock_s = throttle.failed(source)
        locked = f", sign-in locked for {lock_s:.0f} s" if lock_s else ""
        budget.warn(log, "sign-in", "console: wrong token from %s%s", client, locked)
        if lock_s:
            return _locked_out(lock_s, back)
        return sign_in_page(back, "That is not the API token.", 401)
    throttle.succeeded(source)
    response = RedirectResponse(back, status_code=303)
    if token is not None:
        response.set_cookie(
            CONSOLE_COOKIE,
            issue_console_session(token),
            max_age=SESSION_S,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path="/",
        )
        log.info("console: signed in from %s", client)
    return response


@console_api.post("/console/logout", response_model=None)
async def logout(request: Request) -> Response:
    """Sign out: the session is revoked on every worker (503 if Redis cannot be reached to
    say so: the browser forgets the cookie, but it would still work elsewhere)."""
    response: Response = RedirectResponse("/console", status_code=303)
    token: SecretStr | None = request.app.state.settings.api_token
    cookie = request.cookies.get(CONSOLE_COOKIE)
    session = read_console_session(token, cookie) if token is not None and cookie else None
    if session is not None:
        try:
            await revoke_console_session(switchboard(request).sessions, session)
            log.info("console: signed out from %s", request.client.host if request.client else "?")
        except RegistryUnavailable:
            log.error("console: sign-out not recorded, Redis unreachable")
            message = "Signed out here, but not revoked: Redis is unreachable."
            response = sign_in_page("/console", message, 503)
    response.delete_cookie(
        CONSOLE_COOKIE,
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response

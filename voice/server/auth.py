"""The API token (`HOTLINE_API_TOKEN`) as a FastAPI dependency: `require_token` on every route
that needs it. Every request passes when no token is configured.

The token comes as `Authorization: Bearer …`, or, from the supervisor console's browser, as the
console's session cookie: an HMAC of the token (never the token itself), HttpOnly and
SameSite=Strict, set by signing in at /console. Websockets may also give it as `?token=`
(browsers cannot set headers on them). Every comparison is constant-time."""

from __future__ import annotations

import hashlib
import hmac

from fastapi import Request
from pydantic import SecretStr
from starlette.requests import HTTPConnection

from voice.server.api import APIError

CONSOLE_COOKIE = "hotline_console"


def console_session(token: SecretStr) -> str:
    """The console cookie's value for `token` (the same on every worker)."""
    key = token.get_secret_value().encode()
    return hmac.new(key, b"hotline console session", hashlib.sha256).hexdigest()


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


def token_matches(connection: HTTPConnection, given: str) -> bool:
    """Whether `given` is the API token (true for anything when none is configured)."""
    token: SecretStr | None = connection.app.state.settings.api_token
    return token is None or _same(given, token.get_secret_value())


def _authorized(connection: HTTPConnection, query_token: bool) -> bool:
    token: SecretStr | None = connection.app.state.settings.api_token
    if token is None:
        return True
    scheme, _, given = connection.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and _same(given.strip(), token.get_secret_value()):
        return True
    cookie = connection.cookies.get(CONSOLE_COOKIE)
    if cookie is not None and _same(cookie, console_session(token)):
        return True
    if query_token and "token" in connection.query_params:
        return _same(connection.query_params["token"], token.get_secret_value())
    return False


def authorized(request: Request) -> bool:
    """Whether the request carries the API token (always true when none is configured)."""
    return _authorized(request, query_token=False)


def authorized_socket(connection: HTTPConnection) -> bool:
    """The API token on a websocket: the header, the console's cookie, or `?token=`."""
    return _authorized(connection, query_token=True)


def require_token(request: Request) -> None:
    """The API token, as a dependency of every route that needs it (401 without it)."""
    if not authorized(request):
        raise APIError(401, "missing or wrong bearer token", {"WWW-Authenticate": "Bearer"})

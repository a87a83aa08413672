"""The API token (`HOTLINE_API_TOKEN`) as a FastAPI dependency: `require_token` on every route
that needs it. Every request passes when no token is configured."""

from __future__ import annotations

import hmac

from fastapi import Request

from voice.server.api import APIError


def authorized(request: Request) -> bool:
    """Whether the request carries the API token (always true when none is configured)."""
    token = request.app.state.settings.api_token
    if token is None:
        return True
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    expected = token.get_secret_value().encode()
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), expected)


def require_token(request: Request) -> None:
    """The API token, as a dependency of every route that needs it (401 without it)."""
    if not authorized(request):
        raise APIError(401, "missing or wrong bearer token", {"WWW-Authenticate": "Bearer"})

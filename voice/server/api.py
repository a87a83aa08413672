"""What every API route shares: JSON error responses (`error`, `APIError`, answered by
`api_error_response`, registered on the app) and request bodies read within a size and nesting
bound."""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

log = logging.getLogger(__name__)

MAX_JSON_DEPTH = 64  # far beyond any body we accept, far below the parser's recursion limit
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def error(status: int, message: str) -> JSONResponse:
    """A JSON error response, logged."""
    log.warning("HTTP %d: %s", status, message)
    return JSONResponse({"error": message}, status_code=status)


class APIError(Exception):
    """A request we refuse: raised anywhere in a handler (or a dependency), answered as a JSON
    error by `api_error_response` (registered on the app)."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


async def api_error_response(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    response = error(exc.status, exc.message)
    response.headers.update(exc.headers)
    return response


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, read as a stream and never past `limit` bytes (413 at once when
    Content-Length already says it is too large)."""
    declared = request.headers.get("content-length", "")  # the server has checked its syntax
    if declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise APIError(413, f"body larger than {limit} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise APIError(413, f"body larger than {limit} bytes")
    return bytes(body)


def json_depth(body: bytes) -> int:
    """How deeply `body`'s arrays and objects nest (brackets inside strings do not count)."""
    brackets = _JSON_STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    depth = deepest = 0
    for byte in brackets:
        depth += 1 if byte in b"[{" else -1
        deepest = max(deepest, depth)
    return deepest


async def read_json_body(request: Request, limit: int) -> dict[str, Any]:
    """The request body as a JSON object (400 or 413 otherwise)."""
    body = await read_body(request, limit)
    if json_depth(body) > MAX_JSON_DEPTH:
        raise APIError(400, f"body nests JSON deeper than {MAX_JSON_DEPTH} levels")
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise APIError(400, "body is not valid JSON") from None
    except RecursionError:  # a nesting the depth count missed must not become a 500
        raise APIError(400, "body nests JSON too deeply") from None
    if not isinstance(data, dict):
        raise APIError(400, "body must be a JSON object")
    return data

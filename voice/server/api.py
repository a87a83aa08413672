"""What every API route shares: JSON error responses (`error`, `APIError`, answered by
`api_error_response`, registered on the app) and request bodies read within a size and nesting
bound."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

log = logging.getLogger(__name__)

MAX_JSON_DEPTH = 64  # far beyond any body we accept, far below the parser's recursion limit
_QUOTE, _BACKSLASH = b'"\\'
_OPENERS, _CLOSERS = tuple(b"[{"), tuple(b"]}")


def error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """A JSON error response (with `headers`, e.g. `Retry-After`), logged."""
    log.warning("HTTP %d: %s", status, message)
    return JSONResponse({"error": message}, status_code=status, headers=headers)


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


@dataclass(frozen=True)
class Nesting:
    """What one pass over a JSON body found: how deeply its arrays and objects nest (as far as
    it looked), and how many bytes it looked at (never more than the body's length)."""

    depth: int
    examined: int


def json_nesting(body: bytes, stop_beyond: int | None = None) -> Nesting:
    """How deeply `body`'s arrays and objects nest, in one pass over its bytes: a small state
    machine (in a string or not, after a backslash or not) looks at each byte once and never
    back, so a body costs its length whatever it holds (an unclosed string, a run of escaped
    quotes, brackets inside strings). With `stop_beyond`, it stops at the first byte that
    nests deeper. Malformed JSON is the parser's to refuse; this only bounds its recursion."""
    in_string = escaped = False
    depth = deepest = 0
    for index, byte in enumerate(body):
        if in_string:
            if escaped:
                escaped = False
            elif byte == _BACKSLASH:
                escaped = True
            elif byte == _QUOTE:
                in_string = False
        elif byte == _QUOTE:
            in_string = True
        elif byte in _OPENERS:
            depth += 1
            if depth > deepest:
                deepest = depth
                if stop_beyond is not None and deepest > stop_beyond:
                    return Nesting(deepest, index + 1)
        elif byte in _CLOSERS:
            depth -= 1
    return Nesting(deepest, len(body))


def json_depth(body: bytes) -> int:
    """How deeply `body`'s arrays and objects nest (brackets inside strings do not count)."""
    return json_nesting(body).depth


async def read_json_body(request: Request, limit: int) -> dict[str, Any]:
    """The request body as a JSON object (400 or 413 otherwise)."""
    body = await read_body(request, limit)
    if json_nesting(body, stop_beyond=MAX_JSON_DEPTH).depth > MAX_JSON_DEPTH:
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

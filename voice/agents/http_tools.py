"""HTTP tools: an agent's tool that is an HTTPS endpoint of the operator's (see `HttpTool`).

When the model calls one, Hotline POSTs a compact UTF-8 JSON body to the tool's `url`:

    {"call_id": "...", "tool": "lookup_order", "tool_call_id": "...",
     "arguments": {...}, "caller": "+15551230000", "callee": "+15559870000"}

with these headers (and the tool's own `headers`, which cannot replace them):

- `Content-Type: application/json`, `User-Agent: Hotline/<version>`,
- `X-Hotline-Call-Id`: the call's id,
- `X-Hotline-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256>`, the HMAC keyed with the agent's
  secret over the bytes `f"{t}."` followed by the raw body. The timestamp is signed too, so a
  receiver can refuse a replayed request: check that `t` is recent, then compare the HMAC in
  constant time. Verify against the raw body bytes, before parsing them. For example (with
  `hashlib`, `hmac` and `time` imported):

    def verify(secret: bytes, header: str, body: bytes, tolerance_s: int = 300) -> bool:
        fields = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
        t = int(fields.get("t", "0"))
        expected = hmac.new(secret, f"{t}.".encode() + body, hashlib.sha256).hexdigest()
        fresh = abs(time.time() - t) <= tolerance_s
        return fresh and hmac.compare_digest(expected, fields.get("v1", ""))

(or import `verify` from this module, which also accepts several `v1` values).

A 2xx answer's body is what the model reads: JSON is passed on as compact JSON, anything else as
`{"result": "<text>"}`, cut to `MAX_OUTPUT_CHARS`. A timeout (`timeout_s` covers the whole
request), any other status, a service that cannot be reached or an answer over
`MAX_RESPONSE_BYTES` becomes an error the model can speak about; `HttpTool.run` never raises for
those. Redirects are not followed: the signed body and the tool's headers (tokens) go to the
configured URL only.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import importlib.metadata
import json
import logging
import time
from functools import cache
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field, HttpUrl

from pipeline.tools import ToolArgumentsError, ToolCall, ToolContext, ToolResult, ToolSpec

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Hotline-Signature"
CALL_ID_HEADER = "X-Hotline-Call-Id"
MAX_OUTPUT_CHARS = 4000  # the most of a service's answer the model reads
MAX_RESPONSE_BYTES = 1_000_000  # a bigger answer is refused, and not read further
_ERROR_BODY_CHARS = 200  # of a non-2xx answer's body, in the model's error


class HttpToolConfig(BaseModel):
    """One HTTP tool as an agent file declares it."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$", description="What the model calls it.")
    description: str = Field(min_length=1, description="What it is for, for the model.")
    parameters: dict[str, Any] = Field(
        default_factory=lambda: {"type": "object", "properties": {}},
        description="JSON schema of the arguments (an object).",
    )
    url: HttpUrl = Field(description="POSTed the arguments as JSON, signed.")
    timeout_s: float = Field(default=5.0, gt=0, le=60)
    headers: dict[str, str] = Field(
        default_factory=dict,
        description='Extra request headers, e.g. {"Authorization": "Bearer ${ORDERS_TOKEN}"}; '
        "${NAME} is read from the environment when the file loads.",
    )


# -- signatures --------------------------------------------------------------------------------


def _digest(secret: bytes, body: bytes, timestamp: int) -> str:
    return hmac.new(secret, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


def sign(secret: bytes, body: bytes, timestamp: int) -> str:
    """The `X-Hotline-Signature` value for `body` sent at `timestamp` (unix seconds)."""
    return f"t={timestamp},v1={_digest(secret, body, timestamp)}"


def verify(
    secret: bytes, header_value: str, body: bytes, now: float, tolerance_s: float = 300
) -> bool:
    """Whether `header_value` (an `X-Hotline-Signature`) signs `body` with `secret`, at a time
    within `tolerance_s` of `now` (unix seconds). Any one of several `v1` values may match (a
    sender rotating secrets); a malformed header is simply not valid."""
    timestamp: int | None = None
    candidates: list[str] = []
    for part in header_value.split(","):
        key, sep, value = part.strip().partition("=")
        if not sep:
            return False
        if key == "t":
            if timestamp is not None or not (value.isascii() and value.isdigit()):
                return False
            timestamp = int(value)
        elif key == "v1":
            candidates.append(value)
    if timestamp is None or not candidates or abs(now - timestamp) > tolerance_s:
        return False
    expected = _digest(secret, body, timestamp)
    # Every candidate is compared, so the time taken does not tell which one matched.
    matches = [
        hmac.compare_digest(expected.encode(), c.encode("ascii", "replace")) for c in candidates
    ]
    return any(matches)


# -- the tool ----------------------------------------------------------------------------------


@cache
def user_agent() -> str:
    """`Hotline/<version>`: the User-Agent of every request Hotline sends out."""
    try:
        version = importlib.metadata.version("hotline")
    except importlib.metadata.PackageNotFoundError:
        version = "dev"
    return f"Hotline/{version}"


def _compact(value: Any) -> str:
    """Compact JSON, UTF-8 as is; \\u escapes only if there is a lone surrogate (JSON text
    may hold one, UTF-8 cannot)."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    try:
        text.encode()
    except UnicodeEncodeError:
        return json.dumps(value, separators=(",", ":"))
    return text


def _decode(raw: bytes, encoding: str | None) -> str:
    try:
        return raw.decode(encoding or "utf-8", errors="replace")
    except LookupError:  # a charset Python does not know
        return raw.decode("utf-8", errors="replace")


def model_output(text: str) -> str:
    """What the model reads of a service's answer `text`: JSON as compact JSON, other text as
    `{"result": text}`; at most `MAX_OUTPUT_CHARS`, saying so when cut."""
    try:
        output = _compact(json.loads(text))
    except ValueError:  # not JSON (json.JSONDecodeError is a ValueError)
        output = _compact({"result": text})
    if len(output) <= MAX_OUTPUT_CHARS:
        return output
    note = f"the answer was {len(output)} characters long; this is its beginning"
    keep = MAX_OUTPUT_CHARS
    while True:  # escaping makes the wrapped length a little more than `keep`
        cut = _compact({"truncated": note, "result": output[:keep]})
        if len(cut) <= MAX_OUTPUT_CHARS or keep == 0:
            return cut
        keep = max(0, keep - (len(cut) - MAX_OUTPUT_CHARS))


class _Refused(Exception):
    """The service answered, but not with something the model can use."""

    def __init__(self, message: str, status: str) -> None:
        super().__init__(message)
        self.message = message
        self.status = status  # for the log line


class HttpTool:
    """One HTTP tool of an agent: `spec` for the model, `run` to POST one call, signed with
    `secret`, through the shared `client`."""

    def __init__(self, config: HttpToolConfig, secret: bytes, client: httpx.AsyncClient) -> None:
        self.config = config
        self._secret = secret
        self._client = client
        self._spec = ToolSpec(config.name, config.description, dict(config.parameters))

    def __repr__(self) -> str:  # never the secret or the headers
        return f"HttpTool({self.config.name!r})"

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def spec(self) -> ToolSpec:
        return self._spec

    async def run(self, call: ToolCall, context: ToolContext) -> ToolResult:
        """POST `call` and return what the service answered, or an error result for the model.
        Cancelling it drops the request (and the connection)."""
        started = time.monotonic()
        name = self.config.name

        def failed(message: str, status: str) -> ToolResult:
            log.warning(
                "call %s: tool %s (tool call %s) failed: %s",
                context.call_id,
                name,
                call.id,
                status,
            )
            return ToolResult.error(call, message, started, time.monotonic())

        try:
            arguments = call.parsed()
        except ToolArgumentsError as exc:
            return failed(f"the arguments for {name} are not valid: {exc}", "bad arguments")

        body = _compact(
            {
                "call_id": context.call_id,
                "tool": call.name,
                "tool_call_id": call.id,
                "arguments": arguments,
                "caller": context.caller,
                "callee": context.callee,
            }
        ).encode()
        headers = httpx.Headers(self.config.headers)
        headers["Content-Type"] = "application/json"
        headers["User-Agent"] = user_agent()
        headers[CALL_ID_HEADER] = context.call_id
        headers[SIGNATURE_HEADER] = sign(self._secret, body, int(time.time()))

        timeout_s = self.config.timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                output = await self._post(body, headers, timeout_s)
        except (TimeoutError, httpx.TimeoutException):
            return failed(f"the {name} service did not answer within {timeout_s:g} s", "timed out")
        except httpx.ConnectError:
            return failed(f"the {name} service could not be reached", "unreachable")
        except httpx.HTTPError as exc:  # reset mid-answer, a broken answer
            return failed(
                f"the {name} service's answer broke off", f"broken answer ({type(exc).__name__})"
            )
        except _Refused as exc:
            return failed(exc.message, exc.status)
        return ToolResult(call, output, started_at=started, ended_at=time.monotonic())

    async def _post(self, body: bytes, headers: httpx.Headers, timeout_s: float) -> str:
        name = self.config.name
        async with self._client.stream(
            "POST",
            str(self.config.url),
            content=body,
            headers=headers,
            timeout=timeout_s,
            follow_redirects=False,
        ) as response:
            status = response.status_code
            if not 200 <= status < 300:
                raw = await _read_some(response, _ERROR_BODY_CHARS * 4)
                text = _decode(raw, response.encoding).strip()[:_ERROR_BODY_CHARS]
                message = f"the {name} service answered with HTTP status {status}"
                raise _Refused(f"{message}: {text}" if text else message, f"HTTP {status}")
            too_big = _Refused(
                f"the {name} service's answer was larger than {MAX_RESPONSE_BYTES / 1e6:g} MB",
                f"HTTP {status}, answer over {MAX_RESPONSE_BYTES} bytes",
            )
            declared = response.headers.get("Content-Length", "")
            if declared.isascii() and declared.isdigit() and int(declared) > MAX_RESPONSE_BYTES:
                raise too_big
            raw = await _read_some(response, MAX_RESPONSE_BYTES + 1)
            if len(raw) > MAX_RESPONSE_BYTES:
                raise too_big
            return model_output(_decode(raw, response.encoding))


async def _read_some(response: httpx.Response, limit: int) -> bytes:
    """Up to about `limit` bytes of `response`'s (decoded) body; stops reading there."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size >= limit:
            break
    return b"".join(chunks)

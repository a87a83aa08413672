"""One webhook attempt over HTTP (`post`): the signed body POSTed, and what the answer means for
the outbox (`Answer`): a status, or none at all (a timeout, no connection), the start of a
refusal's text, and the receiver's `Retry-After`. Redirects are not followed: the signed body
goes to the configured URL or nowhere."""

from __future__ import annotations

import asyncio
import email.utils
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC
from typing import Literal, get_args

import httpx

from voice.agents.http_tools import user_agent

_ERROR_TEXT_CHARS = 200  # of a non-2xx answer's body, in `last_error`

# What one attempt came to, as the outbox's `on_outcome` is told: delivered; retried (another
# attempt follows); rejected (a status that is not retried: failed); given_up (failed at the
# deadline); superseded (its lease ran out and another worker took it, which records it).
Outcome = Literal["delivered", "retried", "rejected", "given_up", "superseded"]
OUTCOMES: tuple[Outcome, ...] = get_args(Outcome)


@dataclass(frozen=True)
class Answer:
    status: int | None  # None: no answer (timeout, connection)
    error: str | None
    retry_after_s: float | None = None


async def post(
    client: httpx.AsyncClient,
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    timeout_s: float,
    clock: Callable[[], float],
) -> Answer:
    """POST `body` (JSON) with `headers`; the answer, never an exception for a failure."""
    sent = {"Content-Type": "application/json", "User-Agent": user_agent(), **headers}
    try:
        async with (
            asyncio.timeout(timeout_s),
            client.stream(
                "POST", url, content=body, headers=sent, timeout=timeout_s, follow_redirects=False
            ) as response,
        ):
            status = response.status_code
            if 200 <= status < 300:
                return Answer(status, None)
            said = await _read_some(response, _ERROR_TEXT_CHARS)
            error = f"HTTP {status}" + (f": {said}" if said else "")
            return Answer(
                status, error, _retry_after_s(response.headers.get("Retry-After"), clock())
            )
    except (TimeoutError, httpx.TimeoutException):
        return Answer(None, f"no answer within {timeout_s:g} s")
    except httpx.ConnectError:
        return Answer(None, "the receiver could not be reached")
    except httpx.HTTPError as exc:  # reset mid-answer, a broken answer
        return Answer(None, f"the answer broke off ({type(exc).__name__})")


def _retry_after_s(value: str | None, now: float) -> float | None:
    """A `Retry-After` header in seconds from `now`: delta seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - now)


async def _read_some(response: httpx.Response, chars: int) -> str:
    """The start of a (refusing) answer's text, for `last_error`; never the whole of it."""
    raw = b""
    async for chunk in response.aiter_bytes():
        raw += chunk
        if len(raw) >= chars * 4:
            break
    return raw.decode(errors="replace").strip()[:chars]

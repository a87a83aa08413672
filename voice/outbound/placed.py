"""What every provider's call placing shares: the call it placed (`PlacedCall`), the error
when it did not (`DialError`), and the create request itself (`post_create`, `placed`): one
POST, never retried (a second one would ring the number twice), whose failures never carry the
provider's credential."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

log = logging.getLogger(__name__)


class DialError(Exception):
    """A call the provider did not place. The message says why (the provider's status, code and
    message); it never holds a credential."""

    def __init__(
        self, message: str, *, provider: str, status: int | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.provider = provider
        self.status = status  # the provider's HTTP status; None: no answer
        self.code = code  # the provider's error code (Twilio's "21211")


@dataclass(frozen=True)
class PlacedCall:
    """A call the provider took: its id (Hotline's call id too) and status (queued)."""

    provider: str
    call_id: str
    status: str
    caller: str | None = None  # the caller id, when the request left it to the provider (SIP)
    trunk: str | None = None  # SIP: the trunk it goes through


def redact(text: str, secret: str) -> str:
    """`text` with the credential `secret` blanked out."""
    return text.replace(secret, "[redacted]") if secret else text


@dataclass(frozen=True)
class Provider:
    """A provider as its create request names it: `provider` in errors, `name` in messages."""

    provider: str  # "twilio"
    name: str  # "Twilio"


async def post_create(
    client: httpx.AsyncClient,
    who: Provider,
    what: str,
    url: str,
    secret: str,
    timeout_s: float,
    **request: Any,
) -> httpx.Response:
    """POST the create request (`request`: httpx's json/data/auth/headers); DialError when no
    answer came (a timeout may still have placed the call: said so)."""
    try:
        return await client.post(url, timeout=timeout_s, **request)
    except httpx.TimeoutException as exc:
        raise DialError(
            f"{what}: {who.name} did not answer within {timeout_s:g} s ({type(exc).__name__}); "
            "the call may or may not have been placed",
            provider=who.provider,
        ) from None
    except httpx.TransportError as exc:
        host = urlsplit(url).netloc
        message = f"{what}: cannot reach {who.name} at {host} ({type(exc).__name__}: {exc})"
        raise DialError(redact(message, secret), provider=who.provider) from None


def placed(
    who: Provider,
    what: str,
    response: httpx.Response,
    read: Callable[[Any], tuple[str, str]],
    missing: str,
) -> PlacedCall:
    """The call a successful answer describes: `read` takes its id and status from the JSON
    (KeyError, TypeError or ValueError when they are not there: DialError naming `missing`)."""
    try:
        call_id, status = read(response.json())
    except (ValueError, KeyError, TypeError):
        raise DialError(
            f"{what}: {who.name} answered HTTP {response.status_code} without {missing}",
            provider=who.provider,
            status=response.status_code,
        ) from None
    log.info("%s: placed, call %s %s", what, call_id, status)
    return PlacedCall(who.provider, call_id, status)

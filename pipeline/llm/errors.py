"""How a provider's failure reaches us: `LLMError`, and what it is read from (the status, the
error body's message and param, the ``Retry-After`` headers).

The router decides from it whether another tier may answer (`pipeline.llm.routing`), and the
controller how long to rest the tier, or which effort never to plan there again.
"""

from __future__ import annotations

import datetime
import email.utils
import math
import time
from collections.abc import Mapping

import openai

EFFORT_PARAMS = ("reasoning_effort", "reasoning.effort")


class LLMError(Exception):
    """The provider failed: HTTP status (None for connection errors and timeouts) and why.

    ``retry_after_s``: how long the provider asked us to wait (its ``Retry-After`` header, in
    seconds or as an HTTP date, or ``retry-after-ms``); ``param``: the request field its error
    body names.
    """

    def __init__(
        self,
        status: int | None,
        message: str,
        *,
        retry_after_s: float | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(f"HTTP {status}: {message}" if status is not None else message)
        self.status = status
        self.message = message
        self.retry_after_s = retry_after_s
        self.param = param

    @property
    def effort_unsupported(self) -> bool:
        """A 400 refusing the reasoning effort (the model does not take it), not the request."""
        if self.status != 400:
            return False
        text = self.message.lower()
        return (
            self.param in EFFORT_PARAMS
            or any(p in text for p in EFFORT_PARAMS)
            or "reasoning effort" in text
        )


def status_error(exc: openai.APIStatusError) -> LLMError:
    """The `LLMError` of an HTTP error answer: its status, message, param and Retry-After."""
    body = exc.body
    message = exc.message
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        message = str(body["message"])
    retry_after = retry_after_s(exc.response.headers)
    return LLMError(exc.status_code, message, retry_after_s=retry_after, param=exc.param)


def retry_after_s(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds the provider asks us to wait: ``retry-after-ms``, else ``Retry-After`` (seconds
    or an HTTP date; ``now`` is the wall-clock time it is measured from). None: no usable one."""
    if (ms := _seconds(headers.get("retry-after-ms"))) is not None:
        return ms / 1000.0
    value = headers.get("retry-after")
    if value is None:
        return None
    if (seconds := _seconds(value)) is not None:
        return seconds
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # an HTTP date is GMT
        when = when.replace(tzinfo=datetime.UTC)
    return max(when.timestamp() - (time.time() if now is None else now), 0.0)


def _seconds(value: str | None) -> float | None:
    try:
        seconds = float(value) if value is not None else math.nan
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None

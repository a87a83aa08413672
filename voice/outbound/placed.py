"""What every provider's call placing shares: the call it placed (`PlacedCall`) and the error
when it did not (`DialError`)."""

from __future__ import annotations

from dataclasses import dataclass


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

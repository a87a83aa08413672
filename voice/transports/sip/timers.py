"""Session timers (RFC 4028): when the caller asks for them (`Supported: timer` and
`Session-Expires`), the call must be refreshed (a re-INVITE or an UPDATE) within the interval,
or it is over: a caller's side that died without a BYE does not hold a line. Who refreshes
(RFC 4028 §9): the caller's choice when it names one; when it names none, the caller
(`refresher=uac`: it supports timers). With `refresher=uas` we refresh before half the interval
passes (§10): by UPDATE without a body when the caller's Allow lists UPDATE, else by re-INVITE
with our session description unchanged (§7.4; no Allow: RFC 3261 §20.5 says assume no UPDATE)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from voice.transports.sip.message import SipMessage, SipParseError, parse_params

MIN_SE_S = 90  # RFC 4028 §4: the smallest interval a UA may be asked for


class IntervalTooSmall(Exception):
    """The asked interval is under our minimum: answer 422 with `Min-SE`."""

    def __init__(self, minimum: int) -> None:
        super().__init__(f"session interval under {minimum} s")
        self.minimum = minimum


def _delta(value: str) -> tuple[int, dict[str, str | None]]:
    head, _, params = value.partition(";")
    if not head.strip().isdigit():
        raise SipParseError(f"bad Session-Expires {value!r}")
    return int(head.strip()), parse_params(";" + params) if params else {}


class SessionTimer:
    """The interval a call must be refreshed within, and when it last was."""

    def __init__(
        self,
        interval_s: int,
        clock: Callable[[], float] = time.monotonic,
        *,
        refresher: str = "uac",
        update: bool = False,
    ) -> None:
        """`refresher`: "uac" (the caller refreshes) or "uas" (we do); `update`: the caller
        allows UPDATE."""
        self.interval_s = interval_s
        self.refresher = refresher
        self.update = update
        self._clock = clock
        self.refreshed_at = clock()
        self._refreshed = asyncio.Event()

    @classmethod
    def asked(cls, request: SipMessage, minimum_s: int = MIN_SE_S) -> SessionTimer | None:
        """The timer an INVITE asks for (None: it asks for none, or cannot do timers).
        IntervalTooSmall when its interval is under `minimum_s`."""
        value = request.header("Session-Expires")
        supported = {v.strip().lower() for v in request.header_values("Supported")}
        required = {v.strip().lower() for v in request.header_values("Require")}
        if value is None or not ({"timer"} & (supported | required)):
            return None
        try:
            interval, params = _delta(value)
        except SipParseError:
            return None
        if interval < minimum_s:
            raise IntervalTooSmall(minimum_s)
        asked = (params.get("refresher") or "").strip().lower()
        allow = {m.strip().upper() for v in request.header_values("Allow") for m in v.split(",")}
        update = "UPDATE" in allow  # how we refresh, if we do: UPDATE, else re-INVITE
        return cls(interval, refresher="uas" if asked == "uas" else "uac", update=update)

    def headers(self) -> list[tuple[str, str]]:
        """What our 2xx says: the interval, who refreshes, and that timers are on."""
        return [
            ("Session-Expires", f"{self.interval_s};refresher={self.refresher}"),
            ("Require", "timer"),
        ]

    def refresh_headers(self) -> list[tuple[str, str]]:
        """What our refresh request says: we send it and go on refreshing, so the refresher is
        its UAC (RFC 4028 §7.4: `uas` would hand the refreshes to the caller)."""
        return [("Session-Expires", f"{self.interval_s};refresher=uac"), ("Supported", "timer")]

    @property
    def ours(self) -> bool:
        """We refresh (RFC 4028 §10): the caller asked `refresher=uas`."""
        return self.refresher == "uas"

    def refresh_due(self) -> float:
        """Seconds until our refresh is due: a third of the interval after the last one
        (RFC 4028 §10 recommends sending it by half the interval)."""
        return max(self.refreshed_at + self.interval_s / 3 - self._clock(), 0.0)

    def refresh(self) -> None:
        self.refreshed_at = self._clock()
        self._refreshed.set()

    async def expired(self) -> None:
        """Return once the interval passes with no refresh (runs until then)."""
        while True:
            left = self.refreshed_at + self.interval_s - self._clock()
            if left <= 0:
                return
            self._refreshed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._refreshed.wait(), left)

"""Calling hours: a campaign dials a number only inside its window (`09:00`-`20:00`), on the
callee's own clock (the row's IANA time zone, else the campaign's). Pure functions of an
instant (Unix seconds), so the runner and the tests give the time they mean.

A window whose end is before its start runs over midnight (`21:00`-`02:00`); start == end is
refused. An opening in the hour skipped when clocks go forward is read as `zoneinfo` reads it
(with the offset before the change: 02:30 becomes 03:30), so it is never in a closed hour."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

_HHMM = re.compile(r"([01][0-9]|2[0-3]):([0-5][0-9])")  # whole string
ZONE_CHARS = 64


class BadZone(ValueError):
    """Not an IANA time zone this machine knows."""


@functools.lru_cache(maxsize=1024)
def zone(name: str) -> ZoneInfo:
    """The IANA time zone `name` (cached); BadZone if there is none."""
    if not name or len(name) > ZONE_CHARS or name.startswith(("/", ".")) or ".." in name:
        raise BadZone(f"{name[:ZONE_CHARS]!r} is not an IANA time zone (e.g. Europe/Paris)")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise BadZone(f"{name!r} is not an IANA time zone (e.g. Europe/Paris)") from None


def clock_time(text: str) -> time:
    """`"09:00"` as a time of day; ValueError otherwise."""
    match = _HHMM.fullmatch(text)
    if match is None:
        raise ValueError(f"{text[:20]!r} is not a time of day as HH:MM (00:00-23:59)")
    return time(int(match.group(1)), int(match.group(2)))


@dataclass(frozen=True)
class Window:
    """The hours of the day a number may be called, local to the callee."""

    start: time
    end: time

    @classmethod
    def of(cls, start: str, end: str) -> Window:
        window = cls(clock_time(start), clock_time(end))
        if window.start == window.end:
            raise ValueError("the window's start and end are the same time")
        return window

    def is_open(self, local: time) -> bool:
        if self.start < self.end:
            return self.start <= local < self.end
        return local >= self.start or local < self.end  # over midnight

    def next_open(self, instant: float, tz: ZoneInfo) -> float:
        """`instant` if the window is open then in `tz`, else when it next opens (Unix s)."""
        local = datetime.fromtimestamp(instant, tz)
        if self.is_open(local.time().replace(tzinfo=None)):
            return instant
        for days in range(3):  # today's opening, else tomorrow's (DST never skips two)
            day = local.date() + timedelta(days=days)
            opening = datetime.combine(day, self.start, tzinfo=tz)
            at = opening.astimezone(UTC).timestamp()
            if at > instant:
                return at
        raise AssertionError("a window opens within two days")  # pragma: no cover

    def describe(self) -> dict[str, str]:
        return {"start": self.start.strftime("%H:%M"), "end": self.end.strftime("%H:%M")}

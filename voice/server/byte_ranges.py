"""HTTP Range requests (RFC 9110 §14): which bytes of a representation of a known size to send.

One range of bytes is served (206). A header that is not exactly one byte range (another unit,
several ranges, bad syntax, longer than MAX_HEADER characters) is ignored and the whole
representation sent (200), as RFC 9110 §14.2 allows; so is any range of an empty one. A range
that starts past the end is unsatisfiable (416). Parsing is linear in the (capped) header."""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_HEADER = 200
_UNIT = "bytes"
# int-range ("first-last", "first-") or suffix-range ("-length"), digits only (RFC 9110 §14.1.1)
_SPEC = re.compile(r"([0-9]+)-([0-9]*)|-([0-9]+)")


class Unsatisfiable(ValueError):
    """No byte of the representation is in the range asked for."""

    def __init__(self, size: int) -> None:
        super().__init__(f"no byte of {size} in the range asked for")
        self.size = size


@dataclass(frozen=True)
class ByteRange:
    """One byte-range-spec: bytes `first` to `last` inclusive (`last` None: to the end), or,
    with `first` None, the last `last` bytes (a suffix range)."""

    first: int | None
    last: int | None

    @property
    def header(self) -> str:
        """This range as a Range header's value (for asking another server for it)."""
        first = "" if self.first is None else str(self.first)
        last = "" if self.last is None else str(self.last)
        return f"{_UNIT}={first}-{last}"

    def span(self, size: int) -> tuple[int, int] | None:
        """The bytes [start, stop) of a `size`-byte representation to send; None: send all of
        it (it is empty). Unsatisfiable: none of its bytes is in the range."""
        if size <= 0:
            return None
        if self.first is None:
            if not self.last:  # "-0": the last no bytes
                raise Unsatisfiable(size)
            return max(size - self.last, 0), size
        if self.first >= size:
            raise Unsatisfiable(size)
        stop = size if self.last is None else min(self.last + 1, size)
        return self.first, stop


def parse(header: str | None) -> ByteRange | None:
    """The one byte range a Range header asks for; None: no header, or one to ignore."""
    if header is None or len(header) > MAX_HEADER:
        return None
    unit, equals, ranges = header.partition("=")
    if not equals or unit.strip().lower() != _UNIT:
        return None
    specs = [part.strip() for part in ranges.split(",")]
    specs = [spec for spec in specs if spec]  # empty list elements are allowed (RFC 9110 §5.6.1)
    if len(specs) != 1:
        return None  # none, or several: the whole representation instead
    found = _SPEC.fullmatch(specs[0])
    if found is None:
        return None
    first, last, suffix = found.groups()
    if suffix is not None:
        return ByteRange(None, int(suffix))
    byte_range = ByteRange(int(first), int(last) if last else None)
    if byte_range.last is not None and byte_range.last < int(first):
        return None  # "5-2" is invalid (RFC 9110 §14.1.1): ignored
    return byte_range


def content_range(span: tuple[int, int], size: int) -> str:
    """The Content-Range header of a 206 sending bytes [start, stop) of `size`."""
    start, stop = span
    return f"{_UNIT} {start}-{stop - 1}/{size}"

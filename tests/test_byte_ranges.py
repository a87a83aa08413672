"""Range headers (RFC 9110 §14): which bytes of a recording to send."""

from __future__ import annotations

import pytest

from voice.server.byte_ranges import (
    MAX_HEADER,
    ByteRange,
    Unsatisfiable,
    content_range,
    parse,
)


@pytest.mark.parametrize(
    ("header", "span"),
    [
        ("bytes=0-99", (0, 100)),
        ("bytes=100-", (100, 1000)),
        ("bytes=990-5000", (990, 1000)),  # past the end: to the end
        ("bytes=999-999", (999, 1000)),
        ("bytes=-10", (990, 1000)),  # the last 10
        ("bytes=-5000", (0, 1000)),  # a suffix longer than the file: all of it
        ("Bytes = 5-9", (5, 10)),  # the unit is case-insensitive
        ("bytes=0-", (0, 1000)),  # what a browser's <audio> asks first
        ("bytes= 5-9 ,", (5, 10)),  # empty list elements are allowed
        (f"bytes=0-{'9' * 150}", (0, 1000)),
    ],
)
def test_one_range_is_served(header: str, span: tuple[int, int]) -> None:
    byte_range = parse(header)
    assert byte_range is not None
    assert byte_range.span(1000) == span


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "bytes=",
        "bytes",
        "bytes=abc",
        "bytes=5-2",  # last before first: invalid, ignored
        "bytes=0-1,5-6",  # several ranges: the whole file instead
        "bytes=-",
        "bytes=--5",
        "bytes=+5-6",
        "bytes=1_0-20",
        "bytes=0x10-20",
        "bytes=5 - 9",
        "bytes=٣-٤",  # digits of another script are not digits here
        "items=0-5",
        "bytes=0-5=6",
        "bytes=0-" + "9" * MAX_HEADER,  # too long
    ],
)
def test_anything_else_is_ignored(header: str | None) -> None:
    assert parse(header) is None


@pytest.mark.parametrize("header", ["bytes=1000-", "bytes=1000-2000", "bytes=-0", "bytes=5000-"])
def test_a_range_past_the_end_is_unsatisfiable(header: str) -> None:
    byte_range = parse(header)
    assert byte_range is not None
    with pytest.raises(Unsatisfiable) as unsatisfiable:
        byte_range.span(1000)
    assert unsatisfiable.value.size == 1000


def test_an_empty_file_is_sent_whole() -> None:
    for header in ("bytes=0-", "bytes=-5", "bytes=3-4"):
        byte_range = parse(header)
        assert byte_range is not None and byte_range.span(0) is None


def test_a_long_header_is_ignored_unread() -> None:
    """A header of a megabyte of commas or digits is turned down by its length."""
    assert parse("bytes=" + "0-1," * 250_000) is None
    assert parse("bytes=" + "9" * 1_000_000 + "-") is None


def test_headers_out() -> None:
    assert ByteRange(100, 199).header == "bytes=100-199"
    assert ByteRange(100, None).header == "bytes=100-"
    assert ByteRange(None, 500).header == "bytes=-500"
    assert content_range((100, 200), 1000) == "bytes 100-199/1000"
    for header in ("bytes=100-199", "bytes=100-", "bytes=-500"):
        byte_range = parse(header)
        assert byte_range is not None and byte_range.header == header

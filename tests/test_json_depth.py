"""The JSON nesting check that runs on every JSON request body before the parser: one pass over
the bytes, whatever they hold. Its cost is counted (bytes examined), never timed.

The body that once took 13 s of the event loop: `{"text":"` and 32 700 escaped quotes, never
closed (a regex that skipped strings retried from every quote)."""

from __future__ import annotations

import json
import random

import pytest

from voice.server.api import MAX_JSON_DEPTH, json_depth, json_nesting


def escaped_quotes(size: int) -> bytes:
    """`{"text":"` then escaped quotes up to `size` bytes, the string never closed."""
    head = b'{"text":"'
    return head + b'\\"' * ((size - len(head)) // 2)


@pytest.mark.parametrize(
    "shape",
    [
        escaped_quotes,
        lambda size: b"[]" * (size // 2),  # nesting that comes and goes
        lambda size: b'"a",' * (size // 4),  # many short strings
        lambda size: b'{"a":"' + b"[{" * (size // 2),  # brackets inside an unclosed string
        lambda size: b'"' + b"\\\\" * (size // 2),  # escaped backslashes, never closed
    ],
    ids=["escaped-quotes", "brackets", "strings", "brackets-in-string", "backslashes"],
)
def test_the_check_looks_at_each_byte_once(shape: object) -> None:
    assert callable(shape)
    half, full = shape(32 * 1024), shape(64 * 1024)
    assert len(full) == pytest.approx(2 * len(half), abs=8)
    counted = [json_nesting(body).examined for body in (half, full)]
    assert counted == [len(half), len(full)]  # each byte once, none looked at again
    assert counted[1] / counted[0] == pytest.approx(2.0, rel=0.01)  # linear, not 4 (quadratic)


def test_the_pathological_body_is_shallow_and_examined_once() -> None:
    body = b'{"text":"' + b'\\"' * 32_700  # the probe's body: 65 409 bytes, under the limit
    assert json_nesting(body, stop_beyond=MAX_JSON_DEPTH) == json_nesting(body)
    assert json_nesting(body).depth == 1
    assert json_nesting(body).examined == len(body)


def test_deep_nesting_stops_at_the_first_byte_past_the_limit() -> None:
    body = b"[" * 60_000 + b"]" * 60_000
    found = json_nesting(body, stop_beyond=MAX_JSON_DEPTH)
    assert found.depth == MAX_JSON_DEPTH + 1
    assert found.examined == MAX_JSON_DEPTH + 1  # not one byte more
    objects = b'{"a":' * 10_000 + b"1" + b"}" * 10_000
    found = json_nesting(objects, stop_beyond=MAX_JSON_DEPTH)
    assert found.depth == MAX_JSON_DEPTH + 1 and found.examined == 5 * MAX_JSON_DEPTH + 1
    assert json_depth(body) == 60_000  # without a limit it counts all the way


@pytest.mark.parametrize(
    ("body", "depth"),
    [
        (b"", 0),
        (b"1", 0),
        (b"[]", 1),
        (b'{"a": [1, {"b": []}]}', 4),
        (b'["[[[[{{{{"]', 1),  # brackets in a string are not nesting
        (b'["\\"[[[["]', 1),  # an escaped quote does not end the string
        (b'["\\\\", [[]]]', 3),  # an escaped backslash does: the brackets after it count
        (b'["\\\\\\"[[", []]', 2),  # backslash, escaped quote, brackets: all in the string
        (b'{"text":"' + b"[" * 100, 1),  # unclosed string: nothing after it counts
        (b"[" * 100, 100),  # unclosed arrays
        (b"]]]][[", 0),  # malformed: the parser refuses it, the check only bounds depth
    ],
)
def test_depth(body: bytes, depth: int) -> None:
    assert json_depth(body) == depth


def nested(rng: random.Random, depth: int) -> object:
    """A random JSON value nesting exactly `depth` levels, with awkward strings."""
    strings = ['"', "\\", '\\"', "[{", "]}", "é", "\u2028", ""]
    if depth == 0:
        return rng.choice([1, 2.5, None, True, rng.choice(strings)])
    inner = [nested(rng, rng.randrange(depth)) for _ in range(rng.randrange(3))]
    inner.insert(rng.randrange(len(inner) + 1), nested(rng, depth - 1))
    if rng.random() < 0.5:
        return inner
    return {rng.choice(strings) + str(i): value for i, value in enumerate(inner)}


def test_depth_agrees_with_the_parser_on_valid_json() -> None:
    rng = random.Random(22)
    for _ in range(300):
        depth = rng.randrange(12)
        value = nested(rng, depth)
        for encoded in (json.dumps(value), json.dumps(value, ensure_ascii=False, indent=1)):
            assert json_depth(encoded.encode()) == depth, encoded

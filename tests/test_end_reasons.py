"""Why calls end, in fixed categories (`voice.server.end_reasons`): each reason the code gives
falls into its category, and none that the source can give falls into `other`."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from voice.server.end_reasons import CATEGORIES, end_category

ROOT = Path(__file__).resolve().parent.parent

# One or more reasons, as the transports and the switchboard say them, for every category.
EXAMPLES = {
    "caller_hung_up": [
        "caller hung up (BYE)",
        "stop: stream stopped",
        "caller track ended",
        "connection closed",
        "socket closed",
        "replay finished",
    ],
    "agent_ended": ["ended by the agent: the caller said goodbye", "ended by the agent"],
    "transferred": ["transferred to +15551230001", "transferred to sip:desk@example.com"],
    "api_hang_up": ["hung up through the API"],
    "timeout": ["no audio for 10 s", "session expired"],
    "setup_failed": ["never connected", "no ACK", "no usable answer"],
    "connection_lost": ["connection failed", "client stopped reading"],
    "shutdown": ["server shutdown"],
    "error": [None, "too many bad messages"],
    "other": ["a reason nobody wrote yet"],
}


def test_the_examples_cover_every_category() -> None:
    assert list(EXAMPLES) == list(CATEGORIES)


@pytest.mark.parametrize(
    ("reason", "category"),
    [(reason, category) for category, reasons in EXAMPLES.items() for reason in reasons],
)
def test_each_reason_has_its_category(reason: str | None, category: str) -> None:
    assert end_category(reason) == category


def reasons_in_source() -> dict[str, str]:
    """The static start of every reason a call is hung up with in voice/ and pipeline/
    (`….hang_up(…, reason)` and `HangUp(reason)`: a literal, an f-string up to its first
    placeholder, or a literal fallback), mapped to where it is."""
    found: dict[str, str] = {}
    for path in sorted([*(ROOT / "voice").rglob("*.py"), *(ROOT / "pipeline").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name not in ("hang_up", "HangUp"):
                continue
            for text in _static_texts(node.args[-1]):
                found[text] = f"{path.relative_to(ROOT)}:{node.lineno}"
    return found


def _static_texts(arg: ast.expr) -> list[str]:
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return [arg.value]
    if isinstance(arg, ast.JoinedStr):
        head = ""
        for part in arg.values:
            if not (isinstance(part, ast.Constant) and isinstance(part.value, str)):
                break
            head += part.value
        return [head]
    if isinstance(arg, ast.Call) and isinstance(arg.func, ast.Attribute):  # f"…".rstrip(…)
        return _static_texts(arg.func.value)
    if isinstance(arg, ast.BoolOp):  # a variable `or` a literal
        return [text for value in arg.values for text in _static_texts(value)]
    return []  # a variable passed on (its literal is found where it is made)


def test_every_reason_in_the_source_has_a_category() -> None:
    found = reasons_in_source()
    assert {"caller hung up (BYE)", "server shutdown", "transferred to "} <= set(found)
    unknown = {text: where for text, where in found.items() if end_category(text) == "other"}
    assert not unknown, (
        f"give these end reasons a category in voice/server/end_reasons.py: {unknown}"
    )

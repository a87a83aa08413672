"""What a phone caller heard of a reply, told by the marks it echoed (`hotline-N` at the end of
each piece of the reply, `hotline-N-part` every 200 ms inside one), against the history."""

from __future__ import annotations

from collections.abc import Sequence


def heard_mismatch(
    echoed: Sequence[str], spoken: Sequence[str], history: str, fillers: int = 0
) -> str | None:
    """None if `history` holds the pieces whose end marks were echoed, whole, and of the piece
    being heard (`-part` marks echoed after the last end) at most a share of its words ending in
    a dash, nothing after that; else what is wrong. A reply that said `fillers` hesitations into
    a dry line (pipeline/speaking.py: audio, but no piece of the text) has one end mark more for
    each: the check holds if it holds with up to that many of the end marks echoed not pieces."""
    ends = sum(not name.endswith("-part") for name in echoed)
    found = [_mismatch(echoed, spoken, history, ends - n) for n in range(min(fillers, ends) + 1)]
    return None if None in found else found[0]


def _mismatch(echoed: Sequence[str], spoken: Sequence[str], history: str, whole: int) -> str | None:
    context = f"echoed {list(echoed)} of the pieces {list(spoken)}; the history holds {history!r}"
    if whole >= len(spoken):
        return f"the reply was not cut: {context}"
    said = " ".join(spoken[:whole])
    if not history.startswith(said):
        return f"a piece heard whole is missing: {context}"
    rest = history[len(said) :].strip()
    if not rest:
        return None
    if not (echoed and echoed[-1].endswith("-part") and rest.endswith(" —")):
        return f"more than the echoed marks say was heard: {context}"
    words = rest.removesuffix(" —").split()
    if not words == spoken[whole].split()[: len(words)] != spoken[whole].split():
        return f"the part heard is not the start of the piece playing: {context}"
    return None


def assert_heard(
    echoed: Sequence[str], spoken: Sequence[str], history: str, fillers: int = 0
) -> None:
    mismatch = heard_mismatch(echoed, spoken, history, fillers)
    assert mismatch is None, mismatch

"""How a reply played at the caller (voice/devtools/playback.py): dry spells and talk-over."""

from __future__ import annotations

from voice.devtools.playback import Playback, playback
from voice.devtools.turns import CallerTurn

TICK = 0.02


def ticks(pattern: str, start: float = 0.0) -> tuple[list[tuple[float, bool]], list[bool]]:
    """One 20 ms tick per character from `start`: 'A' audible reply audio, 'a' fed but quiet
    (a pause inside the speech), '.' the buffer dry."""
    played = [(start + i * TICK, c == "A") for i, c in enumerate(pattern)]
    return played, [c != "." for c in pattern]


def test_a_dry_spell_over_100_ms_inside_a_reply_is_a_gap_and_its_end_is_not() -> None:
    # reply from tick 2: 4 dry ticks (80 ms: no gap), 7 dry ticks (140 ms: a gap), then
    # dry until the next utterance (the reply is over: no gap)
    pattern = ".." + "AAaA" + "...." + "AA" + "......." + "Aa" + "." * 30
    played, fed = ticks(pattern)
    turns = [
        CallerTurn(onset=-1.0, speech_end=-0.5, reply_start=2 * TICK),
        CallerTurn(onset=len(pattern) * TICK, speech_end=len(pattern) * TICK + 1),
    ]
    first, second = playback(turns, played, fed)
    assert first == Playback(gaps=1, longest_gap_ms=140.0, over_caller_ms=0.0)
    assert second is None  # no reply heard


def test_reply_audio_while_the_caller_speaks_again_is_counted() -> None:
    pattern = "AAAA" + "AAAAA" + "....."  # the caller's next words start at tick 4
    played, fed = ticks(pattern)
    turns = [
        CallerTurn(onset=-1.0, speech_end=-0.5, reply_start=0.0),
        CallerTurn(onset=4 * TICK, speech_end=6 * TICK, reply_start=None),
    ]
    [first, _] = playback(turns, played, fed)
    assert first is not None and first.over_caller_ms == 60.0  # ticks 4, 5, 6
    assert first.gaps == 0


def test_a_reply_cut_by_the_caller_after_going_quiet_had_a_gap_there() -> None:
    """The line went quiet mid-reply; the caller took it for the end and spoke: the server's
    record says the reply was cut, so the quiet before the caller's words was a gap."""
    pattern = "AAAA" + "." * 40  # 800 ms dry, then the caller speaks
    played, fed = ticks(pattern)
    turns = [
        CallerTurn(onset=-1.0, speech_end=-0.5, reply_start=0.0),
        CallerTurn(onset=len(pattern) * TICK, speech_end=len(pattern) * TICK + 1),
    ]
    [whole, _] = playback(turns, played, fed, cut=[False, False])
    [cut, _] = playback(turns, played, fed, cut=[True, False])
    assert whole is not None and whole.gaps == 0  # a reply that ended: its end is no gap
    assert cut == Playback(gaps=1, longest_gap_ms=800.0, over_caller_ms=0.0)

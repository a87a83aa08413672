"""How each reply played at the caller: gaps where it ran dry, and audio over the caller.

A phone plays what it is sent from a buffer, 20 ms a tick (`voice.devtools.phone_caller`); a
tick the buffer had nothing for is dry. A reply has a gap where it ran dry for more than
`GAP_MS` after it began and before its last audio (the stutter a caller hears when a sentence
is not synthesised in time), or, for a reply the caller cut short (the server's record says
so), before the caller spoke again: a caller who hears the line go quiet takes it for the end
of the reply. A reply is over the caller by the audible reply audio that played while the
caller said its next utterance.

Measured where the buffer is the caller's own (the emulated Twilio phone: the server sends
nothing while it has nothing to say). Over WebRTC and SIP the server fills its silences with
silent frames, so a dry spell cannot be told from a pause in the speech: not measured there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from voice.devtools.turns import FRAME_S, CallerTurn

GAP_MS = 100.0
_TICK_MS = FRAME_S * 1e3


@dataclass(frozen=True)
class Playback:
    """One reply as it played at the caller."""

    gaps: int  # dry spells longer than GAP_MS between its first and its last audio
    longest_gap_ms: float  # the longest dry spell there (0: none)
    over_caller_ms: float  # audible reply audio while the caller said its next utterance


def playback(
    turns: Sequence[CallerTurn],
    ticks: Sequence[tuple[float, bool]],
    fed: Sequence[bool],
    cut: Sequence[bool] = (),
) -> list[Playback | None]:
    """Per caller turn, how its reply played (None: no reply). `ticks`: (time, audible) of
    each 20 ms the phone played; `fed`: whether its buffer had audio for that tick; `cut`: per
    turn, whether its reply was cut short by the caller's next words."""
    played = list(zip(ticks, fed, strict=True))
    result: list[Playback | None] = []
    for index, turn in enumerate(turns):
        if turn.reply_start is None:
            result.append(None)
            continue
        following = turns[index + 1] if index + 1 < len(turns) else None
        until = following.onset if following is not None else math.inf
        window = [had for (at, _), had in played if turn.reply_start <= at < until]
        last = max((i for i, had in enumerate(window) if had), default=-1)
        if index < len(cut) and cut[index] and following is not None:
            last = len(window)  # it went quiet before the caller spoke: a gap, not its end
            window.append(True)
        spells, run = [], 0
        for had in window[: last + 1]:
            if had:
                spells.append(run * _TICK_MS)
                run = 0
            else:
                run += 1
        gaps = [ms for ms in spells if ms > GAP_MS]
        over = 0.0
        if following is not None:
            speaking = (following.onset, following.speech_end)
            over = _TICK_MS * sum(
                1
                for (at, audible), had in played
                if had and audible and speaking[0] <= at <= speaking[1]
            )
        result.append(Playback(len(gaps), max(gaps, default=0.0), over))
    return result

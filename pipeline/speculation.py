"""Speculative replies: answer at the caller's pause, speak only once the turn has ended.

When the caller pauses (`TurnPause`, 120 ms of silence) the words so far are transcribed at
once; with speculation on, the reply starts as soon as that transcript is ready: the LLM request
goes out and the first chunk is synthesised, but its audio waits behind a `Gate`. Words that
stop mid-sentence (`pipeline.endpoint.leaves_hanging`: a comma, "...", "and", "the"), and a
pause the turn model judged unfinished (`pipeline.turn_taking.end_of_turn`), send no request
until the turn has really ended there. If the turn then ends at that same pause (`TurnSegment`
with the same end position: end of turn decided so, `TurnDetector.hasten`, or the timeout
passed), the gate opens and the held audio goes out at once.
If the caller speaks again (`SpeechResumed`), or the turn ends somewhere else, the speculation
is thrown away: its task cancelled, nothing recorded, nothing in the history, nothing played;
only the count of discarded requests remains, since they cost the operator tokens.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pipeline.records import TurnClock
from pipeline.stt import Transcript


class Discarded(Exception):
    """The speculation this reply belonged to was thrown away."""


class Gate:
    """Holds a reply's audio until its turn is confirmed; opened once, or discarded.

    `bind(confirm)` names what the reply does once its turn is real (take the caller's words
    as a turn, show them): run at `open()`, or at once if the gate is already open.
    """

    def __init__(self) -> None:
        self._opened = asyncio.get_running_loop().create_future()
        self._confirm: Callable[[], None] | None = None

    @property
    def opened(self) -> bool:
        return self._opened.done() and not self._opened.cancelled()

    def bind(self, confirm: Callable[[], None]) -> None:
        if self.opened:
            confirm()
        else:
            self._confirm = confirm

    def open(self) -> None:
        if not self._opened.done():
            self._opened.set_result(None)
            confirm, self._confirm = self._confirm, None
            if confirm is not None:
                confirm()

    def discard(self) -> None:
        if not self._opened.done():
            self._opened.cancel()

    async def passed(self) -> None:
        """Return once the gate is open; `Discarded` if it never will be."""
        try:
            await asyncio.shield(self._opened)
        except asyncio.CancelledError:
            if self._opened.cancelled():
                raise Discarded from None
            raise


@dataclass
class Unanswered:
    """Caller speech not yet answered: its audio, its turn's clock, its transcription if any."""

    audio: npt.NDArray[np.int16]
    clock: TurnClock
    transcript: asyncio.Task[Transcript] | None


@dataclass
class Speculation:
    """A reply started at a pause, waiting to learn whether the turn ended there."""

    end_position: int  # where the caller's speech stopped, in samples since the call began
    words: Unanswered  # what it answers; its clock's zero is the end of speech at that pause
    gate: Gate
    task: asyncio.Task[None]  # the reply (STT -> LLM -> sentences -> TTS), held at the gate

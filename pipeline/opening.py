"""A call's opening: the recording notice (if any), then the greeting (if any); and how a fixed
text is spoken (`announce`, also the operator's messages).

Recording consent (issue 25, item 8). Recording starts on the `notice_played` event, sent only
once the notice was *heard in full*: played to its last sample. What barge-in does decides it
(`pipeline.turn_taking.interruptions`):

- speech judged a backchannel ("mm-hm") pauses the notice and resumes it from where the caller
  stopped hearing it: played on to its end, it was heard in full;
- speech judged an interruption (or a key, an operator's message, a hang-up, speech into its
  silence before its audio) cuts it short: `notice_cut` is sent and no recording starts.

The caller's words over a cut notice are their turn, but its answer is held until the notice has
been said again, in full: the caller spoke before being told the call is recorded, and the
conversation must not go on (nor be recorded) as if they had been told. A caller who asked
something hears the notice, then the answer, with no greeting in between (they are already
talking); the STT and the LLM work meanwhile. Each cut-short notice counts: after `attempts`
(a setting, default 2) it is not said again, recording stays off for the call, and the last
`notice_cut` says `final`; the call's record reads `state()`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from pipeline.llm.client import ChatMessage
from pipeline.records import TurnClock
from pipeline.replies import Spoken, heard_text
from pipeline.sentences import SentenceSettings, SentenceSplitter
from pipeline.transport import PlaybackCleared, Transport

log = logging.getLogger(__name__)

NOTICE_ATTEMPTS = 2  # how many times a notice cut short is said before recording stays off

Speak = Callable[[str, list[Spoken], TurnClock], Awaitable[list[asyncio.Task[None]]]]


async def announce(
    text: str,
    transport: Transport,
    speak: Speak,
    sentence_settings: SentenceSettings | None,
    history: list[ChatMessage],
) -> bool:
    """Speak a fixed text sentence by sentence (`speak` queues one); True once the caller has
    heard its last sample, False if playback was cleared first. `history` takes what was heard,
    also when this is cancelled."""
    spoken: list[Spoken] = []
    watchers: list[asyncio.Task[None]] = []
    clock = TurnClock(time.monotonic())
    splitter = SentenceSplitter(sentence_settings)
    try:
        for sentence in [*splitter.push(text), *splitter.flush()]:
            watchers.extend(await speak(sentence, spoken, clock))
        if spoken:
            await transport.wait_played(spoken[-1].end)
        return True
    except PlaybackCleared:
        return False
    finally:
        for watcher in watchers:
            watcher.cancel()
        heard = heard_text(spoken, transport.played_samples)
        if heard:
            history.append(ChatMessage(role="assistant", content=heard))


class Opening:
    """The notice and the greeting of one call (module docstring). `say(text)` speaks a fixed
    text, True if it was heard to its end; `emit` tells whoever watches the call."""

    def __init__(
        self,
        call_id: str,
        notice: str | None,
        greeting: str | None,
        say: Callable[[str], Awaitable[bool]],
        emit: Callable[[dict[str, object]], None],
        attempts: int = NOTICE_ATTEMPTS,
    ) -> None:
        self.call_id = call_id
        self.notice = notice or None
        self.greeting = greeting or None
        self.attempts = max(1, attempts)
        self._say = say
        self._emit = emit
        self.said = 0  # times the notice was begun
        self.cut_short = 0
        self.heard_in_full = False

    @property
    def due(self) -> bool:
        """Something to say when the call starts."""
        return self.notice is not None or self.greeting is not None

    @property
    def owed(self) -> bool:
        """The notice must still be said in full before the caller's next answer."""
        return self.notice is not None and not self.heard_in_full and self.said < self.attempts

    async def run(self) -> None:
        """The notice (again, if playback was cleared under it), then the greeting."""
        await self._owed_notice()
        if self.greeting is not None:
            await self._say(self.greeting)

    async def before(self, answer: Callable[[], Awaitable[None]]) -> None:
        """Answer a caller's turn (`answer`), once any notice owed has been heard in full
        (or has been cut short `attempts` times)."""
        await self._owed_notice()
        await answer()

    async def _owed_notice(self) -> None:
        while self.owed:
            assert self.notice is not None
            self.said += 1
            heard = False
            try:
                heard = await self._say(self.notice)
            finally:  # also when cancelled: the caller interrupted it, or hung up
                self._settle(heard)

    def _settle(self, heard: bool) -> None:
        if heard:
            self.heard_in_full = True
            log.info("call %s: recording notice heard in full (time %d)", self.call_id, self.said)
            self._emit({"type": "notice_played", "heard_in_full": True, "attempts": self.said})
            return
        self.cut_short += 1
        final = not self.owed
        log.warning(
            "call %s: recording notice cut short (time %d of %d)%s",
            self.call_id,
            self.said,
            self.attempts,
            ": recording stays off" if final else ": said again before the answer",
        )
        self._emit({"type": "notice_cut", "attempts": self.said, "final": final})

    def state(self) -> dict[str, object] | None:
        """For the call's record: whether the notice was heard in full, how many times it was
        begun and cut short (None: the call has no notice)."""
        if self.notice is None:
            return None
        return {
            "heard_in_full": self.heard_in_full,
            "attempts": self.said,
            "cut_short": self.cut_short,
        }

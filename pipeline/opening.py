"""A call's recording notice (issue 25, item 8), and how a fixed text is spoken (`announce`: the
notice and the greeting at the start of the call, an operator's messages).

Recording starts on the `notice_played` event, sent with `heard_in_full: true` once playback
passed the notice's last sample. An "mm-hm" over it pauses and resumes it
(`pipeline.turn_taking.interruptions`): played on to its end, it was heard in full. Cut short
(speech judged an interruption, a key, an operator's message, speech before it began), nothing
is sent yet: the caller's turn is answered as usual, but the reply begins with the notice, said
again in full through the reply's own `speak`, before the LLM's sentences. Its audio is
synthesised once per call (`NoticeVoice`), so saying it again costs no synthesis time. After
`attempts` tries cut short, `notice_played` says `heard_in_full: false` and why: the call is not
recorded. A try that only a speculative reply held, and that was thrown away, does not count:
the caller was never going to hear it. `Notice.state()` is what the call's record shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pipeline.llm.client import ChatMessage
from pipeline.records import TurnClock
from pipeline.replies import Spoken, heard_text
from pipeline.scheduling import Urgency
from pipeline.sentences import SentenceSettings, SentenceSplitter
from pipeline.services import SpeechSynthesizer
from pipeline.speculation import Gate
from pipeline.transport import PlaybackCleared, Transport

log = logging.getLogger(__name__)

NOTICE_ATTEMPTS = 2  # tries of a notice the caller cuts short, before recording stays off
# Who spoke a fixed text (`ChatMessage.source`): a supervisor, or the call itself (the greeting,
# the notice, the human message); the bot's own replies have no source.
OPERATOR, ANNOUNCEMENT = "operator", "announcement"

# queues one sentence of a reply (or of a fixed text), adding it to that reply's spoken list
SpeakSentence = Callable[[str, list[Spoken], TurnClock], Awaitable[list[asyncio.Task[None]]]]


@dataclass
class _Try:
    """One saying of the notice, inside the response whose sentences are `spoken`."""

    spoken: list[Spoken]
    gate: Gate | None  # a speculative reply's: the try counts once it opened
    end: int | None = None  # the outbound position of its last sample, once all is queued


class Notice:
    """The recording notice of one call (module docstring): `text` None, a call without one.
    `emit` tells whoever watches the call; `transport` says how far playback got."""

    def __init__(
        self,
        call_id: str,
        text: str | None,
        transport: Transport,
        emit: Callable[[dict[str, object]], None],
        attempts: int = NOTICE_ATTEMPTS,
        sentence_settings: SentenceSettings | None = None,
    ) -> None:
        self.call_id = call_id
        self.text = text or None
        splitter = SentenceSplitter(sentence_settings)
        self.sentences = tuple([*splitter.push(text), *splitter.flush()] if text else ())
        self.attempts = max(1, attempts)
        self.said = 0  # tries that reached the caller (or were cut before they could)
        self.cut_short = 0
        self.heard_in_full = False
        self.reason: str | None = None  # why it was given up
        self._transport = transport
        self._emit = emit
        self._try: _Try | None = None

    @property
    def owed(self) -> bool:
        """It must still be said, in full, before the caller's next answer."""
        return bool(self.sentences) and not self.heard_in_full and self.reason is None

    def voice(self, tts: SpeechSynthesizer) -> SpeechSynthesizer:
        """`tts`, remembering the notice's audio for the call."""
        return NoticeVoice(tts, self.sentences) if self.sentences else tts

    async def say(
        self, speak: Callable[[str], Awaitable[object]], spoken: list[Spoken], gate: Gate | None
    ) -> list[asyncio.Task[None]]:
        """Queue the notice, if owed, through a response's `speak` (which adds to `spoken`);
        returns the task that settles it once playback passes its end. The response calls
        `stopped(spoken)` when it ends, however it ends."""
        if not self.owed:
            return []
        if self._try is not None:  # a response that is being cancelled: a new one says it
            self.stopped(self._try.spoken)
        attempt = self._try = _Try(spoken, gate)
        first = len(spoken)
        for sentence in self.sentences:
            await speak(sentence)
        if len(spoken) == first:  # the voice made no audio of it: nothing to wait for
            return []
        attempt.end = spoken[-1].end
        return [asyncio.create_task(self._watch(attempt, attempt.end))]

    async def _watch(self, attempt: _Try, end: int) -> None:
        with contextlib.suppress(PlaybackCleared):  # cut short: `stopped` settles it
            await self._transport.wait_played(end)
            self._settle(attempt, heard=True)

    def stopped(self, spoken: list[Spoken]) -> None:
        """The response that spoke `spoken` is over (done, cut or cancelled): a try of the
        notice in it that is still open settles by how far playback got."""
        attempt = self._try
        if attempt is None or attempt.spoken is not spoken:
            return
        if attempt.gate is not None and not attempt.gate.opened:
            self._try = None  # a speculative reply thrown away: owed to the next reply
            return
        played = self._transport.played_samples
        self._settle(attempt, heard=attempt.end is not None and played >= attempt.end)

    def _settle(self, attempt: _Try, heard: bool) -> None:
        if self._try is not attempt:
            return
        self._try = None
        self.said += 1
        if heard:
            self.heard_in_full = True
            log.info("call %s: recording notice heard in full (try %d)", self.call_id, self.said)
            self._emit({"type": "notice_played", **self.outcome()})
            return
        self.cut_short += 1
        if self.said < self.attempts:
            log.info("call %s: recording notice cut short (try %d)", self.call_id, self.said)
            return
        self.reason = f"cut short {self.cut_short} time{'s' if self.cut_short > 1 else ''}"
        log.warning("call %s: recording notice %s: not recorded", self.call_id, self.reason)
        self._emit({"type": "notice_played", **self.outcome()})

    def outcome(self) -> dict[str, object]:
        """Heard in full or not, the tries and how many were cut short, why it was given up."""
        reason = self.reason
        if reason is None and not self.heard_in_full:
            reason = "cut short, not yet said again" if self.cut_short else "not yet heard"
        return {
            "heard_in_full": self.heard_in_full,
            "attempts": self.said,
            "cut_short": self.cut_short,
            "reason": reason,
        }

    def state(self) -> dict[str, object] | None:
        """For the call's record: `outcome()`; None for a call without a notice."""
        return self.outcome() if self.sentences else None


class NoticeVoice:
    """A speech synthesizer that keeps the audio of the notice's sentences for the call: the
    notice is fixed text, so saying it again adds no synthesis time."""

    def __init__(self, tts: SpeechSynthesizer, sentences: Sequence[str]) -> None:
        self._tts = tts
        self._sentences = frozenset(sentences)
        self._audio: dict[str, npt.NDArray[np.int16]] = {}

    @property
    def sample_rate(self) -> int:
        return self._tts.sample_rate

    async def synthesize(self, text: str, urgent: bool | Urgency = False) -> npt.NDArray[np.int16]:
        if text not in self._sentences:
            return await self._tts.synthesize(text, urgent)
        audio = self._audio.get(text)
        if audio is None:
            audio = self._audio[text] = await self._tts.synthesize(text, urgent)
        return audio


async def announce(
    text: str,
    transport: Transport,
    speak: SpeakSentence,
    sentence_settings: SentenceSettings | None,
    history: list[ChatMessage],
    notice: Notice | None = None,
    source: str = ANNOUNCEMENT,
    on_heard: Callable[[ChatMessage], None] | None = None,
) -> bool:
    """Speak a fixed text (after the notice, if it is given and owed), sentence by sentence;
    True once the caller has heard its last sample, False if playback was cleared first.
    `history` takes what was heard (from `source`), also when this is cancelled; `on_heard`
    is told of it."""
    spoken: list[Spoken] = []
    watchers: list[asyncio.Task[None]] = []
    clock = TurnClock(time.monotonic())
    splitter = SentenceSplitter(sentence_settings)

    async def say(sentence: str) -> None:
        watchers.extend(await speak(sentence, spoken, clock))

    try:
        if notice is not None:
            watchers.extend(await notice.say(say, spoken, None))
        for sentence in [*splitter.push(text), *splitter.flush()]:
            await say(sentence)
        if spoken:
            await transport.wait_played(spoken[-1].end)
        return True
    except PlaybackCleared:
        return False
    finally:
        for watcher in watchers:
            watcher.cancel()
        if notice is not None:
            notice.stopped(spoken)
        heard = heard_text(spoken, transport.played_samples)
        if heard:
            message = ChatMessage(role="assistant", content=heard, source=source)
            history.append(message)
            if on_heard is not None:
                on_heard(message)

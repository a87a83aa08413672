"""One call's barge-in: pause the reply when the caller speaks, then resume it or give way.

```
SpeechStarted while the reply plays -> transport.pause()          (quiet within the VAD's 96 ms)
TurnSegment of that speech           -> classify(duration, early transcript)  (barge_in.py)
    backchannel / cough / nothing    -> transport.resume(): the reply plays on, no turn
    interruption                     -> cancel the reply (history = what was heard), the
                                        words are the caller's next turn
backchannel_max_ms of speech, in audio  -> interruption, at once (`heard`)
```

The reply's task is not cancelled while paused: it waits on the played position, which a
pause holds where the caller stopped hearing, so what the history keeps (`heard_text` at the
played position) is the same whether the reply resumes or is cut. A segment whose transcript
is not in yet is decided by a task of its own, so the call's loop never waits on Whisper.

The length that makes speech an interruption is counted in the caller's audio as the turn
detector analyses it (`heard(speech_ms)`), not on the wall clock: on a starved host the audio
of an "mm-hm" may be read seconds after it was said, and is still a short acknowledgement
then. A wall-clock cap three times as long stays for a line whose audio stops coming.

Only while the reply is audible (queued audio the caller has not heard yet): speech into the
bot's silence (the LLM still thinking) interrupts at once, as before, and its words are
answered with the next turn's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from pipeline.scheduling import Urgency
from pipeline.services import SpeechRecognizer
from pipeline.stt import Transcript
from pipeline.transport import Transport
from pipeline.turn_taking.barge_in import BargeInSettings, Verdict, classify
from pipeline.turns import SpeechStarted, TurnSegment

log = logging.getLogger(__name__)

# The segment of speech that ended comes end_silence_ms later, plus the VAD's window and frame
# rounding (20-28 ms, pipeline.turns) and the loop's own lag: the wall-clock cap waits this
# much more, times _DEAD_LINE (it is only for audio that stops coming).
_SEGMENT_LATE_MS = 100
_DEAD_LINE = 3

EarlyTranscript = tuple[asyncio.Task[Transcript], Urgency]  # a pause's, and its rank


@dataclass
class _Held:
    """A reply paused for the caller's speech, until that speech is judged."""

    response: asyncio.Task[None]
    onset_at: float  # the first speech's onset (monotonic)
    speaking: bool = True  # a SpeechStarted not yet followed by its TurnSegment
    cap: asyncio.TimerHandle | None = None
    deciding: set[asyncio.Task[None]] = field(default_factory=set)  # waiting on a transcript


class Interruptions:
    """Barge-in for one call (see the module docstring). `end_silence_ms`: the turn
    detector's; `early(position)`: the early transcript of the caller's pause that ended at
    `position`, if there is one (and its rank in the STT queue); `interrupt(onset)` stops the
    reply for good; `interrupt(onset, response)` stops that reply for good (and no later
    one); `take_turn(segment)` answers the caller's words."""

    def __init__(
        self,
        call_id: str,
        transport: Transport,
        settings: BargeInSettings,
        end_silence_ms: int,
        stt: SpeechRecognizer,
        *,
        early: Callable[[int], EarlyTranscript | None],
        interrupt: Callable[[float, asyncio.Task[None]], Coroutine[Any, Any, None]],
        take_turn: Callable[[TurnSegment], None],
    ) -> None:
        self.call_id = call_id
        self.transport = transport
        self.settings = settings
        self._end_silence_ms = end_silence_ms
        self._stt = stt
        self._early = early
        self._interrupt = interrupt
        self._take_turn = take_turn
        self._held: _Held | None = None
        self.resumed: list[float] = []  # onsets of speech the reply was resumed after
        self._safety: set[asyncio.Task[None]] = set()

    @property
    def paused(self) -> bool:
        return self._held is not None

    async def pause(self, started: SpeechStarted, response: asyncio.Task[None] | None) -> bool:
        """The caller began speaking while `response` runs: True if the reply is now paused
        until this speech is judged (or already was); False if it must be interrupted now."""
        if not self.settings.resume or response is None or response.done():
            return False
        held = self._held
        if held is not None and held.response is response:
            held.speaking = True  # more speech while paused: judged at its own end
            self._arm_cap(held, started.at)
            return True
        if self.transport.queued_samples <= self.transport.played_samples:
            return False  # nothing audible: the caller speaks into the bot's silence
        await self.transport.pause()
        held = _Held(response, started.at)
        self._held = held
        response.add_done_callback(self._response_ended)
        self._arm_cap(held, started.at)
        log.info("call %s: reply paused for the caller's speech", self.call_id)
        return True

    def heard(self, speech_ms: float) -> None:
        """The caller's current speech has lasted `speech_ms` of audio so far (the turn
        detector's count, after each piece of audio): at `backchannel_max_ms` it is no
        acknowledgement, and the paused reply gives way to it at once."""
        held = self._held
        if held is not None and held.speaking and speech_ms >= self.settings.backchannel_max_ms:
            self._too_long(held)

    def absorb(self, segment: TurnSegment) -> bool:
        """The caller's speech ended: True if this speech paused the reply and is being judged
        (a backchannel resumes it; an interruption cuts it and answers `segment` as a turn);
        False if it is a turn to answer as any other (no reply was paused for it)."""
        held = self._held
        if held is None or not held.speaking:
            return False
        held.speaking = False
        if held.cap is not None:
            held.cap.cancel()
        held.deciding.add(asyncio.create_task(self._decide(held, segment)))
        return True

    def turn_ended(self, segment: TurnSegment) -> None:
        """A caller turn is over (the turn detector's, or one the end-of-turn judge ended
        sooner): judged here if its speech paused the reply, else answered at once."""
        if not self.absorb(segment):
            self._take_turn(segment)

    def forget(self, response: asyncio.Task[None] | None = None) -> None:
        """The reply (`response`, if given: only that one) is being stopped for good (an
        interruption, a key, an announcement)."""
        held = self._held
        if held is None or (response is not None and held.response is not response):
            return
        self._held = None
        if held.cap is not None:
            held.cap.cancel()
        for deciding in held.deciding:
            if deciding is not asyncio.current_task():
                deciding.cancel()

    async def _decide(self, held: _Held, segment: TurnSegment) -> None:
        """Judge a segment from its duration and transcript (the pause's early one if there is
        one, else a new one), then resume the reply or give way to the caller."""
        duration_ms = (segment.speech_ended_at - segment.speech_started_at) * 1e3
        try:
            text = await self._words(segment, duration_ms)
        finally:
            me = asyncio.current_task()
            if me is not None:
                held.deciding.discard(me)
        if self._held is not held or held.response.done():
            return  # settled meanwhile (a key, a hang-up)
        if text is None and held.speaking:
            return  # its transcription was dropped for newer speech: that one decides
        # Not transcribed (the recognizer failed): stop the reply, as before this module.
        verdict = Verdict.INTERRUPTION
        if text is not None:
            verdict = classify(self.settings, duration_ms, text)
        self._log(duration_ms, text, verdict)
        if verdict is Verdict.BACKCHANNEL:
            await self._resume(held)
            return
        await self._interrupt(held.onset_at, held.response)
        self._take_turn(segment)

    async def _words(self, segment: TurnSegment, duration_ms: float) -> str | None:
        """The segment's transcript, unless its duration alone decides ("" then)."""
        if classify(self.settings, duration_ms, None) is not Verdict.UNDECIDED:
            return ""
        early = self._early(segment.end_position)
        if early is not None:
            transcribing, urgency = early
            urgency.promote()  # the caller and the paused reply both wait on it now
        else:
            transcribing = asyncio.ensure_future(self._stt.transcribe(segment.audio))
        try:
            await asyncio.wait({transcribing})  # never cancels it: the turn may want it
        except asyncio.CancelledError:
            if early is None:
                transcribing.cancel()
            raise
        return _text(transcribing)

    def _log(self, duration_ms: float, text: str | None, verdict: Verdict) -> None:
        log.info(
            "call %s: %.0f ms of speech during the reply (%r): %s",
            self.call_id,
            duration_ms,
            text,
            verdict.value,
        )

    async def _resume(self, held: _Held) -> None:
        """Play on, unless the caller is speaking again (judged at its end) or a decision on
        earlier speech is still under way."""
        if self._held is not held or held.speaking or held.deciding:
            return
        self._held = None
        self.resumed.append(held.onset_at)
        await self.transport.resume()
        log.info("call %s: reply resumed", self.call_id)

    def _arm_cap(self, held: _Held, onset_at: float) -> None:
        """The cap for a line whose audio stops coming (`heard` decides while it comes): speech
        not judged `_DEAD_LINE` times as long after its onset as a backchannel of
        `backchannel_max_ms` and its trailing silence take is an interruption."""
        if held.cap is not None:
            held.cap.cancel()
        limit_ms = self.settings.backchannel_max_ms + self._end_silence_ms + _SEGMENT_LATE_MS
        limit_s = _DEAD_LINE * limit_ms / 1e3
        delay = max(0.0, onset_at + limit_s - time.monotonic())
        held.cap = asyncio.get_running_loop().call_later(delay, self._too_long, held)

    def _too_long(self, held: _Held) -> None:
        if self._held is held and held.speaking and not held.response.done():
            log.info("call %s: the caller speaks on: an interruption", self.call_id)
            # Settled now, not when the task runs: on a starved host the speech's end may be
            # read before it does, and is then a turn to answer, not a judgement to drop.
            self.forget()
            task = asyncio.create_task(self._interrupt(held.onset_at, held.response))
            self._safety.add(task)
            task.add_done_callback(self._safety.discard)

    def _response_ended(self, response: asyncio.Task[None]) -> None:
        """The paused reply ended without this module's say (a hang-up, or a turn started
        elsewhere): the line must not stay paused, holding its audio."""
        held = self._held
        if held is None or held.response is not response:
            return
        self.forget()
        log.info("call %s: a paused reply was ended elsewhere; line cleared", self.call_id)
        task = asyncio.create_task(self.transport.clear())
        self._safety.add(task)
        task.add_done_callback(self._safety.discard)


def _text(task: asyncio.Task[Transcript]) -> str | None:
    """The transcript's text if it is in (None: not yet, cancelled or failed)."""
    if not task.done() or task.cancelled():
        return None
    with contextlib.suppress(Exception):
        return task.result().text
    return None

"""End of turn in a live call: at each pause, is the caller done?

The turn detector (`pipeline.turns`) offers a `TurnPause` after `pause_ms` (120 ms) of silence.
`EndOfTurn.pause` then scores the turn so far with the turn model (Smart Turn v3.2,
`pipeline.turn_taking.model`, on its own thread pool, never on the event loop) while the
early transcript of the same audio is being made. As each of the two arrives it asks the
policy (`pipeline.turn_taking.policy.end_delay_ms`, with what has arrived so far) how long a
silence ends the turn there: `policy.min_delay_ms` when the model is confident, the timeout
(`policy.timeout_ms`) when it is not, or when the words veto it. Until the first answer (and
always without a model) the detector's own `TurnSettings.end_silence_ms` stands. Each answer goes to
the detector (`TurnDetector.hasten`) in place of the one before; the turn ends the moment the
silence reaches the answer standing then (at once if it already has), exactly as `hotline
turn-bench` replays the same function on recorded pauses. Speech resuming forgets it. The
segment goes to `on_end` (the conversation's `_start_response`, which releases the reply
held at that pause's gate); its `judgement` (score, delay) goes into the turn record.

A transcript that fails counts as not in; a model that fails, or is off (`policy.model`, or
no model given), scores None, and the policy decides from the words alone.

`TurnSettings.finished_silence_ms` (the text rule from before the model; 0, off, by default)
still works: a transcript that `sounds_finished` ends the turn after that silence, whatever the
model says. `policy.finished_words` is the same rule inside the policy (used without a model).

A speculative reply begun at a pause the model judged not over (score below the threshold)
sends no LLM request until its gate opens (`PauseJudgement.unless_going_on`), as a reply to
words left hanging already does: the caller is likely to go on, and a reply thrown away
still costs its tokens and its reasoning. Holding it, rather than asking at the lowest effort,
keeps a turn that does end there (at the timeout) from being answered at an effort chosen for
a reply nobody was expected to hear: the request goes out then and the controller plans it
for the time already spent, so it steps down by itself only as far as the budget needs.

Measured (tests/test_end_of_turn.py; piper's voice with its noise off, real VAD, real Smart
Turn, 2 shared cores): "My number is 5 5 5" scored 0.08 (not over), "1 2 3 4." 0.97, "I would
like to book a table for two." 0.98; one inference 46-66 ms, features included. Also found:
"To leave a message," 0.97 (over, though it plainly goes on; Whisper wrote "to leave a
message", no comma, so the words do not veto it either), and renderings of "My number is
5 5 5" with piper's noise on scored 0.03 to 0.8.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from pipeline.endpoint import sounds_finished
from pipeline.records import TurnClock
from pipeline.speculation import Discarded, Gate
from pipeline.stt import Transcript
from pipeline.turn_taking.model import TurnScore
from pipeline.turn_taking.policy import end_delay_ms
from pipeline.turns import EndJudgement, TurnDetector, TurnSegment, TurnSettings

log = logging.getLogger(__name__)


class TurnJudge(Protocol):
    """What end of turn needs of the turn model (`pipeline.turn_taking.model.TurnModel`)."""

    async def judge(self, audio: npt.NDArray[np.int16], urgent: bool = True) -> TurnScore: ...


def chosen_delay_ms(
    settings: TurnSettings, modelled: bool, score: float | None, transcript: str | None
) -> int:
    """The silence (ms) that ends the turn at a pause: the policy's choice
    (`end_delay_ms`), or `finished_silence_ms` if that is on, shorter, and the transcript
    sounds finished. The timeout is `policy.timeout_ms` where a turn model judges the pauses
    (`modelled`), else `end_silence_ms`: without a model, nothing waits longer than before."""
    timeout = settings.policy.timeout_ms if modelled else settings.end_silence_ms
    delay = end_delay_ms(settings.policy, timeout, score, transcript)
    finished = settings.finished_silence_ms
    if finished and transcript is not None and sounds_finished(transcript):
        delay = min(delay, finished)
    return delay


@dataclass
class PauseJudgement:
    """One pause being judged: the model's score (None: not scored) and the decision."""

    end_position: int  # where the caller's speech stopped, in samples since the call began
    scoring: asyncio.Task[TurnScore | None]
    deciding: asyncio.Task[EndJudgement | None]
    threshold: float
    answers: list[EndJudgement]  # the policy's, as the score and the transcript came in

    async def likely_over(self) -> bool:
        """Whether the model did not judge this pause unfinished (True when not scored)."""
        await asyncio.wait([self.scoring])
        score = None if self.scoring.cancelled() else self.scoring.result()
        return score is None or score.complete >= self.threshold

    async def unless_going_on(
        self,
        gate: Gate,
        reply: Callable[[], Awaitable[None]],
        clock: TurnClock,
        transcript: asyncio.Task[Transcript],
    ) -> None:
        """Run the speculative `reply` now if the turn may be over here; if the model judged
        it unfinished, only once `gate` opens (nothing at all if it is discarded). Its
        `clock` marks the `transcript` ready when it is, held or not."""
        transcript.add_done_callback(functools.partial(_mark_transcribed, clock))
        if not await self.likely_over():
            try:
                await gate.passed()
            except Discarded:
                return
        await reply()

    def cancel(self) -> None:
        self.scoring.cancel()
        self.deciding.cancel()


def _mark_transcribed(clock: TurnClock, transcript: asyncio.Task[Transcript]) -> None:
    if not transcript.cancelled() and transcript.exception() is None:
        clock.mark("stt")


class EndOfTurn:
    """One call's end-of-turn decisions beside its `TurnDetector` (module docstring)."""

    def __init__(
        self,
        detector: TurnDetector,
        model: TurnJudge | None,
        on_end: Callable[[TurnSegment], None],
    ) -> None:
        """`model`: None for no turn model (the policy decides from the words alone)."""
        self.detector = detector
        self.model = model
        self._on_end = on_end
        self._current: PauseJudgement | None = None

    @property
    def settings(self) -> TurnSettings:
        return self.detector.settings

    @property
    def modelled(self) -> bool:
        """Whether a turn model judges the pauses."""
        return self.model is not None and self.settings.policy.model

    @property
    def longest_silence_ms(self) -> int:
        """The longest silence after which a turn can end here."""
        if not self.modelled:
            return self.settings.end_silence_ms
        return max(self.settings.end_silence_ms, self.settings.policy.timeout_ms)

    def pause(
        self,
        end_position: int,
        audio: npt.NDArray[np.int16],
        transcript: asyncio.Task[Transcript] | None,
    ) -> PauseJudgement:
        """Judge the pause at `end_position`: `audio` is the turn so far, `transcript` its
        early transcription (None: skipped). An earlier pause still being judged is
        dropped."""
        self.close()
        answers: list[EndJudgement] = []
        scoring = asyncio.create_task(self._score(audio))
        deciding = asyncio.create_task(self._decide(end_position, scoring, transcript, answers))
        threshold = self.settings.policy.threshold
        judgement = PauseJudgement(end_position, scoring, deciding, threshold, answers)
        self._current = judgement
        return judgement

    def close(self) -> None:
        """Stop judging (the pause judged now, if any): the call is over or moved on."""
        if self._current is not None:
            self._current.cancel()
            self._current = None

    async def _score(self, audio: npt.NDArray[np.int16]) -> TurnScore | None:
        if self.model is None or not self.settings.policy.model:
            return None
        try:
            return await self.model.judge(audio, urgent=True)
        except Exception:  # a model that fails decides nothing: the words still may
            log.warning("the turn model failed on a pause", exc_info=True)
            return None

    async def _decide(
        self,
        end_position: int,
        scoring: asyncio.Task[TurnScore | None],
        transcript: asyncio.Task[Transcript] | None,
        answers: list[EndJudgement],
    ) -> EndJudgement | None:
        """Ask the policy as each of the score and the transcript arrives, and tell the
        detector each answer; the last answer given before the silence reaches it ends the
        turn (as `hotline turn-bench` replays it)."""
        score: TurnScore | None = None
        text: str | None = None
        judgement: EndJudgement | None = None
        waiting: set[asyncio.Task[TurnScore | None] | asyncio.Task[Transcript]]
        waiting = {scoring} if transcript is None else {scoring, transcript}
        while waiting:  # never cancels the transcription
            done, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if scoring in done and not scoring.cancelled():
                score = scoring.result()
            if transcript in done and not transcript.cancelled() and not transcript.exception():
                text = transcript.result().text
            probability = score.complete if score is not None else None
            delay = chosen_delay_ms(self.settings, self.modelled, probability, text)
            judgement = EndJudgement(probability, delay)
            answers.append(judgement)
            log.debug(
                "pause at %d: score %s, %r: ends after %d ms", end_position, score, text, delay
            )
            segment = self.detector.hasten(end_position, delay, judgement)
            if segment is not None:
                self._on_end(segment)
                break
        return judgement

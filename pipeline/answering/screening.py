"""A placed call's opening under answering-machine detection (`Screening`): nothing is said
until the detector has decided who answered, and the call's turns do not hear the callee
meanwhile.

- *human* (or *unknown*): the greeting at once. The callee's "Hello?" is never a turn: the
  audio reaches the turn detector only from the verdict on, after the 700 ms of silence that
  decided it, so the LLM does not answer "Hello?" on its own (the greeting is the answer) and
  the turn detector starts on a quiet line, ready for a barge-in over the greeting.
- *machine*: the message once the beep has ended (`BeepEnded`); with no beep, once the
  greeting has been silent `quiet_ms`; at the latest `message_within_ms` after the verdict.
  Then hang up. The turns never hear a machine: no LLM turn, and its greeting is no barge-in.
- *a beep after human*: a machine whose greeting was short and paused ("Hello." ... beep) is
  taken for a person until its beep, which the detector listens for up to its `max_ms` after the
  answer. Then it is a machine after all (`overturned`): the conversation stops what it says
  and leaves the message as above.

Early transcripts of the opening come from the call's own recognizer, not urgent (behind the
turns of calls in progress), one at a time: an offer made while one runs waits, and only the
latest waits.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, Field

from pipeline.answering.detector import (
    HYSTERESIS,
    AnsweringEvent,
    AnsweringMachineDetector,
    AnsweringSettings,
    BeepEnded,
    OpeningSoFar,
    Verdict,
)
from pipeline.services import SpeechRecognizer
from pipeline.transport import SAMPLE_RATE
from pipeline.vad import WINDOW, SpeechProbability

log = logging.getLogger(__name__)

MESSAGE_LEFT = "voicemail: message left"
HUNG_UP = "voicemail: hung up"


class ScreeningSettings(BaseModel):
    """How a placed call with machine detection opens (`HOTLINE_OUTBOUND__ANSWERING__*`)."""

    detector: AnsweringSettings = Field(default_factory=AnsweringSettings)
    quiet_ms: int = Field(
        default=1500,
        gt=0,
        description="With no beep, a machine's greeting has ended once silent this long.",
    )
    message_within_ms: int = Field(
        default=30000,
        gt=0,
        description="Longest wait for the beep (or the quiet) after a machine verdict.",
    )


@dataclass(frozen=True)
class OnMachine:
    """What a placed call does when a machine answers: leave `message` after the beep (None:
    hang up without one)."""

    message: str | None


class _Quiet:
    """How long the callee's audio has been silent (Silero, as the detector hears speech)."""

    def __init__(self, settings: AnsweringSettings) -> None:
        self._settings = settings
        self._speech = SpeechProbability(settings.quiet_floor, settings.threshold - HYSTERESIS)
        self._pending = np.zeros(0, dtype=np.float32)
        self.silent = 0  # samples of silence up to now

    def push(self, pcm: np.ndarray) -> None:
        samples = np.asarray(pcm, dtype=np.int16).reshape(-1).astype(np.float32) / 32768.0
        self._pending = np.concatenate([self._pending, samples])
        while len(self._pending) >= WINDOW:
            window, self._pending = self._pending[:WINDOW], self._pending[WINDOW:]
            quiet = self._speech(window) < self._settings.threshold - HYSTERESIS
            self.silent = self.silent + WINDOW if quiet else 0


class Screening:
    """One placed call's opening: feed it the callee's audio (`push`), and let it open the
    call (`open`). Not thread-safe; one per call, on the call's event loop."""

    def __init__(
        self,
        on_machine: OnMachine,
        stt: SpeechRecognizer,
        settings: ScreeningSettings | None = None,
        detector: AnsweringMachineDetector | None = None,
        on_answered: Callable[[dict[str, object]], None] | None = None,
        call_id: str = "",
    ) -> None:
        """`on_answered`: told who answered once it is known (`answered_by`)."""
        self._on_answered = on_answered
        self.call_id = call_id
        self.on_machine = on_machine
        self.settings = s = settings or ScreeningSettings()
        self.detector = detector or AnsweringMachineDetector(s.detector)
        self._stt = stt
        self.verdict: Verdict | None = None
        self.beep: BeepEnded | None = None
        self._decided = asyncio.Event()
        self._message_due = asyncio.Event()
        self._quiet: _Quiet | None = None  # from a machine verdict on
        self._machine_at = 0  # samples fed at the machine verdict
        self._hearing: asyncio.Task[None] | None = None
        self._next: OpeningSoFar | None = None
        self._emit: Callable[[dict[str, object]], None] = lambda event: None
        self._overturned = False  # a beep after a human verdict, not yet acted on

    @property
    def screening(self) -> bool:
        """The callee's audio is the screening's alone (not the turns'): until a person (or
        nobody) was heard; for a machine, to the end of the call."""
        return self.verdict is None or self.verdict.answer == "machine"

    def push(self, pcm: np.ndarray) -> bool:
        """The callee's audio (16 kHz int16, any length); True if it is the screening's alone
        (`screening`), False if the turns should hear it."""
        if not self.screening:
            if self.detector.now_ms >= self.settings.detector.max_ms:
                return False  # no beep came: a person
            for event in self.detector.push(pcm):  # listening for a beep only
                self._on(event)
            return self.screening
        for event in self.detector.push(pcm):
            self._on(event)
        if self._quiet is not None and not self._message_due.is_set():
            self._quiet.push(pcm)
            waited = self.detector.position - self._machine_at
            quiet = self.detector.beep is None and self._quiet.silent >= _samples(
                self.settings.quiet_ms
            )
            if quiet or waited >= _samples(self.settings.message_within_ms):
                self._message_due.set()
        return True

    def _on(self, event: AnsweringEvent) -> None:
        if isinstance(event, Verdict):
            self._decide(event)
        elif isinstance(event, BeepEnded):
            self.beep = event
            self._message_due.set()
        elif isinstance(event, OpeningSoFar):
            self._listen(event)

    def _decide(self, verdict: Verdict) -> None:
        self._overturned = verdict.revised
        self.verdict = verdict
        log.info("call %s: answered by %s (%s at %.0f ms: %s)", self.call_id, *_said(verdict))
        if verdict.answer == "machine":
            self._quiet = _Quiet(self.settings.detector)
            self._machine_at = self.detector.position
            if self.beep is not None:
                self._message_due.set()
        self._decided.set()
        answered = self.answered_by()
        assert answered is not None
        if self._on_answered is not None:
            self._on_answered(answered)
        self._emit({"type": "answered_by", "answered_by": answered})

    def _listen(self, offer: OpeningSoFar) -> None:
        """Transcribe the opening so far (after the one under way, if any)."""
        if self._hearing is not None and not self._hearing.done():
            self._next = offer
            return
        self._hearing = asyncio.create_task(self._hear(offer))

    async def _hear(self, offer: OpeningSoFar) -> None:
        try:
            transcript = await self._stt.transcribe(offer.audio, urgent=False)
        except Exception:
            log.warning("call %s: no early transcript of the opening", self.call_id, exc_info=True)
        else:
            verdict = self.detector.hear(transcript.text)
            if verdict is not None:
                self._decide(verdict)
        following, self._next = self._next, None
        if following is not None and self.verdict is None:
            self._hearing = asyncio.create_task(self._hear(following))

    async def open(
        self,
        greet: Callable[[], Awaitable[None]],
        say: Callable[[str], Awaitable[bool]],
        hang_up: Callable[[str], None],
        emit: Callable[[dict[str, object]], None],
    ) -> None:
        """Open the call once who answered is known: `greet` a person (or nobody); `say` the
        message to a machine after its beep, then `hang_up`. `emit` tells watchers the
        verdict."""
        self._emit = emit
        await self._decided.wait()
        if self.verdict is None or self.verdict.answer != "machine":
            await greet()
        else:
            await self.leave(say, hang_up)

    def overturned(self) -> bool:
        """Whether a beep has just made a machine of a callee taken for a person (once: the
        conversation stops talking and `leave`s the message)."""
        overturned, self._overturned = self._overturned, False
        return overturned

    async def leave(
        self, say: Callable[[str], Awaitable[bool]], hang_up: Callable[[str], None]
    ) -> None:
        """A machine answered: once its beep has ended (or its greeting), `say` the message
        (if any), then `hang_up`."""
        await self._message_due.wait()
        message = self.on_machine.message
        if message:
            await say(message)
        hang_up(MESSAGE_LEFT if message else HUNG_UP)

    def close(self) -> None:
        """The call ended: stop transcribing; undecided, it was `unknown`."""
        self._next = None
        if self._hearing is not None:
            self._hearing.cancel()
        if self.verdict is None:
            self._decide(Verdict("unknown", "timeout", self.detector.now_ms, "the call ended"))

    def answered_by(self) -> dict[str, object] | None:
        """Who answered, as the call record has it (None: not decided yet): the result, the
        rule that decided it (`basis`), when (`ms` since the answer), when the beep ended
        (`beep_ms`; None: no beep heard), and whether a beep overturned a `human`."""
        if self.verdict is None:
            return None
        return {
            "result": self.verdict.answer,
            "basis": self.verdict.by,
            "ms": round(self.verdict.at_ms),
            "beep_ms": round(self.beep.end_ms) if self.beep is not None else None,
            "revised": self.verdict.revised,  # a beep made a machine of a "human"
        }


def _samples(ms: int) -> int:
    return ms * SAMPLE_RATE // 1000


def _said(verdict: Verdict) -> tuple[str, str, float, str]:
    return verdict.answer, verdict.by, verdict.at_ms, verdict.why

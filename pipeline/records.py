"""Per-turn timing and the record each finished turn leaves behind.

The zero of a turn is the end of the caller's speech. Every stage marks the moment it finished;
the first mark of a stage wins and a mark before the zero is rejected (logged, not stored).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field

from pipeline.llm.decision import Decision
from pipeline.turns import EndJudgement

log = logging.getLogger(__name__)

# Stage names in pipeline order, each a moment measured from the end of the caller's speech.
STAGES = (
    "endpoint",  # end-of-turn decided
    "stt",  # transcript ready
    "llm_first_token",  # first visible LLM token
    "first_sentence",  # first speakable sentence complete
    "tts_first_chunk",  # first sentence synthesized
    "first_audio",  # first reply audio frame sent to the caller
)


class TurnClock:
    """Monotonic stage marks relative to the end of caller speech, and how the end was judged
    (`judgement`: the turn model's score and the delay chosen at the pause that ended it)."""

    def __init__(self, speech_ended_at: float, judgement: EndJudgement | None = None) -> None:
        self.zero = speech_ended_at
        self.judgement = judgement
        self.stt_earlier_s = 0.0  # the transcript's `earlier_s`: kept from earlier pauses
        self.early_skipped = False  # no early transcription at the turn's last pause (busy)
        self.gaps: list[dict[str, object]] = []  # the reply's gaps (pipeline/speaking.py)
        self.fillers = 0  # hesitations said where the line ran dry (pipeline/speaking.py)
        self._marks: dict[str, float] = {}

    def mark(self, stage: str, at: float | None = None) -> None:
        """Record that `stage` finished at `at` (now by default); the first mark wins."""
        if stage in self._marks:
            return
        moment = time.monotonic() if at is None else at
        if moment < self.zero:
            log.warning(
                "rejected negative timing for %s: %.1f ms", stage, (moment - self.zero) * 1e3
            )
            return
        self._marks[stage] = moment

    def gap(self, ms: float, waited_on: str) -> None:
        """The reply went silent for `ms` between two sentences, the second late for `waited_on`
        ("text", "synthesis" or "loop")."""
        self.gaps.append({"ms": round(ms, 1), "waited_on": waited_on})

    @property
    def turn_score(self) -> float | None:
        return self.judgement.score if self.judgement is not None else None

    @property
    def turn_delay_ms(self) -> int | None:
        return self.judgement.delay_ms if self.judgement is not None else None

    def ms(self) -> dict[str, float]:
        """Each marked stage in milliseconds since the end of caller speech."""
        return {
            stage: round((self._marks[stage] - self.zero) * 1e3, 1)
            for stage in STAGES
            if stage in self._marks
        }


@dataclass
class TurnRecord:
    """One finished turn: what was said, what the caller heard, and when each stage finished."""

    turn: int
    caller_text: str
    reply_text: str  # what the caller heard
    generated_text: str  # what the LLM produced before the turn ended
    interrupted: bool
    effort: str | None
    service_tier_requested: str | None  # the service_tier sent (not our tier's name)
    service_tier_served: str | None  # the service_tier the provider echoed as serving it
    reason: str
    timings_ms: dict[str, float] = field(default_factory=dict)
    stt_inference_ms: float | None = None
    llm_ttft_ms: float | None = None  # request sent -> first visible token
    reasoning_tokens: int | None = None
    output_tokens: int | None = None
    started_at: float = 0.0  # wall clock (time.time()) at the end of caller speech
    experiment: str | None = None  # the call's experiment and arm, if it is in one
    arm: str | None = None
    budget_ms: float | None = None  # the voice-to-voice budget the turn was planned for
    # The controller's decision: planned vs spoken tier (our tier's name) and effort, predicted
    # vs actual first audio, why, and every request tried (`pipeline.llm.decision`); a dict
    # in `to_dict()`.
    decision: Decision | None = None
    speculative: bool = False  # the reply began at the caller's pause, held until the turn ended
    # Replies begun at earlier pauses of this turn and thrown away (the caller spoke on): LLM
    # requests the operator paid for that nobody heard.
    speculations_discarded: int = 0
    # Tools the LLM called in this turn, in order: name, arguments, ok, ms, output (cut to 500
    # characters), the action asked of the call (Transfer, EndCall, SendDigits) if any.
    tools: list[dict[str, object]] = field(default_factory=list)
    tools_ms: float | None = None  # time the turn waited on its tools
    # The end of the turn (`pipeline.turn_taking.end_of_turn`): the turn model's score at the
    # pause that ended it (probability the turn was over; None: not scored, or no judgement
    # came before the timeout) and the silence the policy chose there (None: no judgement).
    turn_score: float | None = None
    turn_delay_ms: int | None = None
    # Of the caller's audio, the seconds transcribed at the turn's earlier pauses, whose words
    # were kept (`pipeline.long_turns`): after the turn ended, only the rest was transcribed.
    stt_earlier_s: float = 0.0
    # The recognizer was busy at the pause that ended the turn, so the early (speculative)
    # transcription there was skipped: the words were transcribed once the turn had ended.
    stt_early_skipped: bool = False
    # Where the reply went silent between two of its sentences for 100 ms or more: each gap's
    # length and what its next sentence waited on ("text", "synthesis", "loop";
    # pipeline/speaking.py). Under load, "synthesis" ones are the voice's line falling behind.
    reply_gaps: list[dict[str, object]] = field(default_factory=list)
    # Hesitations ("Um,", the settings' gap_filler) said where the line ran dry while the next
    # sentence waited for its audio; not in the reply's text.
    reply_fillers: int = 0

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

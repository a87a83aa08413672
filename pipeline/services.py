"""What a conversation needs of its speech recognizer, its speech synthesizer and its LLM: the
server passes `pipeline.stt.SpeechToText`, `pipeline.tts.TextToSpeech` and
`pipeline.llm.routing.CallRouter`; tests pass scripted stand-ins."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

from pipeline.llm.client import ChatMessage
from pipeline.llm.decision import Decision
from pipeline.scheduling import Urgency
from pipeline.stt import Transcript
from pipeline.tools import ToolCall


class SpeechRecognizer(Protocol):
    @property
    def busy(self) -> bool:
        """Transcriptions are queueing: one started now would wait a whole inference or more
        (a speculative one at a pause is then skipped)."""
        ...

    async def transcribe(
        self, audio: npt.NDArray[np.int16], urgent: bool | Urgency = True
    ) -> Transcript: ...


class SpeechSynthesizer(Protocol):
    @property
    def sample_rate(self) -> int: ...

    async def synthesize(
        self, text: str, urgent: bool | Urgency = False
    ) -> npt.NDArray[np.int16]: ...


class ReplyStream(Protocol):
    """One turn's reply (`pipeline.llm.routing.RoutedReply`): text deltas, and what they came
    from."""

    filler: str | None  # a short phrase to say at once: the reply will be late

    @property
    def service_tier_requested(self) -> str | None: ...
    @property
    def effort(self) -> str | None: ...
    @property
    def first_token_at(self) -> float | None: ...
    @property
    def requested_at(self) -> float: ...
    @property
    def service_tier_served(self) -> str | None: ...
    @property
    def reasoning_tokens(self) -> int | None: ...
    @property
    def output_tokens(self) -> int | None: ...
    @property
    def tool_calls(self) -> Sequence[ToolCall]:
        """The tools the reply calls (complete once its text has ended)."""
        ...

    def __aiter__(self) -> AsyncIterator[str]: ...

    async def aclose(self) -> None: ...

    def finish(self, timings_ms: Mapping[str, float]) -> Decision | None:
        """The turn is over: learn from its timings; the decision for the turn record."""
        ...


class LanguageModel(Protocol):
    """The call's LLM (`pipeline.llm.routing.CallRouter`): plans and streams each turn's reply."""

    experiment: str | None
    arm: str | None

    def reply(self, history: Sequence[ChatMessage], zero: float) -> ReplyStream:
        """Plan the reply to `history` now; `zero` is the monotonic end of caller speech."""
        ...

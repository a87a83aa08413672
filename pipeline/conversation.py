"""One call's loop: caller audio in, turns out, one response task at a time, barge-in.

```
transport.inbound() -> TurnDetector -> SpeechStarted: barge-in (clear, cancel, await)
                                    -> TurnSegment: response task
response task: STT -> LLM stream -> sentences -> TTS -> transport.play()
```

The history keeps only what the caller heard: every sentence is queued at a known outbound
position, and when a response ends (finished or interrupted) the transport's played position
says how far the caller got.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt
import soxr
from pydantic import BaseModel

from pipeline.llm import ChatMessage, LLMError
from pipeline.records import TurnClock, TurnRecord
from pipeline.sentences import SentenceSettings, SentenceSplitter
from pipeline.stt import Transcript
from pipeline.transport import (
    SAMPLE_RATE,
    AudioIn,
    Dtmf,
    HangUp,
    PlaybackCleared,
    Transport,
)
from pipeline.turns import SpeechStarted, TurnDetector, TurnPause, TurnSegment, TurnSettings

log = logging.getLogger(__name__)


class SpeechRecognizer(Protocol):
    async def transcribe(self, audio: npt.NDArray[np.int16]) -> Transcript: ...


class SpeechSynthesizer(Protocol):
    @property
    def sample_rate(self) -> int: ...

    async def synthesize(self, text: str) -> npt.NDArray[np.int16]: ...


class ReplyStream(Protocol):
    """One turn's reply (`pipeline.routing.RoutedReply`): text deltas, and what they came from."""

    filler: str | None  # a short phrase to say at once: the reply will be late

    @property
    def requested_tier(self) -> str | None: ...
    @property
    def effort(self) -> str | None: ...
    @property
    def first_token_at(self) -> float | None: ...
    @property
    def requested_at(self) -> float: ...
    @property
    def service_tier(self) -> str | None: ...
    @property
    def reasoning_tokens(self) -> int | None: ...
    @property
    def output_tokens(self) -> int | None: ...

    def __aiter__(self) -> AsyncIterator[str]: ...

    async def aclose(self) -> None: ...

    def finish(self, timings_ms: Mapping[str, float]) -> dict[str, object] | None:
        """The turn is over: learn from its timings; the decision for the turn record."""
        ...


class LanguageModel(Protocol):
    """The call's LLM (`pipeline.routing.CallLLM`): plans and streams each turn's reply."""

    experiment: str | None
    arm: str | None

    def reply(self, history: Sequence[ChatMessage], zero: float) -> ReplyStream:
        """Plan the reply to `history` now; `zero` is the monotonic end of caller speech."""
        ...


class ConversationSettings(BaseModel):
    """How a call behaves, apart from its models."""

    greeting: str | None = None  # spoken when the call starts, if set
    # Spoken when no tier could answer a turn (every one failed).
    apology: str = "Sorry, I can't answer that right now. Please say it again in a moment."
    # Keys pressed within this long of each other make one keypad turn ("#" ends it at once).
    keypad_timeout_s: float = 1.5


@dataclass
class _Spoken:
    """A sentence queued for playback at outbound positions [start, end)."""

    text: str
    start: int
    end: int


def heard_text(spoken: Sequence[_Spoken], played: int) -> str:
    """The part of the spoken sentences the caller heard, given the played position.

    Sentences played in full are kept whole; the sentence playing when the caller cut in keeps
    the share of its words proportional to the share of its audio that was played.
    """
    parts: list[str] = []
    for sentence in spoken:
        if played >= sentence.end:
            parts.append(sentence.text)
        elif played > sentence.start:
            words = sentence.text.split()
            share = (played - sentence.start) / (sentence.end - sentence.start)
            kept = words[: int(len(words) * share)]
            if kept:
                parts.append(" ".join(kept) + " —")
            break
        else:
            break
    return " ".join(parts)


class Conversation:
    """The per-call loop of DESIGN.md; owns the call's state and at most one response task."""

    def __init__(
        self,
        call_id: str,
        transport: Transport,
        *,
        stt: SpeechRecognizer,
        llm: LanguageModel,
        tts: SpeechSynthesizer,
        settings: ConversationSettings | None = None,
        turn_settings: TurnSettings | None = None,
        sentence_settings: SentenceSettings | None = None,
        on_turn: Callable[[TurnRecord], None] | None = None,
        on_key: Callable[[str], bool] | None = None,
        on_event: Callable[[dict[str, object]], None] | None = None,
    ) -> None:
        """`on_key(digit)` sees each DTMF key first; returning True consumes it (e.g. "0" for a
        person); other keys are collected into a keypad turn that the LLM answers."""
        self.call_id = call_id
        self.transport = transport
        self.stt = stt
        self.llm = llm
        self.tts = tts
        self.settings = settings or ConversationSettings()
        self.sentence_settings = sentence_settings
        self.detector = TurnDetector(turn_settings)
        self.history: list[ChatMessage] = []
        self.records: list[TurnRecord] = []
        self.barge_ins: list[float] = []  # monotonic speech onsets that interrupted a reply
        self._on_turn = on_turn
        self._on_key = on_key
        self._on_event = on_event
        self._keypad: list[str] = []
        self._keypad_timer: asyncio.TimerHandle | None = None
        self._response: asyncio.Task[None] | None = None
        # Caller speech whose reply was cut off before any of it played: it is answered together
        # with the next turn (as audio if it was cut during STT, else as text).
        self._unheard_audio: npt.NDArray[np.int16] | None = None
        self._unanswered = ""
        # Transcription started when the caller paused, by the audio position where speech ended.
        self._early: tuple[int, asyncio.Task[Transcript]] | None = None
        # One stateful resampler for this call's outbound audio (TTS rate -> 16 kHz).
        self._resampler = soxr.ResampleStream(tts.sample_rate, SAMPLE_RATE, 1, dtype="int16")

    def _emit(self, event: dict[str, object]) -> None:
        """Tell the caller's screen (if any) and whoever watches the call."""
        self.transport.send_event(event)
        if self._on_event is not None:
            self._on_event(event)

    async def run(self) -> None:
        """Serve the call until the caller hangs up or the transport ends."""
        log.info("call %s: conversation started", self.call_id)
        try:
            if self.settings.greeting:
                self._response = asyncio.create_task(self._announce(self.settings.greeting))
            async for event in self.transport.inbound():
                if isinstance(event, AudioIn):
                    for found in self.detector.push(event.pcm, event.at):
                        if isinstance(found, SpeechStarted):
                            await self._barge_in(found)
                        elif isinstance(found, TurnPause):
                            self._transcribe_early(found)
                        else:
                            self._start_response(found)
                elif isinstance(event, Dtmf):
                    await self._key_pressed(event.digit)
                elif isinstance(event, HangUp):
                    log.info("call %s: hang-up (%s)", self.call_id, event.reason)
                    break
        finally:
            if self._keypad_timer is not None:
                self._keypad_timer.cancel()
            self._drop_early()
            await self._stop_response()
            log.info("call %s: conversation ended after %d turns", self.call_id, len(self.records))

    # -- barge-in ---------------------------------------------------------------------------

    async def _barge_in(self, started: SpeechStarted) -> None:
        if self._response is None or self._response.done():
            return
        log.info(
            "call %s: barge-in, speech began %.0f ms ago (monotonic %.3f)",
            self.call_id,
            (time.monotonic() - started.at) * 1e3,
            started.at,
        )
        self.barge_ins.append(started.at)
        await self._interrupt()

    async def _interrupt(self) -> None:
        """Silence the reply at once, then stop the response task."""
        if self._response is not None and not self._response.done():
            # First, so that it queues no more audio: clear() awaits the wire, and a sentence
            # whose synthesis finished meanwhile would otherwise be played after the clear.
            self._response.cancel()
        await self.transport.clear()
        await self._stop_response()

    async def say(self, text: str) -> None:
        """Speak `text` into the call now, cutting off any reply in progress."""
        await self._interrupt()
        self._response = asyncio.create_task(self._announce(text))

    # -- keypad -----------------------------------------------------------------------------

    async def _key_pressed(self, digit: str) -> None:
        log.info("call %s: DTMF %s", self.call_id, digit)
        self._emit({"type": "dtmf", "digit": digit})
        if self._on_key is not None and self._on_key(digit):
            return
        if not self._keypad and self._response is not None and not self._response.done():
            await self._interrupt()  # a key press cuts the reply short, as speech does
        if self._keypad_timer is not None:
            self._keypad_timer.cancel()
        if digit != "#":
            self._keypad.append(digit)
        if digit == "#" or len(self._keypad) >= 32:
            self._keypad_turn()
        else:
            loop = asyncio.get_running_loop()
            self._keypad_timer = loop.call_later(self.settings.keypad_timeout_s, self._keypad_turn)

    def _keypad_turn(self) -> None:
        """The keys pressed so far become one caller turn, as text for the LLM."""
        digits, self._keypad, self._keypad_timer = self._keypad, [], None
        if not digits:
            return
        if self._response is not None and not self._response.done():
            self._response.cancel()
        text = f"(The caller pressed {' '.join(digits)} on the keypad.)"
        self._response = asyncio.create_task(self._reply(text, TurnClock(time.monotonic()), None))

    async def _stop_response(self) -> None:
        task, self._response = self._response, None
        if task is None or task.done():
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    def _caller_audio(self, audio: npt.NDArray[np.int16]) -> npt.NDArray[np.int16]:
        """The audio to transcribe: `audio`, after any speech whose reply was cut off unheard."""
        if self._unheard_audio is None:
            return audio
        return np.concatenate([self._unheard_audio, audio])

    def _transcribe_early(self, pause: TurnPause) -> None:
        """Start transcribing at a pause, so the transcript is ready when the turn ends."""
        self._drop_early()
        task = asyncio.create_task(self.stt.transcribe(self._caller_audio(pause.audio)))
        self._early = (pause.end_position, task)

    def _drop_early(self) -> None:
        if self._early is not None:
            self._early[1].cancel()
            self._early = None

    def _start_response(self, segment: TurnSegment) -> None:
        if self._response is not None and not self._response.done():
            # A turn can only end after speech started, which already cancelled any response.
            log.warning("call %s: turn ended while a response was running", self.call_id)
            self._response.cancel()
        early = None
        if self._early is not None and self._early[0] == segment.end_position:
            early, self._early = self._early[1], None
        self._drop_early()
        self._response = asyncio.create_task(self._respond(segment, early))

    # -- one response -----------------------------------------------------------------------

    async def _respond(
        self, segment: TurnSegment, early: asyncio.Task[Transcript] | None = None
    ) -> None:
        clock = TurnClock(segment.speech_ended_at)
        clock.mark("endpoint", segment.detected_at)
        audio = self._caller_audio(segment.audio)
        self._unheard_audio = audio
        try:
            # The same audio was handed to STT when the caller paused, unless speech resumed.
            transcript = await (early or self.stt.transcribe(audio))
        finally:
            if early is not None:
                early.cancel()
        clock.mark("stt")
        self._unheard_audio = None
        said = " ".join(part for part in (self._unanswered, transcript.text.strip()) if part)
        if not transcript.text.strip():
            log.info("call %s: empty transcript, no reply", self.call_id)
            return
        await self._reply(said, clock, round(transcript.inference_s * 1e3, 1))

    async def _reply(self, said: str, clock: TurnClock, stt_ms: float | None) -> None:
        """Answer what the caller said (or keyed in): LLM -> sentences -> TTS -> transport."""
        self._unanswered = ""
        turn = len(self.records) + 1
        self._emit({"type": "transcript", "role": "caller", "turn": turn, "text": said})
        history = [*self.history, ChatMessage(role="user", content=said)]
        stream = self.llm.reply(history, clock.zero)
        spoken: list[_Spoken] = []
        generated: list[str] = []
        finished = False
        watcher: asyncio.Task[None] | None = None
        try:
            if stream.filler:
                watcher = await self._speak(stream.filler, spoken, clock)
            splitter = SentenceSplitter(self.sentence_settings)
            try:
                async for delta in stream:
                    clock.mark("llm_first_token")
                    generated.append(delta)
                    for sentence in splitter.push(delta):
                        watcher = await self._speak(sentence, spoken, clock) or watcher
            except LLMError as exc:
                log.error("call %s: no reply from the LLM: %s", self.call_id, exc)
                splitter = SentenceSplitter(self.sentence_settings)
                for sentence in splitter.push(self.settings.apology):
                    watcher = await self._speak(sentence, spoken, clock) or watcher
            for sentence in splitter.flush():
                watcher = await self._speak(sentence, spoken, clock) or watcher
            if spoken:
                await self.transport.wait_played(spoken[-1].end)
            finished = True
        except PlaybackCleared:
            pass
        finally:
            if watcher is not None:
                watcher.cancel()
            await stream.aclose()
            self._finish_turn(
                turn, said, spoken, "".join(generated), finished, clock, stt_ms, stream
            )

    async def _speak(
        self, sentence: str, spoken: list[_Spoken], clock: TurnClock
    ) -> asyncio.Task[None] | None:
        """Synthesize one sentence and queue it; returns the first-audio watcher if it made one."""
        clock.mark("first_sentence")
        audio = await self.tts.synthesize(sentence)
        clock.mark("tts_first_chunk")
        pcm = self._resampler.resample_chunk(audio)
        if pcm.size == 0:
            return None
        start = self.transport.queued_samples
        end = self.transport.play(pcm)
        spoken.append(_Spoken(sentence, start, end))
        if len(spoken) == 1:
            return asyncio.create_task(self._watch_first_audio(start, clock))
        return None

    async def _watch_first_audio(self, start: int, clock: TurnClock) -> None:
        with contextlib.suppress(PlaybackCleared):
            # The first 20 ms frame of the reply has gone out once sending passes its start.
            clock.mark("first_audio", await self.transport.wait_sent(start + 1))

    def _finish_turn(
        self,
        turn: int,
        said: str,
        spoken: list[_Spoken],
        generated: str,
        finished: bool,
        clock: TurnClock,
        stt_ms: float | None,
        stream: ReplyStream,
    ) -> None:
        decision = stream.finish(clock.ms())
        heard = heard_text(spoken, self.transport.played_samples)
        interrupted = not finished
        if interrupted and not heard:
            # Nothing reached the caller: answer these words together with what comes next.
            log.info(
                "call %s: reply cut off before any audio; carrying the words over", self.call_id
            )
            self._unanswered = said
            return
        self.history.append(ChatMessage(role="user", content=said))
        if heard:
            self.history.append(ChatMessage(role="assistant", content=heard))
        budget = decision.get("budget_ms") if decision else None
        ttft = None
        if stream.first_token_at is not None:
            ttft = round((stream.first_token_at - stream.requested_at) * 1e3, 1)
        record = TurnRecord(
            turn=turn,
            caller_text=said,
            reply_text=heard,
            generated_text=generated,
            interrupted=interrupted,
            effort=stream.effort,
            tier=stream.requested_tier,
            tier_used=stream.service_tier,
            reason=str(decision["reason"]) if decision else "",
            timings_ms=clock.ms(),
            stt_inference_ms=stt_ms,
            llm_ttft_ms=ttft,
            reasoning_tokens=stream.reasoning_tokens,
            output_tokens=stream.output_tokens,
            started_at=time.time() - (time.monotonic() - clock.zero),
            experiment=self.llm.experiment,
            arm=self.llm.arm,
            budget_ms=budget if isinstance(budget, int | float) else None,
            decision=decision,
        )
        self.records.append(record)
        log.info(
            "call %s turn %d%s: %s",
            self.call_id,
            turn,
            " (interrupted)" if interrupted else "",
            record.timings_ms,
        )
        self._emit(
            {
                "type": "transcript",
                "role": "bot",
                "turn": turn,
                "text": heard,
                "interrupted": interrupted,
            }
        )
        self._emit({"type": "turn", "record": record.to_dict()})
        if self._on_turn is not None:
            self._on_turn(record)

    async def _announce(self, text: str) -> None:
        """Speak a fixed text (greeting, operator message); history keeps what was heard."""
        spoken: list[_Spoken] = []
        watcher = None
        try:
            watcher = await self._speak(text, spoken, TurnClock(time.monotonic()))
            if spoken:
                await self.transport.wait_played(spoken[-1].end)
        except PlaybackCleared:
            pass
        finally:
            if watcher is not None:
                watcher.cancel()
            heard = heard_text(spoken, self.transport.played_samples)
            if heard:
                self.history.append(ChatMessage(role="assistant", content=heard))

"""Scripted stand-ins for the per-call loop's tests: fake STT, LLM and TTS that keep the real
ones' timing shape (a transcription delay, a time to first token and a token rate, synthesis
that returns audio proportional to the words), a phone line that plays queued audio in real
time, and the caller's real speech as 20 ms frames."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence

import numpy as np

from pipeline.llm.client import ChatMessage
from pipeline.llm.decision import Decision
from pipeline.llm.errors import LLMError
from pipeline.scheduling import Urgency
from pipeline.stt import Transcript
from pipeline.tools import ToolCall, ToolContext, ToolResult, ToolSpec
from pipeline.transport import (
    PCM,
    SAMPLE_RATE,
    AudioIn,
    InboundEvent,
    PlaybackCleared,
    Taps,
)
from tests.support.speech import concat, frames, silence
from tests.support.speech import utterance as shared_utterance


class ScriptedSTT:
    def __init__(self, texts: Sequence[str], delay_s: float = 0.05) -> None:
        self.texts = list(texts)
        self.delay_s = delay_s
        self.heard_seconds: list[float] = []
        self.called_at: list[float] = []
        self.finished_at: list[float] = []

    busy = False  # never queueing

    async def transcribe(self, audio: PCM, urgent: bool | Urgency = True) -> Transcript:
        self.called_at.append(time.monotonic())
        await asyncio.sleep(self.delay_s)
        self.finished_at.append(time.monotonic())
        self.heard_seconds.append(len(audio) / SAMPLE_RATE)
        return Transcript(self.texts.pop(0), len(audio) / SAMPLE_RATE, self.delay_s)


class ScriptedReply:
    """A streamed reply: first token after `ttft_s`, then `tokens_per_s` word tokens."""

    def __init__(
        self,
        text: str,
        ttft_s: float,
        tokens_per_s: float,
        tool_calls: Sequence[ToolCall] = (),
    ) -> None:
        self.text = text
        self.script_calls = list(tool_calls)  # asked for once the text has streamed
        self.tool_calls: list[ToolCall] = []
        self.ttft_s = ttft_s
        self.tokens_per_s = tokens_per_s
        self.requested_at = time.monotonic()
        self.first_token_at: float | None = None
        self.service_tier_requested: str | None = "priority"
        self.effort: str | None = "low"
        self.service_tier_served: str | None = "default"  # the provider served another
        self.reasoning_tokens: int | None = 0
        self.output_tokens: int | None = None
        self.filler: str | None = None
        self.failure: LLMError | None = None
        self.closed = False
        self.finished_with: dict[str, float] | None = None

    async def _tokens(self) -> AsyncIterator[str]:
        tokens = [" " + word for word in self.text.split()]
        start = self.requested_at + self.ttft_s
        if self.failure is not None:
            await asyncio.sleep(max(0.0, start - time.monotonic()))
            raise self.failure
        for index, token in enumerate(tokens):
            await asyncio.sleep(max(0.0, start + index / self.tokens_per_s - time.monotonic()))
            if self.first_token_at is None:
                self.first_token_at = time.monotonic()
            yield token
        self.output_tokens = len(tokens)
        self.tool_calls = self.script_calls

    def __aiter__(self) -> AsyncIterator[str]:
        return self._tokens()

    async def aclose(self) -> None:
        self.closed = True

    def finish(self, timings_ms: Mapping[str, float]) -> Decision | None:
        self.finished_with = dict(timings_ms)
        return Decision(
            tier="fast",
            effort=self.effort,
            planned_tier="fast",
            planned_effort="low",
            taken="planned",
            reason="scripted",
            budget_ms=1000.0,
            fits=True,
            filler=None,
            first_token_deadline_ms=300.0,
            predicted_first_audio_ms=600.0,
            actual_first_audio_ms=timings_ms.get("first_audio"),
            error_ms=None,
        )


Scripted = str | tuple[str, Sequence[ToolCall]]  # a reply's text, and the tools it asks for


class ScriptedLLM:
    def __init__(
        self, replies: Sequence[Scripted], ttft_s: Sequence[float] = (), tokens_per_s: float = 200
    ) -> None:
        self.replies = list(replies)
        self.ttft_s = list(ttft_s)
        self.tokens_per_s = tokens_per_s
        self.requests: list[list[ChatMessage]] = []
        self.zeros: list[float] = []
        self.streams: list[ScriptedReply] = []
        self.experiment: str | None = None
        self.arm: str | None = None

    def reply(self, history: Sequence[ChatMessage], zero: float) -> ScriptedReply:
        self.requests.append(list(history))
        self.zeros.append(zero)
        ttft = self.ttft_s.pop(0) if self.ttft_s else 0.1
        script = self.replies.pop(0)
        text, calls = (script, ()) if isinstance(script, str) else script
        reply = ScriptedReply(text, ttft, self.tokens_per_s, calls)
        self.streams.append(reply)
        return reply


class ScriptedToolbox:
    """Tools that answer `outputs[name]` after `delay_s[name]` (default 50 ms), or never
    (until cancelled) when the delay is None; with `actions[name]`, that action too."""

    def __init__(
        self,
        outputs: Mapping[str, str],
        delay_s: Mapping[str, float | None] | None = None,
        actions: Mapping[str, object] | None = None,
    ) -> None:
        self.outputs = dict(outputs)
        self.delay_s = dict(delay_s or {})
        self.actions = dict(actions or {})
        self.started: list[tuple[ToolCall, ToolContext]] = []
        self.running = asyncio.Event()  # set when a call starts
        self.cancelled: list[str] = []
        self.results: list[ToolResult] = []

    def specs(self) -> Sequence[ToolSpec]:
        return [ToolSpec(name, f"the {name} tool") for name in self.outputs]

    async def run(self, call: ToolCall, context: ToolContext) -> ToolResult:
        started = time.monotonic()
        self.started.append((call, context))
        self.running.set()
        delay = self.delay_s.get(call.name, 0.05)
        try:
            if delay is None:
                await asyncio.Event().wait()
            await asyncio.sleep(delay or 0.0)
        except asyncio.CancelledError:
            self.cancelled.append(call.id)
            raise
        action = self.actions.get(call.name)
        result = ToolResult(
            call,
            self.outputs[call.name],
            started_at=started,
            ended_at=time.monotonic(),
            action=action,  # type: ignore[arg-type]
        )
        self.results.append(result)
        return result


class ToneTTS:
    """250 ms of tone per word at 22 050 Hz, ready after 20 ms."""

    sample_rate = 22_050

    async def synthesize(self, text: str, urgent: bool | Urgency = False) -> PCM:
        await asyncio.sleep(0.02)
        n = int(0.25 * self.sample_rate) * len(text.split())
        t = np.arange(n) / self.sample_rate
        return (np.sin(2 * np.pi * 440 * t) * 8000).astype(np.int16)


class PhoneLine:
    """A transport that plays queued audio in real time and feeds a scripted caller.

    Like a phone stream (voice/transports/phone/stream.py), it sends reply audio in 20 ms frames
    on a real-time schedule, each frame up to `lead_s` ahead of its slot and never before it was
    queued: a frame is *sent* when it leaves, *played* once its slot has passed. `clear()` drops
    what has not played, sent or not (the provider's buffer with it). `pause()` stops the line
    at the frame playing (what has not played waits, and so do its waiters); `resume()` plays on
    from there, as a phone stream resends from its played position.
    """

    FRAME = 320  # 20 ms at 16 kHz

    def __init__(self, lead_s: float = 0.2) -> None:
        self.script: Callable[[PhoneLine], AsyncIterator[InboundEvent]] | None = None
        self.taps = Taps()
        self.events: list[dict[str, object]] = []
        self.clears = 0
        self.pauses: list[int] = []  # the played position at each pause
        self.resumes = 0
        self.paused = False
        self.lead_s = lead_s
        self._queued = 0
        self._start_pos = 0  # the burst playing now: its first position, and when it started
        self._start_time = time.monotonic()
        self._chunks: list[tuple[int, float]] = []  # (end position, queued at) in this burst
        self._cleared = asyncio.Event()  # set (and renewed) at each clear
        self._changed = asyncio.Event()  # the same, at each clear, pause and resume

    def inbound(self) -> AsyncIterator[InboundEvent]:
        assert self.script is not None
        return self.script(self)

    def _slot(self, position: int) -> float:
        """When the frame holding sample `position - 1` starts playing."""
        frame = (position - 1 - self._start_pos) // self.FRAME
        return self._start_time + frame * self.FRAME / SAMPLE_RATE

    def _played_at(self, now: float) -> int:
        if self.paused:
            return self._start_pos
        frames_passed = int((now - self._start_time) * SAMPLE_RATE) // self.FRAME
        return min(self._queued, self._start_pos + frames_passed * self.FRAME)

    def played_due(self, position: int) -> float:
        """When `position` has played: the slot of its frame has passed."""
        if position <= self._start_pos:
            return self._start_time
        return self._slot(position) + self.FRAME / SAMPLE_RATE

    def sent_due(self, position: int) -> float:
        """When the frame holding sample `position - 1` leaves: `lead_s` before its slot, or
        when it was queued if that was later."""
        if position <= self._start_pos:
            return self._start_time
        queued_at = next(at for end, at in self._chunks if end >= position)
        return max(queued_at, self._slot(position) - self.lead_s)

    @property
    def played_samples(self) -> int:
        return self._played_at(time.monotonic())

    @property
    def queued_samples(self) -> int:
        return self._queued

    def play(self, pcm: PCM) -> int:
        now = time.monotonic()
        if not self.paused and self._played_at(now) >= self._queued:  # idle: playback starts now
            self._start_pos, self._start_time, self._chunks = self._queued, now, []
        self._queued += len(pcm)
        self._chunks.append((self._queued, now))
        self._change()  # a caller waiting for the reply to get this far (`reached`) looks again
        return self._queued

    async def clear(self) -> None:
        self.clears += 1
        now = time.monotonic()
        position = self._played_at(now)
        self.paused = False
        self._queued = self._start_pos = position
        self._start_time, self._chunks = now, []
        self._cleared.set()
        self._cleared = asyncio.Event()
        self._change()

    async def pause(self) -> None:
        if self.paused:
            return
        self._start_pos = self._played_at(time.monotonic())
        self.paused = True
        self.pauses.append(self._start_pos)
        self._change()

    async def resume(self) -> None:
        if not self.paused:
            return
        now = time.monotonic()
        self.paused = False
        self.resumes += 1
        self._start_time, self._chunks = now, [(self._queued, now)]
        self._change()

    def _change(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _until(self, position: int, due: Callable[[int], float]) -> float:
        clears = self.clears
        while True:
            if position > self._queued or self.clears != clears:
                raise PlaybackCleared
            changed = self._changed
            at = None if self.paused else due(position)
            timeout = None if at is None else max(0.0, at - time.monotonic())
            try:
                await asyncio.wait_for(changed.wait(), timeout)
            except TimeoutError:
                assert at is not None
                return at

    async def wait_played(self, position: int) -> float:
        return await self._until(position, self.played_due)

    async def wait_sent(self, position: int) -> float:
        return await self._until(position, self.sent_due)

    def hang_up(self, reason: str) -> None:
        raise AssertionError("the conversation never hangs up by itself")

    def send_event(self, event: dict[str, object]) -> None:
        self.events.append(event)

    async def close(self) -> None:
        pass

    async def reached(self, position: int) -> None:
        """Wait until the caller has heard `position` samples of reply (also when the reply is
        not yet queued that far: a slow STT under load holds it back)."""
        while self.played_samples < position:
            if position > self._queued:
                await self._changed.wait()
                continue
            await self.wait_played(position)


async def speak(pcm: PCM) -> AsyncIterator[InboundEvent]:
    """The caller's microphone: 20 ms frames, in real time."""
    start = time.monotonic()
    for index, frame in enumerate(frames(pcm)):
        due = start + (index + 1) * 0.02
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        yield AudioIn(frame, due)


def utterance(text: str) -> PCM:
    """The caller's turn in the scripted conversation tests: the shared
    `tests.support.speech.utterance` in espeak-ng's en-us voice at its own 160 wpm, reframed
    with 200 ms of silence before and 700 ms after (the shared one: 300 and 200). The 700 ms
    tail outlasts the turn detector's 500 ms end-of-turn silence, so each turn ends inside its
    own clip, and these tests' timelines are counted from that framing."""
    spoken = shared_utterance(text, "en-us", wpm=160)[SAMPLE_RATE // 10 :]  # 300 -> 200 ms
    return concat(spoken, silence(500))  # 200 -> 700 ms

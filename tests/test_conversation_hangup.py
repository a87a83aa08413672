"""The caller hangs up before hearing the reply: every turn they spoke still leaves one record.

Timelines as in `tests/test_conversation.py` (real speech through the real turn detector, fakes
with the real models' timing shape); the caller hangs up at each stage of a turn: while it is
being transcribed, before the first LLM token, during synthesis, after the reply went out but
before the line confirmed playing any of it (Twilio without `mark` echoes), and after a reply
was cut off unheard, when its words wait for a next turn that never comes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from pipeline.conversation import Conversation
from pipeline.conversation_settings import ConversationSettings
from pipeline.records import TurnRecord
from pipeline.scheduling import Urgency
from pipeline.stt import Transcript
from pipeline.transport import PCM, SAMPLE_RATE, AudioIn, HangUp, InboundEvent, PlaybackCleared
from tests.support.conversation import (
    PhoneLine,
    ScriptedLLM,
    ScriptedSTT,
    ToneTTS,
    speak,
    utterance,
)
from tests.support.speech import frames


class UnconfirmedLine(PhoneLine):
    """A line that sends reply audio in real time but never confirms that any of it played."""

    def __init__(self) -> None:
        super().__init__()
        self.queued = asyncio.Event()

    @property
    def played_samples(self) -> int:
        return 0

    def play(self, pcm: PCM) -> int:
        end = super().play(pcm)
        self.queued.set()
        return end

    async def wait_played(self, position: int) -> float:
        await self._cleared.wait()  # no confirmation ever comes; only a clear ends the wait
        raise PlaybackCleared


class SlowTTS(ToneTTS):
    """Synthesis that takes `delay_s`; `started` is set when the first sentence goes in."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.started = asyncio.Event()
        self.started_at = 0.0

    async def synthesize(self, text: str, urgent: bool | Urgency = False) -> PCM:
        if not self.started.is_set():
            self.started_at = time.monotonic()
        self.started.set()
        await asyncio.sleep(self.delay_s)
        return await super().synthesize(text, urgent)


class PacedSTT(ScriptedSTT):
    """ScriptedSTT with one delay per transcription."""

    def __init__(self, texts: list[str], delays_s: list[float]) -> None:
        super().__init__(texts)
        self.delays_s = delays_s

    busy = False  # never queueing

    async def transcribe(self, audio: PCM, urgent: bool | Urgency = True) -> Transcript:
        self.delay_s = self.delays_s.pop(0)
        return await super().transcribe(audio, urgent)


class Call:
    """One conversation with a scripted caller; what it recorded and when the caller hung up."""

    def __init__(
        self,
        line: PhoneLine,
        stt: ScriptedSTT,
        llm: ScriptedLLM,
        tts: ToneTTS | None = None,
        **settings: object,
    ) -> None:
        self.line = line
        self.stt = stt
        self.llm = llm
        self.stored: list[TurnRecord] = []  # what `on_turn` was given (the server's Redis writes)
        self.replying = asyncio.Event()  # the caller's words reached the LLM
        self.hung_up_at = 0.0
        self.ended_at = 0.0
        self.conversation = Conversation(
            "hangup",
            line,
            stt=stt,
            llm=llm,
            tts=tts or ToneTTS(),
            settings=ConversationSettings.model_validate(settings),
            on_turn=self.stored.append,
            on_event=self._event,
        )

    def _event(self, event: dict[str, object]) -> None:
        if event["type"] == "transcript" and event["role"] == "caller":
            self.replying.set()

    def hang_up(self) -> HangUp:
        self.hung_up_at = time.monotonic()
        return HangUp("caller hung up")

    async def run(self, capped: bool = False) -> list[TurnRecord]:
        """Run the call to its end. Cleanup after the hang-up waits for nothing but the last
        words' transcript, for at most `hang_up_stt_s`: without `capped` (a transcript that
        comes within the cap), it ends before the cap runs out, and after every transcription
        under way has finished. Each test also checks that it ended before anything else the
        timeline scripts (a first token, a synthesis) could have happened."""
        await asyncio.wait_for(self.conversation.run(), 30)
        self.ended_at = time.monotonic()
        took = self.ended_at - self.hung_up_at
        cap = self.conversation.settings.hang_up_stt_s
        if capped:
            assert took >= cap, f"ended {took:.3f} s after the hang-up, before the {cap} s cap"
        else:
            assert took < cap, f"ended {took:.3f} s after the hang-up: waited out the {cap} s cap"
            assert len(self.stt.finished_at) == len(self.stt.called_at), "a transcription left"
            assert all(at <= self.ended_at for at in self.stt.finished_at)
        assert self.stored == self.conversation.records
        return self.conversation.records

    def history(self) -> list[tuple[str, str]]:
        return [(m.role, m.content) for m in self.conversation.history]


def unheard(record: TurnRecord) -> None:
    """The record of a turn whose reply the caller never heard."""
    assert record.reply_text == ""
    assert record.interrupted


async def test_reply_sent_but_never_confirmed_played_is_recorded_as_unheard() -> None:
    line = UnconfirmedLine()
    call = Call(line, ScriptedSTT(["table for two"]), ScriptedLLM(["Table booked."]))
    left: list[float] = []

    async def caller(_: PhoneLine) -> AsyncIterator[InboundEvent]:
        async for event in speak(utterance("A table for two please")):
            yield event
        await line.queued.wait()
        left.append(line.sent_due(1))  # the reply's first frame
        await line.wait_sent(line.queued_samples)  # the whole reply went out, unconfirmed
        yield call.hang_up()

    line.script = caller
    [record] = await call.run()
    unheard(record)
    assert record.caller_text == "table for two"
    assert record.generated_text.strip() == "Table booked."
    # First audio is when the reply's first frame left, though none of it was confirmed played.
    zero = record.started_at + (time.monotonic() - time.time())  # the end of the speech
    first_audio_at = zero + record.timings_ms["first_audio"] / 1e3
    assert abs(first_audio_at - left[0]) < 0.002, (first_audio_at - zero, left[0] - zero)
    assert call.history() == [("user", "table for two")]
    assert call.llm.streams[0].closed
    bot = [e for e in line.events if e["type"] == "transcript" and e["role"] == "bot"]
    assert bot == [
        {
            "type": "transcript",
            "role": "bot",
            "source": "bot",
            "turn": 1,
            "text": "",
            "interrupted": True,
        }
    ]


async def test_hang_up_before_the_first_llm_token_is_recorded() -> None:
    line = PhoneLine()
    call = Call(line, ScriptedSTT(["what time do you open"]), ScriptedLLM(["At nine."], [5.0]))

    async def caller(line: PhoneLine) -> AsyncIterator[InboundEvent]:
        async for event in speak(utterance("What time do you open")):
            yield event
        await call.replying.wait()
        yield call.hang_up()

    line.script = caller
    [record] = await call.run()
    unheard(record)
    assert record.caller_text == "what time do you open"
    assert record.generated_text == ""
    assert "llm_first_token" not in record.timings_ms and "stt" in record.timings_ms
    assert call.llm.streams[0].closed and call.llm.streams[0].first_token_at is None
    assert call.history() == [("user", "what time do you open")]


async def test_hang_up_during_synthesis_is_recorded_with_what_was_generated() -> None:
    line = PhoneLine()
    tts = SlowTTS(delay_s=5.0)
    call = Call(line, ScriptedSTT(["hello"]), ScriptedLLM(["Hi there. How can I help?"]), tts=tts)

    async def caller(line: PhoneLine) -> AsyncIterator[InboundEvent]:
        async for event in speak(utterance("Hello")):
            yield event
        await tts.started.wait()
        yield call.hang_up()

    line.script = caller
    [record] = await call.run()
    unheard(record)
    assert record.caller_text == "hello"
    assert record.generated_text.strip().startswith("Hi there.")
    assert line.queued_samples == 0
    assert call.ended_at < tts.started_at + tts.delay_s  # the synthesis was not waited for
    assert call.history() == [("user", "hello")]


async def test_hang_up_during_transcription_waits_for_the_words_and_records_them() -> None:
    line = PhoneLine()
    stt = ScriptedSTT(["cancel my booking"], delay_s=1.0)
    call = Call(line, stt, ScriptedLLM(["never asked"]))

    async def caller(line: PhoneLine) -> AsyncIterator[InboundEvent]:
        # The turn ends 500 ms into the trailing silence; the transcript is due 1 s after the
        # pause that started it, so the caller hangs up while it is still being made.
        async for event in speak(utterance("Cancel my booking")):
            yield event
        assert len(stt.called_at) == 1 and not stt.heard_seconds
        yield call.hang_up()

    line.script = caller
    [record] = await call.run()
    unheard(record)
    assert record.caller_text == "cancel my booking" and record.generated_text == ""
    assert list(record.timings_ms) == ["endpoint", "stt"]
    # The turn's clock: the transcript is timed when it came, after the hang-up, not when the
    # caller hung up; the turn ended (and was timed) before the transcription finished.
    zero = record.started_at + (time.monotonic() - time.time())  # the end of the speech
    endpoint_at = zero + record.timings_ms["endpoint"] / 1e3
    stt_at = zero + record.timings_ms["stt"] / 1e3
    finished = stt.finished_at[0]
    since = {
        "turn ended": endpoint_at - zero,
        "hung up": call.hung_up_at - zero,
        "transcribed": finished - zero,
        "timed": stt_at - zero,
    }  # seconds after the end of the speech
    assert endpoint_at < call.hung_up_at < finished <= stt_at + 0.001, since
    assert len(stt.called_at) == 1  # the transcription under way was awaited, not redone
    assert call.llm.requests == []  # nothing is asked of the LLM once the caller is gone
    assert call.history() == [("user", "cancel my booking")]


async def test_a_turn_and_hang_up_arriving_in_one_burst_is_recorded() -> None:
    """Frames buffered on the wire arrive at once: the turn ends and the call ends before the
    response task ever runs."""
    line = PhoneLine()
    call = Call(line, ScriptedSTT(["goodbye"]), ScriptedLLM(["never asked"]))
    pcm = utterance("Goodbye then")

    async def caller(line: PhoneLine) -> AsyncIterator[InboundEvent]:
        arrived = time.monotonic() - len(pcm) / SAMPLE_RATE
        for index, frame in enumerate(frames(pcm)):
            yield AudioIn(frame, arrived + (index + 1) * 0.02)
        yield call.hang_up()

    line.script = caller
    [record] = await call.run()
    unheard(record)
    assert record.caller_text == "goodbye"
    assert call.history() == [("user", "goodbye")]


async def test_words_carried_over_are_recorded_when_no_next_turn_comes() -> None:
    line = PhoneLine()
    stt = ScriptedSTT(["book me in", "for friday"])
    call = Call(line, stt, ScriptedLLM(["never heard"], [5.0]))

    async def caller(line: PhoneLine) -> AsyncIterator[InboundEvent]:
        async for event in speak(utterance("Book me in")):
            yield event
        # The caller goes on talking while the LLM thinks (the reply is cut off unheard, its
        # words carried over to the next turn), then hangs up before that turn ends.
        async for event in speak(utterance("for Friday")):
            yield event
            if call.conversation.barge_ins:
                break
        yield call.hang_up()

    line.script = caller
    [record] = await call.run()
    unheard(record)
    assert record.caller_text == "book me in" and record.generated_text == ""
    assert call.llm.streams[0].closed
    assert len(stt.called_at) == 1
    assert call.history() == [("user", "book me in")]


async def test_carried_words_and_a_turn_in_transcription_each_leave_one_record() -> None:
    line = PhoneLine()
    stt = PacedSTT(["book me in", "for friday"], delays_s=[0.05, 1.0])
    call = Call(line, stt, ScriptedLLM(["never heard"], [5.0]))

    async def caller(line: PhoneLine) -> AsyncIterator[InboundEvent]:
        async for event in speak(utterance("Book me in")):
            yield event
        async for event in speak(utterance("for Friday")):
            yield event
        assert call.conversation.barge_ins and len(stt.called_at) == 2
        yield call.hang_up()

    line.script = caller
    first, second = await call.run()
    unheard(first)
    unheard(second)
    assert [first.turn, second.turn] == [1, 2]
    assert [first.caller_text, second.caller_text] == ["book me in", "for friday"]
    assert len(call.llm.requests) == 1
    assert call.history() == [("user", "book me in"), ("user", "for friday")]


async def test_a_transcription_that_never_ends_does_not_hold_up_the_hang_up() -> None:
    line = PhoneLine()
    stt = ScriptedSTT(["lost words"], delay_s=60.0)
    call = Call(line, stt, ScriptedLLM([]), hang_up_stt_s=0.2)

    async def caller(line: PhoneLine) -> AsyncIterator[InboundEvent]:
        async for event in speak(utterance("Are you there")):
            yield event
        yield call.hang_up()

    line.script = caller
    assert await call.run(capped=True) == []
    assert call.ended_at < stt.called_at[0] + stt.delay_s  # the transcription was given up
    assert call.history() == []

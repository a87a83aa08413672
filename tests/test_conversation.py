"""The per-call loop on scripted timelines.

The caller's audio is real speech through the real turn detector; STT, LLM and TTS are fakes
(tests/support/conversation.py) that keep the real ones' timing shape (a transcription delay, a
time to first token and a token rate, synthesis that returns audio proportional to the words);
the line plays queued audio in real time, as a phone line does.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Sequence

from pipeline.conversation import Conversation
from pipeline.conversation_settings import ConversationSettings
from pipeline.llm.client import ChatMessage
from pipeline.llm.errors import LLMError
from pipeline.records import TurnRecord
from pipeline.replies import heard_text
from pipeline.scheduling import Urgency
from pipeline.transport import (
    PCM,
    SAMPLE_RATE,
    Dtmf,
    HangUp,
    InboundEvent,
)
from tests.support.conversation import (
    PhoneLine,
    ScriptedLLM,
    ScriptedReply,
    ScriptedSTT,
    ToneTTS,
    speak,
    utterance,
)
from tests.support.speech import silence


async def test_a_turn_is_answered_and_timed_in_order() -> None:
    line = PhoneLine()
    llm = ScriptedLLM(["Sure. A table for two at seven."])
    stt = ScriptedSTT(["table for two"], delay_s=0.2)
    # The classic timeline: the reply starts at the endpoint (speculation is tested below).
    quiet = ConversationSettings(speculate=False)
    conversation = Conversation("c1", line, stt=stt, llm=llm, tts=ToneTTS(), settings=quiet)

    async def caller(line: PhoneLine) -> AsyncIterator[InboundEvent]:
        async for event in speak(utterance("A table for two at seven please")):
            yield event
        await line.reached(line.queued_samples)  # hear the whole reply
        async for event in speak(silence(300)):
            yield event
        yield HangUp("caller hung up")

    line.script = caller
    await conversation.run()

    [record] = conversation.records
    assert record.caller_text == "table for two"
    # Transcription (200 ms here) began at the caller's pause, so it was ready at the endpoint.
    assert len(stt.called_at) == 1
    # Begun at the endpoint, it would have finished at least the STT's 200 ms after it.
    assert record.timings_ms["stt"] - record.timings_ms["endpoint"] < stt.delay_s * 1e3
    assert record.reply_text == "Sure. A table for two at seven."
    assert not record.interrupted
    stages = list(record.timings_ms)
    assert stages == [
        "endpoint",
        "stt",
        "llm_first_token",
        "first_sentence",
        "tts_first_chunk",
        "first_audio",
    ]
    values = list(record.timings_ms.values())
    assert values == sorted(values), record.timings_ms
    print(f"\ntimeline (ms since end of speech): {record.timings_ms}")
    assert [m.content for m in conversation.history] == ["table for two", record.reply_text]
    assert llm.requests[0][-1].content == "table for two"
    assert [e["role"] for e in line.events if e["type"] == "transcript"] == ["caller", "bot"]
    # the reply stream learned the turn's timings, and its decision went into the record
    assert llm.streams[0].finished_with == record.timings_ms
    assert record.decision is not None and record.reason == "scripted"
    assert record.budget_ms == 1000.0
    assert (record.service_tier_requested, record.service_tier_served) == ("priority", "default")
    decision = json.loads(json.dumps(record.to_dict()))["decision"]  # as the calls API serves it
    assert (decision["taken"], decision["tier"], decision["attempts"]) == ("planned", "fast", [])


async def test_barge_in_clears_the_line_closes_the_stream_and_keeps_what_was_heard() -> None:
    line = PhoneLine()
    reply = "One two three four five six seven eight. Nine ten eleven twelve thirteen fourteen."
    llm = ScriptedLLM([reply, "Okay."])
    stt = ScriptedSTT(["first question", "stop"])
    conversation = Conversation("c2", line, stt=stt, llm=llm, tts=ToneTTS())
    cut_in_at: list[int] = []

    async def caller(line: PhoneLine) -> AsyncIterator[InboundEvent]:
        async for event in speak(utterance("Tell me a long story")):
            yield event
        # Cut in after about three words (250 ms each) of the reply.
        await line.reached(int(0.75 * SAMPLE_RATE))
        cut_in_at.append(line.played_samples)
        async for event in speak(utterance("Stop")):
            yield event
        await line.reached(line.queued_samples)
        yield HangUp("done")

    line.script = caller
    await conversation.run()

    first, second = conversation.records
    assert first.interrupted and line.clears == 1
    assert llm.streams[0].closed
    heard = first.reply_text.rstrip(" —").split()
    print(f"\nheard before barge-in: {first.reply_text!r}")
    # Words heard: at least the three played before the caller spoke, never the whole reply.
    assert 3 <= len(heard) < len(reply.split())
    assert heard == reply.split()[: len(heard)]
    assert conversation.history[1].content == first.reply_text
    assert second.caller_text == "stop" and second.reply_text == "Okay."
    assert len(conversation.barge_ins) == 1


async def test_synthesis_follows_playback_at_most_two_sentences_ahead() -> None:
    line = PhoneLine()
    backlog: list[int] = []  # reply samples queued but not yet played, at each synthesis

    class WatchedTTS(ToneTTS):
        async def synthesize(self, text: str, urgent: bool | Urgency = False) -> PCM:
            if text in reply:  # not the voice's gap filler, made once ahead of need
                backlog.append(line.queued_samples - line.played_samples)
            return await super().synthesize(text, urgent)

    reply = "One two. Three four. Five six. Seven eight. Nine ten. Eleven twelve."
    answered = asyncio.Event()
    conversation = Conversation(
        "c5",
        line,
        stt=ScriptedSTT(["go"]),
        llm=ScriptedLLM([reply]),
        tts=WatchedTTS(),
        on_turn=lambda record: answered.set(),
    )

    async def caller(line: PhoneLine) -> AsyncIterator[InboundEvent]:
        async for event in speak(utterance("Count for me")):
            yield event
        await answered.wait()  # the whole reply played
        yield HangUp("done")

    line.script = caller
    await conversation.run()

    [record] = conversation.records
    assert record.reply_text == reply and len(backlog) == 6
    sentence = int(0.5 * SAMPLE_RATE)  # two words of tone
    # Sentence n is synthesized once sentence n-2 has played: at most one sentence is waiting
    # (without the rule, all six would be synthesized at once, with up to five waiting).
    assert max(backlog) <= sentence + 0.05 * SAMPLE_RATE, backlog
    assert backlog[2:] == [b for b in backlog[2:] if b > 0]  # the next one was still playing


async def test_words_cut_off_before_any_audio_are_answered_with_the_next_turn() -> None:
    line = PhoneLine()
    llm = ScriptedLLM(["never heard", "Booked for Friday."], ttft_s=[5.0, 0.1])
    stt = ScriptedSTT(["book me in", "for friday"])
    answered = asyncio.Event()
    conversation = Conversation(
        "c3", line, stt=stt, llm=llm, tts=ToneTTS(), on_turn=lambda record: answered.set()
    )

    async def caller(line: PhoneLine) -> AsyncIterator[InboundEvent]:
        async for event in speak(utterance("Book me in")):
            yield event
        # The caller goes on talking while the LLM is still thinking about the first part.
        async for event in speak(utterance("for Friday")):
            yield event
        await answered.wait()
        yield HangUp("done")

    line.script = caller
    await conversation.run()

    assert llm.streams[0].closed and llm.streams[0].first_token_at is None
    [record] = conversation.records
    assert record.caller_text == "book me in for friday"
    assert record.reply_text == "Booked for Friday."
    assert [m.content for m in conversation.history] == [record.caller_text, record.reply_text]


def test_heard_text_cuts_the_sentence_playing_at_the_played_share() -> None:
    from pipeline.replies import Spoken

    spoken = [Spoken("One two three.", 0, 300), Spoken("Four five six seven.", 300, 700)]
    assert heard_text(spoken, 0) == ""
    assert heard_text(spoken, 300) == "One two three."
    assert heard_text(spoken, 500) == "One two three. Four five —"
    assert heard_text(spoken, 700) == "One two three. Four five six seven."


async def test_keypad_digits_become_one_turn_and_a_handler_can_take_a_key() -> None:
    line = PhoneLine()
    llm = ScriptedLLM(["Order one two three is on its way."])
    answered = asyncio.Event()
    handled: list[str] = []

    def on_key(digit: str) -> bool:
        if digit == "0":
            handled.append(digit)
            return True
        return False

    conversation = Conversation(
        "c4",
        line,
        stt=ScriptedSTT([]),
        llm=llm,
        tts=ToneTTS(),
        on_turn=lambda record: answered.set(),
        on_key=on_key,
    )

    async def caller(line: PhoneLine) -> AsyncIterator[InboundEvent]:
        for digit in "0123#":
            yield Dtmf(digit, time.monotonic())
        await answered.wait()
        yield HangUp("done")

    line.script = caller
    await conversation.run()

    assert handled == ["0"]
    [record] = conversation.records
    assert record.caller_text == "(The caller pressed 1 2 3 on the keypad.)"
    assert record.reply_text == "Order one two three is on its way."
    assert llm.requests[0][-1].content == record.caller_text
    assert [e["digit"] for e in line.events if e["type"] == "dtmf"] == list("0123#")


async def keypad_turn(llm: ScriptedLLM, **settings: object) -> TurnRecord:
    """One keypad turn ("1#") answered by `llm`; its record."""
    line = PhoneLine()
    answered = asyncio.Event()
    conversation = Conversation(
        "keys",
        line,
        stt=ScriptedSTT([]),
        llm=llm,
        tts=ToneTTS(),
        settings=ConversationSettings.model_validate(settings),
        on_turn=lambda record: answered.set(),
    )

    async def caller(line: PhoneLine) -> AsyncIterator[InboundEvent]:
        for digit in "1#":
            yield Dtmf(digit, time.monotonic())
        await answered.wait()
        yield HangUp("done")

    line.script = caller
    await conversation.run()
    [record] = conversation.records
    return record


async def test_a_filler_is_spoken_before_a_late_reply() -> None:
    llm = ScriptedLLM(["Here is your order."], ttft_s=[0.3])
    original = llm.reply

    def with_filler(history: Sequence[ChatMessage], zero: float) -> ScriptedReply:
        reply = original(history, zero)
        reply.filler = "One moment."
        return reply

    llm.reply = with_filler  # type: ignore[method-assign]
    record = await keypad_turn(llm)
    assert record.reply_text == "One moment. Here is your order."
    # the filler's audio went out before the first LLM token came
    assert record.timings_ms["first_audio"] < record.timings_ms["llm_first_token"]


async def test_when_no_tier_answers_the_caller_hears_an_apology() -> None:
    llm = ScriptedLLM(["never spoken"])
    original = llm.reply

    def failing(history: Sequence[ChatMessage], zero: float) -> ScriptedReply:
        reply = original(history, zero)
        reply.failure = LLMError(503, "every tier failed (fast, standard)")
        return reply

    llm.reply = failing  # type: ignore[method-assign]
    record = await keypad_turn(llm, apology="Sorry, please try again.")
    assert record.reply_text == "Sorry, please try again."
    assert "never" not in record.generated_text and not record.interrupted

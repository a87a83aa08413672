"""A reply's gaps: the line running dry between two of its sentences, as the server sees it.

The caller's audio is real speech through the real turn detector; the STT, LLM and voice are
the timed fakes of tests/support/conversation.py, and the line plays in real time. A gap is
made by holding a sentence back until the line has played everything queued before it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
from prometheus_client import REGISTRY

from pipeline.conversation import Conversation
from pipeline.conversation_settings import ConversationSettings
from pipeline.records import TurnRecord
from pipeline.scheduling import Urgency
from pipeline.speaking import GAP_MS, Speaker, make_filler
from pipeline.transport import PCM, SAMPLE_RATE, HangUp, InboundEvent
from pipeline.tts import AUDIBLE, TextToSpeech
from tests.support.conversation import (
    PhoneLine,
    ScriptedLLM,
    ScriptedSTT,
    ToneTTS,
    speak,
    utterance,
)
from voice.server.metrics import observe_turn

REPLY = "One two three. Four five six. Seven eight nine."
LATE_S = 0.6  # how long the late sentence's synthesis goes on after the line ran dry
SILENT = ConversationSettings(gap_filler="")  # a dry line stays silent


async def call(
    llm: ScriptedLLM,
    tts: LateVoice,
    turns: int = 1,
    settings: ConversationSettings | None = None,
) -> list[TurnRecord]:
    """`turns` caller turns, each heard out to the end of its reply; the records."""
    line = PhoneLine()
    answered = asyncio.Queue[TurnRecord]()
    conversation = Conversation(
        "gaps",
        line,
        stt=ScriptedSTT([f"question {n}" for n in range(turns)]),
        llm=llm,
        tts=tts,
        settings=settings,
        on_turn=answered.put_nowait,
    )
    tts.conversation = conversation

    async def caller(line: PhoneLine) -> AsyncIterator[InboundEvent]:
        for _ in range(turns):
            async for event in speak(utterance("Tell me the numbers")):
                yield event
            await answered.get()  # the whole reply played
        yield HangUp("done")

    line.script = caller
    tts.line = line
    await conversation.run()
    return conversation.records


class LateVoice(ToneTTS):
    """Synthesizes the sentence that starts with `late` only once the line has played all that
    was queued before it, and `LATE_S` after that."""

    def __init__(self, late: str | None = None) -> None:
        self.late = late
        self.line: PhoneLine | None = None
        self.conversation: Conversation | None = None
        self.said: list[str] = []

    async def synthesize(self, text: str, urgent: bool | Urgency = False) -> PCM:
        self.said.append(text)
        if self.late is not None and text.startswith(self.late) and self.line is not None:
            await self.line.reached(self.line.queued_samples)
            await asyncio.sleep(LATE_S)  # the synthesis itself, slow under load
        return await super().synthesize(text, urgent)


async def test_a_sentence_synthesized_after_the_line_ran_dry_is_a_synthesis_gap() -> None:
    [record] = await call(ScriptedLLM([REPLY]), LateVoice(late="Seven"), settings=SILENT)
    assert record.reply_text == REPLY and not record.interrupted
    [gap] = record.reply_gaps
    # Its words had come long before; its audio came LATE_S after the line had gone quiet.
    assert gap["waited_on"] == "synthesis"
    assert isinstance(gap["ms"], float) and gap["ms"] >= LATE_S * 1e3 - 1, gap
    assert record.to_dict()["reply_gaps"] == [gap]  # as the calls API serves it
    assert record.reply_fillers == 0


async def test_the_voice_hesitates_where_a_sentence_is_late_for_its_audio() -> None:
    voice = LateVoice(late="Seven")
    first, record = await call(ScriptedLLM([REPLY, REPLY]), voice, turns=2)
    # Not made ahead (the server makes it at startup): the voice's first gap makes it.
    assert first.reply_fillers == 0 and voice.said.count("Um,") == 1
    assert record.reply_fillers == 1
    # The caller heard "Um," (a quarter second of this voice) where the line ran dry, and the
    # silence after it; the text and the history hold only the reply.
    assert record.reply_text == REPLY and not record.interrupted
    assert voice.conversation is not None
    assert [m.content for m in voice.conversation.history][2:] == ["question 1", REPLY]
    [gap] = record.reply_gaps
    assert gap["waited_on"] == "synthesis"
    assert isinstance(gap["ms"], float) and gap["ms"] >= (LATE_S - 0.25) * 1e3 - 1, gap


async def test_a_voice_that_cannot_say_the_filler_leaves_the_gap_silent() -> None:
    class NoFiller(LateVoice):
        async def synthesize(self, text: str, urgent: bool | Urgency = False) -> PCM:
            if text == "Um,":
                raise RuntimeError("the voice failed")
            return await super().synthesize(text, urgent)

    records = await call(ScriptedLLM([REPLY, REPLY]), NoFiller(late="Seven"), turns=2)
    assert [(r.reply_text, r.interrupted) for r in records] == [(REPLY, False)] * 2
    assert [r.reply_fillers for r in records] == [0, 0]
    assert [[gap["waited_on"] for gap in r.reply_gaps] for r in records] == [["synthesis"]] * 2


async def test_words_that_came_after_the_line_ran_dry_are_a_text_gap() -> None:
    # Four words a second: the first sentence plays out (0.75 s) long before the next one's
    # nine words have come.
    reply = "One two three. Four five six seven eight nine ten eleven twelve."
    [record] = await call(ScriptedLLM([reply], tokens_per_s=4), LateVoice())
    assert record.reply_text == reply
    assert record.reply_gaps, "the line went quiet for about 1.5 s between the sentences"
    assert {gap["waited_on"] for gap in record.reply_gaps} == {"text"}, record.reply_gaps
    assert record.reply_fillers == 0  # no words to come were known: nothing to hold the line for


async def test_sentences_in_time_leave_no_gap_nor_does_the_pause_between_two_replies() -> None:
    # Each sentence is synthesized while the one before it plays. The second reply's first
    # sentence comes seconds after the first reply ended (the caller's turn): not a gap.
    records = await call(ScriptedLLM([REPLY, REPLY]), LateVoice(), turns=2)
    assert [r.reply_text for r in records] == [REPLY, REPLY]
    assert [r.reply_gaps for r in records] == [[], []]
    assert [r.reply_fillers for r in records] == [0, 0]


def test_the_gaps_are_counted_by_what_they_waited_on() -> None:
    def count(waited_on: str) -> float:
        labels = {"waited_on": waited_on}
        return REGISTRY.get_sample_value("hotline_reply_gaps_seconds_count", labels) or 0.0

    before = {cause: count(cause) for cause in ("synthesis", "text", "loop")}
    record = TurnRecord(1, "hi", "hello", "hello", False, None, None, None, "")
    record.reply_gaps = [
        {"ms": 2 * GAP_MS, "waited_on": "synthesis"},
        {"ms": 3 * GAP_MS, "waited_on": "synthesis"},
        {"ms": 4 * GAP_MS, "waited_on": "text"},
    ]
    observe_turn(record)
    after = {cause: count(cause) - before[cause] for cause in before}
    assert after == {"synthesis": 2, "text": 1, "loop": 0}


def test_the_bundled_voices_filler_is_made_ahead_cut_to_its_audible_part() -> None:
    """What the server does at startup: "Um," from the bundled voice, without the comma's
    pause piper ends it with, ready before any call needs it."""
    voice = TextToSpeech.shared()
    make_filler(voice, "Um,")
    speaker = Speaker(PhoneLine(), voice, ConversationSettings())
    filler = speaker._filler()  # made: no synthesis is started for it
    assert filler is not None and not speaker._making
    spoken = voice.synthesize_blocking("Um,")
    assert 0.1 * SAMPLE_RATE < filler.size < 0.9 * len(spoken) / voice.sample_rate * SAMPLE_RATE
    audible = np.flatnonzero(np.abs(filler.astype(np.int32)) >= AUDIBLE)
    assert audible[0] < 0.02 * SAMPLE_RATE  # it starts at once
    assert filler.size - audible[-1] < 0.06 * SAMPLE_RATE  # and ends with its sound

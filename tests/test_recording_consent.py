"""Recording consent (issue 25, item 8): a recording notice cut short is said again in full, at
the start of the reply, before recording starts; cut short on every try, the call is not
recorded; an "mm-hm" over it leaves it heard in full.

In-process calls as in `tests/test_barge_in_backchannel.py`: the caller's real speech (piper)
through the real turn detector and barge-in, on a phone line that plays in real time; the LLM
and the TTS are scripted (250 ms of tone a word), and so is the STT: it always hears the same
words, however many times the caller's pauses ask it (speech over a reply longer than 1.3 s is
an interruption by its duration alone). The server starts recording on `notice_played` with
`heard_in_full` (voice/server/calls.py), so each test reads when that event came: how far the
line had played then. The caller's clips have no internal pause and end in silence, and the
script waits on the line's played position, never on the clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import pytest

from pipeline.conversation import Conversation
from pipeline.conversation_settings import ConversationSettings
from pipeline.scheduling import Urgency
from pipeline.stt import Transcript
from pipeline.transport import PCM, SAMPLE_RATE, HangUp, InboundEvent
from tests.support.conversation import PhoneLine, ScriptedLLM, ToneTTS, speak
from tests.support.poll import until
from tests.support.speech import concat, silence
from tests.support.speech import utterance as spoken
from voice.server.call_records import Call as CallOnRecord

pytestmark = pytest.mark.slow  # real-time calls with the real turn detector

NOTICE = "This call is recorded for quality and training purposes."  # 9 words: 2.25 s
GREETING = "Welcome to the shop."
ANSWER = "Sure, I can help you with your order today."  # 9 words: 2.25 s after the notice
OVER_NOTICE = "I would like to ask about my order"  # about 2 s of piper, no pause inside
CUT_IN_S = 0.3  # the caller's clip starts once this much of the notice's latest saying played


class Hears:
    """Speech recognition that hears `text` in any audio, after `delay_s`."""

    def __init__(self, text: str, delay_s: float = 0.1) -> None:
        self.text = text
        self.delay_s = delay_s

    busy = False  # never queueing

    async def transcribe(self, audio: PCM, urgent: bool | Urgency = True) -> Transcript:
        await asyncio.sleep(self.delay_s)
        return Transcript(self.text, len(audio) / SAMPLE_RATE, self.delay_s)


class Line(PhoneLine):
    """The phone line, noting where each chunk of reply audio lies and where each clear cut."""

    def __init__(self) -> None:
        super().__init__()
        self.plays: list[tuple[int, int]] = []  # (start, end) on the outbound clock
        self.cuts: list[int] = []  # the played position at each clear

    def play(self, pcm: PCM) -> int:
        start = self.queued_samples
        end = super().play(pcm)
        self.plays.append((start, end))
        return end

    async def clear(self) -> None:
        self.cuts.append(self.played_samples)
        await super().clear()

    def plays_after(self, position: int) -> list[tuple[int, int]]:
        return [play for play in self.plays if play[0] >= position]


@dataclass
class Call:
    conversation: Conversation
    line: Line
    notices: list[tuple[dict[str, object], int]] = field(default_factory=list)  # (event, played)


async def call_with(
    over_notice: Sequence[str], hears: str, turns: int, interrupts: bool = True
) -> Call:
    """A call with the notice and a greeting: each of `over_notice` said into the notice's
    latest saying once CUT_IN_S of it has played (the first notice, then the reply that says
    it again), and, if it `interrupts`, the line cut for it; then silence until `turns` turns
    are over and the line is quiet."""
    # made before the call: piper would hold up the event loop while the notice plays
    clips = [concat(spoken(words, "piper"), silence(700)) for words in over_notice]
    line = Line()
    llm = ScriptedLLM([ANSWER] * 8)  # speculative replies ask too: as many as they like
    notices: list[tuple[dict[str, object], int]] = []

    def on_event(event: dict[str, object]) -> None:
        if event["type"] == "notice_played":
            notices.append((event, line.played_samples))

    conversation = Conversation(
        "consent",
        line,
        stt=Hears(hears),
        llm=llm,
        tts=ToneTTS(),
        on_event=on_event,
        settings=ConversationSettings(greeting=GREETING),
        notice=NOTICE,
    )
    call = Call(conversation, line, notices)

    async def caller(line: PhoneLine) -> AsyncIterator[InboundEvent]:
        async for event in speak(silence(100)):
            yield event
        for index, clip in enumerate(clips):
            start = call.line.cuts[-1] if index else 0  # its latest saying starts there
            await until(lambda at=start: line.queued_samples > at, "the notice said", 10)
            await line.reached(start + int(CUT_IN_S * SAMPLE_RATE))
            async for event in speak(clip):
                yield event
            if interrupts:
                await until(lambda n=index: len(call.line.cuts) > n, "the notice cut short", 10)
        await until(
            lambda: (
                len(conversation.records) >= turns
                and conversation.history
                and conversation.history[-1].content.endswith(ANSWER if turns else GREETING)
                and line.played_samples >= line.queued_samples
            ),
            f"{turns} turns over and heard",
            20,
            describe=lambda: (notices, [m.content for m in conversation.history]),
        )
        yield HangUp("done")

    line.script = caller
    await conversation.run()
    return call


async def test_a_notice_talked_over_is_said_again_in_full_before_the_answer() -> None:
    call = await call_with([OVER_NOTICE], OVER_NOTICE, turns=1)
    conversation, line = call.conversation, call.line
    [(event, played_at)] = call.notices
    assert event == {
        "type": "notice_played",
        "heard_in_full": True,
        "attempts": 2,
        "cut_short": 1,
        "reason": None,
    }
    # The reply to the caller's turn began with the notice, all of it (the same audio as the
    # first saying), and the event came once playback passed its last sample, before the
    # answer after it had played.
    [cut] = line.cuts
    first = line.plays[0]
    notice_again, answer = line.plays_after(cut)[:2]
    assert notice_again[1] - notice_again[0] == first[1] - first[0]
    assert notice_again[1] <= played_at < answer[1], (notice_again, played_at, answer)
    # What the caller heard: part of the notice (no greeting: they were talking), then their
    # words answered by the notice in full and the answer.
    [record] = conversation.records
    assert record.reply_text == f"{NOTICE} {ANSWER}" and not record.interrupted
    heard_first, said, reply = (m.content for m in conversation.history)
    assert heard_first.endswith(" —") and NOTICE.startswith(heard_first.removesuffix(" —"))
    assert (said, reply) == (OVER_NOTICE, record.reply_text)
    state = conversation.notice.state()
    assert state == {"heard_in_full": True, "attempts": 2, "cut_short": 1, "reason": None}
    detail = CallOnRecord("consent", "phone", conversation).detail()
    assert detail["notice"] == {**state, "recording": False}  # no recorder in this test


async def test_a_caller_who_talks_over_every_try_is_not_recorded() -> None:
    call = await call_with([OVER_NOTICE, OVER_NOTICE], OVER_NOTICE, turns=2)
    conversation, line = call.conversation, call.line
    outcome = {
        "heard_in_full": False,
        "attempts": 2,
        "cut_short": 2,
        "reason": "cut short 2 times",
    }
    assert [event for event, _ in call.notices] == [{"type": "notice_played", **outcome}]
    assert conversation.notice.state() == outcome and len(line.cuts) == 2
    # The first reply said the notice again and was cut in it; the second is the answer
    # alone: the notice is not said a third time.
    first, second = conversation.records
    assert first.interrupted and NOTICE.startswith(first.reply_text.removesuffix(" —"))
    assert first.reply_text != NOTICE
    assert second.reply_text == ANSWER and not second.interrupted
    assert all(NOTICE not in m.content for m in conversation.history)
    detail = CallOnRecord("consent", "phone", conversation).detail()
    assert detail["notice"] == {**outcome, "recording": False}


async def test_an_mm_hm_over_the_notice_leaves_it_heard_in_full() -> None:
    """A backchannel pauses the notice, and it plays on from there to its end: heard the first
    time, recording starts once."""
    call = await call_with(["Mm hmm."], "Mm-hmm.", turns=0, interrupts=False)
    conversation, line = call.conversation, call.line
    assert line.pauses and line.resumes == 1 and line.cuts == []
    [(event, played_at)] = call.notices
    assert event == {
        "type": "notice_played",
        "heard_in_full": True,
        "attempts": 1,
        "cut_short": 0,
        "reason": None,
    }
    notice, greeting = line.plays
    assert notice[1] <= played_at < greeting[1]
    assert [m.content for m in conversation.history] == [NOTICE, GREETING]

"""The recording notice's bookkeeping (`pipeline.opening.Notice`): heard in full, cut short and
said again, given up after its tries, a speculative try that does not count, its audio made
once. On the real-time scripted phone line, with a notice of two short sentences."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np

from pipeline.conversation import Conversation
from pipeline.conversation_settings import ConversationSettings
from pipeline.opening import OPERATOR, Notice, NoticeVoice
from pipeline.replies import Spoken
from pipeline.scheduling import Urgency
from pipeline.speculation import Gate
from pipeline.transport import HangUp, InboundEvent
from tests.support.conversation import PhoneLine, ScriptedLLM, ScriptedSTT, ToneTTS, speak
from tests.support.poll import until
from tests.support.speech import silence
from voice.server.call_records import Call as CallOnRecord

NOTICE = "This call is recorded. Thank you."
TONE = np.full(640, 3000, np.int16)  # 40 ms a sentence


class Said:
    """One response speaking onto the line, as `Conversation._speak` queues sentences."""

    def __init__(self, line: PhoneLine) -> None:
        self.line = line
        self.spoken: list[Spoken] = []

    async def speak(self, sentence: str) -> None:
        start = self.line.queued_samples
        self.spoken.append(Spoken(sentence, start, self.line.play(TONE)))


def notice_on(line: PhoneLine, attempts: int = 2) -> tuple[Notice, list[dict[str, object]]]:
    events: list[dict[str, object]] = []
    return Notice("unit", NOTICE, line, events.append, attempts), events


async def test_a_notice_played_to_its_last_sample_is_heard_in_full_once() -> None:
    line = PhoneLine()
    notice, events = notice_on(line)
    said = Said(line)
    [watcher] = await notice.say(said.speak, said.spoken, None)
    assert [s.text for s in said.spoken] == ["This call is recorded.", "Thank you."]
    assert events == [] and notice.owed  # queued, not yet played
    await watcher
    assert line.played_samples >= said.spoken[-1].end
    assert events == [
        {
            "type": "notice_played",
            "heard_in_full": True,
            "attempts": 1,
            "cut_short": 0,
            "reason": None,
        }
    ]
    notice.stopped(said.spoken)  # the response ends: settled already, nothing more
    assert len(events) == 1 and not notice.owed
    again = Said(line)
    assert await notice.say(again.speak, again.spoken, None) == [] and again.spoken == []


async def test_a_notice_cut_short_is_owed_and_said_again_in_full() -> None:
    line = PhoneLine()
    notice, events = notice_on(line)
    first = Said(line)
    [watcher] = await notice.say(first.speak, first.spoken, None)
    await line.reached(first.spoken[0].end)  # the first sentence heard, then the caller cut in
    await line.clear()
    await asyncio.wait({watcher})
    notice.stopped(first.spoken)
    assert events == [] and notice.owed
    assert notice.state() == {
        "heard_in_full": False,
        "attempts": 1,
        "cut_short": 1,
        "reason": "cut short, not yet said again",
    }
    second = Said(line)
    [watcher] = await notice.say(second.speak, second.spoken, None)
    assert [s.text for s in second.spoken] == ["This call is recorded.", "Thank you."]
    await watcher
    assert events == [
        {
            "type": "notice_played",
            "heard_in_full": True,
            "attempts": 2,
            "cut_short": 1,
            "reason": None,
        }
    ]


async def test_a_notice_cut_short_every_try_is_given_up() -> None:
    line = PhoneLine()
    notice, events = notice_on(line, attempts=2)
    for _ in range(2):
        said = Said(line)
        watchers = await notice.say(said.speak, said.spoken, None)
        await line.clear()  # at once: not a sample of it heard
        for watcher in watchers:
            watcher.cancel()
        notice.stopped(said.spoken)
    outcome = {
        "heard_in_full": False,
        "attempts": 2,
        "cut_short": 2,
        "reason": "cut short 2 times",
    }
    assert events == [{"type": "notice_played", **outcome}]
    assert notice.state() == outcome and not notice.owed
    third = Said(line)
    assert await notice.say(third.speak, third.spoken, None) == [] and third.spoken == []


async def test_a_response_ending_as_the_notice_ends_settles_it_as_heard() -> None:
    """The response's own end can come before its watcher wakes: the played position decides."""
    line = PhoneLine()
    notice, events = notice_on(line)
    said = Said(line)
    [watcher] = await notice.say(said.speak, said.spoken, None)
    await line.wait_played(said.spoken[-1].end)
    watcher.cancel()
    notice.stopped(said.spoken)
    assert [e["heard_in_full"] for e in events] == [True] and not notice.owed


async def test_a_speculative_try_thrown_away_does_not_count() -> None:
    line = PhoneLine()
    notice, events = notice_on(line, attempts=1)
    gate = Gate()
    held = Said(line)
    await notice.say(held.speak, held.spoken, gate)
    gate.discard()
    notice.stopped(held.spoken)
    assert events == [] and notice.owed and notice.said == 0
    # A try whose gate opened counts: cut short, the one try is spent.
    gate = Gate()
    taken = Said(line)
    await notice.say(taken.speak, taken.spoken, gate)
    gate.open()
    await line.clear()
    notice.stopped(taken.spoken)
    assert [e["reason"] for e in events] == ["cut short 1 time"] and not notice.owed


async def test_a_new_response_settles_the_try_of_the_one_it_replaces() -> None:
    """The old response is being cancelled; its `stopped` may come after the new one began."""
    line = PhoneLine()
    notice, events = notice_on(line, attempts=3)
    old = Said(line)
    await notice.say(old.speak, old.spoken, None)
    await line.clear()
    new = Said(line)
    [watcher] = await notice.say(new.speak, new.spoken, None)
    notice.stopped(old.spoken)  # late: already settled, as cut short
    assert notice.cut_short == 1 and notice.owed
    await watcher
    assert events[-1]["attempts"] == 2 and events[-1]["heard_in_full"] is True


class CountingTTS(ToneTTS):
    def __init__(self) -> None:
        self.texts: list[str] = []

    async def synthesize(self, text: str, urgent: bool | Urgency = False) -> np.ndarray:
        self.texts.append(text)
        return await super().synthesize(text, urgent)


async def test_the_notice_is_synthesised_once_per_call() -> None:
    tts = CountingTTS()
    notice, _ = notice_on(PhoneLine())
    voice = notice.voice(tts)
    assert isinstance(voice, NoticeVoice) and voice.sample_rate == tts.sample_rate
    first = await voice.synthesize("Thank you.")
    again = await voice.synthesize("Thank you.")
    await voice.synthesize("Sure.")
    await voice.synthesize("Sure.")
    assert np.array_equal(first, again)
    assert tts.texts == ["Thank you.", "Sure.", "Sure."]  # replies are not the notice's


async def test_a_call_without_a_notice_owes_none() -> None:
    tts = ToneTTS()
    notice = Notice("unit", None, PhoneLine(), lambda event: None)
    said = Said(PhoneLine())
    assert not notice.owed and notice.state() is None and notice.voice(tts) is tts
    assert await notice.say(said.speak, said.spoken, None) == [] and said.spoken == []


async def test_the_greeting_and_an_operator_message_keep_who_said_them() -> None:
    """Fixed texts are heard as the bot's voice, but the history, the calls API and the call's
    watchers (the console) keep who said them: an announcement, an operator."""
    line, greeting, message = PhoneLine(), "Welcome to the shop.", "A supervisor is listening."
    settings = ConversationSettings(greeting=greeting)
    stt, llm = ScriptedSTT([]), ScriptedLLM([])
    conversation = Conversation("said", line, stt=stt, llm=llm, tts=ToneTTS(), settings=settings)

    async def caller(line: PhoneLine) -> AsyncIterator[InboundEvent]:
        async for event in speak(silence(100)):
            yield event
        await until(lambda: conversation.history, "the greeting heard", 10)
        await conversation.say(message, source=OPERATOR)
        await until(lambda: len(conversation.history) == 2, "the operator heard", 10)
        yield HangUp("done")

    line.script = caller
    await conversation.run()
    assert [(m.content, m.source) for m in conversation.history] == [
        (greeting, "announcement"),
        (message, "operator"),
    ]
    said = [e for e in line.events if e["type"] == "transcript"]
    assert [(e["source"], e["text"], e["after_turn"]) for e in said] == [
        ("announcement", greeting, 0),
        ("operator", message, 0),
    ]
    history = CallOnRecord("said", "phone", conversation).detail()["history"]
    assert history == [
        {"role": "assistant", "content": greeting, "source": "announcement"},
        {"role": "assistant", "content": message, "source": "operator"},
    ]

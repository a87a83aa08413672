"""Recording consent (issue 25, item 8): recording starts only once the notice was heard in full.

The in-process call of `tests/test_barge_in_backchannel.py`: the caller's real speech (piper)
through the real turn detector and barge-in, Whisper tiny.en transcribing, on a phone line that
plays in real time; LLM and TTS scripted (250 ms of tone a word). Recording starts on the
`notice_played` event (voice/server/calls.py), so each test reads when it came: how much of the
line had played then, and what the caller had heard of the notice.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import pytest

from pipeline.conversation import Conversation
from pipeline.conversation_settings import ConversationSettings
from pipeline.services import SpeechRecognizer
from pipeline.stt import SpeechToText
from pipeline.transport import SAMPLE_RATE, HangUp, InboundEvent
from tests.support.conversation import PhoneLine, ScriptedLLM, ScriptedSTT, ToneTTS, speak
from tests.support.poll import until
from tests.support.speech import concat, silence, words_in_order
from tests.support.speech import utterance as spoken
from voice.server.call_records import Call as CallOnRecord

pytestmark = pytest.mark.slow  # real-time calls with the real models

# 9 words, 2.25 s of tone: the caller's onset (CUT_IN_S + 300 ms of clip silence + the VAD's
# onset) falls well inside it, even on a loaded runner
NOTICE = "This call is recorded for quality and training purposes."
GREETING = "Welcome."
ANSWER = "Sure, which order?"
INTERRUPTION = "No, wait, it's about my order."
CUT_IN_S = 0.3  # the caller's clip begins once 0.3 s of the notice has played


@dataclass
class Call:
    conversation: Conversation
    line: PhoneLine
    llm: ScriptedLLM
    # (event, played samples then, queued samples then), for each notice event
    notices: list[tuple[dict[str, object], int, int]] = field(default_factory=list)

    def kinds(self) -> list[object]:
        return [event["type"] for event, _, _ in self.notices]


async def call_with(over_notice: Sequence[str], stt: SpeechRecognizer, turns: int) -> Call:
    """A call with a notice and a greeting: each of `over_notice` (piper) is said into the
    notice once CUT_IN_S of its latest saying has played; then silence until `turns` turns are
    over and the line is quiet, and the caller hangs up."""
    line = PhoneLine()
    llm = ScriptedLLM([ANSWER])
    call = Call(None, line, llm)  # type: ignore[arg-type]

    def on_event(event: dict[str, object]) -> None:
        if str(event.get("type", "")).startswith("notice_"):
            call.notices.append((event, line.played_samples, line.queued_samples))

    conversation = Conversation(
        "consent",
        line,
        stt=stt,
        llm=llm,
        tts=ToneTTS(),
        on_event=on_event,
        settings=ConversationSettings(greeting=GREETING),
        notice=NOTICE,
    )
    call.conversation = conversation

    async def caller(line: PhoneLine) -> AsyncIterator[InboundEvent]:
        async for event in speak(silence(100)):
            yield event
        for index, words in enumerate(over_notice):
            # The notice's latest saying starts where the line stood at the last cut.
            start = call.notices[-1][2] if index else 0
            await until(lambda at=start: line.queued_samples > at, "the notice said (again)", 10)
            await line.reached(start + int(CUT_IN_S * SAMPLE_RATE))
            async for event in speak(concat(spoken(words, "piper"), silence(700))):
                yield event
            await until(lambda n=index: len(call.notices) > n, "the notice cut short", 10)
        last = ANSWER if turns else GREETING
        await until(
            lambda: (
                len(conversation.records) >= turns
                and conversation.history
                and conversation.history[-1].content == last
                and line.played_samples >= line.queued_samples
            ),
            f"{turns} turns over, {last!r} heard",
            20,
            describe=lambda: (call.kinds(), [m.content for m in conversation.history]),
        )
        yield HangUp("done")

    line.script = caller
    await conversation.run()
    return call


def whisper() -> SpeechRecognizer:
    return SpeechToText.shared()


def samples(text: str) -> int:
    """The tone ToneTTS makes of `text`, at 16 kHz."""
    return len(text.split()) * int(0.25 * ToneTTS.sample_rate) * SAMPLE_RATE // ToneTTS.sample_rate


async def test_a_notice_talked_over_is_said_again_in_full_before_recording_starts() -> None:
    call = await call_with([INTERRUPTION], whisper(), turns=1)
    conversation, line = call.conversation, call.line
    assert call.kinds() == ["notice_cut", "notice_played"], call.notices
    cut, played = call.notices[0][0], call.notices[1][0]
    assert cut == {"type": "notice_cut", "attempts": 1, "final": False}
    assert played == {"type": "notice_played", "heard_in_full": True, "attempts": 2}
    # Recording started once the second saying had played to its end, not before: the line
    # had played all it had queued then, and that was the cut position plus the whole notice.
    _, played_at, queued_at = call.notices[1]
    cut_at = call.notices[0][2]
    assert played_at == queued_at
    assert abs(queued_at - (cut_at + samples(NOTICE))) <= 2 * line.FRAME, (cut_at, queued_at)
    # The history: the part heard, the notice in full, then the caller's words and the answer
    # (held until the notice was said; no greeting: the caller is already talking).
    history = [m.content for m in conversation.history]
    heard_first = history[0].removesuffix(" —")
    assert history[1] == NOTICE and NOTICE.startswith(heard_first) and heard_first != NOTICE
    [record] = conversation.records
    assert {"wait", "order"} <= set(words_in_order(record.caller_text)), record.caller_text
    assert history[2:] == [record.caller_text, ANSWER] and GREETING not in history
    assert conversation.opening.state() == {"heard_in_full": True, "attempts": 2, "cut_short": 1}
    detail = CallOnRecord("consent", "phone", conversation).detail()
    assert detail["notice"] == {**conversation.opening.state(), "recording": "on"}  # type: ignore[dict-item]


async def test_a_caller_who_talks_over_every_notice_is_not_recorded() -> None:
    call = await call_with([INTERRUPTION, "Hello? Can you hear me?"], whisper(), turns=1)
    conversation = call.conversation
    assert call.kinds() == ["notice_cut", "notice_cut"], call.notices
    assert [event for event, _, _ in call.notices] == [
        {"type": "notice_cut", "attempts": 1, "final": False},
        {"type": "notice_cut", "attempts": 2, "final": True},
    ]
    # Not said a third time: the caller's words (both times) are answered at once.
    [record] = conversation.records
    said = set(words_in_order(record.caller_text))
    assert {"wait", "order"} <= said and {"hear"} <= said, record.caller_text
    history = [m.content for m in conversation.history]
    assert NOTICE not in history and history[-2:] == [record.caller_text, ANSWER], history
    state = {"heard_in_full": False, "attempts": 2, "cut_short": 2}
    assert conversation.opening.state() == state
    detail = CallOnRecord("consent", "phone", conversation).detail()
    reason = "notice not heard in full"
    assert detail["notice"] == {**state, "recording": "off", "reason": reason}


async def test_a_notice_heard_in_full_starts_recording_once() -> None:
    call = await call_with([], ScriptedSTT([]), turns=0)
    conversation, line = call.conversation, call.line
    assert call.kinds() == ["notice_played"], call.notices
    _, played_at, queued_at = call.notices[0]
    assert played_at == queued_at  # heard to its end (the greeting not queued yet)
    assert [m.content for m in conversation.history] == [NOTICE, GREETING]
    assert line.clears == 0 and line.pauses == []


async def test_a_notice_resumed_after_an_mm_hm_counts_as_heard_in_full() -> None:
    """A backchannel pauses the notice and it plays on from where the caller stopped hearing
    it: heard in full the first time, recording starts once."""
    started = time.monotonic()
    call = await call_with(["Mm hmm."], ScriptedSTT(["Mm-hmm."]), turns=0)
    print(f"\ncall took {time.monotonic() - started:.1f} s")
    conversation, line = call.conversation, call.line
    assert line.pauses and line.resumes == 1 and line.clears == 0
    assert call.kinds() == ["notice_played"], call.notices
    assert call.notices[0][0] == {"type": "notice_played", "heard_in_full": True, "attempts": 1}
    assert [m.content for m in conversation.history] == [NOTICE, GREETING]

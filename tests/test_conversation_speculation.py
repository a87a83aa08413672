"""Speculative replies: begun at the caller's pause, heard only once the turn has ended there.

Timelines as in `tests/test_conversation.py`: real speech through the real turn detector, with
scripted STT, LLM and TTS; the same call is run with speculation on and off and compared.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from pipeline.conversation import Conversation
from pipeline.conversation_settings import ConversationSettings
from pipeline.records import TurnRecord
from pipeline.transport import PCM, HangUp, InboundEvent
from pipeline.turns import TurnSettings
from tests.support.conversation import PhoneLine, ScriptedLLM, ScriptedSTT, ToneTTS, speak
from tests.support.speech import concat, espeak, silence

# Longer than the server's 500 ms, so that the scripted STT, LLM and TTS (170 ms in all) are
# done well before the endpoint even on a loaded runner: the point is the order, not the speed.
END_SILENCE_MS = 1000


class WatchedLine(PhoneLine):
    """A phone line that notes when the first reply audio was queued."""

    def __init__(self) -> None:
        super().__init__()
        self.first_play_at: float | None = None

    def play(self, pcm: PCM) -> int:
        if self.first_play_at is None:
            self.first_play_at = asyncio.get_running_loop().time()
        return super().play(pcm)


async def one_turn(
    speech: PCM,
    stt: ScriptedSTT,
    llm: ScriptedLLM,
    speculate: bool,
    finished_silence_ms: int = 0,
) -> tuple[Conversation, WatchedLine]:
    line = WatchedLine()
    answered = asyncio.Event()

    def on_turn(record: TurnRecord) -> None:
        answered.set()

    conversation = Conversation(
        "spec",
        line,
        stt=stt,
        llm=llm,
        tts=ToneTTS(),
        settings=ConversationSettings(speculate=speculate),
        turn_settings=TurnSettings(
            end_silence_ms=END_SILENCE_MS, finished_silence_ms=finished_silence_ms
        ),
        on_turn=on_turn,
    )

    async def caller(line: PhoneLine) -> AsyncIterator[InboundEvent]:
        async for event in speak(speech):
            yield event
        await answered.wait()
        yield HangUp("done")

    line.script = caller
    await conversation.run()
    return conversation, line


async def test_a_reply_begun_at_the_pause_is_heard_as_the_turn_ends() -> None:
    speech = concat(silence(200), espeak("A table for two at seven please"), silence(1400))
    gaps = {}
    for speculate in (True, False):
        llm = ScriptedLLM(["Sure. A table for two at seven."])
        conversation, _ = await one_turn(speech, ScriptedSTT(["table for two"]), llm, speculate)
        [record] = conversation.records
        t = record.timings_ms
        print(f"\nspeculate={speculate}: {t}")
        assert record.reply_text == "Sure. A table for two at seven."
        assert record.speculative is speculate and record.speculations_discarded == 0
        assert t["first_audio"] >= t["endpoint"], "no reply audio before the turn ended"
        gaps[speculate] = t["first_audio"] - t["endpoint"]
        if speculate:
            # The LLM answered while the detector was still waiting out the silence...
            assert t["stt"] < t["llm_first_token"] < t["tts_first_chunk"] < t["endpoint"]
    # ...so the held audio went out as the turn ended, instead of the LLM and TTS starting then
    # (100 ms to first token + synthesis here); compared within this run.
    assert gaps[True] < gaps[False] / 2, gaps


async def test_a_busy_recognizer_skips_the_pause_and_transcribes_the_ended_turn() -> None:
    speech = concat(silence(200), espeak("A table for two at seven please"), silence(1400))
    stt_after_endpoint = {}
    for busy in (True, False):
        stt = ScriptedSTT(["table for two"], delay_s=0.2)
        stt.busy = busy  # transcriptions queueing (other calls' finished turns)
        llm = ScriptedLLM(["Sure."])
        conversation, _ = await one_turn(speech, stt, llm, speculate=True)
        [record] = conversation.records
        assert record.caller_text == "table for two" and len(stt.called_at) == 1
        assert record.stt_early_skipped is busy
        assert record.speculative is not busy  # no transcript at the pause: nothing to begin
        stt_after_endpoint[busy] = record.timings_ms["stt"] - record.timings_ms["endpoint"]
    # Skipped at the pause, the words were transcribed (200 ms here) after the turn ended.
    assert stt_after_endpoint[True] >= 200 > stt_after_endpoint[False], stt_after_endpoint


async def test_speaking_on_after_a_pause_discards_the_reply_begun_there() -> None:
    speech = concat(
        silence(200), espeak("I would like a table"), silence(150), espeak("for two"), silence(1400)
    )
    stt = ScriptedSTT(["I would like a table.", "I would like a table for two"])
    llm = ScriptedLLM(["Never heard, this one.", "A table for two, sure."])
    conversation, line = await one_turn(speech, stt, llm, speculate=True)

    [record] = conversation.records
    assert record.caller_text == "I would like a table for two"
    assert record.reply_text == "A table for two, sure." and record.speculative
    assert record.speculations_discarded == 1 and conversation.speculations_discarded == 1
    assert len(llm.streams) == 2 and llm.streams[0].closed  # the first request was cut off
    assert [m.content for m in conversation.history] == [record.caller_text, record.reply_text]
    # Nothing of the discarded reply reached the line: it held only the second reply's audio.
    assert line.queued_samples == line.played_samples
    words = 5  # "A table for two, sure."
    assert abs(line.queued_samples - words * 0.25 * 16_000) < 0.05 * 16_000


async def test_words_left_hanging_at_a_pause_ask_the_llm_nothing_until_the_turn_ends() -> None:
    speech = concat(
        silence(200), espeak("I would like"), silence(150), espeak("a table for two"), silence(1400)
    )
    stt = ScriptedSTT(["I would like", "I would like a table for two"])
    llm = ScriptedLLM(["A table for two, sure."])
    conversation, _ = await one_turn(speech, stt, llm, speculate=True)

    [record] = conversation.records
    assert record.caller_text == "I would like a table for two"
    assert record.reply_text == "A table for two, sure." and record.speculative
    # "I would like" stops mid-sentence: its speculation waited for the turn to end there, and
    # was dropped when the caller went on without having sent a request (no tokens spent).
    assert len(llm.streams) == 1
    assert record.speculations_discarded == 0 and conversation.speculations_discarded == 0


async def test_words_left_hanging_at_the_end_are_answered_once_the_turn_ends() -> None:
    speech = concat(silence(200), espeak("Send it to the"), silence(1400))
    llm = ScriptedLLM(["Send it where?"])
    conversation, _ = await one_turn(speech, ScriptedSTT(["Send it to the"]), llm, True)

    [record] = conversation.records
    assert record.reply_text == "Send it where?" and record.speculative
    t = record.timings_ms
    assert t["stt"] < t["endpoint"] < t["llm_first_token"], "asked only once the turn ended"


async def test_with_speculation_off_the_llm_is_asked_only_at_the_endpoint() -> None:
    speech = concat(silence(200), espeak("What time do you open"), silence(1400))
    llm = ScriptedLLM(["We open at nine."])
    conversation, _ = await one_turn(speech, ScriptedSTT(["what time do you open"]), llm, False)
    [record] = conversation.records
    assert not record.speculative
    assert record.timings_ms["llm_first_token"] > record.timings_ms["endpoint"]


async def test_words_that_sound_finished_end_the_turn_sooner() -> None:
    speech = concat(silence(200), espeak("Book me a taxi to the airport"), silence(1400))
    endpoints = {}
    for heard in ("Book me a taxi to the airport.", "Book me a taxi to the"):
        for hasten in (0, 300):
            llm = ScriptedLLM(["Sure, a taxi."])
            conversation, _ = await one_turn(speech, ScriptedSTT([heard]), llm, True, hasten)
            [record] = conversation.records
            assert record.caller_text == heard and record.speculative
            endpoints[heard, hasten] = record.timings_ms["endpoint"]
    print(endpoints)
    # A whole sentence ends the turn after 300 ms of silence (or when its transcript is in);
    # a sentence left hanging ("to the") waits the whole end_silence_ms, as with it off.
    finished, hanging = "Book me a taxi to the airport.", "Book me a taxi to the"
    assert endpoints[finished, 300] < endpoints[finished, 0] - 400
    assert endpoints[finished, 300] >= 300
    assert abs(endpoints[hanging, 300] - endpoints[hanging, 0]) < 100
    assert endpoints[hanging, 0] >= END_SILENCE_MS

"""Long turns transcribed piece by piece (`pipeline.long_turns`).

The first test runs the bundled Whisper on piper's speech; the others give the pieces' words by
hand (`HeldSTT`: each transcription waits until the test answers it), so that which audio each
transcription covers, and what happens when one is dropped mid-way, can be stepped through.
The last runs a call through the real turn detector.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
import pytest

from pipeline.conversation import Conversation
from pipeline.conversation_settings import ConversationSettings
from pipeline.long_turns import LongTurns
from pipeline.scheduling import Urgency
from pipeline.stt import SpeechToText, Transcript
from pipeline.transport import PCM, SAMPLE_RATE, HangUp, InboundEvent
from tests.support.conversation import PhoneLine, ScriptedLLM, ToneTTS, speak, utterance
from tests.support.speech import concat, piper, silence, words_in_order

SENTENCES = ("My name is Alice Johnson.", "I bought a blue kettle.", "It never arrived.")


class HeldSTT:
    """A recognizer whose every transcription waits for the test's `answer(text)`."""

    def __init__(self) -> None:
        self.asked: list[tuple[int, asyncio.Future[str]]] = []  # (samples, its answer)
        self.asked_once = asyncio.Event()

    busy = False  # never queueing

    async def transcribe(self, audio: PCM, urgent: bool | Urgency = True) -> Transcript:
        answer: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.asked.append((len(audio), answer))
        self.asked_once.set()
        return Transcript(await answer, len(audio) / SAMPLE_RATE, 0.01)

    async def request(self, index: int) -> tuple[int, asyncio.Future[str]]:
        """The `index`-th transcription asked for (from 0), once asked: its audio's length in
        samples, and the future its words go into."""
        while len(self.asked) <= index:
            self.asked_once.clear()
            await self.asked_once.wait()
        return self.asked[index]


class SizeSTT:
    """A recognizer that hears how much audio it was given: "<samples>"."""

    busy = False  # never queueing

    async def transcribe(self, audio: PCM, urgent: bool | Urgency = True) -> Transcript:
        return Transcript(f"<{len(audio)}>", len(audio) / SAMPLE_RATE, 0.01)


def held() -> tuple[HeldSTT, LongTurns]:
    """A held recognizer, and long turns over it that keep pieces of 2 s or more."""
    stt = HeldSTT()
    return stt, LongTurns(stt, piece_s=2.0)


def voiced(audio: PCM) -> PCM:
    """`audio` from its first sound to its last (no silence around it)."""
    loud = np.flatnonzero(np.abs(audio.astype(np.int32)) > 300)
    return audio[loud[0] : loud[-1] + 1]


def turn(*seconds: float) -> tuple[PCM, list[int]]:
    """A turn for `HeldSTT`, which does not listen: pieces of `seconds` of constant samples,
    each followed by 400 ms of silence; and where each piece's silence ends (samples)."""
    parts: list[PCM] = []
    for index, length_s in enumerate(seconds):
        parts += [np.full(round(length_s * SAMPLE_RATE), index + 1, np.int16), silence(400)]
    ends = np.cumsum([len(part) for part in parts])[1::2]
    return concat(*parts), [int(end) for end in ends]


async def test_a_long_turn_ends_with_only_its_last_piece_transcribed() -> None:
    stt = SpeechToText.shared()
    pieces = [concat(piper(text), silence(400)) for text in SENTENCES]
    audio = concat(*pieces)
    first, second = len(pieces[0]), len(pieces[0]) + len(pieces[1])
    long_turns = LongTurns(stt, piece_s=min(first, second - first) / SAMPLE_RATE - 0.1)

    at_first = await long_turns.transcribe(audio[:first], urgent=False)  # a pause: kept
    at_second = await long_turns.transcribe(audio[:second], urgent=False)  # kept after it
    whole = await long_turns.transcribe(audio)

    assert at_first.earlier_s == 0.0
    assert at_second.earlier_s == pytest.approx(first / SAMPLE_RATE)
    assert whole.earlier_s == pytest.approx(second / SAMPLE_RATE)
    assert whole.audio_s == pytest.approx(len(audio) / SAMPLE_RATE)
    heard = words_in_order(whole.text)
    for word in ("alice", "johnson", "blue", "kettle", "never", "arrived"):
        assert word in heard, whole.text
    assert heard.index("alice") < heard.index("kettle") < heard.index("arrived")


async def test_a_piece_is_kept_even_when_the_caller_spoke_on_before_it_was_transcribed() -> None:
    stt, long_turns = held()
    audio, (first, second, end) = turn(2.5, 1.0, 1.0)

    at_pause = asyncio.create_task(long_turns.transcribe(audio[:first], urgent=False))
    samples, answer = await stt.request(0)
    assert samples == first
    at_pause.cancel()  # the caller spoke on: the conversation drops this pause's transcript
    answer.set_result("my name is alice")  # its piece was long enough: it ran on, and is kept
    with pytest.raises(asyncio.CancelledError):
        await at_pause

    # a short piece after it is not kept: dropped, its transcription goes with it
    short = asyncio.create_task(long_turns.transcribe(audio[:second], urgent=False))
    samples, answer = await stt.request(1)
    assert samples == second - first
    short.cancel()
    with pytest.raises(asyncio.CancelledError):
        await short
    assert answer.cancelled()

    ended = asyncio.create_task(long_turns.transcribe(audio[:end]))
    samples, answer = await stt.request(2)
    assert samples == end - first  # only what follows the kept piece
    answer.set_result("I ordered a kettle.")
    transcript = await ended
    assert transcript.text == "my name is alice I ordered a kettle."
    assert transcript.earlier_s == pytest.approx(first / SAMPLE_RATE)
    assert transcript.audio_s == pytest.approx(end / SAMPLE_RATE)


async def test_a_short_turn_and_another_turn_are_transcribed_whole() -> None:
    stt, long_turns = held()
    audio, (first, _end) = turn(2.5, 1.0)
    short = asyncio.create_task(long_turns.transcribe(audio[:SAMPLE_RATE]))
    samples, answer = await stt.request(0)
    answer.set_result("hello")
    assert samples == SAMPLE_RATE and (await short).text == "hello"

    kept = asyncio.create_task(long_turns.transcribe(audio[:first]))
    (await stt.request(1))[1].set_result("first")
    await kept
    again = await long_turns.transcribe(audio[:first])  # the same audio: its kept words
    assert (again.text, again.earlier_s, len(stt.asked)) == ("first", first / SAMPLE_RATE, 2)
    other, _ = turn(3.0, 1.0)  # the next turn's audio: it does not begin with the kept piece
    whole = asyncio.create_task(long_turns.transcribe(other))
    samples, answer = await stt.request(2)
    assert samples == len(other)
    answer.set_result("something else")
    assert (await whole).text == "something else" and (await whole).earlier_s == 0.0


async def test_of_two_pieces_from_the_same_start_the_longer_is_kept() -> None:
    stt, long_turns = held()
    audio, (first, second, end) = turn(2.5, 1.0, 1.0)
    early = asyncio.create_task(long_turns.transcribe(audio[:first], urgent=False))
    _, early_answer = await stt.request(0)
    later = asyncio.create_task(long_turns.transcribe(audio[:second], urgent=False))
    _, later_answer = await stt.request(1)
    later_answer.set_result("one two")  # the longer one finishes first
    early_answer.set_result("one")
    await asyncio.gather(early, later)

    ended = asyncio.create_task(long_turns.transcribe(audio[:end]))
    samples, answer = await stt.request(2)
    assert samples == end - second
    answer.set_result("three")
    assert (await ended).text == "one two three"


async def test_a_call_records_how_much_of_a_long_turn_was_transcribed_while_it_was_spoken() -> None:
    line = PhoneLine()
    settings = ConversationSettings(speculate=False, long_turn_piece_s=1.0)
    answered = asyncio.Event()
    call = Conversation(
        "c1",
        line,
        stt=SizeSTT(),
        llm=ScriptedLLM(["Noted."] * 3),
        tts=ToneTTS(),
        settings=settings,
        on_turn=lambda record: answered.set(),
    )

    async def caller(line: PhoneLine) -> AsyncIterator[InboundEvent]:
        # three phrases 250 ms apart (pauses: a turn ends after 500 ms), then the turn's end
        phrases = [voiced(utterance(text)) for text in SENTENCES]
        spoken = [silence(200), phrases[0], silence(250), phrases[1], silence(250), phrases[2]]
        async for event in speak(concat(*spoken, silence(700))):
            yield event
        await answered.wait()
        yield HangUp("caller hung up")

    line.script = caller
    await call.run()

    [record] = call.records
    pieces = [int(piece.strip("<>")) for piece in record.caller_text.split()]
    assert len(pieces) >= 2, record.caller_text  # kept at a pause, then the rest
    assert record.stt_earlier_s == pytest.approx(sum(pieces[:-1]) / SAMPLE_RATE, abs=0.01)
    assert all(samples >= SAMPLE_RATE for samples in pieces[:-1])  # each kept piece ≥ 1 s
    # the last transcription covered the end of the turn only
    assert pieces[-1] < sum(pieces) / 2

"""End of turn in the live call: the turn model (real Smart Turn v3.2) judges each pause.

Real speech (piper's voice, its generator noise off so that every run hears the same audio)
through the real VAD and the real Smart Turn model, on the scripted timelines of
tests/test_conversation_speculation.py: scripted STT (the texts are what Whisper tiny.en made
of this audio), LLM and TTS. Every test passes its own policy: none depends on the defaults,
which the turn-bench sets.

What Smart Turn made of these pauses (measured on this audio through the real VAD, fresh
install of 2026-12-03): "My number is 5 5 5" 0.07 (not over), then "1 2 3 4 and that's my
number." 0.90. "My number is 5 5 5 ... 1 2 3 4." scored 0.97 on an earlier install and 0.30 on
this one: the same text renders differently from one install to the next, and the model hears
prosody. With piper's noise on, renderings of "My number is 5 5 5" scored anywhere from 0.03 to
0.8.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import AsyncIterator
from importlib.metadata import PackageNotFoundError
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

import pipeline.turn_taking.model as model_module
from pipeline.conversation import Conversation
from pipeline.records import TurnRecord
from pipeline.stt import Transcript
from pipeline.transport import PCM, HangUp, InboundEvent
from pipeline.tts import TextToSpeech, TTSSettings
from pipeline.turn_taking.end_of_turn import EndOfTurn
from pipeline.turn_taking.model import TurnModel, TurnScore
from pipeline.turn_taking.policy import TurnPolicy
from pipeline.turns import EndJudgement, TurnDetector, TurnPause, TurnSegment, TurnSettings
from tests.support.conversation import PhoneLine, ScriptedLLM, ScriptedSTT, ToneTTS, speak
from tests.support.poll import until
from tests.support.speech import concat, frames, resample, silence
from voice.server.settings import Settings

pytestmark = pytest.mark.slow  # real-time calls with the real models

RATE = 16_000
# Explicit, not the defaults: a timeout (policy.timeout_ms, and end_silence_ms) well past the
# 1 s pause, so that only the model's verdict can end a turn there, and past any inference
# time on a loaded runner.
POLICY = TurnPolicy(model=True, threshold=0.5, min_delay_ms=300, timeout_ms=2500)
SETTINGS = TurnSettings(end_silence_ms=2500, policy=POLICY)


@functools.cache
def _said(text: str) -> bytes:
    voice = TextToSpeech.shared(TTSSettings(noise_scale=0.0, noise_w_scale=0.0))
    return resample(voice.synthesize_blocking(text), voice.sample_rate, RATE).tobytes()


def said(text: str) -> PCM:
    """`text` in piper's voice, the same samples every run, 16 kHz."""
    return np.frombuffer(_said(text), dtype=np.int16).copy()


class WatchedModel(TurnModel):
    """The real Smart Turn model, noting the thread each inference ran on."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[str] = []

    def score(self, audio: npt.NDArray[np.int16]) -> TurnScore:
        self.threads.append(threading.current_thread().name)
        return super().score(audio)


_MODEL: WatchedModel | None = None


def model() -> WatchedModel:
    global _MODEL
    if _MODEL is None:
        _MODEL = WatchedModel()
    _MODEL.threads.clear()
    return _MODEL


async def call(
    turns: list[PCM],
    stt: ScriptedSTT,
    llm: ScriptedLLM,
    judge: TurnModel,
    settings: TurnSettings = SETTINGS,
) -> Conversation:
    """One call: each of `turns` spoken once the reply to the one before has been heard, then
    silence until its own reply is recorded; then the caller hangs up."""
    line = PhoneLine()
    records: list[TurnRecord] = []
    conversation = Conversation(
        "eot",
        line,
        stt=stt,
        llm=llm,
        tts=ToneTTS(),
        turn_settings=settings,
        on_turn=records.append,
        turn_model=judge,
    )

    async def caller(line: PhoneLine) -> AsyncIterator[InboundEvent]:
        for number, speech in enumerate(turns, start=1):
            async for event in speak(speech):
                yield event
            while len(records) < number:  # the caller stays silent until answered
                async for event in speak(silence(100)):
                    yield event
            await until(lambda: line.played_samples >= line.queued_samples, "reply heard")
        yield HangUp("done")

    line.script = caller
    await asyncio.wait_for(conversation.run(), 60)
    return conversation


async def test_a_pause_after_my_number_is_5_5_5_does_not_end_the_turn() -> None:
    speech = concat(
        silence(300),
        said("My number is 5 5 5"),
        silence(1000),
        said("1 2 3 4 and that's my number."),
        silence(200),
    )
    stt = ScriptedSTT(["My number is 555.", "My number is 555. 1, 2, 3, 4 and that's my number."])
    llm = ScriptedLLM(["Thanks, 555 1234.", "Thanks, 555 1234."])  # should one be wasted
    judge = model()
    conversation = await call([speech], stt, llm, judge)

    # Answered once, after the digits: the 1 s pause after "5 5 5" was judged not over.
    [record] = conversation.records
    assert record.caller_text == "My number is 555. 1, 2, 3, 4 and that's my number."
    assert record.reply_text == "Thanks, 555 1234." and record.speculative
    assert len(stt.called_at) == 2, "one early transcript at each pause"
    # The speculative reply begun at the first pause asked the LLM nothing: the model judged
    # the turn unfinished there, so no tokens (or reasoning) went on a reply thrown away.
    assert [[m.content for m in request] for request in llm.requests] == [[record.caller_text]]
    assert record.speculations_discarded == 0
    # The turn ended at the last pause, judged over: after the policy's short delay, not the
    # timeout (both on the audio clock).
    assert record.turn_score is not None and record.turn_score >= POLICY.threshold
    assert record.turn_delay_ms == POLICY.min_delay_ms
    t = record.timings_ms
    assert POLICY.min_delay_ms <= t["endpoint"] < SETTINGS.end_silence_ms, t
    assert t["first_audio"] >= t["endpoint"]
    # Smart Turn ran once a pause, on its own pool's thread, never on the event loop.
    assert len(judge.threads) == 2 and all(n.startswith("turn-model") for n in judge.threads)


async def test_a_finished_sentence_ends_sooner_than_one_judged_unfinished() -> None:
    finished = concat(silence(300), said("I would like to book a table for two."), silence(200))
    unfinished = concat(silence(300), said("My number is 5 5 5"), silence(200))
    stt = ScriptedSTT(["I would like to book a table for two.", "My number is 555."])
    llm = ScriptedLLM(["A table for two, sure.", "And the rest of it?"])
    judge = model()
    conversation = await call([finished, unfinished], stt, llm, judge)

    first, second = conversation.records
    print(f"\nfinished: {first.turn_score} {first.timings_ms}")
    print(f"unfinished: {second.turn_score} {second.timings_ms}")
    assert first.caller_text == "I would like to book a table for two."
    assert second.caller_text == "My number is 555."
    # The record carries the model's score at the pause that ended the turn and the delay the
    # policy chose there.
    assert first.turn_score is not None and first.turn_score >= POLICY.threshold
    assert second.turn_score is not None and second.turn_score < POLICY.threshold
    assert first.turn_delay_ms == POLICY.min_delay_ms
    assert second.turn_delay_ms == SETTINGS.end_silence_ms
    # Compared within the run: the finished sentence ended after the short delay, the other
    # waited out the timeout.
    assert first.timings_ms["endpoint"] < second.timings_ms["endpoint"] - 1000
    assert second.timings_ms["endpoint"] >= SETTINGS.end_silence_ms
    # Both replies were begun at the pause; the second, judged unfinished, asked the LLM only
    # once the turn had ended there (it spent nothing on a reply that might be thrown away).
    assert first.speculative and second.speculative and len(llm.streams) == 2
    asked_ms = (llm.streams[1].requested_at - llm.zeros[1]) * 1e3
    assert asked_ms >= second.timings_ms["endpoint"], (asked_ms, second.timings_ms)
    # Held or not, its transcript was ready at the pause, and the record says so.
    assert second.timings_ms["stt"] < second.timings_ms["endpoint"] - 1000
    assert all(n.startswith("turn-model") for n in judge.threads), judge.threads


async def test_with_the_model_off_the_pause_waits_for_the_timeout() -> None:
    speech = concat(silence(300), said("I would like to book a table for two."), silence(200))
    stt = ScriptedSTT(["I would like to book a table for two."])
    llm = ScriptedLLM(["A table for two, sure."])
    off = SETTINGS.model_copy(update={"policy": POLICY.model_copy(update={"model": False})})
    judge = model()
    conversation = await call([speech], stt, llm, judge, off)
    [record] = conversation.records
    assert judge.threads == [], "policy.model off: the model never ran"
    # Judged from the words alone: a whole sentence, but the policy's text rule is off.
    assert record.turn_score is None and record.turn_delay_ms == off.end_silence_ms
    assert record.timings_ms["endpoint"] >= off.end_silence_ms


def test_the_policy_is_a_server_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOTLINE_TURNS__POLICY__MODEL", "false")
    monkeypatch.setenv("HOTLINE_TURNS__POLICY__THRESHOLD", "0.7")
    monkeypatch.setenv("HOTLINE_TURNS__POLICY__MIN_DELAY_MS", "250")
    turns = Settings().turns
    assert (turns.policy.model, turns.policy.threshold, turns.policy.min_delay_ms) == (
        False,
        0.7,
        250,
    )


def _transcript(text: str) -> asyncio.Task[Transcript]:
    async def heard() -> Transcript:
        return Transcript(text, 2.0, 0.05)

    return asyncio.create_task(heard())


async def _pause_of(detector: TurnDetector, speech: PCM) -> tuple[TurnPause, float]:
    """Push `speech` (on a clock of its own) up to its first pause; that pause, and the clock."""
    at = 0.0
    for frame in frames(speech):
        at += 0.02
        for event in detector.push(frame, at):
            if isinstance(event, TurnPause):
                return event, at
    raise AssertionError("no pause in the speech")


async def test_a_pause_judged_after_its_delay_ends_the_turn_at_once() -> None:
    detector, ended = TurnDetector(SETTINGS), list[TurnSegment]()
    end_of_turn = EndOfTurn(detector, model(), ended.append)
    speech = concat(silence(300), said("I would like to book a table for two."), silence(3000))
    pause, at = await _pause_of(detector, speech)
    judging = end_of_turn.pause(pause.end_position, pause.audio, _transcript("A table for two."))
    # The caller stays silent past the policy's delay before the judgement is in.
    quiet = silence(POLICY.min_delay_ms + 200)
    assert detector.push(quiet, at + len(quiet) / RATE) == []
    judgement = await judging.deciding
    assert judgement is not None and judgement.delay_ms == POLICY.min_delay_ms
    [segment] = ended  # at once, when the judgement came in
    assert segment.end_position == pause.end_position and segment.judgement == judgement


async def test_a_turn_model_that_fails_leaves_the_words_and_the_timeout() -> None:
    class Broken:
        async def judge(self, audio: npt.NDArray[np.int16], urgent: bool = True) -> TurnScore:
            raise RuntimeError("the model file is gone")

    detector, ended = TurnDetector(SETTINGS), list[TurnSegment]()
    end_of_turn = EndOfTurn(detector, Broken(), ended.append)
    speech = concat(silence(300), said("I would like to book a table for two."), silence(200))
    pause, at = await _pause_of(detector, speech)
    judging = end_of_turn.pause(pause.end_position, pause.audio, _transcript("A table for two."))
    assert await judging.likely_over(), "not scored: nothing holds the speculative reply"
    assert await judging.deciding == EndJudgement(None, SETTINGS.end_silence_ms)
    assert ended == []
    quiet = silence(SETTINGS.end_silence_ms)
    [segment] = detector.push(quiet, at + len(quiet) / RATE)
    assert isinstance(segment, TurnSegment)
    assert segment.judgement == EndJudgement(None, SETTINGS.end_silence_ms)


async def test_words_that_come_after_the_score_still_veto_the_end() -> None:
    detector, ended = TurnDetector(SETTINGS), list[TurnSegment]()
    end_of_turn = EndOfTurn(detector, model(), ended.append)
    speech = concat(silence(300), said("I would like to book a table for two."), silence(3000))
    pause, at = await _pause_of(detector, speech)
    words: asyncio.Future[Transcript] = asyncio.get_running_loop().create_future()

    async def transcribed() -> Transcript:
        return await words

    judging = end_of_turn.pause(pause.end_position, pause.audio, asyncio.create_task(transcribed()))
    # The score first: over, so the turn would end after min_delay_ms...
    await until(lambda: judging.answers, "the policy's answer to the score")
    assert judging.answers[0].delay_ms == POLICY.min_delay_ms
    # ...but the words come before the silence has lasted that long.
    words.set_result(Transcript("I would like to book a table for", 2.0, 0.05))  # left hanging
    judgement = await judging.deciding
    assert judgement is not None and judgement.score is not None
    assert judgement.score >= POLICY.threshold and judgement.delay_ms == SETTINGS.end_silence_ms
    # The silence outlasts min_delay_ms: the veto, given before it did, still holds.
    quiet = silence(POLICY.min_delay_ms + 500)
    assert detector.push(quiet, at + len(quiet) / RATE) == [] and ended == []


def test_without_the_fetched_model_the_path_says_how_to_fetch_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def not_installed(name: str) -> None:
        raise PackageNotFoundError(name)

    monkeypatch.setenv("HOTLINE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(model_module, "distribution", not_installed)  # no pipecat-ai either
    assert model_module.cached_model_path().is_relative_to(tmp_path)
    with pytest.raises(FileNotFoundError, match="hotline fetch-models"):
        model_module.smart_turn_path()
    fetched = model_module.cached_model_path()
    fetched.parent.mkdir(parents=True)
    fetched.write_bytes(b"onnx")
    assert model_module.smart_turn_path() == fetched

"""Speech during the reply: an "mm-hm" lets it play on, "no, wait" stops it (issue 24, part 3).

Timelines as in `tests/test_conversation.py`: the caller's real speech (piper) through the real
turn detector, on a phone line that plays in real time; Whisper tiny.en transcribes (the
decision reads its words), the LLM and the TTS are scripted. Then each transport's pause and
resume on its own playback bookkeeping.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import pytest
from starlette.websockets import WebSocket

from pipeline.conversation import Conversation
from pipeline.conversation_settings import ConversationSettings
from pipeline.services import SpeechRecognizer
from pipeline.stt import SpeechToText
from pipeline.transport import SAMPLE_RATE, AudioIn, HangUp, InboundEvent
from pipeline.turn_taking.barge_in import BargeInSettings, Verdict, classify
from pipeline.turn_taking.end_of_turn import TurnJudge
from pipeline.turn_taking.model import TurnScore
from pipeline.turn_taking.policy import TurnPolicy
from pipeline.turns import TurnSettings
from tests.support.conversation import (
    PhoneLine,
    ScriptedLLM,
    ScriptedSTT,
    ToneTTS,
    speak,
    utterance,
)
from tests.support.poll import until
from tests.support.speech import concat, frames, silence, words_in_order
from tests.support.speech import utterance as spoken
from voice.audio import mulaw_decode
from voice.transports.phone.stream import PhoneStream
from voice.transports.phone.twilio import TwilioProtocol
from voice.transports.phone.wire import MarkPlayed, Start
from voice.transports.sip.media import SipMedia
from voice.transports.sip.rtp import RtpSession
from voice.transports.webrtc import OutboundAudio

pytestmark = pytest.mark.slow  # real-time calls with the real models

# 12 words of tone, 250 ms each: 3 s of reply in two sentences.
REPLY = "One two three four five six seven eight. Nine ten eleven twelve."
CUT_IN_S = 0.75  # the caller speaks once three words have played


@dataclass
class Call:
    conversation: Conversation
    line: PhoneLine
    llm: ScriptedLLM
    cut_in_at: int = 0  # reply samples heard when the caller's clip began (300 ms before speech)
    speech_over_at: float = 0.0  # monotonic: the caller's words over (the clip's silence left)
    kept_at: list[float] = field(default_factory=list)  # monotonic: each turn record kept


async def call_with(
    over_reply: str,
    stt: SpeechRecognizer,
    turns: int,
    settings: ConversationSettings | None = None,
    turn_model: TurnJudge | None = None,
    turn_settings: TurnSettings | None = None,
    starve_s: float = 0.0,
) -> Call:
    """A call: "Tell me a long story", the 3 s reply, `over_reply` (piper) said into it three
    words in, then silence until `turns` turns are over (the reply, and any answer to the
    caller's words). With `starve_s`, the process is held up that long once the reply has
    paused for the caller (`starved`)."""
    line = PhoneLine()
    llm = ScriptedLLM([REPLY, "Sorry, which address?"])
    kept_at: list[float] = []
    conversation = Conversation(
        "bc",
        line,
        stt=stt,
        llm=llm,
        tts=ToneTTS(),
        settings=settings or ConversationSettings(),
        on_turn=lambda record: kept_at.append(time.monotonic()),
        turn_model=turn_model,
        turn_settings=turn_settings,
    )
    call = Call(conversation, line, llm, kept_at=kept_at)
    words = spoken(over_reply, "piper")
    speech_end = len(words) - SAMPLE_RATE // 5  # the shared utterance ends in 200 ms of silence
    clip = concat(words, silence(700))  # the turn detector's 500 ms end of turn, inside the clip

    async def caller(line: PhoneLine) -> AsyncIterator[InboundEvent]:
        async for event in speak(utterance("Tell me a long story")):
            yield event
        await line.reached(int(CUT_IN_S * SAMPLE_RATE))
        call.cut_in_at = line.played_samples
        sent = 0
        microphone = starved(line, clip, starve_s) if starve_s else speak(clip)
        async for event in microphone:
            yield event
            sent += len(getattr(event, "pcm", ()))
            if sent >= speech_end and not call.speech_over_at:
                call.speech_over_at = time.monotonic()
        await until(  # a deadline for a stalled call, not a measure: CI's load has used 20 s
            lambda: len(conversation.records) >= turns,
            f"{turns} turns over",
            60,
            describe=lambda: [(r.caller_text, r.reply_text) for r in conversation.records],
        )
        async for event in speak(silence(300)):
            yield event
        yield HangUp("done")

    line.script = caller
    await conversation.run()
    return call


async def starved(line: PhoneLine, pcm: np.ndarray, hog_s: float) -> AsyncIterator[InboundEvent]:
    """The caller's microphone in a process starved of CPU (a loaded host): real time until
    the reply pauses for the caller's speech, then the whole loop is held up `hog_s` (a CPU
    hog). The caller went on speaking meanwhile: what arrived is read in one go, in the same
    loop turn as the timers that fell due during the hold-up (this reader's wake-up first, as
    a datagram's comes before timers)."""
    start, hogged = time.monotonic(), False
    for index, frame in enumerate(frames(pcm)):
        due = start + (index + 1) * 0.02
        if line.pauses and not hogged:
            hogged = True
            asyncio.get_running_loop().call_later(0.01, time.sleep, hog_s)
            await asyncio.sleep(0.02)  # falls due during the hold-up, before any later timer
        elif not hogged:
            await asyncio.sleep(max(0.0, due - time.monotonic()))
        yield AudioIn(frame, due)


# piper's; Whisper tiny.en reads it "MMM". ("Okay." through Whisper: the turn-model test below.)
ACKNOWLEDGEMENTS = ("Mm hmm.",)


def whisper() -> SpeechRecognizer:
    return SpeechToText.shared()


@pytest.mark.parametrize("acknowledgement", ACKNOWLEDGEMENTS)
async def test_an_acknowledgement_during_the_reply_leaves_it_and_the_history_whole(
    acknowledgement: str,
) -> None:
    """piper's hum through the real VAD; its words as Whisper reads a human "mm-hm". Whisper on
    piper's synthetic hum varies between processes ("MMM", "Amen, ma'am."): the replay in
    pipeline/turn_taking/barge_in.py counts those misses; this test pins the call's behaviour."""
    stt = ScriptedSTT(["Tell me a long story.", "Mm-hmm."])
    call = await call_with(acknowledgement, stt, turns=1)
    line, conversation = call.line, call.conversation
    turns = [(r.caller_text, r.reply_text, r.interrupted) for r in conversation.records]
    assert len(turns) == 1, f"the acknowledgement became a turn: {turns}"
    [record] = conversation.records
    assert not record.interrupted and record.reply_text == REPLY
    assert [m.content for m in conversation.history] == [record.caller_text, REPLY]
    assert len(call.llm.requests) == 1 and not conversation.barge_ins
    # It went quiet at the caller's onset and played on from there: nothing dropped, nothing
    # twice (the line's played position counts each reply sample once).
    assert len(line.pauses) == 1 and line.resumes == 1 and line.clears == 0
    assert call.cut_in_at <= line.pauses[0] < line.queued_samples
    assert line.played_samples == line.queued_samples


class SureItIsOver:
    """A turn model that calls every pause the end of the turn."""

    async def judge(self, audio: np.ndarray, urgent: bool = True) -> TurnScore:
        return TurnScore(complete=0.99, inference_ms=1.0)


async def test_an_acknowledgement_the_turn_model_ends_sooner_is_still_one() -> None:
    """The end-of-turn judge ends the "okay" as soon as it has judged its pause (the delay it
    chose has passed by then), not after 500 ms: that segment is judged as the detector's."""
    policy = TurnPolicy(model=True, threshold=0.5, min_delay_ms=100)  # less than pause_ms
    settings = TurnSettings(policy=policy)
    call = await call_with("Okay.", whisper(), 1, None, SureItIsOver(), settings)
    turns = [(r.caller_text, r.reply_text, r.interrupted) for r in call.conversation.records]
    assert len(turns) == 1 and turns[0][1] == REPLY, turns
    assert call.line.resumes == 1 and call.line.clears == 0


async def test_a_short_stop_is_an_interruption_by_its_words() -> None:
    """As short as an "okay" (0.3-0.5 s), so the words decide."""
    call = await call_with("Stop.", whisper(), turns=2)
    first, second = call.conversation.records
    assert first.interrupted and call.line.clears == 1 and call.line.resumes == 0
    assert words_in_order(second.caller_text) == ["stop"]
    history = [m.content for m in call.conversation.history]
    assert history[1:3] == [first.reply_text, second.caller_text]


async def test_a_real_interruption_stops_the_reply_and_becomes_the_next_turn() -> None:
    call = await call_with("No, wait, that's not my address.", whisper(), turns=2)
    line, conversation = call.line, call.conversation
    first, second = conversation.records
    assert first.interrupted and line.clears == 1 and line.resumes == 0
    heard = first.reply_text.rstrip(" —").split()
    print(f"\nheard before the interruption: {first.reply_text!r}")
    assert 3 <= len(heard) < len(REPLY.split()) and heard == REPLY.split()[: len(heard)]
    assert conversation.history[1].content == first.reply_text  # what the caller heard
    said = words_in_order(second.caller_text)
    assert {"wait", "address"} <= set(said), second.caller_text
    assert second.reply_text == "Sorry, which address?"
    assert conversation.barge_ins and call.llm.streams[0].closed
    # Silent from the onset (the pause), long before the words could be judged: the reply was
    # paused within the first half of the caller's 2.3 s of speech...
    onset = call.cut_in_at + int(0.3 * SAMPLE_RATE)
    paused_ms = (line.pauses[0] - onset) * 1e3 / SAMPLE_RATE
    print(f"reply quiet {paused_ms:.0f} ms of reply audio after the caller's onset")
    assert line.pauses[0] - onset < (line.queued_samples - onset) / 2
    # ...and given up while the caller was still speaking (longer than any acknowledgement).
    assert call.kept_at[0] < call.speech_over_at, "the reply was given up only at the end"


async def test_an_interruption_read_late_on_a_starved_host_is_still_answered() -> None:
    """The reply pauses for the caller; the host is then held up past the cap on undecided
    speech (1.3 s + 500 ms + 100 ms after the onset), and the caller's speech, over by then,
    is read in the loop turn the cap fires in. The speech is a turn to answer: no
    interruption scheduled by the cap drops its judgement, or stops the reply to it (CI:
    a loaded runner's SIP caller was never answered)."""
    said = "No, wait, that's not my address."
    cap_s = (BargeInSettings().backchannel_max_ms + TurnSettings().end_silence_ms + 100) / 1e3
    stt = ScriptedSTT(["Tell me a long story.", said])
    call = await call_with(said, stt, turns=2, starve_s=cap_s + 0.6)
    first, second = call.conversation.records
    assert first.interrupted and call.line.clears == 1 and call.line.resumes == 0
    assert second.caller_text == said and second.reply_text == "Sorry, which address?"
    assert not second.interrupted


async def test_an_acknowledgement_read_late_on_a_starved_host_still_resumes_the_reply() -> None:
    """The reply pauses for an "mm-hm"; the host is then held up past the wall-clock time the
    speech's segment is due (1.3 s + 500 ms + 100 ms after the onset). Read late, its audio is
    still half a second of hum: an acknowledgement, so the reply plays on and no turn is made
    of it (a cap on the wall clock called it an interruption)."""
    cap_s = (BargeInSettings().backchannel_max_ms + TurnSettings().end_silence_ms + 100) / 1e3
    stt = ScriptedSTT(["Tell me a long story.", "Mm-hmm."])
    call = await call_with("Mm hmm.", stt, turns=1, starve_s=cap_s + 0.6)
    turns = [(r.caller_text, r.reply_text, r.interrupted) for r in call.conversation.records]
    assert len(turns) == 1, f"the acknowledgement became a turn: {turns}"
    [record] = call.conversation.records
    assert not record.interrupted and record.reply_text == REPLY
    assert call.line.resumes == 1 and call.line.clears == 0


@pytest.mark.parametrize("transcript", ["(coughs)"])  # "" too: test_classify
async def test_a_cough_or_nothing_said_resumes_the_reply(transcript: str) -> None:
    """What Whisper makes of a cough: nothing, or its own annotation."""
    call = await call_with("Okay.", ScriptedSTT(["tell me a long story", transcript]), turns=1)
    turns = [(r.caller_text, r.reply_text, r.interrupted) for r in call.conversation.records]
    assert len(turns) == 1, f"the cough became a turn: {turns}"
    [record] = call.conversation.records
    assert record.reply_text == REPLY and not record.interrupted
    assert call.line.resumes == 1 and call.line.clears == 0


async def test_with_resume_off_any_speech_stops_the_reply_as_before() -> None:
    settings = ConversationSettings(barge_in=BargeInSettings(resume=False))
    stt = ScriptedSTT(["tell me a long story", "okay"])
    call = await call_with("Okay.", stt, 2, settings)
    first, second = call.conversation.records
    assert first.interrupted and second.caller_text == "okay"
    assert call.line.pauses == [] and call.line.clears == 1


@pytest.mark.parametrize(
    ("words", "ms", "verdict"),
    [
        ("MMM", 544, Verdict.BACKCHANNEL),  # what Whisper made of the hums above
        ("M.H.M.", 576, Verdict.BACKCHANNEL),
        ("NMMM", 512, Verdict.BACKCHANNEL),
        ("Uh-huh.", 352, Verdict.BACKCHANNEL),
        ("Yeah, okay.", 928, Verdict.BACKCHANNEL),
        ("I see...", 544, Verdict.BACKCHANNEL),
        ("[cough]", 300, Verdict.BACKCHANNEL),
        ("", 300, Verdict.BACKCHANNEL),  # a cough Whisper made nothing of
        ("Stop!", 256, Verdict.INTERRUPTION),  # as short as an "okay": the words decide
        ("No.", 320, Verdict.INTERRUPTION),
        ("Okay, but what about Friday?", 900, Verdict.INTERRUPTION),
        ("Yeah, okay, sure, right.", 1400, Verdict.INTERRUPTION),  # too long to be listening
        (None, 400, Verdict.UNDECIDED),
        (None, 1300, Verdict.INTERRUPTION),
    ],
)
def test_classify(words: str | None, ms: int, verdict: Verdict) -> None:
    assert classify(BargeInSettings(), ms, words) is verdict


# -- the transports' pause and resume ----------------------------------------------------------


class RecordingSocket:
    def __init__(self) -> None:
        self.sent: list[dict[str, object]] = []

    async def send_text(self, message: str) -> None:
        self.sent.append(json.loads(message))

    async def close(self, code: int = 1000) -> None:
        pass


def twilio_stream(socket: RecordingSocket) -> PhoneStream:
    """A Twilio stream onto `socket`, 10 s of lead: every frame goes out at once."""
    protocol = TwilioProtocol()
    protocol.stream_sid = "MZ1"
    start = Start(call_id="CA1", stream_id="MZ1", caller=None, callee=None)
    return PhoneStream("CA1", cast(WebSocket, socket), protocol, start, lead_s=10.0)


def tone(ms: int, hz: float) -> np.ndarray:
    t = np.arange(SAMPLE_RATE * ms // 1000) / SAMPLE_RATE
    return (8000 * np.sin(2 * np.pi * hz * t)).astype(np.int16)


def media(messages: Sequence[dict[str, object]]) -> list[bytes]:
    payloads = [
        cast(dict[str, str], m["media"])["payload"] for m in messages if m["event"] == "media"
    ]
    return [base64.b64decode(p) for p in payloads]


def marks(messages: Sequence[dict[str, object]]) -> list[str]:
    return [cast(dict[str, str], m["mark"])["name"] for m in messages if m["event"] == "mark"]


async def test_a_resumed_phone_stream_resends_from_the_played_position() -> None:
    """Two sentences sent (lead_s: at once), the first one's mark echoed: a pause clears the
    phone and a resume sends the second sentence again, frame for frame, under a new mark; an
    echo of the cleared mark does not count as heard, the new one's does."""
    socket = RecordingSocket()
    stream = twilio_stream(socket)
    first = stream.play(tone(200, 440))
    end = stream.play(tone(200, 660))
    await stream.wait_sent(end)
    await until(lambda: marks(socket.sent) == ["hotline-1", "hotline-2"], "both marks sent")
    stream.accept([MarkPlayed("hotline-1")])
    assert stream.played_samples == first
    before = len(socket.sent)
    finished = asyncio.ensure_future(stream.wait_played(end))

    await stream.pause()
    assert [m["event"] for m in socket.sent[before:]] == ["clear"]
    stream.accept([MarkPlayed("hotline-2")])  # Twilio echoes the marks a clear dropped
    assert stream.played_samples == first and not finished.done()
    await stream.resume()
    await until(lambda: marks(socket.sent[before:]), "the second sentence sent again, marked")
    again = socket.sent[before + 1 :]
    first_mark = next(i for i, m in enumerate(socket.sent) if m["event"] == "mark")
    second_sentence = b"".join(media(socket.sent[first_mark:before]))
    assert len(second_sentence) == 1600  # 200 ms at 8 kHz
    assert b"".join(media(again)) == second_sentence and marks(again) == ["hotline-3"]
    assert np.abs(mulaw_decode(media(again)[0]).astype(np.int32)).max() > 1000
    stream.accept([MarkPlayed("hotline-3")])
    assert stream.played_samples == end and await finished
    await stream.clear()  # after a resume, a clear is a clear again
    assert socket.sent[-1]["event"] == "clear"
    await stream.close()


async def test_a_phone_stream_resumes_mid_sentence_from_the_last_mark_played() -> None:
    """A mark goes out every 200 ms of a sentence: paused 400 ms into a 1 s sentence, the reply
    resumes from there, not from the sentence's start, and the played position says so."""
    socket = RecordingSocket()
    stream = twilio_stream(socket)
    end = stream.play(tone(1000, 440))
    await stream.wait_sent(end)
    await until(lambda: len(marks(socket.sent)) == 5, "a mark every 200 ms")
    assert marks(socket.sent) == [*(f"hotline-{n}-part" for n in range(1, 5)), "hotline-5"]
    sent = b"".join(media(socket.sent))
    assert len(sent) == 8000  # 1 s at 8 kHz, in messages of 100 ms, none across a mark
    assert [m["event"] for m in socket.sent] == ["media", "media", "mark"] * 5
    stream.accept([MarkPlayed(name) for name in marks(socket.sent)[:2]])
    assert stream.played_samples == SAMPLE_RATE * 400 // 1000
    before = len(socket.sent)
    await stream.pause()
    await stream.resume()
    await until(lambda: len(marks(socket.sent[before:])) == 3, "the rest sent again, marked")
    assert b"".join(media(socket.sent[before:])) == sent[3200:]  # from 400 ms on, exactly
    await stream.close()


async def test_a_phone_stream_cleared_while_paused_sends_one_clear() -> None:
    socket = RecordingSocket()
    stream = twilio_stream(socket)
    end = stream.play(tone(200, 440))
    await stream.wait_sent(end)
    await stream.pause()
    await stream.clear()  # the interruption: the phone was cleared at the pause already
    assert [m["event"] for m in socket.sent].count("clear") == 1
    assert stream.queued_samples == stream.played_samples == 0
    await stream.close()


async def test_webrtc_pause_sends_silence_and_resume_goes_on() -> None:
    out = OutboundAudio()
    end = out.play(tone(100, 440))
    out.next_frame()
    out.pause()
    assert not out.next_frame().any(), "reply audio sent while paused"
    assert out.played_samples == 320
    out.paused = False  # what WebRTCTransport.resume does
    frames = [out.next_frame() for _ in range(4)]
    assert all(frame.any() for frame in frames) and out.played_samples == end
    out.stop()


class FakeRtp:
    """What `SipMedia` sends through: each frame, and whether it carried the marker bit."""

    packets_lost = 0

    def __init__(self) -> None:
        self.frames: list[tuple[bool, bool]] = []  # (loud, marker)

    def send_frame(self, frame: np.ndarray, marker: bool = False) -> None:
        self.frames.append((bool(np.abs(frame.astype(np.int32)).max() > 1000), marker))

    def close(self) -> None:
        pass


async def test_sip_pause_sends_silence_and_resume_goes_on_from_the_same_frame() -> None:
    rtp = FakeRtp()
    media = SipMedia("s1", cast(RtpSession, rtp), idle_timeout_s=None)
    end = media.play(tone(200, 440))  # ten 20 ms frames
    await until(lambda: sum(loud for loud, _ in rtp.frames) >= 3, "three frames of reply")
    await media.pause()
    played, sent = media.played_samples, len(rtp.frames)
    await until(lambda: len(rtp.frames) >= sent + 5, "five frames while paused")
    assert not any(loud for loud, _ in rtp.frames[sent:]), "reply audio sent while paused"
    assert media.played_samples == played < end
    await media.resume()
    await media.wait_played(end)
    resumed = [marker for loud, marker in rtp.frames[sent:] if loud]
    assert resumed[0] and not any(resumed[1:])  # the marker bit: a talkspurt begins again
    assert sum(loud for loud, _ in rtp.frames) == 10  # each frame once
    await media.close()

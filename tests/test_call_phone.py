"""Whole phone calls through the Twilio route with the faithful Twilio caller."""

from __future__ import annotations

import httpx
import pytest

from pipeline.sentences import SentenceSplitter
from tests.support.barge_in import barge_in_bound_ms, round_trip_ms
from tests.support.marks import heard_mismatch
from tests.support.server import Server
from tests.support.speech import heard, utterance, words
from voice.devtools.twilio_call import place_twilio_call

pytestmark = pytest.mark.slow

FIRST = "Please book a table for two people tonight."
SECOND = "What will the weather be like in Paris tomorrow?"
# A mark echoed this close before the clear arrived may have crossed the clear on loopback.
CROSSING_S = 0.03


def stream_url(server: Server) -> str:
    return server.url.replace("http://", "ws://") + "/twilio/stream"


def call_detail(server: Server, call_id: str) -> dict[str, object]:
    response = httpx.get(f"{server.url}/calls/{call_id}", timeout=10)
    response.raise_for_status()
    detail: dict[str, object] = response.json()
    return detail


async def test_a_phone_call_through_the_webhook_answers_two_turns(server: Server) -> None:
    # Twilio's way in: the voice webhook's TwiML names the stream, then the stream.
    # The reply opens with a short phrase: a slow next chunk is not the end of the reply.
    speech = [utterance(FIRST), utterance(SECOND)]
    result = await place_twilio_call(server.url, speech, quiet_s=2.0)

    assert result.rejected is None and not result.violations
    latencies = [turn.voice_to_voice_ms for turn in result.turns]
    print(f"\nphone voice-to-voice at the caller (ms): {latencies}")
    assert len(latencies) == 2 and None not in latencies
    reply = heard(result.reply_audio)
    print(f"reply audio transcribed: {reply!r}")
    assert {"table", "people", "tonight"} <= words(reply)
    assert {"weather", "tomorrow"} <= words(reply)

    detail = call_detail(server, result.call_id)
    assert detail["transport"] == "twilio"
    assert detail["caller"] == "+15555550100"
    records = detail["records"]
    assert isinstance(records, list) and len(records) == 2
    for record in records:
        print(f"server parts (ms): {record['timings_ms']}")
        assert not record["interrupted"]
    # The server heard the second turn ("Paris" itself sometimes comes out "pairs" at 8 kHz).
    assert {"weather", "tomorrow"} <= words(str(records[1]["caller_text"]))
    # Marks came back for every sentence the phone played.
    assert len(result.marks_echoed) >= 2


@pytest.mark.serial
async def test_barge_in_sends_clear_and_history_is_cut_at_the_last_echoed_mark(
    server: Server,
) -> None:
    """The reply goes silent within the call's own bound (`tests/support/barge_in.py`), and
    the history holds exactly what the marks the phone echoed before the clear say it played:
    what the caller heard, told by the caller. Run alone (`serial`): the bound is real time."""
    result = await place_twilio_call(
        stream_url(server),
        # "Hold on" is heard within 250 ms at every alignment of Silero's windows over an 8 kHz
        # line; a short "Wait," is sometimes scored below the threshold, and barge-in then
        # waits for the next word.
        [utterance(FIRST), utterance("Hold on, I want a table for four.")],
        barge_in_after_ms=4000,  # past the first sentence (about 3 s), inside the reply
    )
    assert not result.violations, result.violations
    clears = result.events_named("clear")
    assert len(clears) == 1, f"one clear expected, the server sent {len(clears)}"
    clear = clears[0]
    interrupted, interrupting = result.turns[0], result.turns[-1]

    detail = call_detail(server, result.call_id)
    records = detail["records"]
    assert isinstance(records, list) and len(records) == 2, records
    first = records[0]
    assert first["interrupted"]

    # Barge-in: from the caller's onset to silence on the phone, within what this call's own
    # transport and the VAD's audio allow.
    trip = round_trip_ms(interrupted.voice_to_voice_ms, first["timings_ms"])
    bound = barge_in_bound_ms(trip)
    print(f"\nphone reply stopped {result.barge_in_stop_ms} ms after the caller cut in")
    print(f"bound {bound:.0f} ms = VAD audio + round trip {trip:.0f} ms + server work")
    assert result.barge_in_stop_ms is not None, "the reply never went silent"
    assert result.barge_in_stop_ms <= bound, (
        f"reply stopped {result.barge_in_stop_ms} ms after the onset, over {bound:.0f} ms "
        f"(round trip {trip:.0f} ms measured on the first turn)"
    )
    # Nothing of the interrupted reply follows the clear: the next media is the new reply,
    # which cannot start before the caller has finished speaking.
    stale = [m for m in result.received if clear.at < m.at < interrupting.speech_end]
    assert not stale, f"sent after the clear: {[m.event for m in stale]}"

    # The caller's side: the marks of the first reply, in the order sent, and those the phone
    # echoed because it had played them (not those a clear sends back).
    sent = [
        str(m.message["mark"]["name"])
        for m in result.received
        if m.event == "mark" and interrupted.speech_end < m.at < clear.at
    ]
    echoed = [(at, name) for at, name in result.marks_echoed if at < clear.at and name in sent]
    played = [name for _, name in echoed]
    assert played == sent[: len(played)], f"marks echoed out of order: {played} of {sent}"
    assert played, "the phone played the first sentence and echoed its mark"

    generated = str(first["generated_text"])
    splitter = SentenceSplitter()
    sentences = splitter.push(generated) + splitter.flush()
    history = detail["history"]
    assert isinstance(history, list) and len(history) >= 2
    assert history[1]["role"] == "assistant"
    heard = str(history[1]["content"])
    print(f"marks played before the clear: {played}; history: {heard!r}")
    # A mark echoed a moment before the clear arrived may have crossed it on the wire (the
    # server had cleared before it read the echo): then it was not counted heard.
    fillers = int(first["reply_fillers"])  # a loaded voice's "Um,": an end mark, no sentence
    mismatch = heard_mismatch(played, sentences, heard, fillers)
    if mismatch is not None and echoed[-1][0] > clear.at - CROSSING_S:
        mismatch = heard_mismatch(played[:-1], sentences, heard, fillers)
    assert mismatch is None, mismatch
    assert first["reply_text"] == history[1]["content"]
    assert interrupting.reply_start is not None, "the interrupting turn was answered"


async def test_keypad_zero_asks_for_a_person_and_digits_reach_the_llm(server: Server) -> None:
    # "0" is the switchboard's (a person, please); "4 2 #" is one keypad turn for the LLM.
    result = await place_twilio_call(
        stream_url(server), [utterance(FIRST), utterance("Thanks.")], dtmf="042#"
    )
    detail = call_detail(server, result.call_id)
    assert detail["wants_human"] is True
    records = detail["records"]
    assert isinstance(records, list)
    keyed = [r for r in records if "keypad" in str(r["caller_text"])]
    assert len(keyed) == 1
    assert str(keyed[0]["caller_text"]).startswith("(The caller pressed 4 2 on the keypad.)")

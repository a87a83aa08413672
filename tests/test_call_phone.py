"""Whole phone calls through the Twilio route with the faithful Twilio caller."""

from __future__ import annotations

import re

import httpx
import numpy as np
import pytest

from pipeline.stt import SpeechToText
from tests.support.server import BARGE_IN_BOUND_MS, Server
from tests.support.speech import concat, piper, silence
from voice.devtools.twilio_call import place_twilio_call

pytestmark = pytest.mark.slow

FIRST = "Please book a table for two people tonight."
SECOND = "What will the weather be like in Paris tomorrow?"


def words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower()))


def utterance(text: str) -> np.ndarray:
    # A natural-sounding voice: robotic espeak loses too many words on an 8 kHz line
    # (README, "Telephone speech recognition").
    return concat(silence(300), piper(text), silence(200))


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
    heard = SpeechToText.shared().transcribe_blocking(result.reply_audio).text
    print(f"reply audio transcribed: {heard!r}")
    assert {"table", "people", "tonight"} <= words(heard)
    assert {"weather", "tomorrow"} <= words(heard)

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
    """Barge-in within 300 ms, from the caller's onset to silence on the phone: audio time for
    the VAD to hear speech plus a few ms of server work (see the WebRTC test), run alone."""
    result = await place_twilio_call(
        stream_url(server),
        # "Hold on" is heard within 250 ms at every alignment of Silero's windows over an 8 kHz
        # line; a short "Wait," is sometimes scored below the threshold, and barge-in then
        # waits for the next word.
        [utterance(FIRST), utterance("Hold on, I want a table for four.")],
        barge_in_after_ms=4000,  # past the first sentence (about 3 s), inside the reply
    )

    print(f"\nphone reply stopped {result.barge_in_stop_ms} ms after the caller cut in")
    clears = result.events_named("clear")
    assert clears, "the server never sent clear"
    # The product target is 300 ms (measured by `hotline call`; about 220 ms here); the bound is
    # generous so that a machine a third slower passes, and a reply that plays on still fails.
    assert result.barge_in_stop_ms is not None and result.barge_in_stop_ms < BARGE_IN_BOUND_MS
    # No reply audio for the interrupted turn after the clear: the next media is the new reply.
    after_clear = [m for m in result.received if m.at > clears[0].at and m.event == "media"]
    first_mark_after = [m for m in result.received if m.at > clears[0].at and m.event == "mark"]
    if after_clear and first_mark_after:
        assert after_clear[0].at > clears[0].at

    detail = call_detail(server, result.call_id)
    records = detail["records"]
    assert isinstance(records, list)
    for record in records:
        print(record["caller_text"], "|", record["reply_text"], "|", record["interrupted"])
    first = records[0]
    assert first["interrupted"]
    heard = str(first["reply_text"])
    generated = str(first["generated_text"])
    print(f"heard before the clear: {heard!r}")
    assert heard, "the first sentence was played and its mark echoed"
    assert not heard.endswith("—"), "phone history is cut at a mark, never mid-sentence"
    # The sentence playing at the clear was generated but is not in the history.
    assert len(generated) > len(heard)
    history = detail["history"]
    assert isinstance(history, list)
    assert history[1] == {"role": "assistant", "content": heard}
    assert result.turns[-1].reply_start is not None


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

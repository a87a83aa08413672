"""Whole calls over WebRTC against a real `hotline serve`: real aiortc peers, real models."""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np
import pytest

from pipeline.transport import FRAME_SAMPLES, SAMPLE_RATE
from tests.support.barge_in import barge_in_bound_ms, round_trip_ms
from tests.support.poll import until
from tests.support.server import Server
from tests.support.speech import heard, utterance, words, words_in_order
from voice.audio import rms
from voice.devtools.turns import AUDIBLE_RMS
from voice.devtools.webrtc_caller import place_call

pytestmark = pytest.mark.slow

FIRST = "Please book a table for two people tonight."
SECOND = "What will the weather be like in Paris tomorrow?"
# Well into the reply's second sentence: the cut leaves words of it heard and unheard.
BARGE_IN_AFTER_MS = 1500
REPLY_GAP_S = 1.0  # the silence that ends the first reply as received
# The caller: espeak-ng's en-us voice at 150 wpm (WebRTC's 16 kHz line keeps espeak's words).
VOICE, WPM = "en-us", 150


def call_detail(server: Server, call_id: str) -> dict[str, object]:
    response = httpx.get(f"{server.url}/calls/{call_id}", timeout=10)
    response.raise_for_status()
    detail: dict[str, object] = response.json()
    return detail


async def test_two_turn_call_hears_the_callers_words(server: Server) -> None:
    # A reply opens with a short phrase ("You said,"); on a loaded runner the next chunk may
    # take a moment to synthesise, which must not be taken for the end of the reply.
    result = await place_call(
        server.url, [utterance(FIRST, VOICE, WPM), utterance(SECOND, VOICE, WPM)], quiet_s=2.0
    )

    assert len(result.turns) == 2
    latencies = [turn.voice_to_voice_ms for turn in result.turns]
    print(f"\nvoice-to-voice at the caller (ms): {latencies}")
    for record in result.records():
        print(f"server parts (ms since end of speech): {record['timings_ms']}")
    assert all(latency is not None for latency in latencies), "a turn got no reply audio"

    reply = heard(result.reply_audio)
    print(f"reply audio transcribed: {reply!r}")
    assert "table" in words(reply)
    assert {"weather", "tomorrow"} <= words(reply)

    callers = result.transcripts("caller")
    assert "table" in words(callers[0]) and "weather" in words(callers[1])
    detail = call_detail(server, result.call_id)
    records = detail["records"]
    assert isinstance(records, list) and len(records) >= 1
    assert not records[0]["interrupted"]
    assert words(records[0]["reply_text"]) == words(records[0]["generated_text"])


def first_reply(audio: np.ndarray) -> np.ndarray:
    """The first reply as received: from its first audible frame to the first long silence
    after it (the caller speaks its next turn, and is answered, only after that)."""
    frames = [
        rms(audio[i : i + FRAME_SAMPLES]) > AUDIBLE_RMS
        for i in range(0, len(audio) - FRAME_SAMPLES + 1, FRAME_SAMPLES)
    ]
    assert any(frames), "no reply audio received"
    start = frames.index(True)
    quiet = round(REPLY_GAP_S * SAMPLE_RATE / FRAME_SAMPLES)
    end, silent = len(frames), 0
    for index in range(start, len(frames)):
        silent = 0 if frames[index] else silent + 1
        if silent == quiet:
            end = index - quiet + 1
            break
    return audio[start * FRAME_SAMPLES : end * FRAME_SAMPLES]


@pytest.mark.serial
async def test_barge_in_stops_the_reply_and_truncates_history(server: Server) -> None:
    """The reply goes silent within the call's own bound (`tests/support/barge_in.py`: the
    VAD's audio plus this call's measured round trip), and the history holds what the caller's
    audio holds of the interrupted reply. Run alone (`serial`): the bound is real time."""
    result = await place_call(
        server.url,
        [
            utterance(FIRST, VOICE, WPM),
            utterance("Wait, actually I want a table for four.", VOICE, WPM),
        ],
        barge_in_after_ms=BARGE_IN_AFTER_MS,
    )

    detail = call_detail(server, result.call_id)
    records = detail["records"]
    assert isinstance(records, list) and len(records) == 2, records
    first = records[0]
    assert first["interrupted"]

    trip = round_trip_ms(result.turns[0].voice_to_voice_ms, first["timings_ms"])
    bound = barge_in_bound_ms(trip)
    print(f"\nreply audio stopped {result.barge_in_stop_ms} ms after the caller cut in")
    print(f"bound {bound:.0f} ms = VAD audio + round trip {trip:.0f} ms + server work")
    print("\n".join(line for line in server.log if f"call {result.call_id}: barge-in," in line))
    assert result.barge_in_stop_ms is not None, "the reply never went silent"
    assert result.barge_in_stop_ms <= bound, (
        f"reply stopped {result.barge_in_stop_ms} ms after the onset, over {bound:.0f} ms "
        f"(round trip {trip:.0f} ms measured on the first turn)"
    )

    # What the caller heard of the interrupted reply, by the project's STT.
    caller_heard = words_in_order(heard(first_reply(result.reply_audio)))
    history = detail["history"]
    assert isinstance(history, list) and len(history) >= 2
    assert history[1]["role"] == "assistant"
    kept = str(history[1]["content"])
    assert kept == first["reply_text"]
    generated = words_in_order(str(first["generated_text"]))
    kept_words = words_in_order(kept)
    print(f"caller heard {' '.join(caller_heard)!r}; history {kept!r}")
    assert kept_words, "the caller heard the start of the reply"
    assert kept_words == generated[: len(kept_words)], "history is a prefix of the reply"
    assert len(kept_words) < len(generated), "history is cut"
    # The history is cut where the caller's audio was. The cut is placed by the share of the
    # sentence's audio played, counted in words, and the caller still hears what was in flight
    # at the flush: so the last two words it keeps may be unheard, and up to three words past
    # it heard, but never a sentence more or less.
    unheard = [w for w in kept_words[:-2] if w not in caller_heard]
    assert not unheard, f"history keeps {unheard}, which the caller never heard: {caller_heard}"
    past_cut = set(generated[len(kept_words) + 3 :]) - set(generated[: len(kept_words) + 3])
    beyond = [w for w in caller_heard if w in past_cut]
    assert not beyond, f"the caller heard {beyond}, past the history's cut {kept!r}"
    assert result.turns[-1].reply_start is not None, "the interrupting turn was answered"


async def test_bad_offers_get_json_400_and_the_server_keeps_serving(server: Server) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
        cases = [
            http.post("/offer", content=b"{not json", headers={"content-type": "application/json"}),
            http.post("/offer", json={"type": "offer"}),
            http.post("/offer", json={"sdp": "v=0\r\nthis is not sdp\r\n", "type": "offer"}),
            http.post("/offer", json={"sdp": "v=0\r\n", "type": "answer"}),
            http.post("/offer", json=["sdp"]),
            http.post("/offer", content=b"x" * 100_000),
        ]
        statuses = []
        for request in cases:
            response = await request
            statuses.append(response.status_code)
            assert "error" in response.json()
        assert statuses == [400, 400, 400, 400, 400, 413]
        assert (await http.get("/calls/no-such-call")).status_code == 404
    result = await place_call(server.url, [utterance(SECOND, VOICE, WPM)])
    assert result.turns[0].reply_start is not None


async def test_a_caller_who_never_connects_is_hung_up(server: Server) -> None:
    """An offer whose answer is never applied: the server gives up after its connect timeout."""
    from aiortc import RTCPeerConnection

    from voice.devtools.webrtc_caller import CallerMicrophone

    pc = RTCPeerConnection()
    pc.addTrack(CallerMicrophone())
    await pc.setLocalDescription(await pc.createOffer())
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
        offer = {"sdp": pc.localDescription.sdp, "type": "offer"}
        call_id = (await http.post("/offer", json=offer)).json()["call_id"]
        await pc.close()  # the caller vanishes before its media connects

        async def ended() -> dict[str, Any]:
            detail: dict[str, Any] = (await http.get(f"/calls/{call_id}")).json()
            return detail if detail["state"] == "ended" else {}

        # by the server's own connect timeout, 5 s in these tests
        detail: dict[str, Any] = await until(ended, "the call ended by the connect timeout", 15)
    assert detail["state"] == "ended"

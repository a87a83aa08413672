"""Whole calls over WebRTC against a real `hotline serve`: real aiortc peers, real models."""

from __future__ import annotations

import asyncio
import re

import httpx
import numpy as np
import pytest

from pipeline.stt import SpeechToText
from tests.support.server import BARGE_IN_BOUND_MS, Server
from tests.support.speech import concat, espeak, silence
from voice.devtools.webrtc_caller import place_call

pytestmark = pytest.mark.slow

FIRST = "Please book a table for two people tonight."
SECOND = "What will the weather be like in Paris tomorrow?"


def words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower()))


def utterance(text: str) -> np.ndarray:
    return concat(silence(300), espeak(text, wpm=150), silence(200))


def call_detail(server: Server, call_id: str) -> dict[str, object]:
    response = httpx.get(f"{server.url}/calls/{call_id}", timeout=10)
    response.raise_for_status()
    detail: dict[str, object] = response.json()
    return detail


async def test_two_turn_call_hears_the_callers_words(server: Server) -> None:
    # A reply opens with a short phrase ("You said,"); on a loaded runner the next chunk may
    # take a moment to synthesise, which must not be taken for the end of the reply.
    result = await place_call(server.url, [utterance(FIRST), utterance(SECOND)], quiet_s=2.0)

    assert len(result.turns) == 2
    latencies = [turn.voice_to_voice_ms for turn in result.turns]
    print(f"\nvoice-to-voice at the caller (ms): {latencies}")
    for record in result.records():
        print(f"server parts (ms since end of speech): {record['timings_ms']}")
    assert all(latency is not None for latency in latencies), "a turn got no reply audio"

    heard = SpeechToText.shared().transcribe_blocking(result.reply_audio).text
    print(f"reply audio transcribed: {heard!r}")
    assert "table" in words(heard)
    assert {"weather", "tomorrow"} <= words(heard)

    callers = result.transcripts("caller")
    assert "table" in words(callers[0]) and "weather" in words(callers[1])
    detail = call_detail(server, result.call_id)
    records = detail["records"]
    assert isinstance(records, list) and len(records) >= 1
    assert not records[0]["interrupted"]
    assert words(records[0]["reply_text"]) == words(records[0]["generated_text"])


@pytest.mark.serial
async def test_barge_in_stops_the_reply_and_truncates_history(server: Server) -> None:
    """Barge-in within 300 ms is a product requirement, measured at the caller from the onset
    of its speech to the reply going silent. What fills that time hardly depends on CPU speed:
    Silero needs a fixed amount of *audio* (about 100-200 ms) to call it speech, then the
    server cancels and flushes in a few ms of event-loop work. It is robust as long as that
    event loop is not starved, so this test runs alone (`serial`), on an otherwise idle server.
    """
    result = await place_call(
        server.url,
        [utterance(FIRST), utterance("Wait, actually I want a table for four.")],
        barge_in_after_ms=900,
    )

    print(f"\nreply audio stopped {result.barge_in_stop_ms} ms after the caller cut in")
    print("\n".join(line for line in server.log if "barge-in," in line))
    assert result.barge_in_stop_ms is not None, "the reply never went silent"
    # The product target is 300 ms (measured by `hotline call`; about 220 ms here); the bound is
    # generous so that a machine a third slower passes, and a reply that plays on still fails.
    assert result.barge_in_stop_ms < BARGE_IN_BOUND_MS

    detail = call_detail(server, result.call_id)
    records = detail["records"]
    assert isinstance(records, list)
    first = records[0]
    assert first["interrupted"]
    assert first["reply_text"], "the caller heard the start of the reply"
    assert len(first["reply_text"]) < len(first["generated_text"])
    history = detail["history"]
    assert isinstance(history, list)
    assert history[1] == {"role": "assistant", "content": first["reply_text"]}
    # The second utterance was answered.
    assert result.turns[-1].reply_start is not None


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
    result = await place_call(server.url, [utterance(SECOND)])
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
        state = "active"
        for _ in range(60):  # bounded wait for the server's own timeout (5 s in these tests)
            state = (await http.get(f"/calls/{call_id}")).json()["state"]
            if state == "ended":
                break
            await asyncio.sleep(0.25)
        assert state == "ended"

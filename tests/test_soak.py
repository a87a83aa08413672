"""Many short phone calls in a row: memory levels off, and ended calls stay readable."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from tests.support.server import start_server, stop_server
from tests.support.speech import concat, piper, silence
from voice.devtools.soak import mb_per_call, run_soak, stream_url
from voice.devtools.twilio_call import place_twilio_call

pytestmark = pytest.mark.slow

CALLS, WARMUP, SECONDS = 60, 10, 0.3
# Measured on a 2-core machine: a server that kept each ended call's conversation (transport,
# turn detector, resamplers) grew 0.25 MB per short silent call; keeping only the records,
# 0.01 to 0.03. RSS per call does not depend on the machine's speed; the bound leaves room
# for allocator noise (a 2 MB step midway through 50 calls adds 0.06 to the slope).
MAX_MB_PER_CALL = 0.12


def test_the_slope_is_a_least_squares_fit() -> None:
    assert mb_per_call([100.0, 101.0, 102.0, 103.0]) == pytest.approx(1.0)
    assert mb_per_call([100.0, 102.0, 100.0, 102.0]) == pytest.approx(0.4)
    assert mb_per_call([5.0]) == 0.0


async def test_memory_levels_off_and_ended_calls_keep_their_records() -> None:
    server = start_server()
    try:
        # A call with one spoken turn first, so the oldest ended call has a record to keep.
        spoken = concat(silence(300), piper("Please book a table for two people tonight."))
        first = await place_twilio_call(stream_url(server.url), [concat(spoken, silence(200))])
        assert first.rejected is None and first.turns and first.turns[0].reply_start is not None

        report = await run_soak(server.url, CALLS, seconds=SECONDS, warmup=WARMUP)
        print("\n" + "\n".join(report.lines()))

        async with httpx.AsyncClient(timeout=10) as http:
            detail = (await http.get(f"{server.url}/calls/{first.call_id}")).json()
            last = (await http.get(f"{server.url}/calls/{report.call_ids[-1]}")).json()
    finally:
        code = stop_server(server)
    assert code == 0, "\n".join(server.log[-40:])

    assert len(report.rss_mb) == CALLS and np.isfinite(report.mb_per_call)
    assert report.mb_per_call < MAX_MB_PER_CALL, report.lines()
    # Ended calls read back from this worker's memory: records, history, why they ended.
    assert detail["state"] == "ended" and detail["transport"] == "twilio"
    assert detail["turns"] == 1 and "table" in detail["records"][0]["caller_text"].lower()
    assert [m["role"] for m in detail["history"]][-2:] == ["user", "assistant"]
    assert detail["end_reason"] is not None
    assert last["state"] == "ended" and last["records"] == [] and "history" in last

"""The models' waiting lines as Prometheus gauges: what /metrics says is what is queued."""

from __future__ import annotations

import asyncio
import threading

from prometheus_client import REGISTRY

from pipeline.scheduling import UrgentFirst
from voice.server import metrics


async def test_waiting_jobs_are_counted_once_per_line() -> None:
    stt, tts = UrgentFirst(1, "stt-test"), UrgentFirst(1, "tts-test")
    metrics.watch_queues([stt, stt], [tts])  # two models sharing one line count it once
    release = threading.Event()
    busy = asyncio.create_task(stt.run(release.wait))
    queued = [asyncio.create_task(stt.run(lambda: None)) for _ in range(2)]
    await asyncio.sleep(0)  # one scheduling turn: each task runs up to the line (no timing)
    assert stt.waiting == 2
    assert REGISTRY.get_sample_value("hotline_stt_waiting") == 2
    assert REGISTRY.get_sample_value("hotline_tts_waiting") == 0
    release.set()
    await asyncio.gather(busy, *queued)
    assert REGISTRY.get_sample_value("hotline_stt_waiting") == 0

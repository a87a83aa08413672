"""The caller's audio through `StreamResampler`: little held back, no seams between chunks."""

from __future__ import annotations

import numpy as np
import pytest

from voice.audio import StreamResampler


def tone(rate: int, seconds: float) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (8000 * np.sin(2 * np.pi * 440 * t)).astype(np.int16)


@pytest.mark.parametrize(("source", "target"), [(8_000, 16_000), (16_000, 8_000)])
def test_a_stream_holds_back_only_a_few_milliseconds(source: int, target: int) -> None:
    """Whatever the stream holds reaches the VAD late: soxr's "HQ" held 66 ms here."""
    stream = StreamResampler(source, target)
    pcm = tone(source, 1.0)
    chunk = source // 50  # 20 ms, as phones send them
    out = sum(len(stream(pcm[i : i + chunk])) for i in range(0, len(pcm), chunk))
    held_ms = (target - out) / target * 1000
    assert 0 <= held_ms <= 5
    assert out + len(stream(np.zeros(0, dtype=np.int16), last=True)) == target


def test_chunks_join_as_if_resampled_in_one_piece() -> None:
    pcm = tone(8_000, 0.5)
    whole = StreamResampler(8_000, 16_000)(pcm, last=True)
    stream = StreamResampler(8_000, 16_000)
    pieces = [stream(pcm[i : i + 160]) for i in range(0, len(pcm), 160)]
    chunked = np.concatenate([*pieces, stream(np.zeros(0, dtype=np.int16), last=True)])
    assert len(chunked) == len(whole) == 8_000
    assert np.max(np.abs(chunked.astype(np.int32) - whole)) <= 2  # rounding; a seam is hundreds


def test_the_same_rate_passes_through() -> None:
    pcm = tone(16_000, 0.1)
    assert np.array_equal(StreamResampler(16_000, 16_000)(pcm), pcm)

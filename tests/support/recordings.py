"""Reading a call recording back in tests: its two channels as 16 kHz PCM."""

from __future__ import annotations

import io

import av
import numpy as np

from pipeline.transport import PCM, SAMPLE_RATE
from voice.audio import resample


def channels(ogg: bytes) -> tuple[PCM, PCM]:
    """Left (the caller) and right (what the caller heard) of an Ogg/Opus recording."""
    with av.open(io.BytesIO(ogg), mode="r") as container:
        stream = container.streams.audio[0]
        assert stream.codec_context.name == "opus" and stream.codec_context.channels == 2
        planar = np.concatenate([f.to_ndarray() for f in container.decode(stream)], axis=1)
        rate = stream.codec_context.sample_rate
    sides = [(np.clip(planar[i], -1, 1) * 32767).astype(np.int16) for i in range(2)]
    left, right = (resample(side, rate, SAMPLE_RATE) for side in sides)
    return left, right

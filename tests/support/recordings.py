"""Reading a call recording back in tests: its two channels as 16 kHz PCM, and where each is
audible, in 20 ms frames of audio time."""

from __future__ import annotations

import io

import av
import numpy as np

from pipeline.transport import FRAME_SAMPLES, PCM, SAMPLE_RATE
from voice.audio import resample, rms
from voice.devtools.turns import AUDIBLE_RMS

FRAME_S = FRAME_SAMPLES / SAMPLE_RATE


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


def audible(pcm: PCM) -> list[bool]:
    """Each whole 20 ms frame of `pcm`: audible or not, by the test callers' own measure
    (`voice.devtools.turns.AUDIBLE_RMS`, what the faithful phone counts as reply audio)."""
    return [
        rms(pcm[i : i + FRAME_SAMPLES]) > AUDIBLE_RMS
        for i in range(0, len(pcm) - FRAME_SAMPLES + 1, FRAME_SAMPLES)
    ]

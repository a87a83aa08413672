"""Audio helpers at the edge: WAV files, levels, framing (the pipeline's 16 kHz mono int16)."""

from __future__ import annotations

import wave
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import soxr

from pipeline.transport import FRAME_SAMPLES, SAMPLE_RATE

PCM = npt.NDArray[np.int16]


def read_wav(path: str | Path, rate: int = SAMPLE_RATE) -> PCM:
    """Read a PCM16 WAV file as mono int16 at `rate` (channels averaged, resampled with soxr)."""
    with wave.open(str(path), "rb") as wav:
        if wav.getsampwidth() != 2:
            raise ValueError(f"{path}: only 16-bit PCM WAV is supported")
        channels = wav.getnchannels()
        source_rate = wav.getframerate()
        data = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2")
    if channels > 1:
        data = data.reshape(-1, channels).mean(axis=1).astype(np.int16)
    if source_rate != rate:
        data = soxr.resample(data, source_rate, rate)
    return np.ascontiguousarray(data, dtype=np.int16)


def write_wav(path: str | Path, pcm: PCM, rate: int = SAMPLE_RATE) -> None:
    """Write mono int16 samples as a PCM16 WAV file."""
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(np.ascontiguousarray(pcm, dtype="<i2").tobytes())


def rms(pcm: PCM) -> float:
    """Root mean square level of int16 samples (0 for an empty array)."""
    if pcm.size == 0:
        return 0.0
    return float(np.sqrt(np.mean(np.square(pcm.astype(np.float32)))))


def frames(pcm: PCM, size: int = FRAME_SAMPLES) -> Iterator[PCM]:
    """Split into frames of `size` samples, zero-padding the last one."""
    for start in range(0, len(pcm), size):
        frame = pcm[start : start + size]
        if len(frame) < size:
            frame = np.concatenate([frame, np.zeros(size - len(frame), dtype=np.int16)])
        yield frame

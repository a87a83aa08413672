"""Test speech: espeak-ng utterances, silence and framing, as 16 kHz mono int16 arrays.

Shared by the whole test suite. Generated audio is cached in memory per (text, voice, wpm), so
asking twice for the same phrase costs nothing; callers get a fresh copy each time and may
modify it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import numpy as np

from voice.audio import espeak, resample, write_wav
from voice.audio import frames as audio_frames

__all__ = ["concat", "espeak", "frames", "noise", "piper", "resample", "silence", "write_wav"]

RATE = 16_000


def piper(text: str) -> np.ndarray:
    """Speak `text` with piper's bundled voice (natural-sounding); int16 16 kHz mono."""
    return _piper_cached(text).copy()


@functools.cache
def _piper_cached(text: str) -> np.ndarray:
    from pipeline.tts import TextToSpeech

    voice = TextToSpeech.shared()
    return resample(voice.synthesize_blocking(text), voice.sample_rate, RATE)


def silence(ms: int) -> np.ndarray:
    """`ms` milliseconds of digital silence at 16 kHz."""
    return np.zeros(RATE * ms // 1000, dtype=np.int16)


def noise(ms: int, level: float = 0.01, seed: int = 0) -> np.ndarray:
    """White noise at RMS `level` (fraction of full scale), reproducible by `seed`."""
    rng = np.random.default_rng(seed)
    samples = rng.normal(0.0, level * 32768.0, RATE * ms // 1000)
    return np.clip(np.round(samples), -32768, 32767).astype(np.int16)


def concat(*parts: np.ndarray) -> np.ndarray:
    """Join int16 clips end to end."""
    if not parts:
        return np.zeros(0, dtype=np.int16)
    return np.concatenate([np.asarray(p, dtype=np.int16) for p in parts])


def frames(pcm: np.ndarray, ms: int = 20) -> Iterator[np.ndarray]:
    """Split audio into `ms`-long frames; the last one is zero-padded to full length."""
    return audio_frames(pcm, RATE * ms // 1000)

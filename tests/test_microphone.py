"""The scripted caller's microphone: digital silence by default, or a line's own noise on every
frame (`hotline bench --line-noise`)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from voice.devtools.bench import run_bench
from voice.devtools.microphone import Microphone


def rms(frames: list[np.ndarray]) -> float:
    samples = np.concatenate(frames).astype(np.float64)
    return float(np.sqrt(np.mean(samples**2)))


def test_without_noise_the_line_is_digitally_silent() -> None:
    mic = Microphone(8000)
    assert all(not mic.next_frame(float(i)).any() for i in range(50))


def test_line_noise_has_its_level_in_silence_and_under_speech() -> None:
    async def frames() -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
        quiet, noisy = Microphone(8000), Microphone(8000, noise_dbfs=-50)
        tone = (np.sin(np.arange(16000) / 3) * 8000).astype(np.int16)  # 1 s at 16 kHz
        silence = [noisy.next_frame(float(i)) for i in range(100)]
        clean_said, noisy_said = quiet.say(tone), noisy.say(tone)
        clean = [quiet.next_frame(float(i)) for i in range(50)]
        spoken = [noisy.next_frame(float(i)) for i in range(50)]
        await asyncio.gather(clean_said, noisy_said)  # every frame of the utterance went out
        return silence, clean, spoken

    silence, clean, spoken = asyncio.run(frames())
    level = 10 ** (-50 / 20) * 32768  # 104 in int16
    assert rms(silence) == pytest.approx(level, rel=0.1)
    added = [s.astype(np.int32) - c for s, c in zip(spoken, clean, strict=True)]
    assert rms(added) == pytest.approx(level, rel=0.1)  # the speech is all there, noise on top


def test_line_noise_is_refused_where_no_caller_simulates_it() -> None:
    with pytest.raises(ValueError, match="line noise"):
        asyncio.run(run_bench("http://127.0.0.1:9", "webrtc", 1, 1, line_noise_dbfs=-50))

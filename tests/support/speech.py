"""Test speech: espeak-ng utterances, silence and framing, as 16 kHz mono int16 arrays.

Shared by the whole test suite. Generated audio is cached in memory per (text, voice, wpm), so
asking twice for the same phrase costs nothing; callers get a fresh copy each time and may
modify it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator

import numpy as np

from voice.audio import espeak, resample, write_wav
from voice.audio import frames as audio_frames

__all__ = [
    "concat",
    "espeak",
    "frames",
    "heard",
    "noise",
    "piper",
    "resample",
    "silence",
    "utterance",
    "words",
    "words_in_order",
    "write_wav",
]

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


def utterance(text: str, voice: str = "piper", wpm: int = 150) -> np.ndarray:
    """A caller's turn: 300 ms of silence, `text` spoken, 200 ms of silence.

    `voice="piper"` (the default) is the bundled natural-sounding voice: robotic espeak loses
    too many words on an 8 kHz line (README, "Telephone speech recognition"). Any other value is
    an espeak-ng voice (e.g. `"en-us"`), spoken at `wpm` words a minute."""
    spoken = piper(text) if voice == "piper" else espeak(text, voice, wpm=wpm)
    return concat(silence(300), spoken, silence(200))


_WORD = re.compile(r"[a-z0-9']+")


def words_in_order(text: str) -> list[str]:
    """The words of `text`, lower case, in order (digits and apostrophes kept: "don't", "42")."""
    return _WORD.findall(text.lower())


def words(text: str) -> set[str]:
    """The set of words in `text` (see `words_in_order`)."""
    return set(words_in_order(text))


def heard(pcm: np.ndarray, gap_s: float = 1.0) -> str:
    """What the bundled Whisper model transcribes from 16 kHz `pcm`: what a caller heard.

    Stretches of sound apart by `gap_s` of quiet are transcribed one by one: on a call of more
    than 30 s, Whisper's windows (no timestamps) cut words at every 30 s mark, however the
    sound falls (a loaded runner's slow turns lost a reply's first half to it)."""
    from pipeline.stt import SpeechToText

    stt = SpeechToText.shared()
    return " ".join(
        text for part in sound_spans(pcm, gap_s) if (text := stt.transcribe_blocking(part).text)
    )


def sound_spans(pcm: np.ndarray, gap_s: float, level: float = 300.0) -> list[np.ndarray]:
    """The parts of `pcm` with sound (20 ms frames of RMS above `level`) that are `gap_s` or
    more apart, each with 0.2 s of what surrounds it."""
    step = RATE // 50
    count = len(pcm) // step
    rms = np.sqrt(np.mean(pcm[: count * step].reshape(-1, step).astype(np.float64) ** 2, axis=1))
    loud = np.flatnonzero(rms > level)
    if loud.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(loud) * step >= gap_s * RATE)
    starts = [loud[0], *loud[breaks + 1]]
    ends = [*loud[breaks], loud[-1]]
    pad = RATE // 5
    return [
        pcm[max(0, a * step - pad) : min(len(pcm), (b + 1) * step + pad)]
        for a, b in zip(starts, ends, strict=True)
    ]

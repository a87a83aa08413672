"""Silero rests on a line's own noise (`SpeechProbability`'s noise margin) and still hears the
caller as when it hears every window: Allison's recorded prompts (human speech, Debian's
Asterisk sounds, fetched as `hotline turn-bench` fetches them) over a phone line carrying white
noise. Positions are samples of the audio fed in, the detector's own clock."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.turns import SpeechStarted, TurnDetector, TurnSegment, TurnSettings
from pipeline.vad import NOISE_WINDOWS, WINDOW
from voice.audio import PCM, read_wav
from voice.devtools.turn_bench.decisions import phone_line
from voice.devtools.turn_bench.sources import ASTERISK_SOUNDS, sources_dir

RATE = 16000
PROMPTS = (
    "vm-savefolder",
    "privacy-prompt",
    "check-number-dial-again",
    "vm-intro",
    "conf-getpin",
    "vm-password",
    "pbx-invalid",
    "vm-leavemsg",
    "queue-callswaiting",
    "agent-pass",
)
NOISE_DBFS = -50.0  # RMS: a quiet room over the phone


@pytest.fixture(scope="module")
def sounds() -> Path:
    return sources_dir() / ASTERISK_SOUNDS


def on_a_noisy_line(speech: PCM, seed: int, gain: float = 1.0) -> PCM:
    """1.5 s of the line, `speech` (times `gain`), 1.5 s of the line; white noise throughout;
    8 kHz μ-law."""
    lead = np.zeros(RATE * 3 // 2)
    audio = np.concatenate([lead, speech.astype(np.float64) * gain, lead])
    level = 10 ** (NOISE_DBFS / 20) * 32768
    audio += np.random.default_rng(seed).normal(0.0, level, len(audio))
    return phone_line(np.clip(np.round(audio), -32768, 32767).astype(np.int16))


def heard(detector: TurnDetector, pcm: PCM) -> list[tuple[str, int]]:
    """Each start and end of speech, with where it was decided (samples), fed in 20 ms frames."""
    events = []
    for start in range(0, len(pcm), 320):
        for event in detector.push(pcm[start : start + 320], (start + 320) / RATE):
            if isinstance(event, SpeechStarted):
                events.append(("started", round(event.at * RATE)))
            elif isinstance(event, TurnSegment):
                events.append(("ended", event.end_position))
    return events


def test_a_noisy_line_rests_silero_once_it_has_learned_the_noise() -> None:
    pcm = on_a_noisy_line(np.zeros(0, dtype=np.int16), seed=1)  # 3 s of the line alone
    resting, every = TurnDetector(), TurnDetector(TurnSettings(noise_margin=0))

    assert heard(resting, pcm) == heard(every, pcm) == []
    assert every._vad.runs == len(pcm) // WINDOW  # above the quiet floor: all of it, before
    assert resting._vad.runs <= NOISE_WINDOWS + 5  # the noise learned, then hardly a run


@pytest.mark.parametrize("gain", [1.0, 0.1], ids=["as-recorded", "a-quiet-caller"])
def test_human_speech_on_a_noisy_line_is_heard_as_with_silero_on_every_window(
    sounds: Path, gain: float
) -> None:
    """Every start and end of each prompt's speech within two windows of where Silero hearing
    every window puts it (one apart at most, measured), for 65% of the Silero runs or fewer.
    The quiet caller (20 dB down, 10 dB over the noise) is where a margin too wide would miss
    words: 6 (16 dB) fails here, 3 does not."""
    runs = {"resting": 0, "every": 0}
    for seed, name in enumerate(PROMPTS):
        pcm = on_a_noisy_line(read_wav(sounds / f"{name}.wav"), seed, gain)
        resting, every = TurnDetector(), TurnDetector(TurnSettings(noise_margin=0))
        got, expected = heard(resting, pcm), heard(every, pcm)

        assert [kind for kind, _ in got] == [kind for kind, _ in expected], name
        for (_, position), (_, reference) in zip(got, expected, strict=True):
            assert abs(position - reference) <= 2 * WINDOW, name
        runs["resting"] += resting._vad.runs
        runs["every"] += every._vad.runs
    assert runs["resting"] < 0.65 * runs["every"]  # 53% measured as recorded


def test_when_the_line_gets_quieter_a_quiet_caller_is_still_heard(sounds: Path) -> None:
    """The noise falls from -40 to -60 dBFS, then a caller speaks softly (about -54 dBFS, under
    what the louder noise was): the line's noise is followed down, so the turn is heard and
    ends where Silero on every window ends it (held at the louder noise, Silero would rest on
    all of it and hear nothing). Its start may come later (190 ms measured): Silero's state is
    still that of the louder line it last heard."""
    rng = np.random.default_rng(5)
    loud, quiet = (10 ** (dbfs / 20) * 32768 for dbfs in (-40, -60))
    speech = read_wav(sounds / "vm-savefolder.wav").astype(np.float64) * 0.02
    lines = [rng.normal(0.0, loud, RATE * 3 // 2), rng.normal(0.0, quiet, RATE * 3 // 2)]
    lines += [speech + rng.normal(0.0, quiet, len(speech)), rng.normal(0.0, quiet, RATE)]
    pcm = phone_line(np.clip(np.round(np.concatenate(lines)), -32768, 32767).astype(np.int16))
    resting, every = TurnDetector(), TurnDetector(TurnSettings(noise_margin=0))
    got, expected = heard(resting, pcm), heard(every, pcm)

    assert [kind for kind, _ in expected] == [kind for kind, _ in got] == ["started", "ended"]
    assert abs(got[1][1] - expected[1][1]) <= 2 * WINDOW
    assert 0 <= got[0][1] - expected[0][1] <= RATE // 2

"""The call recorder: stereo Ogg/Opus, caller left and what was heard right, barge-in cuts,
jitter, gaps, and a file that survives a crash (tests/test_recorder.py)."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
import pytest

from pipeline.transport import FRAME_SAMPLES, PCM, SAMPLE_RATE
from voice.audio import resample
from voice.recordings.recorder import CallRecorder, RecordingWriter


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def tone(hz: float, seconds: float, amplitude: int = 8000) -> PCM:
    t = np.arange(round(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    return (amplitude * np.sin(2 * np.pi * hz * t)).astype(np.int16)


def decode(path: Path) -> tuple[PCM, PCM]:
    """Left and right channels at 16 kHz."""
    with av.open(str(path)) as container:
        stream = container.streams.audio[0]
        assert stream.codec_context.name == "opus"
        assert stream.codec_context.channels == 2
        parts = [frame.to_ndarray() for frame in container.decode(stream)]
    planar = np.concatenate(parts, axis=1)  # fltp: (2, n) at 48 kHz
    sides = [(np.clip(planar[i], -1, 1) * 32767).astype(np.int16) for i in range(2)]
    rate = 48_000
    left, right = (resample(side, rate, SAMPLE_RATE) for side in sides)
    return left, right


def rms(pcm: PCM, start_s: float, end_s: float) -> float:
    part = pcm[round(start_s * SAMPLE_RATE) : round(end_s * SAMPLE_RATE)].astype(np.float64)
    return float(np.sqrt(np.mean(part**2))) if part.size else 0.0


@pytest.fixture
def writer() -> RecordingWriter:
    w = RecordingWriter()
    yield w  # type: ignore[misc]
    w.shutdown()


def feed_caller(recorder: CallRecorder, clock: Clock, pcm: PCM, jitter_s: float = 0.0) -> None:
    """Caller audio in 20 ms frames, each arriving when its last sample was spoken (+ jitter)."""
    rng = np.random.default_rng(7)
    for start in range(0, pcm.size, FRAME_SAMPLES):
        clock.now += FRAME_SAMPLES / SAMPLE_RATE
        late = float(rng.uniform(0, jitter_s)) if jitter_s else 0.0
        recorder.caller(pcm[start : start + FRAME_SAMPLES], clock.now + late)


async def test_caller_left_heard_right_and_a_cut_reply(
    tmp_path: Path, writer: RecordingWriter
) -> None:
    clock = Clock()
    recorder = CallRecorder("c1", tmp_path / "c1.ogg", writer, clock=clock)
    caller = tone(300, 4.0)
    reply = tone(1200, 2.0)
    per_s = SAMPLE_RATE // FRAME_SAMPLES  # 50 frames a second
    for n in range(4 * per_s):
        clock.now += 1 / per_s
        recorder.caller(caller[n * FRAME_SAMPLES : (n + 1) * FRAME_SAMPLES], clock.now)
        if per_s <= n < 2 * per_s:
            # the reply's frames are sent from 1 s on, 200 ms ahead of when they play
            offset = (n - per_s) * FRAME_SAMPLES
            recorder.heard(reply[offset : offset + FRAME_SAMPLES], clock.now + 0.2)
        if n == 2 * per_s:
            recorder.cut(clock.now)  # barge-in at 2 s: what was sent ahead never plays
    info = await recorder.close()
    assert info.bytes > 0
    assert info.duration_s == pytest.approx(4.0, abs=0.1)
    left, right = decode(info.path)
    assert rms(left, 0.2, 3.8) > 3000
    assert rms(right, 0.0, 1.1) < 300  # nothing heard before the reply played (at 1.2 s)
    assert rms(right, 1.3, 1.9) > 3000  # the reply, heard
    assert rms(right, 2.1, 4.0) < 300  # cut at 2.0 s although sent up to 2.2 s and beyond
    # the right side is the reply, the left the caller: compare their spectra's peaks
    spectrum = np.abs(np.fft.rfft(right[round(1.3 * SAMPLE_RATE) : round(1.9 * SAMPLE_RATE)]))
    peak_hz = np.argmax(spectrum) * SAMPLE_RATE / (2 * (spectrum.size - 1))
    assert peak_hz == pytest.approx(1200, abs=20)


async def test_jitter_neither_tears_nor_stretches_the_caller(
    tmp_path: Path, writer: RecordingWriter
) -> None:
    clock = Clock()
    recorder = CallRecorder("c2", tmp_path / "c2.ogg", writer, clock=clock)
    feed_caller(recorder, clock, tone(300, 3.0), jitter_s=0.04)
    info = await recorder.close()
    left, _ = decode(info.path)
    # continuous: no 20 ms window of silence inside the tone
    windows = [rms(left, s, s + 0.02) for s in np.arange(0.1, 2.9, 0.02)]
    assert min(windows) > 2000
    assert info.duration_s == pytest.approx(3.0, abs=0.1)


async def test_a_pause_in_the_caller_audio_stays_a_pause(
    tmp_path: Path, writer: RecordingWriter
) -> None:
    clock = Clock()
    recorder = CallRecorder("c3", tmp_path / "c3.ogg", writer, clock=clock)
    feed_caller(recorder, clock, tone(300, 1.0))
    clock.now += 1.0  # nothing arrives for a second
    feed_caller(recorder, clock, tone(300, 1.0))
    info = await recorder.close()
    left, _ = decode(info.path)
    assert info.duration_s == pytest.approx(3.0, abs=0.1)
    assert rms(left, 1.2, 1.8) < 300
    assert rms(left, 2.2, 2.8) > 3000


async def test_a_crash_loses_at_most_the_last_seconds(
    tmp_path: Path, writer: RecordingWriter
) -> None:
    clock = Clock()
    recorder = CallRecorder("c4", tmp_path / "c4.ogg", writer, clock=clock)
    feed_caller(recorder, clock, tone(300, 8.0))
    await recorder.flushed()  # the process dies here: close() never runs
    left, _ = decode(tmp_path / "c4.ogg")
    assert left.size / SAMPLE_RATE > 8.0 - 2.5
    assert rms(left, 0.2, 5.0) > 3000


async def test_an_unwritable_directory_loses_the_recording_not_the_call(
    tmp_path: Path, writer: RecordingWriter
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    clock = Clock()
    recorder = CallRecorder("c5", blocker / "c5.ogg", writer, clock=clock)
    feed_caller(recorder, clock, tone(300, 3.0))
    info = await recorder.close()
    assert info.bytes == 0

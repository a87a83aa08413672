"""`hotline serve` keeps FFmpeg from starting a thread pool per audio filter graph
(voice/server/ffmpeg.py): PyAV's resampler and a recording's Opus encoder, run in a fresh
interpreter, start threads of their own unless FFmpeg counts one core."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

PROBE = textwrap.dedent(
    """
    import os, sys, tempfile
    from pathlib import Path
    import av, numpy as np
    from voice.server.ffmpeg import single_threaded_ffmpeg
    from voice.recordings.recorder import _OggOpusFile

    forced = single_threaded_ffmpeg() if sys.argv[1] == "single" else False
    before = len(os.listdir("/proc/self/task"))
    # The caller's WebRTC audio to 16 kHz mono, as the WebRTC transport converts it.
    resampler = av.AudioResampler(format="s16", layout="mono", rate=16000)
    frame = av.AudioFrame.from_ndarray(
        np.zeros((1, 1920), dtype=np.int16), format="s16", layout="stereo"
    )
    frame.sample_rate = 48000
    resampler.resample(frame)
    # A second of a call recording, encoded to Ogg/Opus as the recorder's writer does.
    recording = _OggOpusFile(Path(tempfile.mkdtemp()) / "call.ogg", 48000)
    recording.write(np.ones((2, 48000), dtype=np.int16))
    recording.close()
    assert not recording.failed and recording.path.stat().st_size > 0
    print(forced, len(os.listdir("/proc/self/task")) - before)
    """
)


def threads_started(mode: str) -> tuple[bool, int]:
    done = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    forced, started = done.stdout.split()
    return forced == "True", int(started)


def test_one_core_for_ffmpeg_starts_no_threads_for_audio() -> None:
    assert threads_started("single") == (True, 0)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="FFmpeg pools only with 2+ cores")
def test_without_it_each_graph_starts_a_pool() -> None:
    forced, started = threads_started("default")
    assert not forced
    assert started >= 2  # a pool for the resampler's graph and one for the recording's

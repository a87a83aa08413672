"""How many threads FFmpeg starts for the server's audio filter graphs.

PyAV converts audio through an FFmpeg filter graph (`av.AudioResampler`): the caller's WebRTC
audio to 16 kHz mono, aiortc's reply audio to 48 kHz stereo in its Opus encoder, and every
recording's audio into libopus's 20 ms frames. FFmpeg gives each graph a pool of one thread per
core, up to eight, which audio filters never use (they have no slice threading): measured on
2 cores, 2 idle threads per recorded phone call and 8 per recorded WebRTC call; on 8 cores or
more, 8 per graph, so a few dozen calls run into a container's process limit (Docker's and
Kubernetes' pids limits count threads).

`single_threaded_ffmpeg` is called by `hotline serve` before any call: FFmpeg then takes the
machine for one core (`av_cpu_force_count(1)` in PyAV's own libavutil) and starts no pools;
the audio is converted on the thread that asks, as before. Without libavutil's symbol (a PyAV
built otherwise) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from pathlib import Path

import av  # noqa: F401  (loads PyAV's libraries: the libavutil changed here is theirs)

log = logging.getLogger(__name__)


def _libavutil() -> str | None:
    """The libavutil this process loaded for PyAV (a wheel bundles its own, under a hashed
    name), else the system's."""
    maps = Path("/proc/self/maps")
    if maps.exists():
        for line in maps.read_text().splitlines():
            fields = line.split(maxsplit=5)  # address, perms, offset, device, inode, path
            if len(fields) == 6 and Path(fields[5]).name.startswith("libavutil"):
                return fields[5]
    return ctypes.util.find_library("avutil")


def single_threaded_ffmpeg() -> bool:
    """Make FFmpeg count one core, so that its filter graphs start no thread pools; whether
    that took effect."""
    path = _libavutil()
    if path is None:
        return False
    try:
        force = ctypes.CDLL(path).av_cpu_force_count
    except (OSError, AttributeError):
        log.info("ffmpeg: no av_cpu_force_count in %s; its thread pools stay", path)
        return False
    force.argtypes = [ctypes.c_int]
    force.restype = None
    force(1)
    return True

"""The stereo recording of one call, written as the call goes: the caller on the left, what the
caller heard on the right, cut where a barge-in cut the reply.

Format: Opus in Ogg (libopus through `av`). Speech at 48 kb/s in Opus is what a contact centre
keeps for years at a seventh of FLAC's size (16 kHz stereo FLAC: ~350 kb/s), every browser's
<audio> plays it (the console's player), and Ogg needs no index at the end: a file cut short by a
crash plays up to its last page. Pages are written every second (`page_duration`) and flushed
at once (`flush_packets`), so a crash loses about the last two seconds.

Placement: each side keeps a cursor in samples since the recording began. A chunk is placed
where the clock says it belongs (caller audio ends when it arrived; reply audio starts when it
plays), unless that is within `_SLACK_S` of the side's cursor, in which case it follows on
without a gap: network jitter neither tears nor overlaps the audio, while real gaps (the bot
silent between replies) stay silent. `cut(at)` removes reply audio placed after `at`.

Encoding happens on one shared thread (`RecordingWriter`), never on the event loop: the loop
only copies samples into a buffer and hands a second of settled audio over at a time. Audio is
settled once it is `_HOLD_S` old (reply audio is placed up to the phone's lead ahead of time,
and a barge-in may still cut it).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import av
import numpy as np

from pipeline.scheduling import name_os_thread
from pipeline.transport import PCM, SAMPLE_RATE

log = logging.getLogger(__name__)

CONTENT_TYPE = "audio/ogg"
_SLACK_S = 0.06  # a chunk this close to its side's cursor follows on without a gap
_HOLD_S = 0.5  # audio younger than this may still move or be cut
_BLOCK_S = 1.0  # settled audio handed to the writer at a time
# libopus's effort, 0-10. At 48 kb/s, three of Allison's prompts on both sides (PESQ wideband,
# decoded against the original): 0 scores 4.02, 2 4.05, 5 4.01, 10 4.43, for 0.13, 0.16, 0.20
# and 0.27 CPU-s a minute of audio: below 10 the effort buys nothing that PESQ hears.
_COMPLEXITY = "0"


@dataclass(frozen=True)
class RecordingInfo:
    """A finished recording: its file, length and size (bytes 0: nothing could be written)."""

    path: Path
    duration_s: float
    bytes: int


class RecordingWriter:
    """The thread every recording of this process is encoded and written on, in order."""

    def __init__(self) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="recorder", initializer=name_os_thread
        )

    def submit(self, job: Any, *args: Any) -> concurrent.futures.Future[Any]:
        return self._pool.submit(job, *args)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)


class _OggOpusFile:
    """One open recording file (used on the writer thread only)."""

    def __init__(self, path: Path, bitrate: int) -> None:
        self.path = path
        self.bitrate = bitrate
        self.samples = 0
        self.failed = False
        self._container: Any = None
        self._stream: Any = None

    def write(self, block: np.ndarray[Any, np.dtype[np.int16]]) -> None:
        """Encode a (2, n) block of int16 samples and write whatever pages are complete."""
        if self.failed:
            return
        try:
            if self._container is None:
                self._open()
            frame = av.AudioFrame.from_ndarray(
                np.ascontiguousarray(block.T).reshape(1, -1), format="s16", layout="stereo"
            )
            frame.sample_rate = SAMPLE_RATE
            frame.pts = self.samples
            self.samples += block.shape[1]
            for packet in self._stream.encode(frame):
                self._container.mux(packet)
        except (OSError, av.FFmpegError) as exc:
            self._fail(exc)

    def close(self) -> None:
        if self._container is None or self.failed:
            return
        try:
            for packet in self._stream.encode(None):
                self._container.mux(packet)
            self._container.close()
        except (OSError, av.FFmpegError) as exc:
            self._fail(exc)

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        options = {"page_duration": str(int(_BLOCK_S * 1e6)), "flush_packets": "1"}
        self._container = av.open(str(self.path), "w", format="ogg", options=options)
        stream = self._container.add_stream(
            "libopus", rate=SAMPLE_RATE, layout="stereo", options={"compression_level": _COMPLEXITY}
        )
        stream.bit_rate = self.bitrate
        self._stream = stream

    def _fail(self, exc: BaseException) -> None:
        self.failed = True
        log.error("recording %s: writing failed, the rest is not recorded: %s", self.path, exc)
        if self._container is not None:
            with contextlib.suppress(OSError, av.FFmpegError):
                self._container.close()


class CallRecorder:
    """An `AudioTap` that records one call to `path` (see the module docstring)."""

    def __init__(
        self,
        call_id: str,
        path: Path,
        writer: RecordingWriter,
        *,
        bitrate: int = 48_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.call_id = call_id
        self.path = path
        self._writer = writer
        self._file = _OggOpusFile(path, bitrate)
        self._clock = clock
        self._t0 = clock()
        self._base = 0  # sample index of _buffer's first column (everything before is written)
        self._buffer = np.zeros((2, 2 * SAMPLE_RATE), dtype=np.int16)
        self._cursors = [0, 0]  # caller, heard: sample index after each side's last sample
        self._pending: list[concurrent.futures.Future[Any]] = []
        self._closed = False

    # -- AudioTap ----------------------------------------------------------------------------

    def caller(self, pcm: PCM, at: float) -> None:
        self._place(0, pcm, self._index(at) - int(pcm.size))
        self._settle(at)

    def heard(self, pcm: PCM, at: float) -> None:
        self._place(1, pcm, self._index(at))
        self._settle(self._clock())

    def cut(self, at: float) -> None:
        cut = max(self._index(at), self._base)
        if self._cursors[1] > cut:
            self._buffer[1, cut - self._base : self._cursors[1] - self._base] = 0
            self._cursors[1] = cut

    # -- the end -----------------------------------------------------------------------------

    async def flushed(self) -> None:
        """Wait until every second handed to the writer so far is in the file."""
        await asyncio.gather(*(asyncio.wrap_future(f) for f in self._pending))

    async def close(self) -> RecordingInfo:
        """Write everything placed so far and close the file (off the event loop)."""
        if not self._closed:
            self._closed = True
            self._hand_over(max(self._cursors))
            self._pending.append(self._writer.submit(self._file.close))
        await asyncio.gather(*(asyncio.wrap_future(f) for f in self._pending))
        self._pending.clear()
        size = self.path.stat().st_size if self.path.exists() else 0
        return RecordingInfo(self.path, self._file.samples / SAMPLE_RATE, size)

    # -- placement ---------------------------------------------------------------------------

    def _index(self, at: float) -> int:
        return round((at - self._t0) * SAMPLE_RATE)

    def _place(self, side: int, pcm: PCM, start: int) -> None:
        if self._closed or pcm.size == 0:
            return
        cursor = self._cursors[side]
        if start > cursor + _SLACK_S * SAMPLE_RATE:
            cursor = start  # a real gap: silence until then
        skip = max(0, self._base - cursor)  # already written: too late for that part
        if skip >= pcm.size:
            return
        cursor += skip
        samples = pcm[skip:]
        end = cursor + int(samples.size)
        self._reserve(end)
        self._buffer[side, cursor - self._base : end - self._base] = samples
        self._cursors[side] = end

    def _reserve(self, end: int) -> None:
        needed = end - self._base
        if needed > self._buffer.shape[1]:
            grown = np.zeros((2, max(needed, 2 * self._buffer.shape[1])), dtype=np.int16)
            grown[:, : self._buffer.shape[1]] = self._buffer
            self._buffer = grown

    def _settle(self, now: float) -> None:
        settled = self._index(now - _HOLD_S)
        if settled - self._base >= _BLOCK_S * SAMPLE_RATE:
            self._hand_over(settled)

    def _hand_over(self, until: int) -> None:
        """Give the writer every sample before `until` and forget them here."""
        count = until - self._base
        if count <= 0:
            return
        self._reserve(until)
        block = self._buffer[:, :count].copy()
        self._buffer[:, : self._buffer.shape[1] - count] = self._buffer[:, count:]
        self._buffer[:, self._buffer.shape[1] - count :] = 0
        self._base = until
        self._pending = [f for f in self._pending if not f.done()]
        self._pending.append(self._writer.submit(self._file.write, block))

"""Silero VAD v6 over a stream: the speech probability of each 32 ms window.

The network that faster-whisper ships (`faster_whisper/assets/silero_vad_v6.onnx`) runs under
onnxruntime: one `InferenceSession` per process, shared by every call (onnxruntime's `run` is
thread-safe). Each `SpeechProbability` holds one stream's state: the LSTM state (h, c) and the
64-sample context that Silero v5/v6 prepends to each 512-sample window. The turn detector
(`pipeline.turns`) decides turns from these probabilities.
"""

from __future__ import annotations

import threading
from collections import deque
from pathlib import Path

import numpy as np
import onnxruntime as ort

from pipeline.transport import VAD_WINDOW

WINDOW = VAD_WINDOW  # samples per Silero window at 16 kHz (32 ms)
CONTEXT = 64  # samples of the previous window prepended to each window (Silero v5/v6)
NOISE_WINDOWS = 15  # silent windows (0.48 s) whose lowest RMS is the line's noise

_session: ort.InferenceSession | None = None
_session_lock = threading.Lock()


def vad_model_path() -> Path:
    """The Silero VAD ONNX file bundled with faster-whisper."""
    from faster_whisper.utils import get_assets_path

    return Path(get_assets_path()) / "silero_vad_v6.onnx"


def vad_session() -> ort.InferenceSession:
    """The process-wide Silero session (loaded once, ~20 ms)."""
    global _session
    with _session_lock:
        if _session is None:
            options = ort.SessionOptions()
            options.inter_op_num_threads = 1
            options.intra_op_num_threads = 1
            options.log_severity_level = 4
            _session = ort.InferenceSession(
                str(vad_model_path()), sess_options=options, providers=["CPUExecutionProvider"]
            )
        return _session


class SpeechProbability:
    """Silero over a stream: feed it 512-sample windows, get each window's speech probability.

    Once Silero has judged the stream silent (probability below `silent_below`), a quiet window
    keeps that verdict without running the network, and the network's state stays that of the
    last window it heard: a caller listening to the reply costs next to nothing. Resetting the
    state instead lost Silero's memory of the speech just before a pause and split more turns
    (14% against 10% at 500 ms in the endpoint study; kept, 6%).

    Quiet is every sample below `quiet_floor` (int16 scale: digital silence) or, on a line with
    noise of its own, an RMS below `noise_margin` times the line's noise: the lowest RMS of the
    last `NOISE_WINDOWS` silent windows, those Silero judged silent and those it rested on (the
    minimum, so that a breath or the end of a word judged silent does not raise it; the windows
    rested on, so that it follows the noise down when it falls), once there are that many. A
    real line's hiss or a room's hum then costs a Silero run now and then (when it gets louder,
    after speech) instead of in every window, while a window above it (the caller's first word)
    goes to Silero as before. On the turn bench's human speech with white noise at -55 to
    -40 dBFS, phone and wide: Silero ran on 41-43% of the windows instead of all, turns split at
    500 ms as often or less (58-64 of 120 against 62-66), and each turn's first word was heard at
    the same window or one apart in 115-120 of 120, the rest up to 160 ms apart, most of them
    earlier (README, "Latency", twelfth session).
    `noise_margin` 0: only `quiet_floor`.
    """

    def __init__(
        self, quiet_floor: int = 0, silent_below: float = 0.0, noise_margin: float = 0.0
    ) -> None:
        self._session = vad_session()
        self._quiet = quiet_floor / 32768.0
        self._silent_below = silent_below
        self._noise_margin = noise_margin
        self.runs = 0  # windows Silero ran on
        self.reset()

    def reset(self) -> None:
        self._h = np.zeros((1, 1, 128), dtype=np.float32)
        self._c = np.zeros((1, 1, 128), dtype=np.float32)
        self._context = np.zeros(CONTEXT, dtype=np.float32)
        self._last = 0.0  # the latest window's probability
        self._noise: deque[float] = deque(maxlen=NOISE_WINDOWS)  # RMS of silent windows
        self._below = 0.0  # a window whose RMS is below this is the line's noise

    def __call__(self, window: np.ndarray) -> float:
        """`window`: 512 float32 samples in [-1, 1]."""
        resting = self._quiet and self._last < self._silent_below
        if resting and float(np.abs(window).max()) < self._quiet:
            self._context = window[-CONTEXT:]
            return self._last
        level = _rms(window) if resting and self._below else None
        if level is not None and level < self._below:
            self._heard_noise(level)  # the noise may be falling: the estimate follows it down
            self._context = window[-CONTEXT:]
            return self._last
        x = np.concatenate([self._context, window])[np.newaxis, :]
        prob, self._h, self._c = self._session.run(None, {"input": x, "h": self._h, "c": self._c})
        self._context = window[-CONTEXT:]
        self.runs += 1
        self._last = float(prob[0])
        if self._noise_margin and self._quiet and self._last < self._silent_below:
            self._heard_noise(_rms(window) if level is None else level)
        return self._last

    def _heard_noise(self, level: float) -> None:
        """A silent window: its RMS is the line's noise, or above it."""
        self._noise.append(level)
        if len(self._noise) == NOISE_WINDOWS:
            self._below = self._noise_margin * min(self._noise)


def _rms(window: np.ndarray) -> float:
    return float(np.sqrt(np.dot(window, window) / len(window)))

"""Smart Turn v3.2: does the audio so far sound like the end of the caller's turn?

The model is pipecat's BSD-2 Smart Turn v3.2 (a Whisper-tiny encoder with a linear head, int8
ONNX, 8.7 MB). It ships inside the `pipecat-ai` wheel
(`pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx`); `hotline fetch-models` (run by
`make` and the Docker build) downloads that wheel from the package registry, checks the file's
sha256 and keeps only it, in `$HOTLINE_CACHE_DIR/smart-turn/`: pipecat-ai's own dependencies
(numba and llvmlite alone are 210 MB) are not installed, and none of its code is imported. An
installed `pipecat-ai` is used as well.

Its input is the Whisper log-mel spectrogram (80 bins, 8 s: 800 frames) of the last 8 s of the
turn at 16 kHz, left-padded with zeros, the waveform normalised to zero mean and unit variance
first; faster-whisper's `FeatureExtractor` computes the same spectrogram as pipecat's own
(within 5e-6). Its output is the probability that the turn is complete.

One `InferenceSession` per process, shared by every call (onnxruntime's `run` is
thread-safe), with one intra-op thread: calls run it on the `UrgentFirst` pool of
`shared()`, never on the event loop. One inference costs about 65 ms on one core of these
machines (features included); `TurnModel.score` returns it with the score.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import numpy as np
import numpy.typing as npt
import onnxruntime as ort
from faster_whisper.feature_extractor import FeatureExtractor

from pipeline.scheduling import UrgentFirst
from pipeline.stt import cache_dir
from pipeline.transport import SAMPLE_RATE

log = logging.getLogger(__name__)

SECONDS = 8  # the model hears the last 8 s of the turn
SAMPLES = SECONDS * SAMPLE_RATE
WHEEL = "pipecat-ai==1.14.0"  # the wheel it ships in
MODEL_FILE = "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx"  # inside it
MODEL_SHA256 = "2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f"


def cached_model_path() -> Path:
    """Where `hotline fetch-models` keeps the model."""
    return cache_dir() / "smart-turn" / Path(MODEL_FILE).name


def smart_turn_path() -> Path:
    """The Smart Turn v3.2 ONNX file: fetched (`cached_model_path`), or inside an installed
    `pipecat-ai`."""
    cached = cached_model_path()
    if cached.is_file():
        return cached
    try:
        installed = Path(str(distribution("pipecat-ai").locate_file(MODEL_FILE)))
    except PackageNotFoundError:
        installed = None
    if installed is not None and installed.is_file():
        return installed
    raise FileNotFoundError(
        f"the Smart Turn model is not at {cached}: run `hotline fetch-models` (make does)"
    )


@dataclass(frozen=True)
class TurnScore:
    """The model's judgement of one pause."""

    complete: float  # probability that the turn is over, 0..1
    inference_ms: float  # CPU time of this judgement (features + network)


class TurnModel:
    """Smart Turn v3.2 on one process-wide session. `score` blocks (run it off the event loop);
    `judge` runs it on the shared pool."""

    def __init__(self, workers: int = 1) -> None:
        options = ort.SessionOptions()
        options.inter_op_num_threads = 1
        options.intra_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.log_severity_level = 4
        self._session = ort.InferenceSession(
            str(smart_turn_path()), sess_options=options, providers=["CPUExecutionProvider"]
        )
        self._features = FeatureExtractor(feature_size=80, chunk_length=SECONDS)
        self._features_lock = threading.Lock()  # its n_samples may be rewritten per call
        self._pool = UrgentFirst(workers, "turn-model")

    def score(self, audio: npt.NDArray[np.int16]) -> TurnScore:
        """How complete the turn sounds, from `audio` (int16 16 kHz mono, the turn so far)."""
        began = time.perf_counter()
        x = np.asarray(audio, dtype=np.float32).reshape(-1)[-SAMPLES:] / 32768.0
        x = np.pad(x, (SAMPLES - len(x), 0))
        x = (x - x.mean()) / np.sqrt(x.var() + 1e-7)
        with self._features_lock:
            mel = self._features(x, padding=0)
        (out,) = self._session.run(None, {"input_features": mel[np.newaxis].astype(np.float32)})
        complete = float(np.asarray(out).reshape(-1)[0])
        return TurnScore(complete, (time.perf_counter() - began) * 1e3)

    async def judge(self, audio: npt.NDArray[np.int16], urgent: bool = True) -> TurnScore:
        """`score` on the model's thread pool."""
        return await self._pool.run(lambda: self.score(audio), urgent)

    def warm_up(self) -> None:
        self.score(np.zeros(SAMPLE_RATE, dtype=np.int16))


_shared: TurnModel | None = None
_shared_lock = threading.Lock()


def shared() -> TurnModel:
    """The process's one `TurnModel` (loaded on first use, ~0.1 s)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = TurnModel()
        return _shared


def shared_if_installed() -> TurnModel | None:
    """`shared()`, or None (logged) when the model file is missing: calls then end their turns
    on silence alone, as with `HOTLINE_TURNS__POLICY__MODEL=false`."""
    try:
        return shared()
    except FileNotFoundError as missing:
        log.error("no turn model, turns end on silence alone: %s", missing)
        return None

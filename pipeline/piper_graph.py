"""A piper voice rewritten so that onnxruntime runs its convolutions with its fastest kernels:
the same audio for less CPU.

Piper voices are VITS models; their HiFi-GAN decoder (the nodes named `/dec/...`) turns the
latent frames into samples and is about two thirds of a synthesis, most of it convolutions over
time. onnxruntime runs 2-D convolutions with its blocked (NCHWc) kernels and 1-D ones without,
so the decoder is rewritten as its 2-D equivalent: a height of 1 is added to its input (an
`Unsqueeze`), to every convolution's weights, kernel, strides, dilations and pads, and taken off
its output (a `Squeeze`). Measured on the bundled voice (2 cores, one intra-op thread, five
sentences of a restaurant booking, alternated five times): 0.0593 → 0.0532 CPU-s per second of
speech (median), resident memory the same (+7 MB after synthesis), the audio the same (largest
difference below 1e-5).

Rewrite 2 (pipeline/piper_passes.py, piper_layout.py) goes further. The decoder's upsamplings,
transposed convolutions that onnxruntime runs as a GEMM and a col2im outside the blocked kernels
(10% of a synthesis), become ordinary convolutions of their phases, interleaved. Its leaky
ReLUs, which onnxruntime does not run in the blocked layout, become a ReLU, a per-channel
scaling and an addition, which it does, so the decoder's data is no longer reordered out and
back in around each of them and each residual addition (38 reorders a synthesis, 8 now). And the
1-D convolutions outside the decoder (the text encoder, the flow, the duration predictor: a
third of a synthesis) each run as a 2-D one, and the decoder's last convolution, to one channel,
is a depthwise one and a sum (-2%). Five real sentences, nine rounds alternated with
rewrite 1 on the same machine: 0.0668 → 0.0605 CPU-s per second of speech (median; -9%), largest
difference 1.6e-5. onnxruntime keeps the weights it reorders for its blocked kernels beside the
originals until they are freed, so loading the voice peaks about 60 MB higher; once malloc's
free pages are given back (the server does it once warm) it holds what rewrite 1 did (161
against 159 MB).

The rewrite is checked, not assumed: a decoder with any operation other than convolutions and
element-wise ones, or a non-scalar constant an element-wise operation would broadcast, is left
as shipped, and so is one whose rewritten output differs from the original on a test input (both
without noise). The checked model is cached in `$HOTLINE_CACHE_DIR/piper/` (written to a
temporary file, then renamed; an earlier rewrite's copy is removed), keyed by the voice file's
content; the `onnx` package is imported only to build it. Where the cache cannot be written,
the rewritten model is kept in memory.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime

from pipeline.piper_int8 import QUANTIZE, Phonemes, quantized
from pipeline.piper_passes import NotRewritable, rewrite
from pipeline.stt import cache_dir

__all__ = [
    "REWRITE",
    "NotRewritable",
    "cached_path",
    "int8_voice",
    "rewrite",
    "rewritten_voice",
]

log = logging.getLogger(__name__)

REWRITE = 2  # bump when the rewrite changes: older cached files are then not used
TOLERANCE = 1e-4  # largest difference allowed between the two models' samples (in [-1, 1])


def cached_path(model: Path, int8: bool = False) -> Path:
    """Where the rewritten `model` is cached (`int8`: with part of it in int8,
    pipeline/piper_int8.py): named by the voice file's content (its sha256, 50 ms for the
    bundled voice), so a copy of the voice and its cache (a container image) still match."""
    with model.open("rb") as file:
        digest = hashlib.file_digest(file, "sha256").hexdigest()
    kind = f"int8-{QUANTIZE}.conv2d-{REWRITE}" if int8 else f"conv2d-{REWRITE}"
    return cache_dir() / "piper" / f"{model.stem}.{digest[:16]}.{kind}.onnx"


def rewritten_voice(model: Path) -> Path | bytes:
    """`model` rewritten (pipeline/piper_passes.py): the cached file, built first if missing
    (the model's bytes where the cache cannot be written). Raises NotRewritable."""
    target = cached_path(model)
    earlier = target.name.replace(f".conv2d-{REWRITE}.", ".conv2d-*.")
    return _cached(target, lambda: _rewritten(model), earlier)


def int8_voice(model: Path, phonemes: Phonemes) -> Path | bytes:
    """`model` rewritten and in part in int8 (pipeline/piper_int8.py), cached as
    `rewritten_voice` is; `phonemes` turns the calibration's text into phoneme ids. Raises
    NotRewritable, at once where this voice was refused before (the reason is cached)."""
    target = cached_path(model, int8=True)
    refused = target.with_suffix(".refused")
    if not target.is_file() and refused.is_file():
        raise NotRewritable(refused.read_text(encoding="utf-8", errors="replace"))
    try:
        earlier = target.name.replace(f".int8-{QUANTIZE}.conv2d-{REWRITE}.", ".int8-*.conv2d-*.")
        return _cached(target, lambda: quantized(rewritten_voice(model), phonemes), earlier)
    except NotRewritable as why:
        with contextlib.suppress(OSError):
            refused.write_text(str(why), encoding="utf-8")
        raise


def _cached(target: Path, build: Callable[[], bytes], earlier: str) -> Path | bytes:
    """`target` if it is a file, else `build()` written there (its bytes where it cannot be);
    the files beside it that `earlier` matches (a glob of its kind: earlier versions) go."""
    if target.is_file():
        return target
    started = time.monotonic()
    data = build()
    log.info("piper: %s built in %.1f s", target.name, time.monotonic() - started)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex}.part")
        partial.write_bytes(data)
        partial.replace(target)  # atomic: another process building it at once is harmless
        for older in target.parent.glob(earlier):
            if older != target:  # an earlier version's copy of this voice
                older.unlink(missing_ok=True)
    except OSError as error:
        log.warning("piper: cannot cache the rewritten voice in %s (%s)", target.parent, error)
        return data
    return target


def _rewritten(model: Path) -> bytes:
    """The voice rewritten and checked; where the whole rewrite fails its check, rewrite 1
    alone (the decoder as 2-D) is tried, so that a voice the newer steps do not suit keeps
    what the older one gave it."""
    try:
        return _checked_rewrite(model, blocked=True)
    except NotRewritable as why:
        log.warning(
            "piper: %s: rewrite %d refused (%s); trying rewrite 1", model.name, REWRITE, why
        )
    return _checked_rewrite(model, blocked=False)


def _checked_rewrite(model: Path, blocked: bool) -> bytes:
    import onnx

    proto = onnx.load(str(model))
    try:
        rewrite(proto, blocked=blocked)
    except (KeyError, IndexError, ValueError) as error:  # a graph the passes misread
        raise NotRewritable(f"{type(error).__name__}: {error}") from error
    data: bytes = proto.SerializeToString()
    _check(model, data)
    return data


def _check(model: Path, data: bytes) -> None:
    """Raises NotRewritable unless the rewritten voice runs and sounds as the shipped one."""
    try:
        difference = largest_difference(str(model), data)
    except Exception as error:  # onnxruntime refused or failed to run the rewritten graph
        raise NotRewritable(f"the rewritten voice does not run: {error}") from error
    if not difference <= TOLERANCE:
        raise NotRewritable(f"the rewritten voice's samples differ by {difference:.2g}")


def largest_difference(original: str, rewritten: bytes) -> float:
    """The largest difference between two voice models' samples for one test input, both
    without noise (noise and noise-width scales 0)."""
    outputs = []
    for model in (original, rewritten):
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1
        session = onnxruntime.InferenceSession(
            model, sess_options=options, providers=["CPUExecutionProvider"]
        )
        outputs.append(session.run(None, _test_input(session))[0])
    if outputs[0].shape != outputs[1].shape:
        return float("inf")
    return float(np.abs(outputs[0] - outputs[1]).max())


def _test_input(session: onnxruntime.InferenceSession) -> dict[str, np.ndarray]:
    ids = np.array([[1, 0, 20, 0, 39, 0, 32, 0, 14, 0, 27, 0, 3, 0, 2]], dtype=np.int64)
    feeds: dict[str, np.ndarray] = {
        "input": ids,
        "input_lengths": np.array([ids.shape[1]], dtype=np.int64),
        "scales": np.array([0.0, 1.0, 0.0], dtype=np.float32),
    }
    if "sid" in {node.name for node in session.get_inputs()}:
        feeds["sid"] = np.array([0], dtype=np.int64)
    return feeds

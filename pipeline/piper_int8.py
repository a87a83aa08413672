"""Part of a piper voice in int8: the flow and the decoder's first stage, where int8 costs the
voice nothing a caller can hear (pipeline/piper_graph.py builds the rest of the voice's rewrite).

onnxruntime's static quantization (QDQ, int8 weights per channel, uint8 activations calibrated
on a few sentences) runs a convolution with its integer kernels (VNNI where the CPU has it).
Where it may is chosen by what it does to the audio. Quantized everywhere, the voice hisses: its
floor rises by 20-30 dB (tried before and refused: README, "piper in int8"). The hiss comes from
the decoder's later stages, which work at the audio's own rate, and there it stays in float.
The flow turns the sampled latent frames into the decoder's input, and the decoder's first
stage works at 1/32 of the audio's rate (the bundled voice upsamples 8, 8 and 4 times); int8
there changes the audio less than the voice's own noise does from one synthesis to the next.
The text encoder, which sets phoneme durations through the duration predictor, stays in float:
the voice speaks at the same pace, sample for sample the same length.

Measured on the bundled voice (16 sentences of a contact centre, 2 cores, one intra-op thread):
0.0552 → 0.0463 CPU-s per second of speech (-16%, five rounds alternated; on a slower AMD EPYC
with AVX-512 VNNI 0.072 → 0.059, -18%); the floor in pauses
(the 10th percentile of 20 ms frames) within 1-4 dB of float's (-101 against -105 dBFS in the
quietest); log-spectral distance to float's samples 0.31-0.41 (the decoder's second stage in int8
too: 0.65-0.78, and its floor -72 where float's is -105); Whisper base hears the same words in
all 16, noise off. With the text encoder also in int8: 0.0437, but durations shift.

The quantized voice is checked, not assumed: on a sentence with a pause, noise off, it must give
as many samples as the float voice, within `DISTANCE` of its log spectrum and with its floor at
most `FLOOR_MARGIN_DB` higher; otherwise the float voice speaks. Calibration draws the voice's
noise from a fixed seed, so a voice quantizes to the same model on every machine.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnxruntime

from pipeline.piper_passes import NotRewritable

if TYPE_CHECKING:
    import onnx

__all__ = ["QUANTIZE", "check", "int8_convolutions", "quantized"]

log = logging.getLogger(__name__)

QUANTIZE = 1  # bump when what is quantized, or how, changes: older cached files are then not used
DISTANCE = 0.5  # largest mean log10-power distance between the two voices' spectra
FLOOR_MARGIN_DB = 10.0  # how much higher the int8 voice's floor in pauses may be
SCALES = (0.667, 1.0, 0.8)  # noise, length, noise width: the bundled voice's own, to calibrate
CALIBRATION = (
    "Your appointment with Doctor Patel is confirmed for Tuesday at ten fifteen.",
    "I'm sorry, we don't have any tables left at eight, but seven forty-five is open.",
    "Would you like me to transfer you to someone in billing?",
    "Okay, I've cancelled the reservation, and you won't be charged.",
    "Thanks for calling, and have a wonderful evening.",
)
CHECK = "Could you spell your last name for me, please?"  # a pause: where hiss would show

Phonemes = Callable[[str], list[list[int]]]  # text → phoneme ids, a list per sentence


def int8_convolutions(graph: onnx.GraphProto) -> list[str]:
    """The convolutions to run in int8: the flow's and the decoder's first stage's (its input
    convolution, first upsampling and the residual blocks after it). Raises NotRewritable for a
    decoder not laid out as HiFi-GAN's (`ups.i`, `resblocks.j`, as many blocks per upsampling)."""
    stages = {name.split("/")[2] for name in _names(graph, "/dec/ups.")}
    blocks = {name.split("/")[2] for name in _names(graph, "/dec/resblocks.")}
    if not stages or not blocks or len(blocks) % len(stages) or "ups.0" not in stages:
        raise NotRewritable(f"a decoder of {len(stages)} upsamplings and {len(blocks)} blocks")
    first: tuple[str, ...] = ("/flow/", "/dec/conv_pre/", "/dec/ups.0/")
    first += tuple(f"/dec/resblocks.{i}/" for i in range(len(blocks) // len(stages)))
    return [
        node.name for node in graph.node if node.op_type == "Conv" and node.name.startswith(first)
    ]


def quantized(model: Path | bytes, phonemes: Phonemes) -> bytes:
    """`model` (a piper voice, rewritten or not) with `int8_convolutions` quantized, calibrated
    on `CALIBRATION` and checked (`check`). Raises NotRewritable, or MemoryError or OSError
    where the machine could not build it now."""
    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    proto = onnx.load_from_string(model) if isinstance(model, bytes) else onnx.load(str(model))
    nodes = int8_convolutions(proto.graph)
    seeded = _seeded(proto)
    feeds = [_feeds(ids) for text in CALIBRATION for ids in phonemes(text)]

    class Calibration(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self._feeds: Iterator[dict[str, np.ndarray]] = iter(feeds)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._feeds, None)

    with tempfile.TemporaryDirectory(prefix="hotline-int8-") as scratch, _quiet_advice():
        target = Path(scratch) / "int8.onnx"
        try:
            quantize_static(
                seeded,
                target,
                Calibration(),
                quant_format=QuantFormat.QDQ,
                nodes_to_quantize=nodes,
                op_types_to_quantize=["Conv"],  # and calibrate only what they read and write
                activation_type=QuantType.QUInt8,
                weight_type=QuantType.QInt8,
                per_channel=True,
            )
        except (MemoryError, OSError):
            raise  # the machine's trouble (memory, disk), not the voice's: no refusal to cache
        except Exception as error:  # a graph onnxruntime's quantizer cannot handle
            raise NotRewritable(f"quantization failed: {type(error).__name__}: {error}") from error
        result = onnx.load(str(target))
    _unseed(result)
    data: bytes = result.SerializeToString()
    float_voice = model if isinstance(model, bytes) else str(model)
    check(_samples(float_voice, phonemes(CHECK)[0]), _samples(data, phonemes(CHECK)[0]))
    return data


def check(float_audio: np.ndarray, int8_audio: np.ndarray) -> None:
    """Raises NotRewritable unless `int8_audio` is the float voice's `float_audio` (the same
    sentence, noise off, samples in [-1, 1]) as near as int8 should bring it."""
    if len(int8_audio) != len(float_audio):
        raise NotRewritable(f"{len(int8_audio)} samples where float gives {len(float_audio)}")
    distance = float(np.abs(_log_spectrum(int8_audio) - _log_spectrum(float_audio)).mean())
    if not distance <= DISTANCE:
        raise NotRewritable(f"its spectrum is {distance:.2f} from float's (at most {DISTANCE})")
    raised = _floor_db(int8_audio) - _floor_db(float_audio)
    if not raised <= FLOOR_MARGIN_DB:
        raise NotRewritable(f"its floor in pauses is {raised:.0f} dB above float's")


def _names(graph: onnx.GraphProto, prefix: str) -> list[str]:
    return [node.name for node in graph.node if node.name.startswith(prefix)]


def _feeds(ids: list[int], scales: tuple[float, float, float] = SCALES) -> dict[str, np.ndarray]:
    return {
        "input": np.array([ids], dtype=np.int64),
        "input_lengths": np.array([len(ids)], dtype=np.int64),
        "scales": np.array(scales, dtype=np.float32),
    }


def _seeded(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `proto` whose random nodes draw from fixed seeds (for calibration)."""
    from onnx import helper

    seeded = type(proto)()
    seeded.CopyFrom(proto)
    for index, node in enumerate(seeded.graph.node):
        if node.op_type.startswith("Random"):
            node.attribute.append(helper.make_attribute("seed", float(index)))
    return seeded


def _unseed(proto: onnx.ModelProto) -> None:
    """Take the calibration's seeds off: in use every synthesis draws its own noise."""
    for node in proto.graph.node:
        if node.op_type.startswith("Random"):
            kept = [attribute for attribute in node.attribute if attribute.name != "seed"]
            del node.attribute[:]
            node.attribute.extend(kept)


def _samples(model: str | bytes, ids: list[int]) -> np.ndarray:
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    session = onnxruntime.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    audio: np.ndarray = session.run(None, _feeds(ids, (0.0, 1.0, 0.0)))[0]
    return audio.reshape(-1)


def _frames(audio: np.ndarray, size: int) -> np.ndarray:
    return audio[: len(audio) // size * size].reshape(-1, size)


def _log_spectrum(audio: np.ndarray) -> np.ndarray:
    power = np.abs(np.fft.rfft(_frames(audio, 512) * np.hanning(512), axis=1)) ** 2
    return np.log10(power + 1e-10)


def _floor_db(audio: np.ndarray) -> float:
    """The level of the 10th-percentile 20 ms frame (at 22 050 Hz): a pause's, where it has one."""
    levels = np.sqrt((_frames(audio, 441) ** 2).mean(axis=1))
    return float(20 * np.log10(np.percentile(levels, 10) + 1e-9))


class _quiet_advice(logging.Filter):
    """onnxruntime's quantizer advises, on the root logger, a pre-processing step (shape
    inference, graph optimizations) that this graph does not need: not in our logs."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "pre-processing" not in record.getMessage()

    def __enter__(self) -> None:
        logging.getLogger().addFilter(self)

    def __exit__(self, *exc: object) -> None:
        logging.getLogger().removeFilter(self)

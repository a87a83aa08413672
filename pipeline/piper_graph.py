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

Two more steps (rewrite 2): the decoder's upsamplings, transposed convolutions that onnxruntime
runs as a GEMM and a col2im outside the blocked kernels (10% of a synthesis), become ordinary
convolutions of their phases, interleaved (`_upsampling_as_convolutions`); and the 1-D
convolutions outside the decoder (the text encoder, the flow, the duration predictor: a third
of a synthesis) each run as a 2-D one between reshapes. Five real sentences, seven rounds
alternated with rewrite 1 on the same machine: 0.0638 → 0.0608 CPU-s per second of speech
(median; -5%), largest difference 1.6e-5.

The rewrite is checked, not assumed: a decoder with any operation other than convolutions and
element-wise ones, or a non-scalar constant an element-wise operation would broadcast, is left
as shipped, and so is one whose rewritten output differs from the original on a test input (both
without noise). The checked model is cached in `$HOTLINE_CACHE_DIR/piper/` (written to a
temporary file, then renamed; an earlier rewrite's copy is removed), keyed by the voice file's
content; the `onnx` package is imported only to build it. Where the cache cannot be written,
the rewritten model is kept in memory.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnxruntime

from pipeline.stt import cache_dir

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)

REWRITE = 2  # bump when the rewrite changes: older cached files are then not used
DECODER = "/dec/"
ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "LeakyRelu", "Relu", "Tanh"}
CONVOLUTIONS = {"Conv", "ConvTranspose"}
TOLERANCE = 1e-4  # largest difference allowed between the two models' samples (in [-1, 1])


class NotRewritable(Exception):
    """The model's decoder is not one this rewrite knows to be safe."""


def cached_path(model: Path) -> Path:
    """Where the rewritten `model` is cached: named by the voice file's content (its sha256,
    50 ms for the bundled voice), so a copy of the voice and its cache (a container image)
    still match."""
    with model.open("rb") as file:
        digest = hashlib.file_digest(file, "sha256").hexdigest()
    return cache_dir() / "piper" / f"{model.stem}.{digest[:16]}.conv2d-{REWRITE}.onnx"


def decoder_as_2d(model: Path) -> Path | bytes:
    """`model` with its decoder's convolutions as 2-D: the cached file, built first if missing
    (the model's bytes where the cache cannot be written). Raises NotRewritable."""
    target = cached_path(model)
    if target.is_file():
        return target
    started = time.monotonic()
    data = _rewritten(model)
    log.info("piper: %s rewritten in %.1f s", model.name, time.monotonic() - started)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex}.part")
        partial.write_bytes(data)
        partial.replace(target)  # atomic: another process building it at once is harmless
        for older in target.parent.glob(target.name.replace(f"-{REWRITE}.", "-*.")):
            if older != target:  # an earlier rewrite's copy of this voice
                older.unlink(missing_ok=True)
    except OSError as error:
        log.warning("piper: cannot cache the rewritten voice in %s (%s)", target.parent, error)
        return data
    return target


def _rewritten(model: Path) -> bytes:
    import onnx

    proto = onnx.load(str(model))
    rewrite(proto)
    data: bytes = proto.SerializeToString()
    difference = largest_difference(str(model), data)
    if not difference <= TOLERANCE:
        raise NotRewritable(f"the rewritten decoder's samples differ by {difference:.2g}")
    return data


def rewrite(model: onnx.ModelProto) -> None:
    """Rewrite `model`'s decoder in place (see the module's text). Raises NotRewritable."""
    from onnx import helper, numpy_helper

    graph = model.graph
    nodes = [node for node in graph.node if node.name.startswith(DECODER)]
    if not nodes:
        raise NotRewritable(f"no {DECODER} nodes")
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    produced = {output for node in nodes for output in node.output}
    outside = _used_outside(graph, nodes)
    entering: dict[str, str] = {}  # tensor from outside the decoder -> its 4-D name
    for node in nodes:
        if node.op_type not in ELEMENTWISE | CONVOLUTIONS:
            raise NotRewritable(f"{node.name} is a {node.op_type}")
        for position, name in enumerate(node.input):
            if name in produced or not name:
                continue
            if name in initializers:
                _check_constant(node, position, initializers[name])
                continue
            entering.setdefault(name, f"{DECODER}{name.strip('/')}_4d")
            node.input[position] = entering[name]
    leaving: dict[str, str] = {}  # decoder tensor used outside it -> its 4-D name inside
    for node in nodes:
        for position, name in enumerate(node.output):
            if name in outside:
                leaving[name] = f"{name}_4d"
                node.output[position] = leaving[name]
        for position, name in enumerate(node.input):
            if name in leaving:
                node.input[position] = leaving[name]
        if node.op_type in CONVOLUTIONS:
            _convolution_as_2d(node, initializers[node.input[1]])
    axis = numpy_helper.from_array(np.array([2], dtype=np.int64), f"{DECODER}height_axis")
    graph.initializer.append(axis)
    first = min(i for i, node in enumerate(graph.node) if node.name.startswith(DECODER))
    for name, inside in entering.items():
        node = helper.make_node("Unsqueeze", [name, axis.name], [inside], name=f"{inside}_in")
        graph.node.insert(first, node)
    last = max(i for i, node in enumerate(graph.node) if node.name.startswith(DECODER))
    for name, inside in leaving.items():
        node = helper.make_node("Squeeze", [inside, axis.name], [name], name=f"{inside}_out")
        graph.node.insert(last + 1, node)
    kept = [info for info in graph.value_info if info.name not in produced]
    del graph.value_info[:]
    graph.value_info.extend(kept)  # the decoder's inferred 3-D shapes no longer hold
    _upsampling_as_convolutions(graph)
    _convolutions_outside_as_2d(graph)


def _upsampling_as_convolutions(graph: onnx.GraphProto) -> None:
    """Each of the decoder's (2-D, height 1) transposed convolutions that can be, as its
    polyphase form: with stride s and kernel k = L * s, output sample q * s + r is phase r's
    L-tap convolution of the input at q, so one convolution with s times the output channels
    computes every phase, and a reshape, transpose and reshape interleave them in time; the
    slice takes off the transposed convolution's padding. onnxruntime runs that convolution
    with its blocked kernels, where a transposed one is a GEMM and a col2im."""
    from onnx import helper, numpy_helper

    initializers = {tensor.name: tensor for tensor in graph.initializer}
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        layout = _polyphase_layout(node, initializers) if node.name.startswith(DECODER) else None
        if layout is None:
            nodes.append(node)
            continue
        stride, pad = layout
        name = node.name
        weights = numpy_helper.to_array(initializers[node.input[1]])  # (in, out, 1, k)
        ins, outs, _, kernel = weights.shape
        taps = kernel // stride
        # tap l of phase r is weights[..., r + l * stride], applied to input q - l
        phases = weights.reshape(ins, outs, taps, stride).transpose(1, 3, 0, 2)[..., ::-1]
        tensors = {
            "weights": phases.reshape(outs * stride, ins, 1, taps),
            "phases": np.array([1, outs, stride, -1], dtype=np.int64),
            "interleaved": np.array([1, outs, 1, -1], dtype=np.int64),
            "starts": np.array([pad], dtype=np.int64),
            "ends": np.array([-pad if pad else np.iinfo(np.int64).max], dtype=np.int64),
            "axes": np.array([3], dtype=np.int64),
        }
        if len(node.input) > 2 and node.input[2]:
            bias = numpy_helper.to_array(initializers[node.input[2]])
            tensors["bias"] = np.repeat(bias, stride)
        for key, value in tensors.items():
            array = value.astype(np.float32) if key in ("weights", "bias") else value
            graph.initializer.append(numpy_helper.from_array(array, f"{name}/polyphase/{key}"))
        at = f"{name}/polyphase"
        convolution = [node.input[0], f"{at}/weights"] + (
            [f"{at}/bias"] if "bias" in tensors else []
        )
        nodes += [
            helper.make_node(
                "Conv",
                convolution,
                [f"{at}/out"],
                name=f"{at}/Conv",
                kernel_shape=[1, taps],
                pads=[0, taps - 1, 0, taps - 1],
            ),
            helper.make_node(
                "Reshape", [f"{at}/out", f"{at}/phases"], [f"{at}/split"], name=f"{at}/Reshape"
            ),
            helper.make_node(
                "Transpose",
                [f"{at}/split"],
                [f"{at}/moved"],
                name=f"{at}/Transpose",
                perm=[0, 1, 3, 2],
            ),
            helper.make_node(
                "Reshape", [f"{at}/moved", f"{at}/interleaved"], [f"{at}/joined"], name=f"{at}/Join"
            ),
            helper.make_node(
                "Slice",
                [f"{at}/joined", f"{at}/starts", f"{at}/ends", f"{at}/axes"],
                [node.output[0]],
                name=f"{at}/Slice",
            ),
        ]
    del graph.node[:]
    graph.node.extend(nodes)
    used = {name for node in graph.node for name in node.input}
    unused = [tensor for tensor in graph.initializer if tensor.name not in used]
    for tensor in unused:  # the transposed convolutions' own weights
        graph.initializer.remove(tensor)


def _polyphase_layout(
    node: onnx.NodeProto, initializers: dict[str, onnx.TensorProto]
) -> tuple[int, int] | None:
    """(stride, pad) of a transposed convolution the polyphase form computes exactly: height
    1, one group, no dilation or output padding, the same pad at both ends, constant weights
    and a kernel that is a whole number of strides. None for any other node."""
    if node.op_type != "ConvTranspose" or node.input[1] not in initializers:
        return None
    attributes = {a.name: list(a.ints) if a.ints else a.i for a in node.attribute}
    kernel = list(initializers[node.input[1]].dims)[2:]
    strides = attributes.get("strides", [1, 1])
    pads = attributes.get("pads", [0, 0, 0, 0])
    if (
        set(attributes) - {"kernel_shape", "strides", "pads", "dilations", "group"}
        or attributes.get("group", 1) != 1
        or attributes.get("dilations", [1, 1]) != [1, 1]
        or len(kernel) != 2
        or kernel[0] != 1
        or strides[0] != 1
        or pads[0] != 0
        or pads[2] != 0
        or pads[1] != pads[3]
        or kernel[1] % strides[1]
        or (len(node.input) > 2 and node.input[2] and node.input[2] not in initializers)
    ):
        return None
    return strides[1], pads[1]


def _convolutions_outside_as_2d(graph: onnx.GraphProto) -> None:
    """The 1-D convolutions outside the decoder (the text encoder, the flow, the duration
    predictor) each as a 2-D one of height 1 between an Unsqueeze and a Squeeze: onnxruntime's
    blocked kernels then run them, with a reorder on either side."""
    from onnx import helper

    initializers = {tensor.name: tensor for tensor in graph.initializer}
    uses: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    axis = f"{DECODER}height_axis"
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        weights = initializers.get(node.input[1]) if len(node.input) > 1 else None
        if (
            node.op_type != "Conv"
            or node.name.startswith(DECODER)
            or weights is None
            or len(weights.dims) != 3
            or uses[weights.name] != 1
            or any(a.name == "auto_pad" and a.s not in (b"", b"NOTSET") for a in node.attribute)
        ):
            nodes.append(node)
            continue
        _convolution_as_2d(node, weights)
        flat_in, flat_out = node.input[0], node.output[0]
        node.input[0], node.output[0] = f"{flat_in}_4d_{node.name}", f"{flat_out}_4d"
        nodes += [
            helper.make_node("Unsqueeze", [flat_in, axis], [node.input[0]], name=f"{node.name}_in"),
            node,
            helper.make_node(
                "Squeeze", [node.output[0], axis], [flat_out], name=f"{node.name}_out"
            ),
        ]
    del graph.node[:]
    graph.node.extend(nodes)


def _used_outside(graph: onnx.GraphProto, decoder: list[onnx.NodeProto]) -> set[str]:
    inside = {id(node) for node in decoder}
    used = {name for node in graph.node if id(node) not in inside for name in node.input}
    return used | {output.name for output in graph.output}


def _check_constant(node: onnx.NodeProto, position: int, tensor: onnx.TensorProto) -> None:
    """A constant is safe in 4-D when it is a convolution's weights or bias, or a scalar."""
    dims = list(tensor.dims)
    if node.op_type in CONVOLUTIONS:
        if position == 1 and len(dims) != 3:
            raise NotRewritable(f"{node.name}'s weights have shape {dims}")
        return
    if int(np.prod(dims)) != 1:
        raise NotRewritable(f"{node.name} broadcasts a constant of shape {dims}")


def _convolution_as_2d(node: onnx.NodeProto, weights: onnx.TensorProto) -> None:
    """A 1-D convolution as a 2-D one of height 1: weights (out, in, k) -> (out, in, 1, k)."""
    from onnx import numpy_helper

    array = numpy_helper.to_array(weights)
    shaped = array.reshape(array.shape[0], array.shape[1], 1, array.shape[2])
    weights.CopyFrom(numpy_helper.from_array(shaped, weights.name))
    height = {"kernel_shape": 1, "strides": 1, "dilations": 1, "output_shape": 1}
    for attribute in node.attribute:
        values = list(attribute.ints)
        if attribute.name in height:
            values = [height[attribute.name], *values]
        elif attribute.name == "output_padding":
            values = [0, *values]
        elif attribute.name == "pads":  # [begin, end] -> [top, begin, bottom, end]
            values = [0, values[0], 0, values[1]]
        elif attribute.name == "auto_pad" and attribute.s not in (b"", b"NOTSET"):
            raise NotRewritable(f"{node.name} pads {attribute.s.decode()}")
        else:
            continue
        attribute.ClearField("ints")
        attribute.ints.extend(values)


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

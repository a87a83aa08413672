"""The steps of piper rewrite 2 that keep the decoder's data in onnxruntime's blocked (NCHWc)
layout from one upsampling to the next (pipeline/piper_passes.py runs them, on a decoder already
in 2-D; pipeline/piper_graph.py says why and what they measured)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import onnx

DECODER = "/dec/"
BLOCKED = {"Conv", "Add", "Relu"}  # what onnxruntime keeps in its blocked layout here


def upsampling_as_convolutions(graph: onnx.GraphProto) -> None:
    """Each of the decoder's (2-D, height 1) transposed convolutions that can be, as its
    polyphase form: with stride s and kernel k = L * s, output sample q * s + r is phase r's
    L-tap convolution of the input at q, so one convolution with s times the output channels
    computes every phase, and a reshape, transpose and reshape interleave them in time; the
    slice takes off the transposed convolution's padding. onnxruntime runs that convolution
    with its blocked kernels, where a transposed one is a GEMM and a col2im."""

    initializers = {tensor.name: tensor for tensor in graph.initializer}
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        layout = _polyphase_layout(node, initializers) if node.name.startswith(DECODER) else None
        if layout is None:
            nodes.append(node)
            continue
        nodes += _polyphase(graph, node, initializers, *layout)
    del graph.node[:]
    graph.node.extend(nodes)


def _polyphase(
    graph: onnx.GraphProto,
    node: onnx.NodeProto,
    initializers: dict[str, onnx.TensorProto],
    stride: int,
    pad: int,
) -> list[onnx.NodeProto]:
    """The nodes that compute transposed convolution `node` in its polyphase form (their
    constants added to `graph`)."""
    from onnx import helper, numpy_helper

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
    convolution = [node.input[0], f"{at}/weights"] + ([f"{at}/bias"] if "bias" in tensors else [])
    pads = [0, taps - 1, 0, taps - 1]
    steps: list[tuple[str, str, list[str], str, dict[str, Any]]] = [  # (operation, name, ...)
        ("Conv", "Conv", convolution, f"{at}/out", {"kernel_shape": [1, taps], "pads": pads}),
        ("Reshape", "Reshape", [f"{at}/out", f"{at}/phases"], f"{at}/split", {}),
        ("Transpose", "Transpose", [f"{at}/split"], f"{at}/moved", {"perm": [0, 1, 3, 2]}),
        ("Reshape", "Join", [f"{at}/moved", f"{at}/interleaved"], f"{at}/joined", {}),
        (
            "Slice",
            "Slice",
            [f"{at}/joined", *(f"{at}/{k}" for k in ("starts", "ends", "axes"))],
            node.output[0],
            {},
        ),
    ]
    return [
        helper.make_node(operation, inputs, [output], name=f"{at}/{label}", **attributes)
        for operation, label, inputs, output, attributes in steps
    ]


def activations_as_blocked(graph: onnx.GraphProto) -> None:
    """The decoder's leaky ReLUs in operations onnxruntime keeps in its blocked layout, so that
    its data is not reordered out and back in around each of them and each residual addition.
    With slope a and k = (1 - a) / a, LeakyRelu(x) = a * (x + k * Relu(x)): a Relu, a per-channel
    scaling by k (a 1x1 depthwise convolution) and an addition, the factor a moved into the
    convolutions that use the result (all its users must be convolutions), and a division of x
    by a positive constant before it (the decoder's mean of its residual blocks) moved there too.
    A tensor that the addition takes from an operation outside the blocked layout (an
    upsampling's slice) passes through an identity depthwise convolution first."""
    from onnx import helper

    initializers = {tensor.name: tensor for tensor in graph.initializer}
    producers = {name: node for node in graph.node for name in node.output}
    users: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            users.setdefault(name, []).append(node)

    outputs = {output.name for output in graph.output}
    replaced: dict[int, list[onnx.NodeProto]] = {}  # node id -> the nodes in its place
    blocked_inputs: dict[str, str] = {}  # tensor -> its copy from an identity convolution
    for node in graph.node:
        slope = next((a.f for a in node.attribute if a.name == "alpha"), 0.01)
        readers = _convolutions_reading(node, users, initializers, outputs)
        if not readers or not 0 < slope < 1:
            continue
        source, factor = node.input[0], slope
        division = producers.get(source)
        divisor = _positive_scalar(division, initializers) if division is not None else None
        if divisor is not None and division is not None and len(users[source]) == 1:
            source, factor = division.input[0], slope / divisor
            replaced[id(division)] = []
        group = next((a.i for a in readers[0].attribute if a.name == "group"), 1)
        channels = int(initializers[readers[0].input[1]].dims[1]) * max(group, 1)
        at = f"{node.name}/blocked"
        parts = []
        if producers[source].op_type not in BLOCKED:
            if source not in blocked_inputs:
                blocked_inputs[source] = f"{source}/blocked"
                parts.append(_depthwise(graph, source, 1.0, channels, blocked_inputs[source]))
            source = blocked_inputs[source]
        parts += [
            helper.make_node("Relu", [source], [f"{at}/relu"], name=f"{at}/Relu"),
            _depthwise(graph, f"{at}/relu", (1 - slope) / slope, channels, f"{at}/scaled"),
            helper.make_node("Add", [f"{at}/scaled", source], [node.output[0]], name=f"{at}/Add"),
        ]
        replaced[id(node)] = parts
        for reader in readers:
            _scale_weights(graph, initializers, reader, factor)
    nodes = [part for node in graph.node for part in replaced.get(id(node), [node])]
    for node in nodes:  # the residual additions read the blocked copies as well
        if node.name.startswith(DECODER) and not node.name.endswith("/blocked"):
            for position, name in enumerate(node.input):
                if name in blocked_inputs and node.op_type == "Add":
                    node.input[position] = blocked_inputs[name]
    del graph.node[:]
    graph.node.extend(nodes)


def _convolutions_reading(
    node: onnx.NodeProto,
    users: dict[str, list[onnx.NodeProto]],
    initializers: dict[str, onnx.TensorProto],
    outputs: set[str],
) -> list[onnx.NodeProto]:
    """The convolutions that read decoder LeakyRelu `node`'s output as their data, with constant
    weights; [] unless those are all that read it (and it is not an output of the graph)."""
    readers = users.get(node.output[0], []) if node.op_type == "LeakyRelu" else []
    if not node.name.startswith(DECODER) or node.output[0] in outputs:
        return []
    for reader in readers:
        if (
            reader.op_type != "Conv"
            or list(reader.input).count(node.output[0]) != 1
            or reader.input[0] != node.output[0]
            or reader.input[1] not in initializers
        ):
            return []
    return readers


def _depthwise(
    graph: onnx.GraphProto, source: str, scale: float, channels: int, target: str
) -> onnx.NodeProto:
    """A 1x1 depthwise convolution that multiplies every channel of `source` by `scale`."""
    from onnx import helper, numpy_helper

    weights = np.full((channels, 1, 1, 1), scale, dtype=np.float32)
    graph.initializer.append(numpy_helper.from_array(weights, f"{target}/weights"))
    return helper.make_node(
        "Conv",
        [source, f"{target}/weights"],
        [target],
        name=target,
        group=channels,
        kernel_shape=[1, 1],
    )


def narrow_convolutions_as_depthwise(graph: onnx.GraphProto) -> None:
    """The decoder's convolutions to one channel (its last, to the waveform) as a depthwise
    convolution and a sum over channels: onnxruntime's blocked kernel computes a whole block of
    output channels (8 or 16) and keeps one, where the depthwise one computes each input channel
    once. -1.8% of a synthesis for the bundled voice."""
    from onnx import helper, numpy_helper

    initializers = {tensor.name: tensor for tensor in graph.initializer}
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        weights = initializers.get(node.input[1]) if node.op_type == "Conv" else None
        attributes = {a.name: a for a in node.attribute}
        if (
            weights is None
            or not node.name.startswith(DECODER)
            or list(weights.dims)[:1] != [1]
            or len(weights.dims) != 4
            or (len(node.input) > 2 and node.input[2])
            or ("group" in attributes and attributes["group"].i != 1)
        ):
            nodes.append(node)
            continue
        channels, at = int(weights.dims[1]), f"{node.name}/depthwise"
        kernels = numpy_helper.to_array(weights).reshape(channels, 1, 1, -1)
        graph.initializer.append(numpy_helper.from_array(kernels, f"{at}/weights"))
        graph.initializer.append(numpy_helper.from_array(np.array([1], np.int64), f"{at}/axes"))
        depthwise = helper.make_node(
            "Conv", [node.input[0], f"{at}/weights"], [f"{at}/out"], name=at
        )
        depthwise.attribute.extend(a for a in node.attribute if a.name != "group")
        depthwise.attribute.append(helper.make_attribute("group", channels))
        nodes += [
            depthwise,
            helper.make_node(
                "ReduceSum", [f"{at}/out", f"{at}/axes"], [node.output[0]], name=f"{at}/Sum"
            ),
        ]
    del graph.node[:]
    graph.node.extend(nodes)


def _positive_scalar(
    node: onnx.NodeProto, initializers: dict[str, onnx.TensorProto]
) -> float | None:
    """c where `node` is x / c with c a positive constant scalar; else None."""
    from onnx import numpy_helper

    if node.op_type != "Div" or node.input[1] not in initializers:
        return None
    value = numpy_helper.to_array(initializers[node.input[1]])
    if value.size != 1 or not float(value.reshape(-1)[0]) > 0:
        return None
    return float(value.reshape(-1)[0])


def _scale_weights(
    graph: onnx.GraphProto,
    initializers: dict[str, onnx.TensorProto],
    node: onnx.NodeProto,
    factor: float,
) -> None:
    """`node`'s weights times `factor`, as a tensor of its own (its bias unchanged)."""
    from onnx import numpy_helper

    weights = numpy_helper.to_array(initializers[node.input[1]]) * np.float32(factor)
    name = f"{node.name}/scaled_weights"
    graph.initializer.append(numpy_helper.from_array(weights.astype(np.float32), name))
    initializers[name] = graph.initializer[-1]
    node.input[1] = name


def declare_lengths(model: onnx.ModelProto) -> None:
    """Every decoder tensor's length declared as one symbol per upsampling stage, where every
    convolution keeps its input's length: onnxruntime joins an addition into the convolution
    before it only where it can tell that the two tensors have one shape, and a dilated
    convolution's output length is one it cannot tell from the input's."""
    from onnx import shape_inference

    graph = model.graph
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    convolutions = [
        node
        for node in graph.node
        if node.name.startswith(DECODER)
        and node.op_type == "Conv"
        and "/polyphase/" not in node.name
    ]
    if not all(_keeps_length(node, initializers) for node in convolutions):
        return
    inferred = {info.name: info for info in shape_inference.infer_shapes(model).graph.value_info}
    stage = 0
    declared = []
    for node in graph.node:
        if not node.name.startswith(DECODER):
            continue
        if node.name.endswith("/polyphase/Slice") or node.op_type == "ConvTranspose":
            stage += 1
        elif "/polyphase/" in node.name or node.op_type not in BLOCKED:
            continue
        info = inferred.get(node.output[0])
        if info is None or len(info.type.tensor_type.shape.dim) != 4:
            continue
        length = info.type.tensor_type.shape.dim[3]
        length.Clear()
        length.dim_param = f"{DECODER}length_{stage}"
        declared.append(info)
    names = {info.name for info in declared}
    kept = [info for info in graph.value_info if info.name not in names]
    del graph.value_info[:]
    graph.value_info.extend(kept + declared)


def _keeps_length(node: onnx.NodeProto, initializers: dict[str, onnx.TensorProto]) -> bool:
    """Whether a 2-D convolution's output is as long as its input: stride 1, and pads that
    add up to its dilated kernel's reach."""
    attributes = {a.name: list(a.ints) for a in node.attribute}
    kernel = list(initializers[node.input[1]].dims)[3] if node.input[1] in initializers else 0
    dilation = attributes.get("dilations", [1, 1])[1]
    pads = attributes.get("pads", [0, 0, 0, 0])
    return (
        attributes.get("strides", [1, 1])[1] == 1
        and pads[1] + pads[3] == dilation * (kernel - 1)
        and not any(a.name == "auto_pad" and a.s not in (b"", b"NOTSET") for a in node.attribute)
    )


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

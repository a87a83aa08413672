"""The graph rewrites of a piper voice (pipeline/piper_graph.py builds, checks and caches the
result). Each keeps the voice's arithmetic and changes only how onnxruntime can run it: with its
blocked (NCHWc) kernels, on data kept in their layout between operations."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from pipeline.piper_layout import (
    DECODER,
    activations_as_blocked,
    declare_lengths,
    narrow_convolutions_as_depthwise,
    upsampling_as_convolutions,
)

if TYPE_CHECKING:
    import onnx

ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "LeakyRelu", "Relu", "Tanh"}
CONVOLUTIONS = {"Conv", "ConvTranspose"}


class NotRewritable(Exception):
    """The model's decoder is not one this rewrite knows to be safe."""


def rewrite(model: onnx.ModelProto, blocked: bool = True) -> None:
    """Rewrite `model` in place: its decoder as 2-D (rewrite 1) and, with `blocked`, the steps
    that keep onnxruntime in its blocked layout (rewrite 2; pipeline/piper_graph.py). Raises
    NotRewritable."""
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
    if not blocked:
        return
    upsampling_as_convolutions(graph)
    activations_as_blocked(graph)
    narrow_convolutions_as_depthwise(graph)
    declare_lengths(model)
    _convolutions_outside_as_2d(graph)
    used = {name for node in graph.node for name in node.input}
    kept = [tensor for tensor in graph.initializer if tensor.name in used]
    del graph.initializer[:]  # without the weights the rewrite replaced
    graph.initializer.extend(kept)


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

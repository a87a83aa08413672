"""piper's decoder with its convolutions as 2-D ones (pipeline/piper_graph.py): the same samples,
and a decoder the rewrite does not know is left as shipped."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from pipeline.piper_graph import REWRITE, NotRewritable, cached_path, rewrite, rewritten_voice
from pipeline.tts import TextToSpeech, TTSSettings, voice_files

RNG = np.random.default_rng(7)
CHANNELS = 4


def constant(name: str, array: np.ndarray) -> TensorProto:
    return numpy_helper.from_array(array.astype(np.float32), name)


def decoder_model(
    extra: list[onnx.NodeProto] | None = None,
    added: np.ndarray | None = None,
    group: int = 2,
    residual: bool = False,
):
    """x (1, 2, T) -> outside: Conv, Mul -> /dec/: Conv, LeakyRelu, ConvTranspose (x2), Add,
    Conv, Tanh -> outside Mul -> y; shaped like a VITS flow's end, its decoder and the output.
    `residual`: a residual block instead of the Add (LeakyRelu, dilated Conv, Add, the mean's
    Div, LeakyRelu), as in a HiFi-GAN decoder."""
    weights = {
        "w_flow": RNG.standard_normal((2, 2, 3)),
        "w_pre": RNG.standard_normal((CHANNELS, 2, 7)),
        "b_pre": RNG.standard_normal(CHANNELS),
        # ConvTranspose: (in, out / group, k), 2 channels out
        "w_up": RNG.standard_normal((CHANNELS, 2 // group, 4)),
        "b_up": RNG.standard_normal(2),
        "w_post": RNG.standard_normal((1, 2, 7)),
        "w_res": RNG.standard_normal((2, 2, 3)),
        "b_res": RNG.standard_normal(2),
        "half": np.array(0.5),
        "two": np.array(2.0),
        "added": np.array(0.1) if added is None else added,
    }
    block = [
        helper.make_node(
            "LeakyRelu", ["c"], ["c_act"], name="/dec/resblocks.0/LeakyRelu", alpha=0.1
        ),
        helper.make_node(
            "Conv",
            ["c_act", "w_res", "b_res"],
            ["c_res"],
            name="/dec/resblocks.0/convs.0/Conv",
            kernel_shape=[3],
            pads=[2, 2],
            dilations=[2],
        ),
        helper.make_node("Add", ["c_res", "c"], ["d0"], name="/dec/resblocks.0/Add"),
        helper.make_node("Div", ["d0", "two"], ["d1"], name="/dec/Div"),
        helper.make_node("LeakyRelu", ["d1"], ["d"], name="/dec/LeakyRelu_1", alpha=0.01),
    ]
    nodes = [
        helper.make_node(
            "Conv", ["x", "w_flow"], ["x1"], name="/flow/Conv", kernel_shape=[3], pads=[1, 1]
        ),
        helper.make_node("Mul", ["x1", "half"], ["z"], name="/Mul_7"),
        helper.make_node(
            "Conv",
            ["z", "w_pre", "b_pre"],
            ["a"],
            name="/dec/conv_pre/Conv",
            kernel_shape=[7],
            pads=[3, 3],
            dilations=[1],
            strides=[1],
            group=1,
        ),
        helper.make_node("LeakyRelu", ["a"], ["b"], name="/dec/LeakyRelu", alpha=0.1),
        helper.make_node(
            "ConvTranspose",
            ["b", "w_up", "b_up"],
            ["c"],
            name="/dec/ups.0/ConvTranspose",
            kernel_shape=[4],
            pads=[1, 1],
            strides=[2],
            group=group,
        ),
        *(block if residual else [helper.make_node("Add", ["c", "added"], ["d"], name="/dec/Add")]),
        *(extra or []),
        helper.make_node(
            "Conv",
            ["d", "w_post"],
            ["e"],
            name="/dec/conv_post/Conv",
            kernel_shape=[7],
            pads=[3, 3],
        ),
        helper.make_node("Tanh", ["e"], ["f"], name="/dec/Tanh"),
        helper.make_node("Mul", ["f", "half"], ["y"], name="/Mul_8"),
    ]
    graph = helper.make_graph(
        nodes,
        "decoder",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, "T"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [constant(name, value) for name, value in weights.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])


def run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    output: np.ndarray = session.run(None, {"x": x})[0]
    return output


def test_the_rewritten_decoder_computes_the_same_samples_with_2d_convolutions() -> None:
    model = decoder_model()  # a grouped upsampling: kept as a transposed convolution
    x = RNG.standard_normal((1, 2, 50)).astype(np.float32)
    before = run(model, x)
    rewrite(model)
    after = run(model, x)
    assert after.shape == before.shape == (1, 1, 100)
    np.testing.assert_allclose(after, before, atol=1e-5)
    convolutions = [n for n in model.graph.node if n.op_type in ("Conv", "ConvTranspose")]
    initializers = {t.name: t for t in model.graph.initializer}
    assert all(len(initializers[n.input[1]].dims) == 4 for n in convolutions)
    shapes = {n.name: list(a.ints) for n in convolutions for a in n.attribute if a.name == "pads"}
    assert shapes["/dec/ups.0/ConvTranspose"] == [0, 1, 0, 1]
    assert shapes["/flow/Conv"] == [0, 1, 0, 1]  # outside the decoder, between its own reshapes
    assert [n.op_type for n in model.graph.node].count("Unsqueeze") == 2
    lengths = {i.name: i.type.tensor_type.shape.dim[3].dim_param for i in model.graph.value_info}
    assert lengths["a"] == "/dec/length_0" and lengths["d"] == "/dec/length_1"  # upsampled


def test_rewrite_1_alone_keeps_the_upsampling_for_voices_rewrite_2_does_not_suit() -> None:
    model = decoder_model(group=1)
    rewrite(model, blocked=False)
    operations = [n.op_type for n in model.graph.node]
    assert "ConvTranspose" in operations and operations.count("Unsqueeze") == 1


@pytest.mark.parametrize("length", [1, 2, 37])
def test_an_upsampling_becomes_one_convolution_of_its_phases_with_the_same_samples(
    length: int,
) -> None:
    model = decoder_model(group=1)
    x = RNG.standard_normal((1, 2, length)).astype(np.float32)
    before = run(model, x)
    rewrite(model)
    after = run(model, x)
    assert after.shape == before.shape == (1, 1, 2 * length)
    np.testing.assert_allclose(after, before, atol=1e-5)
    operations = [n.op_type for n in model.graph.node]
    assert "ConvTranspose" not in operations and "Transpose" in operations
    assert "w_up" not in {t.name for t in model.graph.initializer}  # its weights went with it


def test_leaky_relus_become_blocked_operations_with_the_same_samples() -> None:
    model = decoder_model(group=1, residual=True)
    x = RNG.standard_normal((1, 2, 40)).astype(np.float32)
    before = run(model, x)
    rewrite(model)
    np.testing.assert_allclose(run(model, x), before, atol=1e-5)
    operations = [n.op_type for n in model.graph.node if n.name.startswith("/dec/")]
    assert "LeakyRelu" not in operations and "Div" not in operations
    assert "ReduceSum" in operations  # the convolution to one channel, as a depthwise one
    assert operations.count("Relu") == 3  # after conv_pre, after the upsampling, after the block
    # the residual addition reads the upsampling's output through an identity convolution
    residual = next(n for n in model.graph.node if n.name == "/dec/resblocks.0/Add")
    assert residual.input[1] == "c/blocked"
    # each stage's tensors declared one length, so that onnxruntime can join the additions
    lengths = {
        info.name: info.type.tensor_type.shape.dim[3].dim_param for info in model.graph.value_info
    }
    assert lengths["a"] == "/dec/length_0" and lengths["d"] == lengths["d0"] == "/dec/length_1"


def test_a_decoder_the_rewrite_does_not_know_is_refused() -> None:
    shape = helper.make_node("Shape", ["d"], ["s"], name="/dec/Shape")
    with pytest.raises(NotRewritable, match="Shape"):
        rewrite(decoder_model(extra=[shape]))
    # an element-wise constant over channels would broadcast along another axis in 4-D
    with pytest.raises(NotRewritable, match="broadcasts"):
        rewrite(decoder_model(added=np.ones((1, 2, 1))))


def test_the_bundled_voice_sounds_the_same_and_its_rewrite_is_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    model = voice_files(TTSSettings().voice)[0]
    monkeypatch.setenv("HOTLINE_CACHE_DIR", str(tmp_path / "not-a-directory"))
    (tmp_path / "not-a-directory").write_text("")
    with caplog.at_level(logging.WARNING, "pipeline.piper_graph"):
        in_memory = rewritten_voice(model)  # the cache cannot be written: the model's bytes
    assert isinstance(in_memory, bytes) and "cannot cache" in caplog.text

    monkeypatch.setenv("HOTLINE_CACHE_DIR", str(tmp_path / "cache"))
    name = cached_path(model).name
    earlier = cached_path(model).with_name(name.replace(f"-{REWRITE}.", f"-{REWRITE - 1}."))
    earlier.parent.mkdir(parents=True)
    earlier.write_bytes(b"an earlier rewrite")
    built = rewritten_voice(model)
    assert built == cached_path(model) and built.is_file()
    assert not earlier.exists()  # replaced, not kept beside it
    written = built.stat().st_mtime_ns
    assert rewritten_voice(model) == built and built.stat().st_mtime_ns == written  # not rebuilt

    # no noise: the same input each time; int8 (tests/test_piper_int8.py) not asked for here
    quiet = {"noise_scale": 0.0, "noise_w_scale": 0.0, "int8": False}
    shipped = TextToSpeech(TTSSettings(conv2d=False, **quiet))
    rewritten = TextToSpeech(TTSSettings(**quiet))
    text = "Your table for two is booked for seven thirty tonight."
    before, after = shipped.synthesize_blocking(text), rewritten.synthesize_blocking(text)
    assert len(after) == len(before) > shipped.sample_rate
    assert np.abs(after.astype(np.int32) - before.astype(np.int32)).max() <= 2

    built.write_bytes(b"not a model")  # damaged: the voice as shipped speaks instead
    caplog.clear()
    with caplog.at_level(logging.WARNING, "pipeline.tts"):
        fallback = TextToSpeech(TTSSettings(**quiet))
    assert "did not load" in caplog.text
    assert np.array_equal(fallback.synthesize_blocking(text), before)


def test_onnxruntime_keeps_the_rewritten_decoder_in_its_blocked_layout(tmp_path: Path) -> None:
    """What the rewrite is for: onnxruntime's optimized graph of the bundled voice reorders the
    decoder's data into and out of its blocked layout only around each upsampling's interleave
    and at the decoder's ends (8 reorders; 38 with the leaky ReLUs and additions as shipped)."""
    source = rewritten_voice(voice_files(TTSSettings().voice)[0])
    options = onnxruntime.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    onnxruntime.InferenceSession(
        source if isinstance(source, bytes) else str(source), options, ["CPUExecutionProvider"]
    )
    optimized = onnx.load(str(tmp_path / "optimized.onnx"))
    reorders = [
        node
        for node in optimized.graph.node
        if node.op_type.startswith("Reorder")
        and any(name.startswith("/dec/") for name in [*node.input, *node.output])
    ]
    upsamplings = sum(node.name.endswith("/polyphase/Transpose") for node in optimized.graph.node)
    assert upsamplings == 3
    assert len(reorders) <= 2 * upsamplings + 2

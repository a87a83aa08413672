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

from pipeline.piper_graph import REWRITE, NotRewritable, cached_path, decoder_as_2d, rewrite
from pipeline.tts import TextToSpeech, TTSSettings, voice_files

RNG = np.random.default_rng(7)
CHANNELS = 4


def constant(name: str, array: np.ndarray) -> TensorProto:
    return numpy_helper.from_array(array.astype(np.float32), name)


def decoder_model(
    extra: list[onnx.NodeProto] | None = None, added: np.ndarray | None = None, group: int = 2
):
    """x (1, 2, T) -> outside: Conv, Mul -> /dec/: Conv, LeakyRelu, ConvTranspose (x2), Add,
    Conv, Tanh -> outside Mul -> y; shaped like a VITS flow's end, its decoder and the output."""
    weights = {
        "w_flow": RNG.standard_normal((2, 2, 3)),
        "w_pre": RNG.standard_normal((CHANNELS, 2, 7)),
        "b_pre": RNG.standard_normal(CHANNELS),
        # ConvTranspose: (in, out / group, k), 2 channels out
        "w_up": RNG.standard_normal((CHANNELS, 2 // group, 4)),
        "b_up": RNG.standard_normal(2),
        "w_post": RNG.standard_normal((1, 2, 7)),
        "half": np.array(0.5),
        "added": np.array(0.1) if added is None else added,
    }
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
        helper.make_node("Add", ["c", "added"], ["d"], name="/dec/Add"),
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
        in_memory = decoder_as_2d(model)  # the cache cannot be written: the model's bytes
    assert isinstance(in_memory, bytes) and "cannot cache" in caplog.text

    monkeypatch.setenv("HOTLINE_CACHE_DIR", str(tmp_path / "cache"))
    name = cached_path(model).name
    earlier = cached_path(model).with_name(name.replace(f"-{REWRITE}.", f"-{REWRITE - 1}."))
    earlier.parent.mkdir(parents=True)
    earlier.write_bytes(b"an earlier rewrite")
    built = decoder_as_2d(model)
    assert built == cached_path(model) and built.is_file()
    assert not earlier.exists()  # replaced, not kept beside it
    written = built.stat().st_mtime_ns
    assert decoder_as_2d(model) == built and built.stat().st_mtime_ns == written  # not rebuilt

    quiet = {"noise_scale": 0.0, "noise_w_scale": 0.0}  # no noise: the same input each time
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

"""Part of the piper voice in int8 (pipeline/piper_int8.py): only where it is harmless, checked
against the float voice, cheaper, and the float voice where it is refused."""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper
from piper.config import PiperConfig

from pipeline.piper_graph import NotRewritable, cached_path, int8_voice, rewritten_voice
from pipeline.piper_int8 import FLOOR_MARGIN_DB, check, int8_convolutions
from pipeline.tts import TextToSpeech, TTSSettings, voice_files, voice_phonemes

QUIET = {"noise_scale": 0.0, "noise_w_scale": 0.0}  # the same audio for the same text
TEXT = "Sure, I can move your appointment to Thursday morning at nine, if that works for you."
RATE = 22050


def bundled_phonemes():
    config = voice_files(TTSSettings().voice)[1]
    return voice_phonemes(PiperConfig.from_dict(json.loads(config.read_text("utf-8"))))


def test_int8_goes_to_the_flow_and_the_decoders_first_stage_only() -> None:
    source = rewritten_voice(voice_files(TTSSettings().voice)[0])
    graph = onnx.load(str(source), load_external_data=False).graph
    chosen = int8_convolutions(graph)
    convolutions = [node.name for node in graph.node if node.op_type == "Conv"]
    assert set(chosen) <= set(convolutions)
    stage = {name.split("/")[2] for name in chosen if name.startswith("/dec/")}
    # the voice upsamples 3 times with 3 residual blocks after each: the first stage is 0-2
    assert stage == {"conv_pre", "ups.0", "resblocks.0", "resblocks.1", "resblocks.2"}
    assert any(name.startswith("/flow/") for name in chosen)
    left = [name for name in convolutions if name not in chosen]
    assert all(name.startswith(("/enc_p/", "/dp/", "/dec/")) for name in left)
    assert any(name.startswith("/dec/resblocks.3/") for name in left)  # the audio-rate stages
    assert any(name.startswith("/enc_p/") for name in left)  # it sets the durations: float

    # a decoder not laid out as HiFi-GAN's: no guess at its stages
    odd = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], name="/dec/ups.0/Conv")], "odd", [], []
    )
    with pytest.raises(NotRewritable, match="1 upsamplings and 0 blocks"):
        int8_convolutions(odd)


def test_the_bundled_voice_in_int8_is_cached_as_long_as_float_and_cheaper() -> None:
    """`hotline fetch-models` (run by `make`) built it: the cached file is used as it is."""
    model = voice_files(TTSSettings().voice)[0]
    source = int8_voice(model, bundled_phonemes())
    assert source == cached_path(model, int8=True) and source.is_file()

    float_voice = TextToSpeech(TTSSettings(int8=False, **QUIET))
    int8 = TextToSpeech(TTSSettings(**QUIET))
    before, after = float_voice.synthesize_blocking(TEXT), int8.synthesize_blocking(TEXT)
    assert len(after) == len(before) > 3 * int8.sample_rate  # the same pace, sample for sample
    assert not np.array_equal(after, before)  # it is another model
    check(before.astype(np.float32) / 32768, after.astype(np.float32) / 32768)

    spent: dict[TextToSpeech, list[float]] = {float_voice: [], int8: []}
    for _ in range(4):  # alternated, so that both see the same machine; the cheapest of each
        for voice, seconds in spent.items():
            started = time.thread_time()  # the synthesis runs on this thread (one intra-op)
            voice.synthesize_blocking(TEXT)
            seconds.append(time.thread_time() - started)
    assert min(spent[int8]) < min(spent[float_voice])


@pytest.fixture
def float_only_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache that holds the bundled voice's float rewrite, not its int8 one: its folder."""
    model = voice_files(TTSSettings().voice)[0]
    rewritten = rewritten_voice(model)
    assert isinstance(rewritten, Path)
    monkeypatch.setenv("HOTLINE_CACHE_DIR", str(tmp_path / "cache"))
    cached_path(model).parent.mkdir(parents=True)
    shutil.copy(rewritten, cached_path(model))
    return cached_path(model).parent


def test_a_refused_voice_speaks_in_float_and_is_not_tried_again(
    float_only_cache: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = voice_files(TTSSettings().voice)[0]
    refused = cached_path(model, int8=True).with_suffix(".refused")
    refused.write_text("its floor in pauses is 31 dB above float's")

    with pytest.raises(NotRewritable, match="31 dB"):
        int8_voice(model, bundled_phonemes())
    with caplog.at_level(logging.WARNING, "pipeline.tts"):
        voice = TextToSpeech(TTSSettings(**QUIET))
    assert "runs without int8: its floor in pauses is 31 dB" in caplog.text
    float_voice = TextToSpeech(TTSSettings(int8=False, **QUIET))
    assert np.array_equal(voice.synthesize_blocking(TEXT), float_voice.synthesize_blocking(TEXT))
    assert sorted(p.name for p in float_only_cache.iterdir()) == sorted(
        [cached_path(model).name, refused.name]
    )  # nothing built


def speech_with_a_pause() -> np.ndarray:
    """1.5 s of a voiced sound, half a second of near silence (-100 dBFS), 1.5 s more."""
    rng = np.random.default_rng(3)
    t = np.arange(3 * RATE // 2) / RATE
    voiced = 0.3 * np.sin(2 * np.pi * 140 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))
    voiced += 0.1 * np.sin(2 * np.pi * 1100 * t) + 0.01 * rng.standard_normal(len(t))
    pause = 1e-5 * rng.standard_normal(RATE // 2)
    return np.concatenate([voiced, pause, voiced[::-1]]).astype(np.float32)


def test_the_check_refuses_a_longer_a_hissing_or_a_different_voice() -> None:
    speech = speech_with_a_pause()
    rng = np.random.default_rng(5)
    check(speech, speech + 3e-6 * rng.standard_normal(len(speech)).astype(np.float32))

    with pytest.raises(NotRewritable, match="samples where float gives"):
        check(speech, np.concatenate([speech, np.zeros(256, np.float32)]))
    hiss = 10 ** ((FLOOR_MARGIN_DB + 5 - 100) / 20) * rng.standard_normal(len(speech))
    with pytest.raises(NotRewritable, match="floor in pauses"):
        check(speech, speech + hiss.astype(np.float32))  # the pause at -85 dBFS, not -100
    other = np.roll(speech, RATE // 2) * 0.5 + 0.2 * np.sin(np.arange(len(speech)) * 0.9)
    with pytest.raises(NotRewritable, match="spectrum"):
        check(speech, other.astype(np.float32))


def test_a_voice_that_cannot_be_built_now_speaks_in_float_and_is_tried_again(
    float_only_cache: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No room for the quantizer's scratch files: the machine's trouble, not the voice's."""
    model = voice_files(TTSSettings().voice)[0]
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-directory"))

    with caplog.at_level(logging.WARNING, "pipeline.tts"):
        voice = TextToSpeech(TTSSettings(**QUIET))
    assert "runs without int8: not built (FileNotFoundError" in caplog.text
    assert len(voice.synthesize_blocking(TEXT)) > voice.sample_rate
    assert [p.name for p in float_only_cache.iterdir()] == [cached_path(model).name]


def test_a_damaged_int8_file_leaves_the_float_rewrite_speaking(
    float_only_cache: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = voice_files(TTSSettings().voice)[0]
    cached_path(model, int8=True).write_bytes(b"not a model")
    with caplog.at_level(logging.INFO, "pipeline.tts"):
        voice = TextToSpeech(TTSSettings(**QUIET))
    assert f"{cached_path(model, int8=True).name} did not load" in caplog.text
    assert f"speaks as {cached_path(model).name}" in caplog.text  # not as shipped
    float_voice = TextToSpeech(TTSSettings(int8=False, **QUIET))
    assert np.array_equal(voice.synthesize_blocking(TEXT), float_voice.synthesize_blocking(TEXT))

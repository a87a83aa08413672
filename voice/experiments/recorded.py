"""Recorded calls as simulated callers: the caller's side of last week's real traffic.

A recording is one stereo Ogg/Opus file per call, `<call_id>.ogg`: the caller on the left, what
the caller heard (the bot) on the right. Only the left channel is used. It is decoded (48 kHz
float from libopus), brought to the pipeline's 16 kHz mono int16, and split into utterances at
the caller's pauses by Silero VAD (`faster_whisper.vad`, the same network the turn detector
runs). A recording cut short (the server crashed: no end-of-stream page) gives what it holds.

Where to split (`RecordingSplit.pause_s`, 1.0 s): a live turn ends after `end_silence_ms` (500
ms) of silence, but the reply's first audio comes some 0.5-1 s after that, so a caller who
resumed within a second had heard nothing yet and the pipeline merged both parts into one turn
(the reply cut off unheard, its words carried over). Replayed as one utterance, such a pause
takes the same path: the turn detector still ends a turn there, the rest of the speech barges
in, and both parts are answered together. A real turn boundary has the bot's reply in it,
seconds long. Shorter voiced bits than `min_speech_ms` (coughs, clicks) are not replayed: the
pipeline would most likely answer nothing, and the replay would wait out `turn_timeout_s`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import av
import numpy as np
from pydantic import BaseModel, Field, model_validator

from pipeline.transport import PCM, SAMPLE_RATE
from voice.audio import resample

log = logging.getLogger(__name__)

EXPECTED = "a stereo Ogg/Opus call recording (left: the caller, right: what the caller heard)"


class RecordingError(ValueError):
    """A recording that cannot be replayed: missing, unreadable, mono, or without speech."""


class RecordingSplit(BaseModel):
    """How a recorded caller channel is cut into utterances, one a turn."""

    pause_s: float = Field(
        default=1.0, gt=0, description="A pause at least this long separates two utterances."
    )
    pad_ms: int = Field(
        default=300,
        ge=0,
        description="Audio kept either side of the speech (at least the turn detector's "
        "200 ms pre-roll, so it hears the onset as it did live).",
    )
    min_speech_ms: int = Field(
        default=200, ge=0, description="Shorter speech is not replayed (coughs, clicks)."
    )
    threshold: float = Field(default=0.5, gt=0, lt=1, description="Silero prob for speech.")

    @model_validator(mode="after")
    def _pads_apart(self) -> RecordingSplit:
        if 2 * self.pad_ms > self.pause_s * 1000:
            raise ValueError("pad_ms must be at most half of pause_s: utterances would overlap")
        return self


@dataclass(frozen=True)
class Utterance:
    """One stretch of the caller's speech, with the padding around it."""

    start_s: float  # in the recording
    end_s: float
    pcm: PCM  # 16 kHz mono int16


@dataclass(frozen=True)
class RecordedCall:
    """One recording, as a simulated caller: its utterances, in order."""

    call_id: str  # the file's stem
    path: Path
    duration_s: float  # of the caller channel that could be read
    utterances: list[Utterance]


def read_caller_channel(path: Path) -> PCM:
    """The caller's channel (left) of a recording, 16 kHz mono int16; a truncated file gives
    what it holds."""
    try:
        container = av.open(str(path))
    except FileNotFoundError as exc:
        raise RecordingError(f"{path}: no such file") from exc
    except (av.FFmpegError, OSError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise RecordingError(f"{path}: cannot be read ({reason}); expected {EXPECTED}") from exc
    with container:
        streams = container.streams.audio
        codec = streams[0].codec_context.name if streams else None
        if "ogg" not in container.format.name.split(",") or codec != "opus":
            found = f"{container.format.name} with {codec or 'no audio'}"
            raise RecordingError(f"{path}: {found}; expected {EXPECTED}")
        channels = streams[0].codec_context.channels
        if channels != 2:
            raise RecordingError(f"{path}: {channels} channel(s); expected {EXPECTED}")
        left: list[np.ndarray] = []
        rate = SAMPLE_RATE
        try:
            for frame in container.decode(streams[0]):
                rate = frame.sample_rate
                samples = frame.to_ndarray()
                left.append(samples[0] if frame.format.is_planar else samples[0, ::channels])
        except (av.FFmpegError, EOFError) as exc:
            if not left:
                raise RecordingError(f"{path}: cannot be decoded ({exc})") from exc
            log.warning("%s: cut short (%s); replaying the audio before it", path, exc)
    if not left:
        raise RecordingError(f"{path}: holds no audio")
    caller = np.concatenate(left).astype(np.float32)
    pcm = np.clip(np.round(caller * 32768.0), -32768, 32767).astype(np.int16)
    return resample(pcm, rate)


def split_utterances(pcm: PCM, split: RecordingSplit | None = None) -> list[Utterance]:
    """The caller's utterances: speech separated by pauses of at least `split.pause_s`."""
    from faster_whisper.vad import VadOptions, get_speech_timestamps

    split = split or RecordingSplit()
    options = VadOptions(
        threshold=split.threshold,
        min_speech_duration_ms=split.min_speech_ms,
        min_silence_duration_ms=round(split.pause_s * 1000),
        speech_pad_ms=split.pad_ms,
    )
    if len(pcm) == 0:
        return []
    spans = get_speech_timestamps(pcm.astype(np.float32) / 32768.0, options, SAMPLE_RATE)
    return [
        Utterance(span["start"] / SAMPLE_RATE, span["end"] / SAMPLE_RATE, pcm[start:end].copy())
        for span in spans
        if (end := int(span["end"])) > (start := int(span["start"]))
    ]


def load_recorded_call(path: Path, split: RecordingSplit | None = None) -> RecordedCall:
    """A recording's caller, ready to replay; RecordingError if there is nothing to replay."""
    pcm = read_caller_channel(path)
    utterances = split_utterances(pcm, split)
    if not utterances:
        raise RecordingError(f"{path}: no caller speech (left channel) to replay")
    return RecordedCall(path.stem, path, len(pcm) / SAMPLE_RATE, utterances)


def recording_files(paths: Iterable[Path]) -> list[Path]:
    """Each file as given, each directory's *.ogg files by name; every call id once."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            inside = sorted(p for p in path.glob("*.ogg") if p.is_file())
            if not inside:
                raise RecordingError(f"{path}: no recordings (*.ogg) in this directory")
            found += inside
        elif path.exists():
            found.append(path)
        else:
            raise RecordingError(f"{path}: no such file or directory")
    by_call: dict[str, Path] = {}
    for path in found:
        seen = by_call.setdefault(path.stem, path)
        if seen.resolve() != path.resolve():
            raise RecordingError(f"two recordings of call {path.stem}: {seen} and {path}")
    return list(by_call.values())


def load_recorded_calls(
    paths: Sequence[Path], split: RecordingSplit | None = None
) -> list[RecordedCall]:
    """Every recording under `paths` (files, or directories of *.ogg), as simulated callers."""
    return [load_recorded_call(path, split) for path in recording_files(paths)]

"""Caller audio handed to the conversation a detector window at a time (`CallerAudio`): no
decision of the turn detector comes later than when it was handed every 20 ms frame."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np

from pipeline.transport import VAD_WINDOW, AudioIn, CallerAudio, Dtmf, HangUp, InboundEvent
from pipeline.turns import TurnDetector, TurnSettings
from tests.support.speech import concat, frames, noise, utterance

FRAME_S = 0.02


def scalars(event: object) -> dict[str, object]:
    """An event's fields but its audio: positions, times, judgements."""
    fields = dataclasses.asdict(event)  # type: ignore[call-overload]
    return {k: v for k, v in fields.items() if not isinstance(v, np.ndarray)}


def queued(queue: asyncio.Queue[InboundEvent]) -> list[InboundEvent]:
    events = []
    while not queue.empty():
        events.append(queue.get_nowait())
    return events


def test_audio_is_handed_over_at_the_frame_that_completes_a_window() -> None:
    queue: asyncio.Queue[InboundEvent] = asyncio.Queue()
    caller = CallerAudio(queue)
    rng = np.random.default_rng(1)
    sent = [rng.integers(-3000, 3000, 320).astype(np.int16) for _ in range(16)]
    handed_at = []
    for index, frame in enumerate(sent, start=1):
        caller.add(frame, index * FRAME_S)
        if not queue.empty():
            handed_at.append(index)
            (event,) = queued(queue)
            assert isinstance(event, AudioIn) and event.at == index * FRAME_S
    # 5 windows in every 8 frames of 320 samples (VAD_WINDOW): 3 of 8 frames wake nobody
    assert VAD_WINDOW == 512
    assert handed_at == [2, 4, 5, 7, 8, 10, 12, 13, 15, 16]


def test_a_key_or_the_hang_up_comes_after_the_audio_held_and_nothing_is_lost() -> None:
    queue: asyncio.Queue[InboundEvent] = asyncio.Queue()
    caller = CallerAudio(queue)
    first, second = np.arange(320, dtype=np.int16), np.arange(320, 640, dtype=np.int16)
    caller.add(first, 0.02)
    assert queue.empty()  # 320 of 512 samples: held
    caller.put(Dtmf("5", 0.03))
    caller.add(second, 0.04)
    caller.put(HangUp("stop"))
    events = queued(queue)
    assert [type(e) for e in events] == [AudioIn, Dtmf, AudioIn, HangUp]
    audio = [e for e in events if isinstance(e, AudioIn)]
    assert np.array_equal(np.concatenate([a.pcm for a in audio]), np.arange(640))
    assert [a.at for a in audio] == [0.02, 0.04]


def test_the_detector_decides_at_the_same_frames_as_when_handed_every_frame() -> None:
    """Speech with pauses (a short one, an end of turn) over a noisy line: every event of the
    turn detector, at the same audio position and after the same frame, either way."""
    speech = concat(
        noise(300, 0.002),
        utterance("I would like to book a table for four."),
        noise(260, 0.002, seed=1),
        utterance("Tomorrow at eight, please."),
        noise(900, 0.002, seed=2),
    )
    settings = TurnSettings()

    def decisions(batched: bool) -> list[tuple[int, str, dict[str, object]]]:
        detector = TurnDetector(settings)
        queue: asyncio.Queue[InboundEvent] = asyncio.Queue()
        caller = CallerAudio(queue)
        found = []
        for index, frame in enumerate(frames(speech)):
            chunks = [AudioIn(frame, index * FRAME_S)]
            if batched:
                caller.add(frame, index * FRAME_S)
                chunks = [e for e in queued(queue) if isinstance(e, AudioIn)]
            for chunk in chunks:
                for event in detector.push(chunk.pcm, chunk.at):
                    found.append((index, type(event).__name__, scalars(event)))
        return found

    every_frame = decisions(batched=False)
    assert {name for _, name, _ in every_frame} >= {"SpeechStarted", "TurnSegment"}
    assert decisions(batched=True) == every_frame

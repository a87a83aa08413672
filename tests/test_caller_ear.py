"""The scripted callers' ear: frame tests over what was heard, as the bench's callers wait on
them for every frame of a call."""

from __future__ import annotations

import asyncio
import random
from typing import SupportsIndex

import pytest

from voice.devtools.turns import Ear, FrameTest, first_audible_after, silent_for_after

Frames = list[tuple[float, bool]]


class CountingFrames(list[tuple[float, bool]]):
    """A list of frames that counts how many of them were read, however they were read."""

    reads = 0

    def __getitem__(self, index: SupportsIndex | slice) -> object:  # type: ignore[override]
        found = super().__getitem__(index)
        self.reads += len(found) if isinstance(index, slice) else 1
        return found

    def __iter__(self):  # type: ignore[no-untyped-def]
        for frame in super().__iter__():
            self.reads += 1
            yield frame


def heard(seed: int, count: int = 3000) -> Frames:
    """A call's frames: 20 ms apart, audible in runs of random length (replies and silences)."""
    rng = random.Random(seed)
    frames: Frames = []
    audible = False
    while len(frames) < count:
        audible = not audible
        for _ in range(rng.randint(1, 80)):
            frames.append((100.0 + len(frames) * 0.02, audible))
    return frames[:count]


def whole(test: FrameTest, frames: Frames) -> float | None:
    return test(list(frames))


def growing(test: FrameTest, frames: Frames) -> float | None:
    """The test asked after every frame, as `Ear.wait_for` asks it; its first answer."""
    seen: Frames = []
    for frame in frames:
        seen.append(frame)
        if (found := test(seen)) is not None:
            return found
    return None


@pytest.mark.parametrize("seed", range(5))
def test_a_test_asked_frame_by_frame_answers_as_one_asked_once(seed: int) -> None:
    frames = heard(seed)
    for t in (0.0, 100.0, 117.3, 140.01, 170.0):
        assert growing(first_audible_after(t), frames) == whole(first_audible_after(t), frames)
        for quiet_s in (0.1, 0.8, 2.0):
            expected = whole(silent_for_after(t, quiet_s), frames)
            assert growing(silent_for_after(t, quiet_s), frames) == expected


def test_an_answer_once_found_stays() -> None:
    frames = heard(7)
    test = first_audible_after(120.0)
    found = test(frames)
    assert found is not None
    frames.append((frames[-1][0] + 0.02, True))
    assert test(frames) == found


@pytest.mark.parametrize("kind", ["first audible", "silent for"])
def test_waiting_out_a_call_reads_each_frame_once(kind: str) -> None:
    """A test that never finds (the reply never came, the line never went quiet) asked after
    each of a minute's 3 000 frames reads each once: it was every frame heard so far, each time
    (4.5 million reads a call-minute, on the bench's event loop for every caller)."""
    frames = CountingFrames()
    test = first_audible_after(1e9) if kind == "first audible" else silent_for_after(0, 1e9)
    for at, audible in heard(3):
        frames.append((at, audible))
        assert test(frames) is None
    assert frames.reads == len(frames)


async def test_the_ear_answers_when_the_frame_comes_and_gives_up_at_the_deadline() -> None:
    ear = Ear()
    loop = asyncio.get_running_loop()
    for i in range(5):
        loop.call_soon(ear.record, 1.0 + i * 0.02, i == 4, b"")
    assert await ear.wait_for(first_audible_after(0.0), 30.0) == 1.08
    assert await ear.wait_for(first_audible_after(2.0), 0.05) is None

"""What a `PhoneStream` queues for the caller: 20 ms frames of reply audio, and the marks whose
echo says the phone has played up to there: one at the end of each piece of the reply (a
sentence), named `hotline-N`, and one every 200 ms inside it, named `hotline-N-part`."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from pipeline.transport import PCM

# A mark every 200 ms of reply audio as well as at each sentence's end: the played position
# (what the caller heard, where a paused reply resumes) is known to within that, not only at
# sentence ends. Twilio echoes each one as the phone plays it: five small messages a second.
MARK_EVERY_FRAMES = 10


@dataclass
class Frame:
    pcm: PCM  # 20 ms at the wire rate
    end: int  # outbound position (16 kHz samples) after this frame
    source: PCM  # the same audio at 16 kHz (for the call's taps)


@dataclass
class Mark:
    name: str
    position: int


def mark_name(number: int, piece_end: bool) -> str:
    """`hotline-N` at a piece's end, `hotline-N-part` inside one."""
    return f"hotline-{number}" if piece_end else f"hotline-{number}-part"


def renamed(mark: Mark, number: int) -> Mark:
    """`mark` under number `number`, still at a piece's end or inside one."""
    return Mark(mark_name(number, not mark.name.endswith("-part")), mark.position)


def end_of(item: Frame | Mark) -> int:
    """The outbound position after `item`."""
    return item.end if isinstance(item, Frame) else item.position


def piece_items(
    pcm: PCM, wire: PCM, frame_samples: int, start: int, marks: int | None
) -> list[Frame | Mark]:
    """One piece of reply audio (`pcm` at 16 kHz, `wire` the same at the wire rate) as frames of
    `frame_samples`, the last padded, from outbound position `start`; unless `marks` is None, a
    mark every `MARK_EVERY_FRAMES` frames and at its end, numbered from `marks` + 1."""
    count = -(-len(wire) // frame_samples)
    frames = np.zeros(count * frame_samples, dtype=np.int16)
    frames[: len(wire)] = wire
    items: list[Frame | Mark] = []
    after = start
    for index in range(count):
        chunk = frames[index * frame_samples : (index + 1) * frame_samples]
        end = start + round((index + 1) * pcm.size / count)
        items.append(Frame(chunk, end, pcm[after - start : end - start]))
        after = end
        last = index + 1 == count
        if marks is not None and (last or (index + 1) % MARK_EVERY_FRAMES == 0):
            marks += 1
            items.append(Mark(mark_name(marks, last), end))
    return items


def take_frames(outbox: deque[Frame | Mark], most: int) -> list[Frame]:
    """The frames at the head of `outbox` (taken off it) that go in one media message: at most
    `most`, none past a mark."""
    frames: list[Frame] = []
    while outbox and len(frames) < most:
        head = outbox[0]
        if not isinstance(head, Frame):
            break
        frames.append(head)
        outbox.popleft()
    return frames

"""What a `PhoneStream` queues for the caller: 20 ms frames of reply audio, and the marks whose
echo says the phone has played up to there: one at the end of each piece of the reply (a
sentence), named `hotline-N`, and one every 200 ms inside it, named `hotline-N-part`."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.transport import PCM


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

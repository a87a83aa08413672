"""What a `PhoneStream` queues for the caller: 20 ms frames of reply audio, and the marks after
each sentence whose echo says the phone has played up to there."""

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


def end_of(item: Frame | Mark) -> int:
    """The outbound position after `item`."""
    return item.end if isinstance(item, Frame) else item.position

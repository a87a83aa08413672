"""A small jitter buffer for one RTP stream: reorder by sequence number, conceal losses.

No clock drives it: frames leave as soon as they are contiguous, so an in-order stream adds no
delay; only a gap holds later frames back, until `depth` packets after it have arrived.
"""

from __future__ import annotations

_SEQUENCE_MOD = 1 << 16  # RFC 3550 §5.1: the sequence number is 16 bits and wraps
MAX_JUMP = 100  # a larger jump is a new sequence space (sender restart), not loss or lateness


def sequence_delta(sequence: int, reference: int) -> int:
    """Signed distance from `reference` to `sequence` in 16-bit serial arithmetic."""
    return (sequence - reference + _SEQUENCE_MOD // 2) % _SEQUENCE_MOD - _SEQUENCE_MOD // 2


class JitterBuffer:
    """Reorders RTP packets of one stream and conceals losses with silence: frames come out in
    sequence order as soon as they are contiguous; a missing packet is given up on (a lost
    frame: None) once `depth` later packets have arrived; packets older than what was already
    played out are dropped (late). Handles 16-bit sequence wrap-around and a sender restart (a
    jump of more than 100 in sequence: resynchronise, no thousands of lost frames)."""

    def __init__(self, depth: int = 3) -> None:
        if depth < 1:
            raise ValueError("depth must be at least 1")
        self.depth = depth
        self.lost = 0  # frames given up on (each came out as None)
        self.late = 0  # packets that arrived after their place had been played out
        self.duplicates = 0  # packets already held
        self.resyncs = 0  # jumps of more than MAX_JUMP (sender restarts)
        self._next: int | None = None  # the sequence number that plays out next
        self._held: dict[int, bytes] = {}  # packets after a gap, by sequence number

    def push(self, sequence: int, payload: bytes) -> list[bytes | None]:
        """Add one packet; returns the frames now ready, in order (None: a lost frame)."""
        sequence %= _SEQUENCE_MOD
        ready: list[bytes | None] = []
        if self._next is None:
            self._next = sequence
        delta = sequence_delta(sequence, self._next)
        if abs(delta) > MAX_JUMP:
            self.resyncs += 1
            ready += self.flush()
            self._next = sequence
        elif delta < 0:
            self.late += 1
            return ready
        elif sequence in self._held:
            self.duplicates += 1
            return ready
        self._held[sequence] = payload
        ready += self._drain()
        while len(self._held) >= self.depth:  # give up on the gap at the head
            self.lost += 1
            ready.append(None)
            self._advance()
            ready += self._drain()
        return ready

    def flush(self) -> list[bytes | None]:
        """Everything still held, in order (gaps skipped, not counted lost); the next packet
        starts a new sequence space (a new SSRC, a sender restart)."""
        if self._next is None:
            return []
        start = self._next
        ordered = sorted(self._held, key=lambda sequence: sequence_delta(sequence, start))
        ready: list[bytes | None] = [self._held[sequence] for sequence in ordered]
        self._held.clear()
        self._next = None
        return ready

    def _drain(self) -> list[bytes | None]:
        ready: list[bytes | None] = []
        while self._next is not None and self._next in self._held:
            ready.append(self._held.pop(self._next))
            self._advance()
        return ready

    def _advance(self) -> None:
        assert self._next is not None
        self._next = (self._next + 1) % _SEQUENCE_MOD

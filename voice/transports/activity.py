"""Whether a line is in use, for the media idle timeouts of phone streams and SIP calls.

A line is idle while it carries no audio: neither the caller's nor the reply's. A client that
keeps a socket open with a trickle (one 1-byte media frame every 8 s held a phone line for ever)
must not hold a line, so not every frame counts as the caller's audio:

- a frame shorter than `MIN_FRAME_S` (10 ms of samples) is not audio;
- digital silence (every sample zero) is not audio on a phone stream: a provider sends the
  line's noise, and zeros are what a client sends to look alive. On SIP it is (see
  voice/transports/sip/media.py: a muted μ-law phone sends exact zeros at the full rate);
- audio counts for what it lasts, `CREDIT` times over, and never past now: a stream must carry
  audio for a tenth of the time or more to stay in use (a provider sends all of it, 20 ms every
  20 ms), so 20 ms of noise every 8 s does not hold a line either.

Reply audio going out counts too: a caller listening to a long answer on a muted phone is there.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

MIN_FRAME_S = 0.01
CREDIT = 10.0


class LineActivity:
    """When a line last carried audio (`last_audio_at`, monotonic seconds), and how many of the
    caller's frames did not count (`not_audio`: too short, or zeros where zeros do not count)."""

    def __init__(self, now: float, *, zeros_count: bool = False) -> None:
        self.last_audio_at = now
        self.zeros_count = zeros_count
        self.not_audio = 0

    def caller_audio(self, pcm: npt.NDArray[np.int16], rate: int, at: float) -> bool:
        """Count a frame of the caller's audio (`rate` samples a second) that came at `at`;
        whether it was audio."""
        seconds = pcm.size / rate
        if seconds < MIN_FRAME_S or not (self.zeros_count or pcm.any()):
            self.not_audio += 1
            return False
        credited = min(at, self.last_audio_at + CREDIT * seconds)
        self.last_audio_at = max(self.last_audio_at, credited)
        return True

    def in_use(self, at: float) -> None:
        """The line is in use until `at` though the caller sent nothing: reply audio plays (the
        caller is listening), or the call is on hold."""
        self.last_audio_at = max(self.last_audio_at, at)

    def idle_for(self, now: float) -> float:
        return now - self.last_audio_at

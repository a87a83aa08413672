"""How soon an interrupted reply must go silent at the caller, derived from the call itself.

The caller measures barge-in from the onset of its own speech to the reply going silent. That
time is made of:
- the caller audio the server's VAD needs before it calls it speech: audio time, fixed by the
  turn settings (`start_speech_ms` of speech, found at Silero's window granularity, in 20 ms
  frames), the same on any machine;
- the way there and back through the transport (the caller's audio reaching the server, the
  reply audio already sent reaching the caller), which the same call measures on its first
  turn: the caller's voice-to-voice time less the server's own first-audio time;
- a few ms of server work (cancel, clear, flush), allowed two frames.

So the bound moves with the transport and the machine the call ran on, and a reply that plays
on after the server knew (a late clear, an unflushed queue) still fails. The product's 300 ms
target is `hotline bench`'s, not a test's.
"""

from __future__ import annotations

from collections.abc import Mapping

from pipeline.transport import FRAME_SAMPLES, SAMPLE_RATE
from pipeline.turns import WINDOW, TurnSettings

FRAME_MS = FRAME_SAMPLES * 1000 / SAMPLE_RATE
# Audio the VAD hears before SpeechStarted: the speech it needs, rounded up to a whole Silero
# window and a whole frame.
VAD_AUDIO_MS = TurnSettings().start_speech_ms + WINDOW * 1000 / SAMPLE_RATE + FRAME_MS
SERVER_WORK_MS = 2 * FRAME_MS


def round_trip_ms(voice_to_voice_ms: float | None, timings_ms: Mapping[str, object]) -> float:
    """The transport's way there and back on one answered turn: voice-to-voice at the caller
    (its speech end to the first reply audio heard) less the server's first audio sent (from
    the end of the speech as it arrived). The two ends are found differently (the caller's
    last loud frame, the VAD's last voiced window), so a fast transport can come out a few ms
    below zero: it counts as zero."""
    assert voice_to_voice_ms is not None, "the calibration turn got no reply audio"
    first_audio = timings_ms.get("first_audio")
    assert isinstance(first_audio, int | float), f"no first_audio in {dict(timings_ms)}"
    return max(0.0, voice_to_voice_ms - float(first_audio))


def barge_in_bound_ms(round_trip: float) -> float:
    """The latest an interrupted reply may go silent, from the caller's onset."""
    return VAD_AUDIO_MS + round_trip + SERVER_WORK_MS

"""The voicemail beep: one frequency holding nearly all of the energy for 150 ms or more.

Each 20 ms frame is judged over the last 40 ms (this frame and the one before, Hann window,
25 Hz bins): it is *tonal* when it is loud enough, its strongest bin lies in the beep band and
that bin with its two neighbours each side (the Hann main lobe) holds at least `concentration`
of the energy. A run of tonal frames within `drift_hz` of the run's first frequency (found
between bins by a parabolic fit) lasting `min_ms` is a beep; it ends at the first frame that is
not tonal at that frequency.

Measured on Allison's 568 recordings (25.5 min, 16 kHz and over the phone path): her sustained
vowels at a raised pitch (350–430 Hz) hold 0.80–0.97 of a frame's energy in one lobe, but
their pitch wanders 15–40 Hz within 150 ms; Asterisk's beep holds 1.00 and wanders under
1 Hz, after μ-law too. With 0.8 and 40 Hz, 6 speech clips held a "beep"; with 0.9 and 12 Hz,
none, and both real tones (beep.wav at 700 Hz, confbridge-leave at 441 Hz) are heard.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, Field

from pipeline.transport import FRAME_SAMPLES, SAMPLE_RATE

WINDOW = 2 * FRAME_SAMPLES  # 40 ms: 25 Hz bins
_HANN = np.hanning(WINDOW).astype(np.float64)
_LOBE = 2  # bins each side of the peak inside the Hann main lobe


class ToneSettings(BaseModel):
    """What counts as a beep."""

    low_hz: float = Field(default=350.0, gt=0, description="Lowest beep frequency.")
    high_hz: float = Field(default=2600.0, gt=0, description="Highest beep frequency.")
    concentration: float = Field(
        default=0.9, gt=0, le=1, description="Share of a frame's energy in the peak's lobe."
    )
    min_dbfs: float = Field(default=-40.0, description="A quieter frame is not tonal.")
    min_ms: int = Field(default=150, gt=0, description="A tone this long is a beep.")
    drift_hz: float = Field(default=12.0, ge=0, description="Frequency wander within one beep.")


@dataclass(frozen=True)
class Tone:
    """A beep: onset and end in samples since the answer (end None while it sounds)."""

    start: int
    end: int | None
    hz: float


def tonal_peak(window: np.ndarray, settings: ToneSettings) -> float | None:
    """The frequency of `window` (int16-scale floats, WINDOW long) if it is tonal, else None."""
    level = float(np.sqrt(np.mean(window**2))) / 32768.0
    if level <= 10 ** (settings.min_dbfs / 20):
        return None
    power = np.abs(np.fft.rfft((window - window.mean()) * _HANN)) ** 2
    peak = int(np.argmax(power))
    hz = peak * SAMPLE_RATE / WINDOW
    if not settings.low_hz <= hz <= settings.high_hz:
        return None
    lobe = float(power[max(0, peak - _LOBE) : peak + _LOBE + 1].sum())
    if lobe < settings.concentration * float(power.sum()):
        return None
    # Refine between bins (parabolic fit on log power) so drift is judged finely.
    a, b, c = np.log(power[peak - 1 : peak + 2] + 1e-9)
    shift = 0.5 * (a - c) / (a - 2 * b + c) if a - 2 * b + c else 0.0
    return float((peak + shift) * SAMPLE_RATE / WINDOW)


class ToneTracker:
    """Follows tonal runs frame by frame; `push` returns the beep when it starts or ends."""

    def __init__(self, settings: ToneSettings | None = None) -> None:
        self.settings = settings or ToneSettings()
        self._previous = np.zeros(FRAME_SAMPLES, dtype=np.float64)
        self._run_start: int | None = None  # onset of the current tonal run
        self._run_hz = 0.0
        self._run_last = 0  # end of the run's last tonal frame
        self._beep: Tone | None = None  # the sounding beep (end None)

    def push(self, frame: np.ndarray, end: int) -> Tone | None:
        """One 20 ms frame whose last sample is at `end` (samples since the answer). Returns
        the beep once it has lasted `min_ms` (end None) and again when it stops (end set)."""
        current = np.asarray(frame, dtype=np.float64)
        window = np.concatenate([self._previous, current])
        self._previous = current
        hz = tonal_peak(window, self.settings) if len(window) == WINDOW else None
        same = hz is not None and abs(hz - self._run_hz) <= self.settings.drift_hz
        if hz is not None and self._run_start is not None and same:
            self._run_last = end
            return self._maybe_started(end)
        finished = self._stop()
        if hz is not None:
            # The frame is tonal once the tone fills most of its 40 ms window: the tone began
            # about half a window before its end.
            self._run_start, self._run_hz, self._run_last = end - WINDOW // 2, hz, end
        return finished

    def _maybe_started(self, end: int) -> Tone | None:
        assert self._run_start is not None
        if self._beep is not None:
            return None
        if (end - self._run_start) * 1000 < self.settings.min_ms * SAMPLE_RATE:
            return None
        self._beep = Tone(self._run_start, None, round(self._run_hz, 1))
        return self._beep

    def _stop(self) -> Tone | None:
        beep, self._beep, self._run_start = self._beep, None, None
        if beep is None:
            return None
        # The last tonal frame still had the tone in most of its window.
        return Tone(beep.start, self._run_last - FRAME_SAMPLES // 2, beep.hz)

"""`/healthz`'s memory figures (voice/server/resident.py): the peak counts from the last reset
(the server resets it once its models are warm), not from the process's start. In a fresh
interpreter, where resident memory moves with the probe alone (in a test worker other
threads allocate and free at the same time)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

PROBE = textwrap.dedent(
    """
    import numpy as np
    from voice.server.resident import peak_rss_bytes, reset_peak_rss, rss_bytes

    MB = 2**20
    held = np.ones(200 * MB, dtype=np.uint8)  # every page touched: resident
    peak_while_held = peak_rss_bytes()
    assert peak_while_held >= rss_bytes() >= held.nbytes
    del held
    assert peak_rss_bytes() > peak_while_held - MB  # freed, but the peak remembers it
    assert reset_peak_rss()
    assert peak_rss_bytes() < peak_while_held - 150 * MB, (peak_rss_bytes(), peak_while_held)
    assert peak_rss_bytes() >= rss_bytes() - MB  # from now on: at least what is resident
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's clear_refs")
def test_the_peak_counts_from_the_reset_not_from_the_start() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr

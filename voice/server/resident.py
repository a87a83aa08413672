"""The server's resident memory as `/healthz` reports it: now, and the peak since the server
became ready.

Loading and warming up the models peaks about 140 MB above where the server then settles (an
idle server: 598 MB at the peak, 459 after), so a peak counted from the process's start said
more about loading than about calls: a one-call bench reported that loading peak. `hotline
serve` resets the peak once its models are warm (Linux: `/proc/self/clear_refs`, "5"), and the
peak reported is the kernel's high-water mark since (`VmHWM`). Elsewhere the peak is the
process's own (`ru_maxrss`), from its start.
"""

from __future__ import annotations

import logging
import resource
import sys

log = logging.getLogger(__name__)


def rss_bytes() -> int:
    """Resident set size now (Linux /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * resource.getpagesize()
    except OSError:
        return 0


def peak_rss_bytes() -> int:
    """The most memory resident at once since the last `reset_peak_rss` (or the start)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes there, KiB on Linux


def reset_peak_rss() -> bool:
    """Count the peak from now on; whether the kernel took it (Linux 4.0 and later)."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    except OSError as error:
        log.info("memory: the peak is counted from the start (%s)", error)
        return False
    return True

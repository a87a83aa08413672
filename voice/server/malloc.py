"""How many heaps glibc's malloc keeps for the server's threads.

glibc gives threads that allocate at once heaps of their own ("arenas"), up to eight per core,
and memory freed in one is kept there for that heap's later allocations. The server has many
threads that allocate large, short-lived buffers (two synthesis threads, two Whisper workers,
the turn model, the recorder, the event loop): each heap ends up holding its own peak. With two
heaps, 24 calls on 2 cores peaked at 867 MB against 926 MB, with the same playback and latency
figures (`hotline bench --calls 24`, README "Under load").

`limit_arenas` is called by `hotline serve` before it starts a thread; an operator's own
`MALLOC_ARENA_MAX` wins. Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger(__name__)

ARENAS = 2
_M_ARENA_MAX = -8  # glibc's malloc.h


def limit_arenas(arenas: int = ARENAS) -> bool:
    """Cap glibc's malloc arenas at `arenas` for threads started from now on; whether the cap
    is in force (False: not glibc, or `MALLOC_ARENA_MAX` set by the operator, which glibc
    already applies)."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    if mallopt(_M_ARENA_MAX, arenas) != 1:
        log.info("malloc: the arena cap was not accepted")
        return False
    return True

"""How many heaps glibc's malloc keeps for the server's threads.

glibc gives threads that allocate at once heaps of their own ("arenas"), up to eight per core,
and memory freed in one is kept there for that heap's later allocations. The server has many
threads that allocate large, short-lived buffers (two synthesis threads, two Whisper workers,
the turn model, the recorder, the event loop): each heap ends up holding its own peak. With two
heaps, 24 calls on 2 cores peaked at 867 MB against 926 MB, with the same playback and latency
figures (`hotline bench --calls 24`, README "Under load").

`limit_arenas` is called by `hotline serve` before it starts a thread; an operator's own
`MALLOC_ARENA_MAX` wins.

Memory freed in the middle of a heap stays with malloc (only a heap's top is given back).
`release_free_memory` (glibc's `malloc_trim`) gives back the whole free pages of every heap;
`hotline serve` calls it once its models are loaded and warmed up, whose buffers (Whisper's
float16 weights converted to int8, the warm-up inferences) are freed by then: an idle server
holds 459 MB instead of 490-510. Calling it every 5 s under load was tried: the 24-call peak
stayed where it was (800-854 against 825-830 MB), since what is freed there is soon taken
again. Elsewhere than glibc these do nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
from typing import Any

log = logging.getLogger(__name__)

ARENAS = 2
_M_ARENA_MAX = -8  # glibc's malloc.h


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


@functools.cache
def _malloc_trim() -> Any:
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is not None:
        trim.argtypes = [ctypes.c_size_t]
        trim.restype = ctypes.c_int
    return trim


def limit_arenas(arenas: int = ARENAS) -> bool:
    """Cap glibc's malloc arenas at `arenas` for threads started from now on; whether the cap
    is in force (False: not glibc, or `MALLOC_ARENA_MAX` set by the operator, which glibc
    already applies)."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    if mallopt(_M_ARENA_MAX, arenas) != 1:
        log.info("malloc: the arena cap was not accepted")
        return False
    return True


def release_free_memory() -> bool:
    """Give the system back the whole pages malloc holds free, in every heap; whether it could
    (False: not glibc)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True

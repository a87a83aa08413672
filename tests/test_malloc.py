"""`hotline serve` caps glibc's malloc arenas (voice/server/malloc.py): threads that allocate
at once share two heaps instead of one each. Counted with glibc's own `malloc_info`, in a fresh
interpreter (the cap holds for threads started after it)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

PROBE = textwrap.dedent(
    """
    import ctypes, ctypes.util, sys, tempfile, threading
    from voice.server.malloc import limit_arenas

    capped = limit_arenas(2) if sys.argv[1] == "cap" else False
    start, done = threading.Barrier(8), threading.Barrier(8)

    def work():
        start.wait()
        held = [bytearray(16_000) for _ in range(64)]  # below the mmap threshold: a heap's
        done.wait()
        del held

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    with tempfile.NamedTemporaryFile("r") as out:
        stream = libc.fopen(out.name.encode(), b"w")
        libc.malloc_info(0, stream)
        libc.fclose(stream)
        print(capped, out.read().count("<heap nr="))
    """
)

glibc = pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.confstr("CS_GNU_LIBC_VERSION") is None,
    reason="glibc's malloc only",
)


def heaps(mode: str, **env: str) -> tuple[bool, int]:
    environment = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"} | env
    done = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, env=environment
    )
    assert done.returncode == 0, done.stderr
    capped, count = done.stdout.split()
    return capped == "True", int(count)


@glibc
def test_threads_allocating_at_once_share_two_heaps_once_capped() -> None:
    capped, count = heaps("free")
    assert not capped and count > 2  # glibc's own limit: eight per core
    assert heaps("cap") == (True, 2)


@glibc
def test_an_operators_malloc_arena_max_wins() -> None:
    assert heaps("cap", MALLOC_ARENA_MAX="4") == (False, 4)


TRIM_PROBE = textwrap.dedent(
    """
    from voice.server.malloc import release_free_memory

    def resident_mb():
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * 4096 / 2**20

    blocks = [bytearray(1000) for _ in range(100_000)]  # 100 MB in malloc's heap
    last = blocks[-1]  # kept: the heap's top stays in use, so free() cannot shrink it
    del blocks
    freed = resident_mb()
    print(release_free_memory(), freed - resident_mb())
    """
)


@glibc
def test_free_pages_malloc_kept_go_back_to_the_system() -> None:
    done = subprocess.run([sys.executable, "-c", TRIM_PROBE], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    released, dropped_mb = done.stdout.split()
    assert released == "True"
    assert float(dropped_mb) > 50  # of the ~100 MB freed below a block still in use

"""Process-wide allocator settings for ``fak serve``.

glibc gives a thread that allocates under contention an arena of its own, up to eight
per core. A server's worker threads allocate and free KV tensors of every size, so
freed memory ends up spread over dozens of arenas that are seldom returned to the
system: resident memory keeps growing after the caches have filled their budgets.
Measured with ``bench/load.py`` (64 clients, default budgets): +22 % over 30 minutes
after warm-up, and about 35 % less resident memory at seven minutes with two arenas
(docs/reliability.md). Only the server does this: it owns its process, a library
caller's process is not ours to tune.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

M_ARENA_MAX = -8  # mallopt parameter (glibc malloc.h)
SERVER_ARENAS = 2


def limit_arenas(arenas: int = SERVER_ARENAS) -> bool:
    """Cap glibc's malloc arenas unless ``MALLOC_ARENA_MAX`` already says (the operator's
    choice wins). Call before threads start. True if the cap was set here."""
    # glibc's own variable, read to let the operator's choice win: an allowed exception to "only fak.settings reads the environment" (tests/repo/test_settings_only_env_reader.py)
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to cap
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_ARENA_MAX, arenas))

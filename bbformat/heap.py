"""Freed memory kept in the process while bbformat decodes or encodes (glibc only).

A decode or a pack allocates and frees the same large temporaries block after block: read
chunks, widened anchors, Gram matrices, the eigensolver's work arrays (numpy's linalg takes
those from malloc directly), regenerated blocks. glibc maps each allocation of more than its
mmap threshold (at most 32 MiB) on its own and unmaps it when freed, so the next block's
temporaries land on fresh pages, which the kernel must zero and a VM's host may first have to
fault in (BENCHMARKS.md 19: with and without this module, side by side).

Inside `kept()`, glibc's main heap serves allocations of up to 2 GiB and keeps up to 2 GiB of
free memory at its top, so freed blocks are reused in place (threads' arenas still map
allocations over 64 MiB on their own). When the last `kept()` block ends, the thresholds go to
32 MiB (mmap) and 64 MiB (trim), the values glibc's dynamic threshold rises to in a process
that frees large arrays, and malloc_trim(0) gives the free memory back. Only where the memory
lies changes: no value, bit or error depends on it.

Nothing is changed where the C library is not glibc, where the environment already sets glibc's
malloc (MALLOC_*_ or GLIBC_TUNABLES with glibc.malloc), or where BBFORMAT_HEAP=default."""
from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Protocol

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
HELD = (1 << 31) - 1  # mallopt takes an int: the largest it can say
AFTER_MMAP = 32 << 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit hosts
AFTER_TRIM = 2 * AFTER_MMAP  # the trim threshold glibc's dynamic rule sets beside it
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_",
                 "MALLOC_ARENA_MAX")


class Malloc(Protocol):
    def mallopt(self, param: int, value: int) -> int: ...

    def malloc_trim(self, pad: int) -> int: ...


@cache
def glibc() -> Malloc | None:
    """The process's glibc (its mallopt and malloc_trim), or None where it is another C library,
    or where the environment sets malloc itself or asks for the default (module docstring)."""
    if os.environ.get("BBFORMAT_HEAP", "") == "default":
        return None
    if any(k in os.environ for k in USER_SETTINGS) or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        return None
    try:
        libc = ctypes.CDLL(None)
        if not hasattr(libc, "gnu_get_libc_version"):
            return None
        libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
        return libc
    except (OSError, AttributeError):
        return None


_lock = threading.Lock()
_depth = 0  # kept() blocks open in this process


@contextmanager
def kept() -> Iterator[None]:
    """Inside the block (in any thread, while any such block is open), freed memory stays in the
    process for reuse; see the module docstring."""
    global _depth
    libc = glibc()
    if libc is None:
        yield
        return
    with _lock:
        _depth += 1
        if _depth == 1:
            libc.mallopt(M_MMAP_THRESHOLD, HELD)
            libc.mallopt(M_TRIM_THRESHOLD, HELD)
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                libc.mallopt(M_MMAP_THRESHOLD, AFTER_MMAP)
                libc.mallopt(M_TRIM_THRESHOLD, AFTER_TRIM)
                libc.malloc_trim(0)


__all__ = ["AFTER_MMAP", "AFTER_TRIM", "HELD", "glibc", "kept"]

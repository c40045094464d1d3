"""Freed memory kept in the process while bbformat decodes or encodes (glibc on 64-bit Linux).

A decode or a pack allocates and frees the same large temporaries block after block: read
chunks, widened anchors, Gram matrices, the eigensolver's work arrays (numpy's linalg takes
those from malloc directly), regenerated blocks. glibc maps each allocation of more than its
mmap threshold (at most 32 MiB by its own rule) on its own and unmaps it when freed, so the
next block's temporaries land on fresh pages, which the kernel must zero and a VM's host may
first have to fault in (BENCHMARKS.md 19: the decode and the pack with and without this).

Inside `kept()`, glibc's main heap serves allocations of up to 2 GiB and keeps up to 2 GiB of
free memory at its top, so freed blocks are reused in place. Threads other than the main one
allocate from arenas of their own, which still map allocations over 64 MiB on their own: the
gain measured is for work on the main thread (a one-worker, one-thread decode; a pack), and
none was seen for `bbformat verify` with its default workers. When the last `kept()` block
ends, the thresholds go to 32 MiB (mmap) and 64 MiB (trim), the most glibc's dynamic rule would
raise them to, and malloc_trim(0) gives the free memory back. Only where memory lies changes:
no decoded value or written byte depends on it, though peak memory may (a pack's rose by up
to 0.55 GiB on the 7B layer).

The `bbformat` command runs each command inside `kept()`: the process is its own and ends with
the command (cli.main called in-process leaves the thresholds at 32 MiB and 64 MiB). The
library never calls it on its own, since its effect is the process's:
  * glibc's dynamic threshold stays off for the rest of the process, and a program's own
    mallopt settings of these two thresholds are replaced (glibc cannot say what they were);
  * memory allocated inside the block that outlives it (a loaded model's tensors) lies in the
    heap, and once freed it goes back to the system only when nothing above it is in use.
A program that accepts that wraps its loads in `with bbformat.heap.kept():`.

Nothing is changed where the C library is not glibc, where the process is not 64-bit Linux,
where glibc refuses the threshold (glibc before 2.35 takes at most 32 MiB), where the
environment sets glibc's malloc itself (one of USER_SETTINGS, or GLIBC_TUNABLES with
glibc.malloc.), or where BBFORMAT_HEAP=default."""
from __future__ import annotations

import ctypes
import os
import sys
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
    """The process's glibc (its mallopt and malloc_trim), or None where kept() changes nothing:
    another C library or platform, or an environment that sets malloc itself or asks for the
    default (module docstring). Read once per process."""
    if os.environ.get("BBFORMAT_HEAP", "") == "default" or not sys.platform.startswith("linux") or sys.maxsize < 1 << 32:
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
    except (OSError, AttributeError, TypeError):
        return None


_lock = threading.RLock()
_depth = 0  # kept() blocks open in this process
_held = False  # whether the open blocks changed the thresholds (glibc took the first)


@contextmanager
def kept() -> Iterator[None]:
    """Inside the block (in any thread, while any such block is open), freed memory stays in the
    process for reuse; see the module docstring for what that costs a long-lived process."""
    global _depth, _held
    libc = glibc()
    if libc is None:
        yield
        return
    entered = False
    try:
        with _lock:
            _depth += 1
            entered = True
            if _depth == 1:
                _held = libc.mallopt(M_MMAP_THRESHOLD, HELD) == 1  # 0: this glibc refuses it; change nothing else
                if _held:
                    libc.mallopt(M_TRIM_THRESHOLD, HELD)
        yield
    finally:
        if entered:
            with _lock:
                _depth -= 1
                if _depth == 0 and _held:
                    _held = False
                    libc.mallopt(M_MMAP_THRESHOLD, AFTER_MMAP)
                    libc.mallopt(M_TRIM_THRESHOLD, AFTER_TRIM)
                    libc.malloc_trim(0)


def depth() -> int:
    """kept() blocks open now (tests)."""
    return _depth


def holding() -> bool:
    """Whether the open kept() blocks changed glibc's thresholds (False where it refused, or none is open)."""
    return _held


__all__ = ["AFTER_MMAP", "AFTER_TRIM", "HELD", "USER_SETTINGS", "depth", "glibc", "holding", "kept"]

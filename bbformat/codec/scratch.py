"""Memory for a decode's large temporaries (the anchor widened to float64, the stack's pushed
symbols, a corrected block), taken from the reader's buffer pool while one is installed.

Fresh pages cost the kernel's zeroing, on this project's VM about as much as the work done in
them (BENCHMARKS.md 19); a pooled buffer is handed out again only when nothing but the pool
refers to it (payload.OutputBuffers), so reuse never writes what anyone still holds. Without a
pool (the encoder, tests, other Pythons) every request is a plain np.empty. The pool is per
thread: a reader installs its own around each block it decodes."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from math import prod

import numpy as np

Alloc = Callable[[int, np.dtype], np.ndarray]  # (elements, dtype) -> an uninitialised 1-d array

MIN_BYTES = 1 << 20  # smaller temporaries come from numpy: malloc reuses their pages already

_alloc: ContextVar[Alloc | None] = ContextVar("bbformat_scratch", default=None)


def empty(shape: int | tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """np.empty(shape, dtype), from the installed pool when there is one and it is large."""
    dt = np.dtype(dtype)
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    n = prod(dims)
    alloc = _alloc.get()
    if alloc is None or n * dt.itemsize < MIN_BYTES:
        return np.empty(dims, dt)
    return alloc(n, dt).reshape(dims)


@contextmanager
def using(alloc: Alloc | None) -> Iterator[None]:
    """Temporaries inside the block (in this thread) come from `alloc`."""
    token = _alloc.set(alloc)
    try:
        yield
    finally:
        _alloc.reset(token)

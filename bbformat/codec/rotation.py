"""Rotation sites: canonical direction, the rotation codec (Alg. 3/4) and recovery (Alg. 2).

All linear algebra is float64. eigh returns ascending eigenvalues and
orthonormal eigenvectors as columns.

Instrumentation: `linalg_clock(record)` reports the seconds spent in gram, eigh, eigh_upper,
rotate_axis and regenerate (tools/bench's "pack linalg s"); see its docstring.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from functools import lru_cache
from time import perf_counter

import numpy as np
from threadpoolctl import ThreadpoolController

from . import host_native


def axis_matrix(x: np.ndarray, axis: int) -> np.ndarray:
    """M = moveaxis(x, axis, -1).reshape(-1, D): rows are the vectors the site rotates."""
    return np.moveaxis(x, axis, -1).reshape(-1, x.shape[axis])


def from_axis_matrix(m: np.ndarray, shape: tuple[int, ...], axis: int) -> np.ndarray:
    moved = list(shape)
    d = moved.pop(axis)
    moved.append(d)
    return np.moveaxis(m.reshape(moved), -1, axis)


# The record function of the active linalg_clock, or None (the default).
_clock: Callable[[str, float], None] | None = None


@contextmanager
def linalg_clock(record: Callable[[str, float], None]) -> Iterator[None]:
    """Instrumentation for measurement tools (tools/bench): while active, each call of gram,
    eigh, eigh_upper, rotate_axis and regenerate ends with record(name, seconds), in the thread
    that made the call (so record must be thread-safe). One clock per process at a time.

    Off, each of those functions tests one module global. The clock sees no array and returns
    nothing to the codec: it cannot change a result."""
    global _clock
    if _clock is not None:
        raise RuntimeError("a linalg_clock is already active")
    _clock = record
    try:
        yield
    finally:
        _clock = None


def clock_active() -> bool:
    """Whether a linalg_clock is on (backends other than numpy time their own calls)."""
    return _clock is not None


def record(name: str, t0: float) -> None:
    """Report a call that began at perf_counter() == t0 to the active linalg_clock, if any."""
    _record(name, t0)


def _record(name: str, t0: float) -> None:
    clock = _clock
    if clock is not None:
        clock(name, perf_counter() - t0)


def rotate_axis(x: np.ndarray, axis: int, r: np.ndarray) -> np.ndarray:
    t0 = perf_counter() if _clock is not None else None
    out = from_axis_matrix(axis_matrix(x, axis) @ r, x.shape, axis)
    if t0 is not None:
        _record("rotate_axis", t0)
    return out


def gram(m: np.ndarray) -> np.ndarray:
    t0 = perf_counter() if _clock is not None else None
    g: np.ndarray = m.T @ m
    if t0 is not None:
        _record("gram", t0)
    return g


Eigensolver = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


def eigh(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The reference eigensolver (SPEC.md 7.5): numpy.linalg.eigh, LAPACK dsyevd on the lower triangle."""
    t0 = perf_counter() if _clock is not None else None
    w, v = np.linalg.eigh(a)
    if t0 is not None:
        _record("eigh", t0)
    return w, v


def eigh_upper(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The same driver on the upper triangle: a different reduction (from the last column),
    so different rounding. The encoder's second opinion for its band (codec/band.py)."""
    t0 = perf_counter() if _clock is not None else None
    w, v = np.linalg.eigh(a, UPLO="U")
    if t0 is not None:
        _record("eigh_upper", t0)
    return w, v


def block_to_matrix(values: np.ndarray, d: int) -> np.ndarray:
    """Popped block (diagonal first, then the strict upper triangle row-major) -> symmetric X.
    Row by row: no index arrays (for D = 4096 they would take 134 MB); compiled where
    host_native is active (the row-major copy, then the mirror in tiles: the same bits)."""
    if host_native.active() and values.size == block_size(d):
        return host_native.symmetric(values, d)
    x = np.zeros((d, d), dtype=np.float64)
    x[np.diag_indices(d)] = values[:d]
    off = d
    for i in range(d - 1):
        n = d - 1 - i
        x[i, i + 1 :] = values[off : off + n]
        x[i + 1 :, i] = values[off : off + n]
        off += n
    return x


def matrix_to_block(x: np.ndarray) -> np.ndarray:
    """Symmetric X -> its block: the diagonal, then the strict upper triangle row by row
    (compiled where host_native is active: one copy, no list of row views)."""
    if host_native.active() and x.ndim == 2 and x.shape[0] == x.shape[1] and x.dtype == np.float64:
        return host_native.upper(x)
    d = x.shape[0]
    return np.concatenate([np.diag(x)] + [x[i, i + 1 :] for i in range(d - 1)])


def block_size(d: int) -> int:
    return d * (d + 1) // 2


def regenerate(e: np.ndarray, mu: np.ndarray, paper: bool) -> np.ndarray:
    """X~ from the anchor's eigenvectors E and the popped eigenvalues mu.

    symmetric: X~ = E diag(mu) E^T      (insensitive to eigenvector signs)
    paper:     X~ = E^T diag(mu) E      (Q~ = E^T, X = Q diag(mu) Q^T)
    """
    t0 = perf_counter() if _clock is not None else None
    x: np.ndarray = (e.T * mu) @ e if paper else (e * mu) @ e.T
    if t0 is not None:
        _record("regenerate", t0)
    return x


def paper_signs(v: np.ndarray) -> np.ndarray:
    """Side information of Alg. 5: sign of each row sum of Q (= V); True means negative."""
    negative: np.ndarray = v.sum(axis=1) < 0
    return negative


@lru_cache(maxsize=1)
def _controller() -> ThreadpoolController:
    return ThreadpoolController()


def one_blas_thread() -> AbstractContextManager[object]:
    """Encoder and decoder run their linear algebra on one BLAS thread: the eigenvectors of a
    nearly degenerate matrix depend on how LAPACK splits its work, so the bytes and the
    decoder's approximations would otherwise depend on the machine's thread settings."""
    limit: AbstractContextManager[object] = _controller().limit(limits=1, user_api="blas")
    return limit


def blas_threads(n: int) -> AbstractContextManager[object]:
    """BLAS on n threads while the context is active (NumpyLinalg's blas_threads)."""
    limit: AbstractContextManager[object] = _controller().limit(limits=n, user_api="blas")
    return limit

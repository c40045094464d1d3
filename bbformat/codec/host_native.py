"""The host's per-value work, compiled (bbformat/codec/_host_native.c), behind numpy-shaped
functions: widening bit patterns, rounding float64 to a dtype (SPEC.md 7.4), boundary
distances (the band, margins) and the x_residuals correction (SPEC.md 8.4). The GIL is
released inside each call, so decoding threads run them side by side.

Each function here is the counterpart of a numpy function that stays the reference
(dtypes.bits_to_f64 and f64_to_bits, band.boundary_distance, in_band and min_distance,
section_kinds' residual decoding and the residual groups' raw size, rotation's block and
matrix conversions); those call in here when `active()` and compute in numpy
otherwise. tests/test_host_native.py proves both give the same bits and the same errors.

`compiled` is None where the extension was not built (no C compiler at install), was built
from another version of the C file, or the host is big-endian. `reference_only()` turns the
compiled path off for a while (tests, benchmarks); it is process-wide.

`spread(run, threads)` cuts the element-wise steps (widening, rounding, distances, the band
test, the finiteness test) of large arrays into `threads` contiguous slices run side by side
by `run` (a reader's or writer's part threads), in the calling thread only. Each value is
computed by the same code whichever slice it falls in, so the bits do not depend on it.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import partial
from types import ModuleType

import numpy as np

from ..constants import EXPONENT_FIELD
from . import scratch
from .native import load
from .runner import Runner

ABI = 7  # the compiled module's functions and argument lists that this file passes

compiled = load("_host_native", ABI)

DTYPE_CODES = {"float16": 0, "bfloat16": 1, "float32": 2}
_UINT = {"float16": np.uint16, "bfloat16": np.uint16, "float32": np.uint32}
_off = 0  # reference_only() depth
MAP_WIDEN, MAP_ROUND, MAP_DISTANCE, MAP_IN_BAND = range(4)  # _host_native.map's kinds


SPLIT_VALUES = 1 << 21  # arrays of fewer values run in one call: a thread's start costs more than the slice
_spread: ContextVar[tuple[Runner, int] | None] = ContextVar("bbformat_host_spread", default=None)


@contextmanager
def spread(run: Runner, threads: int) -> Iterator[None]:
    """Inside the block (in this thread), large element-wise steps run as `threads` slices through `run`."""
    token = _spread.set((run, threads) if threads > 1 else None)
    try:
        yield
    finally:
        _spread.reset(token)


def _slices(n: int) -> tuple[Runner, list[tuple[int, int]]] | None:
    """The installed runner and [start, end) slices of n values, or None to run in one call."""
    got = _spread.get()
    if got is None or n < SPLIT_VALUES:
        return None
    run, threads = got
    k = min(threads, n // (SPLIT_VALUES // 2))
    cuts = [n * i // k for i in range(k + 1)]
    return run, list(zip(cuts[:-1], cuts[1:]))


def _map(kind: int, src: np.ndarray, code: int, out: np.ndarray, *delta: float) -> None:
    """_host_native.map over C-contiguous src and out (of src's size), in slices where spread."""
    plan = _slices(src.size)
    if plan is None or not (src.flags.c_contiguous and out.flags.c_contiguous):
        _lib().map(kind, src, code, out, *delta)
        return
    run, parts = plan
    a, b, lib = src.reshape(-1), out.reshape(-1), _lib()
    run([partial(lib.map, kind, a[i:j], code, b[i:j], *delta) for i, j in parts])


def active() -> bool:
    """Whether the compiled path runs (built, current, and not turned off)."""
    return compiled is not None and not _off


@contextmanager
def reference_only() -> Iterator[None]:
    """Compute in numpy (the reference) inside the block, in every thread."""
    global _off
    _off += 1
    try:
        yield
    finally:
        _off -= 1


def _lib() -> ModuleType:
    assert compiled is not None, "host_native used while inactive"
    return compiled


def _f64(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float64)


def widen(bits: np.ndarray, dtype: str) -> np.ndarray:
    """dtypes.bits_to_f64: the exact float64 values of bit patterns, in bits' shape."""
    src = np.ascontiguousarray(bits, dtype=_UINT[dtype])  # 0-d becomes 1-d: the shape is given back below
    out = scratch.empty(src.shape, np.float64)
    _map(MAP_WIDEN, src, DTYPE_CODES[dtype], out)
    return out.reshape(np.shape(bits))


def round_to(x: np.ndarray, dtype: str, out: np.ndarray | None = None, keep_order: bool = False) -> np.ndarray:
    """dtypes.f64_to_bits: float64 rounded to dtype (SPEC.md 7.4), as bit patterns in x's shape;
    written into `out` where given (a C-contiguous array of x's size and the dtype's width).
    keep_order: an F-ordered x (an axis-0 rotation's result) is rounded in its own order, not
    copied to C order first, and the bits come back F-ordered."""
    if keep_order and out is None and isinstance(x, np.ndarray) and x.ndim > 1 and x.dtype == np.float64 \
            and x.flags.f_contiguous and not x.flags.c_contiguous:
        return round_to(x.T, dtype).T
    src = _f64(x)
    if out is None:
        out = np.empty(src.shape, _UINT[dtype])
    elif out.dtype != _UINT[dtype] or out.size != src.size or not out.flags.c_contiguous:
        raise ValueError(f"round_to: out must be a C-contiguous {np.dtype(_UINT[dtype])} array of {src.size} values")
    _map(MAP_ROUND, src, DTYPE_CODES[dtype], out)
    return out.reshape(np.shape(x))


def boundary_distance(x: np.ndarray, dtype: str) -> np.ndarray:
    src = _f64(x)
    out = np.empty(src.shape, np.float64)
    _map(MAP_DISTANCE, src, DTYPE_CODES[dtype], out)
    return out.reshape(np.shape(x))


def in_band(x: np.ndarray, dtype: str, delta: float) -> np.ndarray:
    src = _f64(x)
    out = np.empty(src.shape, np.bool_)
    _map(MAP_IN_BAND, src, DTYPE_CODES[dtype], out.view(np.uint8), float(delta))
    return out.reshape(np.shape(x))


def min_distance(x: np.ndarray, dtype: str, skip: np.ndarray | None = None) -> float:
    """band.min_distance: skip holds flat positions that do not count."""
    src = _f64(x).reshape(-1)
    mask = np.zeros(0, np.uint8)
    if skip is not None:
        mask = np.zeros(src.size, np.uint8)
        mask[skip] = 1
    return float(_lib().min_distance(src, DTYPE_CODES[dtype], mask))


def upper(x: np.ndarray) -> np.ndarray:
    """rotation.matrix_to_block: a square matrix's diagonal, then its strict upper triangle row by row."""
    src = _f64(x)
    d = src.shape[0]
    out = scratch.empty(d * (d + 1) // 2, np.float64)
    _lib().upper(src, d, out)
    return out


def symmetric(values: np.ndarray, d: int) -> np.ndarray:
    """rotation.block_to_matrix: the symmetric d x d matrix of a block (the diagonal, then the
    strict upper triangle row by row)."""
    src = _f64(values).reshape(-1)
    out = scratch.empty((d, d), np.float64)
    _lib().symmetric(src, d, out)
    return out


def all_finite(x: np.ndarray) -> bool:
    """Whether every value of a float64 array is finite (np.isfinite(x).all())."""
    src = _f64(x)
    plan = _slices(src.size)
    if plan is None:
        return bool(_lib().all_finite(src))
    run, parts = plan
    flat, lib = src.reshape(-1), _lib()
    return all(bool(ok) for ok in run([partial(lib.all_finite, flat[i:j]) for i, j in parts]))


def nonfinite(bits: np.ndarray, dtype: str) -> tuple[int, int]:
    """(NaN count, infinity count) of bit patterns of dtype."""
    src = np.ascontiguousarray(bits, dtype=_UINT[dtype])
    nan, inf = _lib().nonfinite(src, DTYPE_CODES[dtype])
    return int(nan), int(inf)


def _keep_bytes(keep: np.ndarray | None) -> np.ndarray:
    if keep is None:
        return np.zeros(0, np.uint8)
    return np.ascontiguousarray(keep, dtype=np.bool_).reshape(-1).view(np.uint8)


def context_counts(approx: np.ndarray, dtype: str, keep: np.ndarray | None = None) -> np.ndarray:
    """The number of residual positions of every context (SPEC.md 8.4), indexed by context."""
    shift, nbits = EXPONENT_FIELD[dtype]
    a = np.ascontiguousarray(approx, dtype=_UINT[dtype]).reshape(-1)
    counts = np.zeros(1 << nbits, np.int64)
    _lib().context_counts(a, a.itemsize * 8, shift, nbits, _keep_bytes(keep), counts)
    return counts


def ordinal_deltas(true: np.ndarray, approx: np.ndarray, mask: np.ndarray, dtype: str) -> np.ndarray:
    """bits_to_ordinal(true) - bits_to_ordinal(approx) where mask, else 0 (int64, flat)."""
    t = np.ascontiguousarray(true, dtype=_UINT[dtype]).reshape(-1)
    a = np.ascontiguousarray(approx, dtype=_UINT[dtype]).reshape(-1)
    m = np.ascontiguousarray(mask, dtype=np.bool_).reshape(-1).view(np.uint8)
    out = np.empty(a.size, np.int64)
    _lib().ordinal_deltas(t, a, m, a.itemsize * 8, out)
    return out


def residual_sizes(approx: np.ndarray, value: np.ndarray, dtype: str, keep: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(positions, varint bytes of zigzag(value)) of every context's residual positions (SPEC.md
    8.4), each indexed by context: the sums ResidualsSection.raw_size makes of the groups."""
    shift, nbits = EXPONENT_FIELD[dtype]
    a = np.ascontiguousarray(approx, dtype=_UINT[dtype]).reshape(-1)
    v = np.ascontiguousarray(value, dtype=np.int64).reshape(-1)
    counts, sizes = np.zeros(1 << nbits, np.int64), np.zeros(1 << nbits, np.int64)
    _lib().residual_sizes(a, v, _keep_bytes(keep), a.itemsize * 8, shift, nbits, counts, sizes)
    return counts, sizes


def varints_ok(raw: bytes | bytearray | memoryview, count: int) -> bool:
    """Whether raw is exactly `count` varints as varint.decode_varints accepts them."""
    return int(_lib().check_varints(raw, count)) == 0


def apply_residuals(approx: np.ndarray, base: np.ndarray, keep: np.ndarray | None, dtype: str,
                    groups: list[bytes | bytearray | memoryview]) -> np.ndarray | None:
    """The corrected block (SPEC.md 8.4): base where keep is False, else approx moved by its
    residual, read in position order from its context's group (groups: one per context,
    indexed by context, each already checked by varints_ok). None if a corrected ordinal
    is out of range."""
    shift, nbits = EXPONENT_FIELD[dtype]
    a = np.ascontiguousarray(approx, dtype=_UINT[dtype]).reshape(-1)
    b = np.ascontiguousarray(base, dtype=_UINT[dtype]).reshape(-1)
    out = scratch.empty(a.size, a.dtype)
    err = int(_lib().apply_residuals(a, b, _keep_bytes(keep), a.itemsize * 8, shift, nbits, tuple(groups), out))
    if err == 4:  # RES_RANGE
        return None
    if err:
        raise AssertionError(f"apply_residuals: groups not checked (code {err})")
    return out

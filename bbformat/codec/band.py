"""The encoder's band (SPEC.md 12.6, informative): which regenerated values another correct
reader could round differently, so that they are stored explicitly.

A reader's float64 result differs from the reference's by the eigensolver's and the
summation order's rounding. A value rounds the same on both unless a rounding boundary of its
dtype lies between them, so every value whose reference result lies within delta of a
boundary is patched, and any reader whose results stay within delta decodes bit-exactly.

delta per site = max(BAND_FACTOR x what a second eigensolver (another reduction of the same
matrix) disagrees by, a rigorous bound on the summation error of the final product).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from . import host_native
from .dtypes import bits_to_f64, f64_to_bits
from ..container.program import bits_of

if TYPE_CHECKING:
    from .linalg import Array, Linalg

BAND_FACTOR = 100.0  # safety factor over the observed disagreement of two eigensolvers
EPS = float(np.finfo(np.float64).eps)


def boundary_distance(x: np.ndarray, dtype: str) -> np.ndarray:
    """Distance of each float64 value to the nearest rounding boundary of `dtype` (the
    midpoints between neighbouring values, 0 between -0 and +0, and the overflow threshold);
    0 for values that are not finite or round to an infinity. The neighbours of a value are
    the next patterns in value order (the ordinal order of dtypes.bits_to_ordinal): from +0
    down is -0, from -0 up is +0, from the largest finite value up is the infinity.
    Compiled where host_native is active; the numpy below is the reference."""
    if host_native.active():
        return host_native.boundary_distance(x, dtype)
    x = np.asarray(x, dtype=np.float64)
    w = bits_of(dtype)
    b = f64_to_bits(x, dtype).astype(np.int64)
    sign = 1 << (w - 1)
    mag = b & (sign - 1)
    neg = b >= sign
    edge = mag == sign - 1  # the last NaN pattern of each sign: no neighbour outward (and v is NaN: distance 0)
    up = np.where(neg, np.where(mag == 0, 0, b - 1), np.where(edge, b, b + 1))
    down = np.where(neg, np.where(edge, b, b + 1), np.where(mag == 0, sign, b - 1))
    udt = np.dtype(f"uint{w}")
    with np.errstate(invalid="ignore", over="ignore"):
        v = bits_to_f64(b.astype(udt), dtype)
        lo = bits_to_f64(down.astype(udt), dtype)
        hi = bits_to_f64(up.astype(udt), dtype)
        mid_lo = np.where(np.isinf(lo), v - (hi - v) / 2, (v + lo) / 2)
        mid_hi = np.where(np.isinf(hi), v + (v - lo) / 2, (v + hi) / 2)
        d = np.minimum(x - mid_lo, mid_hi - x)
    return np.where(np.isfinite(x) & np.isfinite(v) & np.isfinite(d), np.abs(d), 0.0)


BLOCK = 1 << 16  # values per step of in_band and min_distance: their temporaries stay in the cache (about 2x faster than 2^20)


def in_band(x: np.ndarray, dtype: str, delta: float) -> np.ndarray:
    """True where another reader's result within `delta` of x could round differently (x's
    shape; computed in blocks, so a large anchor costs one bool per value, not ten float64s)."""
    if host_native.active():
        return host_native.in_band(x, dtype, delta)
    flat = np.asarray(x, dtype=np.float64).reshape(-1)
    out = np.empty(flat.size, dtype=bool)
    for i in range(0, flat.size, BLOCK):
        out[i : i + BLOCK] = boundary_distance(flat[i : i + BLOCK], dtype) <= delta
    return out.reshape(np.shape(x))


def min_distance(x: np.ndarray, dtype: str, skip: np.ndarray | None = None) -> float:
    """The smallest boundary_distance of the values of x (flat) at positions not in `skip`
    (flat indexes: the values stored explicitly); inf when none is left. In blocks, as in_band."""
    if host_native.active():
        return host_native.min_distance(x, dtype, skip)
    flat = np.asarray(x, dtype=np.float64).reshape(-1)
    keep = np.ones(flat.size, dtype=bool)
    if skip is not None:
        keep[skip] = False
    out = np.inf
    for i in range(0, flat.size, BLOCK):
        part = flat[i : i + BLOCK][keep[i : i + BLOCK]]
        if part.size:
            out = min(out, float(boundary_distance(part, dtype).min()))
    return out


def width(observed: float, floor: float) -> float:
    """A site's band: the safety factor over the observed disagreement, at least the floor."""
    return max(BAND_FACTOR * observed, floor)


def product_floor(d: int, scale: float) -> float:
    """Twice the rounding bound of a length-d float64 dot product whose terms' absolute values
    sum to at most `scale` (two readers, each off by at most d * eps * scale)."""
    return 2.0 * d * EPS * scale


def max_abs_product(la: "Linalg", m: "Array", diff: "Array", row_block: int = 1 << 14) -> float:
    """max |m @ diff| on backend `la`, in row blocks: no R x D temporary (the encoder's
    disagreement on a paper anchor, m @ e - m @ e2 taken as m @ (e - e2))."""
    out = 0.0
    for i in range(0, m.shape[0], row_block):
        out = max(out, la.max_abs(la.matmul(m[i : i + row_block], diff)))
    return out

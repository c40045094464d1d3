"""Rounding a rotated tensor to its dtype with error feedback (encoder only).

Storing a rotated model means rounding every rotated weight once more. Nearest rounding
minimises each element's error; when the second moment H = E[x xᵀ] of the inputs along
one axis is known (from calibration text), rounding the elements one input coordinate at
a time and feeding each coordinate's error forward into the coordinates not yet rounded
(OPTQ/GPTQ, with the dtype's own grid) minimises the error of the tensor's *function*,
tr(Δᵀ H Δ), instead. Decoders are unaffected: the result is just the stored tensor.
"""
from __future__ import annotations

import numpy as np

from .dtypes import bits_to_f64, f64_to_bits

DAMPING = 0.01  # of the mean diagonal of H, added to H before inverting
BLOCK = 128  # coordinates per lazily-applied block update


def quantize_moment(h: np.ndarray, bits: int = 10) -> np.ndarray:
    """H rounded to `bits` significant bits: rounding decisions then do not depend on the
    last bits of the calibration arithmetic (thread counts, BLAS builds)."""
    m, e = np.frexp(np.asarray(h, dtype=np.float64))
    return np.ldexp(np.round(m * (1 << bits)) / (1 << bits), e)


def round_feedback(x: np.ndarray, axis: int, h: np.ndarray, dtype: str) -> np.ndarray:
    """Bit patterns of `x` (float64) rounded to `dtype` with error feedback along `axis`,
    whose inputs have second moment `h` (D×D). Falls back to nearest rounding when H
    is unusable or feedback would produce a non-finite value."""
    nearest = f64_to_bits(x, dtype)
    d = x.shape[axis]
    if h.shape != (d, d) or d < 2 or not np.all(np.isfinite(h)) or not np.all(np.isfinite(x)):
        return nearest
    mean_diag = float(np.mean(np.diag(h)))
    if not mean_diag > 0:
        return nearest
    hd = h + DAMPING * mean_diag * np.eye(d)
    try:
        hinv = np.linalg.inv(np.linalg.cholesky(hd))
        hinv = hinv.T @ hinv  # (L Lᵀ)⁻¹
        u = np.linalg.cholesky(hinv).T  # upper, hinv = Uᵀ U
    except np.linalg.LinAlgError:
        return nearest
    m = np.moveaxis(x, axis, 0).reshape(d, -1).astype(np.float64, copy=True)
    out = np.empty(m.shape, dtype=nearest.dtype)
    for b0 in range(0, d, BLOCK):
        b1 = min(b0 + BLOCK, d)
        errs = np.empty((b1 - b0, m.shape[1]))
        for i in range(b0, b1):
            q = f64_to_bits(m[i], dtype)
            out[i] = q
            err = (m[i] - bits_to_f64(q, dtype)) / u[i, i]
            errs[i - b0] = err
            if i + 1 < b1:
                m[i + 1 : b1] -= np.outer(u[i, i + 1 : b1], err)
        if b1 < d:
            m[b1:] -= u[b0:b1, b1:].T @ errs
    values = bits_to_f64(out, dtype)
    if not np.all(np.isfinite(values)):
        return nearest
    shape = (d,) + tuple(s for k, s in enumerate(x.shape) if k != axis)
    return np.moveaxis(out.reshape(shape), 0, axis).copy()


def function_error(x: np.ndarray, bits: np.ndarray, axis: int, h: np.ndarray, dtype: str) -> float:
    """tr(Δᵀ H Δ) of a rounding: the mean squared output error for inputs with moment H."""
    d = x.shape[axis]
    delta = np.moveaxis(bits_to_f64(bits, dtype) - x, axis, 0).reshape(d, -1)
    return float(np.einsum("ij,ik,kj->", delta, h, delta))

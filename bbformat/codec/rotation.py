"""Rotation sites: canonical direction, the rotation codec (Alg. 3/4) and recovery (Alg. 2).

All linear algebra is float64. eigh returns ascending eigenvalues and
orthonormal eigenvectors as columns.
"""
from __future__ import annotations

from contextlib import AbstractContextManager
from functools import lru_cache

import numpy as np
from threadpoolctl import ThreadpoolController


def axis_matrix(x: np.ndarray, axis: int) -> np.ndarray:
    """M = moveaxis(x, axis, -1).reshape(-1, D): rows are the vectors the site rotates."""
    return np.moveaxis(x, axis, -1).reshape(-1, x.shape[axis])


def from_axis_matrix(m: np.ndarray, shape: tuple[int, ...], axis: int) -> np.ndarray:
    moved = list(shape)
    d = moved.pop(axis)
    moved.append(d)
    return np.moveaxis(m.reshape(moved), -1, axis)


def rotate_axis(x: np.ndarray, axis: int, r: np.ndarray) -> np.ndarray:
    return from_axis_matrix(axis_matrix(x, axis) @ r, x.shape, axis)


def gram(m: np.ndarray) -> np.ndarray:
    return m.T @ m


def eigh(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    w, v = np.linalg.eigh(a)
    return w, v


def block_to_matrix(values: np.ndarray, d: int) -> np.ndarray:
    """Popped block (diagonal first, then the strict upper triangle row-major) -> symmetric X.
    Row by row: no index arrays (for D = 4096 they would take 134 MB)."""
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
    d = x.shape[0]
    return np.concatenate([np.diag(x)] + [x[i, i + 1 :] for i in range(d - 1)])


def block_size(d: int) -> int:
    return d * (d + 1) // 2


def regenerate(e: np.ndarray, mu: np.ndarray, paper: bool) -> np.ndarray:
    """X~ from the anchor's eigenvectors E and the popped eigenvalues mu.

    symmetric: X~ = E diag(mu) E^T      (insensitive to eigenvector signs)
    paper:     X~ = E^T diag(mu) E      (Q~ = E^T, X = Q diag(mu) Q^T)
    """
    if paper:
        return (e.T * mu) @ e
    return (e * mu) @ e.T


def paper_signs(v: np.ndarray) -> np.ndarray:
    """Side information of Alg. 5: sign of each row sum of Q (= V); True means negative."""
    return v.sum(axis=1) < 0


def apply_paper_signs(e: np.ndarray, negative: np.ndarray) -> np.ndarray:
    """Alg. 2: flip each recovered eigenvector (column of E = row of Q) to the stored sign."""
    flip = (e.sum(axis=0) < 0) != negative
    return e * np.where(flip, -1.0, 1.0)


@lru_cache(maxsize=1)
def _controller() -> ThreadpoolController:
    return ThreadpoolController()


def one_blas_thread() -> AbstractContextManager[object]:
    """Encoder and decoder run their linear algebra on one BLAS thread: the eigenvectors of a
    nearly degenerate matrix depend on how LAPACK splits its work, so the bytes and the
    decoder's approximations would otherwise depend on the machine's thread settings."""
    return _controller().limit(limits=1, user_api="blas")

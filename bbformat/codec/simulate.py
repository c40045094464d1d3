"""The encoder's side of correction: which regenerated values the decoder must be given,
found by running the real decoder (codec/decoder.py) with a corrector that knows the truth."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import band
from .dtypes import RawTensor, bits_to_f64
from .linalg import REFERENCE, Array, Linalg, apply_paper_signs, solve


def needs_fix(approx: np.ndarray, true: np.ndarray, dtype: str, tolerance: float) -> np.ndarray:
    """Which regenerated values the encoder must correct."""
    if tolerance <= 0:
        differs: np.ndarray = approx != true
        return differs
    a = bits_to_f64(approx, dtype)
    t = bits_to_f64(true, dtype)
    with np.errstate(invalid="ignore"):
        far = ~(np.abs(a - t) <= tolerance)
    fix: np.ndarray = far & (approx != true)
    return fix


@dataclass
class SiteFix:
    """What the encoder found the decoder needs for one site. x_mask / anchor_mask: every value
    stored explicitly or corrected; x_band: the values in the band (SPEC.md 12.6), a subset of
    x_mask that must be patched, never given a residual."""

    signs: np.ndarray | None = None
    x_mask: np.ndarray | None = None
    x_true: np.ndarray | None = None
    x_approx: np.ndarray | None = None
    x_band: np.ndarray | None = None
    anchor_mask: np.ndarray | None = None
    anchor_true: np.ndarray | None = None
    banded: int = 0  # values in the band (stored explicitly whether or not they also needed a correction)
    widths: tuple[float, ...] | None = None  # with bands: the band widths the writer stores (SPEC.md 8.8)


@dataclass
class SimulatingCorrector:
    """The encoder's stand-in for stored side information: it knows the truth. With band=True
    it also stores every value another correct reader could round differently (codec/band.py),
    and names in `unsafe` the PAPER sites whose sign decisions another reader could flip; with
    bands=True too, each site's fix records the band widths it used (a 1.4 band section)."""

    dtype: str
    tolerance: float
    true_x: dict[int, np.ndarray]
    true_signs: dict[int, np.ndarray]
    true_anchor: dict[int, RawTensor]
    band: bool = False
    bands: bool = False
    la: Linalg = REFERENCE  # the backend the simulated decoder runs on (its second eigensolver too)
    fixes: dict[int, SiteFix] = field(default_factory=dict)
    unsafe: dict[int, str] = field(default_factory=dict)
    # per site, from the second eigensolver: (its regenerated block, that block's summation floor);
    # and, in paper mode, the band of the un-rotated anchor. Each is dropped when used.
    _alt_x: dict[int, tuple[np.ndarray, float]] = field(default_factory=dict)
    _anchor_delta: dict[int, float] = field(default_factory=dict)
    _sums_delta: dict[int, float] = field(default_factory=dict)

    def _fix(self, site: int) -> SiteFix:
        return self.fixes.setdefault(site, SiteFix())

    def signs(self, site: int) -> np.ndarray:
        self._fix(site).signs = self.true_signs[site]
        return self.true_signs[site]

    def note_basis(self, site: int, g: Array, e: Array, mu: np.ndarray, m: Array | None) -> None:
        """A second eigensolver on the same Gram matrix: how far another reader may land."""
        if not self.band:
            return
        la = self.la
        d = g.shape[0]
        e2 = solve(la, g, second=True)
        if e2 is None or not la.all_finite(e):
            self.unsafe[site] = "no second eigendecomposition to bound the band"
            return
        paper = m is not None
        if paper:
            e2 = apply_paper_signs(la, e2, self.true_signs[site])
            sums, sums2 = la.column_sums(e), la.column_sums(e2)
            delta = band.width(float(np.max(np.abs(sums - sums2))), band.product_floor(d, float(np.sqrt(d))))
            if float(np.min(np.abs(sums))) <= delta:
                self.unsafe[site] = "a sign decision lies within the band of 0"
            self._sums_delta[site] = delta
        self._alt_x[site] = (la.block(la.regenerate(e2, la.asarray(mu), paper)), band.product_floor(d, float(np.max(np.abs(mu)))))
        if m is not None:
            row_norm = la.max_row_norm(m)
            observed = band.max_abs_product(la, m, e - e2)
            self._anchor_delta[site] = band.width(observed, band.product_floor(d, row_norm))

    def correct_x(self, site: int, approx: np.ndarray, regenerated: np.ndarray | None = None) -> np.ndarray:
        true = self.true_x[site]
        mask = needs_fix(approx, true, self.dtype, self.tolerance)
        f = self._fix(site)
        alt = self._alt_x.pop(site, None)
        if alt is not None and regenerated is not None:
            x2, floor = alt
            delta = band.width(float(np.max(np.abs(regenerated - x2), initial=0.0)), floor)
            f.x_band = band.in_band(regenerated, self.dtype, delta)
            f.banded += int(np.count_nonzero(f.x_band))
            mask = mask | f.x_band
            if self.bands:
                f.widths = (delta,)
        f.x_mask, f.x_true, f.x_approx = mask, true, approx
        return np.where(mask, true, approx).astype(approx.dtype)

    def correct_anchor(self, site: int, approx: RawTensor, unrotated: np.ndarray | None = None) -> RawTensor:
        true = self.true_anchor[site]
        mask = needs_fix(approx.bits, true.bits, approx.dtype, self.tolerance)
        f = self._fix(site)
        delta = self._anchor_delta.pop(site, None)
        sums = self._sums_delta.pop(site, None)
        if delta is not None and unrotated is not None:
            near = band.in_band(unrotated, approx.dtype, delta)
            f.banded += int(np.count_nonzero(near))
            mask = mask | near
        f.widths = f.widths + (delta, sums) if f.widths is not None and delta is not None and sums is not None else None
        f.anchor_mask, f.anchor_true = mask, true.bits
        return RawTensor(approx.dtype, np.where(mask, true.bits, approx.bits).astype(approx.bits.dtype))

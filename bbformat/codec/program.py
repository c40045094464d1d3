"""Block programs: the self-describing recipe of one chunk, run forwards (encode)
and backwards (decode).

A program lists the chunk's tensors, its rotation sites and its ops. Encoding runs
the ops in order on a symbol stack: PUSH t pushes tensor t's symbols; SITE s pops
the D(D+1)/2-symbol block X, pushes X's eigenvalues mu as 2D symbols, and fixes the
rotation applied to the tensors pushed after it. Decoding runs the ops backwards.
The final stack is the chunk's payload.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..errors import FormatError
from . import band
from . import rotation as rot
from .dtypes import (
    RawTensor,
    bits_of,
    bits_to_f64,
    f64_to_bits,
    symbols_to_tensor,
    uint_dtype,
    wide_dtype,
)
from .stack import SymbolStack

OP_PUSH = 1
OP_SITE = 2

SITE_PLAIN = 0x1  # no pop, no push, no rotation recovery
SITE_PAPER = 0x2  # paper mode: sign bits, X~ = E^T diag(mu) E, anchor un-rotated
SITE_FLAGS_KNOWN = SITE_PLAIN | SITE_PAPER


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)  # exact (no int64 overflow); 1 for a scalar

    def symbols(self, symbol_bits: int) -> int:
        return self.numel * (bits_of(self.dtype) // symbol_bits)


@dataclass(frozen=True)
class FollowerEntry:
    tensor: str
    axis: int


@dataclass(frozen=True)
class SiteEntry:
    name: str
    dim: int
    anchor: int  # index into the program's tensors
    anchor_axis: int
    flags: int
    followers: tuple[FollowerEntry, ...] = ()

    @property
    def plain(self) -> bool:
        return bool(self.flags & SITE_PLAIN)

    @property
    def paper(self) -> bool:
        return bool(self.flags & SITE_PAPER)

    @property
    def n_pop(self) -> int:
        return rot.block_size(self.dim)

    @property
    def n_mu(self) -> int:
        return 2 * self.dim


@dataclass(frozen=True)
class Op:
    kind: int
    index: int


@dataclass
class BlockProgram:
    name: str
    symbol_dtype: str
    tensors: list[TensorEntry]
    sites: list[SiteEntry]
    ops: list[Op]

    @property
    def symbol_bits(self) -> int:
        return bits_of(self.symbol_dtype)

    def payload_symbols(self) -> int:
        """The number of symbols the final stack must hold."""
        w = self.symbol_bits
        n = sum(t.symbols(w) for t in self.tensors)
        for s in self.sites:
            if not s.plain:
                n += s.n_mu - s.n_pop
        return n

    def stack_peak_symbols(self) -> int:
        """The most symbols the decoder's stack holds at once (SPEC.md 11.5)."""
        w = self.symbol_bits
        n = peak = self.payload_symbols()
        for op in reversed(self.ops):
            if op.kind == OP_PUSH:
                n -= self.tensors[op.index].symbols(w)
            elif not self.sites[op.index].plain:
                s = self.sites[op.index]
                n += s.n_pop - s.n_mu
                peak = max(peak, n)
        return peak

    def validate(self) -> None:
        """Structural rules a reader checks before decoding (SPEC.md section 6)."""
        w = self.symbol_bits
        if self.symbol_dtype not in ("float16", "bfloat16", "float32"):
            raise FormatError(f"unknown symbol dtype {self.symbol_dtype}", "E_DTYPE")
        names = set()
        for t in self.tensors:
            if t.name in names:
                raise FormatError(f"duplicate tensor name {t.name!r}", "E_DESCRIPTOR")
            names.add(t.name)
            if bits_of(t.dtype) % w:
                raise FormatError(f"tensor {t.name!r} is narrower than the symbols", "E_DTYPE")
        pushed = [0] * len(self.tensors)
        seen_site = [0] * len(self.sites)
        pos_push: dict[int, int] = {}
        pos_site: dict[int, int] = {}
        for k, op in enumerate(self.ops):
            if op.kind == OP_PUSH:
                if not 0 <= op.index < len(self.tensors):
                    raise FormatError("PUSH names a tensor that does not exist", "E_DESCRIPTOR")
                pushed[op.index] += 1
                pos_push[op.index] = k
            elif op.kind == OP_SITE:
                if not 0 <= op.index < len(self.sites):
                    raise FormatError("SITE names a site that does not exist", "E_DESCRIPTOR")
                seen_site[op.index] += 1
                pos_site[op.index] = k
            else:
                raise FormatError(f"unknown opcode {op.kind}", "E_DESCRIPTOR")
        if any(c != 1 for c in pushed):
            raise FormatError("every tensor must be pushed exactly once", "E_DESCRIPTOR")
        if any(c != 1 for c in seen_site):
            raise FormatError("every site must appear exactly once", "E_DESCRIPTOR")
        for i, s in enumerate(self.sites):
            if s.flags & ~SITE_FLAGS_KNOWN:
                raise FormatError(f"site {s.name!r} has reserved flag bits set", "E_RESERVED")
            if not 0 <= s.anchor < len(self.tensors):
                raise FormatError(f"site {s.name!r} anchor does not exist", "E_SITE")
            a = self.tensors[s.anchor]
            if not 0 <= s.anchor_axis < len(a.shape) or a.shape[s.anchor_axis] != s.dim or s.dim < 2:
                raise FormatError(f"site {s.name!r} does not fit its anchor {a.name!r}", "E_SITE")
            if pos_push[s.anchor] < pos_site[i]:
                raise FormatError(f"site {s.name!r}: anchor pushed before the site", "E_SITE")


class Corrector(Protocol):
    """Supplies what the decoder cannot compute: sign bits and corrections. `regenerated` and
    `unrotated` are the float64 values before rounding (the encoder's band needs them)."""

    def signs(self, site: int) -> np.ndarray: ...

    def correct_x(self, site: int, approx: np.ndarray, regenerated: np.ndarray | None = None) -> np.ndarray: ...

    def correct_anchor(self, site: int, approx: RawTensor, unrotated: np.ndarray | None = None) -> RawTensor: ...


class BasisObserver(Protocol):
    """A corrector that also sees each site's Gram matrix and eigenvectors (the encoder's)."""

    def note_basis(self, site: int, g: np.ndarray, e: np.ndarray, mu: np.ndarray, m: np.ndarray | None) -> None: ...


def _solve(g: np.ndarray, solver: "rot.Eigensolver") -> np.ndarray | None:
    if not np.all(np.isfinite(g)):
        return None
    try:
        return solver(g)[1]
    except np.linalg.LinAlgError:
        return None


def recover_basis(anchor: RawTensor, site: SiteEntry, signs: np.ndarray | None, solver: "rot.Eigensolver | None" = None,
                  keep_gram: bool = False) -> tuple[np.ndarray | None, np.ndarray, np.ndarray | None]:
    """(the anchor's float64 axis matrix in paper mode, else None; the eigenvectors of its Gram
    matrix, ascending, sign-fixed in paper mode; the Gram matrix if keep_gram, else None).
    Outside paper mode the matrix is dropped before the eigensolver runs: for a
    5,120 x 20,480 anchor that is 840 MB. solver: the reader's eigensolver (default: the
    one rotation.decoder_eigh picks)."""
    mat = rot.axis_matrix(anchor.to_f64(), site.anchor_axis)
    g = rot.gram(mat)
    m = mat if site.paper else None
    del mat
    e = _solve(g, solver or rot.decoder_eigh)
    if e is None:
        # SPEC.md 7.5: a non-finite Gram matrix or a failed eigensolver makes every entry of E NaN
        e = np.full((site.dim, site.dim), np.nan)
    if site.paper:
        assert signs is not None
        e = rot.apply_paper_signs(e, signs)
    return m, e, (g if keep_gram else None)


def decode_program(program: BlockProgram, payload: np.ndarray, corrector: Corrector, reference: bool = False) -> dict[str, RawTensor]:
    """Run the program backwards from the final stack; return the decoded tensors.

    reference=True: the reference numerics whatever the environment (numpy's eigh, one BLAS
    thread), as the encoder's simulation needs. Otherwise the reader's: one BLAS thread and
    numpy unless rotation.decoder_eigensolver / the BBFORMAT_* test variables say otherwise.
    Non-finite anchors decode to NaN (SPEC.md 7.5), quietly."""
    threads = rot.one_blas_thread() if reference else rot.decoder_blas_threads()
    solver = rot.eigh if reference else rot.decoder_eigh
    with threads, np.errstate(invalid="ignore", over="ignore"):
        return _decode_program(program, payload, corrector, solver)


def _decode_program(program: BlockProgram, payload: np.ndarray, corrector: Corrector, solver: "rot.Eigensolver") -> dict[str, RawTensor]:
    w = program.symbol_bits
    stack = SymbolStack(w, payload, capacity=program.stack_peak_symbols())
    out: dict[str, RawTensor] = {}
    for op in reversed(program.ops):
        if op.kind == OP_PUSH:
            t = program.tensors[op.index]
            out[t.name] = symbols_to_tensor(stack.pop(t.symbols(w)), t.dtype, t.shape, w)
            continue
        s = program.sites[op.index]
        if s.plain:
            continue
        _undo_site(program, op.index, stack, out, corrector, solver)
    if len(stack):
        raise FormatError(f"{len(stack)} payload symbols left over after decoding", "E_SYMBOL_COUNT")
    return out


def _undo_site(program: BlockProgram, site: int, stack: SymbolStack, out: dict[str, RawTensor], corrector: Corrector,
               solver: "rot.Eigensolver") -> None:
    """One site, backwards: push the regenerated block back (corrected), and in the paper
    scheme un-rotate the anchor. Its float64 temporaries (the anchor's matrix, X~) die here."""
    s = program.sites[site]
    w = program.symbol_bits
    mu = np.frombuffer(stack.pop(s.n_mu).tobytes(), dtype=wide_dtype(w)).astype(np.float64)
    anchor_name = program.tensors[s.anchor].name
    anchor = out[anchor_name]
    signs = corrector.signs(site) if s.paper else None
    observer = corrector if hasattr(corrector, "note_basis") else None
    m, e, g = recover_basis(anchor, s, signs, solver, keep_gram=observer is not None)
    if observer is not None and g is not None:
        observer.note_basis(site, g, e, mu, m)
    del g
    xf = rot.matrix_to_block(rot.regenerate(e, mu, s.paper))
    approx = f64_to_bits(xf, program.symbol_dtype)
    stack.push(corrector.correct_x(site, approx, xf))
    del xf
    if m is not None:  # paper
        cf = rot.from_axis_matrix(m @ e, anchor.shape, s.anchor_axis)
        canon = RawTensor.from_f64(cf, anchor.dtype)
        out[anchor_name] = corrector.correct_anchor(site, canon, cf)


def needs_fix(approx: np.ndarray, true: np.ndarray, dtype: str, tolerance: float) -> np.ndarray:
    """Which regenerated values the encoder must correct."""
    if tolerance <= 0:
        return approx != true
    a = bits_to_f64(approx, dtype)
    t = bits_to_f64(true, dtype)
    with np.errstate(invalid="ignore"):
        far = ~(np.abs(a - t) <= tolerance)
    return far & (approx != true)


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


@dataclass
class SimulatingCorrector:
    """The encoder's stand-in for stored side information: it knows the truth. With band=True
    it also stores every value another correct reader could round differently (codec/band.py),
    and names in `unsafe` the PAPER sites whose sign decisions another reader could flip."""

    dtype: str
    tolerance: float
    true_x: dict[int, np.ndarray]
    true_signs: dict[int, np.ndarray]
    true_anchor: dict[int, RawTensor]
    band: bool = False
    fixes: dict[int, SiteFix] = field(default_factory=dict)
    unsafe: dict[int, str] = field(default_factory=dict)
    # per site, from the second eigensolver: (its regenerated block, that block's summation floor);
    # and, in paper mode, the band of the un-rotated anchor. Each is dropped when used.
    _alt_x: dict[int, tuple[np.ndarray, float]] = field(default_factory=dict)
    _anchor_delta: dict[int, float] = field(default_factory=dict)

    def _fix(self, site: int) -> SiteFix:
        return self.fixes.setdefault(site, SiteFix())

    def signs(self, site: int) -> np.ndarray:
        self._fix(site).signs = self.true_signs[site]
        return self.true_signs[site]

    def note_basis(self, site: int, g: np.ndarray, e: np.ndarray, mu: np.ndarray, m: np.ndarray | None) -> None:
        """A second eigensolver on the same Gram matrix: how far another reader may land."""
        if not self.band:
            return
        d = g.shape[0]
        e2 = _solve(g, rot.eigh_upper)
        if e2 is None or not np.all(np.isfinite(e)):
            self.unsafe[site] = "no second eigendecomposition to bound the band"
            return
        paper = m is not None
        if paper:
            e2 = rot.apply_paper_signs(e2, self.true_signs[site])
            sums, sums2 = e.sum(axis=0), e2.sum(axis=0)
            delta = band.width(float(np.max(np.abs(sums - sums2))), band.product_floor(d, float(np.sqrt(d))))
            if float(np.min(np.abs(sums))) <= delta:
                self.unsafe[site] = "a sign decision lies within the band of 0"
        self._alt_x[site] = (rot.matrix_to_block(rot.regenerate(e2, mu, paper)), band.product_floor(d, float(np.max(np.abs(mu)))))
        if m is not None:
            row_norm = float(np.sqrt(np.max(np.einsum("ij,ij->i", m, m), initial=0.0)))
            self._anchor_delta[site] = band.width(band.max_abs_diff_of_product(m, e, e2), band.product_floor(d, row_norm))

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
        f.x_mask, f.x_true, f.x_approx = mask, true, approx
        return np.where(mask, true, approx).astype(approx.dtype)

    def correct_anchor(self, site: int, approx: RawTensor, unrotated: np.ndarray | None = None) -> RawTensor:
        true = self.true_anchor[site]
        mask = needs_fix(approx.bits, true.bits, approx.dtype, self.tolerance)
        f = self._fix(site)
        delta = self._anchor_delta.pop(site, None)
        if delta is not None and unrotated is not None:
            near = band.in_band(unrotated, approx.dtype, delta)
            f.banded += int(np.count_nonzero(near))
            mask = mask | near
        f.anchor_mask, f.anchor_true = mask, true.bits
        return RawTensor(approx.dtype, np.where(mask, true.bits, approx.bits).astype(approx.bits.dtype))


def push_symbols_of(t: RawTensor, w: int) -> np.ndarray:
    return np.frombuffer(t.tobytes(), dtype=uint_dtype(w))

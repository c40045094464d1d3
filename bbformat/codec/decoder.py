"""The decoder: run a block program backwards from its payload (SPEC.md section 7).

What the decoder cannot compute (sign bits, corrections) comes from a Corrector: the
reader's reads the stored side sections, the encoder's simulation knows the truth.
"""
from __future__ import annotations

from typing import Protocol

import numpy as np

from ..errors import FormatError
from . import rotation as rot
from .dtypes import RawTensor, f64_to_bits, symbols_to_tensor, wide_dtype
from ..container.program import BlockProgram, SiteEntry
from ..constants import OpKind
from .stack import SymbolStack


class Corrector(Protocol):
    """Supplies what the decoder cannot compute: sign bits and corrections. `regenerated` and
    `unrotated` are the float64 values before rounding (the encoder's band needs them)."""

    def signs(self, site: int) -> np.ndarray: ...

    def correct_x(self, site: int, approx: np.ndarray, regenerated: np.ndarray | None = None) -> np.ndarray: ...

    def correct_anchor(self, site: int, approx: RawTensor, unrotated: np.ndarray | None = None) -> RawTensor: ...


class BasisObserver(Protocol):
    """A corrector that also sees each site's Gram matrix and eigenvectors (the encoder's)."""

    def note_basis(self, site: int, g: np.ndarray, e: np.ndarray, mu: np.ndarray, m: np.ndarray | None) -> None: ...


def solve(g: np.ndarray, solver: "rot.Eigensolver") -> np.ndarray | None:
    """The eigenvectors of g by `solver`, or None if g is not finite or the solver fails."""
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
    e = solve(g, solver or rot.decoder_eigh)
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
        if op.kind == OpKind.PUSH:
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

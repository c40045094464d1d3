"""The decoder: run a block program backwards from its payload (SPEC.md section 7).

What the decoder cannot compute (sign bits, corrections) comes from a Corrector: the
reader's reads the stored side sections, the encoder's simulation knows the truth.
"""
from __future__ import annotations

from typing import Protocol, cast

import numpy as np

from ..errors import FormatError
from .linalg import REFERENCE, Array, Linalg, apply_paper_signs, solve
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
    """A corrector that also sees each site's Gram matrix and eigenvectors (the encoder's), as
    arrays of the decoding backend, and the popped eigenvalues on the host."""

    def note_basis(self, site: int, g: Array, e: Array, mu: np.ndarray, m: Array | None) -> None: ...


class MarginObserver(Protocol):
    """A corrector that measures margins (format 1.4, SPEC.md 9 item 7): it also sees each PAPER
    site's column sums of E, on the host, when `margins_wanted`."""

    margins_wanted: bool

    def note_columns(self, site: int, sums: np.ndarray) -> None: ...


def recover_basis(la: Linalg, anchor: RawTensor, site: SiteEntry, signs: np.ndarray | None,
                  keep_gram: bool = False) -> tuple[Array | None, Array, Array | None]:
    """(the anchor's float64 axis matrix in paper mode, else None; the eigenvectors of its Gram
    matrix, ascending, sign-fixed in paper mode; the Gram matrix if keep_gram, else None), as
    arrays of backend `la`. Outside paper mode the matrix is dropped before the eigensolver
    runs: for a 5,120 x 20,480 anchor that is 840 MB."""
    mat = la.axis_matrix(la.widen(anchor), site.anchor_axis)
    g = la.gram(mat)
    m = mat if site.paper else None
    del mat
    e = solve(la, g)
    if e is None:
        # SPEC.md 7.5: a non-finite Gram matrix or a failed eigensolver makes every entry of E NaN
        e = la.nan_square(site.dim)
    if site.paper:
        assert signs is not None
        e = apply_paper_signs(la, e, signs)
    return m, e, (g if keep_gram else None)


def decode_program(program: BlockProgram, payload: np.ndarray, corrector: Corrector, la: Linalg = REFERENCE,
                   share: bool = False) -> dict[str, RawTensor]:
    """Run the program backwards from the final stack; return the decoded tensors.

    la: where the linear algebra runs (codec/linalg.py); the default is the reference, as the
    encoder's simulation of the decoder needs. Every value is rounded on the host (SPEC.md
    7.4) whatever the backend. Non-finite anchors decode to NaN (SPEC.md 7.5), quietly.
    share: a tensor that lies wholly in the payload is a view of it, not a copy (less memory
    and time; the payload lives while any such tensor does, and a view of a read-only
    payload is read-only): for callers that use a block and drop it."""
    with la.threads(), la.guard(), np.errstate(invalid="ignore", over="ignore"):
        return _decode_program(program, payload, corrector, la, share)


def _decode_program(program: BlockProgram, payload: np.ndarray, corrector: Corrector, la: Linalg,
                    share: bool) -> dict[str, RawTensor]:
    w = program.symbol_bits
    stack = SymbolStack(w, payload, capacity=program.stack_peak_symbols())
    out: dict[str, RawTensor] = {}
    for op in reversed(program.ops):
        if op.kind == OpKind.PUSH:
            t = program.tensors[op.index]
            out[t.name] = symbols_to_tensor(stack.pop(t.symbols(w), share), t.dtype, t.shape, w, share)
            continue
        s = program.sites[op.index]
        if s.plain:
            continue
        _undo_site(program, op.index, stack, out, corrector, la)
    if len(stack):
        raise FormatError(f"{len(stack)} payload symbols left over after decoding", "E_SYMBOL_COUNT")
    return out


def _undo_site(program: BlockProgram, site: int, stack: SymbolStack, out: dict[str, RawTensor], corrector: Corrector,
               la: Linalg) -> None:
    """One site, backwards: push the regenerated block back (corrected), and in the paper
    scheme un-rotate the anchor. Its float64 temporaries (the anchor's matrix, X~) die here."""
    s = program.sites[site]
    w = program.symbol_bits
    mu = np.frombuffer(stack.pop(s.n_mu).tobytes(), dtype=wide_dtype(w)).astype(np.float64)
    anchor_name = program.tensors[s.anchor].name
    anchor = out[anchor_name]
    signs = corrector.signs(site) if s.paper else None
    observer = corrector if hasattr(corrector, "note_basis") else None
    m, e, g = recover_basis(la, anchor, s, signs, keep_gram=observer is not None)
    if observer is not None and g is not None:
        observer.note_basis(site, g, e, mu, m)
    del g
    if s.paper and getattr(corrector, "margins_wanted", False):  # a MarginObserver: the sign decisions' margin
        cast(MarginObserver, corrector).note_columns(site, la.column_sums(e))
    xf = la.block(la.regenerate(e, la.asarray(mu), s.paper))  # float64, on the host
    approx = f64_to_bits(xf, program.symbol_dtype)
    stack.push(corrector.correct_x(site, approx, xf))
    del xf
    if m is not None:  # paper
        cf = la.host(la.from_axis_matrix(la.matmul(m, e), anchor.shape, s.anchor_axis))
        canon = RawTensor.from_f64(cf, anchor.dtype)
        out[anchor_name] = corrector.correct_anchor(site, canon, cf)

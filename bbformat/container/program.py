"""Block programs: the self-describing recipe of one chunk (SPEC.md section 6), as data.

A program lists the chunk's tensors, its rotation sites and its ops. Encoding runs
the ops in order on a symbol stack: PUSH t pushes tensor t's symbols; SITE s pops
the D(D+1)/2-symbol block X, pushes X's eigenvalues mu as 2D symbols, and fixes the
rotation applied to the tensors pushed after it. Decoding (codec/decoder.py) runs the
ops backwards. The final stack is the chunk's payload.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..constants import DTYPE_BITS, FLOAT_DTYPES, MIN_SITE_DIM, SAFETENSORS_DTYPES, SITE_FLAGS_KNOWN, SYMBOL_BITS, OpKind, SiteFlag
from ..errors import FormatError, InputError


def bits_of(dtype: str) -> int:
    """The width in bits of an element type SPEC.md names (float16, ..., float8_e5m2)."""
    try:
        return DTYPE_BITS[dtype]
    except KeyError:
        raise InputError(f"unsupported element type {dtype!r}") from None


def safetensors_dtype(code: str) -> str:
    """The dtype name of a safetensors dtype string ("F16", "BOOL", ...); one the format cannot
    store (F8_E8M0, F4, C64, ...) is an InputError naming it."""
    try:
        return SAFETENSORS_DTYPES[code]
    except KeyError:
        raise InputError(f"safetensors dtype {code!r} cannot be stored (one of {', '.join(SAFETENSORS_DTYPES)})") from None


def block_size(dim: int) -> int:
    """Symbols of the upper triangle of a dim x dim symmetric matrix: D(D+1)/2."""
    return dim * (dim + 1) // 2


@dataclass(frozen=True)
class AxisRef:
    """One axis of one tensor, by name."""

    tensor: str
    axis: int




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
class SiteEntry:
    name: str
    dim: int
    anchor: int  # index into the program's tensors
    anchor_axis: int
    flags: int
    followers: tuple[AxisRef, ...] = ()

    @property
    def plain(self) -> bool:
        return bool(self.flags & SiteFlag.PLAIN)

    @property
    def paper(self) -> bool:
        return bool(self.flags & SiteFlag.PAPER)

    @property
    def n_pop(self) -> int:
        return block_size(self.dim)

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

    def plain_bytes(self) -> int:
        """The chunk's tensors in the plain array layout."""
        return sum(t.numel * bits_of(t.dtype) // 8 for t in self.tensors)

    def bits_back_bound(self) -> int:
        """The gross bits-back bound: D(D-1)/2 symbols per site, plain or not (paper section 3)."""
        return sum(s.dim * (s.dim - 1) // 2 * self.symbol_bits for s in self.sites)

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
            if op.kind == OpKind.PUSH:
                n -= self.tensors[op.index].symbols(w)
            elif not self.sites[op.index].plain:
                s = self.sites[op.index]
                n += s.n_pop - s.n_mu
                peak = max(peak, n)
        return peak

    def validate(self) -> None:
        """Structural rules a reader checks before decoding (SPEC.md section 6)."""
        if DTYPE_BITS.get(self.symbol_dtype) not in SYMBOL_BITS:
            raise FormatError(f"symbol dtype {self.symbol_dtype} is not 8, 16 or 32 bits wide", "E_DTYPE")
        w = self.symbol_bits
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
            if op.kind == OpKind.PUSH:
                if not 0 <= op.index < len(self.tensors):
                    raise FormatError("PUSH names a tensor that does not exist", "E_DESCRIPTOR")
                pushed[op.index] += 1
                pos_push[op.index] = k
            elif op.kind == OpKind.SITE:
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
            if self.symbol_dtype not in FLOAT_DTYPES or a.dtype not in FLOAT_DTYPES:
                raise FormatError(f"site {s.name!r}: symbols {self.symbol_dtype} and anchor {a.dtype} must both be floats", "E_SITE")
            if not 0 <= s.anchor_axis < len(a.shape) or a.shape[s.anchor_axis] != s.dim or s.dim < MIN_SITE_DIM:
                raise FormatError(f"site {s.name!r} does not fit its anchor {a.name!r}", "E_SITE")
            if pos_push[s.anchor] < pos_site[i]:
                raise FormatError(f"site {s.name!r}: anchor pushed before the site", "E_SITE")

"""Element types, their bit patterns, and exact rounding from float64.

A tensor travels as `RawTensor`: its dtype name and an unsigned-integer array of
its bit patterns, as wide as its elements (uint16 for float16/bfloat16, uint8 for bool, int8 and
float8, uint64 for float64/int64, ...). Only float16, bfloat16 and float32 have values here.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..container.program import bits_of
from ..errors import InputError
from . import host_native

_UINT: dict[int, np.dtype] = {8: np.dtype("u1"), 16: np.dtype("<u2"), 32: np.dtype("<u4"), 64: np.dtype("<u8")}


def uint_dtype(bits: int) -> np.dtype:
    return _UINT[bits]


@dataclass
class RawTensor:
    """A tensor as bit patterns: `bits` has the tensor's shape and an unsigned dtype."""

    dtype: str
    bits: np.ndarray

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.bits.shape)

    def to_f64(self) -> np.ndarray:
        return bits_to_f64(self.bits, self.dtype)

    @classmethod
    def from_f64(cls, x: np.ndarray, dtype: str, keep_order: bool = False) -> "RawTensor":
        """x rounded to dtype; keep_order: the bits may keep x's memory order (f64_to_bits)."""
        return cls(dtype, f64_to_bits(x, dtype, keep_order))

    def little_endian(self) -> np.ndarray:
        """The bits as a C-ordered little-endian array (no copy where they already are)."""
        return np.ascontiguousarray(self.bits).astype(self.bits.dtype.newbyteorder("<"), copy=False)

    def tobytes(self) -> bytes:
        return self.little_endian().tobytes()

    def equal(self, other: "RawTensor") -> bool:
        return (
            self.dtype == other.dtype
            and self.shape == other.shape
            and bool(np.array_equal(self.bits, other.bits))
        )


def bits_to_f64(bits: np.ndarray, dtype: str) -> np.ndarray:
    if dtype in host_native.DTYPE_CODES and host_native.active():
        return host_native.widen(bits, dtype)
    with np.errstate(invalid="ignore"):
        return _bits_to_f64(bits, dtype)


def _bits_to_f64(bits: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "float16":
        return bits.astype(np.uint16, copy=False).view(np.float16).astype(np.float64)
    if dtype == "bfloat16":
        return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)
    if dtype == "float32":
        return bits.astype(np.uint32, copy=False).view(np.float32).astype(np.float64)
    raise InputError(f"unsupported element type {dtype!r}")


def _f64_to_f32_round_to_odd(x: np.ndarray) -> np.ndarray:
    """float64 -> float32 bits, rounding toward zero and setting the last bit if inexact.

    Rounding to odd first and then to nearest-even in the narrower type gives the
    correctly rounded result, with no double-rounding error.
    """
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        r = x.astype(np.float32)
    too_big = np.abs(r.astype(np.float64)) > np.abs(x)
    r = np.where(too_big, np.nextafter(r, np.float32(0)), r)
    b = r.view(np.uint32).copy()
    inexact = (r.astype(np.float64) != x) & ~np.isnan(x)
    b |= inexact.astype(np.uint32)
    return b


def f64_to_bits_into(x: np.ndarray, dtype: str, out: np.ndarray) -> None:
    """out[...] = f64_to_bits(x, dtype), without the temporary where the compiled path can
    write into `out` (C-contiguous, of x's shape and the dtype's width)."""
    if (dtype in host_native.DTYPE_CODES and host_native.active() and out.flags.c_contiguous and out.shape == np.shape(x)
            and out.dtype == uint_dtype(bits_of(dtype))):
        host_native.round_to(x, dtype, out)
    else:
        out[...] = f64_to_bits(x, dtype)


def f64_to_bits(x: np.ndarray, dtype: str, keep_order: bool = False) -> np.ndarray:
    """Round float64 values to `dtype` (IEEE round-to-nearest-even), returning bit patterns.
    Compiled where host_native is active; the numpy below is the reference. keep_order: an
    F-ordered x gives F-ordered bits without a C-ordered copy first (else the compiled path's
    bits are C-ordered)."""
    if dtype in host_native.DTYPE_CODES and host_native.active():
        return host_native.round_to(x, dtype, keep_order=keep_order)
    x = np.asarray(x, dtype=np.float64)
    if dtype == "float16":
        with np.errstate(over="ignore", invalid="ignore"):
            return x.astype(np.float16).view(np.uint16)
    if dtype == "float32":
        with np.errstate(over="ignore", invalid="ignore"):
            return x.astype(np.float32).view(np.uint32)
    if dtype == "bfloat16":
        b = _f64_to_f32_round_to_odd(x).astype(np.uint64)
        nan = np.isnan(x)
        rounded = ((b + np.uint64(0x7FFF) + ((b >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)).astype(
            np.uint16
        )
        return np.where(nan, np.uint16(0x7FC0), rounded).astype(np.uint16)
    raise InputError(f"unsupported element type {dtype!r}")


# width -> the magnitude bits' mask, as an int64 value
_MAGNITUDE = {w: (1 << (w - 1)) - 1 for w in (8, 16, 32, 64)}


def bits_to_ordinal(bits: np.ndarray, width: int) -> np.ndarray:
    """Map sign-magnitude bit patterns to integers that order like the values (+0 -> 0, -0 -> -1):
    the magnitude, complemented (-magnitude - 1) where the sign bit is set. Without branches, on
    one int64 array and one int64 temporary (the sign as 0 or -1)."""
    o = np.array(bits, dtype=np.int64, ndmin=1)
    neg = np.left_shift(o, np.int64(64 - width))  # the sign bit at the top, then
    np.right_shift(neg, np.int64(63), out=neg)  # spread: -1 where set, else 0
    np.bitwise_and(o, np.int64(_MAGNITUDE[width]), out=o)
    np.bitwise_xor(o, neg, out=o)  # ~magnitude = -magnitude - 1 where negative
    return o.reshape(np.shape(bits))


def ordinal_to_bits(o: np.ndarray, width: int) -> np.ndarray:
    """bits_to_ordinal's inverse, for ordinals in range (callers check): a negative ordinal's
    complement is the magnitude, with the sign bit set."""
    b = np.array(o, dtype=np.int64, ndmin=1)
    neg = np.right_shift(b, np.int64(63))  # -1 where negative, else 0
    np.bitwise_xor(b, neg, out=b)
    np.bitwise_and(neg, np.int64(~_MAGNITUDE[width]), out=neg)  # the sign bit (and, for width < 64, bits above it: cut below)
    np.bitwise_or(b, neg, out=b)
    return b.astype(uint_dtype(width)).reshape(np.shape(o))


def symbols_view(t: RawTensor, symbol_bits: int) -> np.ndarray:
    """A tensor's little-endian bytes in C order, read as `symbol_bits`-wide little-endian
    symbols: a view where the bits already are C-ordered little-endian."""
    return t.little_endian().reshape(-1).view(np.dtype(uint_dtype(symbol_bits)).newbyteorder("<"))


def tensor_to_symbols(t: RawTensor, symbol_bits: int) -> np.ndarray:
    """symbols_view as native-order symbols (one copy)."""
    return symbols_view(t, symbol_bits).astype(uint_dtype(symbol_bits))


def little_endian_bytes(a: np.ndarray) -> bytes:
    """The bytes of `a` in C order, little-endian, in one copy."""
    return np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<"), copy=False).tobytes()


def symbols_to_tensor(sym: np.ndarray, dtype: str, shape: tuple[int, ...], symbol_bits: int, share: bool = False) -> RawTensor:
    """The tensor whose bits the symbols are. It owns its memory, unless share and the symbols
    are already a contiguous array of the tensor's own width (then it is a view of them)."""
    sym = np.ascontiguousarray(sym, dtype=uint_dtype(symbol_bits))  # no copy when already so
    if sym.base is not None and not (share and bits_of(dtype) == symbol_bits):
        sym = sym.copy()
    return RawTensor(dtype, sym.view(uint_dtype(bits_of(dtype))).reshape(shape))


def wide_dtype(symbol_bits: int) -> np.dtype:
    """Eigenvalues travel as floats twice the symbol width (W = 16 or 32: sites need float symbols)."""
    wide: dict[int, np.dtype] = {16: np.dtype("<f4"), 32: np.dtype("<f8")}
    return wide[symbol_bits]

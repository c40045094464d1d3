"""Vectorised LEB128 varints and zigzag, used by correction sections, and the group that
bytecursor.ByteCursor.group reads back (SPEC.md 8.4, 8.6)."""
from __future__ import annotations

import operator

import numpy as np

from ..constants import MAX_VARINT_BYTES, Codec
from ..errors import FormatError
from ..zstdframe import Compressor


def zigzag(v: np.ndarray) -> np.ndarray:
    v = np.asarray(v, dtype=np.int64)
    return ((v << np.int64(1)) ^ (v >> np.int64(63))).astype(np.uint64)


def unzigzag(u: np.ndarray) -> np.ndarray:
    """zigzag's inverse: (u >> 1) ^ -(u & 1), in place on two int64 arrays."""
    u = np.asarray(u, dtype=np.uint64)
    flat = u.reshape(-1)
    out = (flat >> np.uint64(1)).view(np.int64)  # < 2^63: the same value as int64
    odd = (flat & np.uint64(1)).view(np.int64)
    np.negative(odd, out=odd)
    out ^= odd
    return out.reshape(u.shape)


def varint_bytes(u: np.ndarray) -> int:
    """len(encode_varints(u)), without encoding."""
    return int(varint_lengths(u).sum(dtype=np.int64))


def varint_lengths(u: np.ndarray) -> np.ndarray:
    """The length in bytes of each value's varint (1 to MAX_VARINT_BYTES), as int64: one
    pass per byte beyond the first that some value needs."""
    u = np.asarray(u, dtype=np.uint64).reshape(-1)
    out = np.ones(u.size, dtype=np.int64)
    t = u >> np.uint64(7)
    while np.any(t):
        out += t != 0
        t >>= np.uint64(7)
    return out


def encode_varint(v: int) -> bytes:
    """One value (0 <= v < 2^64; an int or a numpy integer) as a LEB128 varint: encode_varints of [v]."""
    v = operator.index(v)
    if not 0 <= v < 1 << 64:
        raise ValueError(f"varint {v} not in 0 .. 2^64 - 1")
    out = bytearray()
    while v >= 0x80:
        out.append(0x80 | (v & 0x7F))
        v >>= 7
    out.append(v)
    return bytes(out)


def encode_varints(u: np.ndarray) -> bytes:
    u = np.asarray(u, dtype=np.uint64).reshape(-1)
    if u.size == 0:
        return b""
    nbytes = varint_lengths(u)
    ends = np.cumsum(nbytes)
    starts = ends - nbytes
    out = np.zeros(int(ends[-1]), dtype=np.uint8)
    rem = u.copy()
    for k in range(int(nbytes.max())):
        active = nbytes > k
        idx = starts[active] + k
        last = nbytes[active] == k + 1
        byte = (rem[active] & np.uint64(0x7F)).astype(np.uint8)
        out[idx] = byte | np.where(last, np.uint8(0), np.uint8(0x80))
        rem[active] >>= np.uint64(7)
    return out.tobytes()


def decode_varints(data: bytes | bytearray | memoryview, count: int) -> np.ndarray:
    """Decode exactly `count` varints filling `data` exactly; reject anything else."""
    b = np.frombuffer(data, dtype=np.uint8)
    if b.size == count and (count == 0 or int(b.max()) < 0x80):
        return b.astype(np.uint64)  # every value is one byte (most residuals)
    ends = np.flatnonzero((b & 0x80) == 0)
    if ends.size != count or (count and ends[-1] != b.size - 1) or (count == 0 and b.size):
        raise FormatError("varint stream does not hold the declared number of values", "E_SECTION_CONTENT")
    starts = np.concatenate(([0], ends[:-1] + 1)) if count else np.zeros(0, np.int64)
    lens = ends - starts + 1
    if count and int(lens.max()) > MAX_VARINT_BYTES:
        raise FormatError("varint longer than 10 bytes", "E_SECTION_CONTENT")
    if count and np.any((lens == MAX_VARINT_BYTES) & (b[ends] > 1)):
        raise FormatError("varint value is 2^64 or more", "E_SECTION_CONTENT")
    out = np.zeros(count, dtype=np.uint64)
    for k in range(int(lens.max()) if count else 0):
        active = lens > k
        out[active] |= (b[starts[active] + k].astype(np.uint64) & np.uint64(0x7F)) << np.uint64(7 * k)
    return out


def encode_group(raw: bytes, z: Compressor, zstd_above: int = 0) -> bytes:
    """One group, as bytecursor.ByteCursor.group reads it: varint L, codec byte, L bytes; zstd where that is
    smaller than raw (tried only for groups longer than zstd_above bytes)."""
    codec, data = Codec.RAW, raw
    if len(raw) > zstd_above:
        comp = z.compress(raw)
        if len(comp) < len(raw):
            codec, data = Codec.ZSTD, comp
    return encode_varint(len(data)) + bytes([codec]) + data

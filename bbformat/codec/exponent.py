"""Payload codec 3, "exponent" (SPEC.md 8.7, format 1.3): each float's exponent field and its
top t mantissa bits as one symbol, through interleaved rANS with a static table per segment
and column class; the sign and the other mantissa bits stored as they are.

Why: the exponent is the only low-entropy field of trained weights, and in bf16 and fp32 it
straddles a byte boundary, so byte planes (codec 2) split it. BENCHMARKS.md 14 and 15.
"""
from __future__ import annotations

import numpy as np

from ..bytecursor import ByteCursor
from ..constants import (
    DTYPE_BITS,
    EXPONENT_FIELD,
    MAX_EXPONENT_CODE_BITS,
    MAX_EXPONENT_LANES,
    MAX_EXPONENT_TABLES,
    MAX_VARINT_BYTES,
)
from ..errors import FormatError, LimitError
from ..zstdframe import PLANES_LEVEL, Buffer, compressor
from . import native, rans
from .dtypes import uint_dtype
from .entropy import MIN_CONTEXT_SEGMENT, SMALL_GROUP, rank_classes, read_segment_records, take_group
from .varint import decode_varints, encode_group, encode_varint, encode_varints

_exponent_native = native.compiled  # the compiled coder, or None: the numpy code below (same bytes)
NATIVE_DECODER = _exponent_native is not None  # and encoder: the same module

JOINED_BITS_TRIED = (0, 1, 2, 3)  # top mantissa bits the encoder tries joining to the exponent
EXPONENT_CLASSES = 4  # column classes the encoder tries for a segment (else 1)
STEPS_PER_LANE = 2048  # the encoder's lanes: about this many symbols each
TABLE_ENTRY_BYTES = 3.0  # the encoder's estimate of a stored table entry
# The encoder's frequencies are multiples of 2^TABLE_GRAIN (any are valid, SPEC.md 8.7): the
# compiled decoder then builds 4x smaller tables, which decode about 15% faster on this
# project's machine for 0.02-0.09% more bytes (BENCHMARKS.md 15). 0 writes the tables the
# writer wrote before (the golden fixtures pin them).
TABLE_GRAIN = 2


def split_fields(dtype: str, joined: int) -> tuple[int, int, int]:
    """(W, code shift, code bits) of a dtype's symbols with `joined` mantissa bits in the code."""
    shift, width = EXPONENT_FIELD[dtype]
    return DTYPE_BITS[dtype], shift - joined, width + joined


def max_joined(dtype: str) -> int:
    """The most mantissa bits a code may join (SPEC.md 8.7): all of them, and the code <= 12 bits."""
    shift, width = EXPONENT_FIELD[dtype]
    return min(shift, MAX_EXPONENT_CODE_BITS - width)


# ----------------------------------------------------------------------------- encoder


def _ideal_bits(counts: np.ndarray) -> float:
    c = counts[counts > 0].astype(np.float64)
    return float((c * np.log2(c.sum() / c)).sum())


def _cost(counts: np.ndarray) -> float:
    """Estimated stored bits of one table's symbols and the table itself."""
    return _ideal_bits(counts) + 8 * TABLE_ENTRY_BYTES * int(np.count_nonzero(counts))


def _histogram(sym: np.ndarray, shift: int, bits: int, r: int, cls: np.ndarray | None, k: int, native: bool) -> np.ndarray:
    """Counts (k x 2^bits, int64) of the codes (sym >> shift) mod 2^bits, symbol p in class
    cls[p mod r] (None: all in class 0)."""
    counts = np.zeros((k, 1 << bits), np.uint64)
    if native and _exponent_native is not None:
        _exponent_native.histogram(sym, 8 * sym.itemsize, shift, bits, r, b"" if cls is None else cls.tobytes(), counts)
        return counts.astype(np.int64)
    step = max(r, REST_PIECE // r * r)  # whole rows a piece, so each starts at column 0
    for lo in range(0, sym.size, step):
        code = (sym[lo : lo + step] >> shift) & ((1 << bits) - 1)
        if cls is None:
            counts[0] += np.bincount(code, minlength=1 << bits).astype(np.uint64)
            continue
        ctx = np.tile(cls, -(-code.size // r))[: code.size].astype(np.int64)
        counts += np.bincount(ctx * (1 << bits) + code, minlength=k << bits).reshape(k, -1).astype(np.uint64)
    return counts.astype(np.int64)


def _column_means(sym: np.ndarray, shift: int, bits: int, r: int, native: bool) -> np.ndarray:
    """The mean code (float64) of each column p mod r of a segment."""
    rows, tail = divmod(sym.size, r)
    if native and _exponent_native is not None:
        sums = np.zeros(r, np.uint64)
        _exponent_native.column_sums(sym, 8 * sym.itemsize, shift, bits, r, sums)
    else:
        code = (sym >> shift) & ((1 << bits) - 1)
        sums = code[: rows * r].reshape(rows, r).sum(0, dtype=np.uint64)
        sums[:tail] += code[rows * r :].astype(np.uint64)
    return sums.astype(np.float64) / (rows + (np.arange(r) < tail))


def _segment_classes(sym: np.ndarray, shift: int, bits: int, r: int, one: np.ndarray, native: bool) -> tuple[int, np.ndarray, list[np.ndarray]]:
    """(K, column classes, symbol counts per class) of one segment whose codes' counts are
    `one`: K = EXPONENT_CLASSES where that is estimated smaller than one table."""
    if sym.size < MIN_CONTEXT_SEGMENT or r < EXPONENT_CLASSES:
        return 1, np.zeros(0, np.uint8), [one]
    cls = rank_classes(_column_means(sym, shift, bits, r, native), EXPONENT_CLASSES)
    counts = list(_histogram(sym, shift, bits, r, cls, EXPONENT_CLASSES, native))
    if sum(_cost(c) for c in counts) + 8 * r < _cost(one):
        return EXPONENT_CLASSES, cls, counts
    return 1, np.zeros(0, np.uint8), [one]


def _choose_joined(sym: np.ndarray, dtype: str, runs: list[tuple[int, int]], native: bool) -> tuple[int, list[np.ndarray]]:
    """(the joined mantissa bits of smallest estimated size (one table per segment), each
    segment's code counts with those bits). Each segment is counted once, at the most bits
    tried; fewer bits' counts are sums of those."""
    tried = [t for t in JOINED_BITS_TRIED if t <= max_joined(dtype)]
    w, shift, bits = split_fields(dtype, max(tried))
    size = {t: float(sym.size) * (w - split_fields(dtype, t)[2]) for t in tried}
    fine, pos = [], 0
    for n, r in runs:
        fine.append(_histogram(sym[pos : pos + n], shift, bits, r, None, 1, native)[0])
        for t in tried:
            size[t] += _cost(fine[-1].reshape(-1, 1 << (max(tried) - t)).sum(1))
        pos += n
    best = min(tried, key=lambda t: (size[t], t))
    return best, [f.reshape(-1, 1 << (max(tried) - best)).sum(1) for f in fine]


def _table_bytes(counts: np.ndarray) -> tuple[bytes, np.ndarray, np.ndarray]:
    """(stored table, symbols, frequencies) of one class's counts (SPEC.md 8.7)."""
    freq = rans.quantize(counts, TABLE_GRAIN)
    symbols = np.flatnonzero(freq)
    gaps = np.diff(symbols, prepend=-1) - 1
    pairs = np.empty(2 * symbols.size, np.uint64)
    pairs[0::2], pairs[1::2] = gaps, freq[symbols]
    return encode_varint(symbols.size) + encode_varints(pairs), symbols, freq[symbols]


def first_tables(segs: list[tuple[int, int, int]]) -> np.ndarray:
    """Each segment's first table (int64): tables are numbered segment by segment, K_j each."""
    return np.concatenate(([0], np.cumsum([k for _, _, k in segs])[:-1])).astype(np.int64)


class _Layout:
    """Where each payload position takes its table from: its segment and column class."""

    def __init__(self, runs: list[tuple[int, int, int]], maps: list[np.ndarray]) -> None:
        self.start = np.concatenate(([0], np.cumsum([n for n, _, _ in runs]))).astype(np.int64)
        self.table_base = first_tables(runs)
        given = iter(maps)
        self.maps = [next(given).astype(np.uint32) if k > 1 else None for _, _, k in runs]

    def table_ids(self, lo: int, hi: int) -> np.ndarray:
        """The table of every position in lo..hi-1, one segment at a time."""
        out = np.empty(hi - lo, np.uint32)
        j = int(np.searchsorted(self.start, lo, side="right")) - 1
        p = lo
        while p < hi:
            s0, end = int(self.start[j]), min(hi, int(self.start[j + 1]))
            dest = out[p - lo : end - lo]
            cls = self.maps[j]
            if cls is None:
                dest[:] = self.table_base[j]
            else:
                first = (p - s0) % cls.size
                dest[:] = np.tile(cls, -(-(end - p + first) // cls.size))[first : first + end - p] + np.uint32(self.table_base[j])
            p = end
            j += 1
        return out


def lanes_for(total: int) -> int:
    """The reference writer's lane count for a payload of `total` symbols."""
    return max(1, min(MAX_EXPONENT_LANES, -(-total // STEPS_PER_LANE)))


REST_PIECE = 1 << 20  # rest fields are packed and unpacked this many symbols at a time (a multiple of 8)


def rest_fields(sym: np.ndarray, w: int, shift: int) -> np.ndarray:
    """The sign above the `shift` low mantissa bits of each symbol (SPEC.md 8.7)."""
    return ((sym >> (w - 1)) << shift) | (sym & ((1 << shift) - 1))


def pack_rest(rest: np.ndarray, bits: int) -> tuple[bytes, bytes]:
    """The rest fields (SPEC.md 8.7) of some symbols (a multiple of 8, but for the last):
    (the low 8*(bits div 8) bits of each as bytes, the high (bits mod 8) bits, 8 symbols to a
    group of (bits mod 8) bytes)."""
    b0, b1 = divmod(bits, 8)
    r = rest.astype(np.uint64)
    low = b""
    if b0:
        low = np.stack([((r >> np.uint64(8 * b)) & np.uint64(0xFF)).astype(np.uint8) for b in range(b0)], 1).tobytes()
    if not b1:
        return low, b""
    h = r >> np.uint64(8 * b0)
    h = np.pad(h, (0, -h.size % 8)).reshape(-1, 8)
    g = (h << (np.uint64(b1) * np.arange(8, dtype=np.uint64))).sum(1, dtype=np.uint64)
    high: bytes = g.astype("<u8").view(np.uint8).reshape(-1, 8)[:, :b1].tobytes()
    return low, high


def encode_exponent(symbols: np.ndarray, dtype: str, runs: list[tuple[int, int]], native: bool = True) -> bytes | None:
    """Codec 3 bytes of a payload of `dtype` symbols whose segments are `runs` (n, row length);
    None if it would need more than MAX_EXPONENT_TABLES tables. Through the compiled coder where
    it is built and `native`, else numpy (the same bytes)."""
    native = native and _exponent_native is not None
    sym = np.ascontiguousarray(np.asarray(symbols).astype(uint_dtype(DTYPE_BITS[dtype]), copy=False))  # native width
    t, seg_counts = _choose_joined(sym, dtype, runs, native)
    w, shift, bits = split_fields(dtype, t)
    head = [bytes([t]), encode_varint(len(runs))]
    segs, maps, tables, stored_tables = [], [], [], []
    pos = 0
    for (n, r), one in zip(runs, seg_counts):
        k, cls, counts = _segment_classes(sym[pos : pos + n], shift, bits, r, one, native)
        head.append(encode_varint(n) + encode_varint(r) + bytes([k]))
        segs.append((n, r, k))
        if k > 1:
            maps.append(cls)
        for c in counts:
            raw, s, f = _table_bytes(c)
            stored_tables.append(raw)
            tables.append((s, f))
        pos += n
    if len(tables) > MAX_EXPONENT_TABLES:
        return None  # the caller stores the payload another way
    lanes = lanes_for(sym.size)
    stream = (_encode_native if native else _encode_numpy)(sym, shift, bits, lanes, segs, maps, rans.Tables.of(tables))
    rest = (_rest_native if native else _rest_numpy)(sym, w, shift)
    z = compressor(PLANES_LEVEL)
    table_raw = b"".join(stored_tables)
    return b"".join([*head, encode_varint(lanes), encode_group(b"".join(m.tobytes() for m in maps), z, SMALL_GROUP),
                     encode_varint(len(table_raw)), encode_group(table_raw, z, SMALL_GROUP), encode_varint(len(stream)), stream, *rest])


def _encode_numpy(sym: np.ndarray, shift: int, bits: int, lanes: int, segs: list[tuple[int, int, int]],
                  maps: list[np.ndarray], tab: rans.Tables) -> bytes:
    """The rANS stream of the payload's codes, in numpy (the reference)."""
    alphabet = 1 << bits
    layout = _Layout(segs, maps)
    entry_of = tab.entry_of(alphabet)

    def entries(lo: int, hi: int) -> np.ndarray:
        code = (sym[lo:hi] >> shift) & (alphabet - 1)
        return entry_of[layout.table_ids(lo, hi).astype(np.int64) * alphabet + code]

    return rans.encode(entries, sym.size, lanes, tab)


def _encode_native(sym: np.ndarray, shift: int, bits: int, lanes: int, segs: list[tuple[int, int, int]],
                   maps: list[np.ndarray], tab: rans.Tables) -> memoryview:
    """_encode_numpy's stream through the compiled coder."""
    assert _exponent_native is not None
    out = np.empty(4 * lanes + 2 * sym.size, np.uint8)
    size = _exponent_native.encode(
        sym, 8 * sym.itemsize, shift, bits, lanes, np.array([n for n, _, _ in segs], np.int64),
        np.array([r for _, r, _ in segs], np.int64), first_tables(segs), np.array([k > 1 for _, _, k in segs], np.uint8),
        np.concatenate([np.zeros(0, np.uint8), *maps]), tab.entry_of(1 << bits).astype(np.int32), tab.freq, tab.start, out)
    return out[:size].data


def _rest_numpy(sym: np.ndarray, w: int, shift: int) -> list[bytes]:
    """The rest fields as stored (low bytes, then high groups), REST_PIECE symbols at a time."""
    pieces = [pack_rest(rest_fields(sym[i : i + REST_PIECE], w, shift), 1 + shift)
              for i in range(0, sym.size, REST_PIECE)]
    return [b"".join(part) for part in zip(*pieces)]


def _rest_native(sym: np.ndarray, w: int, shift: int) -> list[memoryview]:
    """_rest_numpy through the compiled coder."""
    assert _exponent_native is not None
    b0, b1 = divmod(1 + shift, 8)
    low, high = np.empty(sym.size * b0, np.uint8), np.zeros(-(-sym.size // 8) * b1, np.uint8)
    _exponent_native.pack_rest(sym, w, shift, low, high)
    return [low.data, high.data]


# ----------------------------------------------------------------------------- decoder


def read_tables(raw: np.ndarray, segs: list[tuple[int, int, int]], alphabet: int, native: bool = True) -> rans.Tables:
    """The tables of every segment and class (SPEC.md 8.7 checks), in order: by the compiled
    reader where it is built and `native` (it only accepts or refuses), else, and for the
    message of a refusal, by numpy. The group is varints only, so numpy decodes them at once
    and then walks them (every failure is E_SECTION_CONTENT, whichever is met first)."""
    count = sum(k for _, _, k in segs)
    if native and _exponent_native is not None:
        cap = len(raw) // 2 + 1  # every entry takes at least two bytes
        code, freq, start = (np.empty(cap, np.uint32) for _ in range(3))
        first = np.empty(count + 1, np.int64)
        got = _exponent_native.tables(np.ascontiguousarray(raw, np.uint8), count, alphabet, code, freq, start, first)
        if got >= 0:
            return rans.Tables(code[:got], freq[:got], start[:got], first)
    what = "exponent payload tables"
    b = np.asarray(raw, np.uint8)
    ends = np.flatnonzero(b < 0x80)
    if b.size and (ends.size == 0 or int(ends[-1]) != b.size - 1):
        raise FormatError(f"{what}: the last varint runs past the end", "E_SECTION_CONTENT")
    v = decode_varints(b.tobytes(), ends.size)
    out, pos = [], 0
    for j, (_, _, k) in enumerate(segs):
        for c in range(k):
            name = f"{what}: segment {j} class {c} table"
            if pos >= v.size:
                raise FormatError(f"{name} is missing", "E_SECTION_CONTENT")
            m = int(v[pos])
            if not 1 <= m <= alphabet:
                raise FormatError(f"{name} has {m} entries; 1..{alphabet} allowed", "E_SECTION_CONTENT")
            pairs = v[pos + 1 : pos + 1 + 2 * m]
            if pairs.size < 2 * m:
                raise FormatError(f"{name} runs past the end", "E_SECTION_CONTENT")
            pos += 1 + 2 * m
            if (pairs[0::2] >= alphabet).any() or (pairs[1::2] < 1).any() or (pairs[1::2] > rans.M).any():
                raise FormatError(f"{name} has a symbol gap or frequency out of range", "E_SECTION_CONTENT")
            gaps, freq = pairs[0::2].astype(np.int64), pairs[1::2].astype(np.int64)
            symbols = np.cumsum(gaps + 1) - 1
            if int(symbols[-1]) >= alphabet or int(freq.sum()) != rans.M:
                raise FormatError(f"{name}: symbols must be < {alphabet} and frequencies must sum to {rans.M}", "E_SECTION_CONTENT")
            out.append((symbols, freq))
    if pos != v.size:
        raise FormatError(f"{what}: bytes after the last table", "E_SECTION_CONTENT")
    return rans.Tables.of(out)


def read_segments(cur: ByteCursor, total: int) -> list[tuple[int, int, int]]:
    """The segment records (SPEC.md 8.7, as 8.6), then the table count's limit."""
    segs = read_segment_records(cur, total)
    if sum(k for _, _, k in segs) > MAX_EXPONENT_TABLES:
        raise LimitError(f"exponent payload has more than {MAX_EXPONENT_TABLES} tables", "E_LIMIT_COUNT")
    return segs


def unpack_rest(data: memoryview, total: int, bits: int) -> np.ndarray:
    """pack_rest's inverse for all `total` symbols (uint32), checking the zero padding."""
    b0, b1 = divmod(bits, 8)
    rest = np.zeros(total, np.uint32)
    if b0:
        low = np.frombuffer(data, np.uint8, total * b0).reshape(total, b0)
        for b in range(b0):
            rest |= low[:, b].astype(np.uint32) << np.uint32(8 * b)
    if not b1:
        return rest
    groups = -(-total // 8)
    high = np.frombuffer(data, np.uint8, groups * b1, total * b0).reshape(groups, b1)
    shifts = np.uint64(b1) * np.arange(8, dtype=np.uint64)
    for g0 in range(0, groups, REST_PIECE // 8):
        g = np.zeros((min(groups, g0 + REST_PIECE // 8) - g0, 8), np.uint8)
        g[:, :b1] = high[g0 : g0 + len(g)]
        h = ((g.view("<u8") >> shifts) & np.uint64((1 << b1) - 1)).astype(np.uint32).reshape(-1)
        end = min(total, 8 * (g0 + len(g)))
        if h[end - 8 * g0 :].any():
            raise FormatError("exponent payload: padding bits of the rest fields are not zero", "E_SECTION_CONTENT")
        rest[8 * g0 : end] |= h[: end - 8 * g0] << np.uint32(8 * b0)
    return rest


def rest_size(total: int, bits: int) -> int:
    """Bytes of the rest fields of `total` symbols."""
    b0, b1 = divmod(bits, 8)
    return total * b0 + -(-total // 8) * b1


def read_head(cur: ByteCursor, total: int, dtype: str) -> tuple[int, list[tuple[int, int, int]]]:
    """(joined t, segment records) of a codec-3 payload of `total` symbols: its leading fields,
    with their checks (SPEC.md 8.7 up to lanes Q: the cover and the table limit included; what
    8.9 reads of each codec-3 part before any part is decoded)."""
    t = cur.u8("joined mantissa bits")
    if t > max_joined(dtype):
        raise cur.fail(f"{t} joined mantissa bits; at most {max_joined(dtype)} for {dtype}")
    return t, read_segments(cur, total)


def table_count(data: Buffer, total: int, dtype: str) -> int:
    """How many tables a codec-3 payload of `total` symbols declares (Σ K_j), from its
    leading fields (read_head's checks)."""
    _, segs = read_head(ByteCursor(data, "exponent payload"), total, dtype)
    return sum(k for _, _, k in segs)


def decode_exponent(data: Buffer, total: int, dtype: str, native: bool = True, out: np.ndarray | None = None) -> np.ndarray:
    """The payload symbols (W-bit little-endian unsigned) from codec-3 bytes: through the
    compiled decoder where it is built and `native`, else numpy (the same symbols and errors).
    `out`: a contiguous array of `total` such symbols to decode into (else a new one)."""
    cur = ByteCursor(data, "exponent payload")
    t, segs = read_head(cur, total, dtype)
    w, shift, bits = split_fields(dtype, t)
    alphabet = 1 << bits
    lanes = cur.varint("lane count")
    if not 1 <= lanes <= min(total, MAX_EXPONENT_LANES):
        raise cur.fail(f"lane count {lanes} not in 1..{min(total, MAX_EXPONENT_LANES)}")
    maps = take_group(cur, sum(r for _, r, k in segs if k > 1), "class maps")
    split, pos = [], 0
    for j, (_, r, k) in enumerate(segs):
        if k > 1:
            m = maps[pos : pos + r]
            if (m >= k).any():
                raise cur.fail(f"segment {j} has a class >= {k}")
            split.append(m)
            pos += r
    ntables = sum(k for _, _, k in segs)
    size = cur.varint("tables length")
    if size > ntables * MAX_VARINT_BYTES * (1 + 2 * alphabet):
        raise cur.fail(f"tables length {size} exceeds what {ntables} tables can hold")
    tables = read_tables(take_group(cur, size, "tables"), segs, alphabet, native)
    slen = cur.varint("stream length")
    if slen > 4 * lanes + 2 * total:
        raise cur.fail(f"stream length {slen} exceeds 4 * lanes + 2 * symbols")
    stream = cur.take(slen, "rANS stream")
    rest_bits = w - bits
    need = rest_size(total, rest_bits)
    if native and _exponent_native is not None:  # checks the rest's length first, as 8.7 allows
        if cur.left != need:
            raise cur.fail(f"{cur.left} bytes of rest fields; {need} expected")
        return _decode_native(stream, lanes, segs, split, tables, cur.take(need, "rest fields"), w, shift, out)
    layout = _Layout(segs, split)
    entries = rans.decode(stream, total, lanes, tables, layout.table_ids)
    if cur.left != need:
        raise cur.fail(f"{cur.left} bytes of rest fields; {need} expected")
    rest = unpack_rest(cur.take(need, "rest fields"), total, rest_bits)
    sym = tables.symbol.take(entries)
    sym <<= np.uint32(shift)
    sym |= rest & np.uint32((1 << shift) - 1)
    rest >>= np.uint32(shift)
    rest <<= np.uint32(w - 1)
    sym |= rest
    if out is None:
        return sym.astype(np.dtype(uint_dtype(w)).newbyteorder("<"))
    out[:] = sym
    return out


def _decode_native(stream: memoryview, lanes: int, segs: list[tuple[int, int, int]], maps: list[np.ndarray],
                   tables: rans.Tables, rest: memoryview, w: int, shift: int, out: np.ndarray | None) -> np.ndarray:
    """decode_exponent's stream and rest fields through the compiled decoder."""
    assert _exponent_native is not None
    rans.initial_states(stream, lanes)
    total = sum(n for n, _, _ in segs)
    if out is None:
        out = np.empty(total, np.dtype(uint_dtype(w)).newbyteorder("<"))
    err = _exponent_native.decode(
        stream, lanes, np.array([n for n, _, _ in segs], np.int64), np.array([r for _, r, _ in segs], np.int64),
        first_tables(segs), np.array([k > 1 for _, _, k in segs], np.uint8), np.concatenate([np.zeros(0, np.uint8), *maps]),
        tables.first, tables.symbol, tables.freq, rest, shift, w, out)
    if err:
        raise FormatError(rans.STREAM_ERRORS[err], "E_SECTION_CONTENT")
    b1 = (1 + shift) % 8
    if b1 and total % 8 and int.from_bytes(rest[len(rest) - b1 :], "little") >> (b1 * (total % 8)):
        raise FormatError("exponent payload: padding bits of the rest fields are not zero", "E_SECTION_CONTENT")
    return out

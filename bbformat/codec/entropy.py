"""The entropy stage: payload codec 2 ("planes", SPEC.md 8.6), and the choice among codecs.

Bits-back removes the redundancy of the rotational symmetry; what is left in the final
stack is float data whose top byte (sign and exponent) has low entropy. Codec 2 splits the
symbols into byte planes; the top plane is coded per segment of the stack (a tensor's
surviving prefix, or a block of eigenvalues) and, inside a segment, per context
(row class x column class), each group as one zstd frame or raw. Lower planes are one
group each. The reader needs no model: contexts come from class maps stored in the section.
"""
from __future__ import annotations

import numpy as np

from ..bytecursor import ByteCursor
from ..constants import ENTROPY_MODES, MAX_PLANES_CLASSES, MAX_PLANES_SEGMENTS, Codec, OpKind
from ..errors import FormatError, LimitError, check_choice
from ..zstdframe import PLANES_LEVEL, Buffer, Compressor, compressor, decompress, frame_content_size
from . import native
from .dtypes import uint_dtype
from ..container.program import BlockProgram
from .varint import encode_group, encode_varint

SMALL_GROUP = 64  # groups up to this size are stored raw without trying zstd
UNPERMUTE_BYTES = 1 << 22  # the decoder un-permutes a top plane in pieces of about this size
CLASS_CHOICES = (1, 4)  # classes per axis the encoder tries for each segment
MIN_CONTEXT_SEGMENT = 4096  # below this many symbols a class map costs more than it saves

Segment = tuple[int, int, int]  # (symbols, row length, classes per axis)


# ----------------------------------------------------------------------------- encoder


def payload_segments(program: BlockProgram) -> list[tuple[int, int]]:
    """(symbols, row length) of each run of the final stack, bottom first: the surviving
    prefix of every pushed tensor (rows = its last dimension) and every site's eigenvalues."""
    w = program.symbol_bits
    runs: list[list[int]] = []
    for op in program.ops:
        if op.kind == OpKind.PUSH:
            t = program.tensors[op.index]
            n = t.symbols(w)
            if n:
                per = n // t.numel
                runs.append([n, (t.shape[-1] if t.shape else 1) * per])
            continue
        s = program.sites[op.index]
        if s.plain:
            continue
        k = s.n_pop
        while k:
            take = min(k, runs[-1][0])
            runs[-1][0] -= take
            k -= take
            if runs[-1][0] == 0:
                runs.pop()
        runs.append([s.n_mu, s.n_mu])
    out = [(n, min(r, n)) for n, r in runs if n]
    assert sum(n for n, _ in out) == program.payload_symbols()
    return out


def rank_classes(score: np.ndarray, k: int) -> np.ndarray:
    """Equal-count classes 0..k-1 by ascending score (ties by position: deterministic)."""
    order = np.argsort(score, kind="stable")
    cls = np.empty(score.size, np.uint8)
    cls[order] = (np.arange(score.size, dtype=np.int64) * k // max(score.size, 1)).astype(np.uint8)
    return cls


def _segment_top(top: np.ndarray, r: int, k: int, z: Compressor) -> tuple[bytes, bytes]:
    """(class-map bytes, groups) of one segment's top plane with k classes per axis."""
    n = top.size
    if k == 1:
        return b"", encode_group(top.tobytes(), z, SMALL_GROUP)
    rows = -(-n // r)
    mag = np.zeros(rows * r, np.uint8)
    mag[:n] = top & 0x7F  # sign dropped: the exponent's high bits order the magnitudes
    grid = mag.reshape(rows, r)  # summed in float64 below: exact integers, a byte per symbol held
    full, tail = divmod(n, r)
    per_row = np.full(rows, float(r))
    per_row[full:] = float(tail or r)
    per_col = np.full(r, float(full)) + (np.arange(r) < tail)
    row_cls = rank_classes(grid.sum(1, dtype=np.float64) / per_row, k)
    col_cls = rank_classes(grid.sum(0, dtype=np.float64) / np.maximum(per_col, 1.0), k)
    # Context a*k+b holds its symbols in position order: the full rows of class a (in order)
    # against the columns of class b, then the tail row's class-b columns if its class is a.
    # So the full rows are permuted once, rows then columns, and each context is a block.
    rho, pi = np.argsort(row_cls[:full], kind="stable"), np.argsort(col_cls, kind="stable")
    block = top[: full * r].reshape(full, r)[rho][:, pi]
    r0 = np.concatenate(([0], np.cumsum(np.bincount(row_cls[:full], minlength=k))))
    c0 = np.concatenate(([0], np.cumsum(np.bincount(col_cls, minlength=k))))
    tail_order = np.argsort(col_cls[:tail], kind="stable")
    tail_sorted = top[full * r :][tail_order]
    t0 = np.concatenate(([0], np.cumsum(np.bincount(col_cls[:tail], minlength=k))))
    tail_cls = int(row_cls[full]) if tail else -1
    parts = []
    for a in range(k):
        for b in range(k):
            part = block[r0[a] : r0[a + 1], c0[b] : c0[b + 1]].tobytes()
            if a == tail_cls:
                part += tail_sorted[t0[b] : t0[b + 1]].tobytes()
            parts.append(encode_group(part, z, SMALL_GROUP))
    return row_cls.tobytes() + col_cls.tobytes(), b"".join(parts)


def encode_planes(symbols: np.ndarray, symbol_bits: int, runs: list[tuple[int, int]], limit: int | None = None) -> bytes | None:
    """Codec 2 bytes for a payload (deterministic: per segment, the smallest of CLASS_CHOICES).
    limit: None as soon as the bytes are known to be more than `limit` (the lower planes are
    coded first, then the top plane's segments; what is coded only grows), else the same bytes."""
    z = compressor(PLANES_LEVEL)
    sym = np.asarray(symbols).astype(uint_dtype(symbol_bits), copy=False)
    lower = [encode_group(((sym >> (8 * b)) & 0xFF).astype(np.uint8).tobytes(), z, SMALL_GROUP) for b in range(symbol_bits // 8 - 2, -1, -1)]
    top = (sym >> (symbol_bits - 8)).astype(np.uint8)
    head = [encode_varint(len(runs))]
    maps, tops = [], []
    size = sum(map(len, lower)) + len(head[0])
    pos = 0
    for n, r in runs:
        if limit is not None and size > limit:
            return None
        best = None
        for k in CLASS_CHOICES:
            if k > 1 and n < MIN_CONTEXT_SEGMENT:
                continue
            m, g = _segment_top(top[pos : pos + n], r, k, z)
            if best is None or len(m) + len(g) < len(best[1]) + len(best[2]):
                best = (k, m, g)
        assert best is not None
        k, m, g = best
        head.append(encode_varint(n) + encode_varint(r) + bytes([k]))
        maps.append(m)
        tops.append(g)
        size += len(head[-1]) + len(g)  # the class maps are one group, maybe compressed: not counted
        pos += n
    if limit is not None and size > limit:
        return None
    return b"".join(head) + encode_group(b"".join(maps), z, SMALL_GROUP) + b"".join(tops) + b"".join(lower)


def check_entropy_mode(mode: str) -> None:
    """An entropy mode (constants.ENTROPY_MODES: `pack --entropy`), else InputError."""
    check_choice("entropy mode", mode, ENTROPY_MODES)


# ----------------------------------------------------------------------------- decoder


def take_group(cur: ByteCursor, size: int, what: str) -> np.ndarray:
    """The next group (SPEC.md 8.6, 8.7), which must decode to exactly `size` bytes."""
    codec, stored = cur.group(what)
    if codec == Codec.ZSTD:
        declared = frame_content_size(stored)
        if declared != size:
            raise FormatError(f"{cur.what}: {what} declares {declared} bytes, {size} expected", "E_SECTION_SIZE")
    elif codec != Codec.RAW:
        raise FormatError(f"{cur.what}: {what} has unknown codec {codec}", "E_CODEC")
    return np.frombuffer(decompress(stored, codec, size, size), np.uint8)


def _read_contexts(cur: ByteCursor, j: int, n: int, r: int, k: int, row_cls: np.ndarray, col_cls: np.ndarray, planes: np.ndarray,
                   pos: int) -> None:
    """The top plane of one segment (symbols pos ... pos+n-1) from its k*k context groups, into
    `planes` (the payload's symbols as a C-order uint8 array, a row of bytes per symbol). The
    full rows, sorted by class, against the columns, sorted by class, form one block per
    context: each group is copied as a block, and the grid is un-permuted into the plane by
    the compiled module (native.py), else by numpy a few rows at a time."""
    nb = planes.shape[1]
    dest = planes[pos : pos + n, nb - 1]
    full, tail = divmod(n, r)
    rc = row_cls[:full]
    rho = np.argsort(rc, kind="stable")
    pi = np.argsort(col_cls, kind="stable")
    rcount = np.bincount(rc, minlength=k)
    ccount = np.bincount(col_cls, minlength=k)
    tcount = np.bincount(col_cls[:tail], minlength=k)
    r0 = np.concatenate(([0], np.cumsum(rcount)))
    c0 = np.concatenate(([0], np.cumsum(ccount)))
    t0 = np.concatenate(([0], np.cumsum(tcount)))
    tail_cls = int(row_cls[full]) if tail else -1
    block = np.empty((full, r), np.uint8)
    tail_sorted = np.empty(tail, np.uint8)
    for a in range(k):
        for b in range(k):
            m = int(rcount[a] * ccount[b])
            extra = int(tcount[b]) if a == tail_cls else 0
            part = take_group(cur, m + extra, f"segment {j} context {a * k + b}")
            block[r0[a] : r0[a + 1], c0[b] : c0[b + 1]] = part[:m].reshape(int(rcount[a]), int(ccount[b]))
            if extra:
                tail_sorted[t0[b] : t0[b + 1]] = part[m:]
    inv_pi = np.empty(r, np.int64)
    inv_pi[pi] = np.arange(r)
    if native.compiled is not None:
        native.compiled.unpermute(block, np.ascontiguousarray(rho, np.int64), inv_pi, planes, pos * nb + nb - 1, nb)
    else:
        grid = np.lib.stride_tricks.as_strided(dest, shape=(full, r), strides=(r * dest.strides[0], dest.strides[0]))  # a view
        step = max(1, UNPERMUTE_BYTES // r)
        for i in range(0, full, step):
            grid[rho[i : i + step]] = block[i : i + step][:, inv_pi]
    if tail:
        dest[full * r :][np.argsort(col_cls[:tail], kind="stable")] = tail_sorted


def read_segment_records(cur: ByteCursor, total: int) -> list[Segment]:
    """The segment count and records of a codec-2 or codec-3 payload (SPEC.md 8.6, 8.7 checks)."""
    count = cur.varint("segment count")
    if count > MAX_PLANES_SEGMENTS:
        raise LimitError(f"{cur.what} has {count} segments; the limit is {MAX_PLANES_SEGMENTS}", "E_LIMIT_COUNT")
    if count == 0 or count > total:
        raise cur.fail(f"{count} segments for {total} symbols")
    segs: list[Segment] = []
    covered = 0
    for j in range(count):
        n = cur.varint("segment length")
        r = cur.varint("row length")
        k = cur.u8("class count")
        if n < 1 or n > total - covered:
            raise cur.fail(f"segment {j} length {n} does not fit the payload")
        if not 1 <= r <= n:
            raise cur.fail(f"segment {j} row length {r} not in 1..{n}")
        if not 1 <= k <= MAX_PLANES_CLASSES:
            raise cur.fail(f"segment {j} class count {k} not in 1..{MAX_PLANES_CLASSES}")
        covered += n
        segs.append((n, r, k))
    if covered != total:
        raise cur.fail(f"segments cover {covered} of {total} symbols")
    return segs


def read_segments(data: Buffer, total: int) -> tuple[list[Segment], int]:
    """The segment table of a codec-2 payload and the offset after it (SPEC.md 8.6 checks)."""
    cur = ByteCursor(data, "planes payload")
    return read_segment_records(cur, total), cur.pos


def decode_planes(data: Buffer, total: int, symbol_bits: int, out: np.ndarray | None = None) -> np.ndarray:
    """The payload symbols (uint16/uint32, `total` of them) from codec-2 bytes; `out`: a
    contiguous array of `total` such symbols to decode into (else a new one)."""
    segs, start = read_segments(data, total)
    cur = ByteCursor(data, "planes payload")
    cur.pos = start
    map_size = sum(-(-n // r) + r for n, r, k in segs if k > 1)
    maps = take_group(cur, map_size, "class maps")
    nb = symbol_bits // 8
    if out is None:
        out = np.empty(total, np.dtype(uint_dtype(symbol_bits)).newbyteorder("<"))
    planes = out.view(np.uint8).reshape(total, nb)  # byte b of every symbol, written in place
    pos = mpos = 0
    for j, (n, r, k) in enumerate(segs):
        if k == 1:
            planes[pos : pos + n, nb - 1] = take_group(cur, n, f"segment {j} top plane")
        else:
            rows = -(-n // r)
            row_cls, col_cls = maps[mpos : mpos + rows], maps[mpos + rows : mpos + rows + r]
            mpos += rows + r
            if (row_cls >= k).any() or (col_cls >= k).any():
                raise FormatError(f"planes payload: segment {j} has a class >= {k}", "E_SECTION_CONTENT")
            _read_contexts(cur, j, n, r, k, row_cls, col_cls, planes, pos)
        pos += n
    for b in range(nb - 2, -1, -1):
        planes[:, b] = take_group(cur, total, f"plane {b}")
    if not cur.done:
        raise FormatError("planes payload: bytes after the last group", "E_SECTION_CONTENT")
    return out

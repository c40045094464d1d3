"""Payload codec 4, "parts" (SPEC.md 8.9, format 1.5): the payload's symbols cut into parts,
each stored by a codec of its own, so that a reader decodes the parts of one block on several
cores. This module holds the byte layout (part records) and the writer's cut points; the
payload layer (codec.payload) codes and decodes the parts themselves.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..bytecursor import ByteCursor
from ..constants import MAX_PAYLOAD_PARTS, WRITER_PARTS, Codec
from ..errors import FormatError, LimitError
from ..zstdframe import Buffer
from .varint import encode_varint


class Part(NamedTuple):
    """One part as read: its codec, the payload symbols [lo, hi) it holds, its stored bytes."""

    codec: int
    lo: int
    hi: int
    stored: memoryview


def part_cuts(runs: list[tuple[int, int]], total: int, part_symbols: int, max_parts: int = WRITER_PARTS) -> list[int]:
    """The reference writer's part bounds [0, c_1, ..., total] (SPEC.md 8.9, informative):
    S = min(ceil(total / part_symbols), max_parts) parts cut at about k·total/S, each cut moved
    down to the start of a row of the run (segment) it falls in; [0, total] when S is 1."""
    parts = min(-(-total // part_symbols), max_parts)
    if parts < 2:
        return [0, total]
    starts = np.cumsum([0] + [n for n, _ in runs])
    cuts = [0]
    for k in range(1, parts):
        c = k * total // parts
        j = int(np.searchsorted(starts, c, side="right")) - 1
        r = runs[j][1]
        c = int(starts[j]) + (c - int(starts[j])) // r * r
        if c > cuts[-1]:
            cuts.append(c)
    cuts.append(total)
    return cuts


def cut_runs(runs: list[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    """The runs (symbols, row length) of payload symbols [lo, hi): each run cut at lo and hi."""
    out, start = [], 0
    for n, r in runs:
        a, b = max(start, lo), min(start + n, hi)
        if a < b:
            out.append((b - a, min(r, b - a)))
        start += n
    return out


def encode_parts(parts: list[tuple[int, int, Buffer]]) -> bytes:
    """Codec-4 bytes of parts given as (codec, symbols, stored bytes), in payload order."""
    head = [encode_varint(len(parts))]
    for codec, symbols, stored in parts:
        head.append(bytes([codec]) + encode_varint(symbols) + encode_varint(len(stored)))
    return b"".join(head) + b"".join(stored for _, _, stored in parts)


def read_parts(data: Buffer, total: int, symbol_bytes: int, codecs: tuple[int, ...]) -> list[Part]:
    """Every part record of a codec-4 payload of `total` symbols, checked in SPEC.md 8.9's
    order; `codecs`: the part codecs the file's flags allow (raw, zstd, and 2/3 with PLANES/
    EXPONENT)."""
    cur = ByteCursor(data, "parts payload")
    count = cur.varint("part count")
    if count > MAX_PAYLOAD_PARTS:
        raise LimitError(f"parts payload has {count} parts; at most {MAX_PAYLOAD_PARTS}", "E_LIMIT_COUNT")
    if not 2 <= count <= total:
        raise cur.fail(f"part count {count} not in 2..{total}")
    records, covered, stored = [], 0, 0
    for k in range(count):
        codec = cur.u8(f"part {k} codec")
        if codec not in codecs:
            raise FormatError(f"parts payload: part {k} has codec {codec}; allowed here: {', '.join(map(str, codecs))}", "E_CODEC")
        n = cur.varint(f"part {k} symbols")
        if not 1 <= n <= total - covered:
            raise cur.fail(f"part {k} holds {n} symbols; 1..{total - covered} are left")
        length = cur.varint(f"part {k} stored length")
        if length > cur.left - stored:
            raise cur.fail(f"part {k} stores {length} bytes; {cur.left - stored} are left after its record")
        if codec == Codec.RAW and length != n * symbol_bytes:
            raise FormatError(f"parts payload: raw part {k} stores {length} bytes for {n} symbols", "E_SECTION_SIZE")
        records.append((codec, covered, covered + n, length))
        covered += n
        stored += length
    if covered != total:
        raise cur.fail(f"the parts hold {covered} symbols; the payload has {total}")
    if stored != cur.left:
        raise cur.fail(f"the parts store {stored} bytes; {cur.left} follow the records")
    out = []
    for codec, lo, hi, length in records:
        out.append(Part(codec, lo, hi, cur.take(length, "part")))
    return out

"""Payload codec 4, "parts" (SPEC.md 8.9, format 1.5): the payload's symbols cut into parts,
each stored by a codec of its own, so that a reader decodes the parts of one block on several
cores. This module holds the byte layout (part records) and the writer's cut points; the
payload layer (codec.payload) codes and decodes the parts themselves.
"""
from __future__ import annotations

from functools import partial
from typing import NamedTuple

import numpy as np

from ..bytecursor import ByteCursor
from ..constants import (
    EXPONENT_FIELD,
    MAX_PAYLOAD_PARTS,
    POPULATION_BLOCK,
    POPULATION_SWITCH_BITS,
    WRITER_PARTS,
    Codec,
)
from ..errors import FormatError, LimitError
from ..zstdframe import PLANES_LEVEL, Buffer, compressor
from .runner import Runner, in_turn
from .varint import encode_varint

ESTIMATE_JOBS = 16  # stretches of blocks the estimate is costed in (the same cuts for any count)


class Part(NamedTuple):
    """One part as read: its codec, the payload symbols [lo, hi) it holds, its stored bytes."""

    codec: int
    lo: int
    hi: int
    stored: memoryview


def part_cuts(runs: list[tuple[int, int]], total: int, part_symbols: int, max_parts: int = WRITER_PARTS) -> list[int]:
    """The even part bounds [0, c_1, ..., total] (SPEC.md 8.9, informative): S = min(ceil(total
    / part_symbols), max_parts) parts cut at about k·total/S, each cut moved down to the start
    of a row of the run (segment) it falls in; [0, total] when S is 1."""
    return _even_cuts(runs, 0, total, min(-(-total // part_symbols), max_parts))


def _row_start(runs: list[tuple[int, int]], c: int) -> int:
    """Symbol c moved down to the start of the row of the run it falls in."""
    start = 0
    for n, r in runs:
        if c < start + n:
            return start + (c - start) // r * r
        start += n
    return start


def _even_cuts(runs: list[tuple[int, int]], lo: int, hi: int, parts: int) -> list[int]:
    """[lo, ..., hi]: symbols [lo, hi) cut into `parts` pieces at about lo + k·(hi−lo)/parts,
    each cut moved down to a row start (lo itself is one)."""
    cuts = [lo]
    for k in range(1, max(parts, 1)):
        c = _row_start(runs, lo + k * (hi - lo) // parts)
        if c > cuts[-1]:
            cuts.append(c)
    cuts.append(hi)
    return cuts


class Estimate(NamedTuple):
    """Estimated bits of a stretch of payload symbols under codec 2 and codec 3 (_block_costs),
    and whether an estimate block it overlaps is labelled codec 2 (_labels)."""

    planes: float
    exponent: float
    planes_block: bool


def population_cuts(sym: np.ndarray, dtype: str, runs: list[tuple[int, int]], part_symbols: int,
                    max_parts: int = WRITER_PARTS, run: Runner = in_turn) -> list[int]:
    """The reference writer's part bounds for a float payload whose parts may take codec 2 or 3
    (SPEC.md 8.9, informative): first a cut wherever the rows change from those codec 2 is
    estimated to store smaller to those codec 3 is (or back), then each stretch between such
    cuts cut evenly as part_cuts does. part_cuts' bounds when there is no change or the parts
    would pass `max_parts`. The estimate's blocks are costed through `run`: the same cuts."""
    return population_plan(sym, dtype, runs, part_symbols, max_parts, run)[0]


def population_plan(sym: np.ndarray, dtype: str, runs: list[tuple[int, int]], part_symbols: int,
                    max_parts: int = WRITER_PARTS, run: Runner = in_turn) -> tuple[list[int], list[Estimate] | None]:
    """(population_cuts' bounds, each part's Estimate), the estimates None where the payload
    makes fewer than 2 estimate blocks (under 2 * POPULATION_BLOCK symbols, or rows too long
    for two)."""
    total = len(sym)
    even = part_cuts(runs, total, part_symbols, max_parts)
    blocks = _even_cuts(runs, 0, total, total // POPULATION_BLOCK)
    if len(blocks) < 3:
        return even, None
    two, three = _block_costs(sym, dtype, blocks, run)
    labels = _labels(two, three)
    changes = [b for b in range(1, len(labels)) if labels[b] != labels[b - 1]]
    cuts = even
    if changes:
        bounds = [0]
        for b in changes:  # refined cuts of neighbouring changes may cross: keep them in order
            bounds.append(max(bounds[-1], _refine(sym, dtype, runs, blocks, labels, b)))
        split = [0]
        for lo, hi in zip(bounds, bounds[1:] + [total]):
            if hi > lo:
                split += _even_cuts(runs, lo, hi, -(-(hi - lo) // part_symbols))[1:]
        cuts = split if len(split) - 1 <= max_parts else even
    at_two, at_three = _cumulative(blocks, two, cuts), _cumulative(blocks, three, cuts)
    first = np.searchsorted(blocks, cuts[:-1], "right") - 1  # the blocks each part overlaps: first[i] .. last[i]
    last = np.searchsorted(blocks, cuts[1:], "left") - 1
    twos = np.concatenate(([0], np.cumsum(np.asarray(labels) == 2)))
    return cuts, [Estimate(float(at_two[i + 1] - at_two[i]), float(at_three[i + 1] - at_three[i]),
                           bool(twos[last[i] + 1] > twos[first[i]])) for i in range(len(cuts) - 1)]


def _cumulative(blocks: list[int], costs: np.ndarray, at: list[int]) -> np.ndarray:
    """The estimated bits of symbols [0, x) for each x in `at`: the blocks' costs summed, a
    block's cost spread evenly over its symbols."""
    return np.interp(np.asarray(at, np.float64), np.asarray(blocks, np.float64), np.concatenate(([0.0], np.cumsum(costs))))


def _planes_of(sym: np.ndarray) -> np.ndarray:
    """The symbols' byte planes (codec 2's planes, SPEC.md 8.6): column b holds byte b."""
    return sym.view(np.uint8).reshape(len(sym), sym.itemsize)


def _codes_of(sym: np.ndarray, dtype: str, joined: int) -> tuple[np.ndarray, int, int]:
    """(codes, code bits, rest bits) of the symbols with `joined` mantissa bits (SPEC.md 8.7)."""
    shift, width = EXPONENT_FIELD[dtype]
    bits = width + joined
    return ((sym >> (shift - joined)) & ((1 << bits) - 1)).astype(np.intp), bits, shift + width + 1 - bits


JOINED = 3  # the most mantissa bits the estimate joins to the code (as the codec-3 writer tries)


def _entropy_bits(hist: np.ndarray) -> np.ndarray:
    """Order-0 entropy, in bits, of each row of counts times its count."""
    n = hist.sum(axis=1, keepdims=True).astype(np.float64)
    c = hist.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(c > 0, c * np.log2(n / np.where(c > 0, c, 1)), 0.0)
    return terms.sum(axis=1)  # type: ignore[no-any-return]


def _block_costs(sym: np.ndarray, dtype: str, blocks: list[int], run: Runner = in_turn) -> tuple[np.ndarray, np.ndarray]:
    """Estimated bits of each block [blocks[i], blocks[i+1]) under codec 2 (each byte plane
    zstd'd as codec 2 does, at most raw) and codec 3 (order-0 entropy of the code, for the best
    joined bits, plus the rest raw). The blocks are costed in ESTIMATE_JOBS stretches through `run`."""
    bits = EXPONENT_FIELD[dtype][1] + JOINED
    n = len(blocks) - 1
    bounds = sorted({n * j // ESTIMATE_JOBS for j in range(ESTIMATE_JOBS + 1)})
    costed = run([partial(_stretch_costs, sym, dtype, blocks[a : b + 1]) for a, b in zip(bounds, bounds[1:])])
    two = np.concatenate([t for t, _ in costed])  # population_plan passes 2 blocks or more
    codes = np.concatenate([c for _, c in costed])
    sizes = np.diff(np.asarray(blocks))
    rest = 8 * sym.itemsize - bits
    three = np.full(len(sizes), np.inf)
    for _ in range(JOINED + 1):
        three = np.minimum(three, _entropy_bits(codes) + sizes * rest)
        codes, rest = codes[:, 0::2] + codes[:, 1::2], rest + 1
    return two, three


def _stretch_costs(sym: np.ndarray, dtype: str, blocks: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(codec-2 bits, code counts) of the blocks [blocks[i], blocks[i+1]) (see _block_costs)."""
    planes = _planes_of(sym)
    shift, width = EXPONENT_FIELD[dtype]
    bits = width + JOINED
    z = compressor(PLANES_LEVEL)
    two = np.zeros(len(blocks) - 1)
    codes = np.zeros((len(blocks) - 1, 1 << bits), np.int64)
    for i, (lo, hi) in enumerate(zip(blocks, blocks[1:])):
        for b in range(sym.itemsize):
            two[i] += 8 * min(len(z.compress(planes[lo:hi, b].tobytes())), hi - lo)
        codes[i] = np.bincount((sym[lo:hi] >> (shift - JOINED)) & ((1 << bits) - 1), minlength=1 << bits)
    return two, codes


def _labels(two: np.ndarray, three: np.ndarray) -> list[int]:
    """Per block 2 or 3, the codec of the least estimated bits over all blocks, a change of codec
    between neighbouring blocks costing POPULATION_SWITCH_BITS (a Viterbi path)."""
    cost = {2: float(two[0]), 3: float(three[0])}
    back: list[dict[int, int]] = []
    for b in range(1, len(two)):
        step = {c: min((cost[p] + (0 if p == c else POPULATION_SWITCH_BITS), p) for p in (2, 3)) for c in (2, 3)}
        back.append({c: step[c][1] for c in (2, 3)})
        cost = {2: step[2][0] + float(two[b]), 3: step[3][0] + float(three[b])}
    labels = [min((2, 3), key=lambda c: (cost[c], c))]
    for choice in reversed(back):
        labels.append(choice[labels[-1]])
    return labels[::-1]


def _refine(sym: np.ndarray, dtype: str, runs: list[tuple[int, int]], blocks: list[int], labels: list[int], b: int) -> int:
    """The row start in blocks b−1 and b (the codec changes between them) where a cut leaves
    the fewest estimated bits: each side's symbols costed under a model of its own codec taken
    from the blocks of the same codec next to it (order-0 cross-entropy)."""
    lo, hi = blocks[b - 1], blocks[b + 1]
    left = _model_span(blocks, labels, b - 1, -1)
    right = _model_span(blocks, labels, b, 1)
    window = sym[lo:hi]
    cost_left = _cross_bits(window, sym[left[0] : left[1]], dtype, labels[b - 1])
    cost_right = _cross_bits(window, sym[right[0] : right[1]], dtype, labels[b])
    total = np.concatenate(([0.0], np.cumsum(cost_left))) + np.concatenate(([0.0], np.cumsum(cost_right[::-1])))[::-1]
    starts = _row_starts(runs, lo, hi)
    return lo + int(starts[int(np.argmin(total[starts]))])


def _row_starts(runs: list[tuple[int, int]], lo: int, hi: int) -> np.ndarray:
    """The row starts in [lo, hi), lo (a row start) first, as offsets from lo."""
    out, start = [], 0
    for n, r in runs:
        a, b = max(start, lo), min(start + n, hi)
        if a < b:
            first = start + -(-(a - start) // r) * r
            out.append(np.arange(first, b, r) - lo)
        start += n
    return np.concatenate(out)


def _model_span(blocks: list[int], labels: list[int], b: int, step: int) -> tuple[int, int]:
    """The symbols of block b and of up to 7 blocks of its codec beyond it (in direction
    `step`): what models that side of a change."""
    end = b
    while 0 <= end + step < len(labels) and labels[end + step] == labels[b] and abs(end + step - b) < 8:
        end += step
    first, last = min(b, end), max(b, end)
    return blocks[first], blocks[last + 1]


def _cross_bits(sym: np.ndarray, model: np.ndarray, dtype: str, codec: int) -> np.ndarray:
    """Estimated bits of each symbol of `sym` under `codec` with order-0 tables of `model`."""
    if codec == 2:
        out = np.zeros(len(sym))
        planes, refs = _planes_of(sym), _planes_of(model)
        for b in range(sym.itemsize):
            out += _log_table(np.bincount(refs[:, b], minlength=256))[planes[:, b]]
        return out
    best: np.ndarray | None = None
    for joined in range(JOINED + 1):
        codes, bits, rest = _codes_of(sym, dtype, joined)
        ref = _codes_of(model, dtype, joined)[0]
        bits_each = _log_table(np.bincount(ref, minlength=1 << bits))[codes] + rest
        if best is None or bits_each.sum() < best.sum():
            best = bits_each
    assert best is not None
    return best


def _log_table(counts: np.ndarray) -> np.ndarray:
    """−log2 of each value's probability, counts smoothed by one half."""
    c = counts.astype(np.float64) + 0.5
    return np.log2(c.sum() / c)  # type: ignore[no-any-return]


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

"""Interleaved rANS with static tables (SPEC.md 8.7): the coder of payload codec 3.

One stream codes a sequence of symbols, each with its own table. Symbol i goes through
lane i mod Q; a lane's state is a u32 in [2^16, 2^32), renormalised by 16-bit words; every
table's frequencies sum to 2^14 (P_BITS). The encoder starts every lane at 2^16 and
codes in reverse; the stream is the Q final states (u32 LE) followed by the words (u16 LE) in
the order the decoder reads them, and the decoder must end with every lane at 2^16.

`push` codes the symbols of one step into the lanes' states and `pop` undoes it (craystack's
pair); `encode` and `decode` run them over a whole sequence, vectorised over the lanes.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..constants import RANS_LOW, RANS_PRECISION_BITS
from ..errors import FormatError

P_BITS = RANS_PRECISION_BITS
M = 1 << P_BITS  # every table's total
SLOT_MASK = M - 1
STREAM_ERRORS = {  # a stream's damage, by the code the compiled decoder returns
    1: "exponent payload: a rANS stream ends early",
    2: "exponent payload: words left over in a rANS stream",
    3: "exponent payload: a rANS lane does not end at 2^16",
}


TableIds = Callable[[int, int], np.ndarray]
"""(lo, hi) -> the table of each symbol at positions lo..hi-1 (uint32)."""


def _cat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, np.uint32)


@dataclass(frozen=True)
class Tables:
    """Static tables, flattened: entry e of table t has symbol[e], freq[e], start[e] (the
    cumulative frequency before it); table t's entries are first[t]..first[t+1]-1."""

    symbol: np.ndarray  # uint32
    freq: np.ndarray  # uint32, >= 1, each table's sum is M
    start: np.ndarray  # uint32
    first: np.ndarray  # int64, len tables + 1

    @staticmethod
    def of(tables: list[tuple[np.ndarray, np.ndarray]]) -> Tables:
        """From (symbols increasing, frequencies summing to M) per table."""
        sym = [np.asarray(s, np.uint32) for s, _ in tables]
        frq = [np.asarray(f, np.uint32) for _, f in tables]
        starts = [np.concatenate(([0], np.cumsum(f, dtype=np.int64)[:-1])).astype(np.uint32) for f in frq]
        first = np.concatenate(([0], np.cumsum([len(s) for s in sym]))).astype(np.int64)
        return Tables(_cat(sym), _cat(frq), _cat(starts), first)

    @property
    def count(self) -> int:
        return len(self.first) - 1

    def lookup(self) -> np.ndarray:
        """table * M + slot -> entry (uint32): each table's frequencies tile its M slots."""
        return np.repeat(np.arange(self.freq.size, dtype=np.uint32), self.freq)

    def entry_of(self, alphabet: int) -> np.ndarray:
        """table * alphabet + symbol -> entry (int64; -1 where the symbol has no entry)."""
        out = np.full(self.count * alphabet, -1, np.int64)
        table = np.repeat(np.arange(self.count), np.diff(self.first))
        out[table * alphabet + self.symbol] = np.arange(self.freq.size)
        return out


def quantize(counts: np.ndarray, grain: int = 0) -> np.ndarray:
    """Frequencies summing to M, >= 1 exactly where counts > 0 (deterministic, integer), each a
    multiple of 2^grain (those are M >> grain units; a grain too coarse for the symbols present
    is lowered until each gets a unit)."""
    c = np.asarray(counts, np.int64)
    n = int(c.sum())
    if n == 0:
        raise ValueError("quantize: no symbols")
    while grain > 0 and int(np.count_nonzero(c)) > M >> grain:
        grain -= 1
    units = M >> grain
    f = np.where(c > 0, np.maximum(1, c * units // n), 0)
    short = units - int(f.sum())
    if short > 0:  # to the largest remainders, ties to the lower symbol
        rem = np.where(c > 0, c * units % n, -1)
        f[np.lexsort((np.arange(c.size), -rem))[:short]] += 1
    while short < 0:  # the floors of 1 overshot: take from the largest
        i = int(np.argmax(f))
        take = min(-short, int(f[i]) - 1)
        f[i] -= take
        short += take
    return f << grain


def push(x: np.ndarray, freq: np.ndarray, start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Code one step (symbol entries given by freq, start) into states x (uint64, in place).
    Returns (x, the words emitted, in the order the decoder will read them)."""
    f = freq.astype(np.uint64)
    over = x >= (f << np.uint64(32 - P_BITS))
    words = (x[over] & 0xFFFF).astype(np.uint16)
    x[over] >>= np.uint64(16)
    x[:] = ((x // f) << np.uint64(P_BITS)) + (x % f) + start
    return x, words


def pop(x: np.ndarray, keys: np.ndarray, lookup: np.ndarray, t: Tables, words: np.ndarray, pos: int) -> tuple[np.ndarray, int]:
    """Decode one step from states x (uint32, in place). keys: table * M per lane. Returns
    (the entries decoded, the next word position)."""
    slot = x & np.uint32(SLOT_MASK)
    e = lookup.take(keys + slot)
    np.right_shift(x, P_BITS, out=x)
    np.multiply(x, t.freq.take(e), out=x)
    np.add(x, slot, out=x)
    np.subtract(x, t.start.take(e), out=x)
    low = np.flatnonzero(x < RANS_LOW)
    if low.size:
        if pos + low.size > words.size:
            raise FormatError(STREAM_ERRORS[1], "E_SECTION_CONTENT")
        x[low] = (x[low] << 16) | words[pos : pos + low.size]
        pos += low.size
    return e, pos


STEPS_PER_BATCH = 64  # table ids are computed this many steps at a time


def encode(entries: Callable[[int, int], np.ndarray], n: int, lanes: int, t: Tables) -> bytes:
    """The stream of n symbols whose table entries `entries(lo, hi)` gives, through `lanes` lanes."""
    steps = -(-n // lanes)
    x = np.full(lanes, RANS_LOW, np.uint64)
    out: list[np.ndarray] = []
    for b in range((steps - 1) // STEPS_PER_BATCH * STEPS_PER_BATCH, -1, -STEPS_PER_BATCH):
        lo_b, hi_b = b * lanes, min(n, (b + STEPS_PER_BATCH) * lanes)
        e_b = entries(lo_b, hi_b)
        for k in range(min(steps, b + STEPS_PER_BATCH) - 1, b - 1, -1):
            lo, hi = k * lanes, min(n, (k + 1) * lanes)
            e = e_b[lo - lo_b : hi - lo_b]
            xs = x[: hi - lo]
            _, w = push(xs, t.freq[e], t.start[e])
            if w.size:
                out.append(w[::-1])
    words = np.concatenate(out)[::-1] if out else np.zeros(0, np.uint16)
    return x.astype("<u4").tobytes() + words.astype("<u2").tobytes()


def initial_states(stream: bytes | memoryview, lanes: int) -> np.ndarray:
    """The lanes' states a stream starts with (uint32), checking its framing."""
    if len(stream) < 4 * lanes or (len(stream) - 4 * lanes) % 2:
        raise FormatError("exponent payload: a rANS stream's length does not fit its lanes", "E_SECTION_CONTENT")
    x = np.frombuffer(stream, "<u4", lanes).astype(np.uint32)
    if (x < RANS_LOW).any():
        raise FormatError("exponent payload: a rANS lane starts below 2^16", "E_SECTION_CONTENT")
    return x


def decode(stream: bytes | memoryview, n: int, lanes: int, t: Tables, table_ids: TableIds) -> np.ndarray:
    """The n entries a stream codes (int array), checking the stream's framing."""
    x = initial_states(stream, lanes)
    words = np.frombuffer(stream, "<u2", offset=4 * lanes).astype(np.uint32)
    lookup = t.lookup()
    out = np.empty(n, np.uint32)
    pos = 0
    steps = -(-n // lanes)
    for b in range(0, steps, STEPS_PER_BATCH):
        lo_b, hi_b = b * lanes, min(n, (b + STEPS_PER_BATCH) * lanes)
        keys_b = table_ids(lo_b, hi_b).astype(np.uint32) << P_BITS
        for k in range(b, min(steps, b + STEPS_PER_BATCH)):
            lo, hi = k * lanes, min(n, (k + 1) * lanes)
            out[lo:hi], pos = pop(x[: hi - lo], keys_b[lo - lo_b : hi - lo_b], lookup, t, words, pos)
    if pos != words.size:
        raise FormatError(STREAM_ERRORS[2], "E_SECTION_CONTENT")
    if (x != RANS_LOW).any():
        raise FormatError(STREAM_ERRORS[3], "E_SECTION_CONTENT")
    return out

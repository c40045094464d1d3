"""The payload's codec, both ways (SPEC.md 8.2, 8.6, 8.7, 8.9): the writer's choice among raw,
zstd, planes (codec 2) and exponent (codec 3), cut into parts (codec 4) when the payload is
large, and the reader's dispatch of a stored payload, its parts on a thread pool."""
from __future__ import annotations

import os
import sys
import sysconfig
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import numpy as np

from ..constants import DTYPE_BITS, MAX_EXPONENT_TABLES, PART_SYMBOLS, Codec, RequiredFlag, payload_codecs
from ..container.program import BlockProgram
from ..errors import InputError, LimitError, check_count
from ..zstdframe import PAYLOAD_LEVEL, Buffer, compress, decompress
from .dtypes import uint_dtype
from .entropy import check_entropy_mode, decode_planes, encode_planes, payload_segments
from .exponent import decode_exponent, encode_exponent, table_count
from .parts import Estimate, Part, cut_runs, encode_parts, part_cuts, population_plan, read_parts
from .runner import Runner, in_turn, on_pool

DEFAULT_FLAGS = int(RequiredFlag.PLANES | RequiredFlag.EXPONENT)
# Whether a payload candidate's coding stops once it cannot be chosen (False: every candidate is
# coded whole, as before; tests compare the two).
PRUNE_CANDIDATES = True
# auto skips codec 2 on a part whose estimated codec-2 bits pass its estimated codec-3 bits by
# more than this fraction, unless an estimate block of the part is labelled codec 2 or codec 3
# cannot code the part (parts.Estimate; None: every part tries codec 2). Measured with
# tools/skip_planes.py (BENCHMARKS.md 19): of the parts codec 2 stored smaller (MiniLM fp32 and
# fp16, SmolLM2 fp16) the highest estimated ratio was 1.005; every bf16 part (SmolLM2, MiniLM,
# the 7B shape) was above 1.05, and codec 2 won none of them. 0.03 is six times the largest
# excess seen and still skips every bf16 part; 0.02 would also skip 10 of MiniLM's 17 fp32
# parts, with less room for inputs not measured.
PLANES_SKIP_MARGIN: float | None = 0.03


def part_threads(threads: int | None) -> int:
    """A reader's or writer's `threads` (how many code or decode one payload's parts, SPEC.md
    8.9): None is every CPU this process may use; anything else a whole number of at least 1."""
    if threads is None:
        try:
            return max(1, len(os.sched_getaffinity(0)))
        except AttributeError:  # pragma: no cover - not Linux
            return max(1, os.cpu_count() or 1)
    return check_count("threads", threads)


# Whether a buffer's reference count tells that nothing but the pool refers to it: CPython 3.10 to
# 3.13 with its GIL. Free-threaded builds defer counts, and 3.14 may leave a stack reference
# uncounted (borrowed), which could make a held buffer look free; there, and on other Pythons,
# every payload gets fresh memory.
COUNTS_REFERENCES = (sys.implementation.name == "cpython" and sys.version_info < (3, 14)
                     and not sysconfig.get_config_var("Py_GIL_DISABLED"))


class OutputBuffers:
    """The memory decoded payloads, read chunks and a decode's large temporaries are written
    to, reused from block to block. Fresh pages cost the kernel's zeroing, about a fifth of an
    entropy-decoding pass (BENCHMARKS.md 15) and more than widening itself (19). A buffer is
    handed out again only when nothing but this pool refers to it (its reference count), so a
    block whose payload or tensors a caller still holds keeps its memory, and nothing it holds
    is ever written. A payload takes the smallest free buffer of its size to 1/8 more (a caller
    may hold it: little to spare); scratch (`scratch`: read chunks, temporaries) the smallest
    of its size to twice it. Else a new one, added to the pool; then free buffers go back,
    smallest first, while the pool holds more than `keep` buffers or more bytes than it ever
    lent at once. So a later block of the sizes seen before gets most of its memory from the
    pool, while the free buffers it keeps sit beside the linear algebra's own arrays until the
    pass ends (release_free). A one-thread decode's peak RSS rises by 0.33 GiB on the one-layer
    Llama-2-7B shape (three chunks of different sizes) and by 0.10 GiB on six layers at hidden
    2048 (by hand, with commit 293160c's BENCHMARKS.md 19 run). A pass that ends while another runs on the same reader drops the
    free buffers that one would have reused: it costs the other pass time, never memory."""

    SLACK = 8  # a free buffer fits a payload of at least 1/SLACK less than its size
    SCRATCH = 2  # ... and scratch of at least 1/SCRATCH of its size

    def __init__(self, keep: int) -> None:
        self._keep = keep if COUNTS_REFERENCES else 0
        self._bufs: list[np.ndarray] = []
        self._peak = 0  # the most bytes of its buffers lent at once
        self._lock = threading.Lock()
        self._owner: int | None = None  # the thread holding _lock

    @contextmanager
    def _held(self) -> Iterator[None]:
        with self._lock:
            self._owner = threading.get_ident()
            try:
                yield
            finally:
                self._owner = None

    def array(self, total: int, dtype: np.dtype) -> np.ndarray:
        """An uninitialised array of `total` elements of `dtype`, for a payload."""
        nbytes = total * dtype.itemsize
        return self._take(nbytes, nbytes + nbytes // self.SLACK)[:nbytes].view(dtype)

    def scratch(self, total: int, dtype: np.dtype) -> np.ndarray:
        """An uninitialised array of `total` elements of `dtype`, for a chunk's bytes or a temporary."""
        nbytes = total * dtype.itemsize
        return self._take(nbytes, nbytes * self.SCRATCH)[:nbytes].view(dtype)

    def _take(self, nbytes: int, most: int) -> np.ndarray:
        with self._held():
            free = [i for i in range(len(self._bufs)) if sys.getrefcount(self._bufs[i]) == 2]  # the list's and the call's
            fits = [i for i in free if nbytes <= self._bufs[i].nbytes <= most]
            if fits:
                return self._bufs[min(fits, key=lambda i: self._bufs[i].nbytes)]
            buf = np.empty(nbytes, np.uint8)
            if self._keep:
                self._bufs.append(buf)
                self._peak = max(self._peak, sum(b.nbytes for b in self._bufs) - sum(self._bufs[i].nbytes for i in free))
                self._trim(free)
            return buf

    def _trim(self, free: list[int]) -> None:
        """Drops free buffers, smallest first, while the pool holds more than `keep` buffers or
        more bytes than it ever lent at once."""
        total, drop = sum(b.nbytes for b in self._bufs), set[int]()
        for i in sorted(free, key=lambda i: self._bufs[i].nbytes):
            if total <= self._peak and len(self._bufs) - len(drop) <= self._keep:
                break
            drop.add(i)
            total -= self._bufs[i].nbytes
        if len(self._bufs) - len(drop) > self._keep:  # none free: the new one stays out
            drop.add(len(self._bufs) - 1)
        self._bufs = [b for i, b in enumerate(self._bufs) if i not in drop]

    def disown(self, bufs: Sequence[np.ndarray]) -> None:
        """Lend these buffers no more and stop counting them: a caller keeps them (a loader
        adopting a block's tensors as the model's)."""
        with self._held():
            self._bufs = [b for b in self._bufs if not any(b is x for x in bufs)]

    def release_free(self) -> None:
        """Let go of the free buffers (a pass has ended: no block of it will take them); those
        a caller still holds stay counted, and come back to the pool when dropped. Skipped where
        this thread is inside the pool already: the garbage collector, run by an allocation
        there, finalising a pass left in a reference cycle (whose end calls this)."""
        if self.held_here():
            return
        with self._held():
            held = [i for i in range(len(self._bufs)) if sys.getrefcount(self._bufs[i]) > 2]  # more than the list's and the call's
            self._bufs = [self._bufs[i] for i in held]

    def held_here(self) -> bool:
        """Whether this thread is inside the pool now (taking a buffer, or releasing): then
        anything that waits for the pool's other users, as the end of a pass does, must not."""
        return self._owner == threading.get_ident()

    def clear(self) -> None:
        with self._held():
            self._bufs.clear()


class PartPool:
    """The threads that code or decode parts (SPEC.md 8.9) for one Writer or Reader, and build
    a writer's side sections and cut estimate: a pool of `threads` threads (part_threads),
    made when first needed. A reader's blocks that several workers decode side by side share
    it: while its parts run a worker waits, and at most `threads` parts run at a time. Neither
    the bytes nor the symbols depend on `threads`. After close() jobs run in turn."""

    def __init__(self, threads: int | None) -> None:
        self.threads = part_threads(threads)
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False
        self._lock = threading.Lock()
        self.buffers = OutputBuffers(2 * self.threads + 10)  # a block's chunk, payload and temporaries, and the parts'

    def runner(self) -> Runner:
        """on_pool of the pool, made now if not yet; in_turn for threads=1 or once closed."""
        if self.threads == 1:
            return in_turn
        with self._lock:
            if self._closed:
                return in_turn
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="bbformat-part")
            return on_pool(self._pool)

    def decode(self, codec: int, stored: Buffer, program: BlockProgram, flags: int) -> np.ndarray:
        """decode_payload with a parts payload's parts on the pool, into this pool's buffers (a
        PayloadDecoder)."""
        return decode_payload(codec, stored, program, flags, self.runner() if codec == Codec.PARTS else in_turn,
                              self.buffers.array)

    def close(self) -> None:
        self.buffers.clear()
        with self._lock:
            self._closed = True
            if self._pool is not None:
                self._pool.shutdown(cancel_futures=True)
                self._pool = None


def code_payload(program: BlockProgram, data: bytes, mode: str, flags: int = DEFAULT_FLAGS, run: Runner = in_turn,
                 part_symbols: int = PART_SYMBOLS) -> tuple[int, bytes]:
    """(codec, stored bytes) of a payload under an entropy mode, among the codecs the file's
    required `flags` allow (`auto`: the smallest; ties go to the lower codec number). With
    PARTS, a payload of more than `part_symbols` symbols is cut into parts (SPEC.md 8.9), and
    with `auto` also where its rows change codec, each part coded on its own (through `run`:
    the parts may be coded at the same time)."""
    check_entropy_mode(mode)
    if mode == "exponent" and not flags & RequiredFlag.EXPONENT:
        raise InputError("entropy mode 'exponent' needs format 1.3 or later")
    if not data or mode == "none":
        return Codec.RAW, data
    dtype, w8 = program.symbol_dtype, program.symbol_bits // 8
    runs = payload_segments(program)
    total = len(data) // w8
    cuts, estimates = _cuts(data, dtype, runs, mode, flags, part_symbols, run) if flags & RequiredFlag.PARTS else ([0, total], None)
    planes = [_tries_planes(e) for e in estimates] if estimates is not None else [True] * (len(cuts) - 1)
    if len(cuts) == 2:
        codec, stored = _code_symbols(data, dtype, runs, mode, flags, planes[0])
        return codec, stored if isinstance(stored, bytes) else bytes(stored)  # raw: `data` itself
    spans = list(zip(cuts[:-1], cuts[1:]))
    view = memoryview(data)
    coded = run([partial(_code_symbols, view[lo * w8 : hi * w8], dtype, cut_runs(runs, lo, hi), mode, flags, p)
                 for (lo, hi), p in zip(spans, planes)])
    parts: list[tuple[int, int, Buffer]] = []
    tables = 0
    for (lo, hi), (codec, stored) in zip(spans, coded):
        n = table_count(stored, hi - lo, dtype) if codec == Codec.EXPONENT else 0
        if tables + n > MAX_EXPONENT_TABLES:  # over the payload's table limit: another codec
            codec, stored = _code_symbols(view[lo * w8 : hi * w8], dtype, cut_runs(runs, lo, hi), mode, flags & ~RequiredFlag.EXPONENT)
            n = 0
        tables += n
        parts.append((codec, hi - lo, stored))
    if all(codec == Codec.RAW for codec, _, _ in parts):
        return Codec.RAW, data
    return Codec.PARTS, encode_parts(parts)


def _cuts(data: bytes, dtype: str, runs: list[tuple[int, int]], mode: str, flags: int, part_symbols: int,
          run: Runner = in_turn) -> tuple[list[int], list[Estimate] | None]:
    """(the part bounds, each part's estimate or None) (SPEC.md 8.9, informative): where the
    rows change codec when a part may take codec 2 or 3 (`auto`; the estimate through `run`),
    else evenly and without an estimate."""
    w8 = DTYPE_BITS[dtype] // 8
    if mode == "auto" and {Codec.PLANES, Codec.EXPONENT} <= set(payload_codecs(flags, dtype)):
        sym = np.frombuffer(data, dtype=np.dtype(uint_dtype(8 * w8)).newbyteorder("<"))
        return population_plan(sym, dtype, runs, part_symbols, run=run)
    return part_cuts(runs, len(data) // w8, part_symbols), None


def _tries_planes(e: Estimate) -> bool:
    """Whether auto codes a part with this estimate in codec 2 (PLANES_SKIP_MARGIN)."""
    return PLANES_SKIP_MARGIN is None or e.planes_block or e.planes <= e.exponent * (1 + PLANES_SKIP_MARGIN)


def _code_symbols(data: Buffer, dtype: str, runs: list[tuple[int, int]], mode: str, flags: int,
                  try_planes: bool = True) -> tuple[int, Buffer]:
    """(codec, stored bytes) of `dtype` symbols (`data`, read in place) with segments `runs`,
    one codec for all of them (`try_planes` False: not codec 2 unless codec 3 cannot be used)."""
    w = DTYPE_BITS[dtype]
    sym = np.frombuffer(data, dtype=np.dtype(uint_dtype(w)).newbyteorder("<"))
    best: tuple[int, Buffer] = (Codec.RAW, data)  # only the best so far is kept: candidates come in increasing codec number

    def offer(codec: int, coded: Buffer | None) -> None:
        """auto: keep the smallest (a tie keeps the lower codec); else the codec asked for, unless it grows the payload."""
        nonlocal best
        if coded is not None and len(coded) < (len(best[1]) if mode == "auto" else len(data)):
            best = (codec, coded)

    if mode in ("zstd", "auto"):
        offer(Codec.ZSTD, compress(data, PAYLOAD_LEVEL))
    exponent = encode_exponent(sym, dtype, runs) if mode in ("exponent", "auto") and Codec.EXPONENT in payload_codecs(flags, dtype) else None
    planes = (try_planes or exponent is None) and mode in ("planes", "auto") and bool(flags & RequiredFlag.PLANES)
    if planes:
        # codec 2 is kept only if no larger than codec 3 (a tie keeps 2) and smaller than the best so far,
        # so its coding stops as soon as it is known to be more than that (the same bytes when not)
        limit = len(best[1]) - 1 if mode == "auto" else len(data) - 1
        if mode == "auto" and exponent is not None:
            limit = min(limit, len(exponent))
        offer(Codec.PLANES, encode_planes(sym, w, runs, limit if PRUNE_CANDIDATES else None))
    offer(Codec.EXPONENT, exponent)
    return best


def part_codecs(flags: int, symbol_dtype: str = "float16") -> tuple[int, ...]:
    """The codecs a part of a codec-4 payload may use in a file with these required flags, in a
    chunk of this symbol dtype (codec 3 only on floats, SPEC.md 8.7)."""
    return tuple(c for c in payload_codecs(flags, symbol_dtype) if c != Codec.PARTS)


def decode_payload(codec: int, stored: Buffer, program: BlockProgram, flags: int = DEFAULT_FLAGS | RequiredFlag.PARTS,
                   run: Runner = in_turn, alloc: Callable[[int, np.dtype], np.ndarray] | None = None) -> np.ndarray:
    """The payload symbols of a codec-2, 3 or 4 payload (the caller checked that the file's
    `flags` allow the codec). A codec-4 payload's parts are decoded through `run`. `alloc(n,
    dtype)` gives the array they are decoded into (OutputBuffers.array; default a new one)."""
    total = program.payload_symbols()  # the descriptor's size; a reader with a budget checked the working set first
    dtype = np.dtype(uint_dtype(program.symbol_bits)).newbyteorder("<")
    new = alloc or np.empty
    if codec != Codec.PARTS:
        return _decode_into(codec, stored, program, total, new(total, dtype))
    parts = read_parts(stored, total, program.symbol_bits // 8, part_codecs(flags, program.symbol_dtype))
    tables = 0
    for k, p in enumerate(parts):  # SPEC.md 8.9: the codec-3 parts' leading fields before any part is decoded
        if p.codec == Codec.EXPONENT:
            tables += table_count(p.stored, p.hi - p.lo, program.symbol_dtype)
            if tables > MAX_EXPONENT_TABLES:
                raise LimitError(f"parts payload: its codec-3 parts 0..{k} hold {tables} tables; at most {MAX_EXPONENT_TABLES}",
                                 "E_LIMIT_COUNT")
    out = new(total, dtype)
    run([partial(_decode_into, p.codec, p.stored, program, p.hi - p.lo, out[p.lo : p.hi]) for p in parts])
    return out


def _decode_into(codec: int, stored: Buffer, program: BlockProgram, total: int, out: np.ndarray) -> np.ndarray:
    """`total` symbols of one codec into `out`: a payload, or a part of one."""
    if codec == Codec.EXPONENT:
        return decode_exponent(stored, total, program.symbol_dtype, out=out)
    if codec == Codec.PLANES:
        return decode_planes(stored, total, program.symbol_bits, out=out)
    size = total * program.symbol_bits // 8  # raw or zstd: only as a part (a whole payload of these is not passed here)
    raw = decompress(stored, codec, size, size)
    out[:] = np.frombuffer(raw, out.dtype)
    return out


__all__ = ["OutputBuffers", "Part", "PartPool", "Runner", "code_payload", "decode_payload", "in_turn", "on_pool", "part_codecs", "part_threads"]

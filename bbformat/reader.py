"""Container reader: random access from a file (footer first), or forward from a stream.

Every size and offset is checked against the file before anything is allocated.
"""
from __future__ import annotations

import os
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import BinaryIO, Iterable, Iterator

import numpy as np

from .codec.dtypes import RawTensor
from .codec import host_native, scratch
from .codec.payload import OutputBuffers, PartPool
from .codec.decoder import decode_program
from .container.program import BlockProgram, TensorEntry
from .codec.linalg import REFERENCE, Linalg, device_backend
from .codec.sections import StoredCorrector
from .constants import (
    CHUNK_FIXED_SIZE,
    CHUNK_MAGIC,
    CRC_SIZE,
    FILE_MAGIC,
    FOOTER_MAGIC,
    FOOTER_SIZE,
    HEADER_FIXED_SIZE,
    INDEX_FIXED_SIZE,
    MAGIC_SIZE,
    MIN_CHUNK_LENGTH,
    MIN_FILE_SIZE,
)
from .container import records as R
from .container.chunks import ParsedChunk, descriptor_extent, head_working_set, parse_chunk, parse_descriptor, table_extent
from .container.crc import crc32c
from .container.digest import content_crc
from .container.framing import (
    Header,
    IndexEntry,
    build_index,
    check_footer_version,
    header_length,
    parse_footer,
    parse_header,
    parse_header_fixed,
    parse_index,
)
from .errors import BBFormatError, DigestError, FormatError, InputError, IntegrityError


AUTO = "auto"
# Threads the model-level functions (unpack, verify, read_tensors, load_model) decode with.
DECODE_WORKERS = max(1, min(4, os.cpu_count() or 1))
# The most bytes a one-worker pass holds for the chunk it parses ahead (its stored bytes and
# decoded payload), "auto" for Reader(read_ahead_bytes=): 1 GiB, at most an eighth of the RAM.
READ_AHEAD_BYTES = 1 << 30


def decode_workers(workers: int | None) -> int:
    """A model-level function's `workers`: None is DECODE_WORKERS; anything else is used as given
    (iter_blocks refuses a count below 1)."""
    return DECODE_WORKERS if workers is None else workers


def physical_memory() -> int | None:
    """Bytes of RAM on this machine, or None where the OS does not say."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return None


def resolve_budget(max_block_bytes: int | str | None) -> int | None:
    """'auto' (the default): half the physical memory, so a block whose decoding could need more
    than the machine has is refused before anything is allocated; None: SPEC.md limits only."""
    if max_block_bytes == AUTO:
        mem = physical_memory()
        return None if mem is None else mem // 2  # the peak may reach 2 x the working set (SPEC.md 11.5)
    if max_block_bytes is None or (isinstance(max_block_bytes, int) and max_block_bytes > 0):
        return max_block_bytes
    raise InputError(f"max_block_bytes must be a positive integer, 'auto' or None, not {max_block_bytes!r}")


def resolve_read_ahead(read_ahead_bytes: int | str | None) -> int:
    """'auto' (the default): READ_AHEAD_BYTES, at most an eighth of the physical memory; 0 or
    None: no read-ahead; else the bytes given."""
    if read_ahead_bytes == AUTO:
        mem = physical_memory()
        return READ_AHEAD_BYTES if mem is None else min(READ_AHEAD_BYTES, mem // 8)
    if read_ahead_bytes is None:
        return 0
    if isinstance(read_ahead_bytes, int) and not isinstance(read_ahead_bytes, bool) and read_ahead_bytes >= 0:
        return read_ahead_bytes
    raise InputError(f"read_ahead_bytes must be a non-negative integer, 'auto' or None, not {read_ahead_bytes!r}")


def check_max_site_dim(max_site_dim: int | None) -> int | None:
    """None: SPEC.md's D <= 32,768. Otherwise non-PLAIN sites over it are refused (E_LIMIT_DIM)
    before anything is decompressed: the caller's bound on decode time, O(D^3) per site."""
    if max_site_dim is None or (isinstance(max_site_dim, int) and max_site_dim >= 2):
        return max_site_dim
    raise InputError(f"max_site_dim must be an integer >= 2 or None, not {max_site_dim!r}")


# Reader.hand_over gives a block's tensors away only where they fill their memory to this
# fraction: 7/8, what a pooled payload buffer may exceed its payload by (OutputBuffers.SLACK).
KEEP_FILL = (OutputBuffers.SLACK - 1, OutputBuffers.SLACK)


def memory_owner(a: np.ndarray) -> np.ndarray | None:
    """The array that owns the memory `a` views (through views and memoryviews of arrays), or
    None where that memory belongs to something else (bytes, a mapping)."""
    o: object = a
    while True:
        if isinstance(o, np.ndarray):
            if o.base is None:
                return o if o.flags.owndata else None
            o = o.base
        elif isinstance(o, memoryview):
            o = o.obj
        else:
            return None


@dataclass
class DecodedBlock:
    """exact: True when the decoded tensors match the chunk's content digest (SPEC.md 5.4), None
    when the file records none (1.0, 1.1), False only under allow_inexact. fallback: the
    reader's device missed the digest, and the block was decoded again with the reference."""

    index: int
    name: str
    tensors: dict[str, RawTensor]
    exact: bool | None = None
    fallback: bool = False
    margin: float | None = None  # with margins: the smallest site margin (SPEC.md 9), None if no site has a band section


def claim_names(seen: dict[str, int], block: DecodedBlock) -> DecodedBlock:
    """Tensor names identify the model's tensors: a name decoded by an earlier block of the
    same pass makes the file ambiguous, and the reader refuses it (SPEC.md 7.1)."""
    for name in block.tensors:
        first = seen.setdefault(name, block.index)
        if first != block.index:
            raise FormatError(f"tensor {name!r} is in chunk {first} and again in chunk {block.index}", "E_DESCRIPTOR")
    return block


def _device_decode(chunk: ParsedChunk, corrector: StoredCorrector, la: Linalg, share: bool) -> dict[str, RawTensor] | None:
    """The chunk decoded on `la` if that matches its digest, else None. A format error met on
    the way is None too: the device's numerics may have led the decoder off the file's path
    (other residual contexts), and the reference decides whether the file is at fault."""
    try:
        tensors = decode_program(chunk.program, chunk.payload, corrector, la, share)
    except FormatError:
        return None
    return tensors if content_crc(chunk.program, tensors) == chunk.content_crc else None


def _decode_or_blame_numerics(chunk: ParsedChunk, corrector: StoredCorrector, la: Linalg, share: bool) -> dict[str, RawTensor]:
    """decode_program on `la`. On a backend other than the reference, a format error in a file
    with digests is the file's only if the reference meets it too; otherwise this backend's
    numerics left the band (other residual contexts, say) and it is DigestError (E_DIGEST),
    which allow_inexact cannot pass: there are no values to return."""
    try:
        return decode_program(chunk.program, chunk.payload, corrector, la, share)
    except FormatError as exc:
        if la.is_reference or chunk.content_crc is None:
            raise
        decode_program(chunk.program, chunk.payload, corrector)  # raises if the file is at fault
        raise DigestError(f"chunk {chunk.index} ({chunk.program.name!r}): decoding on {la.name} left the file's band and met "
                          f"{exc.code} ({exc}); the reference decodes this chunk") from None


def decode_parsed(chunk: ParsedChunk, allow_inexact: bool = False, la: Linalg = REFERENCE, fallback: bool = True,
                  margins: bool = False, share: bool = False) -> DecodedBlock:
    """Decode a parsed chunk on backend `la` and check its content digest where the file
    records one: a mismatch is DigestError (E_DIGEST), or with allow_inexact a block marked
    exact=False. On any backend but the reference, a chunk that misses its digest is decoded
    again with the reference (fallback=True, the default; the block says so), so a device
    never costs exactness, only the time of the chunks it missed. margins: the block's margin
    (a 1.4 file's band sections) on backend `la`, also for a chunk that fell back: it is
    how close that backend's arithmetic came, which a missed digest makes the question.
    share: tensors may be views of the chunk's payload (decode_program)."""
    corrector = StoredCorrector(chunk.program, chunk.side, margins, digests=chunk.content_crc is not None)
    fell_back = False
    if fallback and not la.is_reference and chunk.content_crc is not None:
        tensors = _device_decode(chunk, corrector, la, share)
        if tensors is not None:
            return DecodedBlock(chunk.index, chunk.program.name, tensors, True, margin=_margin(corrector))
        la, fell_back = REFERENCE, True
        device = dict(corrector.margins)  # the device's, kept over the reference's below
    tensors = _decode_or_blame_numerics(chunk, corrector, la, share)
    if fell_back:
        corrector.margins = device
    exact = None
    if chunk.content_crc is not None:
        got = content_crc(chunk.program, tensors)
        exact = got == chunk.content_crc
        if not exact and not allow_inexact:
            margin = _margin(corrector)
            raise DigestError(f"chunk {chunk.index} ({chunk.program.name!r}) decoded to other values than the encoder's: "
                              f"content CRC32C {got:08x}, recorded {chunk.content_crc:08x} (this reader's floating point "
                              "differs beyond the file's band" + ("" if margin is None else f"; its band margin here {margin:.6g}") + ")")
    return DecodedBlock(chunk.index, chunk.program.name, tensors, exact, fell_back, _margin(corrector))


def _margin(corrector: StoredCorrector) -> float | None:
    return min(corrector.margins.values()) if corrector.margins else None


def reader_backend(la: Linalg, has_digests: bool, source: object) -> tuple[Linalg, str | None]:
    """The backend a reader decodes with, and a one-line note when it is not the one asked for:
    a file without digests (1.0, 1.1) decodes with the reference, since nothing could check
    another device's result."""
    if la.is_reference or has_digests:
        return la, None
    return REFERENCE, (f"{source}: this file records no digests of its decoded values (format 1.0/1.1), so it is decoded with "
                       f"the reference (numpy on the CPU) instead of {la.name}, where its result could not be checked")


class Reader:
    """Random-access reader over a seekable file.

    max_block_bytes bounds the declared working set of any one chunk (SPEC.md 11.5); a chunk
    over it is refused with E_LIMIT_MEMORY before its sections are decompressed. It is also
    the memory budget of iter_blocks' workers: the blocks decoded ahead are started only while
    their working sets fit in it together. max_site_dim
    bounds decode time: a non-PLAIN site with a larger D is refused with E_LIMIT_DIM.
    allow_inexact: a chunk whose decoded values miss its content digest is returned with
    exact=False instead of raising DigestError.

    device: where the linear algebra runs (codec/linalg.py device_backend: "cpu", the reference,
    by default; "cuda", "cuda:N", "torch:DEV", or a Linalg). Every chunk decoded elsewhere is
    checked against its digest and, where it misses, decoded again with the reference
    (fallback=False turns that off, for cross-reader tests). A file without digests decodes
    with the reference; `note` then says so. `linalg` is the backend in use.

    margins: each decoded block of a 1.4 file (band sections) carries its margin (DecodedBlock,
    SPEC.md 9): how close this reader's arithmetic came to rounding a value differently.

    share_payload: a decoded tensor that lies wholly in its chunk's payload is a view of it
    rather than a copy: less memory and time per block, but the payload, and the chunk it was
    read from, live as long as any of its tensors. For callers that use each block and drop it
    (verify, unpack, load_model). Views of a payload stored raw are read-only, unless
    writable_chunks: each chunk is then read into a writable mapping of its own (for callers
    that hand the tensors to torch without a copy: load_model).

    threads: how many threads decode the parts of one payload (format 1.5, SPEC.md 8.9), beside
    iter_blocks' workers, whose blocks share these threads (codec.payload.PartPool); None (the
    default) is every CPU this process may use, 1 decodes them in turn. The decoded bits do not depend on it.

    read_ahead_bytes: in a one-worker pass (iter_blocks), a thread reads and parses the next
    chunk (read, CRC32C, entropy decoding) while this one decodes the current block (the linear
    algebra, corrections, digest), when that chunk's stored bytes plus its decoded payload are at
    most this many bytes; "auto" (the default) is READ_AHEAD_BYTES, at most an eighth of the
    RAM; 0 or None reads each chunk when its turn comes. Neither the bits nor the order in which
    blocks and errors arrive depend on it."""

    def __init__(
        self, source: str | os.PathLike[str] | BinaryIO, *, max_block_bytes: int | str | None = AUTO, max_site_dim: int | None = None,
        allow_inexact: bool = False, device: str | Linalg | None = None, fallback: bool = True, margins: bool = False,
        share_payload: bool = False, writable_chunks: bool = False, threads: int | None = None,
        read_ahead_bytes: int | str | None = AUTO,
    ) -> None:
        self._parts = PartPool(threads)
        self._budget = resolve_budget(max_block_bytes)
        self._read_ahead = resolve_read_ahead(read_ahead_bytes)
        self._ahead: set[ThreadPoolExecutor] = set()  # the read-ahead threads of passes under way
        self._share = share_payload
        self._writable = writable_chunks
        self._fallback = fallback
        self._margins = margins
        asked = device_backend(device)
        self._allow_inexact = allow_inexact
        self._max_dim = check_max_site_dim(max_site_dim)
        self._lock = threading.Lock()
        if isinstance(source, (str, os.PathLike)):
            try:
                self._f: BinaryIO = open(source, "rb")
            except OSError as exc:
                raise InputError(f"cannot open {source}: {exc.strerror}") from None
            self._own = True
        else:
            self._f, self._own = source, False
        try:
            self._open()
        except OSError as exc:  # a file that opens but cannot be read (e.g. /proc/self/mem)
            self.close()
            raise InputError(f"cannot read {source if self._own else 'input'}: {exc.strerror or exc}") from None
        except BaseException:
            self.close()
            raise
        self.linalg, self.note = reader_backend(asked, self.has_digests, source if isinstance(source, (str, os.PathLike)) else "input")

    def _read_into(self, offset: int, n: int, writable: bool = True) -> memoryview:
        """_read_at into a numpy buffer from the reader's pool (not zero-filled first as a
        bytearray would be, on huge pages where numpy asks for them, and reused from chunk to
        chunk once nothing refers to it: fresh pages cost the kernel's zeroing, BENCHMARKS.md
        19). writable: arrays over it are writable, so shared tensors go to torch without a
        copy (writable_chunks); else it is read-only, as bytes would be. An anonymous mapping
        per chunk read 3-4x slower on this project's VM (BENCHMARKS.md 18)."""
        view = self._parts.buffers.scratch(n, np.dtype(np.uint8)).data
        got = 0
        if self._own and hasattr(os, "preadv"):
            while got < n:
                k = os.preadv(self._f.fileno(), [view[got:]], offset + got)
                if k <= 0:
                    break
                got += k
        else:
            with self._lock:
                self._f.seek(offset)
                while got < n:
                    k = self._f.readinto(view[got:])  # type: ignore[attr-defined]
                    if not k:
                        break
                    got += k
        if got != n:
            raise FormatError("unexpected end of file", "E_TRUNCATED")
        return view if writable else view.toreadonly()

    def _read_at(self, offset: int, n: int) -> bytes:
        if self._own and hasattr(os, "pread"):  # a file this reader opened: positional reads, no lock
            data = os.pread(self._f.fileno(), n, offset)
            while 0 < len(data) < n:  # a short read (a regular file gives one only at its end)
                part = os.pread(self._f.fileno(), n - len(data), offset + len(data))
                if not part:
                    break
                data += part
        else:
            with self._lock:  # iter_blocks(workers=N) reads from several threads
                self._f.seek(offset)
                data = self._f.read(n)
        if len(data) != n:
            raise FormatError("unexpected end of file", "E_TRUNCATED")
        return data

    def _open(self) -> None:
        self._f.seek(0, os.SEEK_END)
        size = self._f.tell()
        self.file_size = size
        if size < MAGIC_SIZE or self._read_at(0, MAGIC_SIZE) != FILE_MAGIC:
            raise FormatError("not a bbformat file (bad leading magic)", "E_MAGIC")
        if size < MIN_FILE_SIZE:
            raise FormatError("file is too short to be a container", "E_TRUNCATED")
        tail = self._read_at(size - FOOTER_SIZE, FOOTER_SIZE)
        if tail[-MAGIC_SIZE:] != FOOTER_MAGIC:
            raise FormatError("no footer magic at the end: the file is truncated or its footer is damaged", "E_TRUNCATED")
        fixed = parse_header_fixed(self._read_at(0, HEADER_FIXED_SIZE))
        hlen = header_length(fixed)
        if hlen > size - FOOTER_SIZE - INDEX_FIXED_SIZE:
            raise FormatError("header runs past the end of the file", "E_BOUNDS")
        self.header: Header = parse_header(self._read_at(0, hlen))
        footer = parse_footer(tail)
        check_footer_version(self.header, footer)
        end = size - FOOTER_SIZE
        if footer.index_offset < hlen or footer.index_length > end - footer.index_offset or footer.index_offset + footer.index_length != end:
            raise FormatError("index offset or length out of bounds", "E_BOUNDS")
        index = self._read_at(footer.index_offset, footer.index_length)
        if crc32c(index) != footer.index_crc:
            raise IntegrityError("index CRC32C mismatch", "E_CRC_INDEX")
        self.entries: list[IndexEntry] = parse_index(index, self.header.chunk_count, hlen, footer.index_offset)
        self.metadata = self.header.metadata

    def __len__(self) -> int:
        return len(self.entries)

    def read_chunk_bytes(self, i: int) -> bytes:
        """Chunk i's stored bytes (chunk_length of them, CRC included) as its index entry
        places them, unchecked: read_chunk checks them, parse_chunk can (bbformat.inspect)."""
        e = self._entry(i)
        return self._read_at(e.offset, e.length)

    def _entry(self, i: int) -> IndexEntry:
        if not 0 <= i < len(self.entries):
            raise IndexError(i)
        return self.entries[i]

    def read_chunk(self, i: int) -> ParsedChunk:
        e = self._entry(i)
        data = self._read_into(e.offset, e.length, self._writable)
        return parse_chunk(data, expected_index=i, expected_crc=e.crc, max_block_bytes=self._budget,
                           max_site_dim=self._max_dim, required_flags=self.header.required_flags, decode_payload=self._parts.decode)

    def read_program(self, i: int) -> BlockProgram:
        """Chunk i's program (its tensors, sites and ops) from its descriptor alone, without
        reading the rest of the chunk: its CRC is checked only when the chunk is decoded."""
        try:
            return self._descriptor(i)
        except FormatError:
            self.read_chunk(i)  # a damaged chunk is reported as such (E_CRC_CHUNK) ...
            raise  # ... else the descriptor itself is bad

    def _descriptor(self, i: int) -> BlockProgram:
        """Chunk i's program parsed from its descriptor's bytes alone (FormatError if it is bad)."""
        e = self._entry(i)
        off, n = descriptor_extent(self._read_at(e.offset, CHUNK_FIXED_SIZE), e.length)
        return parse_descriptor(self._read_at(e.offset + off, n), self.header.required_flags)

    def working_set(self, i: int) -> int:
        """Chunk i's declared working set (SPEC.md 11.5) from its descriptor and section table,
        read without the rest of the chunk; 0 where those cannot be read (its decode then meets
        the error, in its turn)."""
        e = self._entry(i)
        try:
            head = self._read_at(e.offset, CHUNK_FIXED_SIZE)
            d_off, d_len = descriptor_extent(head, e.length)
            t_off, t_len = table_extent(head, e.length)  # the table follows the descriptor: one read
            both = self._read_at(e.offset + d_off, t_off + t_len - d_off)
            return head_working_set(both[:d_len], both[d_len:], e.length, self.header.required_flags)
        except BBFormatError:
            return 0

    def tensor_entries(self) -> dict[str, TensorEntry]:
        """Every tensor of the container (name, dtype, shape) in chunk order, from the
        descriptors: what a writer needs before the first block is decoded. A name in two
        chunks is refused (E_DESCRIPTOR), as iter_blocks refuses it."""
        out: dict[str, TensorEntry] = {}
        for i in range(len(self.entries)):
            for t in self.read_program(i).tensors:
                if t.name in out:
                    raise FormatError(f"tensor {t.name!r} is in two chunks (the second: chunk {i})", "E_DESCRIPTOR")
                out[t.name] = t
        return out

    @property
    def has_digests(self) -> bool:
        """Whether every chunk records the digest of its decoded tensors (format 1.2, DIGESTS)."""
        return self.header.has_digests

    def decode_block(self, i: int) -> DecodedBlock:
        return self._decode_chunk(i, None)

    def _decode_chunk(self, i: int, chunk: ParsedChunk | None) -> DecodedBlock:
        """Block i, from its parsed chunk where the read-ahead thread gave one, else read here."""
        with scratch.using(self._parts.buffers.scratch), host_native.spread(self._parts.runner(), self._parts.threads):
            if chunk is None:
                chunk = self.read_chunk(i)
            return decode_parsed(chunk, self._allow_inexact, self.linalg, self._fallback, self._margins, self._share)

    def _parse_ahead(self, i: int) -> ParsedChunk | None:
        """Chunk i read and parsed on the read-ahead thread; None where it would hold more than
        the read-ahead budget, or where its descriptor cannot be read: the decoding thread then
        reads it in its turn, and meets any error there, in the usual order."""
        try:
            program = self._descriptor(i)
        except FormatError:
            return None
        held = self.entries[i].length + program.payload_symbols() * (program.symbol_bits // 8)
        if held > self._read_ahead:
            return None
        with scratch.using(self._parts.buffers.scratch):
            return self.read_chunk(i)

    def _one_worker(self, idx: list[int], seen: dict[str, int]) -> Iterator[DecodedBlock]:
        """Blocks in the order of idx on this thread, the next chunk parsed ahead on another
        (read_ahead_bytes). A parse error of chunk i is raised when block i is asked for, as
        without read-ahead; a chunk read ahead whose block is never asked for is dropped."""
        if not self._read_ahead or len(idx) < 2:
            for i in idx:
                yield claim_names(seen, self.decode_block(i))
            return
        with ThreadPoolExecutor(1, thread_name_prefix="bbformat-read-ahead") as pool:
            self._ahead.add(pool)  # close() waits for it
            nxt: Future[ParsedChunk | None] | None = pool.submit(self._parse_ahead, idx[0])
            try:
                for k, i in enumerate(idx):
                    assert nxt is not None
                    chunk = nxt.result()
                    nxt = pool.submit(self._parse_ahead, idx[k + 1]) if k + 1 < len(idx) else None
                    block = claim_names(seen, self._decode_chunk(i, chunk))
                    del chunk  # not held while the caller holds the block: its buffers go back to the pool
                    yield block
                    del block
            finally:
                if nxt is not None:
                    nxt.cancel()
                self._ahead.discard(pool)

    def iter_blocks(self, order: str = "forward", workers: int = 1) -> Iterator[DecodedBlock]:
        """Decode blocks in order, one at a time (workers=1: memory about one block, plus the
        next chunk parsed ahead within read_ahead_bytes), or with up to
        `workers` threads decoding the next blocks ahead, within the memory budget
        (max_block_bytes): a block is started only while the declared working sets (SPEC.md
        11.5) of the blocks being decoded, waiting, and the one the caller holds (until it asks
        for the next) fit in the budget together; one block is always under way. So memory is
        bounded by the budget, whatever `workers` is. When the pass ends, the reader lets go of
        the memory it kept for reuse, but for what the caller still holds.
        Chunks are independent and the linear algebra releases the GIL, so one worker's host work
        (reading, entropy decoding, corrections, digests) overlaps another's linear algebra, on
        the CPU or a device. The reference runs BLAS on one thread in every worker, so the
        decoded bits do not depend on `workers`, nor on the budget. A tensor name that an earlier block of the pass
        already gave is refused (E_DESCRIPTOR)."""
        idx = list(range(len(self.entries)))
        if order == "reverse":
            idx.reverse()
        elif order != "forward":
            raise ValueError("order must be 'forward' or 'reverse'")
        if workers < 1:
            raise InputError(f"workers must be at least 1, not {workers}")
        try:
            yield from self._one_worker(idx, {}) if workers == 1 or len(idx) < 2 else self._workers(idx, workers, {})
        finally:  # the pass is over: its free buffers are not kept beside whatever the caller does next
            self._parts.buffers.release_free()

    def _workers(self, idx: list[int], workers: int, seen: dict[str, int]) -> Iterator[DecodedBlock]:
        """Blocks in the order of idx, decoded ahead on `workers` threads within the budget (iter_blocks)."""
        # BLAS held at the decoder's count around the whole pool, so that the workers' own
        # limits never restore a larger count while another worker is decoding.
        with self.linalg.threads(), self._decode_pool(workers) as pool:
            ahead: deque[tuple[Future[DecodedBlock], int]] = deque()
            todo, held, costs = deque(idx), 0, dict[int, int]()

            def start(holding: int) -> None:
                """Submit the next blocks while a worker is free and their working sets fit."""
                nonlocal held
                while todo and len(ahead) < workers:
                    if todo[0] not in costs:  # read once, though a block may wait through several calls
                        costs[todo[0]] = self.working_set(todo[0]) if self._budget is not None else 0
                    cost = costs[todo[0]]
                    if (ahead or holding) and self._budget is not None and held + holding + cost > self._budget:
                        return
                    ahead.append((pool.submit(self.decode_block, todo.popleft()), cost))
                    held += cost

            start(0)
            while ahead:
                future, cost = ahead.popleft()
                block = future.result()
                held -= cost
                start(cost)  # the caller holds this block's memory until it asks for the next
                yield claim_names(seen, block)
                del block
                start(0)

    @contextmanager
    def _decode_pool(self, workers: int) -> Iterator[ThreadPoolExecutor]:
        """The threads of a multi-worker pass. Its end waits for the blocks under way, unless
        this thread is inside the buffer pool (the garbage collector, run by an allocation
        there, ending a pass left in a reference cycle): those blocks may be waiting for the
        pool, so they finish on their own, their results dropped, and close() waits for them
        before the file closes. Only the buffer pool's lock is known here: a collection inside
        another lock the workers need would still wait."""
        pool = ThreadPoolExecutor(workers, thread_name_prefix="bbformat-decode")
        try:
            yield pool
        finally:
            inside = self._parts.buffers.held_here()
            pool.shutdown(wait=not inside, cancel_futures=True)
            if inside:
                self._ahead.add(pool)  # close() waits for it

    def hand_over(self, block: DecodedBlock, names: Iterable[str]) -> set[str]:
        """Which of `names` (tensors of `block`) the caller may keep as they are, without a copy
        (a loader making them the model's): those lying in writable memory that the tensors
        named fill to at least KEEP_FILL of, so that keeping them pins little else. The reader
        lends that memory to no later block. Any other tensor of the block may lie in memory
        the reader reuses once the block is dropped: the caller copies it."""
        groups: dict[int, tuple[np.ndarray, list[str]]] = {}
        for name in dict.fromkeys(names):
            bits = block.tensors[name].bits
            owner = memory_owner(bits)
            if owner is None or not bits.flags.writeable or not bits.flags.c_contiguous:
                continue
            groups.setdefault(id(owner), (owner, []))[1].append(name)
        kept: list[np.ndarray] = []
        out: set[str] = set()
        for owner, group in groups.values():
            if sum(block.tensors[n].bits.nbytes for n in group) * KEEP_FILL[1] >= owner.nbytes * KEEP_FILL[0]:
                kept.append(owner)
                out.update(group)
        self._parts.buffers.disown(kept)
        return out

    def close(self) -> None:
        for pool in list(self._ahead):  # a pass left open: its read-ahead ends before the file closes
            pool.shutdown(wait=True, cancel_futures=True)
        self._parts.close()
        if self._own:
            self._f.close()

    def __enter__(self) -> "Reader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _read_exact(f: BinaryIO, n: int, what: str, prefix: bytes | bytearray = b"") -> bytearray:
    """prefix + n bytes read in bounded pieces, so a lying length cannot allocate much; the
    buffer grows in place (no second copy of a block)."""
    buf = bytearray(prefix)
    left = n
    while left:
        part = f.read(min(left, 1 << 24))
        if not part:
            raise FormatError(f"stream ends inside the {what}", "E_TRUNCATED")
        buf += part
        left -= len(part)
    return buf


class StreamReader:
    """Reads a container forward from a non-seekable stream (a pipe). The header is read and
    checked on construction (`.header`); iterating decodes each block in order, and after
    the last one checks the index and footer against what was read. Iterate once."""

    def __init__(self, f: BinaryIO, *, max_block_bytes: int | str | None = AUTO, max_site_dim: int | None = None,
                 allow_inexact: bool = False, device: str | Linalg | None = None, fallback: bool = True,
                 threads: int | None = None, margins: bool = False) -> None:
        asked = device_backend(device)
        self._margins = margins
        self._parts = PartPool(threads)
        self._f = f
        self._fallback = fallback
        self._budget = resolve_budget(max_block_bytes)
        self._max_dim = check_max_site_dim(max_site_dim)
        self._allow_inexact = allow_inexact
        fixed_bytes = _read_exact(f, HEADER_FIXED_SIZE, "header")
        self._header_length = header_length(parse_header_fixed(fixed_bytes))
        self.header: Header = parse_header(fixed_bytes + _read_exact(f, self._header_length - HEADER_FIXED_SIZE, "header"))
        self._started = False
        self.size: int | None = None  # the stream's length, once read to its end
        self.linalg, self.note = reader_backend(asked, self.header.has_digests, "stream")

    def _claim(self) -> None:
        if self._started:
            raise InputError("a StreamReader is read once")
        self._started = True

    def __iter__(self) -> Iterator[DecodedBlock]:
        self._claim()
        return self._blocks()

    def _blocks(self) -> Iterator[DecodedBlock]:
        try:
            yield from self._chunks()
        finally:
            self._parts.close()

    def raw_chunks(self) -> Iterator[bytearray]:
        """Each chunk's stored bytes in order, their CRCs unchecked (bbformat.inspect checks
        them); after the last, the index and footer are checked against what was read
        (`size` is then the stream's length). Instead of iterating: iterate once."""
        self._claim()
        return self._stored_chunks()

    def _stored_chunks(self) -> Iterator[bytearray]:
        f, pos = self._f, self._header_length
        entries: list[IndexEntry] = []
        for _ in range(self.header.chunk_count):
            head = _read_exact(f, CHUNK_FIXED_SIZE, "chunk header")
            if head[: len(CHUNK_MAGIC)] != CHUNK_MAGIC:
                raise FormatError("bad chunk magic", "E_MAGIC")
            length = R.CHUNK_FIXED.parse(head).chunk_length
            if length < MIN_CHUNK_LENGTH:
                raise FormatError("chunk length too small", "E_BOUNDS")
            data = _read_exact(f, length - CHUNK_FIXED_SIZE, "chunk", prefix=head)
            entries.append(IndexEntry(pos, length, int.from_bytes(data[-CRC_SIZE:], "little")))
            pos += length
            yield data
        self.size = self._check_tail(pos, entries)

    def _chunks(self) -> Iterator[DecodedBlock]:
        seen: dict[str, int] = {}
        for i, data in enumerate(self._stored_chunks()):
            chunk = parse_chunk(data, expected_index=i, max_block_bytes=self._budget, max_site_dim=self._max_dim,
                                required_flags=self.header.required_flags, decode_payload=self._parts.decode)
            del data  # a coded payload is decoded by now; a raw one is still held by the chunk
            block = claim_names(seen, decode_parsed(chunk, self._allow_inexact, self.linalg, self._fallback, self._margins))
            del chunk  # while the caller holds the block, keep nothing else of it
            yield block

    def _check_tail(self, pos: int, entries: list[IndexEntry]) -> int:
        """Checks the index and footer; returns the stream's length."""
        index = build_index(entries)
        got = _read_exact(self._f, len(index) + FOOTER_SIZE, "index and footer")
        if got[: len(index)] != index:
            raise FormatError("index disagrees with the chunks read", "E_INDEX")
        footer = parse_footer(got[len(index) :])
        check_footer_version(self.header, footer)
        if footer.index_offset != pos or footer.index_length != len(index) or footer.index_crc != crc32c(index):
            raise FormatError("footer disagrees with the stream", "E_INDEX")
        if self._f.read(1):
            raise FormatError("bytes after the footer", "E_TRAILING")
        return pos + len(got)


def iter_stream(f: BinaryIO, *, max_block_bytes: int | str | None = AUTO, max_site_dim: int | None = None,
                allow_inexact: bool = False, device: str | Linalg | None = None, threads: int | None = None) -> StreamReader:
    """A StreamReader on `f`: `.header` at once, then `for block in ...` in order.
    max_block_bytes, allow_inexact, device and threads as for Reader: each chunk's digest is
    checked before its block is yielded."""
    return StreamReader(f, max_block_bytes=max_block_bytes, max_site_dim=max_site_dim, allow_inexact=allow_inexact, device=device,
                        threads=threads)

"""pack's pipeline: encode a model's chunks in order and write them, with bounded memory.

The chain: chunk i's sites rotate tensors of later chunks (symmetric) and, in the paper
scheme, take canonical directions of later anchors. Three threads overlap without changing
a byte: the canonical directions of anchors no site rotates are computed CANONICAL_AHEAD
chunks ahead; chunk i is compressed and written while chunk i + 1 encodes (at most
PACK_QUEUE chunks wait); the header's metadata is compressed by the Writer on its own thread.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextvars import copy_context
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from .codec.dtypes import RawTensor
from .codec.encoder import EncodedChunk, Moments, canonical_rotation_of, encode_chunk
from .codec.layout import ChunkLayout, ModelLayout
from .codec.linalg import REFERENCE, Linalg
from .container.program import AxisRef
from .errors import InputError

# Chunks encoded ahead of the compression worker (memory: about this many chunks).
PACK_QUEUE = 1
# Chunks ahead of the encoder whose canonical directions a second thread computes (0: none).
CANONICAL_AHEAD = 2

Progress = Callable[[int, int, str], None]
TensorSource = Callable[[str], RawTensor]
Describer = Callable[[str], tuple[str, tuple[int, ...]]]  # name -> (dtype, shape), no data read
T = TypeVar("T")


class LazyTensors(Mapping[str, RawTensor]):
    """A chunk's input tensors, read from the checkpoint on each access and not kept: the encoder
    holds each only while it rotates or pushes it (a block of a 13B model is 0.5 GB).
    describe(name): a tensor's dtype and shape without reading it (encoder.tensor_entry)."""

    def __init__(self, get: TensorSource, names: Sequence[str], describe: Describer | None = None) -> None:
        self._get, self._names, self._describe = get, dict.fromkeys(names), describe

    def describe(self, name: str) -> tuple[str, tuple[int, ...]]:
        if name not in self._names:
            raise KeyError(name)
        if self._describe is None:
            t = self._get(name)
            return t.dtype, t.shape
        return self._describe(name)

    def __getitem__(self, name: str) -> RawTensor:
        if name not in self._names:
            raise KeyError(name)
        return self._get(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def input_canonical(get: TensorSource, anchor: AxisRef, la: Linalg = REFERENCE) -> np.ndarray:
    """The canonical direction of an anchor as the input holds it (no rotation applied); the
    backend's device errors as DeviceError, on whichever thread computes it."""
    with la.guard():
        return canonical_rotation_of(get(anchor.tensor), anchor.axis, la)


def independent_anchors(layout: ModelLayout) -> set[str]:
    """Anchors that no site rotates: their canonical directions depend on the input alone."""
    followers = {f.tensor for c in layout.chunks for s in c.sites for f in s.followers}
    return {s.anchor.tensor for c in layout.chunks for s in c.sites} - followers


@dataclass
class EncodeChain:
    """What one chunk hands the next: U0 per site name (`canonical`) and the rotations that
    axes of later chunks must get (`pending`)."""

    layout: ModelLayout
    get: TensorSource
    scheme: str
    tolerance: float
    moments: Moments | None = None
    band: bool = True
    progress: Progress | None = None
    bands: bool = False  # format 1.4: band sections (SPEC.md 8.8)
    la: Linalg = REFERENCE  # where the linear algebra runs
    describe: Describer | None = None  # LazyTensors' describe: dtype and shape without a read
    canonical: dict[str, np.ndarray] = field(default_factory=dict)
    pending: dict[tuple[str, int], np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.where = {n: i for i, c in enumerate(self.layout.chunks) for n in c.tensors}

    def encode(self, ci: int) -> EncodedChunk:
        """Encode layout.chunks[ci], updating `canonical` and `pending`."""
        chunk = self.layout.chunks[ci]
        local = set(chunk.tensors)
        self._take_later_canonicals(ci, local)
        incoming = {k: v for k, v in self.pending.items() if k[0] in local}
        moments = {n: m for n, m in self.moments.items() if n in local} if self.moments else None
        enc = encode_chunk(chunk, LazyTensors(self.get, chunk.tensors, self.describe), incoming, self.scheme, self.tolerance, self.canonical,
                           moments, defer=True, band=self.band, la=self.la, bands=self.bands)
        for k in incoming:
            self.pending.pop(k, None)
        for k, r in enc.outgoing.items():
            if self.where.get(k[0], -1) > ci:
                self.pending[k] = r
        for s in chunk.sites:  # a site's canonical direction is used up once its own chunk is
            self.canonical.pop(s.name, None)
        if self.progress is not None:
            self.progress(ci + 1, len(self.layout.chunks), chunk.name)
        return enc

    def _take_later_canonicals(self, ci: int, local: set[str]) -> None:
        """Paper: a later site's canonical direction rotates its followers stored in this chunk."""
        for later in self.layout.chunks[ci + 1 :]:
            for s in later.sites:
                hits = [f for f in s.followers if f.tensor in local]
                if not hits:
                    continue
                if self.scheme != "paper":
                    raise InputError(f"site {s.name} touches {hits[0].tensor}, which is stored before it")
                if s.name not in self.canonical:
                    self.canonical[s.name] = input_canonical(self.get, s.anchor, self.la)
                for f in hits:
                    self.pending[(f.tensor, f.axis)] = self.canonical[s.name]


def encode_chunks(chain: EncodeChain) -> Iterator[tuple[ChunkLayout, EncodedChunk]]:
    """Encode the chunks in order. The canonical directions of independent anchors are computed
    CANONICAL_AHEAD chunks ahead on a thread. The caller holds the backend's thread settings
    (`chain.la.threads()`; the reference: one BLAS thread) for as long as this runs."""
    layout = chain.layout
    independent = independent_anchors(layout) if CANONICAL_AHEAD > 0 else set()
    ahead: dict[str, Future[np.ndarray]] = {}

    def prefetch(pool: ThreadPoolExecutor, ci: int) -> None:
        if ci < len(layout.chunks):
            for s in layout.chunks[ci].sites:
                if s.anchor.tensor in independent and s.name not in ahead:
                    ahead[s.name] = pool.submit(copy_context().run, input_canonical, chain.get, s.anchor, chain.la)  # the caller's spread

    with ThreadPoolExecutor(1, thread_name_prefix="bbformat-canonical") as pool:
        for ci in range(CANONICAL_AHEAD):
            prefetch(pool, ci)
        for ci, chunk in enumerate(layout.chunks):
            prefetch(pool, ci + CANONICAL_AHEAD)
            for s in chunk.sites:
                fut = ahead.pop(s.name, None)  # popped either way: a future left behind would hold its D x D
                if fut is not None and s.name not in chain.canonical:
                    chain.canonical[s.name] = fut.result()
            enc = chain.encode(ci)
            yield chunk, enc
            del enc  # not held while the next chunk encodes


class BoundedWorker:
    """One worker thread fed in order, with at most `depth` tasks waiting behind the running
    one; a task's error is raised in the caller at the next submit or at drain()."""

    def __init__(self, depth: int | None = None, name: str = "bbformat-compress") -> None:
        self.depth = PACK_QUEUE if depth is None else depth
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=name)
        self._queued: deque[Future[None]] = deque()

    def submit(self, fn: Callable[..., None], *args: object) -> None:
        self._queued.append(self._pool.submit(fn, *args))
        while len(self._queued) > self.depth or (self._queued and self._queued[0].done()):
            self._queued.popleft().result()

    def drain(self) -> None:
        while self._queued:
            self._queued.popleft().result()

    def __enter__(self) -> BoundedWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

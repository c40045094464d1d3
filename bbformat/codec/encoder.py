"""Encode one chunk: plan its program, run it forwards, simulate the decoder, and
store plainly any site that does not pay for itself."""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextvars import copy_context
from dataclasses import dataclass, field
from functools import partial
from typing import NamedTuple, TypeVar

import numpy as np

from ..constants import FLOAT_DTYPES, NO_SITE, ROTATION_SCHEMES, WRITER_WIDE_SYMBOLS, OpKind, SectionKind, SiteFlag
from ..errors import InputError, check_choice
from . import rotation as rot
from .dtypes import RawTensor, bits_to_f64, f64_to_bits, f64_to_bits_into, little_endian_bytes, symbols_view, uint_dtype, wide_dtype
from ..container.program import BlockProgram, Op, SiteEntry, TensorEntry, bits_of
from .layout import ChunkLayout, SiteSpec
from .rounding import round_feedback
from .decoder import decode_program
from .linalg import REFERENCE, Array, Linalg
from .simulate import SimulatingCorrector, SiteFix
from .runner import Runner, in_turn
from .sections import Section, build_sections, build_site_sections, side_cost_bound
from .stack import SymbolStack

Rotations = dict[tuple[str, int], np.ndarray]
T = TypeVar("T")
# tensor name -> (axis, second moment E[x xᵀ] of that axis's inputs, in the input's basis)
Moments = dict[str, tuple[int, np.ndarray]]


def touched_in_scheme(site: SiteSpec, scheme: str) -> list[str]:
    """Tensors the random rotation touches: all of them (symmetric) or the anchor (paper)."""
    if scheme == "paper":
        return [site.anchor.tensor]
    return [a.tensor for a in site.touched()]


def choose_symbol_dtype(entries: list[TensorEntry]) -> str:
    """The narrowest width W of the chunk's tensors (32 when all are 64 bits wide: uint32
    symbols), and of that width the first float in push order, else the first dtype (SPEC.md
    6.2, informative): a float keeps codec 3 open to the payload."""
    narrow = min(min(bits_of(t.dtype) for t in entries), 32)
    same = [t.dtype for t in entries if bits_of(t.dtype) == narrow]
    return next((d for d in same if d in FLOAT_DTYPES), same[0] if same else WRITER_WIDE_SYMBOLS)


def check_site_dtypes(layout: ChunkLayout, entries: list[TensorEntry], sym_dtype: str) -> None:
    """Sites need float symbols and float anchors (SPEC.md 5.2): else an InputError."""
    dtypes = {e.name: e.dtype for e in entries}
    for s in layout.sites:
        if sym_dtype not in FLOAT_DTYPES or dtypes[s.anchor.tensor] not in FLOAT_DTYPES:
            raise InputError(f"chunk {layout.name!r}: site {s.name!r} needs float symbols and a float anchor, "
                             f"not {sym_dtype} and {dtypes[s.anchor.tensor]} (scheme none stores any dtype)")


def _first_touched(layout: ChunkLayout, site: SiteSpec, scheme: str) -> int:
    local = [layout.tensors.index(t) for t in touched_in_scheme(site, scheme) if t in layout.tensors]
    return min(local) if local else -1


def plan_ops(layout: ChunkLayout, scheme: str) -> list[Op]:
    """Place each site just before the first tensor of this chunk that it touches."""
    index = {n: i for i, n in enumerate(layout.tensors)}
    first: dict[int, int] = {}
    for s_idx, s in enumerate(layout.sites):
        if s.anchor.tensor not in index:
            raise InputError(f"site {s.name}: anchor {s.anchor.tensor} is not in chunk {layout.name}")
        local = [index[t] for t in touched_in_scheme(s, scheme) if t in index]
        first[s_idx] = min(local)
    ops: list[Op] = []
    for t_idx in range(len(layout.tensors)):
        for s_idx in sorted(k for k, v in first.items() if v == t_idx):
            ops.append(Op(OpKind.SITE, s_idx))
        ops.append(Op(OpKind.PUSH, t_idx))
    return ops


@dataclass
class SiteReport:
    name: str
    dim: int
    plain_reason: str | None
    gain_bits: int
    side_bytes: int
    corrected: int
    sign_bits: int
    banded: int = 0  # values in the band: stored because another reader could round them differently


@dataclass
class EncodedChunk:
    """One encoded chunk. After encode_chunk(defer=True), `sections` is complete only once
    finish() has run: the side sections of sites that pay for themselves even stored raw are
    built and compressed there, so a caller can do that zstd work on another thread."""

    program: BlockProgram
    payload: np.ndarray
    sections: list[Section]
    intended: dict[str, RawTensor]
    outgoing: Rotations
    reports: list[SiteReport] = field(default_factory=list)
    deferred: dict[int, SiteFix] = field(default_factory=dict)

    def finish(self, run: Runner = in_turn) -> list[Section]:
        """Build the deferred sites' sections (the same bytes encode_chunk(defer=False) makes),
        put them in site order and fill in their reports' side_bytes. Idempotent. The sections
        are compressed as independent jobs through `run` (a writer's part threads): same bytes."""
        if self.deferred:
            chosen = [sec for secs in build_sections(self.program, self.deferred, run).values() for sec in secs]
            built = run([sec.finish for sec in chosen])
            # the payload first, then the sites in order (a stable sort keeps each site's own order)
            self.sections = self.sections[:1] + sorted(self.sections[1:] + built, key=lambda sec: sec.site)
            _report_stored_sizes(self, list(self.deferred))
            self.deferred = {}
        return self.sections


def _report_stored_sizes(enc: EncodedChunk, sites: list[int]) -> None:
    """Each listed site's report gets the bytes its sections take as stored."""
    for i in sites:
        name = enc.program.sites[i].name
        report = next(r for r in enc.reports if r.name == name)
        report.side_bytes = sum(sec.cost for sec in enc.sections if sec.site == i)


def canonical_rotation(anchor: Array, axis: int, la: Linalg = REFERENCE) -> np.ndarray:
    """U0 with (anchor U0)^T (anchor U0) diagonal, eigenvalues ascending (Alg. 1); `anchor` is
    an array of backend `la`, U0 comes back to the host."""
    _, u0 = la.eigh(la.gram(la.axis_matrix(anchor, axis)))
    return la.host(u0)


# A 2-D tensor whose float64 copy would be larger than this is rotated and its Gram matrix
# summed in row blocks of about BLOCK_F64_BYTES, so the encoder never holds it whole in float64
# (a 50,272 x 5,120 head would need 2 x 2 GB). Encoder-only arithmetic (the decoder never
# rotates a follower, and recomputes an anchor's Gram its own way): the stored bits of such
# tensors can differ from a single matrix product's in the last place, never the format.
LARGE_F64_BYTES = 256 << 20
BLOCK_F64_BYTES = 32 << 20


def is_large(t: RawTensor) -> bool:
    return t.bits.ndim == 2 and 8 * t.bits.size > LARGE_F64_BYTES


def is_large_entry(e: TensorEntry) -> bool:
    return len(e.shape) == 2 and 8 * e.numel > LARGE_F64_BYTES


def _row_blocks(m: np.ndarray) -> range:
    return range(0, m.shape[0], max(1, BLOCK_F64_BYTES // (8 * max(1, m.shape[1]))))


def canonical_rotation_of(t: RawTensor, axis: int, la: Linalg = REFERENCE) -> np.ndarray:
    """canonical_rotation of a stored tensor; a large one's Gram is summed over row blocks (each
    block widened on a helper thread while the previous block's Gram runs)."""
    if not is_large(t):
        return canonical_rotation(la.widen(t), axis, la)
    m = rot.axis_matrix(t.bits, axis)
    g: Array = None
    step = _row_blocks(m).step
    with ThreadPoolExecutor(1, thread_name_prefix="bbformat-rows") as helper:
        for x in _ahead(helper, [partial(la.widen, RawTensor(t.dtype, m[i : i + step])) for i in _row_blocks(m)]):
            part = la.gram(x)
            if g is None:
                g = part
            else:
                g += part  # in place: the same sums as g + part, without a fresh D x D array each block
    _, u0 = la.eigh(g)
    return la.host(u0)


def rotate_rounded_blocks(t: RawTensor, axis: int, r: np.ndarray, la: Linalg = REFERENCE) -> RawTensor:
    """fp(t rotated by r on `axis`) for a large 2-D tensor, a row block of its axis matrix at a
    time. A helper thread widens the next block and rounds the last while this one's product
    runs (the same steps on the same values: the same bits), in this thread's context (a
    pack's host_native.spread)."""
    m = rot.axis_matrix(t.bits, axis)
    out = np.empty(t.bits.shape, t.bits.dtype)
    om = rot.axis_matrix(out, axis)  # a view: rows written through it land in `out`
    rows = _row_blocks(m)
    step = rows.step
    rd = la.asarray(r)
    with ThreadPoolExecutor(1, thread_name_prefix="bbformat-rows") as helper:
        rounding: Future[None] | None = None
        for i, x in zip(rows, _ahead(helper, [partial(la.widen, RawTensor(t.dtype, m[i : i + step])) for i in rows])):
            y = la.host(la.matmul(x, rd))
            if rounding is not None:
                rounding.result()
            rounding = helper.submit(copy_context().run, f64_to_bits_into, y, t.dtype, om[i : i + step])
        if rounding is not None:
            rounding.result()
    return RawTensor(t.dtype, out)


def _ahead(helper: ThreadPoolExecutor, jobs: list[Callable[[], T]]) -> Iterator[T]:
    """The jobs' results in order, each next job started on `helper` before the last result is
    used (one result held ahead). Each runs in a copy of the caller's context (host_native's
    spread, like every ContextVar, is the caller's there too)."""
    nxt = helper.submit(copy_context().run, jobs[0]) if jobs else None
    for k in range(len(jobs)):
        assert nxt is not None
        got = nxt.result()
        nxt = helper.submit(copy_context().run, jobs[k + 1]) if k + 1 < len(jobs) else None
        yield got


def _rotate(la: Linalg, x: Array, rots: list[tuple[int, np.ndarray]]) -> Array:
    for axis, r in rots:
        x = la.rotate(x, axis, la.asarray(r))
    return x


def encode_chunk(
    layout: ChunkLayout,
    tensors: Mapping[str, RawTensor],
    incoming: Rotations,
    scheme: str,
    tolerance: float,
    canonical: dict[str, np.ndarray] | None = None,
    moments: Moments | None = None,
    defer: bool = False,
    band: bool = True,
    demote: bool = True,
    la: Linalg = REFERENCE,
    bands: bool = False,
) -> EncodedChunk:
    """Encode one chunk. `tensors` may be a lazy mapping that reads a tensor on every access
    (pack's, so a block's inputs are not all held at once): each is read a few times and
    never kept. `incoming` rotates axes touched by sites of earlier chunks
    (paper: also later ones); `canonical` caches U0 per site name; `moments` switches
    rotated tensors that have one to error-feedback rounding (codec/rounding.py).

    BLAS runs on one thread here: eigenvectors of a nearly degenerate popped X depend on how
    LAPACK splits its work, so any other count would make the bytes depend on the machine's
    thread settings (tests/test_determinism.py).

    defer=True leaves the zstd work of the side sections to EncodedChunk.finish() wherever
    a bound on their raw size already shows that the site pays for itself.

    band=True (format 1.2, the default) stores every regenerated value that another correct
    reader could round differently (codec/band.py), and may put x_residuals and x_patches on
    one site (the file must set FLAG_MIXED_CORRECTIONS); band=False writes what 1.1 readers
    read, exact only under the reference numerics. bands=True (format 1.4, with band) also
    stores each rotated site's band widths (a band section, SPEC.md 8.8).

    demote=False keeps every usable site rotated even where its side information does not
    pay for itself or another reader could decide its signs differently (conformance vectors
    use it to exercise large corrections); such a file is valid but may be larger than plain.

    la: where the linear algebra runs (codec/linalg.py), the simulated decoder's included, so
    the corrections and the band are computed with that backend's numerics."""
    check_choice("scheme", scheme, ROTATION_SCHEMES)
    with la.threads(), la.guard():
        return _encode_chunk(_ChunkContext.make(layout, tensors, incoming, scheme, tolerance, canonical, moments, defer, band, la,
                                                bands and band), demote)


@dataclass
class _ChunkContext:
    """What every encoding attempt of one chunk reads: its usable sites, its inputs with the
    rotations of other chunks, and the rounding rules. Built once per chunk."""

    layout: ChunkLayout
    dropped: list[SiteSpec]  # sites with no bits source (the start of the symmetric chain)
    tensors: Mapping[str, RawTensor]
    incoming_of: dict[str, list[tuple[int, np.ndarray]]]
    entries: list[TensorEntry]
    sym_dtype: str
    ops: list[Op]
    scheme: str
    tolerance: float
    canonical: dict[str, np.ndarray]
    moments: Moments  # followed through the incoming rotations: H' = Rᵀ H R
    defer: bool
    band: bool
    la: Linalg
    bands: bool
    feedback_cache: dict[tuple[str, bytes], RawTensor] = field(default_factory=dict)

    @classmethod
    def make(cls, layout: ChunkLayout, tensors: Mapping[str, RawTensor], incoming: Rotations, scheme: str, tolerance: float,
             canonical: dict[str, np.ndarray] | None, moments: Moments | None, defer: bool, band: bool,
             la: Linalg = REFERENCE, bands: bool = False) -> "_ChunkContext":
        # A site that would have to pop before anything is pushed (the start of the
        # symmetric chain) has no bits source: it is not a usable site and is left out.
        dropped = [s for s in layout.sites if _first_touched(layout, s, scheme) == 0]
        if dropped:
            layout = ChunkLayout(layout.name, layout.tensors, tuple(s for s in layout.sites if s not in dropped))
        entries = [tensor_entry(tensors, n) for n in layout.tensors]
        incoming_of = {n: [(ax, r) for (t, ax), r in incoming.items() if t == n] for n in layout.tensors}
        check_site_dtypes(layout, entries, choose_symbol_dtype(entries))
        ctx = cls(layout, dropped, tensors, incoming_of, entries, choose_symbol_dtype(entries), plan_ops(layout, scheme), scheme,
                  tolerance, {} if canonical is None else canonical, _moments_after(moments or {}, incoming, incoming_of), defer, band, la,
                  bands)
        ctx.fill_canonical()
        return ctx

    @property
    def w(self) -> int:
        return bits_of(self.sym_dtype)

    @property
    def paper(self) -> bool:
        return self.scheme == "paper"

    def index(self, name: str) -> int:
        return self.layout.tensors.index(name)

    def base(self, name: str) -> Array:
        """The input in float64 with the other chunks' rotations applied (a backend array), made
        when needed and dropped after (a block's float64 copy whole would be 4x its fp16 size)."""
        return _rotate(self.la, self.la.widen(self.tensors[name]), self.incoming_of[name])

    def fill_canonical(self) -> None:
        for s in self.layout.sites:
            if s.name not in self.canonical:
                a = s.anchor.tensor
                self.canonical[s.name] = canonical_rotation(self.base(a), s.anchor.axis, self.la) if self.incoming_of[a] else \
                    canonical_rotation_of(self.tensors[a], s.anchor.axis, self.la)


def tensor_entry(tensors: Mapping[str, RawTensor], name: str) -> TensorEntry:
    """A tensor's record. From the mapping's describe(name) where it has one (packing's
    LazyTensors: each access reads the tensor, which a record does not need)."""
    describe = getattr(tensors, "describe", None)
    if describe is not None:
        dtype, shape = describe(name)
        return TensorEntry(name, dtype, tuple(shape))
    t = tensors[name]
    return TensorEntry(name, t.dtype, t.shape)


def _moments_after(moments: Moments, incoming: Rotations, incoming_of: dict[str, list[tuple[int, np.ndarray]]]) -> Moments:
    """Second moments follow their axis through the incoming rotations: H' = Rᵀ H R."""
    out: Moments = {}
    for n, (ax, h) in moments.items():
        if n in incoming_of:
            for (t, rax), r in incoming.items():
                if t == n and rax == ax:
                    h = r.T @ h @ r
            out[n] = (ax, h)
    return out


class _Attempt(NamedTuple):
    enc: EncodedChunk
    newly_plain: dict[int, str]  # sites this attempt found must be stored plainly, with why


def _encode_chunk(ctx: _ChunkContext, demote: bool) -> EncodedChunk:
    """Encode until no attempt finds another site to store plainly (at most one per site)."""
    plain: dict[int, str] = {}
    for _ in range(len(ctx.layout.sites) + 1):
        attempt = _encode_once(ctx, plain)
        newly = {k: v for k, v in attempt.newly_plain.items() if k not in plain} if demote else {}
        if not newly:
            enc = attempt.enc
            no_source = "no bits source: start of the symmetric chain"
            enc.reports = [SiteReport(s.name, s.dim, no_source, 0, 0, 0, 0) for s in ctx.dropped] + enc.reports
            return enc
        plain.update(newly)
    raise AssertionError("site planning did not converge")


def round_rotated(name: str, x: np.ndarray, rots: list[tuple[int, np.ndarray]], dtype: str, moments: Moments,
                  cache: dict[tuple[str, bytes], RawTensor]) -> RawTensor:
    """The rotated tensor x in its dtype: with error feedback along the axis that has a
    second moment in `moments`, else nearest. `rots` are the rotations x has had in this
    chunk; the feedback rounding is cached under them."""
    if name not in moments:
        return RawTensor.from_f64(x, dtype, keep_order=True)  # pushed as symbols: any order does
    ax, h = moments[name]
    # the rounding depends on every rotation of the tensor, on any axis
    key = (name, b"".join(a.to_bytes(1, "little") + np.ascontiguousarray(r).tobytes() for a, r in rots))
    if key not in cache:
        for a, r in rots:
            if a == ax:
                h = r.T @ h @ r
        cache[key] = RawTensor(dtype, round_feedback(x, ax, h, dtype))
    return cache[key]


def _eigen_of_top(la: Linalg, stack: SymbolStack, n_pop: int, dim: int, sym_dtype: str, w: int) -> tuple[str | None, np.ndarray, np.ndarray]:
    """(reason the site cannot be used or None, eigenvalues as stored, eigenvectors; on the
    host) of the symmetric matrix the top n_pop symbols make; the matrix itself is dropped here."""
    xv = bits_to_f64(stack.peek(n_pop), sym_dtype)
    if not np.all(np.isfinite(xv)):
        return "non-finite popped values", np.zeros(0), np.zeros(0)
    mu_d, v_d = la.eigh(la.from_block(xv, dim))
    mu, v = la.host(mu_d), la.host(v_d)
    mu_w = mu.astype(wide_dtype(w))
    if not np.all(np.isfinite(mu_w)):
        return "eigenvalues overflow", mu_w, v
    return None, mu_w, v


@dataclass
class _Forward:
    """One forward run of a chunk's program: the stack, and per site the rotations chosen
    and the truth the decoder's simulation is checked against."""

    stack: SymbolStack
    plain: dict[int, str]  # site -> why it is stored plainly
    anchor_rot: dict[int, np.ndarray] = field(default_factory=dict)
    follower_rot: dict[int, np.ndarray | None] = field(default_factory=dict)
    paper_q: dict[int, np.ndarray] = field(default_factory=dict)  # paper: the random rotation of the anchor
    true_x: dict[int, np.ndarray] = field(default_factory=dict)
    true_signs: dict[int, np.ndarray] = field(default_factory=dict)
    true_anchor: dict[int, RawTensor] = field(default_factory=dict)


def _final_value(ctx: _ChunkContext, fw: _Forward, name: str) -> RawTensor:
    """Tensor `name` as pushed: every rotation of this chunk's sites (and the incoming ones)
    applied and rounded; in the paper scheme an anchor also gets its random rotation Q."""
    entry = ctx.entries[ctx.index(name)]
    rots: list[tuple[int, np.ndarray]] = []
    q: tuple[int, int] | None = None
    for s_idx, s in enumerate(ctx.layout.sites):
        for a in s.touched():
            if a.tensor != name:
                continue
            if a == s.anchor:
                if s_idx in fw.anchor_rot:
                    rots.append((a.axis, fw.anchor_rot[s_idx]))
                if s_idx in fw.paper_q:
                    q = (s_idx, a.axis)
            elif (r := fw.follower_rot.get(s_idx)) is not None:
                rots.append((a.axis, r))
    every = ctx.incoming_of[name] + rots
    if len(every) == 1 and name not in ctx.moments and is_large_entry(entry):
        t = rotate_rounded_blocks(ctx.tensors[name], *every[0], ctx.la)
    elif every:
        x = ctx.la.host(_rotate(ctx.la, ctx.base(name), rots))
        t = round_rotated(name, x, rots, entry.dtype, ctx.moments, ctx.feedback_cache)
    else:
        t = ctx.tensors[name]
    if q is not None:
        # paper: W' = fp(W_c Q) with the canonical W_c = fp(W U0) and Q = V (Alg. 1, 5)
        fw.true_anchor[q[0]] = t
        la = ctx.la
        t = RawTensor.from_f64(la.host(la.rotate(la.widen(t), q[1], la.asarray(fw.paper_q[q[0]]))), entry.dtype)
    return t


def _run_forward(ctx: _ChunkContext, plain: dict[int, str]) -> _Forward:
    """Run the ops in order: push each tensor as rotated, and at each usable site pop the
    block X, push its eigenvalues and choose the rotation from X's eigenvectors (Alg. 1-3)."""
    w = ctx.w
    # room for every push up front: a doubling stack would hold up to 3x the block at a regrowth
    capacity = sum(e.numel * bits_of(e.dtype) // w for e in ctx.entries) + sum(4 * s.dim for s in ctx.layout.sites)
    fw = _Forward(SymbolStack(w, capacity=capacity), dict(plain))
    if ctx.paper:
        # Alg. 1: the canonical direction is fixed before anything is pushed; the random
        # rotation Q touches only the anchor, which is pushed after its site.
        for s_idx, s in enumerate(ctx.layout.sites):
            fw.anchor_rot[s_idx] = fw.follower_rot[s_idx] = ctx.canonical[s.name]
    for op in ctx.ops:
        if op.kind == OpKind.PUSH:
            fw.stack.push(symbols_view(_final_value(ctx, fw, ctx.layout.tensors[op.index]), w), adopt=True)  # never changed after
        else:
            _forward_site(ctx, fw, op.index)
    return fw


def _forward_site(ctx: _ChunkContext, fw: _Forward, s_idx: int) -> None:
    s = ctx.layout.sites[s_idx]
    u0 = ctx.canonical[s.name]
    reason = fw.plain.get(s_idx)
    n_pop = rot.block_size(s.dim)
    if reason is None and len(fw.stack) < n_pop:
        reason = "no bits source" if len(fw.stack) == 0 else "too few symbols below"
    if reason is None:
        reason, mu_w, v = _eigen_of_top(ctx.la, fw.stack, n_pop, s.dim, ctx.sym_dtype, ctx.w)
    if reason is not None:
        fw.plain[s_idx] = reason
        # paper: the canonical direction is applied regardless (Alg. 1)
        if ctx.paper:
            fw.anchor_rot[s_idx] = fw.follower_rot[s_idx] = u0
        else:
            fw.anchor_rot.pop(s_idx, None)
            fw.follower_rot[s_idx] = None
        return
    fw.true_x[s_idx] = fw.stack.pop(n_pop)
    fw.stack.push(np.frombuffer(mu_w.tobytes(), dtype=uint_dtype(ctx.w)))
    if ctx.paper:
        fw.true_signs[s_idx] = rot.paper_signs(v)
        fw.anchor_rot[s_idx] = fw.follower_rot[s_idx] = u0
        fw.paper_q[s_idx] = v
    else:
        la = ctx.la
        fw.anchor_rot[s_idx] = fw.follower_rot[s_idx] = la.host(la.matmul(la.asarray(u0), la.asarray(v).T))


def _program(ctx: _ChunkContext, plain: dict[int, str]) -> BlockProgram:
    mode = SiteFlag.PAPER if ctx.paper else 0
    sites = [SiteEntry(s.name, s.dim, ctx.index(s.anchor.tensor), s.anchor.axis, mode | (SiteFlag.PLAIN if i in plain else 0), s.followers)
             for i, s in enumerate(ctx.layout.sites)]
    return BlockProgram(ctx.layout.name, ctx.sym_dtype, ctx.entries, sites, list(ctx.ops))


def _encode_once(ctx: _ChunkContext, plain: dict[int, str]) -> _Attempt:
    """One attempt with the given sites stored plainly: run forwards, decode with the real
    decoder (simulating the stored corrections), and judge each site by what it costs."""
    fw = _run_forward(ctx, plain)
    program = _program(ctx, fw.plain)
    # the payload's bytes once, and the symbols as a read-only view of them (not a second copy)
    payload_bytes = little_endian_bytes(fw.stack.take())
    payload = np.frombuffer(payload_bytes, dtype=np.dtype(uint_dtype(ctx.w)).newbyteorder("<")).astype(uint_dtype(ctx.w), copy=False)
    sim = SimulatingCorrector(ctx.sym_dtype, ctx.tolerance, fw.true_x, fw.true_signs, fw.true_anchor, band=ctx.band,
                              bands=ctx.bands, la=ctx.la)
    intended = decode_program(program, payload, sim, ctx.la)
    sections = [Section(SectionKind.PAYLOAD, NO_SITE, payload_bytes)]
    reports: list[SiteReport] = []
    newly: dict[int, str] = {}
    deferred: dict[int, SiteFix] = {}
    for s_idx, s in enumerate(ctx.layout.sites):
        if s_idx in fw.plain:
            reports.append(SiteReport(s.name, s.dim, fw.plain[s_idx], 0, 0, 0, 0))
            continue
        secs, report, why = _judge_site(ctx, program, s_idx, sim, deferred)
        if why is not None:
            newly.setdefault(s_idx, why)
        reports.append(report)
        sections.extend(secs)
    enc = EncodedChunk(program, payload, [sec.finish(sec.kind != SectionKind.PAYLOAD) for sec in sections], intended,
                       _outgoing(ctx, fw), reports, deferred)
    _report_stored_sizes(enc, [i for i in range(len(ctx.layout.sites)) if i not in fw.plain and i not in deferred])
    return _Attempt(enc, newly)


def _judge_site(ctx: _ChunkContext, program: BlockProgram, s_idx: int, sim: SimulatingCorrector,
                deferred: dict[int, SiteFix]) -> tuple[list[Section], SiteReport, str | None]:
    """One rotated site's side sections (or its deferral), its report, and why it must be
    stored plainly (unsafe, or side information that does not pay), or None."""
    s = ctx.layout.sites[s_idx]
    gain = (rot.block_size(s.dim) - 2 * s.dim) * ctx.w
    why = sim.unsafe.get(s_idx)
    fix = sim.fixes.get(s_idx)
    if ctx.defer and fix is not None and side_cost_bound(program, s_idx, fix) * 8 < gain:
        deferred[s_idx] = fix  # pays even stored raw: sections built in finish()
        secs: list[Section] = []
        side = 0
    else:
        secs = build_site_sections(program, s_idx, fix) if fix is not None else []
        side = sum(c.cost for c in secs)
    corrected = int(fix.x_mask.sum()) if fix is not None and fix.x_mask is not None else 0
    if fix is not None and fix.anchor_mask is not None:
        corrected += int(fix.anchor_mask.sum())
    if why is None and side * 8 >= gain:
        why = f"side information ({side} B) would not pay for the {gain // 8} B saved"
    report = SiteReport(s.name, s.dim, None, gain, side, corrected, s.dim if ctx.paper else 0, fix.banded if fix is not None else 0)
    return secs, report, why


def _outgoing(ctx: _ChunkContext, fw: _Forward) -> Rotations:
    """The rotations this chunk's sites give to followers in other chunks."""
    out: Rotations = {}
    local = set(ctx.layout.tensors)
    for s_idx, s in enumerate(ctx.layout.sites):
        r = fw.follower_rot.get(s_idx)
        if r is None:
            continue
        for f in s.followers:
            if f.tensor not in local:
                out[(f.tensor, f.axis)] = r
    return out

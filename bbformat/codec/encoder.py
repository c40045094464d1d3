"""Encode one chunk: plan its program, run it forwards, simulate the decoder, and
store plainly any site that does not pay for itself."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError
from . import rotation as rot
from .dtypes import RawTensor, bits_of, bits_to_f64, f64_to_bits, little_endian_bytes, symbols_view, uint_dtype, wide_dtype
from .layout import ChunkLayout, SiteSpec
from .rounding import round_feedback
from .program import (
    OP_PUSH,
    OP_SITE,
    SITE_PAPER,
    SITE_PLAIN,
    BlockProgram,
    FollowerEntry,
    Op,
    SimulatingCorrector,
    SiteEntry,
    SiteFix,
    TensorEntry,
    decode_program,
)
from .sections import KIND_PAYLOAD, NO_SITE, Section, build_site_sections, side_cost_bound
from .stack import SymbolStack

SCHEMES = ("paper", "symmetric")
Rotations = dict[tuple[str, int], np.ndarray]
# tensor name -> (axis, second moment E[x xᵀ] of that axis's inputs, in the input's basis)
Moments = dict[str, tuple[int, np.ndarray]]


def touched_in_scheme(site: SiteSpec, scheme: str) -> list[str]:
    """Tensors the random rotation touches: all of them (symmetric) or the anchor (paper)."""
    if scheme == "paper":
        return [site.anchor.tensor]
    return [a.tensor for a in site.touched()]


def choose_symbol_dtype(entries: list[TensorEntry]) -> str:
    narrow = min(bits_of(t.dtype) for t in entries)
    return next(t.dtype for t in entries if bits_of(t.dtype) == narrow)


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
            ops.append(Op(OP_SITE, s_idx))
        ops.append(Op(OP_PUSH, t_idx))
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

    def finish(self) -> list[Section]:
        """Build the deferred sites' sections (the same bytes encode_chunk(defer=False) makes),
        put them in site order and fill in their reports' side_bytes. Idempotent."""
        if self.deferred:
            built = [sec.finish() for site, fix in self.deferred.items() for sec in build_site_sections(self.program, site, fix)]
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


def canonical_rotation(anchor: np.ndarray, axis: int) -> np.ndarray:
    """U0 with (anchor U0)^T (anchor U0) diagonal, eigenvalues ascending (Alg. 1)."""
    _, u0 = rot.eigh(rot.gram(rot.axis_matrix(anchor, axis)))
    return u0


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


def canonical_rotation_of(t: RawTensor, axis: int) -> np.ndarray:
    """canonical_rotation of a stored tensor; a large one's Gram is summed over row blocks."""
    if not is_large(t):
        return canonical_rotation(t.to_f64(), axis)
    m = rot.axis_matrix(t.bits, axis)
    g = np.zeros((m.shape[1], m.shape[1]))
    step = _row_blocks(m).step
    for i in _row_blocks(m):
        block = bits_to_f64(m[i : i + step], t.dtype)
        g += rot.gram(block)
    _, u0 = rot.eigh(g)
    return u0


def rotate_rounded_blocks(t: RawTensor, axis: int, r: np.ndarray) -> RawTensor:
    """fp(t rotated by r on `axis`) for a large 2-D tensor, a row block of its axis matrix at a time."""
    m = rot.axis_matrix(t.bits, axis)
    out = np.empty(t.bits.shape, t.bits.dtype)
    om = rot.axis_matrix(out, axis)  # a view: rows written through it land in `out`
    step = _row_blocks(m).step
    for i in _row_blocks(m):
        om[i : i + step] = f64_to_bits(bits_to_f64(m[i : i + step], t.dtype) @ r, t.dtype)
    return RawTensor(t.dtype, out)


def _rotate(x: np.ndarray, rots: list[tuple[int, np.ndarray]]) -> np.ndarray:
    for axis, r in rots:
        x = rot.rotate_axis(x, axis, r)
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
    read, exact only under the reference numerics."""
    with rot.one_blas_thread():
        return _encode_chunk(layout, tensors, incoming, scheme, tolerance, canonical, moments, defer, band)


def _encode_chunk(
    layout: ChunkLayout,
    tensors: Mapping[str, RawTensor],
    incoming: Rotations,
    scheme: str,
    tolerance: float,
    canonical: dict[str, np.ndarray] | None,
    moments: Moments | None,
    defer: bool,
    band: bool,
) -> EncodedChunk:
    if scheme not in SCHEMES:
        raise InputError(f"unknown scheme {scheme!r}")
    canonical = {} if canonical is None else canonical
    # A site that would have to pop before anything is pushed (the start of the
    # symmetric chain) has no bits source: it is not a usable site and is left out.
    dropped = [s for s in layout.sites if _first_touched(layout, s, scheme) == 0]
    if dropped:
        layout = ChunkLayout(layout.name, layout.tensors, tuple(s for s in layout.sites if s not in dropped))
    entries = [TensorEntry(n, t.dtype, t.shape) for n in layout.tensors for t in (tensors[n],)]
    sym_dtype = choose_symbol_dtype(entries)
    w = bits_of(sym_dtype)
    ops = plan_ops(layout, scheme)
    index = {n: i for i, n in enumerate(layout.tensors)}

    # Inputs in float64 with rotations from other chunks already applied, made when needed
    # and dropped after (a block's float64 copy whole would be 4x its fp16 size).
    incoming_of = {n: [(ax, r) for (t, ax), r in incoming.items() if t == n] for n in layout.tensors}
    rotated_in = {n for n, rots in incoming_of.items() if rots}

    def base(n: str) -> np.ndarray:
        return _rotate(tensors[n].to_f64(), incoming_of[n])

    # Second moments follow their axis through the incoming rotations: H' = Rᵀ H R.
    base_h: Moments = {}
    for n, (ax, h) in (moments or {}).items():
        if n in incoming_of:
            for (t, rax), r in incoming.items():
                if t == n and rax == ax:
                    h = r.T @ h @ r
            base_h[n] = (ax, h)
    feedback_cache: dict[tuple[str, bytes], RawTensor] = {}
    for s in layout.sites:
        if s.name not in canonical:
            a = s.anchor.tensor
            canonical[s.name] = canonical_rotation(base(a), s.anchor.axis) if a in rotated_in else \
                canonical_rotation_of(tensors[a], s.anchor.axis)

    plain: dict[int, str] = {}
    for _ in range(len(layout.sites) + 1):
        result = _encode_once(layout, tensors, base, incoming_of, ops, index, entries, sym_dtype, w, scheme, tolerance, canonical, plain,
                              base_h, feedback_cache, defer, band)
        newly = {k: v for k, v in result[1].items() if k not in plain}
        if not newly:
            enc = result[0]
            enc.reports = [SiteReport(s.name, s.dim, "no bits source: start of the symmetric chain", 0, 0, 0, 0) for s in dropped] + enc.reports
            return enc
        plain.update(newly)
    raise AssertionError("site planning did not converge")


def _rounded(name, x, rots, dtype, base_h, cache):  # type: ignore[no-untyped-def]
    """The rotated tensor in its dtype: with error feedback along the axis that has a
    second moment, else nearest."""
    if name not in base_h:
        return RawTensor.from_f64(x, dtype)
    ax, h = base_h[name]
    # the rounding depends on every rotation of the tensor, on any axis
    key = (name, b"".join(a.to_bytes(1, "little") + np.ascontiguousarray(r).tobytes() for a, r in rots))
    if key not in cache:
        for a, r in rots:
            if a == ax:
                h = r.T @ h @ r
        cache[key] = RawTensor(dtype, round_feedback(x, ax, h, dtype))
    return cache[key]


def _eigen_of_top(stack: SymbolStack, n_pop: int, dim: int, sym_dtype: str, w: int) -> tuple[str | None, np.ndarray, np.ndarray]:
    """(reason the site cannot be used or None, eigenvalues as stored, eigenvectors) of the
    symmetric matrix the top n_pop symbols make; the matrix itself is dropped here."""
    xv = bits_to_f64(stack.peek(n_pop), sym_dtype)
    if not np.all(np.isfinite(xv)):
        return "non-finite popped values", np.zeros(0), np.zeros(0)
    mu, v = rot.eigh(rot.block_to_matrix(xv, dim))
    mu_w = mu.astype(wide_dtype(w))
    if not np.all(np.isfinite(mu_w)):
        return "eigenvalues overflow", mu_w, v
    return None, mu_w, v


def _encode_once(layout, tensors, base, incoming_of, ops, index, entries, sym_dtype, w, scheme, tolerance, canonical, plain, base_h, cache, defer, band):  # type: ignore[no-untyped-def]
    paper = scheme == "paper"
    # room for every push up front: a doubling stack would hold up to 3x the block at a regrowth
    stack = SymbolStack(w, capacity=sum(e.numel * bits_of(e.dtype) // w for e in entries) + sum(4 * s.dim for s in layout.sites))
    anchor_rot: dict[int, np.ndarray] = {}
    follower_rot: dict[int, np.ndarray | None] = {}
    true_x: dict[int, np.ndarray] = {}
    true_signs: dict[int, np.ndarray] = {}
    true_anchor: dict[int, RawTensor] = {}
    new_plain: dict[int, str] = dict(plain)
    sites = layout.sites

    paper_q: dict[int, np.ndarray] = {}
    if paper:
        # Alg. 1: the canonical direction is fixed before anything is pushed; the random
        # rotation Q touches only the anchor, which is pushed after its site.
        for s_idx, s in enumerate(sites):
            anchor_rot[s_idx] = follower_rot[s_idx] = canonical[s.name]

    def final_value(name: str) -> RawTensor:
        entry = entries[index[name]]
        dtype = entry.dtype
        rots: list[tuple[int, np.ndarray]] = []
        q: tuple[int, int] | None = None
        for s_idx, s in enumerate(sites):
            for a in s.touched():
                if a.tensor != name:
                    continue
                if a == s.anchor:
                    if s_idx in anchor_rot:
                        rots.append((a.axis, anchor_rot[s_idx]))
                    if s_idx in paper_q:
                        q = (s_idx, a.axis)
                elif follower_rot.get(s_idx) is not None:
                    rots.append((a.axis, follower_rot[s_idx]))  # type: ignore[arg-type]
        every = incoming_of[name] + rots
        if len(every) == 1 and name not in base_h and is_large_entry(entry):
            t = rotate_rounded_blocks(tensors[name], *every[0])
        elif every:
            t = _rounded(name, _rotate(base(name), rots), rots, dtype, base_h, cache)
        else:
            t = tensors[name]
        if q is not None:
            # paper: W' = fp(W_c Q) with the canonical W_c = fp(W U0) and Q = V (Alg. 1, 5)
            true_anchor[q[0]] = t
            t = RawTensor.from_f64(rot.rotate_axis(t.to_f64(), q[1], paper_q[q[0]]), dtype)
        return t

    for op in ops:
        if op.kind == OP_PUSH:
            name = layout.tensors[op.index]
            t = final_value(name)
            stack.push(symbols_view(t, w))
            continue
        s_idx = op.index
        s = sites[s_idx]
        u0 = canonical[s.name]
        reason = new_plain.get(s_idx)
        n_pop = rot.block_size(s.dim)
        if reason is None and len(stack) < n_pop:
            reason = "no bits source" if len(stack) == 0 else "too few symbols below"
        if reason is None:
            reason, mu_w, v = _eigen_of_top(stack, n_pop, s.dim, sym_dtype, w)
        if reason is not None:
            new_plain[s_idx] = reason
            # paper: the canonical direction is applied regardless (Alg. 1)
            anchor_rot[s_idx] = u0 if paper else np.eye(s.dim)
            follower_rot[s_idx] = u0 if paper else None
            if not paper:
                anchor_rot.pop(s_idx)
            continue
        true_x[s_idx] = stack.pop(n_pop)
        stack.push(np.frombuffer(mu_w.tobytes(), dtype=uint_dtype(w)))
        if paper:
            true_signs[s_idx] = rot.paper_signs(v)
            anchor_rot[s_idx] = u0
            paper_q[s_idx] = v
            follower_rot[s_idx] = u0
        else:
            anchor_rot[s_idx] = follower_rot[s_idx] = u0 @ v.T
        del v, mu_w  # not held through the decoder's simulation below

    program = BlockProgram(
        layout.name,
        sym_dtype,
        entries,
        [
            SiteEntry(
                s.name,
                s.dim,
                index[s.anchor.tensor],
                s.anchor.axis,
                (SITE_PAPER if paper else 0) | (SITE_PLAIN if i in new_plain else 0),
                tuple(FollowerEntry(f.tensor, f.axis) for f in s.followers),
            )
            for i, s in enumerate(sites)
        ],
        list(ops),
    )
    # the payload's bytes once, and the symbols as a read-only view of them (not a second copy)
    payload_bytes = little_endian_bytes(stack.take())
    payload = np.frombuffer(payload_bytes, dtype=np.dtype(uint_dtype(w)).newbyteorder("<")).astype(uint_dtype(w), copy=False)
    sim = SimulatingCorrector(sym_dtype, tolerance, true_x, true_signs, true_anchor, band=band)
    intended = decode_program(program, payload, sim, reference=True)
    sections = [Section(KIND_PAYLOAD, NO_SITE, payload_bytes)]
    reports: list[SiteReport] = []
    newly: dict[int, str] = {}
    deferred: dict[int, SiteFix] = {}
    for s_idx, s in enumerate(sites):
        gain = (rot.block_size(s.dim) - 2 * s.dim) * w
        if s_idx in new_plain:
            reports.append(SiteReport(s.name, s.dim, new_plain[s_idx], 0, 0, 0, 0))
            continue
        if s_idx in sim.unsafe:
            newly[s_idx] = sim.unsafe[s_idx]
        fix = sim.fixes.get(s_idx)
        if defer and fix is not None and side_cost_bound(program, s_idx, fix) * 8 < gain:
            deferred[s_idx] = fix  # pays even stored raw: sections built in finish()
            secs, side = [], 0
        else:
            secs = build_site_sections(program, s_idx, fix) if fix is not None else []
            side = sum(c.cost for c in secs)
        corrected = int(fix.x_mask.sum()) if fix is not None and fix.x_mask is not None else 0
        if fix is not None and fix.anchor_mask is not None:
            corrected += int(fix.anchor_mask.sum())
        if side * 8 >= gain:
            newly.setdefault(s_idx, f"side information ({side} B) would not pay for the {gain // 8} B saved")
        reports.append(SiteReport(s.name, s.dim, None, gain, side, corrected, s.dim if paper else 0, fix.banded if fix is not None else 0))
        sections.extend(secs)
    outgoing: Rotations = {}
    local = set(layout.tensors)
    for s_idx, s in enumerate(sites):
        r = follower_rot.get(s_idx)
        if r is None:
            continue
        for f in s.followers:
            if f.tensor not in local:
                outgoing[(f.tensor, f.axis)] = r
    enc = EncodedChunk(program, payload, [sec.finish(sec.kind != KIND_PAYLOAD) for sec in sections], intended, outgoing, reports,
                       deferred)
    _report_stored_sizes(enc, [i for i in range(len(sites)) if i not in new_plain and i not in deferred])
    return enc, newly

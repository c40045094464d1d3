"""The bits-back invariant, craystack style: a site's push followed by its pop
returns the stack to exactly its previous state."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from bbformat.codec import rotation as rot
from bbformat.codec.dtypes import RawTensor, tensor_to_symbols
from bbformat.codec.encoder import encode_chunk
from bbformat.codec.runner import on_pool
from bbformat.codec.layout import ChunkLayout, SiteSpec
from bbformat.container.program import AxisRef
from bbformat.codec.decoder import decode_program
from bbformat.constants import OpKind
from bbformat.codec.sections import StoredCorrector, decoded_limit
from bbformat.zstdframe import decompress


def _stored_decode(enc):  # type: ignore[no-untyped-def]
    side = {
        (s.kind, s.site): decompress(s.stored, s.codec, len(s.data), decoded_limit(enc.program, s.kind, s.site))
        for s in enc.sections
        if s.kind != 1
    }
    return decode_program(enc.program, enc.payload, StoredCorrector(enc.program, side))


def _case(seed: int, d: int, rows: int, dtype: str, scale: float):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    prefix = RawTensor.from_f64(rng.normal(0, scale, (d + 3, d)), dtype)  # the stack before the site
    anchor = RawTensor.from_f64(rng.normal(0, scale, (d, rows)), dtype)
    follower = RawTensor.from_f64(rng.normal(0, scale, (5, d)), dtype)
    layout = ChunkLayout(
        "c", ("prefix", "anchor", "follower"), (SiteSpec("s", d, AxisRef("anchor", 0), (AxisRef("follower", 1),)),)
    )
    return layout, {"prefix": prefix, "anchor": anchor, "follower": follower}


dims = st.integers(4, 40)
dtypes = st.sampled_from(["float16", "bfloat16", "float32"])
schemes = st.sampled_from(["symmetric", "paper"])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), d=dims, extra=st.integers(0, 20), dtype=dtypes, scheme=schemes)
def test_pop_after_push_restores_the_stack_exactly(seed: int, d: int, extra: int, dtype: str, scheme: str) -> None:
    layout, tensors = _case(seed, d, d + extra, dtype, 0.05)
    enc = encode_chunk(layout, tensors, {}, scheme, 0.0)
    dec = _stored_decode(enc)
    # the symbols below the site (the stack it borrowed from) come back bit for bit
    assert np.array_equal(tensor_to_symbols(dec["prefix"], enc.program.symbol_bits), tensor_to_symbols(tensors["prefix"], enc.program.symbol_bits))
    for name, t in enc.intended.items():
        assert dec[name].equal(t)
    site = enc.program.sites[0]
    if not site.plain:
        # the payload really is shorter: D(D+1)/2 popped, 2D pushed back
        plain = sum(t.bits.size * t.bits.itemsize * 8 // enc.program.symbol_bits for t in tensors.values())
        assert enc.payload.size == plain - rot.block_size(d) + 2 * d


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), d=st.integers(8, 32), dtype=dtypes)
def test_symmetric_rotation_preserves_products(seed: int, d: int, dtype: str) -> None:
    """Anchor and follower rotate together, so anchor^T-follower products are invariant."""
    layout, tensors = _case(seed, d, d + 4, dtype, 0.05)
    enc = encode_chunk(layout, tensors, {}, "symmetric", 0.0)
    a0, f0 = tensors["anchor"].to_f64(), tensors["follower"].to_f64()
    a1, f1 = enc.intended["anchor"].to_f64(), enc.intended["follower"].to_f64()
    ref = f0 @ a0
    eps = {"float16": 2e-3, "bfloat16": 2e-2, "float32": 1e-6}[dtype]
    assert np.abs(f1 @ a1 - ref).max() <= eps * max(1.0, np.abs(ref).max()) * d


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), d=st.integers(8, 32), tol=st.sampled_from([1e-4, 1e-3, 1e-2]))
def test_tolerance_bounds_regenerated_error(seed: int, d: int, tol: float) -> None:
    layout, tensors = _case(seed, d, d + 4, "float16", 0.05)
    enc = encode_chunk(layout, tensors, {}, "symmetric", tol)
    dec = _stored_decode(enc)
    err = np.abs(dec["prefix"].to_f64() - tensors["prefix"].to_f64()).max()
    assert err <= tol
    assert dec["anchor"].equal(enc.intended["anchor"])


def test_site_without_enough_symbols_is_stored_plainly() -> None:
    rng = np.random.default_rng(1)
    small = RawTensor.from_f64(rng.normal(size=(2, 3)), "float16")
    anchor = RawTensor.from_f64(rng.normal(size=(16, 20)), "float16")
    layout = ChunkLayout("c", ("small", "anchor"), (SiteSpec("s", 16, AxisRef("anchor", 0)),))
    enc = encode_chunk(layout, {"small": small, "anchor": anchor}, {}, "symmetric", 0.0)
    assert enc.program.sites[0].plain
    assert enc.reports[0].plain_reason == "too few symbols below"
    assert enc.intended["anchor"].equal(anchor)  # untouched: plain sites perturb nothing
    dec = _stored_decode(enc)
    assert dec["small"].equal(small) and dec["anchor"].equal(anchor)


def test_non_finite_popped_values_make_the_site_plain() -> None:
    rng = np.random.default_rng(2)
    prefix = RawTensor.from_f64(rng.normal(size=(40, 8)), "float16")
    prefix.bits[-1, -1] = 0x7E00  # NaN on top of the stack
    anchor = RawTensor.from_f64(rng.normal(size=(8, 9)), "float16")
    layout = ChunkLayout("c", ("prefix", "anchor"), (SiteSpec("s", 8, AxisRef("anchor", 0)),))
    enc = encode_chunk(layout, {"prefix": prefix, "anchor": anchor}, {}, "symmetric", 0.0)
    assert enc.program.sites[0].plain and "non-finite" in (enc.reports[0].plain_reason or "")
    assert _stored_decode(enc)["prefix"].equal(prefix)


def test_degenerate_spectrum_does_not_pay_and_is_plain() -> None:
    """An anchor whose Gram matrix is a multiple of the identity has no recoverable basis."""
    d = 24
    prefix = RawTensor.from_f64(np.random.default_rng(3).normal(0, 0.05, (60, d)), "float16")
    anchor = RawTensor.from_f64(np.eye(d), "float16")
    layout = ChunkLayout("c", ("prefix", "anchor"), (SiteSpec("s", d, AxisRef("anchor", 0)),))
    enc = encode_chunk(layout, {"prefix": prefix, "anchor": anchor}, {}, "symmetric", 0.0)
    assert enc.program.sites[0].plain
    assert "would not pay" in (enc.reports[0].plain_reason or "")
    assert _stored_decode(enc)["prefix"].equal(prefix)


def test_site_ops_come_before_touched_tensors() -> None:
    layout, tensors = _case(0, 8, 10, "float16", 0.05)
    enc = encode_chunk(layout, tensors, {}, "symmetric", 0.0)
    kinds = [(o.kind, o.index) for o in enc.program.ops]
    assert kinds.index((OpKind.SITE, 0)) == 1


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), d=dims, extra=st.integers(0, 20), dtype=dtypes, scheme=schemes,
       tol=st.sampled_from([0.0, 1e-3]))
def test_deferred_sections_are_the_sequential_ones(seed: int, d: int, extra: int, dtype: str, scheme: str, tol: float) -> None:
    """encode_chunk(defer=True) + finish() (pack's pipeline: the zstd work on a worker) gives
    the sections and reports of a sequential encode, and the raw-size bound it decides
    with is never below the real cost."""
    from bbformat.codec.sections import build_site_sections, side_cost_bound

    layout, tensors = _case(seed, d, d + extra, dtype, 0.05)
    now = encode_chunk(layout, tensors, {}, scheme, tol)
    later = encode_chunk(layout, tensors, {}, scheme, tol, defer=True)
    finished = later.finish()
    assert later.finish() is finished and not later.deferred  # idempotent
    assert [(s.kind, s.site, s.codec, s.stored) for s in finished] == [(s.kind, s.site, s.codec, s.stored) for s in now.sections]
    with ThreadPoolExecutor(3) as pool:  # as a Writer's threads run it
        pooled = encode_chunk(layout, tensors, {}, scheme, tol, defer=True).finish(on_pool(pool))
    assert [(s.kind, s.site, s.codec, s.stored) for s in pooled] == [(s.kind, s.site, s.codec, s.stored) for s in now.sections]
    assert later.reports == now.reports
    assert np.array_equal(later.payload, now.payload)
    site = now.program.sites[0]
    if not site.plain:
        fixes = encode_chunk(layout, tensors, {}, scheme, tol, defer=True).deferred
        for s_idx, fix in fixes.items():
            assert side_cost_bound(now.program, s_idx, fix) >= sum(c.cost for c in build_site_sections(now.program, s_idx, fix))


def _sequential_sections(enc) -> list[tuple[int, int, int, bytes]]:  # type: ignore[no-untyped-def]
    """The deferred sections as the writer built them before they ran as jobs, written out
    here independently: per site in order, each planned section encoded and finished with
    its kind's compress_whole, the cheapest block choice as built (ties: the lower last
    kind), then finish(True) on each chosen one; the payload first, then by site."""
    from bbformat.codec.sections import Section
    from bbformat.codec.section_kinds import site_plan

    def built(p):  # type: ignore[no-untyped-def]
        return Section(p.codec.kind, p.ctx.site, p.encode()).finish(p.codec.compress_whole)

    out = []
    for site, fix in enc.deferred.items():
        plan = site_plan(enc.program, site, fix)
        choices = [[built(p) for p in c] for c in plan.block_choices]
        block = min(choices, key=lambda secs: (sum(c.cost for c in secs), secs[-1].kind)) if choices else []
        out += [sec.finish() for sec in [*(built(p) for p in plan.first), *block, *(built(p) for p in plan.last)]]
    secs = enc.sections[:1] + sorted(enc.sections[1:] + out, key=lambda sec: sec.site)
    return [(s.kind, s.site, s.codec, s.stored) for s in secs]


def test_pooled_sections_are_those_built_one_by_one() -> None:
    """EncodedChunk.finish on a pool against an independent copy of the sequential build, on
    fixed cases that reach both block choices, zstd'd x_residuals and anchor patches."""
    from bbformat.constants import Codec, SectionKind

    seen: set[str] = set()
    with ThreadPoolExecutor(3) as pool:
        for seed in range(12):
            for d, extra, dtype, scheme, tol in [(24, 9, "float16", "symmetric", 0.0), (33, 0, "bfloat16", "paper", 0.0),
                                                  (40, 17, "float32", "symmetric", 1e-3), (16, 20, "bfloat16", "symmetric", 0.0),
                                                  (24, 9, "bfloat16", "paper", 1e-3)]:
                layout, tensors = _case(seed, d, d + extra, dtype, 0.05)
                enc = encode_chunk(layout, tensors, {}, scheme, tol, defer=True)
                if not enc.deferred:
                    continue
                want = _sequential_sections(encode_chunk(layout, tensors, {}, scheme, tol, defer=True))
                got = [(s.kind, s.site, s.codec, s.stored) for s in enc.finish(on_pool(pool))]
                assert got == want, (seed, d, dtype, scheme, tol)
                kinds = {(k, c) for k, _, c, _ in got}
                seen |= {"residuals zstd"} if (SectionKind.X_RESIDUALS, Codec.ZSTD) in kinds else set()
                seen |= {"patches only"} if any(k == SectionKind.X_PATCHES for k, _ in kinds) and not any(
                    k == SectionKind.X_RESIDUALS for k, _ in kinds) else set()
                seen |= {"anchor patches"} if any(k == SectionKind.ANCHOR_PATCHES for k, _ in kinds) else set()
    assert seen == {"residuals zstd", "patches only", "anchor patches"}, seen


def test_a_section_is_compressed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Section.finish(True) again (EncodedChunk.finish after build_site_sections) keeps the
    first result without compressing the section a second time, unless its data changed."""
    from dataclasses import replace

    from bbformat.codec import sections
    from bbformat.constants import Codec, SectionKind

    calls: list[int] = []
    real = sections.section_compressor

    def counting():  # type: ignore[no-untyped-def]
        calls.append(1)
        return real()

    monkeypatch.setattr(sections, "section_compressor", counting)
    sec = sections.Section(SectionKind.X_PATCHES, 0, bytes(1000)).finish()
    assert calls and sec.codec == Codec.ZSTD
    stored = sec.stored
    assert sec.finish() is sec and sec.stored == stored and len(calls) == 1
    assert sec.finish(False).codec == Codec.RAW and sec.finish().codec == Codec.ZSTD and len(calls) == 2
    other = bytes(range(256)) * 4
    moved = replace(sec, data=other).finish()  # a copy with other data is compressed anew
    assert decompress(moved.stored, moved.codec, len(other), len(other)) == other and len(calls) == 3
    sec.data = other
    assert decompress(sec.finish().stored, sec.codec, len(other), len(other)) == other and len(calls) == 4


def test_deferral_keeps_the_plain_decision() -> None:
    """A site whose side information only compression could make pay is decided at once."""
    d = 24
    prefix = RawTensor.from_f64(np.random.default_rng(3).normal(0, 0.05, (60, d)), "float16")
    anchor = RawTensor.from_f64(np.eye(d), "float16")
    layout = ChunkLayout("c", ("prefix", "anchor"), (SiteSpec("s", d, AxisRef("anchor", 0)),))
    enc = encode_chunk(layout, {"prefix": prefix, "anchor": anchor}, {}, "symmetric", 0.0, defer=True)
    assert enc.program.sites[0].plain and not enc.deferred
    assert enc.finish() == enc.sections


def test_add_encoded_on_an_ended_writer_is_refused_before_any_work(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A Writer that was aborted refuses add_encoded before it builds the chunk's side
    sections, and starts no part threads again."""
    import threading

    from bbformat.writer import Writer, WriterStateError

    layout, tensors = _case(0, 24, 33, "float16", 0.05)
    enc = encode_chunk(layout, tensors, {}, "symmetric", 0.0, defer=True)
    assert enc.deferred
    w = Writer(tmp_path / "x.bb", "symmetric", 1, {}, format_version="1.5", entropy="auto", threads=2)
    w.abort()
    before = {t.name for t in threading.enumerate()}
    with pytest.raises(WriterStateError):
        w.add_encoded(enc)
    assert enc.deferred and {t.name for t in threading.enumerate()} == before
    assert not (tmp_path / "x.bb").exists()

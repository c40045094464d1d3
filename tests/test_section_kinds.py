"""The contract every section kind keeps (numcodecs style): for each registered kind, encode ->
decode round-trips, the raw size bound is at least the real size, encoded sections stay within
the kind's decoded-size limit, and decoding hostile bytes raises only the format's errors.
Also: the registry covers SPEC.md 8.1, and the descriptor is read with the layout it is built with."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from bbformat.codec.dtypes import uint_dtype
from bbformat.container.program import BlockProgram, Op, SiteEntry, TensorEntry, bits_of
from bbformat.codec.section_kinds import SECTION_KINDS, Patches, SectionCodec, SiteContext, section_codec
from bbformat.codec.sections import Section
from bbformat.constants import DTYPE_CODES, NO_SITE, OpKind, SectionKind, SiteFlag
from bbformat.container import records as R
from bbformat.container.section_rules import SECTION_RULES, rules_of, site_sections_limit
from bbformat.errors import BBFormatError, FormatError

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DTYPES = ("float16", "bfloat16", "float32")
SITE_MODES = (0, SiteFlag.PAPER)  # symmetric, paper
Draw = Callable[..., Any]  # st.DrawFn, or st.DataObject.draw


def program(dtype: str, dim: int, rows: int, flags: int) -> BlockProgram:
    """One site of `dim` on an anchor (dim, rows), after a tensor holding its block (as a chunk is)."""
    n_pop = dim * (dim + 1) // 2
    tensors = [TensorEntry("x", dtype, (n_pop,)), TensorEntry("a", dtype, (dim, rows))]
    ops = [Op(OpKind.PUSH, 0), Op(OpKind.SITE, 0), Op(OpKind.PUSH, 1)]
    p = BlockProgram("c", dtype, tensors, [SiteEntry("s", dim, 1, 0, flags)], ops)
    p.validate()
    return p


@st.composite
def contexts(draw: st.DrawFn, codec: SectionCodec[Any]) -> SiteContext:
    """A program with one site where `codec`'s kind is allowed, and that kind's place in it."""
    modes = [m for m in SITE_MODES if codec.allowed(SiteEntry("s", 2, 1, 0, m))] or list(SITE_MODES)
    p = program(draw(st.sampled_from(DTYPES)), draw(st.integers(2, 12)), draw(st.integers(1, 6)), draw(st.sampled_from(modes)))
    return SiteContext(p, NO_SITE if codec.allowed(None) else 0)


def bit_patterns(draw: Draw, n: int, bits: int) -> np.ndarray:
    seed = draw(st.integers(0, 2**32 - 1))
    return np.random.default_rng(seed).integers(0, 1 << bits, n, dtype=np.uint64).astype(uint_dtype(bits))


def mask(draw: Draw, n: int) -> np.ndarray:
    return np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)


def patches(draw: Draw, ctx: SiteContext, n: int, bits: int) -> Patches:
    return Patches.of(mask(draw, n), bit_patterns(draw, n, bits))


def block_patches(draw: Draw, ctx: SiteContext) -> Patches:
    return patches(draw, ctx, ctx.program.sites[ctx.site].n_pop, ctx.program.symbol_bits)


def anchor_patches(draw: Draw, ctx: SiteContext) -> Patches:
    anchor = ctx.program.tensors[ctx.program.sites[ctx.site].anchor]
    return patches(draw, ctx, anchor.numel, bits_of(anchor.dtype))


def residuals(draw: Draw, ctx: SiteContext) -> tuple[SiteContext, np.ndarray]:
    """Residuals of a block (0 off the residual positions), with the block they correct."""
    w, n = ctx.program.symbol_bits, ctx.program.sites[ctx.site].n_pop
    keep = mask(draw, n) if draw(st.booleans()) else None
    big = draw(st.booleans())  # up to the whole ordinal range, or small (the usual case)
    span = (1 << w) - 1 if big else 8
    deltas = np.random.default_rng(draw(st.integers(0, 2**32 - 1))).integers(-span, span + 1, n, dtype=np.int64)
    if keep is not None:
        deltas[~keep] = 0
    ctx = SiteContext(ctx.program, ctx.site, bit_patterns(draw, n, w), keep)
    return ctx, deltas


def payload(draw: Draw, ctx: SiteContext) -> np.ndarray:
    return bit_patterns(draw, ctx.program.payload_symbols(), ctx.program.symbol_bits)


def signs(draw: Draw, ctx: SiteContext) -> np.ndarray:
    return mask(draw, ctx.program.sites[ctx.site].dim)


def band_widths(draw: Draw, ctx: SiteContext) -> np.ndarray:
    """One width per value the site's mode bounds (SPEC.md 8.8): finite and > 0."""
    n = 3 if ctx.program.sites[ctx.site].paper else 1
    width = st.floats(min_value=5e-324, max_value=1e308, allow_nan=False, allow_infinity=False)
    return np.array([draw(width) for _ in range(n)], np.float64)


def plain(make: Callable[[Draw, SiteContext], Any]) -> Callable[[Draw, SiteContext], tuple[SiteContext, Any]]:
    return lambda draw, ctx: (ctx, make(draw, ctx))


# A value of each kind, where it is read (a kind without an entry here fails the tests)
VALUES: dict[SectionKind, Callable[[Draw, SiteContext], tuple[SiteContext, Any]]] = {
    SectionKind.PAYLOAD: plain(payload),
    SectionKind.SIGNS: plain(signs),
    SectionKind.X_RESIDUALS: residuals,
    SectionKind.X_PATCHES: plain(block_patches),
    SectionKind.ANCHOR_PATCHES: plain(anchor_patches),
    SectionKind.BAND: plain(band_widths),
}
KINDS = sorted(SECTION_KINDS)


def same(a: Any, b: Any) -> bool:
    if isinstance(a, Patches):
        return np.array_equal(a.positions, b.positions) and np.array_equal(a.values, b.values)
    return bool(np.array_equal(a, b)) and np.asarray(a).dtype == np.asarray(b).dtype


# ----------------------------------------------------------------------------- the registry


def test_the_registry_covers_every_section_kind() -> None:
    assert set(SECTION_KINDS) == set(SectionKind) == set(SECTION_RULES) == set(VALUES)
    for kind, codec in SECTION_KINDS.items():
        assert codec.kind == kind and codec.name == kind.name.lower()
        assert isinstance(codec, type(SECTION_RULES[kind]))  # its rules are the container's
        assert section_codec(int(kind)) is codec and rules_of(int(kind)) is SECTION_RULES[kind]


@pytest.mark.parametrize("kind", [0, 7, 255])
def test_an_unknown_kind_is_e_section_kind(kind: int) -> None:
    for lookup in (section_codec, rules_of):
        with pytest.raises(FormatError) as info:
            lookup(kind)
        assert info.value.code == "E_SECTION_KIND"


def test_where_each_kind_is_allowed_is_spec_8_1() -> None:
    paper, symmetric, plain_site = (SiteEntry("s", 4, 0, 0, f) for f in (SiteFlag.PAPER, 0, SiteFlag.PLAIN))
    table = {  # SPEC.md 8.1: (the chunk, a PAPER site, a symmetric-mode site, a PLAIN site)
        SectionKind.PAYLOAD: (True, False, False, False),
        SectionKind.SIGNS: (False, True, False, False),
        SectionKind.X_RESIDUALS: (False, False, True, False),
        SectionKind.X_PATCHES: (False, True, True, False),
        SectionKind.ANCHOR_PATCHES: (False, True, False, False),
        SectionKind.BAND: (False, True, True, False),
    }
    for kind, want in table.items():
        assert tuple(SECTION_KINDS[kind].allowed(s) for s in (None, paper, symmetric, plain_site)) == want, kind.name


@pytest.mark.parametrize("mode", SITE_MODES + (SiteFlag.PLAIN,))
@pytest.mark.parametrize("mixed", [False, True])
def test_a_sites_sections_limit_is_spec_11_5(mode: int, mixed: bool) -> None:
    p = program("float16", 8, 5, mode)
    limit = {k: SECTION_RULES[k].decoded_limit(p, 0) for k in SectionKind if k != SectionKind.PAYLOAD}
    if mode == SiteFlag.PLAIN:
        want = 0
    elif mode == SiteFlag.PAPER:
        want = limit[SectionKind.SIGNS] + limit[SectionKind.X_PATCHES] + limit[SectionKind.ANCHOR_PATCHES]
    else:
        pair = (limit[SectionKind.X_RESIDUALS], limit[SectionKind.X_PATCHES])
        want = sum(pair) if mixed else max(pair)
    assert site_sections_limit(p, 0, mixed) == want
    bands = 0 if mode == SiteFlag.PLAIN else limit[SectionKind.BAND]  # 1.4: the band section, with BANDS only
    assert site_sections_limit(p, 0, mixed, bands=True) == want + bands


# ----------------------------------------------------------------------------- the contract


@pytest.mark.parametrize("kind", KINDS, ids=[k.name.lower() for k in KINDS])
@SETTINGS
@given(data=st.data())
def test_encode_decode_round_trips(kind: SectionKind, data: st.DataObject) -> None:
    codec = SECTION_KINDS[kind]
    ctx, value = VALUES[kind](data.draw, data.draw(contexts(codec)))
    assert same(codec.decode(ctx, codec.encode(ctx, value)), value)


@pytest.mark.parametrize("kind", KINDS, ids=[k.name.lower() for k in KINDS])
@SETTINGS
@given(data=st.data())
def test_sizes_are_within_the_bound_and_the_limit(kind: SectionKind, data: st.DataObject) -> None:
    """raw_size >= the encoded size >= the stored size; the encoded size <= the decoded limit
    (the payload's is exact)."""
    codec = SECTION_KINDS[kind]
    ctx, value = VALUES[kind](data.draw, data.draw(contexts(codec)))
    encoded = codec.encode(ctx, value)
    stored = Section(kind, ctx.site, encoded).finish(codec.compress_whole).stored
    assert codec.raw_size(ctx, value) >= len(encoded) >= len(stored)
    limit = codec.decoded_limit(ctx.program, ctx.site)
    assert len(encoded) == limit if codec.exact_declared or codec.exact_decoded else len(encoded) <= limit


@pytest.mark.parametrize("kind", KINDS, ids=[k.name.lower() for k in KINDS])
@SETTINGS
@given(data=st.data(), junk=st.binary(max_size=80))
def test_decoding_hostile_bytes_raises_only_the_formats_errors(kind: SectionKind, data: st.DataObject, junk: bytes) -> None:
    codec = SECTION_KINDS[kind]
    ctx, _ = VALUES[kind](data.draw, data.draw(contexts(codec)))
    for read in (codec.decode, codec.tally):
        try:
            read(ctx, junk)
        except BBFormatError:
            pass


# ----------------------------------------------------------------------------- the descriptor's layout

NAMES = st.text(st.characters(codec="utf-8"), max_size=6)


@st.composite
def descriptor_records(draw: st.DrawFn) -> dict[str, Any]:
    """Any structurally valid descriptor (values need not make a valid program)."""
    u8, u16, u32, u64 = (st.integers(0, (1 << b) - 1) for b in (8, 16, 32, 64))

    def tensor(dims: list[int]) -> dict[str, Any]:
        return dict(name=draw(NAMES), dtype=draw(st.sampled_from(sorted(DTYPE_CODES.values()))), ndim=len(dims), reserved=draw(u16), dims=dims)

    def followers() -> list[dict[str, Any]]:
        return [dict(tensor=draw(NAMES), axis=draw(u8), reserved=draw(u8)) for _ in range(draw(st.integers(0, 2)))]

    tensors = [tensor(draw(st.lists(u64, max_size=3))) for _ in range(draw(st.integers(0, 3)))]
    sites = [dict(name=draw(NAMES), dim=draw(u32), anchor=draw(u32), anchor_axis=draw(u8), flags=draw(u8), reserved=draw(u16),
                  followers=followers()) for _ in range(draw(st.integers(0, 2)))]
    ops = [dict(kind=draw(u8), reserved0=draw(u8), reserved1=draw(u16), index=draw(u32))
           for _ in range(draw(st.integers(0, len(tensors) + len(sites))))]
    return dict(name=draw(NAMES), symbol_dtype=draw(u8), reserved0=draw(u8), reserved1=draw(u16), tensors=tensors, sites=sites, ops=ops)


@SETTINGS
@given(rec=descriptor_records())
def test_the_descriptor_is_read_with_the_layout_it_is_built_with(rec: dict[str, Any]) -> None:
    data = R.DESCRIPTOR.build(rec)
    assert R.read_descriptor(data) == rec
    for cut in (1, len(data) // 2):  # a short descriptor: the one structural code
        with pytest.raises(FormatError) as info:
            R.read_descriptor(data[:-cut])
        assert info.value.code == "E_DESCRIPTOR"
    with pytest.raises(FormatError) as info:
        R.read_descriptor(data + b"\x00")
    assert info.value.code == "E_DESCRIPTOR"

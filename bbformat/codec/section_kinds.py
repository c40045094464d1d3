"""Section kinds as codec objects (numcodecs style): one object per kind, one interface.

Each object is its kind's format rules (container/section_rules.py: where it is allowed, its
storage codecs, its decoded-size limit) with the codec of its content (SPEC.md 6.3, 8.3-8.5):
`encode` turns a value into the section's decoded bytes, `decode` reads them back, `raw_size`
bounds the stored size without compressing, `tally` counts what `bbformat inspect` shows.
`site_plan` says which kinds, holding which values, store a site's SiteFix.

"Codec" is meant as in numcodecs; how a section's bytes are stored (raw, zstd, planes) is
constants.Codec. A new kind: its rules in section_rules.py, its codec here, one entry in each
registry, and its contract is checked by tests/test_section_kinds.py.
"""
from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass, replace
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import numpy as np
import numpy.typing as npt

from ..bytecursor import ByteCursor
from ..constants import EXPONENT_FIELD, SECTION_ENTRY_SIZE, Codec, SectionKind
from ..container.program import BlockProgram, bits_of
from ..container.section_rules import (
    AnchorPatchesRules,
    BandRules,
    BlockPatchesRules,
    PayloadRules,
    ResidualsRules,
    SectionRules,
    SignsRules,
    band_widths,
    payload_dtype,
    residual_bytes_per_value,
    rules_of,
)
from ..errors import FormatError, LimitError
from ..zstdframe import Buffer, decompress, frame_content_size, section_compressor
from . import host_native
from .dtypes import bits_to_ordinal, ordinal_to_bits, uint_dtype
from .simulate import SiteFix
from .varint import decode_varints, encode_group, encode_varint, encode_varints, unzigzag, varint_bytes, varint_lengths, zigzag

Array = npt.NDArray[Any]
V = TypeVar("V")


@dataclass(frozen=True)
class SiteContext:
    """What the encoder and the decoder both know about a section before it is read: the
    program and the site (NO_SITE for the payload); for x_residuals also the block before
    correction (its contexts) and the residual positions (SPEC.md 8.4; None: all)."""

    program: BlockProgram
    site: int
    approx: Array | None = None
    keep: Array | None = None


@dataclass(frozen=True)
class Patches:
    """Values stored explicitly (SPEC.md 8.5): their positions, increasing, and bit patterns."""

    positions: Array
    values: Array

    @classmethod
    def of(cls, mask: Array, true_bits: Array) -> Patches:
        """The values of `true_bits` where `mask` is set."""
        positions = np.flatnonzero(mask.reshape(-1)).astype(np.int64)
        return cls(positions, true_bits.reshape(-1)[positions])

    def gaps(self) -> Array:
        """The gap before each position, as the section stores it."""
        return np.diff(np.concatenate(([-1], self.positions))) - 1

    def apply(self, bits: Array) -> Array:
        """A copy of the flat `bits` with the patched values in place."""
        out = bits.copy()
        out[self.positions] = self.values
        return out


@dataclass(frozen=True)
class Tally:
    """What `bbformat inspect` counts in one section."""

    sign_bits: int = 0
    corrections: int | None = None  # None: not a correction section


class SectionCodec(SectionRules, Generic[V]):
    """One section kind: its rules (SectionRules) and the codec of its content."""

    compress_whole = True
    """Whether the writer tries zstd on the whole section when it builds it (Section.finish)."""

    @abstractmethod
    def encode(self, ctx: SiteContext, value: V) -> bytes:
        """The section's decoded bytes for `value`."""

    @abstractmethod
    def decode(self, ctx: SiteContext, data: Buffer) -> V:
        """The value of a section's decoded bytes; malformed content is a FormatError."""

    def raw_size(self, ctx: SiteContext, value: V) -> int:
        """An upper bound on len(encode(ctx, value)), and so on its stored size (raw is stored
        where zstd is not smaller), computed without compressing."""
        return len(self.encode(ctx, value))

    def tally(self, ctx: SiteContext, data: Buffer) -> Tally:
        """Sign bits and corrections in a section's decoded bytes (default: none)."""
        return Tally()


class PayloadSection(PayloadRules, SectionCodec[Array]):
    """The final stack's symbols, bottom first, W-bit little-endian (SPEC.md 6.3)."""

    def encode(self, ctx: SiteContext, value: Array) -> bytes:
        return np.ascontiguousarray(value, dtype=payload_dtype(ctx.program)).tobytes()

    def decode(self, ctx: SiteContext, data: Buffer) -> Array:
        limit = self.decoded_limit(ctx.program, ctx.site)
        if len(data) != limit:
            raise FormatError(f"payload holds {len(data)} bytes; the program needs {limit}", "E_SYMBOL_COUNT")
        return np.frombuffer(data, dtype=payload_dtype(ctx.program))  # read-only: the decoder copies it once

    def raw_size(self, ctx: SiteContext, value: Array) -> int:
        return int(value.size) * (ctx.program.symbol_bits // 8)


class SignsSection(SignsRules, SectionCodec[Array]):
    """A PAPER site's D sign bits, least significant bit first (SPEC.md 8.3)."""

    compress_whole = False

    def encode(self, ctx: SiteContext, value: Array) -> bytes:
        return np.packbits(value, bitorder="little").tobytes()

    def decode(self, ctx: SiteContext, data: Buffer) -> Array:
        d = ctx.program.sites[ctx.site].dim
        if len(data) != self.decoded_limit(ctx.program, ctx.site):
            raise FormatError("sign bitmap has the wrong size", "E_SECTION_SIZE")
        bits = np.unpackbits(np.frombuffer(data, np.uint8), bitorder="little")
        if np.any(bits[d:]):
            raise FormatError("sign bitmap padding bits must be zero", "E_RESERVED")
        return bits[:d].astype(bool)

    def raw_size(self, ctx: SiteContext, value: Array) -> int:
        return self.decoded_limit(ctx.program, ctx.site)

    def tally(self, ctx: SiteContext, data: Buffer) -> Tally:
        return Tally(sign_bits=ctx.program.sites[ctx.site].dim)


def residual_contexts(approx_bits: Array, dtype: str) -> Array:
    """Context of each regenerated value: the exponent field of its rounded approximation.

    Residuals in ulps grow as the exponent shrinks, so coding each context as its own
    stream costs markedly fewer bits than one stream."""
    shift, nbits = EXPONENT_FIELD[dtype]
    return ((approx_bits.astype(np.int64) >> shift) & ((1 << nbits) - 1)).astype(np.int64)


def context_groups(approx_bits: Array, dtype: str, keep: Array | None = None) -> list[tuple[int, Array]]:
    """(context, positions in increasing order) for every context that occurs, ascending:
    one stable sort instead of a pass per context. keep: the residual positions (SPEC.md 8.4;
    a site's patched positions are not), default all."""
    if keep is not None:
        where = np.flatnonzero(keep)
        return [(c, where[pos]) for c, pos in context_groups(approx_bits.reshape(-1)[where], dtype)]
    shift, nbits = EXPONENT_FIELD[dtype]
    a = np.asarray(approx_bits)
    ctx = ((a >> a.dtype.type(shift)) & a.dtype.type((1 << nbits) - 1)).astype(np.uint8)
    counts = np.bincount(ctx, minlength=1 << nbits)  # residual_contexts, one byte a value
    order = np.argsort(ctx, kind="stable")  # contexts < 256: a radix sort
    ends = np.cumsum(counts)
    return [(int(c), order[ends[c] - counts[c] : ends[c]]) for c in np.flatnonzero(counts)]


def residual_deltas(true: Array, approx: Array, mask: Array, dtype: str) -> Array:
    """true - approx in ordinal steps where mask, else 0, in true's shape: a block's x_residuals
    values. Compiled where host_native is active; the numpy below is the reference."""
    if host_native.active() and dtype in host_native.DTYPE_CODES:
        return host_native.ordinal_deltas(true, approx, mask, dtype).reshape(np.shape(true))
    width = bits_of(dtype)
    deltas = bits_to_ordinal(true, width)
    deltas -= bits_to_ordinal(approx, width)
    deltas *= np.asarray(mask, np.bool_).reshape(deltas.shape)
    return deltas


def residual_sizes(approx_bits: Array, value: Array, dtype: str, keep: Array | None = None) -> tuple[Array, Array]:
    """(positions, varint bytes of zigzag(value)) of every context's residual positions, each
    indexed by context (the groups of context_groups, summed without gathering them).
    Compiled where host_native is active; the numpy below is the reference."""
    if host_native.active() and dtype in host_native.DTYPE_CODES:
        return host_native.residual_sizes(approx_bits, value, dtype, keep)
    approx, value = np.asarray(approx_bits).reshape(-1), np.asarray(value).reshape(-1)
    if keep is not None:
        where = np.flatnonzero(keep)
        approx, value = approx[where], value[where]
    contexts = residual_contexts(approx, dtype)
    n = 1 << EXPONENT_FIELD[dtype][1]
    counts = np.bincount(contexts, minlength=n)
    sizes = np.bincount(contexts, weights=varint_lengths(zigzag(value)), minlength=n)  # exact: sums below 2^53
    return counts, sizes.astype(np.int64)


def read_residual_groups(data: Buffer, counts: list[int], per_value: int, take: Callable[[int, Buffer], None]) -> None:
    """Read an x_residuals section's groups, one per count (the contexts in ascending order),
    with SPEC.md 8.4's checks in its order: take(j, decoded bytes) checks group j's varints
    before group j + 1 is read; bytes after the last group are refused at the end."""
    cur = ByteCursor(data, "x_residuals")
    for j, count in enumerate(counts):
        codec, stored = cur.group("residual group")
        limit = count * per_value
        raw: Buffer
        if codec == Codec.RAW:
            raw = stored
            if len(raw) > limit:
                raise LimitError("residual group is larger than its values allow", "E_LIMIT_SECTION")
        else:
            if codec != Codec.ZSTD:
                raise FormatError(f"unknown residual group codec {codec}", "E_CODEC")
            declared = frame_content_size(stored)
            if declared > limit:
                raise LimitError("residual group declares more bytes than its values allow", "E_LIMIT_SECTION")
            raw = decompress(stored, Codec.ZSTD, declared, limit)
        take(j, raw)
    if not cur.done:
        raise FormatError("bytes after the last residual group", "E_SECTION_CONTENT")


def decode_residuals(data: Buffer, approx_bits: Array, dtype: str, keep: Array | None = None) -> Array:
    """The residual of every block position (0 where keep is False: a patched position)."""
    out = np.zeros(approx_bits.size, dtype=np.int64)
    groups = context_groups(approx_bits, dtype, keep)

    def take(j: int, raw: Buffer) -> None:
        where = groups[j][1]
        out[where] = unzigzag(decode_varints(raw, where.size))

    read_residual_groups(data, [where.size for _, where in groups], residual_bytes_per_value(bits_of(dtype)), take)
    return out


def apply_residuals(approx: Array, value: Array, width: int) -> Array:
    """approx moved by its residuals, in ordinal steps (SPEC.md 8.4); out of range is E_SECTION_CONTENT."""
    o = bits_to_ordinal(approx, width)
    o += value  # a residual too large for int64 arithmetic lands far out of range, and is refused
    lim = 1 << (width - 1)
    if o.size and (int(o.min()) < -lim or int(o.max()) >= lim):
        raise FormatError("residual moves a value out of range", "E_SECTION_CONTENT")
    return ordinal_to_bits(o, width)


def correct_residuals(data: Buffer, approx: Array, base: Array, dtype: str, keep: Array | None = None) -> Array:
    """The block corrected by an x_residuals section (SPEC.md 8.4): base where keep is False (a
    patched position), approx moved by its residual elsewhere. Compiled where host_native is
    active, with the same checks in the same order; decode_residuals and apply_residuals are
    the reference."""
    if not host_native.active():
        corrected = apply_residuals(approx, decode_residuals(data, approx, dtype, keep), bits_of(dtype))
        return corrected if keep is None else np.where(keep, corrected, base).astype(base.dtype)
    counts = host_native.context_counts(approx, dtype, keep)
    contexts = [int(c) for c in np.flatnonzero(counts)]
    groups: list[Buffer] = [b""] * counts.size

    def take(j: int, raw: Buffer) -> None:
        if not host_native.varints_ok(raw, int(counts[contexts[j]])):
            raise FormatError("varint stream does not hold the declared number of values", "E_SECTION_CONTENT")
        groups[contexts[j]] = raw

    read_residual_groups(data, [int(counts[c]) for c in contexts], residual_bytes_per_value(bits_of(dtype)), take)
    out = host_native.apply_residuals(approx, base, keep, dtype, groups)
    if out is None:
        raise FormatError("residual moves a value out of range", "E_SECTION_CONTENT")
    return out.astype(base.dtype, copy=False).reshape(np.shape(base))


class ResidualsSection(ResidualsRules, SectionCodec[Array]):
    """The residual, in ordinal steps, of every residual position of a symmetric-mode site's
    block, one group per context (SPEC.md 8.4). The value has one entry per block position."""

    compress_whole = False  # its groups are compressed one by one

    def _groups(self, ctx: SiteContext) -> list[tuple[int, Array]]:
        assert ctx.approx is not None, "x_residuals needs the block before correction"
        return context_groups(ctx.approx, ctx.program.symbol_dtype, ctx.keep)

    def encode(self, ctx: SiteContext, value: Array) -> bytes:
        z = section_compressor()
        return b"".join(encode_group(encode_varints(zigzag(value[where])), z) for _, where in self._groups(ctx))

    def decode(self, ctx: SiteContext, data: Buffer) -> Array:
        assert ctx.approx is not None, "x_residuals needs the block before correction"
        return decode_residuals(data, ctx.approx, ctx.program.symbol_dtype, ctx.keep)

    def raw_size(self, ctx: SiteContext, value: Array) -> int:
        """Each group's raw bytes and header, from per-context sums of the varints' lengths
        (the groups' sizes without gathering them: the encoder's bound, side_cost_bound)."""
        assert ctx.approx is not None, "x_residuals needs the block before correction"
        counts, sizes = residual_sizes(ctx.approx, value, ctx.program.symbol_dtype, ctx.keep)
        total = 0
        for c in np.flatnonzero(counts):
            n = int(sizes[c])
            total += len(encode_varint(n)) + 1 + n
        return total

    def tally(self, ctx: SiteContext, data: Buffer) -> Tally:
        """Nonzero residuals, counted without the block (so without its contexts: each group
        is bounded by what the whole block's residuals may take)."""
        limit = ctx.program.sites[ctx.site].n_pop * residual_bytes_per_value(ctx.program.symbol_bits)
        cur, total = ByteCursor(data, "x_residuals"), 0
        while not cur.done:
            codec, stored = cur.group("residual group")
            declared = frame_content_size(stored) if codec == Codec.ZSTD else len(stored)
            raw = decompress(stored, codec, declared, limit)
            n = int(np.count_nonzero((np.frombuffer(raw, np.uint8) & 0x80) == 0))
            total += int(np.count_nonzero(decode_varints(raw, n)))
        return Tally(corrections=total)

    def corrected(self, ctx: SiteContext, value: Array) -> Array:
        """The block with the residuals applied (SPEC.md 8.4); out of range is E_SECTION_CONTENT."""
        assert ctx.approx is not None, "x_residuals needs the block before correction"
        return apply_residuals(ctx.approx, value, ctx.program.symbol_bits)


def decode_patches(data: Buffer, n_total: int, value_bits: int) -> tuple[Array, Array]:
    """(positions, values) of a patch section (SPEC.md 8.5) over n_total values of value_bits."""
    b = np.frombuffer(data, dtype=np.uint8)
    # the count is the first varint
    end = int(np.argmax((b & 0x80) == 0)) if b.size else -1
    if b.size == 0 or (b[end] & 0x80):
        raise FormatError("patch section has no count", "E_SECTION_CONTENT")
    count = int(decode_varints(data[: end + 1], 1)[0])
    vbytes = value_bits // 8
    if count > n_total or count * vbytes > len(data) - end - 1:
        raise FormatError("patch count exceeds the values it can correct", "E_SECTION_CONTENT")
    gap_bytes = len(data) - end - 1 - count * vbytes
    gaps = decode_varints(data[end + 1 : end + 1 + gap_bytes], count)
    pos = np.cumsum(gaps.astype(np.int64) + 1) - 1
    if count and (pos[-1] >= n_total or np.any(gaps > np.uint64(n_total))):
        raise FormatError("patch position out of range", "E_SECTION_CONTENT")
    vals = np.frombuffer(data, dtype=uint_dtype(value_bits), count=count, offset=end + 1 + gap_bytes)
    return pos, vals


class PatchesSection(SectionCodec[Patches]):
    """A count, the gaps between positions and the values (SPEC.md 8.5)."""

    @abstractmethod
    def span(self, ctx: SiteContext) -> tuple[int, int]:
        """(how many values it may correct, their bits)."""

    def encode(self, ctx: SiteContext, value: Patches) -> bytes:
        bits = self.span(ctx)[1]
        count = encode_varint(value.positions.size)
        return count + encode_varints(value.gaps().astype(np.uint64)) + value.values.astype(uint_dtype(bits)).tobytes()

    def decode(self, ctx: SiteContext, data: Buffer) -> Patches:
        return Patches(*decode_patches(data, *self.span(ctx)))

    def raw_size(self, ctx: SiteContext, value: Patches) -> int:
        count = int(value.positions.size)
        gaps = varint_bytes(value.gaps().astype(np.uint64))
        return varint_bytes(np.array([count], np.uint64)) + gaps + count * (self.span(ctx)[1] // 8)

    def tally(self, ctx: SiteContext, data: Buffer) -> Tally:
        return Tally(corrections=ByteCursor(data, self.name).varint("patch count"))


class BlockPatchesSection(BlockPatchesRules, PatchesSection):
    """x_patches: values of the regenerated block, W bits each."""

    def span(self, ctx: SiteContext) -> tuple[int, int]:
        return ctx.program.sites[ctx.site].n_pop, ctx.program.symbol_bits


class AnchorPatchesSection(AnchorPatchesRules, PatchesSection):
    """anchor_patches: elements of the un-rotated anchor, in C order, of the anchor's width."""

    def span(self, ctx: SiteContext) -> tuple[int, int]:
        anchor = ctx.program.tensors[ctx.program.sites[ctx.site].anchor]
        return anchor.numel, bits_of(anchor.dtype)


class BandSection(BandRules, SectionCodec[Array]):
    """A site's band widths (SPEC.md 8.8): float64 little-endian, each finite and > 0."""

    compress_whole = False

    def encode(self, ctx: SiteContext, value: Array) -> bytes:
        return np.asarray(value, "<f8").tobytes()

    def decode(self, ctx: SiteContext, data: Buffer) -> Array:
        if len(data) != self.decoded_limit(ctx.program, ctx.site):
            raise FormatError("band section has the wrong size", "E_SECTION_SIZE")
        return band_widths(data)


PAYLOAD = PayloadSection()
SIGNS = SignsSection()
X_RESIDUALS = ResidualsSection()
X_PATCHES = BlockPatchesSection()
ANCHOR_PATCHES = AnchorPatchesSection()
BAND = BandSection()

SECTION_KINDS: dict[SectionKind, SectionCodec[Any]] = {c.kind: c for c in (PAYLOAD, SIGNS, X_RESIDUALS, X_PATCHES, ANCHOR_PATCHES, BAND)}
"""Every section kind, by kind."""


def section_codec(kind: int) -> SectionCodec[Any]:
    """The codec of a section table entry's kind; an unknown kind is E_SECTION_KIND."""
    return SECTION_KINDS[rules_of(kind).kind]


# ----------------------------------------------------------------------------- what a site stores


@dataclass(frozen=True)
class PlannedSection:
    """A section the writer may store: its kind, where, and the value it encodes."""

    codec: SectionCodec[Any]
    ctx: SiteContext
    value: Any

    def encode(self) -> bytes:
        return self.codec.encode(self.ctx, self.value)

    def raw_cost(self) -> int:
        """An upper bound on the section's cost as stored: its bytes and its table entry."""
        return self.codec.raw_size(self.ctx, self.value) + SECTION_ENTRY_SIZE


@dataclass(frozen=True)
class SitePlan:
    """How a site's SiteFix is stored, in the writer's order (SPEC.md 8.1): `first` (signs,
    band), then one of `block_choices` (the ways to store the block's corrections; none if it needs
    none), then `last` (anchor_patches)."""

    first: list[PlannedSection]
    block_choices: list[list[PlannedSection]]
    last: list[PlannedSection]


def site_plan(program: BlockProgram, site: int, fix: SiteFix) -> SitePlan:
    """The sections that may store a rotated site's fix (SPEC.md 8.1, 12.4)."""
    s = program.sites[site]
    at = SiteContext(program, site)
    first = [PlannedSection(SIGNS, at, fix.signs)] if SIGNS.allowed(s) else []
    if fix.widths is not None:  # 1.4 (bands): the site's band widths
        first.append(PlannedSection(BAND, at, np.asarray(fix.widths, np.float64)))
    choices: list[list[PlannedSection]] = []
    if fix.x_mask is not None and fix.x_mask.any():
        assert fix.x_true is not None
        choices.append([PlannedSection(X_PATCHES, at, Patches.of(fix.x_mask, fix.x_true))])
        if X_RESIDUALS.allowed(s):
            choices.append(_residual_choice(at, fix))
    last = []
    if ANCHOR_PATCHES.allowed(s) and fix.anchor_mask is not None and fix.anchor_mask.any():
        assert fix.anchor_true is not None
        last.append(PlannedSection(ANCHOR_PATCHES, at, Patches.of(fix.anchor_mask, fix.anchor_true)))
    return SitePlan(first, choices, last)


def _residual_choice(at: SiteContext, fix: SiteFix) -> list[PlannedSection]:
    """x_residuals, preceded by x_patches of the band's values if there are any (SPEC.md 8.4,
    MIXED_CORRECTIONS): a value in the band is stored, never given a residual."""
    assert fix.x_mask is not None and fix.x_true is not None and fix.x_approx is not None
    band = fix.x_band if fix.x_band is not None and fix.x_band.any() else None
    deltas = residual_deltas(fix.x_true, fix.x_approx, fix.x_mask, at.program.symbol_dtype)
    residuals = PlannedSection(X_RESIDUALS, replace(at, approx=fix.x_approx, keep=None if band is None else ~band), deltas)
    if band is None:
        return [residuals]
    return [PlannedSection(X_PATCHES, at, Patches.of(band, fix.x_true)), residuals]

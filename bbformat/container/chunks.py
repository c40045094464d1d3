"""Chunk bytes <-> (block program, sections), with every MUST-reject check."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Protocol

import numpy as np

from ..constants import (
    payload_codecs,
    CHUNK_FIXED_SIZE,
    CHUNK_MAGIC,
    CRC_SIZE,
    DTYPE_CODES,
    DTYPE_NAMES,
    EXTENDED_DTYPES,
    FLOAT_DTYPES,
    MAX_DESCRIPTOR,
    MAX_NDIM,
    MAX_SECTIONS_PER_CHUNK,
    MAX_SITE_DIM,
    MAX_EXPONENT_TABLES,
    MAX_PLANES_CLASSES,
    MAX_TENSOR_ELEMENTS,
    MIN_CHUNK_LENGTH,
    NO_SITE,
    RANS_PRECISION_BITS,
    SECTION_ENTRY_SIZE,
    Codec,
    RequiredFlag,
    SectionKind,
)
from ..errors import FormatError, IntegrityError, LimitError
from ..zstdframe import Buffer, decompress
from . import records as R
from .crc import crc32c
from .program import AxisRef, BlockProgram, Op, SiteEntry, TensorEntry, bits_of
from .section_rules import SectionRules, band_widths, payload_dtype, rules_of, site_sections_limit

PayloadDecoder = Callable[[int, Buffer, BlockProgram, int], np.ndarray]
"""Payload codecs 2, 3 and 4 (SPEC.md 8.6, 8.7, 8.9): (codec, stored bytes, program, the
header's required flags) -> the payload symbols. The codec layer's
(codec.payload.decode_payload); a reader passes it to parse_chunk."""
ENTROPY_CODECS = (Codec.PLANES, Codec.EXPONENT, Codec.PARTS)
"""The payload codecs that need a PayloadDecoder."""


class StoredSection(Protocol):
    """What a chunk is built from, per section (codec.sections.Section is one)."""

    @property
    def kind(self) -> int: ...

    @property
    def site(self) -> int: ...

    @property
    def codec(self) -> int: ...

    @property
    def data(self) -> bytes: ...  # decoded

    @property
    def stored(self) -> bytes: ...


def program_record(p: BlockProgram) -> dict[str, Any]:
    """A program as the fields of its descriptor (SPEC.md 5.1), ready for construct to build."""
    return dict(
        name=p.name,
        symbol_dtype=DTYPE_CODES[p.symbol_dtype],
        reserved0=0,
        reserved1=0,
        tensors=[dict(name=t.name, dtype=DTYPE_CODES[t.dtype], ndim=len(t.shape), reserved=0, dims=list(t.shape)) for t in p.tensors],
        sites=[
            dict(
                name=s.name,
                dim=s.dim,
                anchor=s.anchor,
                anchor_axis=s.anchor_axis,
                flags=s.flags,
                reserved=0,
                followers=[dict(tensor=f.tensor, axis=f.axis, reserved=0) for f in s.followers],
            )
            for s in p.sites
        ],
        ops=[dict(kind=o.kind, reserved0=0, reserved1=0, index=o.index) for o in p.ops],
    )


class BuiltChunk(NamedTuple):
    """A chunk as the pieces it is written from (the sections are not copied into one buffer)."""

    parts: list[Buffer]
    length: int
    crc: int


def build_chunk_parts(index: int, program: BlockProgram, sections: Sequence[StoredSection], content_crc: int = 0) -> BuiltChunk:
    """content_crc: the decoded tensors' digest (SPEC.md 5.4) in a file with FLAG_DIGESTS, else 0."""
    desc = R.DESCRIPTOR.build(program_record(program))
    table_end = CHUNK_FIXED_SIZE + len(desc) + SECTION_ENTRY_SIZE * len(sections)
    entries = []
    off = table_end
    for s in sections:
        entries.append(
            R.SECTION_ENTRY.build(
                dict(kind=s.kind, codec=s.codec, reserved=0, site=s.site, offset=off, stored_length=len(s.stored), decoded_length=len(s.data))
            )
        )
        off += len(s.stored)
    length = off + CRC_SIZE
    head = R.CHUNK_FIXED.build(
        dict(content_crc=content_crc, chunk_length=length, chunk_index=index, descriptor_length=len(desc), section_count=len(sections), reserved1=0)
    )
    parts: list[Buffer] = [head + desc + b"".join(entries), *(s.stored for s in sections)]
    crc = 0
    for part in parts:
        crc = crc32c(part, crc)
    return BuiltChunk([*parts, crc.to_bytes(CRC_SIZE, "little")], length, crc)


def build_chunk(index: int, program: BlockProgram, sections: Sequence[StoredSection], content_crc: int = 0) -> bytes:
    """The chunk's bytes, CRC included."""
    return b"".join(build_chunk_parts(index, program, sections, content_crc).parts)


@dataclass
class ParsedChunk:
    index: int
    program: BlockProgram
    payload: np.ndarray
    side: dict[tuple[int, int], bytes]
    sections: list[dict[str, Any]]  # table entries, for inspection
    crc: int
    content_crc: int | None = None  # the recorded digest of the decoded tensors (FLAG_DIGESTS), else None


def _check_reserved(value: int, what: str) -> None:
    if value != 0:
        raise FormatError(f"reserved field {what} is not zero", "E_RESERVED")


def known_dtypes(required_flags: int) -> dict[int, str]:
    """Code -> name of the dtypes a file with these flags may use (SPEC.md 6.1): codes 4-15 only
    with DTYPES (1.6)."""
    extended = bool(required_flags & RequiredFlag.DTYPES)
    return {c: n for c, n in DTYPE_NAMES.items() if extended or n not in EXTENDED_DTYPES}


def parse_descriptor(data: bytes, required_flags: int = 0) -> BlockProgram:
    """A chunk descriptor's bytes (SPEC.md 5.1) as a validated block program, in a file with
    these required flags (which dtype codes are known)."""
    rec = R.read_descriptor(data)
    _check_reserved(rec["reserved0"] | rec["reserved1"], "descriptor")
    dtypes = known_dtypes(required_flags)
    if rec["symbol_dtype"] not in dtypes:
        raise FormatError(f"unknown symbol dtype code {rec['symbol_dtype']}", "E_DTYPE")
    tensors = [_tensor_entry(t, dtypes) for t in rec["tensors"]]
    sites = [_site_entry(s) for s in rec["sites"]]
    ops = []
    for o in rec["ops"]:
        _check_reserved(o["reserved0"] | o["reserved1"], "op")
        ops.append(Op(o["kind"], o["index"]))
    program = BlockProgram(rec["name"], DTYPE_NAMES[rec["symbol_dtype"]], tensors, sites, ops)
    program.validate()
    return program


def _tensor_entry(t: dict[str, Any], dtypes: dict[int, str]) -> TensorEntry:
    name, dtype, ndim, dims = t["name"], t["dtype"], t["ndim"], t["dims"]
    _check_reserved(t["reserved"], "tensor")
    if dtype not in dtypes:
        raise FormatError(f"tensor {name!r} has unknown dtype code {dtype}", "E_DTYPE")
    if ndim > MAX_NDIM:
        raise LimitError(f"tensor {name!r} has {ndim} dimensions", "E_LIMIT_NDIM")
    numel = nonzero = 1
    for d in dims:
        numel *= d
        nonzero *= d or 1
    # Non-zero dims multiplying past the element limit are refused even when another dim is
    # 0 (a reader's own limit, SPEC.md 11.4): numpy cannot represent such a shape.
    if numel > MAX_TENSOR_ELEMENTS or nonzero > MAX_TENSOR_ELEMENTS:
        raise LimitError(f"tensor {name!r} is too large", "E_LIMIT_TENSOR")
    return TensorEntry(name, DTYPE_NAMES[dtype], tuple(dims))


def _site_entry(s: dict[str, Any]) -> SiteEntry:
    _check_reserved(s["reserved"], "site")
    for f in s["followers"]:
        _check_reserved(f["reserved"], "follower")
    if s["dim"] > MAX_SITE_DIM:
        raise LimitError(f"site {s['name']!r} dimension {s['dim']} exceeds {MAX_SITE_DIM}", "E_LIMIT_DIM")
    followers = tuple(AxisRef(f["tensor"], f["axis"]) for f in s["followers"])
    return SiteEntry(s["name"], s["dim"], s["anchor"], s["anchor_axis"], s["flags"], followers)


def descriptor_extent(head: bytes, chunk_length: int) -> tuple[int, int]:
    """(offset, length) of the descriptor inside a chunk, from its fixed header, checked against
    the chunk's length from the index before anything is read (the CRC is checked only when
    the whole chunk is read)."""
    if len(head) != CHUNK_FIXED_SIZE or head[: len(CHUNK_MAGIC)] != CHUNK_MAGIC:
        raise FormatError("bad chunk magic", "E_MAGIC")
    fixed = R.CHUNK_FIXED.parse(head)
    if fixed.chunk_length != chunk_length:
        raise FormatError("chunk length field disagrees with its extent", "E_BOUNDS")
    if fixed.descriptor_length > MAX_DESCRIPTOR:
        raise LimitError("chunk descriptor too large", "E_LIMIT_COUNT")
    if CHUNK_FIXED_SIZE + fixed.descriptor_length > chunk_length - CRC_SIZE:
        raise FormatError("chunk descriptor runs past the chunk", "E_BOUNDS")
    return CHUNK_FIXED_SIZE, int(fixed.descriptor_length)


def working_set_bytes(program: BlockProgram, chunk_length: int, planes: bool = False, mixed: bool = False,
                      exponent: bool = False, bands: bool = False) -> int:
    """The declared working set of decoding one chunk (SPEC.md 11.5): what a decoder needs at
    most, computed from the descriptor (and, for `planes` or `exponent`, the payload's codec 2,
    or 3 or 4) before any section is decompressed."""
    w8 = program.symbol_bits // 8
    side = sum(site_sections_limit(program, i, mixed, bands) for i in range(len(program.sites)))
    site_work = 0
    for s in program.sites:
        if not s.plain:
            site_work = max(site_work, 8 * (3 * program.tensors[s.anchor].numel + 6 * s.dim * s.dim))
    tensors = sum(t.numel * bits_of(t.dtype) // 8 for t in program.tensors)
    payload = program.payload_symbols() * w8
    p = program.payload_symbols()
    planes_work = 10 * p if planes else 0  # contexts, their order, one plane
    if exponent:  # entries, rest fields, one batch of table ids; each table's slot lookup
        planes_work = 12 * p + (4 << RANS_PRECISION_BITS) * min(MAX_EXPONENT_TABLES, MAX_PLANES_CLASSES * p)
    return chunk_length + 2 * payload + side + program.stack_peak_symbols() * w8 + tensors + site_work + planes_work


def declared_working_set(program: BlockProgram, chunk_length: int, payload_codecs: Sequence[int], required_flags: int) -> int:
    """working_set_bytes as a reader declares it (SPEC.md 11.5): the payload's codec (2, or 3
    or 4) from its section entries, and the header's flags."""
    return working_set_bytes(program, chunk_length, Codec.PLANES in payload_codecs, bool(required_flags & RequiredFlag.MIXED_CORRECTIONS),
                             Codec.EXPONENT in payload_codecs or Codec.PARTS in payload_codecs, bool(required_flags & RequiredFlag.BANDS))


def head_working_set(descriptor: bytes, table: bytes, chunk_length: int, required_flags: int) -> int:
    """A chunk's declared working set from its first bytes alone, before the rest is read: its
    descriptor (descriptor_extent) and its section table (table_extent).
    FormatError or LimitError where they cannot be parsed; parse_chunk meets the same."""
    program = parse_descriptor(descriptor, required_flags)
    if len(table) % SECTION_ENTRY_SIZE:
        raise FormatError("section table is cut short", "E_BOUNDS")
    kinds = [R.SECTION_ENTRY.parse(table[i : i + SECTION_ENTRY_SIZE]) for i in range(0, len(table), SECTION_ENTRY_SIZE)]
    return declared_working_set(program, chunk_length, [e.codec for e in kinds if e.kind == SectionKind.PAYLOAD], required_flags)


def table_extent(head: bytes, chunk_length: int) -> tuple[int, int]:
    """(offset, length) of the section table inside a chunk, from its fixed header, checked as
    parse_chunk checks it."""
    off, n = descriptor_extent(head, chunk_length)
    count = int(R.CHUNK_FIXED.parse(head).section_count)
    if count > MAX_SECTIONS_PER_CHUNK:
        raise LimitError("chunk section table too large", "E_LIMIT_COUNT")
    if off + n + SECTION_ENTRY_SIZE * count > chunk_length - CRC_SIZE:
        raise FormatError("chunk descriptor or section table runs past the chunk", "E_BOUNDS")
    return off + n, SECTION_ENTRY_SIZE * count


def _check_place(program: BlockProgram, rules: SectionRules, site: int) -> None:
    """A section's site field names the site its kind may belong to (SPEC.md 8.1): NO_SITE for
    the payload, else a site where the kind is allowed (E_SECTION_KIND)."""
    if site != NO_SITE and site >= len(program.sites):
        raise FormatError(f"{rules.name} section names a site that does not exist", "E_SECTION_KIND")
    entry = None if site == NO_SITE else program.sites[site]
    if not rules.allowed(entry):
        where = "without a site" if entry is None else f"for site {entry.name!r}"
        raise FormatError(f"section kind {rules.name} not allowed {where}", "E_SECTION_KIND")


def parse_chunk(
    data: Buffer,
    expected_index: int | None = None,
    expected_crc: int | None = None,
    check_crc: bool = True,
    max_block_bytes: int | None = None,
    max_site_dim: int | None = None,
    required_flags: int = 0,
    decode_payload: PayloadDecoder | None = None,
) -> ParsedChunk:
    """Parse and validate one chunk's bytes (the whole chunk, CRC included). With
    max_block_bytes, a chunk whose declared working set is larger is refused (E_LIMIT_MEMORY)
    before any section is decompressed. required_flags: the header's; FLAG_PLANES allows
    payload codec 2, FLAG_EXPONENT codec 3 and FLAG_PARTS codec 4, FLAG_DIGESTS makes offset 4 the content digest,
    FLAG_MIXED_CORRECTIONS lets x_residuals and x_patches share a site, FLAG_BANDS allows (and
    asks for) a band section per non-PLAIN site. decode_payload: the
    payload decoder of codecs 2 and 3 (codec.payload.decode_payload); without it such a
    payload is refused (E_CODEC)."""
    mixed = bool(required_flags & RequiredFlag.MIXED_CORRECTIONS)
    bands = bool(required_flags & RequiredFlag.BANDS)
    if len(data) < MIN_CHUNK_LENGTH:
        raise FormatError("chunk is truncated", "E_TRUNCATED")
    if data[: len(CHUNK_MAGIC)] != CHUNK_MAGIC:
        raise FormatError("bad chunk magic", "E_MAGIC")
    head = R.CHUNK_FIXED.parse(data[: CHUNK_FIXED_SIZE])
    digests = bool(required_flags & RequiredFlag.DIGESTS)
    _check_reserved(head.reserved1 | (0 if digests else head.content_crc), "chunk header")
    if head.chunk_length != len(data):
        raise FormatError("chunk length field disagrees with its extent", "E_BOUNDS")
    stored_crc = int.from_bytes(data[-CRC_SIZE:], "little")
    view = memoryview(data)  # sections and the CRC range are read through it: no copies of a block
    if check_crc and crc32c(view[:-CRC_SIZE]) != stored_crc:
        raise IntegrityError(f"chunk {head.chunk_index}: CRC32C mismatch", "E_CRC_CHUNK")
    if check_crc and expected_crc is not None and expected_crc != stored_crc:
        raise IntegrityError(f"chunk {head.chunk_index}: index CRC differs from the chunk's", "E_CRC_INDEX_ENTRY")
    if expected_index is not None and head.chunk_index != expected_index:
        raise FormatError(f"chunk number {head.chunk_index} found where {expected_index} was expected", "E_CHUNK_ORDER")
    if head.descriptor_length > MAX_DESCRIPTOR or head.section_count > MAX_SECTIONS_PER_CHUNK:
        raise LimitError("chunk descriptor or section table too large", "E_LIMIT_COUNT")
    table_off = CHUNK_FIXED_SIZE + head.descriptor_length
    table_end = table_off + SECTION_ENTRY_SIZE * head.section_count
    if table_end > len(data) - CRC_SIZE:
        raise FormatError("chunk descriptor or section table runs past the chunk", "E_BOUNDS")
    program = parse_descriptor(bytes(data[CHUNK_FIXED_SIZE:table_off]), required_flags)
    if max_site_dim is not None:  # the caller's time budget: an eigendecomposition costs O(D^3)
        for s in program.sites:
            if not s.plain and s.dim > max_site_dim:
                raise LimitError(f"site {s.name!r} has D = {s.dim}; this reader's limit is {max_site_dim}", "E_LIMIT_DIM")
    codecs = payload_codecs(required_flags, program.symbol_dtype)
    entries = [R.SECTION_ENTRY.parse(data[table_off + i * SECTION_ENTRY_SIZE : table_off + (i + 1) * SECTION_ENTRY_SIZE])
               for i in range(head.section_count)]
    pos = table_end
    payload = None
    side: dict[tuple[int, int], bytes] = {}
    seen: set[tuple[int, int]] = set()
    for e in entries:
        _check_reserved(e.reserved, "section")
        if e.kind == SectionKind.BAND and not bands:
            raise FormatError("band section (kind 6) in a file without BANDS", "E_SECTION_KIND")
        rules = rules_of(e.kind)
        if e.codec not in codecs or e.codec not in rules.codecs:
            raise FormatError(f"unknown section codec {e.codec}" + (" for this section kind" if e.codec in codecs else "")
                              + ("" if program.symbol_dtype in FLOAT_DTYPES else f" (symbol dtype {program.symbol_dtype})"), "E_CODEC")
        if e.offset != pos or e.stored_length > len(data) - CRC_SIZE - pos:
            raise FormatError("sections must be contiguous, in table order, inside the chunk", "E_BOUNDS")
        pos += e.stored_length
        _check_place(program, rules, e.site)
        key = (e.kind, e.site)
        if key in seen or (not mixed and any((alt, e.site) in seen for alt in rules.alternatives)):
            raise FormatError("duplicate section", "E_SECTION_DUPLICATE")
        seen.add(key)
        limit = rules.decoded_limit(program, e.site)
        if rules.exact_declared and e.decoded_length != limit:
            raise FormatError(f"{rules.name} holds {e.decoded_length} bytes; the program needs {limit}", rules.exact_declared)
        if max_block_bytes is not None:  # once, after the first entry's size checks, before anything is decompressed
            need = declared_working_set(program, len(data), [x.codec for x in entries if x.kind == SectionKind.PAYLOAD],
                                        required_flags)
            if need > max_block_bytes:
                raise LimitError(
                    f"chunk {head.chunk_index} ({program.name!r}) needs up to {need:,} bytes to decode; the limit is {max_block_bytes:,}",
                    "E_LIMIT_MEMORY",
                )
            max_block_bytes = None
        stored = view[e.offset : e.offset + e.stored_length]
        if e.codec in ENTROPY_CODECS:
            if decode_payload is None:
                raise FormatError(f"payload codec {e.codec}: this parser was given no payload decoder", "E_CODEC")
            payload = decode_payload(e.codec, stored, program, required_flags)
            continue
        raw = decompress(stored, e.codec, e.decoded_length, limit)
        if e.kind == SectionKind.PAYLOAD:  # read-only; the decoder copies it once, into its stack
            payload = np.frombuffer(raw, dtype=payload_dtype(program))
        elif rules.exact_decoded and e.decoded_length != limit:
            raise FormatError(f"{rules.name} section has the wrong size", rules.exact_decoded)
        else:
            side[key] = bytes(raw)
            if e.kind == SectionKind.BAND:
                band_widths(raw)
    if pos != len(data) - CRC_SIZE:
        raise FormatError("bytes between the last section and the chunk CRC", "E_BOUNDS")
    if payload is None:
        raise FormatError("chunk has no payload section", "E_SECTION_MISSING")
    for i, site in enumerate(program.sites):
        if bands and not site.plain and (SectionKind.BAND, i) not in seen:
            raise FormatError(f"site {site.name!r} has no band section", "E_SECTION_MISSING")
    return ParsedChunk(int(head.chunk_index), program, payload, side, [dict(e) for e in entries], stored_crc,
                       int(head.content_crc) if digests else None)

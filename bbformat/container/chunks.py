"""Chunk bytes <-> (block program, sections), with every MUST-reject check."""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..codec.dtypes import DTYPE_CODES, DTYPE_NAMES, bits_of, uint_dtype
from ..codec.entropy import CODEC_PLANES, decode_planes
from ..codec.program import BlockProgram, FollowerEntry, Op, SiteEntry, TensorEntry
from ..codec.sections import (
    CODEC_RAW,
    CODEC_ZSTD,
    KIND_ANCHOR_PATCHES,
    KIND_NAMES,
    KIND_PAYLOAD,
    KIND_SIGNS,
    KIND_X_PATCHES,
    KIND_X_RESIDUALS,
    NO_SITE,
    Buffer,
    Section,
    decoded_limit,
    decompress,
)
from ..errors import FormatError, IntegrityError, LimitError
from . import records as R
from .crc import crc32c


def _program_to_record(p: BlockProgram) -> dict:
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


def build_chunk_parts(index: int, program: BlockProgram, sections: list[Section], content_crc: int = 0) -> BuiltChunk:
    """content_crc: the decoded tensors' digest (SPEC.md 5.4) in a file with FLAG_DIGESTS, else 0."""
    desc = R.DESCRIPTOR.build(_program_to_record(program))
    table_end = R.CHUNK_FIXED_SIZE + len(desc) + R.SECTION_ENTRY_SIZE * len(sections)
    entries = []
    off = table_end
    for s in sections:
        entries.append(
            R.SECTION_ENTRY.build(
                dict(kind=s.kind, codec=s.codec, reserved=0, site=s.site, offset=off, stored_length=len(s.stored), decoded_length=len(s.data))
            )
        )
        off += len(s.stored)
    length = off + 4
    head = R.CHUNK_FIXED.build(
        dict(content_crc=content_crc, chunk_length=length, chunk_index=index, descriptor_length=len(desc), section_count=len(sections), reserved1=0)
    )
    parts: list[Buffer] = [head + desc + b"".join(entries), *(s.stored for s in sections)]
    crc = 0
    for part in parts:
        crc = crc32c(part, crc)
    return BuiltChunk([*parts, crc.to_bytes(4, "little")], length, crc)


def build_chunk(index: int, program: BlockProgram, sections: list[Section], content_crc: int = 0) -> bytes:
    """The chunk's bytes, CRC included."""
    return b"".join(build_chunk_parts(index, program, sections, content_crc).parts)


@dataclass
class ParsedChunk:
    index: int
    program: BlockProgram
    payload: np.ndarray
    side: dict[tuple[int, int], bytes]
    sections: list[dict]  # table entries, for inspection
    crc: int
    content_crc: int | None = None  # the recorded digest of the decoded tensors (FLAG_DIGESTS), else None


def _check_reserved(value: int, what: str) -> None:
    if value != 0:
        raise FormatError(f"reserved field {what} is not zero", "E_RESERVED")


class _Tensor(NamedTuple):
    name: str
    dtype: int
    ndim: int
    reserved: int
    dims: list[int]


class _Follower(NamedTuple):
    tensor: str
    axis: int
    reserved: int


class _Site(NamedTuple):
    name: str
    dim: int
    anchor: int
    anchor_axis: int
    flags: int
    reserved: int
    followers: list[_Follower]


class _Op(NamedTuple):
    kind: int
    reserved0: int
    reserved1: int
    index: int


class _Descriptor(NamedTuple):
    name: str
    symbol_dtype: int
    reserved0: int
    reserved1: int
    tensors: list[_Tensor]
    sites: list[_Site]
    ops: list[_Op]


class _Scan:
    """Structural parse of a descriptor (SPEC.md 5.1), plain struct over a memoryview."""

    def __init__(self, data: bytes) -> None:
        self.data = memoryview(data)
        self.pos = 0

    def take(self, n: int) -> memoryview:
        if n > len(self.data) - self.pos:
            raise FormatError("malformed chunk descriptor: a record runs past its end", "E_DESCRIPTOR")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def need(self, count: int, min_size: int, what: str) -> None:
        """Records that cannot fit in what is left are a structural error, known at once."""
        if count * min_size > len(self.data) - self.pos:
            raise FormatError(f"malformed chunk descriptor: {count:,} {what} cannot fit in its length", "E_DESCRIPTOR")

    def u(self, fmt: str) -> tuple[int, ...]:
        st = struct.Struct("<" + fmt)
        return st.unpack(self.take(st.size))

    def name(self) -> str:
        (n,) = self.u("H")
        raw = self.take(n)
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError:
            raise FormatError("malformed chunk descriptor: a name is not UTF-8", "E_DESCRIPTOR") from None


MAX_FOLLOWERS_PER_CHUNK = 1 << 16  # the reference's own limit (SPEC.md 11.4)


def _over(what: str, n: int, limit: int) -> LimitError:
    return LimitError(f"{n:,} {what} in one chunk (limit {limit:,})", "E_LIMIT_COUNT")


def _scan_descriptor(data: bytes) -> _Descriptor:
    """Counts over a limit are refused as soon as they are read: such a descriptor breaks a
    limit whatever else it breaks (SPEC.md 11.3, last paragraph), and refusing early keeps the
    work bounded by the limits, not by the descriptor's length."""
    sc = _Scan(data)
    name = sc.name()
    sym, r0, r1, tcount = sc.u("BBHI")
    sc.need(tcount, 6, "tensor records")
    if tcount > R.MAX_TENSORS_PER_CHUNK:
        raise _over("tensors", tcount, R.MAX_TENSORS_PER_CHUNK)
    tensors = []
    for _ in range(tcount):
        tname = sc.name()
        dt, nd, res = sc.u("BBH")
        tensors.append(_Tensor(tname, dt, nd, res, list(sc.u(f"{nd}Q")) if nd else []))
    (scount,) = sc.u("I")
    sc.need(scount, 18, "site records")
    if scount > R.MAX_SITES_PER_CHUNK:
        raise _over("sites", scount, R.MAX_SITES_PER_CHUNK)
    sites = []
    nfollow = 0
    for _ in range(scount):
        sname = sc.name()
        dim, anchor, axis, flags, res, fcount = sc.u("IIBBHI")
        sc.need(fcount, 4, "follower records")
        nfollow += fcount
        if nfollow > MAX_FOLLOWERS_PER_CHUNK:
            raise _over("followers", nfollow, MAX_FOLLOWERS_PER_CHUNK)
        followers = []
        for _ in range(fcount):
            fname = sc.name()
            faxis, fres = sc.u("BB")
            followers.append(_Follower(fname, faxis, fres))
        sites.append(_Site(sname, dim, anchor, axis, flags, res, followers))
    (ocount,) = sc.u("I")
    if ocount > tcount + scount:
        raise FormatError(f"{ocount:,} ops for {tcount} tensors and {scount} sites", "E_DESCRIPTOR")
    ops = [_Op(*v) for v in struct.iter_unpack("<BBHI", sc.take(8 * ocount))]
    if sc.pos != len(data):
        raise FormatError("chunk descriptor length does not match its contents", "E_DESCRIPTOR")
    return _Descriptor(name, sym, r0, r1, tensors, sites, ops)


def parse_descriptor(data: bytes) -> BlockProgram:
    """A chunk descriptor's bytes (SPEC.md 5.1) as a validated block program."""
    rec = _scan_descriptor(data)
    _check_reserved(rec.reserved0 | rec.reserved1, "descriptor")
    if rec.symbol_dtype not in DTYPE_NAMES:
        raise FormatError(f"unknown symbol dtype code {rec.symbol_dtype}", "E_DTYPE")
    tensors = []
    for t in rec.tensors:
        _check_reserved(t.reserved, "tensor")
        if t.dtype not in DTYPE_NAMES:
            raise FormatError(f"tensor {t.name!r} has unknown dtype code {t.dtype}", "E_DTYPE")
        if t.ndim > R.MAX_NDIM:
            raise LimitError(f"tensor {t.name!r} has {t.ndim} dimensions", "E_LIMIT_NDIM")
        numel = nonzero = 1
        for d in t.dims:
            numel *= d
            nonzero *= d or 1
        # Non-zero dims multiplying past the element limit are refused even when another dim is
        # 0 (a reader's own limit, SPEC.md 11.4): numpy cannot represent such a shape.
        if numel > R.MAX_TENSOR_ELEMENTS or nonzero > R.MAX_TENSOR_ELEMENTS:
            raise LimitError(f"tensor {t.name!r} is too large", "E_LIMIT_TENSOR")
        tensors.append(TensorEntry(t.name, DTYPE_NAMES[t.dtype], tuple(int(d) for d in t.dims)))
    sites = []
    for s in rec.sites:
        _check_reserved(s.reserved, "site")
        for f in s.followers:
            _check_reserved(f.reserved, "follower")
        if s.dim > R.MAX_SITE_DIM:
            raise LimitError(f"site {s.name!r} dimension {s.dim} exceeds {R.MAX_SITE_DIM}", "E_LIMIT_DIM")
        sites.append(
            SiteEntry(s.name, int(s.dim), int(s.anchor), int(s.anchor_axis), int(s.flags), tuple(FollowerEntry(f.tensor, int(f.axis)) for f in s.followers))
        )
    ops = []
    for o in rec.ops:
        _check_reserved(o.reserved0 | o.reserved1, "op")
        ops.append(Op(int(o.kind), int(o.index)))
    program = BlockProgram(rec.name, DTYPE_NAMES[rec.symbol_dtype], tensors, sites, ops)
    program.validate()
    return program


def descriptor_extent(head: bytes, chunk_length: int) -> tuple[int, int]:
    """(offset, length) of the descriptor inside a chunk, from its fixed header, checked against
    the chunk's length from the index before anything is read (the CRC is checked only when
    the whole chunk is read)."""
    if len(head) != R.CHUNK_FIXED_SIZE or head[:4] != R.CHUNK_MAGIC:
        raise FormatError("bad chunk magic", "E_MAGIC")
    fixed = R.CHUNK_FIXED.parse(head)
    if fixed.chunk_length != chunk_length:
        raise FormatError("chunk length field disagrees with its extent", "E_BOUNDS")
    if fixed.descriptor_length > R.MAX_DESCRIPTOR:
        raise LimitError("chunk descriptor too large", "E_LIMIT_COUNT")
    if R.CHUNK_FIXED_SIZE + fixed.descriptor_length > chunk_length - 4:
        raise FormatError("chunk descriptor runs past the chunk", "E_BOUNDS")
    return R.CHUNK_FIXED_SIZE, int(fixed.descriptor_length)


def working_set_bytes(program: BlockProgram, chunk_length: int, planes: bool = False, mixed: bool = False) -> int:
    """The declared working set of decoding one chunk (SPEC.md 11.5): what a decoder needs at
    most, computed from the descriptor (and, for `planes`, the payload's codec 2) before any
    section is decompressed."""
    w8 = program.symbol_bits // 8
    side = site_work = 0
    for i, s in enumerate(program.sites):
        if s.plain:
            continue
        if s.paper:  # signs, x_patches and anchor_patches may all be present
            side += sum(decoded_limit(program, k, i) for k in (KIND_SIGNS, KIND_X_PATCHES, KIND_ANCHOR_PATCHES))
        else:  # x_residuals or x_patches; both only with FLAG_MIXED_CORRECTIONS
            limits = [decoded_limit(program, k, i) for k in (KIND_X_RESIDUALS, KIND_X_PATCHES)]
            side += sum(limits) if mixed else max(limits)
        a = program.tensors[s.anchor].numel
        site_work = max(site_work, 8 * (3 * a + 6 * s.dim * s.dim))
    tensors = sum(t.numel * bits_of(t.dtype) // 8 for t in program.tensors)
    payload = program.payload_symbols() * w8
    planes_work = 10 * program.payload_symbols() if planes else 0  # contexts, their order, one plane
    return chunk_length + 2 * payload + side + program.stack_peak_symbols() * w8 + tensors + site_work + planes_work


def parse_chunk(
    data: Buffer,
    expected_index: int | None = None,
    expected_crc: int | None = None,
    check_crc: bool = True,
    max_block_bytes: int | None = None,
    max_site_dim: int | None = None,
    required_flags: int = 0,
) -> ParsedChunk:
    """Parse and validate one chunk's bytes (the whole chunk, CRC included). With
    max_block_bytes, a chunk whose declared working set is larger is refused (E_LIMIT_MEMORY)
    before any section is decompressed. required_flags: the header's; FLAG_PLANES allows
    payload codec 2, FLAG_DIGESTS makes offset 4 the content digest, FLAG_MIXED_CORRECTIONS
    lets x_residuals and x_patches share a site."""
    mixed = bool(required_flags & R.FLAG_MIXED_CORRECTIONS)
    codecs = (CODEC_RAW, CODEC_ZSTD, CODEC_PLANES) if required_flags & R.FLAG_PLANES else (CODEC_RAW, CODEC_ZSTD)
    if len(data) < R.CHUNK_FIXED_SIZE + 4:
        raise FormatError("chunk is truncated", "E_TRUNCATED")
    if data[:4] != R.CHUNK_MAGIC:
        raise FormatError("bad chunk magic", "E_MAGIC")
    head = R.CHUNK_FIXED.parse(data[: R.CHUNK_FIXED_SIZE])
    digests = bool(required_flags & R.FLAG_DIGESTS)
    _check_reserved(head.reserved1 | (0 if digests else head.content_crc), "chunk header")
    if head.chunk_length != len(data):
        raise FormatError("chunk length field disagrees with its extent", "E_BOUNDS")
    stored_crc = int.from_bytes(data[-4:], "little")
    view = memoryview(data)  # sections and the CRC range are read through it: no copies of a block
    if check_crc and crc32c(view[:-4]) != stored_crc:
        raise IntegrityError(f"chunk {head.chunk_index}: CRC32C mismatch", "E_CRC_CHUNK")
    if check_crc and expected_crc is not None and expected_crc != stored_crc:
        raise IntegrityError(f"chunk {head.chunk_index}: index CRC differs from the chunk's", "E_CRC_INDEX_ENTRY")
    if expected_index is not None and head.chunk_index != expected_index:
        raise FormatError(f"chunk number {head.chunk_index} found where {expected_index} was expected", "E_CHUNK_ORDER")
    if head.descriptor_length > R.MAX_DESCRIPTOR or head.section_count > R.MAX_SECTIONS_PER_CHUNK:
        raise LimitError("chunk descriptor or section table too large", "E_LIMIT_COUNT")
    table_off = R.CHUNK_FIXED_SIZE + head.descriptor_length
    table_end = table_off + R.SECTION_ENTRY_SIZE * head.section_count
    if table_end > len(data) - 4:
        raise FormatError("chunk descriptor or section table runs past the chunk", "E_BOUNDS")
    program = parse_descriptor(bytes(data[R.CHUNK_FIXED_SIZE:table_off]))
    if max_site_dim is not None:  # the caller's time budget: an eigendecomposition costs O(D^3)
        for s in program.sites:
            if not s.plain and s.dim > max_site_dim:
                raise LimitError(f"site {s.name!r} has D = {s.dim}; this reader's limit is {max_site_dim}", "E_LIMIT_DIM")
    entries = [R.SECTION_ENTRY.parse(data[table_off + i * 32 : table_off + (i + 1) * 32]) for i in range(head.section_count)]
    pos = table_end
    payload = None
    side: dict[tuple[int, int], bytes] = {}
    seen: set[tuple[int, int]] = set()
    for e in entries:
        _check_reserved(e.reserved, "section")
        if e.kind not in KIND_NAMES:
            raise FormatError(f"unknown section kind {e.kind}", "E_SECTION_KIND")
        if e.codec not in codecs or (e.codec == CODEC_PLANES and e.kind != KIND_PAYLOAD):
            raise FormatError(f"unknown section codec {e.codec}" + (" for this section kind" if e.codec in codecs else ""), "E_CODEC")
        if e.offset != pos or e.stored_length > len(data) - 4 - pos:
            raise FormatError("sections must be contiguous, in table order, inside the chunk", "E_BOUNDS")
        pos += e.stored_length
        if e.kind == KIND_PAYLOAD:
            if e.site != NO_SITE:
                raise FormatError("payload section must not name a site", "E_SECTION_KIND")
        elif e.site >= len(program.sites):
            raise FormatError("section names a site that does not exist", "E_SECTION_KIND")
        else:
            site = program.sites[e.site]
            allowed = {KIND_X_RESIDUALS, KIND_X_PATCHES}
            if site.paper:
                allowed |= {KIND_SIGNS, KIND_ANCHOR_PATCHES}
                allowed.discard(KIND_X_RESIDUALS)
            if site.plain or e.kind not in allowed:
                raise FormatError(f"section kind {KIND_NAMES[e.kind]} not allowed for site {site.name!r}", "E_SECTION_KIND")
        key = (e.kind, e.site)
        if key in seen or (not mixed and e.kind in (KIND_X_RESIDUALS, KIND_X_PATCHES)
                           and ({(KIND_X_RESIDUALS, e.site), (KIND_X_PATCHES, e.site)} & seen)):
            raise FormatError("duplicate section", "E_SECTION_DUPLICATE")
        seen.add(key)
        limit = decoded_limit(program, e.kind, e.site)
        if e.kind == KIND_PAYLOAD and e.decoded_length != limit:
            raise FormatError(f"payload holds {e.decoded_length} bytes; the program needs {limit}", "E_SYMBOL_COUNT")
        if max_block_bytes is not None:  # once, after the first entry's size checks, before anything is decompressed
            planes = any(x.kind == KIND_PAYLOAD and x.codec == CODEC_PLANES for x in entries)
            need = working_set_bytes(program, len(data), planes, mixed)
            if need > max_block_bytes:
                raise LimitError(
                    f"chunk {head.chunk_index} ({program.name!r}) needs up to {need:,} bytes to decode; the limit is {max_block_bytes:,}",
                    "E_LIMIT_MEMORY",
                )
            max_block_bytes = None
        stored = view[e.offset : e.offset + e.stored_length]
        if e.codec == CODEC_PLANES:
            payload = decode_planes(stored, program.payload_symbols(), program.symbol_bits)
            continue
        raw = decompress(stored, e.codec, e.decoded_length, limit)
        if e.kind == KIND_PAYLOAD:  # read-only; the decoder copies it once, into its stack
            payload = np.frombuffer(raw, dtype=uint_dtype(program.symbol_bits))
        elif e.kind == KIND_SIGNS and e.decoded_length != limit:
            raise FormatError("sign bitmap has the wrong size", "E_SECTION_SIZE")
        else:
            side[key] = bytes(raw)
    if pos != len(data) - 4:
        raise FormatError("bytes between the last section and the chunk CRC", "E_BOUNDS")
    if payload is None:
        raise FormatError("chunk has no payload section", "E_SECTION_MISSING")
    return ParsedChunk(int(head.chunk_index), program, payload, side, [dict(e) for e in entries], stored_crc,
                       int(head.content_crc) if digests else None)

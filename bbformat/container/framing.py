"""Header, index and footer bytes."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import construct

from ..constants import (
    BYTE_CODECS,
    CRC_SIZE,
    FILE_MAGIC,
    FOOTER_CRC_OFFSET,
    FOOTER_MAGIC,
    FOOTER_SIZE,
    FORMAT_MAJOR,
    FORMAT_MINOR,
    FORMAT_VERSIONS,
    HEADER_FIXED_SIZE,
    INDEX_ENTRY_SIZE,
    INDEX_FIXED_SIZE,
    INDEX_MAGIC,
    MAGIC_SIZE,
    MAX_CHUNKS,
    MAX_METADATA,
    METADATA_ZSTD_ABOVE,
    MIN_CHUNK_LENGTH,
    REQUIRED_FLAGS_KNOWN,
    SCHEME_CODES,
    SCHEME_NAMES,
    Codec,
    RequiredFlag,
    Scheme,
    minor_for,
    required_flags_for,
)
from ..errors import FormatError, InputError, IntegrityError, LimitError, check_choice
from ..zstdframe import METADATA_LEVEL, Buffer, compress, decompress, frame_content_size
from . import records as R
from .crc import crc32c


@dataclass
class Header:
    scheme: str
    chunk_count: int
    metadata: dict[str, Any]
    major: int = FORMAT_MAJOR
    minor: int = FORMAT_MINOR
    length: int = 0
    required_flags: int = 0

    @property
    def has_digests(self) -> bool:
        """Every chunk records the digest of its decoded values (format 1.2, DIGESTS)."""
        return bool(self.required_flags & RequiredFlag.DIGESTS)


def check_format_version(format_version: str, entropy: str = "none", dtypes: bool = False) -> None:
    """A version a writer can be asked to write (constants.FORMAT_VERSIONS), and one that
    allows payload codec 3 if `entropy` is "exponent" (1.3 and later) and the dtypes of format
    1.6 if `dtypes`, else InputError."""
    check_choice("format version", format_version, FORMAT_VERSIONS)
    if entropy == "exponent" and not required_flags_for(format_version, entropy) & RequiredFlag.EXPONENT:
        raise InputError(f"entropy mode 'exponent' (payload codec 3) needs format 1.3 or later, not {format_version}")
    if dtypes and not required_flags_for(format_version, entropy, dtypes=True) & RequiredFlag.DTYPES:
        raise InputError(f"dtypes other than float16, bfloat16 and float32 need format 1.6, not {format_version}")


@dataclass(frozen=True)
class HeaderFields:
    """A checked header, its metadata still uncompressed (check_header, then seal_header)."""

    scheme: str
    chunk_count: int
    metadata_json: bytes
    required_flags: int


def check_header(scheme: str, chunk_count: int, metadata: dict[str, Any], required_flags: int = 0) -> HeaderFields:
    """Refuses what a reader would refuse (InputError), before anything is written; the slow
    part, compressing the metadata, is seal_header's."""
    if required_flags & ~REQUIRED_FLAGS_KNOWN:
        raise InputError(f"unknown required flags 0x{required_flags:08x}")
    if required_flags & RequiredFlag.BANDS and not required_flags & RequiredFlag.DIGESTS:
        raise InputError("required flag BANDS needs DIGESTS (SPEC.md 4)")
    if scheme not in SCHEME_CODES:
        raise InputError(f"unknown scheme {scheme!r} (choose {', '.join(sorted(SCHEME_CODES))})")
    if SCHEME_CODES[scheme] == Scheme.NONE and not required_flags & RequiredFlag.DIGESTS:
        raise InputError("scheme 'none' needs DIGESTS, format 1.2 or later (SPEC.md 4)")
    if not 0 <= chunk_count <= MAX_CHUNKS:
        raise InputError(f"{chunk_count} chunks: a container holds 0 to {MAX_CHUNKS}")
    try:
        meta = json.dumps(metadata, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise InputError(f"metadata is not plain JSON: {exc}") from None
    if len(meta) > MAX_METADATA:
        raise InputError(f"the container's metadata (for pack: the side files and key list) is {len(meta):,} bytes; "
                         f"readers refuse more than {MAX_METADATA:,}")
    return HeaderFields(scheme, chunk_count, meta, required_flags)


def seal_header(h: HeaderFields) -> bytes:
    """The header bytes of a checked header: metadata zstd-19 compressed where that is smaller."""
    meta, required_flags, codec = h.metadata_json, h.required_flags, Codec.RAW
    if len(meta) > METADATA_ZSTD_ABOVE:
        packed = compress(meta, METADATA_LEVEL)
        if len(packed) < len(meta):
            meta, codec = packed, Codec.ZSTD
    fixed = R.HEADER_FIXED.build(
        dict(
            major=FORMAT_MAJOR,
            minor=minor_for(required_flags),
            required_flags=required_flags,
            optional_flags=0,
            scheme=SCHEME_CODES[h.scheme],
            metadata_codec=codec,
            reserved1=0,
            chunk_count=h.chunk_count,
            metadata_length=len(meta),
        )
    )
    body: bytes = fixed + meta
    return body + crc32c(body).to_bytes(CRC_SIZE, "little")


def check_version(major: int, minor: int) -> None:
    if major != FORMAT_MAJOR:
        raise FormatError(f"unsupported major version {major}.{minor}", "E_VERSION")


def parse_header_fixed(data: Buffer) -> construct.Container:
    if len(data) < HEADER_FIXED_SIZE:
        raise FormatError("file is too short for a header", "E_TRUNCATED")
    if data[:MAGIC_SIZE] != FILE_MAGIC:
        raise FormatError("not a bbformat file (bad leading magic)", "E_MAGIC")
    h = R.HEADER_FIXED.parse(data[: HEADER_FIXED_SIZE])
    check_version(h.major, h.minor)
    if h.required_flags & ~REQUIRED_FLAGS_KNOWN:
        raise FormatError(f"unknown required flags 0x{h.required_flags:08x}", "E_REQUIRED_FLAG")
    if h.required_flags & RequiredFlag.BANDS and not h.required_flags & RequiredFlag.DIGESTS:
        raise FormatError("required flag BANDS (bit 4) without DIGESTS (bit 1)", "E_REQUIRED_FLAG")
    if h.metadata_codec not in BYTE_CODECS:
        raise FormatError(f"unknown metadata codec {h.metadata_codec}", "E_CODEC")
    if h.reserved1:
        raise FormatError("reserved header field is not zero", "E_RESERVED")
    if h.scheme not in SCHEME_NAMES:
        raise FormatError(f"unknown scheme code {h.scheme}", "E_SCHEME")
    if h.scheme == Scheme.NONE and not h.required_flags & RequiredFlag.DIGESTS:
        raise FormatError("scheme 3 (none) without required flag DIGESTS (SPEC.md 4)", "E_SCHEME")
    if h.chunk_count > MAX_CHUNKS:
        raise LimitError(f"{h.chunk_count} chunks exceeds the limit {MAX_CHUNKS}", "E_LIMIT_COUNT")
    if h.metadata_length > MAX_METADATA:
        raise LimitError("metadata exceeds 64 MiB", "E_LIMIT_METADATA")
    return h


def header_length(fixed: construct.Container) -> int:
    return HEADER_FIXED_SIZE + int(fixed.metadata_length) + CRC_SIZE


def parse_header(data: Buffer) -> Header:
    """`data` is exactly the header bytes (fixed part, metadata, CRC)."""
    h = parse_header_fixed(data)
    n = header_length(h)
    if len(data) != n:
        raise FormatError("header is truncated", "E_TRUNCATED")
    if crc32c(data[:-CRC_SIZE]) != int.from_bytes(data[-CRC_SIZE:], "little"):
        raise IntegrityError("header CRC32C mismatch", "E_CRC_HEADER")
    raw: Buffer = data[HEADER_FIXED_SIZE:-CRC_SIZE]
    if h.metadata_codec == Codec.ZSTD:
        declared = frame_content_size(raw)
        if declared > MAX_METADATA:
            raise LimitError("metadata decompresses past 64 MiB", "E_LIMIT_METADATA")
        raw = decompress(raw, Codec.ZSTD, declared, MAX_METADATA)
    try:
        meta = json.loads(str(raw, "utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FormatError(f"metadata is not UTF-8 JSON: {exc}", "E_METADATA") from None
    except (ValueError, RecursionError) as exc:
        # valid JSON past this reader's limits (RFC 8259 section 9): nesting depth, digits of an integer
        raise FormatError(f"metadata JSON exceeds this reader's limits: {type(exc).__name__}", "E_METADATA") from None
    if not isinstance(meta, dict):
        raise FormatError("metadata must be a JSON object", "E_METADATA")
    return Header(SCHEME_NAMES[h.scheme], h.chunk_count, meta, h.major, h.minor, n, h.required_flags)


@dataclass
class IndexEntry:
    offset: int
    length: int
    crc: int


def build_index(entries: list[IndexEntry]) -> bytes:
    out = [R.INDEX_FIXED.build(dict(chunk_count=len(entries)))]
    out += [R.INDEX_ENTRY.build(dict(offset=e.offset, length=e.length, crc=e.crc, reserved=0)) for e in entries]
    return b"".join(out)


def parse_index(data: bytes, chunk_count: int, first_offset: int, index_offset: int) -> list[IndexEntry]:
    if len(data) < INDEX_FIXED_SIZE or data[: len(INDEX_MAGIC)] != INDEX_MAGIC:
        raise FormatError("bad index magic", "E_MAGIC")
    n = R.INDEX_FIXED.parse(data[: INDEX_FIXED_SIZE]).chunk_count
    if n != chunk_count:
        raise FormatError(f"index lists {n} chunks, header says {chunk_count}", "E_INDEX")
    if len(data) != INDEX_FIXED_SIZE + n * INDEX_ENTRY_SIZE:
        raise FormatError("index length does not match its chunk count", "E_INDEX")
    out = []
    pos = first_offset
    for i in range(n):
        off = INDEX_FIXED_SIZE + i * INDEX_ENTRY_SIZE
        e = R.INDEX_ENTRY.parse(data[off : off + INDEX_ENTRY_SIZE])
        if e.reserved:
            raise FormatError("reserved index field is not zero", "E_RESERVED")
        if e.offset != pos or e.length < MIN_CHUNK_LENGTH or e.length > index_offset - pos:
            raise FormatError(f"index entry {i} is out of bounds or overlapping", "E_BOUNDS")
        pos += e.length
        out.append(IndexEntry(e.offset, e.length, e.crc))
    if pos != index_offset:
        raise FormatError("chunks do not end where the index starts", "E_BOUNDS")
    return out


def build_footer(index_offset: int, index: bytes, minor: int = 0) -> bytes:
    part = R.FOOTER.build(
        dict(
            index_offset=index_offset,
            index_length=len(index),
            index_crc=crc32c(index),
            major=FORMAT_MAJOR,
            minor=minor,
            reserved=0,
            footer_crc=0,
            magic=FOOTER_MAGIC,
        )
    )
    covered: bytes = part[:FOOTER_CRC_OFFSET]
    return covered + crc32c(covered).to_bytes(CRC_SIZE, "little") + FOOTER_MAGIC


def parse_footer(data: Buffer) -> construct.Container:
    if len(data) != FOOTER_SIZE:
        raise FormatError("file is too short for a footer", "E_TRUNCATED")
    if data[-MAGIC_SIZE:] != FOOTER_MAGIC:
        raise FormatError("bad trailing magic (truncated or not a bbformat file)", "E_MAGIC")
    f = R.FOOTER.parse(data)
    if crc32c(data[:FOOTER_CRC_OFFSET]) != f.footer_crc:
        raise IntegrityError("footer CRC32C mismatch", "E_CRC_FOOTER")
    check_version(f.major, f.minor)
    if f.reserved:
        raise FormatError("reserved footer field is not zero", "E_RESERVED")
    return f


def check_footer_version(header: Header, footer: construct.Container) -> None:
    """The footer's version must be the header's (SPEC.md 11.2, E_VERSION)."""
    if footer.major != header.major or footer.minor != header.minor:
        raise FormatError("header and footer versions differ", "E_VERSION")

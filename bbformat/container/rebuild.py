"""Split a container into its parts and put parts back together with fresh index,
footer and CRCs. Used to craft test and conformance vectors."""
from __future__ import annotations

from dataclasses import dataclass

from ..constants import (
    CHUNK_FIXED_SIZE,
    CRC_SIZE,
    FOOTER_CRC_OFFSET,
    FOOTER_INDEX_CRC_OFFSET,
    FOOTER_SIZE,
    HEADER_FIXED_SIZE,
)
from . import records as R
from .crc import crc32c
from .framing import IndexEntry, build_footer, build_index


@dataclass
class Parts:
    header: bytes
    chunks: list[bytes]


def split(data: bytes) -> Parts:
    """Trusting split of a well-formed container (for crafting only)."""
    fixed = R.HEADER_FIXED.parse(data[: HEADER_FIXED_SIZE])
    hlen = HEADER_FIXED_SIZE + fixed.metadata_length + CRC_SIZE
    chunks = []
    pos = hlen
    for _ in range(fixed.chunk_count):
        n = R.CHUNK_FIXED.parse(data[pos : pos + CHUNK_FIXED_SIZE]).chunk_length
        chunks.append(data[pos : pos + n])
        pos += n
    return Parts(data[:hlen], chunks)


def reseal_header(header: bytes) -> bytes:
    return header[:-CRC_SIZE] + crc32c(header[:-CRC_SIZE]).to_bytes(CRC_SIZE, "little")


def reseal_chunk(chunk: bytes) -> bytes:
    return chunk[:-CRC_SIZE] + crc32c(chunk[:-CRC_SIZE]).to_bytes(CRC_SIZE, "little")


def join(parts: Parts) -> bytes:
    entries = []
    pos = len(parts.header)
    for c in parts.chunks:
        entries.append(IndexEntry(pos, len(c), int.from_bytes(c[-CRC_SIZE:], "little")))
        pos += len(c)
    index = build_index(entries)
    minor = R.HEADER_FIXED.parse(parts.header[: HEADER_FIXED_SIZE]).minor
    return parts.header + b"".join(parts.chunks) + index + build_footer(pos, index, minor)


def reseal_footer(data: bytes, index_crc: bool = True) -> bytes:
    """Recompute the footer CRC (and, if asked, the index CRC from the footer's index
    offset) after bytes of the index or footer were edited."""
    footer = bytearray(data[-FOOTER_SIZE :])
    if index_crc:
        index_offset = int.from_bytes(footer[0:8], "little")
        footer[FOOTER_INDEX_CRC_OFFSET : FOOTER_INDEX_CRC_OFFSET + CRC_SIZE] = crc32c(data[index_offset : -FOOTER_SIZE]).to_bytes(CRC_SIZE, "little")
    footer[FOOTER_CRC_OFFSET : FOOTER_CRC_OFFSET + CRC_SIZE] = crc32c(bytes(footer[:FOOTER_CRC_OFFSET])).to_bytes(CRC_SIZE, "little")
    return bytes(data[: -FOOTER_SIZE]) + bytes(footer)

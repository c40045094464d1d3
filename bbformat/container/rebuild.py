"""Split a container into its parts and put parts back together with fresh index,
footer and CRCs. Used to craft test and conformance vectors."""
from __future__ import annotations

from dataclasses import dataclass

from . import records as R
from .crc import crc32c
from .framing import IndexEntry, build_footer, build_index


@dataclass
class Parts:
    header: bytes
    chunks: list[bytes]


def split(data: bytes) -> Parts:
    """Trusting split of a well-formed container (for crafting only)."""
    fixed = R.HEADER_FIXED.parse(data[: R.HEADER_FIXED_SIZE])
    hlen = R.HEADER_FIXED_SIZE + fixed.metadata_length + 4
    chunks = []
    pos = hlen
    for _ in range(fixed.chunk_count):
        n = R.CHUNK_FIXED.parse(data[pos : pos + R.CHUNK_FIXED_SIZE]).chunk_length
        chunks.append(data[pos : pos + n])
        pos += n
    return Parts(data[:hlen], chunks)


def reseal_header(header: bytes) -> bytes:
    return header[:-4] + crc32c(header[:-4]).to_bytes(4, "little")


def reseal_chunk(chunk: bytes) -> bytes:
    return chunk[:-4] + crc32c(chunk[:-4]).to_bytes(4, "little")


def join(parts: Parts) -> bytes:
    entries = []
    pos = len(parts.header)
    for c in parts.chunks:
        entries.append(IndexEntry(pos, len(c), int.from_bytes(c[-4:], "little")))
        pos += len(c)
    index = build_index(entries)
    minor = R.HEADER_FIXED.parse(parts.header[: R.HEADER_FIXED_SIZE]).minor
    return parts.header + b"".join(parts.chunks) + index + build_footer(pos, index, minor)


def reseal_footer(data: bytes, index_crc: bool = True) -> bytes:
    """Recompute the footer CRC (and, if asked, the index CRC from the footer's index
    offset) after bytes of the index or footer were edited."""
    footer = bytearray(data[-R.FOOTER_SIZE :])
    if index_crc:
        index_offset = int.from_bytes(footer[0:8], "little")
        footer[16:20] = crc32c(data[index_offset : -R.FOOTER_SIZE]).to_bytes(4, "little")
    footer[28:32] = crc32c(bytes(footer[:28])).to_bytes(4, "little")
    return bytes(data[: -R.FOOTER_SIZE]) + bytes(footer)

"""zstd frames as the format stores them: the one place compressors and decompressors are built.

Every frame bbformat writes declares its content size and has no checksum (SPEC.md 4.1,
8.2: chunk_crc covers the bytes). Every frame it reads is checked in SPEC.md's order
(frame header, declared size against the caller's limit, exactly one frame, decompression)
and the decoder is bounded by the declared size, so a decompression bomb costs at most the
limit. The levels are the reference writer's: changing one changes the bytes it writes.
"""
from __future__ import annotations

import threading

import zstandard

from .constants import ZSTD_FRAME_MAGIC, Codec
from .errors import FormatError, LimitError

Buffer = bytes | bytearray | memoryview
"""What the parsers read through: sections and groups are views of a chunk, not copies."""

SECTION_PARAMS = {"strategy": zstandard.STRATEGY_BTULTRA, "window_log": 20, "chain_log": 16, "hash_log": 16,
                  "search_log": 1, "min_match": 3, "target_length": 64}
"""Side sections and residual groups (SPEC.md 12.4, informative): zstd's btultra parser (level
18's strategy; 19 uses btultra2) with a 1 MiB window and one search step. Against level 19 on
the side sections of two bfloat16 packs (tools/section_zstd.py): the one-layer Llama-2-7B
shape's 0.31% larger (0.010% of the file) in 1/5 of the time, sliced SmolLM2's 0.18% smaller
in 1/3 (BENCHMARKS.md 19)."""
METADATA_LEVEL = 19
"""Header metadata (SPEC.md 4.1, informative)."""
PAYLOAD_LEVEL = 3
"""A payload stored as one frame, codec 1 (`--entropy zstd`/`auto`)."""
PLANES_LEVEL = 3
"""Groups of a codec-2 payload (SPEC.md 8.6; measured: higher levels are no smaller, BENCHMARKS.md)."""


Compressor = zstandard.ZstdCompressor


def compressor(level: int) -> Compressor:
    """A compressor whose frames declare their content size and carry no checksum."""
    return zstandard.ZstdCompressor(level=level, write_content_size=True, write_checksum=False)


def section_compressor() -> Compressor:
    """The compressor of side sections and residual groups (SECTION_PARAMS; content size, no checksum)."""
    params = zstandard.ZstdCompressionParameters(write_content_size=True, write_checksum=False, **SECTION_PARAMS)
    return zstandard.ZstdCompressor(compression_params=params)


def compress(data: Buffer, level: int) -> bytes:
    """One frame of `data` (see compressor)."""
    return compressor(level).compress(data)


def frame_content_size(data: Buffer) -> int:
    """Frame_Content_Size of the zstd frame that `data` starts with (2^64 - 1 when the header
    has none). Anything but a zstd frame header, including a skippable frame, is E_ZSTD."""
    if bytes(data[:4]) != ZSTD_FRAME_MAGIC:
        raise FormatError("not a zstd frame (bad frame magic; skippable frames are not allowed)", "E_ZSTD")
    try:
        return int(zstandard.get_frame_parameters(data).content_size)
    except zstandard.ZstdError as exc:
        raise FormatError(f"bad zstd frame: {exc}", "E_ZSTD") from None


_LOCAL = threading.local()  # one decompression context per thread (a ZstdDecompressor is not thread-safe)


def decompress_frame(stored: Buffer) -> bytes:
    """The bytes of `stored`, which must be exactly one complete zstd frame (else E_ZSTD). The
    caller checks the frame's declared content size against its limit first (frame_content_size,
    or decompress, which does both): the frame is decoded at once into that many bytes, and
    libzstd refuses data that decodes past the declared size."""
    dctx = getattr(_LOCAL, "dctx", None)
    if dctx is None:
        dctx = _LOCAL.dctx = zstandard.ZstdDecompressor()
    try:
        data = dctx.decompress(stored, allow_extra_data=False)
        if not data:  # python-zstandard returns b"" for a frame declaring 0 bytes without reading its blocks
            _check_empty_frame(dctx, stored)
        return data
    except zstandard.ZstdError as exc:
        raise FormatError(f"bad zstd data: {exc}", "E_ZSTD") from None


def _check_empty_frame(dctx: zstandard.ZstdDecompressor, stored: Buffer) -> None:
    """Decode a frame that decoded to nothing block by block: a damaged or truncated block, or
    bytes after the frame, is E_ZSTD (as libzstd and the C reader find)."""
    obj = dctx.decompressobj()
    if obj.decompress(bytes(stored)) or not obj.eof or obj.unused_data:
        raise FormatError("bad zstd data: an empty frame that does not end where the data ends", "E_ZSTD")


def decompress(stored: Buffer, codec: int, declared: int, limit: int) -> Buffer:
    """The decoded bytes of a raw or zstd field that declares `declared` decoded bytes, at most
    `limit` (SPEC.md 8.2 order: limit, E_LIMIT_SECTION; raw length or frame content size,
    E_SECTION_SIZE; one frame and its data, E_ZSTD, which includes data decoding to another
    size than the frame declares: libzstd refuses it, and the check below only restates it). A
    raw field is returned as given (a view stays a view)."""
    if declared > limit:
        raise LimitError(f"section declares {declared} decoded bytes, limit is {limit}", "E_LIMIT_SECTION")
    if codec == Codec.RAW:
        if len(stored) != declared:
            raise FormatError("raw section length differs from its declared size", "E_SECTION_SIZE")
        return stored
    if codec != Codec.ZSTD:
        raise FormatError(f"unknown section codec {codec}", "E_CODEC")
    if frame_content_size(stored) != declared:
        raise FormatError("zstd frame content size differs from the declared size", "E_SECTION_SIZE")
    data = decompress_frame(stored)
    if len(data) != declared:
        raise FormatError("zstd frame decodes to a size other than its content size", "E_ZSTD")
    return data

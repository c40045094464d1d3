"""Record layouts shared by the reader and the writer, as construct structs.

Every integer is little-endian. Reserved fields are written as zero and checked.
"""
from __future__ import annotations

from construct import (
    Array,
    Bytes,
    Const,
    Int8ul,
    Int16ul,
    Int32ul,
    Int64ul,
    PascalString,
    PrefixedArray,
    Struct,
    this,
)

FILE_MAGIC = b"\x89BBF\r\n\x1a\n"
FOOTER_MAGIC = b"BBFEND\r\n"
CHUNK_MAGIC = b"BBCK"
INDEX_MAGIC = b"BBIX"

VERSION_MAJOR = 1
VERSION_MINOR = 2  # the newest minor this code reads; a writer writes the lowest its file needs

SCHEME_CODES = {"paper": 1, "symmetric": 2, "none": 3}  # 3: 1.2, no rotation sites (the entropy stage alone)
SCHEME_NAMES = {v: k for k, v in SCHEME_CODES.items()}

FLAG_PLANES = 0x1  # 1.1: payloads may use codec 2 (SPEC.md 8.6)
FLAG_DIGESTS = 0x2  # 1.2: every chunk records content_crc, a CRC32C of its decoded tensors (SPEC.md 5.4)
FLAG_MIXED_CORRECTIONS = 0x4  # 1.2: x_residuals and x_patches may share a site (SPEC.md 8.4)
REQUIRED_FLAGS_KNOWN = FLAG_PLANES | FLAG_DIGESTS | FLAG_MIXED_CORRECTIONS
OPTIONAL_FLAGS_KNOWN = 0x0

HEADER_FIXED = Struct(
    "magic" / Const(FILE_MAGIC),
    "major" / Int16ul,
    "minor" / Int16ul,
    "required_flags" / Int32ul,
    "optional_flags" / Int32ul,
    "scheme" / Int8ul,
    "metadata_codec" / Int8ul,
    "reserved1" / Int16ul,
    "chunk_count" / Int32ul,
    "metadata_length" / Int32ul,
)
HEADER_FIXED_SIZE = 32

CHUNK_FIXED = Struct(
    "magic" / Const(CHUNK_MAGIC),
    "content_crc" / Int32ul,  # reserved (0) in a file without FLAG_DIGESTS
    "chunk_length" / Int64ul,
    "chunk_index" / Int32ul,
    "descriptor_length" / Int32ul,
    "section_count" / Int32ul,
    "reserved1" / Int32ul,
)
CHUNK_FIXED_SIZE = 32

SECTION_ENTRY = Struct(
    "kind" / Int8ul,
    "codec" / Int8ul,
    "reserved" / Int16ul,
    "site" / Int32ul,
    "offset" / Int64ul,
    "stored_length" / Int64ul,
    "decoded_length" / Int64ul,
)
SECTION_ENTRY_SIZE = 32

NAME = PascalString(Int16ul, "utf8")

TENSOR_RECORD = Struct(
    "name" / NAME,
    "dtype" / Int8ul,
    "ndim" / Int8ul,
    "reserved" / Int16ul,
    "dims" / Array(this.ndim, Int64ul),
)
FOLLOWER_RECORD = Struct("tensor" / NAME, "axis" / Int8ul, "reserved" / Int8ul)
SITE_RECORD = Struct(
    "name" / NAME,
    "dim" / Int32ul,
    "anchor" / Int32ul,
    "anchor_axis" / Int8ul,
    "flags" / Int8ul,
    "reserved" / Int16ul,
    "followers" / PrefixedArray(Int32ul, FOLLOWER_RECORD),
)
OP_RECORD = Struct("kind" / Int8ul, "reserved0" / Int8ul, "reserved1" / Int16ul, "index" / Int32ul)
DESCRIPTOR = Struct(
    "name" / NAME,
    "symbol_dtype" / Int8ul,
    "reserved0" / Int8ul,
    "reserved1" / Int16ul,
    "tensors" / PrefixedArray(Int32ul, TENSOR_RECORD),
    "sites" / PrefixedArray(Int32ul, SITE_RECORD),
    "ops" / PrefixedArray(Int32ul, OP_RECORD),
)

INDEX_FIXED = Struct("magic" / Const(INDEX_MAGIC), "chunk_count" / Int32ul)
INDEX_FIXED_SIZE = 8
INDEX_ENTRY = Struct("offset" / Int64ul, "length" / Int64ul, "crc" / Int32ul, "reserved" / Int32ul)
INDEX_ENTRY_SIZE = 24

FOOTER = Struct(
    "index_offset" / Int64ul,
    "index_length" / Int64ul,
    "index_crc" / Int32ul,
    "major" / Int16ul,
    "minor" / Int16ul,
    "reserved" / Int32ul,
    "footer_crc" / Int32ul,
    "magic" / Bytes(8),
)
FOOTER_SIZE = 40

# Reader limits (SPEC.md section 8).
MAX_CHUNKS = 1 << 16
MAX_METADATA = 64 << 20
MAX_DESCRIPTOR = 16 << 20
MAX_NDIM = 8
MAX_TENSORS_PER_CHUNK = 1 << 16
MAX_SITES_PER_CHUNK = 1 << 12
MAX_SECTIONS_PER_CHUNK = 1 << 14
MAX_SITE_DIM = 1 << 15
MAX_TENSOR_ELEMENTS = 1 << 40

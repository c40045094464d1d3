"""The numbers SPEC.md gives the format, in one place: the ground floor of the package.

Pure Python with no imports from bbformat (and no numpy), so every layer may use it and
`import bbformat` stays fast. Every value here is part of the format or of the reference
writer's output: changing one changes bytes on disk. Section references are to SPEC.md.

The enums are IntEnums (not IntFlags, even for bit values): their members are ints, so
they are written, compared and combined exactly as the plain ints read from a file are,
and `~` gives the plain two's-complement mask that the reserved-bit checks need.
"""
from __future__ import annotations

from enum import IntEnum

# ----------------------------------------------------------------------------- versions

FORMAT_MAJOR = 1
"""Header and footer `major` (SPEC.md 4, 10.2); any other value is E_VERSION."""
FORMAT_MINOR = 6
"""The newest minor this code knows; a writer writes the lowest its file needs (minor_for)."""
FORMAT_VERSIONS = ("1.6", "1.5", "1.4", "1.3", "1.2", "1.1")
"""What a writer can be asked to write (`pack --format-version`), the default first. The file
gets the lowest minor its features need: "1.6" writes minor 6 only when it holds a dtype of
format 1.6 (EXTENDED_DTYPES), else as "1.5"; "1.5" writes minor 5 unless its payloads are stored
raw (`--entropy none`), else as "1.4"; "1.4" writes minor 4 when it has sites (their band
sections), else as "1.3"; "1.3" writes minor 2 unless payloads may use codec 3; "1.1" writes
minor 0 unless the payloads may use codec 2."""

# ----------------------------------------------------------------------------- magics

FILE_MAGIC = b"\x89BBF\r\n\x1a\n"
"""Header offset 0 (SPEC.md 4)."""
FOOTER_MAGIC = b"BBFEND\r\n"
"""The last 8 bytes of the footer (SPEC.md 10.2)."""
CHUNK_MAGIC = b"BBCK"
"""Chunk offset 0 (SPEC.md 5)."""
INDEX_MAGIC = b"BBIX"
"""Index offset 0 (SPEC.md 10.1)."""
ZSTD_FRAME_MAGIC = b"\x28\xb5\x2f\xfd"
"""The first 4 bytes of a zstd frame (RFC 8878); a skippable frame is E_ZSTD (SPEC.md 8.2)."""
MAGIC_SIZE = 8
"""Bytes of the file and footer magics (SPEC.md 4, 10.2)."""

# ----------------------------------------------------------------------------- fixed sizes

CRC_SIZE = 4
"""Every CRC32C is a u32 (SPEC.md 3)."""
HEADER_FIXED_SIZE = 32
"""The header's fixed part, magic to metadata_length (SPEC.md 4)."""
HEADER_MIN_SIZE = HEADER_FIXED_SIZE + CRC_SIZE
"""36: the header without metadata; H = 36 + M (SPEC.md 4)."""
CHUNK_FIXED_SIZE = 32
"""The chunk's fixed header, magic to reserved (SPEC.md 5)."""
MIN_CHUNK_LENGTH = CHUNK_FIXED_SIZE + CRC_SIZE
"""36: chunk_length >= 36 (SPEC.md 5, 10.1, 10.3)."""
SECTION_ENTRY_SIZE = 32
"""One section table entry (SPEC.md 5.3): the section table is 32 * S bytes."""
INDEX_FIXED_SIZE = 8
"""Index magic and chunk_count (SPEC.md 10.1)."""
INDEX_ENTRY_SIZE = 24
"""One index entry (SPEC.md 10.1): the index is 8 + 24 * N bytes."""
FOOTER_SIZE = 40
"""The footer (SPEC.md 10.2)."""
FOOTER_INDEX_CRC_OFFSET = 16
"""index_crc's offset in the footer (SPEC.md 10.2)."""
FOOTER_CRC_OFFSET = 28
"""footer_crc's offset in the footer; it covers footer bytes [0, 28) (SPEC.md 10.2)."""
MIN_FILE_SIZE = HEADER_MIN_SIZE + INDEX_FIXED_SIZE + FOOTER_SIZE
"""84: no container is shorter (SPEC.md 10.2)."""
TENSOR_RECORD_MIN_SIZE = 6
"""A tensor record with an empty name and ndim 0 (SPEC.md 5.1, 11.3)."""
SITE_RECORD_MIN_SIZE = 18
"""A site record with an empty name and no followers (SPEC.md 5.1, 11.3)."""
FOLLOWER_RECORD_MIN_SIZE = 4
"""A follower record with an empty name (SPEC.md 5.1, 11.3)."""
OP_RECORD_SIZE = 8
"""One op record (SPEC.md 5.1)."""
NO_SITE = 0xFFFFFFFF
"""The payload section's site field (SPEC.md 5.3, 8.1)."""
MAX_VARINT_BYTES = 10
"""The longest varint (SPEC.md 1)."""

# ----------------------------------------------------------------------------- limits (SPEC.md 11.1)

MAX_CHUNKS = 1 << 16
"""Chunks per file (E_LIMIT_COUNT)."""
MAX_METADATA = 64 << 20
"""Metadata bytes, stored and decoded (E_LIMIT_METADATA)."""
MAX_DESCRIPTOR = 16 << 20
"""Descriptor length Ld (E_LIMIT_COUNT)."""
MAX_SECTIONS_PER_CHUNK = 1 << 14
"""Sections per chunk (E_LIMIT_COUNT)."""
MAX_TENSORS_PER_CHUNK = 1 << 16
"""Tensors per chunk (E_LIMIT_COUNT)."""
MAX_SITES_PER_CHUNK = 1 << 12
"""Sites per chunk (E_LIMIT_COUNT)."""
MAX_NDIM = 8
"""Tensor rank (E_LIMIT_NDIM)."""
MAX_TENSOR_ELEMENTS = 1 << 40
"""Elements per tensor (E_LIMIT_TENSOR)."""
MAX_SITE_DIM = 1 << 15
"""Site dimension D (E_LIMIT_DIM)."""
MIN_SITE_DIM = 2
"""D >= 2 (SPEC.md 5.1, E_SITE)."""
MAX_FOLLOWERS_PER_CHUNK = 1 << 16
"""The reference reader's own limit on followers per chunk (SPEC.md 11.4, E_LIMIT_COUNT)."""
MAX_PLANES_SEGMENTS = 1 << 16
"""Segments of a codec-2 payload (SPEC.md 8.6, E_LIMIT_COUNT)."""
MAX_PLANES_CLASSES = 16
"""Classes per axis of a codec-2 segment, K (SPEC.md 8.6); column classes of a codec-3 segment (8.7)."""
MAX_EXPONENT_TABLES = 1024
"""Tables (segments x classes) of a codec-3 payload (SPEC.md 8.7, E_LIMIT_COUNT)."""
MAX_EXPONENT_LANES = 1 << 16
"""rANS lanes of a codec-3 payload, Q (SPEC.md 8.7)."""
MAX_PAYLOAD_PARTS = 1 << 16
"""Parts of a codec-4 payload (SPEC.md 8.9, 11.1; E_LIMIT_COUNT)."""
MAX_EXPONENT_CODE_BITS = 12
"""Bits of a codec-3 code: the exponent field and the joined mantissa bits (SPEC.md 8.7)."""
RANS_PRECISION_BITS = 14
"""Every codec-3 table's frequencies sum to 2^14 (SPEC.md 8.7)."""
RANS_LOW = 1 << 16
"""A codec-3 lane's state lies in [2^16, 2^32); it starts and ends at 2^16 (SPEC.md 8.7)."""

# ----------------------------------------------------------------------------- header fields


class RequiredFlag(IntEnum):
    """Bits of the header's required_flags (SPEC.md 4); any other set bit is E_REQUIRED_FLAG."""

    PLANES = 0x1  # 1.1: payload sections may use codec 2 (SPEC.md 8.6)
    DIGESTS = 0x2  # 1.2: every chunk records content_crc of its decoded tensors (SPEC.md 5.4)
    MIXED_CORRECTIONS = 0x4  # 1.2: x_residuals and x_patches may share a symmetric-mode site (SPEC.md 8.4)
    EXPONENT = 0x8  # 1.3: payload sections may use codec 3 (SPEC.md 8.7)
    BANDS = 0x10  # 1.4: every non-PLAIN site stores its band widths, a band section (SPEC.md 8.8); needs DIGESTS
    PARTS = 0x20  # 1.5: payload sections may use codec 4, independent parts (SPEC.md 8.9)
    DTYPES = 0x40  # 1.6: dtype codes 4-15 (EXTENDED_DTYPES) and W = 8 symbols (SPEC.md 6.1, 6.2)


REQUIRED_FLAGS_KNOWN = int(RequiredFlag.PLANES | RequiredFlag.DIGESTS | RequiredFlag.MIXED_CORRECTIONS | RequiredFlag.EXPONENT
                           | RequiredFlag.BANDS | RequiredFlag.PARTS | RequiredFlag.DTYPES)
"""Every required flag this code understands (SPEC.md 4, 11.2 item 4)."""
OPTIONAL_FLAGS_KNOWN = 0x0
"""None are defined; readers ignore optional_flags (SPEC.md 4)."""


class Scheme(IntEnum):
    """The header's scheme byte (SPEC.md 4, 12.2); any other value is E_SCHEME."""

    PAPER = 1
    SYMMETRIC = 2
    NONE = 3  # 1.2: no sites, the entropy stage alone


SCHEME_CODES: dict[str, Scheme] = {s.name.lower(): s for s in Scheme}
"""Scheme name ("paper", "symmetric", "none") -> header code."""
SCHEME_NAMES: dict[int, str] = {int(code): name for name, code in SCHEME_CODES.items()}
"""Header code -> scheme name."""
PACK_SCHEMES = ("symmetric", "paper", "none")
"""The schemes `pack` writes, its default first (SPEC.md 12.2)."""
ROTATION_SCHEMES = ("symmetric", "paper")
"""The schemes that take bits back at rotation sites, the default first: what adapters and the
encoder lay out ("none" is packed as symmetric chunks without sites)."""


class Codec(IntEnum):
    """How stored bytes become decoded bytes (SPEC.md 8.2): section codecs, and the codec byte
    of the metadata (SPEC.md 4), of residual groups (8.4) and of planes groups (8.6)."""

    RAW = 0
    ZSTD = 1  # exactly one zstd frame declaring its content size
    PLANES = 2  # 1.1, payload only, in a file with RequiredFlag.PLANES (SPEC.md 8.6)
    EXPONENT = 3  # 1.3, payload only, in a file with RequiredFlag.EXPONENT (SPEC.md 8.7)
    PARTS = 4  # 1.5, payload only, in a file with RequiredFlag.PARTS (SPEC.md 8.9)


CODEC_NAMES: dict[int, str] = {int(c): c.name.lower() for c in Codec}
"""Codec -> its name as `bbformat inspect` prints it."""
BYTE_CODECS = (Codec.RAW, Codec.ZSTD)
"""The codecs of metadata, residual groups and planes groups; other values are E_CODEC."""

# ----------------------------------------------------------------------------- chunk contents


class SectionKind(IntEnum):
    """A section table entry's kind (SPEC.md 8.1); any other value is E_SECTION_KIND."""

    PAYLOAD = 1  # the final stack (SPEC.md 6.3)
    SIGNS = 2  # sign bitmap of a PAPER site (SPEC.md 8.3)
    X_RESIDUALS = 3  # residuals of a symmetric-mode site's regenerated block (SPEC.md 8.4)
    X_PATCHES = 4  # patches of the regenerated block (SPEC.md 8.5)
    ANCHOR_PATCHES = 5  # patches of a PAPER site's un-rotated anchor (SPEC.md 8.5)
    BAND = 6  # 1.4, in a file with RequiredFlag.BANDS: a site's band widths (SPEC.md 8.8)


SECTION_KIND_NAMES: dict[int, str] = {int(k): k.name.lower() for k in SectionKind}
"""Kind -> its name in SPEC.md 8.1 ("payload", "signs", "x_residuals", ...)."""


class OpKind(IntEnum):
    """An op record's kind (SPEC.md 5.1); any other value is E_DESCRIPTOR."""

    PUSH = 1
    SITE = 2


class SiteFlag(IntEnum):
    """Bits of a site record's flags (SPEC.md 5.1); bits 2-7 are reserved (E_RESERVED)."""

    PLAIN = 0x1  # no bits taken back: no pop, no push, no sections
    PAPER = 0x2  # paper mode: sign bits, X~ = E^T diag(mu) E, anchor un-rotated


SITE_FLAGS_KNOWN = int(SiteFlag.PLAIN | SiteFlag.PAPER)
"""Every site flag bit (SPEC.md 5.1, 5.2 rule 3)."""


class Dtype(IntEnum):
    """Element type codes of tensor records and symbol_dtype (SPEC.md 6.1); other E_DTYPE.
    Codes 4-15 (format 1.6) are known only in a file with RequiredFlag.DTYPES, and are stored
    as opaque bit patterns: only float16, bfloat16 and float32 have values a decoder uses."""

    FLOAT16 = 1
    BFLOAT16 = 2
    FLOAT32 = 3
    FLOAT64 = 4  # 1.6 from here on (RequiredFlag.DTYPES)
    INT8 = 5
    UINT8 = 6
    INT16 = 7
    UINT16 = 8
    INT32 = 9
    UINT32 = 10
    INT64 = 11
    UINT64 = 12
    BOOL = 13
    FLOAT8_E4M3FN = 14
    FLOAT8_E5M2 = 15


DTYPE_CODES: dict[str, Dtype] = {d.name.lower(): d for d in Dtype}
"""Dtype name -> code. The names are torch's (torch.float8_e4m3fn, torch.uint16, ...) and numpy's
where numpy has the type."""
DTYPE_NAMES: dict[int, str] = {int(code): name for name, code in DTYPE_CODES.items()}
"""Code -> dtype name."""
DTYPE_BITS: dict[str, int] = {"float16": 16, "bfloat16": 16, "float32": 32, "float64": 64, "int8": 8, "uint8": 8, "int16": 16,
                              "uint16": 16, "int32": 32, "uint32": 32, "int64": 64, "uint64": 64, "bool": 8, "float8_e4m3fn": 8,
                              "float8_e5m2": 8}
"""Bits per element (SPEC.md 6.1); a symbol dtype's bits are the chunk's W."""
SAFETENSORS_DTYPES: dict[str, str] = {"F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64", "I8": "int8",
                                      "U8": "uint8", "I16": "int16", "U16": "uint16", "I32": "int32", "U32": "uint32",
                                      "I64": "int64", "U64": "uint64", "BOOL": "bool", "F8_E4M3": "float8_e4m3fn",
                                      "F8_E5M2": "float8_e5m2"}
"""safetensors' dtype string -> dtype name; any other (F8_E8M0, F4, F6_*, C64, ...) cannot be stored."""
FLOAT_DTYPES = ("float16", "bfloat16", "float32")
"""The dtypes with values (SPEC.md 6.1): the only symbol dtypes of a chunk with sites (5.2) or a
codec-3 payload (8.7), and the only anchors."""
EXTENDED_DTYPES = frozenset(name for name, code in DTYPE_CODES.items() if code > Dtype.FLOAT32)
"""The dtypes of format 1.6: a file holding one sets RequiredFlag.DTYPES."""
SYMBOL_BITS = (8, 16, 32)
"""The symbol widths W (SPEC.md 6.2): a 64-bit symbol dtype is E_DTYPE."""
WRITER_WIDE_SYMBOLS = "uint32"
"""The reference writer's symbol dtype for a chunk whose tensors are all 64 bits wide."""
EXPONENT_FIELD = {"float16": (10, 5), "bfloat16": (7, 8), "float32": (23, 8)}
"""(shift, width) of each float dtype's exponent field: the contexts of SPEC.md 8.4."""

# ----------------------------------------------------------------------------- the reference writer's choices

METADATA_ZSTD_ABOVE = 4096
"""The writer tries zstd on metadata longer than this (SPEC.md 4.1, informative)."""
SIDE_FILES_MAX_BYTES = 46 << 20
"""Side files travel base64-encoded in the metadata, which a reader refuses past 64 MiB
(MAX_METADATA): 3/4 of that, less room for the tensor keys, is their budget."""
PLAIN_CHUNK_BYTES = 128 << 20
"""A plain directory's chunks: consecutive tensors of one file, one layer and one symbol width
class, up to this many bytes (a larger tensor is a chunk of its own)."""
ENTROPY_MODES = ("none", "zstd", "planes", "exponent", "auto")
"""How a writer stores payloads (`pack --entropy`, SPEC.md 8.6, 8.7): raw, one zstd frame,
codec 2, codec 3 (format 1.3), or the smallest of those the format version allows, per chunk."""
PLANES_ENTROPY_MODES = ("planes", "auto")
"""The entropy modes whose payloads may use codec 2: a file written so sets RequiredFlag.PLANES."""
EXPONENT_ENTROPY_MODES = ("exponent", "auto")
"""The entropy modes whose payloads may use codec 3 in a 1.3 file (RequiredFlag.EXPONENT)."""
PARTS_ENTROPY_MODES = ("zstd", "planes", "exponent", "auto")
"""The entropy modes whose payloads may use codec 4 in a 1.5 file (RequiredFlag.PARTS): every
mode that codes payloads at all."""
PART_SYMBOLS = 1 << 21
"""The reference writer cuts a payload of more symbols than this into parts of about this many
(SPEC.md 8.9, informative), at most WRITER_PARTS; where its rows change codec, also there
(POPULATION_BLOCK). Each part costs its tables and about half a
millisecond of Python before its compiled decoding (a few milliseconds for 2 Mi symbols), so
parts are not made smaller: on SmolLM2's bfloat16 payloads, parts of 2 Mi store no more than
one part (1 Mi: 0.01% more), and a 3.5 Mi-symbol layer splits into two, one per core of a
2-core machine."""
POPULATION_BLOCK = 1 << 16
"""The reference writer estimates, per block of about this many symbols (whole rows), whether
codec 2 or codec 3 stores them smaller, and cuts parts where that changes (SPEC.md 8.9,
informative): large enough for order-0 estimates over 2^11 codes."""
POPULATION_SWITCH_BITS = 8 * 4096
"""What the writer's cut rule charges a change of codec between blocks: about the tables and
records of one more part (SPEC.md 8.9, informative)."""
WRITER_PARTS = 64
"""The most parts the reference writer cuts a payload into: enough for the cores of one
machine, and few enough that the codec-3 parts keep their column classes within the 1,024
tables of one payload (a Llama-2-7B layer: 64 parts of about 3.2 Mi symbols)."""


def payload_codecs(required_flags: int, symbol_dtype: str = "float16") -> tuple[Codec, ...]:
    """The codecs a payload section may use in a file with these required flags, in a chunk of
    this symbol dtype (SPEC.md 8.2): raw and zstd, and planes, exponent and parts with their
    flags; exponent only on float symbols (FLOAT_DTYPES; the default symbol_dtype is a float,
    as every chunk's before 1.6)."""
    flags = required_flags if symbol_dtype in FLOAT_DTYPES else required_flags & ~RequiredFlag.EXPONENT
    return (Codec.RAW, Codec.ZSTD) + tuple(c for c, f in ((Codec.PLANES, RequiredFlag.PLANES), (Codec.EXPONENT, RequiredFlag.EXPONENT),
                                                         (Codec.PARTS, RequiredFlag.PARTS)) if flags & f)


def required_flags_for(format_version: str, entropy: str, sites: bool = True, dtypes: bool = False) -> int:
    """The required flags of a file written as `format_version` ("1.6" ... "1.1")
    with payloads stored by `entropy` (SPEC.md 4): 1.2 and later record digests and may mix
    corrections; planes and auto may use codec 2; from 1.3, exponent and auto may use codec 3;
    in 1.4, a file that may have sites (`sites`: a scheme other than none) stores their bands;
    in 1.6, a file that may hold EXTENDED_DTYPES (`dtypes`) sets DTYPES."""
    flags = int(RequiredFlag.PLANES) if entropy in PLANES_ENTROPY_MODES else 0
    if format_version in ("1.2", "1.3", "1.4", "1.5", "1.6"):
        flags |= RequiredFlag.DIGESTS | RequiredFlag.MIXED_CORRECTIONS
    if format_version in ("1.3", "1.4", "1.5", "1.6") and entropy in EXPONENT_ENTROPY_MODES:
        flags |= RequiredFlag.EXPONENT
    if format_version in ("1.4", "1.5", "1.6") and sites:
        flags |= RequiredFlag.BANDS
    if format_version in ("1.5", "1.6") and entropy in PARTS_ENTROPY_MODES:
        flags |= RequiredFlag.PARTS
    if format_version == "1.6" and dtypes:
        flags |= RequiredFlag.DTYPES
    return flags


def minor_for(required_flags: int) -> int:
    """The lowest minor version whose features a file with these flags uses (SPEC.md 4,
    Versions): 6 with DTYPES, 5 with PARTS, 4 with BANDS, 3 with EXPONENT, 2 with DIGESTS or MIXED_CORRECTIONS, else 1 with
    PLANES, else 0."""
    if required_flags & RequiredFlag.DTYPES:
        return 6
    if required_flags & RequiredFlag.PARTS:
        return 5
    if required_flags & RequiredFlag.BANDS:
        return 4
    if required_flags & RequiredFlag.EXPONENT:
        return 3
    if required_flags & (RequiredFlag.DIGESTS | RequiredFlag.MIXED_CORRECTIONS):
        return 2
    return 1 if required_flags & RequiredFlag.PLANES else 0


def written_version(format_version: str, entropy: str, sites: bool = True, dtypes: bool = False) -> str:
    """The version ("1.6" ... "1.0") of a file written as `format_version` with `entropy` (and
    sites, unless `sites` is False: scheme none; EXTENDED_DTYPES if `dtypes`)."""
    return f"{FORMAT_MAJOR}.{minor_for(required_flags_for(format_version, entropy, sites, dtypes))}"


# ----------------------------------------------------------------------------- errors


class ExitStatus(IntEnum):
    """The CLI's exit status for each kind of error (README, Exit codes)."""

    OK = 0
    ERROR = 1  # any other bbformat error
    INPUT = 2  # bad input: paths, options, checkpoint files
    UNSUPPORTED_MODEL = 3
    FORMAT = 4  # the container violates SPEC.md
    INTEGRITY = 5  # a CRC32C mismatch
    LIMIT = 6  # a reader limit exceeded
    VERIFY = 7  # pack --verify found a difference
    OUTPUT = 8  # the output could not be written (E_OUTPUT, E_NO_SPACE)
    DIGEST = 9  # a chunk decoded to other values than its digest records
    DEVICE = 10  # the chosen device (--device) is missing, unusable or out of memory
    USAGE = 64  # command-line usage error
    INTERNAL = 70  # a bug
    INTERRUPTED = 130  # 128 + SIGINT
    BROKEN_PIPE = 141  # 128 + SIGPIPE: stdout's reader went away
    TERMINATED = 143  # 128 + SIGTERM


ERROR_CODES: dict[str, ExitStatus] = {
    # SPEC.md 11.2, in its order: the container violates the format
    "E_MAGIC": ExitStatus.FORMAT,
    "E_TRUNCATED": ExitStatus.FORMAT,
    "E_VERSION": ExitStatus.FORMAT,
    "E_REQUIRED_FLAG": ExitStatus.FORMAT,
    "E_RESERVED": ExitStatus.FORMAT,
    "E_SCHEME": ExitStatus.FORMAT,
    "E_CODEC": ExitStatus.FORMAT,
    "E_ZSTD": ExitStatus.FORMAT,
    "E_METADATA": ExitStatus.FORMAT,
    "E_CRC_HEADER": ExitStatus.INTEGRITY,
    "E_CRC_CHUNK": ExitStatus.INTEGRITY,
    "E_CRC_INDEX_ENTRY": ExitStatus.INTEGRITY,
    "E_CRC_INDEX": ExitStatus.INTEGRITY,
    "E_CRC_FOOTER": ExitStatus.INTEGRITY,
    "E_BOUNDS": ExitStatus.FORMAT,
    "E_INDEX": ExitStatus.FORMAT,
    "E_CHUNK_ORDER": ExitStatus.FORMAT,
    "E_DESCRIPTOR": ExitStatus.FORMAT,
    "E_DTYPE": ExitStatus.FORMAT,
    "E_SITE": ExitStatus.FORMAT,
    "E_SECTION_KIND": ExitStatus.FORMAT,
    "E_SECTION_DUPLICATE": ExitStatus.FORMAT,
    "E_SECTION_MISSING": ExitStatus.FORMAT,
    "E_SECTION_SIZE": ExitStatus.FORMAT,
    "E_SECTION_CONTENT": ExitStatus.FORMAT,
    "E_SYMBOL_COUNT": ExitStatus.FORMAT,
    "E_LIMIT_COUNT": ExitStatus.LIMIT,
    "E_LIMIT_METADATA": ExitStatus.LIMIT,
    "E_LIMIT_NDIM": ExitStatus.LIMIT,
    "E_LIMIT_TENSOR": ExitStatus.LIMIT,
    "E_LIMIT_DIM": ExitStatus.LIMIT,
    "E_LIMIT_SECTION": ExitStatus.LIMIT,
    "E_LIMIT_MEMORY": ExitStatus.LIMIT,  # the reader's memory budget (SPEC.md 11.4, 11.5)
    "E_TRAILING": ExitStatus.FORMAT,
    "E_DIGEST": ExitStatus.DIGEST,
    # not about container validity (SPEC.md 11.2, last paragraph)
    "E_INPUT": ExitStatus.INPUT,
    "E_EXISTS": ExitStatus.INPUT,  # an InputError: the output exists and was not named for replacement
    "E_UNSUPPORTED_MODEL": ExitStatus.UNSUPPORTED_MODEL,
    "E_VERIFY": ExitStatus.VERIFY,
    "E_WRITER_STATE": ExitStatus.ERROR,
    "E_OUTPUT": ExitStatus.OUTPUT,
    "E_NO_SPACE": ExitStatus.OUTPUT,
    "E_DEVICE": ExitStatus.DEVICE,
}
"""Every error code bbformat's checks report (SPEC.md 11.2), with the CLI exit status it ends
with. The exception classes of errors.py carry a default code of their own (E_BBFORMAT,
E_FORMAT, E_CRC, E_LIMIT), which no check relies on."""

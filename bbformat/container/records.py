"""Record layouts shared by the reader and the writer, as construct structs: the writer builds
and the reader parses with the same structs.

Every integer is little-endian. Reserved fields are written as zero and checked. The
format's numbers (magics, sizes, flags, limits) live in bbformat/constants.py.
"""
from __future__ import annotations

import struct
from typing import Any, Callable

from construct import (
    Array,
    Bytes,
    Const,
    FormatField,
    Int16ul,
    Int32ul,
    Int64ul,
    Int8ul,
    PascalString,
    PrefixedArray,
    Struct,
    Subconstruct,
    this,
)

from ..constants import (
    CHUNK_FIXED_SIZE,
    CHUNK_MAGIC,
    FILE_MAGIC,
    FOLLOWER_RECORD_MIN_SIZE,
    FOOTER_SIZE,
    HEADER_FIXED_SIZE,
    INDEX_ENTRY_SIZE,
    INDEX_FIXED_SIZE,
    INDEX_MAGIC,
    MAX_FOLLOWERS_PER_CHUNK,
    MAX_SITES_PER_CHUNK,
    MAX_TENSORS_PER_CHUNK,
    OP_RECORD_SIZE,
    SECTION_ENTRY_SIZE,
    SITE_RECORD_MIN_SIZE,
    TENSOR_RECORD_MIN_SIZE,
)
from ..bytecursor import ByteCursor
from ..errors import FormatError, LimitError
from ..zstdframe import Buffer

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

CHUNK_FIXED = Struct(
    "magic" / Const(CHUNK_MAGIC),
    "content_crc" / Int32ul,  # reserved (0) in a file without FLAG_DIGESTS
    "chunk_length" / Int64ul,
    "chunk_index" / Int32ul,
    "descriptor_length" / Int32ul,
    "section_count" / Int32ul,
    "reserved1" / Int32ul,
)

SECTION_ENTRY = Struct(
    "kind" / Int8ul,
    "codec" / Int8ul,
    "reserved" / Int16ul,
    "site" / Int32ul,
    "offset" / Int64ul,
    "stored_length" / Int64ul,
    "decoded_length" / Int64ul,
)

NAME_LENGTH = Int16ul
NAME = PascalString(NAME_LENGTH, "utf8")
"""A name (SPEC.md 1): its length, then that many bytes of UTF-8."""
RECORD_COUNT = Int32ul
"""The count before a list of records (SPEC.md 5.1)."""

CountCheck = Callable[[int, int, dict[str, Any], dict[str, int]], None]
"""(count, bytes left after it, the record read so far, running totals of this parse) -> None,
or raises."""


class Records(Subconstruct):  # type: ignore[misc]  # construct is untyped
    """A u32 count and that many `record`s (a PrefixedArray). read_descriptor checks the count with
    `check` as soon as it is read, before any record is (SPEC.md 11.3, 11.5)."""

    def __init__(self, record: Struct, check: CountCheck) -> None:
        super().__init__(PrefixedArray(RECORD_COUNT, record))
        self.record = record
        self.check = check


def _fits(count: int, left: int, min_size: int, what: str) -> None:
    """Records that cannot fit in what is left are a structural error, known at once."""
    if count * min_size > left:
        raise FormatError(f"malformed chunk descriptor: {count:,} {what} cannot fit in its length", "E_DESCRIPTOR")


def _within(count: int, limit: int, what: str) -> None:
    if count > limit:
        raise LimitError(f"{count:,} {what} in one chunk (limit {limit:,})", "E_LIMIT_COUNT")


def _tensor_count(count: int, left: int, record: dict[str, Any], totals: dict[str, int]) -> None:
    _fits(count, left, TENSOR_RECORD_MIN_SIZE, "tensor records")
    _within(count, MAX_TENSORS_PER_CHUNK, "tensors")


def _site_count(count: int, left: int, record: dict[str, Any], totals: dict[str, int]) -> None:
    _fits(count, left, SITE_RECORD_MIN_SIZE, "site records")
    _within(count, MAX_SITES_PER_CHUNK, "sites")


def _follower_count(count: int, left: int, record: dict[str, Any], totals: dict[str, int]) -> None:
    """Followers are limited per chunk (the reference's own limit, SPEC.md 11.4)."""
    _fits(count, left, FOLLOWER_RECORD_MIN_SIZE, "follower records")
    totals["followers"] = totals.get("followers", 0) + count
    _within(totals["followers"], MAX_FOLLOWERS_PER_CHUNK, "followers")


def _op_count(count: int, left: int, record: dict[str, Any], totals: dict[str, int]) -> None:
    tensors, sites = len(record["tensors"]), len(record["sites"])
    if count > tensors + sites:
        raise FormatError(f"{count:,} ops for {tensors} tensors and {sites} sites", "E_DESCRIPTOR")


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
    "followers" / Records(FOLLOWER_RECORD, _follower_count),
)
OP_RECORD = Struct("kind" / Int8ul, "reserved0" / Int8ul, "reserved1" / Int16ul, "index" / Int32ul)
DESCRIPTOR = Struct(
    "name" / NAME,
    "symbol_dtype" / Int8ul,
    "reserved0" / Int8ul,
    "reserved1" / Int16ul,
    "tensors" / Records(TENSOR_RECORD, _tensor_count),
    "sites" / Records(SITE_RECORD, _site_count),
    "ops" / Records(OP_RECORD, _op_count),
)
"""A chunk descriptor (SPEC.md 5.1). The writer builds it with construct; a reader reads it with
read_descriptor, which checks every count first (construct's own parse does not)."""


# ----------------------------------------------------------------------------- reading records

_NAME_LENGTH, _RECORD_COUNT = struct.Struct(NAME_LENGTH.fmtstr), struct.Struct(RECORD_COUNT.fmtstr)
Step = Callable[[ByteCursor, dict[str, Any], dict[str, int]], None]


def _fixed_step(names: list[str], fmt: str) -> Step:
    """Consecutive fixed-size fields, unpacked at once."""
    fields = struct.Struct("<" + fmt)

    def step(cur: ByteCursor, record: dict[str, Any], totals: dict[str, int]) -> None:
        record.update(zip(names, cur.unpack(fields, "a record")))
    return step


def _name_step(name: str) -> Step:
    def step(cur: ByteCursor, record: dict[str, Any], totals: dict[str, int]) -> None:
        (n,) = cur.unpack(_NAME_LENGTH, "a name length")
        try:
            record[name] = str(cur.take(n, "a name"), "utf-8")
        except UnicodeDecodeError:
            raise cur.fail("a name is not UTF-8") from None
    return step


def _array_step(name: str, array: Array) -> Step:
    """A field repeated as many times as an earlier field says (dims: ndim of them)."""
    fmt = array.subcon.fmtstr[1:]

    def step(cur: ByteCursor, record: dict[str, Any], totals: dict[str, int]) -> None:
        count = int(array.count(record))
        record[name] = list(cur.unpack(struct.Struct(f"<{count}{fmt}"), "a record")) if count else []
    return step


def _records_step(name: str, records: Records) -> Step:
    steps = _steps_of(records.record)

    def step(cur: ByteCursor, record: dict[str, Any], totals: dict[str, int]) -> None:
        (count,) = cur.unpack(_RECORD_COUNT, "a record count")
        records.check(count, cur.left, record, totals)
        record[name] = [_read(steps, cur, totals) for _ in range(count)]
    return step


def _steps_of(layout: Struct) -> list[Step]:
    """How read_descriptor reads a struct: its fields in order, runs of fixed-size ones at once."""
    steps: list[Step] = []
    names: list[str] = []
    fmt = ""
    for field in layout.subcons:
        if isinstance(field.subcon, FormatField):
            names.append(field.name)
            fmt += field.subcon.fmtstr[1:]
            continue
        if names:
            steps.append(_fixed_step(names, fmt))
            names, fmt = [], ""
        if field.subcon is NAME:
            steps.append(_name_step(field.name))
        elif isinstance(field.subcon, Records):
            steps.append(_records_step(field.name, field.subcon))
        elif isinstance(field.subcon, Array):
            steps.append(_array_step(field.name, field.subcon))
        else:
            raise TypeError(f"read_descriptor cannot read field {field.name!r}")
    if names:
        steps.append(_fixed_step(names, fmt))
    return steps


def _read(steps: list[Step], cur: ByteCursor, totals: dict[str, int]) -> dict[str, Any]:
    record: dict[str, Any] = {}
    for step in steps:
        step(cur, record, totals)
    return record


_DESCRIPTOR_STEPS = _steps_of(DESCRIPTOR)


def read_descriptor(data: Buffer) -> dict[str, Any]:
    """A descriptor's records, read with DESCRIPTOR's layout: every count checked as it is read
    (E_DESCRIPTOR if its records cannot fit, E_LIMIT_COUNT over a limit: SPEC.md 11.3, last
    paragraph); a record running past the end, a name that is not UTF-8 or bytes left over
    are E_DESCRIPTOR. The values are chunks.parse_descriptor's to check."""
    cur = ByteCursor(data, "malformed chunk descriptor", "E_DESCRIPTOR")
    record = _read(_DESCRIPTOR_STEPS, cur, {})
    if not cur.done:
        raise FormatError("chunk descriptor length does not match its contents", "E_DESCRIPTOR")
    return record


INDEX_FIXED = Struct("magic" / Const(INDEX_MAGIC), "chunk_count" / Int32ul)
INDEX_ENTRY = Struct("offset" / Int64ul, "length" / Int64ul, "crc" / Int32ul, "reserved" / Int32ul)

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

# The fixed-size records are as long as constants.py says (checked once, at import).
assert HEADER_FIXED.sizeof() == HEADER_FIXED_SIZE and CHUNK_FIXED.sizeof() == CHUNK_FIXED_SIZE
assert SECTION_ENTRY.sizeof() == SECTION_ENTRY_SIZE and OP_RECORD.sizeof() == OP_RECORD_SIZE
assert INDEX_FIXED.sizeof() == INDEX_FIXED_SIZE and INDEX_ENTRY.sizeof() == INDEX_ENTRY_SIZE and FOOTER.sizeof() == FOOTER_SIZE

"""The one cursor that reads a buffer field by field: a descriptor's records (SPEC.md 5.1), a
section's varints, bytes and groups (8.4-8.6). Every overrun is a FormatError with the
cursor's code, raised before anything is read past the end."""
from __future__ import annotations

import struct

from .constants import MAX_VARINT_BYTES
from .errors import FormatError
from .zstdframe import Buffer


class ByteCursor:
    """Reads `data` in order from `pos`. `what` prefixes every error message; `code` is its code."""

    def __init__(self, data: Buffer, what: str, code: str = "E_SECTION_CONTENT") -> None:
        self.data = memoryview(data)
        self.pos = 0
        self.what = what
        self.code = code

    def fail(self, problem: str) -> FormatError:
        """The cursor's error for `problem`."""
        return FormatError(f"{self.what}: {problem}", self.code)

    @property
    def left(self) -> int:
        """Bytes not read yet."""
        return len(self.data) - self.pos

    @property
    def done(self) -> bool:
        return self.pos == len(self.data)

    def take(self, n: int, what: str) -> memoryview:
        """The next n bytes, as a view (no copy)."""
        if n > len(self.data) - self.pos:
            raise self.fail(f"{what} runs past the end")
        self.pos += n
        return self.data[self.pos - n : self.pos]

    def unpack(self, fields: struct.Struct, what: str) -> tuple[int, ...]:
        """The next fields.size bytes, unpacked."""
        if fields.size > len(self.data) - self.pos:
            raise self.fail(f"{what} runs past the end")
        self.pos += fields.size
        return fields.unpack_from(self.data, self.pos - fields.size)

    def u8(self, what: str) -> int:
        if self.pos >= len(self.data):
            raise self.fail(f"{what} is missing")
        self.pos += 1
        return int(self.data[self.pos - 1])

    def varint(self, what: str) -> int:
        """An LEB128 varint of at most 10 bytes and below 2^64 (SPEC.md 1)."""
        v = shift = 0
        end = self.pos
        while end < len(self.data) and end - self.pos < MAX_VARINT_BYTES:
            byte = self.data[end]
            v |= (byte & 0x7F) << shift
            shift += 7
            end += 1
            if not byte & 0x80:
                if v >> 64:
                    raise self.fail(f"{what} is 2^64 or more")
                self.pos = end
                return v
        raise self.fail(f"{what} is not a complete varint")

    def group(self, what: str) -> tuple[int, memoryview]:
        """(codec, stored bytes) of the next group (SPEC.md 8.4, 8.6): a varint L, a codec byte
        and L bytes (codec.varint.encode_group writes one). The codec's value is the caller's
        to check."""
        length = self.varint(f"{what} length")
        codec = self.u8(f"{what} codec")
        if length > self.left:
            raise self.fail(f"{what} runs past the section")
        return codec, self.take(length, what)

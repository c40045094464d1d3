"""CRC32C (Castagnoli): reflected polynomial 0x82F63B78, init and xorout 0xFFFFFFFF."""
from __future__ import annotations

import crc32c as _crc32c

CHECK_VALUE = 0xE3069283  # crc32c(b"123456789")


def crc32c(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    return _crc32c.crc32c(data, value=value) & 0xFFFFFFFF

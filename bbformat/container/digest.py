"""The content digest of a decoded chunk (SPEC.md 5.4)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import numpy as np

from .crc import crc32c
from .program import BlockProgram


class DecodedTensor(Protocol):
    """A decoded tensor (codec.dtypes.RawTensor): its elements as little-endian unsigned ints."""

    def little_endian(self) -> np.ndarray: ...


def content_crc(program: BlockProgram, tensors: Mapping[str, DecodedTensor]) -> int:
    """CRC32C of the decoded tensors' little-endian element bytes, in tensor-record order."""
    value = 0
    for entry in program.tensors:
        le = tensors[entry.name].little_endian().reshape(-1)
        if le.size:
            value = crc32c(le.view(np.uint8).data, value)
    return value

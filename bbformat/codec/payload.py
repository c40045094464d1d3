"""The payload's codec, both ways (SPEC.md 8.2, 8.6, 8.7): the writer's choice among raw,
zstd, planes (codec 2) and exponent (codec 3), and the reader's dispatch of a stored payload."""
from __future__ import annotations

import numpy as np

from ..constants import Codec, RequiredFlag
from ..container.program import BlockProgram
from ..errors import InputError
from ..zstdframe import PAYLOAD_LEVEL, Buffer, compress
from .dtypes import uint_dtype
from .entropy import check_entropy_mode, decode_planes, encode_planes, payload_segments
from .exponent import decode_exponent, encode_exponent


def code_payload(program: BlockProgram, data: bytes, mode: str, flags: int = int(RequiredFlag.PLANES | RequiredFlag.EXPONENT)) -> tuple[int, bytes]:
    """(codec, stored bytes) of a payload under an entropy mode, among the codecs the file's
    required `flags` allow (`auto`: the smallest; ties go to the lower codec number)."""
    check_entropy_mode(mode)
    if mode == "exponent" and not flags & RequiredFlag.EXPONENT:
        raise InputError("entropy mode 'exponent' needs format 1.3 or later")
    if not data or mode == "none":
        return Codec.RAW, data
    best: tuple[int, bytes] = (Codec.RAW, data)  # only the best so far is kept: candidates come in increasing codec number

    def offer(codec: int, coded: bytes | None) -> None:
        """auto: keep the smallest (a tie keeps the lower codec); else the codec asked for, unless it grows the payload."""
        nonlocal best
        if coded is not None and len(coded) < (len(best[1]) if mode == "auto" else len(data)):
            best = (codec, coded)

    w = program.symbol_bits
    sym = np.frombuffer(data, dtype=np.dtype(uint_dtype(w)).newbyteorder("<"))
    if mode in ("zstd", "auto"):
        offer(Codec.ZSTD, compress(data, PAYLOAD_LEVEL))
    runs = payload_segments(program)
    if mode in ("planes", "auto") and flags & RequiredFlag.PLANES:
        offer(Codec.PLANES, encode_planes(sym, w, runs))
    if mode in ("exponent", "auto") and flags & RequiredFlag.EXPONENT:
        offer(Codec.EXPONENT, encode_exponent(sym, program.symbol_dtype, runs))
    return best


def decode_payload(codec: int, stored: Buffer, program: BlockProgram) -> np.ndarray:
    """The payload symbols of a codec-2 or codec-3 payload (the caller checked the flag)."""
    if codec == Codec.EXPONENT:
        return decode_exponent(stored, program.payload_symbols(), program.symbol_dtype)
    return decode_planes(stored, program.payload_symbols(), program.symbol_bits)

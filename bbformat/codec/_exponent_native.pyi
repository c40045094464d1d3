# The compiled coder of payload codec 3 (_exponent_native.c); exponent.py is its one caller.
from typing import Any, TypeAlias

import numpy as np

_Buf: TypeAlias = bytes | bytearray | memoryview | np.ndarray[Any, Any]

def decode(stream: _Buf, lanes: int, seg_n: _Buf, seg_r: _Buf, seg_base: _Buf, has_map: _Buf, maps: _Buf,
           first: _Buf, code: _Buf, freq: _Buf, rest: _Buf, shift: int, width: int, out: _Buf,
           simd: bool = ...) -> int: ...
def encode(sym: _Buf, width: int, shift: int, bits: int, lanes: int, seg_n: _Buf, seg_r: _Buf, seg_base: _Buf,
           has_map: _Buf, maps: _Buf, entry_of: _Buf, freq: _Buf, start: _Buf, out: _Buf) -> int: ...
def histogram(sym: _Buf, width: int, shift: int, bits: int, r: int, classes: _Buf, counts: _Buf) -> None: ...
def column_sums(sym: _Buf, width: int, shift: int, bits: int, r: int, sums: _Buf) -> None: ...
def pack_rest(sym: _Buf, width: int, shift: int, low: _Buf, high: _Buf) -> None: ...

SIMD: int  # 1 where the AVX2 steps run (x86-64 with AVX2, GCC or Clang build)
ABI: int  # the functions and argument lists above; exponent.NATIVE_ABI must match

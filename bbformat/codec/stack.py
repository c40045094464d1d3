"""The symbol stack: fixed-width symbols, push appends, pop takes from the top."""
from __future__ import annotations

import numpy as np

from ..errors import FormatError
from .dtypes import uint_dtype


class SymbolStack:
    def __init__(self, symbol_bits: int, initial: np.ndarray | None = None, capacity: int = 0) -> None:
        """capacity: room to reserve at the first push (a decoder knows its peak, so it never
        regrows). `initial` is not copied until something is pushed: a decoder pops tensors
        from the payload first, so a block without rotations is never copied whole."""
        self.symbol_bits = symbol_bits
        self._dtype = uint_dtype(symbol_bits)
        self._buf = np.zeros(0, self._dtype) if initial is None else np.asarray(initial, self._dtype).reshape(-1)
        self._owned = False
        self._capacity = capacity
        self._n = self._buf.size

    def __len__(self) -> int:
        return self._n

    def push(self, symbols: np.ndarray) -> None:
        s = np.asarray(symbols).reshape(-1)
        need = self._n + s.size
        if not self._owned or need > self._buf.size:
            grown = np.empty(max(need, self._capacity, 2 * self._n, 1024), self._dtype)
            grown[: self._n] = self._buf[: self._n]
            self._buf, self._owned = grown, True
        self._buf[self._n : need] = s
        self._n = need

    def peek(self, n: int) -> np.ndarray:
        if n > self._n:
            raise FormatError(f"stack underflow: need {n} symbols, have {self._n}", "E_SYMBOL_COUNT")
        return self._buf[self._n - n : self._n].copy()

    def pop(self, n: int) -> np.ndarray:
        if n == self._n == self._buf.size and self._buf.flags.writeable and self._buf.base is None:
            # the whole of a fresh, writable initial array (a decoded payload holding one
            # tensor): hand it over instead of copying it
            out, self._buf, self._n, self._owned = self._buf, np.zeros(0, self._dtype), 0, False
            return out
        out = self.peek(n)
        self._n -= n
        return out

    def symbols(self) -> np.ndarray:
        return self._buf[: self._n].copy()

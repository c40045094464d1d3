"""The symbol stack: fixed-width symbols, push appends, pop takes from the top."""
from __future__ import annotations

import numpy as np

from ..errors import FormatError
from .dtypes import uint_dtype


class SymbolStack:
    def __init__(self, symbol_bits: int, initial: np.ndarray | None = None, capacity: int = 0) -> None:
        """capacity: room to reserve up front (a decoder knows its peak, so it never regrows)."""
        self.symbol_bits = symbol_bits
        self._dtype = uint_dtype(symbol_bits)
        init = np.zeros(0, self._dtype) if initial is None else np.asarray(initial, self._dtype)
        self._buf = np.empty(max(capacity, init.size, 1 if capacity else 1024), self._dtype)
        self._buf[: init.size] = init
        self._n = init.size

    def __len__(self) -> int:
        return self._n

    def push(self, symbols: np.ndarray) -> None:
        s = np.asarray(symbols).reshape(-1)
        need = self._n + s.size
        if need > self._buf.size:
            grown = np.empty(max(need, 2 * self._buf.size), self._dtype)
            grown[: self._n] = self._buf[: self._n]
            self._buf = grown
        self._buf[self._n : need] = s
        self._n = need

    def peek(self, n: int) -> np.ndarray:
        if n > self._n:
            raise FormatError(f"stack underflow: need {n} symbols, have {self._n}", "E_SYMBOL_COUNT")
        return self._buf[self._n - n : self._n].copy()

    def pop(self, n: int) -> np.ndarray:
        out = self.peek(n)
        self._n -= n
        return out

    def symbols(self) -> np.ndarray:
        return self._buf[: self._n].copy()

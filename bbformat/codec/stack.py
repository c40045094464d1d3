"""The symbol stack: fixed-width symbols, push appends, pop takes from the top."""
from __future__ import annotations

import numpy as np

from ..errors import FormatError
from . import scratch
from .dtypes import uint_dtype


class SymbolStack:
    """Two parts: the `initial` symbols (a decoded payload), which are only ever read, and
    the symbols pushed since, in a buffer of the stack's own. A pop takes from the pushed
    part first, then from the initial one, so the payload is never copied whole: a decoder
    holds its payload plus what it pushes (a site's regenerated block), not the payload twice."""

    def __init__(self, symbol_bits: int, initial: np.ndarray | None = None, capacity: int = 0) -> None:
        """capacity: the most symbols the stack will hold; what the initial symbols leave of it
        is reserved at the first push, so the pushed part never regrows."""
        self.symbol_bits = symbol_bits
        self._dtype = uint_dtype(symbol_bits)
        base = np.zeros(0, self._dtype) if initial is None else np.asarray(initial, self._dtype)
        self._base = base if base.ndim == 1 else base.reshape(-1)
        self._nbase = self._base.size
        self._top = np.zeros(0, self._dtype)
        self._ntop = 0
        self._adopted = False  # _top is a caller's array (push(adopt=True)): never written, copied out on the next push
        self._reserve = max(0, capacity - self._nbase)

    def __len__(self) -> int:
        return self._nbase + self._ntop

    def push(self, symbols: np.ndarray, adopt: bool = False) -> None:
        """Append the symbols (copied). adopt: the caller never changes `symbols` afterwards, so
        a push onto an empty top that fills all the room reserved takes a C-contiguous array of
        the symbol dtype as it is (a chunk of one tensor: its payload is that tensor); the
        stack never writes into it, and a later push copies it out."""
        s = np.asarray(symbols).reshape(-1)
        if not s.size:
            return
        if adopt and not self._ntop and s.size >= self._reserve and s.dtype == self._dtype and s.flags.c_contiguous:
            self._top, self._ntop, self._adopted = s, s.size, True
            return
        need = self._ntop + s.size
        if need > self._top.size or self._adopted:  # an adopted array is copied out into room for what was reserved
            grown = scratch.empty(max(need, self._reserve, 1024) if self._adopted else max(need, self._reserve, 2 * self._ntop, 1024),
                                  self._dtype)
            grown[: self._ntop] = self._top[: self._ntop]
            self._top, self._adopted = grown, False
        self._top[self._ntop : need] = s
        self._ntop = need

    def peek(self, n: int) -> np.ndarray:
        if n > len(self):
            raise FormatError(f"stack underflow: need {n} symbols, have {len(self)}", "E_SYMBOL_COUNT")
        if n <= self._ntop:
            return self._top[self._ntop - n : self._ntop].copy()
        below = n - self._ntop
        return np.concatenate((self._base[self._nbase - below : self._nbase], self._top[: self._ntop]))

    def pop(self, n: int, share: bool = False) -> np.ndarray:
        """The top n symbols, bottom first. share: where they all lie in the initial symbols,
        a view of them (the initial array then lives as long as the view), not a copy."""
        if n == self._nbase == self._base.size and not self._ntop and self._base.flags.writeable and self._base.base is None:
            # the whole of a fresh, writable initial array (a decoded payload holding one
            # tensor): hand it over instead of copying it
            out, self._base, self._nbase = self._base, np.zeros(0, self._dtype), 0
            return out
        if share and not self._ntop and n <= self._nbase:
            self._nbase -= n
            return self._base[self._nbase : self._nbase + n]
        out = self.peek(n)
        if n <= self._ntop:
            self._ntop -= n
        else:
            self._nbase -= n - self._ntop
            self._ntop = 0
        return out

    def symbols(self) -> np.ndarray:
        return np.concatenate((self._base[: self._nbase], self._top[: self._ntop]))

    def take(self) -> np.ndarray:
        """The symbols, handed over without a copy where they are in one part (an adopted array
        itself, read-only if it was); the stack is empty afterwards."""
        if not self._nbase:
            out = self._top[: self._ntop]
        elif not self._ntop:
            out = self._base[: self._nbase]
        else:
            out = self.symbols()
        self._base, self._nbase = np.zeros(0, self._dtype), 0
        self._top, self._ntop, self._adopted = np.zeros(0, self._dtype), 0, False
        return out

"""The tensors of a weights file mapped from it, not read: pages come in when a tensor is first
used, and leave this process's resident set again when it is released."""
from __future__ import annotations

import ctypes
import functools
import mmap
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch


class MappedWeights(Mapping[str, torch.Tensor]):
    """The tensors of a weights file, mapped from the file instead of read: a tensor's pages are
    read when it is first used, and release(name) drops them from this process's resident set
    again (they stay in the OS page cache). pack holds about one block of the model this way,
    whatever the file's size. close() unmaps the file (the tensors must not be used after)."""

    def __init__(self, path: Path | list[Path], tensors: dict[str, torch.Tensor], keep_alive: object = None) -> None:
        paths = path if isinstance(path, list) else [path]  # a sharded model: several files
        self._path = paths[0]
        self._tensors = tensors
        self._keep_alive = keep_alive  # e.g. the safetensors handle that owns the mapping
        self._ranges = [r for p in paths for r in _file_mappings(p)]

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._tensors[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    @property
    def mapped_ranges(self) -> list[tuple[int, int]]:
        """[start, end) of this process's mappings of the file: the only memory release() touches."""
        return list(self._ranges)

    def release(self, name: str) -> None:
        """Drop `name`'s pages from the resident set (only ever within this file's own mappings)."""
        t = self._tensors.get(name)
        if t is not None and t.numel():
            start = t.data_ptr()  # a view's extent: its last element is at sum((size - 1) * stride)
            last = sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
            release_mapped(self._ranges, start, start + (last + 1) * t.element_size())

    def close(self) -> None:
        self._tensors = {}
        self._keep_alive = None


_PAGE = mmap.PAGESIZE
_MADV_DONTNEED = 4


def _file_mappings(path: Path) -> list[tuple[int, int]]:
    """[start, end) of this process's mappings of `path` (matched by device and inode), from
    /proc/self/maps; empty where there is no such file (then nothing is ever released)."""
    try:
        st = os.stat(path)
        with open("/proc/self/maps") as f:
            lines = f.readlines()
    except OSError:
        return []
    out = []
    for line in lines:
        parts = line.split()
        if len(parts) < 6 or parts[4] != str(st.st_ino):
            continue
        major, minor = (int(x, 16) for x in parts[3].split(":"))
        if os.makedev(major, minor) != st.st_dev:
            continue
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        out.append((lo, hi))
    return out


def release_mapped(ranges: list[tuple[int, int]], start: int, end: int) -> None:
    """madvise(MADV_DONTNEED) on the whole pages of [start, end) that lie inside one of `ranges`,
    which must be read-only or unmodified private file mappings: their pages are read again
    from the file if touched. Never applied to anything else (that would discard data)."""
    lo = (start + _PAGE - 1) // _PAGE * _PAGE  # whole pages only: a neighbour's page stays
    hi = end // _PAGE * _PAGE
    libc = _libc()
    if hi <= lo or libc is None or not any(a <= lo and hi <= b for a, b in ranges):
        return
    libc.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), _MADV_DONTNEED)


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        return libc
    except (OSError, AttributeError):
        return None

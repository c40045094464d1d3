"""Streaming container writer: header, then one chunk per block, then index and footer.

A state machine: calls out of order raise. Writing to a path is atomic (temp file
in the same directory, fsync, rename); any stream with `write` also works, and it
need not be seekable.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import BinaryIO

from .codec.program import BlockProgram
from .codec.sections import Section
from .container.chunks import build_chunk
from .container.crc import crc32c
from .container.framing import IndexEntry, build_footer, build_header, build_index
from .errors import BBFormatError, InputError
from .fsutil import fsync_dir


class WriterStateError(BBFormatError):
    code = "E_WRITER_STATE"


class Writer:
    def __init__(self, dest: str | os.PathLike[str] | BinaryIO, scheme: str, chunk_count: int, metadata: dict) -> None:
        self._path: Path | None = None
        self._tmp: str | None = None
        if isinstance(dest, (str, os.PathLike)):
            self._path = Path(dest)
            parent = self._path.parent if str(self._path.parent) else Path(".")
            if not parent.is_dir():
                raise InputError(f"output directory {parent} does not exist")
            fd, self._tmp = tempfile.mkstemp(prefix=f".{self._path.name}.", suffix=".tmp", dir=parent)
            self._out: BinaryIO = os.fdopen(fd, "wb")
        else:
            self._out = dest
        self._expected = chunk_count
        self._entries: list[IndexEntry] = []
        self._state = "chunks"
        header = build_header(scheme, chunk_count, metadata)
        self._out.write(header)
        self._pos = len(header)
        self.metadata_bytes = len(header)

    @property
    def bytes_written(self) -> int:
        return self._pos

    def add_chunk(self, program: BlockProgram, sections: list[Section]) -> IndexEntry:
        if self._state != "chunks":
            raise WriterStateError(f"add_chunk() called in state {self._state!r}")
        if len(self._entries) >= self._expected:
            raise WriterStateError(f"more chunks than the {self._expected} declared")
        data = build_chunk(len(self._entries), program, sections)
        entry = IndexEntry(self._pos, len(data), int.from_bytes(data[-4:], "little"))
        assert entry.crc == crc32c(data[:-4])
        self._out.write(data)
        self._pos += len(data)
        self._entries.append(entry)
        return entry

    def close(self) -> int:
        """Write index and footer; publish the file. Returns the container size."""
        if self._state != "chunks":
            raise WriterStateError(f"close() called in state {self._state!r}")
        if len(self._entries) != self._expected:
            raise WriterStateError(f"{len(self._entries)} chunks written, {self._expected} declared")
        index = build_index(self._entries)
        footer = build_footer(self._pos, index)
        self._out.write(index + footer)
        self._pos += len(index) + len(footer)
        self._state = "closed"
        if self._path is not None:
            self._out.flush()
            os.fsync(self._out.fileno())
            self._out.close()
            assert self._tmp is not None
            os.replace(self._tmp, self._path)
            self._tmp = None
            fsync_dir(self._path.parent)
        else:
            self._out.flush()
        return self._pos

    def abort(self) -> None:
        """Discard a partial output; nothing appears at the destination."""
        if self._state == "closed":
            return
        self._state = "aborted"
        if self._path is not None:
            self._out.close()
            if self._tmp and os.path.exists(self._tmp):
                os.unlink(self._tmp)

    def __enter__(self) -> "Writer":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:  # type: ignore[no-untyped-def]
        if exc_type is not None:
            self.abort()
        elif self._state == "chunks":
            self.close()


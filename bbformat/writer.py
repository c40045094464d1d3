"""Streaming container writer: header, then one chunk per block, then index and footer.

A state machine: calls out of order raise. Writing to a path is atomic: the bytes go to
`.NAME.bbtmp-<12 hex>` in the destination's directory, which is fsynced and renamed over
NAME only once complete, so NAME is at every moment absent, the previous file or the new
complete one, even if the process is killed. A killed process can leave its temp behind;
the next successful write of NAME removes such leftovers once they are an hour old (see
fsutil). Any stream with `write` also works, and it need not be seekable.

An OSError while writing (disk full, file-size limit, I/O error) becomes an OutputError
(NoSpaceError for ENOSPC/EDQUOT/EFBIG), after the temp file is removed.
"""
from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Callable

from .codec.entropy import check_entropy_mode
from .codec.payload import PartPool, code_payload
from .codec.runner import Runner, in_turn
from .constants import EXTENDED_DTYPES, FLOAT_DTYPES, PART_SYMBOLS, SYMBOL_BITS, RequiredFlag, SectionKind, minor_for, required_flags_for
from .container.digest import content_crc
from .container.program import BlockProgram, bits_of
from .codec.section_kinds import BAND
from .codec.sections import Section
from .container.section_rules import band_widths
from .container.chunks import BuiltChunk, build_chunk_parts
from .container.framing import IndexEntry, build_footer, build_index, check_format_version, check_header, seal_header
from .errors import BBFormatError, InputError, check_count, output_error, output_exists
from .fsutil import AtomicOutput, check_output_file


if TYPE_CHECKING:
    from .codec.encoder import EncodedChunk


class WriterStateError(BBFormatError):
    code = "E_WRITER_STATE"




class Writer:
    def __init__(self, dest: str | os.PathLike[str] | BinaryIO, scheme: str, chunk_count: int, metadata: dict[str, Any],
                 entropy: str = "none", background_header: bool = False, format_version: str = "1.3", *,
                 overwrite: bool = False, threads: int | None = None, part_symbols: int = PART_SYMBOLS, dtypes: bool = False) -> None:
        """entropy: how add_chunk stores each payload (SPEC.md 8.6, 8.7): "none" raw, "zstd" one
        zstd frame, "planes" codec 2, "exponent" codec 3 (format 1.3), "auto" the smallest of
        those the format version allows, per chunk. "planes" and "auto" set the required flag
        PLANES, which 1.0 readers refuse; in 1.3, "exponent" and "auto" set EXPONENT, which
        1.2 readers refuse.

        format_version "1.3" (the default) and "1.2" set DIGESTS and MIXED_CORRECTIONS: every chunk
        records the digest of its decoded tensors (add_chunk's content_crc, SPEC.md 5.4), which
        1.1 readers refuse; "1.1" writes neither (a 1.0 file unless PLANES is set).

        background_header: compress the metadata (zstd-19; seconds for a tokenizer) on a
        thread of its own; the header is written before the first chunk, as always.

        overwrite: a path destination that exists is refused (OutputExistsError, E_EXISTS)
        unless True, here and again, atomically, when close() publishes the file
        (fsutil.rename_no_replace): a file that appears meanwhile is never replaced.

        threads: how many threads code the parts of one large payload (format 1.5, SPEC.md 8.9),
        and build an encoder's side sections (add_encoded, runner; any format version); None is
        every CPU this process may use. The bytes do not depend on it. part_symbols: a
        payload of more symbols is cut into parts of about this many (at most WRITER_PARTS;
        SPEC.md 8.9's informative rule; smaller for tests and conformance vectors).

        dtypes: the chunks may hold tensors of the dtypes of format 1.6 (float64, the integers,
        bool, float8; constants.EXTENDED_DTYPES): needs format_version "1.6", and sets
        RequiredFlag.DTYPES (minor 6), which 1.5 readers refuse. Without it such a chunk is an
        InputError. The header is written first, so this is said up front."""
        check_entropy_mode(entropy)
        check_format_version(format_version, entropy, dtypes)
        self._entropy = entropy
        self._flags = required_flags_for(format_version, entropy, sites=scheme != "none", dtypes=dtypes)
        fields = check_header(scheme, chunk_count, metadata, self._flags)  # refuses bad input before a temp file exists
        self._parts = PartPool(threads)
        self._part_symbols = check_count("part_symbols", part_symbols)
        self._header_pool: ThreadPoolExecutor | None = None
        self._header: Future[bytes] | None = None  # a background header not yet written
        self._path: Path | None = None
        self._atomic: AtomicOutput | None = None  # a path destination's temp file, until published
        self._state = "chunks"
        if isinstance(dest, (str, os.PathLike)):
            self._path = Path(dest)
            parent = self._path.parent if str(self._path.parent) else Path(".")
            if not parent.is_dir():
                raise InputError(f"output directory {parent} does not exist")
            if self._path.is_dir():
                raise InputError(f"output {self._path} is a directory")
            check_output_file(self._path, overwrite)
            self._existed = os.path.lexists(self._path)
            try:
                self._atomic = AtomicOutput(self._path, replace=overwrite)
            except OSError as exc:
                raise output_error(exc, self._path, self._untouched()) from None
            assert self._atomic.file is not None
            self._out: BinaryIO = self._atomic.file
        else:
            self._out = dest
        try:  # an interrupt (SIGINT, SIGTERM) before the caller holds this Writer: no temp is left
            self._start(chunk_count, fields, background_header)
        except BaseException:
            if self._atomic is not None:
                self._atomic.discard()
            raise

    def _start(self, chunk_count: int, fields: Any, background_header: bool) -> None:
        self._expected = chunk_count
        self._entries: list[IndexEntry] = []
        self._waiting: list[BuiltChunk] = []  # built chunks not yet written (behind a background header)
        self._added = 0
        self._pos = 0
        self._header_bytes = 0
        if background_header:
            self._header_pool = ThreadPoolExecutor(1, thread_name_prefix="bbformat-header")
            self._header = self._header_pool.submit(seal_header, fields)
        else:
            self._write_header(seal_header(fields))

    def _write_header(self, header: bytes) -> None:
        self._write(header)
        self._header_bytes = len(header)

    def _stop_header_pool(self) -> None:
        if self._header_pool is not None:
            self._header_pool.shutdown(wait=False, cancel_futures=True)
            self._header_pool = None

    @property
    def metadata_bytes(self) -> int:
        """The header's size (waits for a background header's compression; writes nothing)."""
        if self._header is not None:
            return len(self._header.result())
        return self._header_bytes

    def _write(self, data: bytes | bytearray | memoryview) -> None:
        try:
            self._out.write(data)
        except OSError as exc:
            self._fail(exc)
        self._pos += len(data)

    def _fail(self, exc: OSError) -> None:
        """Discard the partial output and raise the OSError as an OutputError."""
        self.abort()
        stream_name: object = getattr(self._out, "name", "the output stream")
        target = self._path if self._path is not None else stream_name
        raise output_error(exc, str(target), self._untouched()) from None

    def _untouched(self) -> str:
        if self._path is None:
            return ""
        return f"; the existing {self._path} is unchanged" if self._existed else f"; {self._path} was not created"

    @property
    def bytes_written(self) -> int:
        return self._pos

    def code_sections(self, program: BlockProgram, sections: list[Section]) -> list[Section]:
        """The sections as add_chunk stores them: the payload under this writer's entropy mode.
        Pure and thread-safe, so a caller can code one chunk while it encodes the next."""
        if self._entropy == "none":
            return list(sections)
        return [self._code(program, s) if s.kind == SectionKind.PAYLOAD else s for s in sections]

    @property
    def digests(self) -> bool:
        """Whether add_chunk needs each chunk's content_crc (format 1.2)."""
        return bool(self._flags & RequiredFlag.DIGESTS)

    @property
    def bands(self) -> bool:
        """Whether every non-PLAIN site stores its band widths (format 1.4, the encoder's bands=True)."""
        return bool(self._flags & RequiredFlag.BANDS)

    @property
    def mixed_corrections(self) -> bool:
        """Whether a site may carry x_residuals and x_patches together (the encoder's band=True)."""
        return bool(self._flags & RequiredFlag.MIXED_CORRECTIONS)

    def add_chunk(self, program: BlockProgram, sections: list[Section], coded: bool = False, content_crc: int | None = None) -> None:
        """Append the next chunk. coded=True: `sections` come from code_sections already.
        content_crc: the digest of the chunk's decoded tensors (container.digest.content_crc of
        what the encoder's decoding produced), required by a 1.2 writer, refused by a 1.1 one.
        While a background header is still being compressed, chunks wait in memory."""
        if self._state != "chunks":
            raise WriterStateError(f"add_chunk() called in state {self._state!r}")
        if (content_crc is None) == self.digests:
            raise WriterStateError("a 1.2 writer needs each chunk's content_crc" if self.digests
                                   else "a 1.1 writer records no content_crc")
        if self._added >= self._expected:
            raise WriterStateError(f"more chunks than the {self._expected} declared")
        self._check_dtypes(program)
        banded = {sec.site for sec in sections if sec.kind == SectionKind.BAND}
        if banded != ({i for i, s in enumerate(program.sites) if not s.plain} if self.bands else set()):
            raise InputError("a 1.4 file with sites stores a band section for every non-PLAIN site (the encoder's bands=True)"
                             if self.bands else "band sections need format 1.4 (RequiredFlag.BANDS)")
        for sec in sections:  # what a reader would refuse (SPEC.md 8.8), refused here before anything is written
            if sec.kind == SectionKind.BAND:
                if len(sec.data) != BAND.decoded_limit(program, sec.site):
                    raise InputError(f"site {sec.site}'s band section holds {len(sec.data)} bytes, "
                                     f"not {BAND.decoded_limit(program, sec.site)}")
                try:
                    band_widths(sec.data)
                except BBFormatError as exc:
                    raise InputError(f"site {sec.site}: {exc}") from None
        if not coded:
            sections = self.code_sections(program, sections)
        self._waiting.append(build_chunk_parts(self._added, program, sections, content_crc or 0))
        self._added += 1
        if self._header is not None and not self._header.done():
            return
        self._flush()

    def _check_dtypes(self, program: BlockProgram) -> None:
        """What a reader would refuse as E_DTYPE or E_SITE (SPEC.md 5.2, 6.1, 6.2), refused here."""
        used = {program.symbol_dtype, *(t.dtype for t in program.tensors)}
        for dtype in sorted(used):
            bits_of(dtype)  # an unknown name: InputError
        if used & EXTENDED_DTYPES and not self._flags & RequiredFlag.DTYPES:
            raise InputError(f"chunk {program.name!r} holds {', '.join(sorted(used & EXTENDED_DTYPES))}: "
                             "a Writer(format_version='1.6', dtypes=True) stores them")
        w = bits_of(program.symbol_dtype)
        if w not in SYMBOL_BITS or any(bits_of(t.dtype) % w for t in program.tensors):
            raise InputError(f"chunk {program.name!r}: symbol dtype {program.symbol_dtype} is not 8, 16 or 32 bits wide, "
                             "or wider than a tensor")
        anchors = {program.tensors[s.anchor].dtype for s in program.sites if 0 <= s.anchor < len(program.tensors)}
        if program.sites and not {program.symbol_dtype, *anchors} <= set(FLOAT_DTYPES):
            raise InputError(f"chunk {program.name!r}: sites need float symbols and float anchors")

    def runner(self) -> Runner:
        """A Runner on this writer's part threads (`threads`), for work whose result does not
        depend on the threads: an encoder's side sections (EncodedChunk.finish). Jobs it runs
        may use it again (they run in turn there)."""
        return self._parts.runner()

    def add_encoded(self, enc: "EncodedChunk") -> None:
        """add_chunk for an encoder's chunk, with its digest when this writer records them."""
        if self._state != "chunks":  # before the side sections' work, not after it
            raise WriterStateError(f"add_encoded() called in state {self._state!r}")
        sections = enc.finish(self.runner())
        self.add_chunk(enc.program, sections, content_crc=content_crc(enc.program, enc.intended) if self.digests else None)

    def _flush(self) -> None:
        """Write a background header if it is not yet written, then the chunks waiting for it."""
        if self._header is not None:
            header = self._header.result()
            self._stop_header_pool()
            self._header = None
            self._write_header(header)
        for chunk in self._waiting:
            entry = IndexEntry(self._pos, chunk.length, chunk.crc)
            for part in chunk.parts:
                self._write(part)
            assert self._pos == entry.offset + entry.length
            self._entries.append(entry)
        self._waiting.clear()

    def _code(self, program: BlockProgram, section: Section) -> Section:
        run = self._parts.runner() if self._flags & RequiredFlag.PARTS else in_turn
        codec, stored = code_payload(program, section.data, self._entropy, self._flags, run, self._part_symbols)
        return Section(section.kind, section.site, section.data, codec, stored)

    def close(self, check: "Callable[[Path], None] | None" = None) -> int:
        """Write index and footer; publish the file. Returns the container size.

        check, for a path destination, is called on the complete, fsynced temp file before it
        replaces the destination; if it raises, the temp file is removed, the destination is
        untouched, and the exception propagates (pack --verify uses this)."""
        if self._state != "chunks":
            raise WriterStateError(f"close() called in state {self._state!r}")
        if self._added != self._expected:
            raise WriterStateError(f"{self._added} chunks written, {self._expected} declared")
        self._flush()
        self._parts.close()
        index = build_index(self._entries)
        footer = build_footer(self._pos, index, minor_for(self._flags))
        self._write(index + footer)
        try:
            self._out.flush()
            if self._atomic is not None:
                self._atomic.publish(check)
        except FileExistsError:  # appeared since __init__ (overwrite=False): left as it is
            self.abort()
            raise output_exists(f"{self._path}: it appeared while this file was written") from None
        except OSError as exc:
            self._fail(exc)
        except BaseException:  # check refused the file, or an interrupt: nothing is published
            self.abort()
            raise
        self._state = "closed"
        return self._pos

    def abort(self) -> None:
        """Discard a partial output; nothing appears at the destination."""
        if self._state in ("closed", "aborted"):
            return
        self._state = "aborted"
        self._stop_header_pool()
        self._parts.close()
        self._waiting.clear()
        if self._atomic is not None:
            self._atomic.discard()

    def __enter__(self) -> "Writer":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:  # type: ignore[no-untyped-def]
        if exc_type is not None:
            self.abort()
        elif self._state == "chunks":
            self.close()


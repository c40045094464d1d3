#!/usr/bin/env python3
"""Generate the bbformat conformance suite (GitHub issue #4): every vector, manifest.json
and ERRORS.md, deterministically (fixed seeds, no timestamps, sorted JSON).

    python conformance/generate.py [--out DIR] [--no-check]

--out defaults to this directory. Every vector is checked while it is written: a reject
vector must be rejected by the reference reader (bbformat.Reader, random access, all chunks
read and decoded) with exactly the manifest's code, an accept vector must decode. Unless
--no-check, every vector is also decoded with alternative numerics (other eigensolvers:
Debian's reference LAPACK dsyevd through ctypes, SciPy's MRRR and QR drivers; other
summation orders for the Gram matrix and the regenerated block) and must land within its
stated tolerance, bit-exactly in a file with digests (1.2), and reject vectors must keep their
code: the suite is robust to a reader with another LAPACK (SPEC.md section 9, guarantees 2
and 3; 5.4 and 12.6 for 1.2's band).

Every vector made before 1.2 keeps its bytes: they are made with the 1.1 encoder
(encode_chunk(..., band=False), Writer/pack(..., format_version="1.1")); add_v12 makes the
1.2 ones. Generate with OPENBLAS_CORETYPE=Haswell (manifest generator.blas_kernel).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import ctypes
import ctypes.util
import hashlib
import io
import json
import os
import platform
import shutil
import struct
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # faster on a shared machine; results are the same

import numpy as np  # noqa: E402
import zstandard  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import bbformat  # noqa: E402
from bbformat.constants import (  # noqa: E402
    CHUNK_MAGIC,
    FILE_MAGIC,
    FOOTER_MAGIC,
    INDEX_MAGIC,
    NO_SITE,
    OpKind,
    RequiredFlag,
    SectionKind,
    SiteFlag,
)
from bbformat import errors as bberr  # noqa: E402
from bbformat.codec import rotation as rot  # noqa: E402
from bbformat.codec.dtypes import RawTensor  # noqa: E402
from bbformat.codec.encoder import encode_chunk  # noqa: E402
from bbformat.codec.layout import ChunkLayout, SiteSpec  # noqa: E402
from bbformat.container.program import AxisRef  # noqa: E402
from bbformat.codec.decoder import decode_program  # noqa: E402
from bbformat.codec.sections import StoredCorrector  # noqa: E402
from bbformat.codec.section_kinds import residual_contexts  # noqa: E402
from bbformat.codec.varint import encode_varint, encode_varints, zigzag  # noqa: E402
from bbformat.container import records as R  # noqa: E402
from bbformat.container.chunks import parse_chunk, program_record  # noqa: E402
from bbformat.container.crc import crc32c  # noqa: E402
from bbformat.container.digest import content_crc  # noqa: E402
from bbformat.reader import Reader, iter_stream  # noqa: E402

import impl_python  # noqa: E402
import run as runner  # noqa: E402

SPEC_VERSION = "1.6"  # of the manifest; each vector records the version that introduced it
U64 = (1 << 64) - 1
ZSTD = zstandard.ZstdCompressor(level=19, write_content_size=True, write_checksum=False)


class GenError(Exception):
    pass


# =============================================================================================
# Byte-level model of a container: every field can be overridden, CRCs are resealed unless
# an override says otherwise.
# =============================================================================================


@dataclass
class Sec:
    kind: int
    site: int
    stored: bytes
    decoded_length: int
    codec: int = 0
    reserved: int = 0
    over: dict = field(default_factory=dict)  # table-entry overrides: offset, stored_length, decoded_length


def raw_sec(kind: int, site: int, data: bytes) -> Sec:
    return Sec(kind, site, data, len(data), 0)


def zstd_sec(kind: int, site: int, data: bytes) -> Sec:
    return Sec(kind, site, ZSTD.compress(data), len(data), 1)


@dataclass
class Chk:
    rec: dict  # descriptor record as construct takes it (see container/records.py)
    secs: list[Sec]
    head: dict = field(default_factory=dict)  # magic, reserved0, chunk_length, chunk_index, descriptor_length, section_count, reserved1
    desc: bytes | None = None  # raw descriptor bytes instead of rec
    tail: bytes = b""  # bytes between the last section and the CRC
    crc: int | None = None  # stored chunk CRC (None: correct)

    def copy(self) -> "Chk":
        return copy.deepcopy(self)

    def descriptor(self) -> bytes:
        return self.desc if self.desc is not None else R.DESCRIPTOR.build(self.rec)

    def sec(self, kind: int, site: int | None = None) -> Sec:
        return next(s for s in self.secs if s.kind == kind and (site is None or s.site == site))

    def build(self, index: int) -> bytes:
        desc = self.descriptor()
        table_end = 32 + len(desc) + 32 * len(self.secs)
        entries, off = [], table_end
        for s in self.secs:
            e = dict(kind=s.kind, codec=s.codec, reserved=s.reserved, site=s.site, offset=off, stored_length=len(s.stored),
                     decoded_length=s.decoded_length)
            e.update(s.over)
            entries.append(struct.pack("<BBHIQQQ", e["kind"], e["codec"], e["reserved"], e["site"], e["offset"], e["stored_length"],
                                       e["decoded_length"]))
            off += len(s.stored)
        body_rest = desc + b"".join(entries) + b"".join(s.stored for s in self.secs) + self.tail
        h = dict(magic=CHUNK_MAGIC, reserved0=0, chunk_length=32 + len(body_rest) + 4, chunk_index=index, descriptor_length=len(desc),
                 section_count=len(self.secs), reserved1=0)
        h.update(self.head)
        head = h["magic"] + struct.pack("<IQIIII", h["reserved0"], h["chunk_length"], h["chunk_index"], h["descriptor_length"],
                                        h["section_count"], h["reserved1"])
        body = head + body_rest
        crc = crc32c(body) if self.crc is None else self.crc
        return body + struct.pack("<I", crc)


def chk_from(enc) -> Chk:  # type: ignore[no-untyped-def]
    """An encoder's EncodedChunk as an editable Chk."""
    return Chk(program_record(enc.program), [Sec(s.kind, s.site, s.stored, len(s.data), s.codec) for s in enc.sections])


def meta_bytes(meta: dict) -> bytes:
    return json.dumps(meta, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


@dataclass
class BB:
    chunks: list[Chk]
    scheme: int = 2
    meta: bytes = b'{"tolerance":0.0}'
    meta_codec: int = 0
    hdr: dict = field(default_factory=dict)  # magic major minor required_flags optional_flags scheme reserved chunk_count metadata_length crc
    entry_edit: Callable[[list[dict]], None] | None = None  # edits [{offset, length, crc, reserved}]
    index_magic: bytes = INDEX_MAGIC
    index_count: int | None = None
    index_extra: bytes = b""
    index_crc: int | None = None  # footer's index_crc (None: correct)
    ftr: dict = field(default_factory=dict)  # index_offset index_length major minor reserved crc magic
    trailing: bytes = b""

    def copy(self) -> "BB":
        c = copy.copy(self)
        c.chunks = [k.copy() for k in self.chunks]
        c.hdr, c.ftr = dict(self.hdr), dict(self.ftr)
        return c

    def header(self) -> bytes:
        h = dict(magic=FILE_MAGIC, major=1, minor=0, required_flags=0, optional_flags=0, scheme=self.scheme, codec=self.meta_codec,
                 reserved=0, chunk_count=len(self.chunks), metadata_length=len(self.meta))
        h.update(self.hdr)
        fixed = h["magic"] + struct.pack("<HHIIBBHII", h["major"], h["minor"], h["required_flags"], h["optional_flags"], h["scheme"],
                                         h["codec"], h["reserved"], h["chunk_count"], h["metadata_length"])
        body = fixed + self.meta
        return body + struct.pack("<I", h.get("crc", crc32c(body)))

    def build(self) -> bytes:
        header = self.header()
        chunks = [c.build(i) for i, c in enumerate(self.chunks)]
        entries, pos = [], len(header)
        for c in chunks:
            entries.append(dict(offset=pos, length=len(c), crc=struct.unpack("<I", c[-4:])[0], reserved=0))
            pos += len(c)
        if self.entry_edit is not None:
            self.entry_edit(entries)
        index = self.index_magic + struct.pack("<I", len(chunks) if self.index_count is None else self.index_count)
        index += b"".join(struct.pack("<QQII", e["offset"], e["length"], e["crc"], e["reserved"]) for e in entries) + self.index_extra
        f = dict(index_offset=pos, index_length=len(index), major=self.hdr.get("major", 1), minor=self.hdr.get("minor", 0), reserved=0,
                 magic=FOOTER_MAGIC)
        f.update(self.ftr)
        part = struct.pack("<QQIHHI", f["index_offset"], f["index_length"], crc32c(index) if self.index_crc is None else self.index_crc,
                           f["major"], f["minor"], f["reserved"])
        footer = part + struct.pack("<I", f.get("crc", crc32c(part))) + f["magic"]
        return header + b"".join(chunks) + index + footer + self.trailing

    def layout(self) -> dict:
        """Offsets of the parts of the built file (for truncation vectors)."""
        header = self.header()
        out = {"H": len(header), "M": len(self.meta), "chunks": []}
        pos = len(header)
        for i, c in enumerate(self.chunks):
            b = c.build(i)
            dl = len(c.descriptor())
            out["chunks"].append(dict(start=pos, end=pos + len(b), desc=pos + 32, table=pos + 32 + dl, data=pos + 32 + dl + 32 * len(c.secs)))
            pos += len(b)
        out["index"] = pos
        return out


def patch(data: bytes, off: int, new: bytes) -> bytes:
    return data[:off] + new + data[off + len(new) :]


def reseal_footer(data: bytes, index_crc: bool = True) -> bytes:
    f = bytearray(data[-40:])
    if index_crc:
        io_ = struct.unpack("<Q", f[0:8])[0]
        f[16:20] = struct.pack("<I", crc32c(data[io_:-40]))
    f[28:32] = struct.pack("<I", crc32c(bytes(f[:28])))
    return data[:-40] + bytes(f)


def desc_replace(c: Chk, old: bytes, new: bytes) -> None:
    """Replace the unique occurrence of `old` in the descriptor bytes by `new` (same length)."""
    d = c.descriptor()
    assert d.count(old) == 1 and len(old) == len(new), (old, d.count(old))
    c.desc = d.replace(old, new)


# =============================================================================================
# Encoding helpers
# =============================================================================================


def t(rng: np.random.Generator, shape: tuple, dtype: str = "float16", scale: float = 0.05) -> RawTensor:
    return RawTensor.from_f64(rng.normal(0.0, scale, shape), dtype)


def orth(rng: np.random.Generator, n: int) -> np.ndarray:
    q, r = np.linalg.qr(rng.normal(size=(n, n)))
    return q * np.sign(np.diag(r))


def separated(rng: np.random.Generator, rows: int, d: int, lo: float = 1.0, hi: float = 3.0, scale: float = 0.05) -> np.ndarray:
    """A rows x d matrix whose Gram matrix has the linearly spaced spectrum scale^2 * [lo, hi]:
    well-separated eigenvalues, hence eigenvectors well conditioned (SPEC.md section 9)."""
    s = np.sqrt(np.linspace(lo, hi, d))[::-1] * scale
    return (orth(rng, rows)[:, :d] * s) @ orth(rng, d).T


def encode(layout: ChunkLayout, tensors: dict, scheme: str, tol: float, force: bool = False, band: bool = False,  # type: ignore[no-untyped-def]
           bands: bool = False):
    """encode_chunk; with force, a site is not made PLAIN for side information that does not pay.
    band=False (the default) is the 1.1 encoder: the bytes of every vector before 1.2; bands=True
    (with band) the 1.4 encoder, which stores each site's band widths."""
    return encode_chunk(layout, tensors, {}, scheme, tol, band=band, demote=not force, bands=bands)


def site_flags(enc) -> list[int]:  # type: ignore[no-untyped-def]
    return [s.flags for s in enc.program.sites]


class Capture(StoredCorrector):
    """Decoder corrector that records each site's rounded regenerated block (before corrections)."""

    def __init__(self, program, side):  # type: ignore[no-untyped-def]
        super().__init__(program, side)
        self.approx: dict[int, np.ndarray] = {}

    def correct_x(self, site, approx, regenerated=None):  # type: ignore[no-untyped-def]
        self.approx[site] = approx.copy()
        return super().correct_x(site, approx, regenerated)


def approx_of(c: Chk, index: int = 0, required_flags: int = 0) -> dict[int, np.ndarray]:
    ch = parse_chunk(c.build(index), required_flags=required_flags)
    cap = Capture(ch.program, ch.side)
    decode_program(ch.program, ch.payload, cap)
    return cap.approx


def residual_section(approx: np.ndarray, dtype: str, r: np.ndarray | None = None, codec: int = 0,
                     group_edit: Callable[[int, bytes], bytes] | None = None) -> bytes:
    """An x_residuals section (SPEC.md 8.4) for residuals r (default 0) over the block `approx`;
    group_edit(k, varint bytes) may alter the k-th group's decoded bytes."""
    r = np.zeros(approx.size, np.int64) if r is None else r
    ctx = residual_contexts(approx, dtype)
    out = b""
    for k, cval in enumerate(np.unique(ctx)):
        raw = encode_varints(zigzag(r[ctx == cval]))
        if group_edit is not None:
            raw = group_edit(k, raw)
        data = ZSTD.compress(raw) if codec == 1 else raw
        out += encode_varint(len(data)) + bytes([codec]) + data
    return out


def patches(positions: list[int], values: list[int], width: int) -> bytes:
    gaps, prev = [], -1
    for p in positions:
        gaps.append(p - prev - 1)
        prev = p
    fmt = "<H" if width == 16 else "<I"
    return (encode_varint(len(positions)) + encode_varints(np.array(gaps, np.uint64))
            + b"".join(struct.pack(fmt, v) for v in values))


def varint(v: int) -> bytes:
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def program_rec(name: str, symbol_dtype: int, tensors: list[tuple], sites: list[tuple], ops: list[tuple]) -> dict:
    """A descriptor record from plain tuples: tensors (name, dtype code, dims), sites
    (name, dim, anchor, axis, flags[, followers]), ops (kind, index)."""
    return dict(
        name=name, symbol_dtype=symbol_dtype, reserved0=0, reserved1=0,
        tensors=[dict(name=n, dtype=d, ndim=len(dims), reserved=0, dims=list(dims)) for n, d, dims in tensors],
        sites=[dict(name=s[0], dim=s[1], anchor=s[2], anchor_axis=s[3], flags=s[4], reserved=0,
                    followers=[dict(tensor=f, axis=a, reserved=0) for f, a in (s[5] if len(s) > 5 else [])]) for s in sites],
        ops=[dict(kind=k, reserved0=0, reserved1=0, index=i) for k, i in ops],
    )


# =============================================================================================
# Provenance: which decoded values are regenerated (SPEC.md section 9)
# =============================================================================================


def regenerated(program) -> dict[str, int]:  # type: ignore[no-untyped-def]
    """Per tensor name, how many elements are not stored bits: they hold a symbol pushed by a
    non-plain SITE (step 8 of SPEC.md 7.1), or belong to a PAPER anchor (step 9). Simulates the
    decoder's stack with one provenance flag per symbol."""
    w = program.symbol_bits
    stack = np.zeros(program.payload_symbols(), dtype=bool)
    n = stack.size
    counts: dict[str, int] = {}
    paper_anchor: set[int] = set()
    for op in reversed(program.ops):
        if op.kind == OpKind.PUSH:
            te = program.tensors[op.index]
            k = te.symbols(w)
            flags = stack[n - k : n]
            n -= k
            per = max(1, k // max(te.numel, 1)) if te.numel else 1
            el = flags.reshape(te.numel, per).any(axis=1) if te.numel else flags
            counts[te.name] = int(el.sum())
            continue
        s = program.sites[op.index]
        if s.plain:
            continue
        n -= 2 * s.dim
        m = s.n_pop
        if n + m > stack.size:
            stack = np.concatenate([stack, np.zeros(n + m - stack.size, bool)])
        stack[n : n + m] = True
        n += m
        if s.paper:
            paper_anchor.add(s.anchor)
    for a in paper_anchor:
        te = program.tensors[a]
        counts[te.name] = te.numel
    return counts


# =============================================================================================
# Alternative numerics (self-check)
# =============================================================================================


def _ref_lapack():  # type: ignore[no-untyped-def]
    for name in ("/usr/lib/x86_64-linux-gnu/lapack/liblapack.so.3", ctypes.util.find_library("lapack")):
        if name and (name.startswith("lib") or os.path.exists(name)):
            try:
                return ctypes.CDLL(name, mode=os.RTLD_LOCAL | getattr(os, "RTLD_DEEPBIND", 0))
            except OSError:
                continue
    return None


def _dsyevd(lib):  # type: ignore[no-untyped-def]
    c_int, c_char = ctypes.c_int, ctypes.c_char
    fn = lib.dsyevd_

    def eigh(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n = a.shape[0]
        A = np.array(a, dtype=np.float64, order="F", copy=True)
        w = np.zeros(n)
        work, iwork = np.zeros(1), np.zeros(1, np.int32)
        info = c_int(0)
        args = lambda lw, liw: (ctypes.byref(c_char(b"V")), ctypes.byref(c_char(b"U")), ctypes.byref(c_int(n)),  # noqa: E731
                                A.ctypes.data_as(ctypes.c_void_p), ctypes.byref(c_int(n)), w.ctypes.data_as(ctypes.c_void_p),
                                work.ctypes.data_as(ctypes.c_void_p), ctypes.byref(c_int(lw)), iwork.ctypes.data_as(ctypes.c_void_p),
                                ctypes.byref(c_int(liw)), ctypes.byref(info))
        fn(*args(-1, -1))
        lwork, liwork = int(work[0]), int(iwork[0])
        work, iwork = np.zeros(max(1, lwork)), np.zeros(max(1, liwork), np.int32)
        fn(*args(lwork, liwork))
        if info.value != 0:
            raise RuntimeError(f"dsyevd info {info.value}")
        return w, A

    return eigh


def _gram_rows(m: np.ndarray) -> np.ndarray:
    g = np.zeros((m.shape[1], m.shape[1]))
    for r in range(m.shape[0]):
        g += np.outer(m[r], m[r])
    return g


def _gram_ld(m: np.ndarray) -> np.ndarray:
    x = m.astype(np.longdouble)
    return (x.T @ x).astype(np.float64)


def _regen_loop(e: np.ndarray, mu: np.ndarray, paper: bool) -> np.ndarray:
    v = e.T if paper else e
    x = np.zeros((e.shape[0], e.shape[0]))
    for k in range(e.shape[0]):
        x += mu[k] * np.outer(v[:, k], v[:, k])
    return x


def _regen_ld(e: np.ndarray, mu: np.ndarray, paper: bool) -> np.ndarray:
    v = (e.T if paper else e).astype(np.longdouble)
    return ((v * mu.astype(np.longdouble)) @ v.T).astype(np.float64)


def numerics_variants() -> list[tuple[str, Callable, Callable, Callable]]:
    out = []
    lib = _ref_lapack()
    if lib is not None:
        out.append(("reference-LAPACK dsyevd, row-sequential Gram, loop X~", _dsyevd(lib), _gram_rows, _regen_loop))
    try:
        import scipy.linalg as sl

        out.append(("scipy evr (MRRR), long-double Gram and X~", lambda a: sl.eigh(a, driver="evr"), _gram_ld, _regen_ld))
        out.append(("scipy ev (QR), reversed-row Gram", lambda a: sl.eigh(a, driver="ev"), lambda m: m[::-1].T @ m[::-1], rot.regenerate))
    except ImportError:
        pass
    return out


def decode_with(path: Path, variant, calls: dict | None = None) -> dict:  # type: ignore[no-untyped-def]
    """Decode `path` with the reference reader on a numpy backend whose eigensolver, Gram and
    regeneration are the variant's (codec/linalg.py: the reader's backend object). Every
    replacement counts its calls in `calls` (name -> count), so a caller can tell that it took
    effect: a non-plain site must have called all three."""
    from bbformat.codec.linalg import NumpyLinalg

    _, eigh, gram, regen = variant
    calls = {} if calls is None else calls

    def count(name: str) -> None:
        calls[name] = calls.get(name, 0) + 1

    class Variant(NumpyLinalg):  # type: ignore[misc, valid-type]
        def gram(self, m):  # type: ignore[no-untyped-def]
            count("gram")
            out = gram(m)
            if np.all(np.isfinite(out)):
                count("gram_finite")  # the reader must then call the eigensolver
            return out

        def eigh(self, g):  # type: ignore[no-untyped-def]
            count("eigh")
            return self._call_eigh(eigh, g)

        def regenerate(self, e, mu, paper):  # type: ignore[no-untyped-def]
            count("regenerate")
            return regen(e, mu, paper)

    return impl_python.decode_path(path, device=Variant())


# =============================================================================================
# The suite
# =============================================================================================

CODES = {
    # code: (meaning, SPEC sections, section 11.2 item or None)
    "E_MAGIC": ("a magic number is wrong: the file's leading magic (or a file shorter than 8 bytes), a chunk's, the index's (or an index shorter than 8 bytes); the footer's when reading forward", "§4, §5, §10.1, §10.3", 1),
    "E_TRUNCATED": ("the file ends early: shorter than 84 bytes, no footer magic at the end of a seekable file (random access), a read past the end, a stream ending early", "§10.2, §10.3", 2),
    "E_VERSION": ("major version not 1 (header or footer), or header and footer versions differ", "§4, §10.2", 3),
    "E_REQUIRED_FLAG": ("a required_flags bit is set that the reader does not know (1.1 defines bit 0, PLANES; 1.2 bits 1, DIGESTS, and 2, MIXED_CORRECTIONS; 1.3 bit 3, EXPONENT; 1.4 bit 4, BANDS; 1.5 bit 5, PARTS; 1.6 bit 6, DTYPES; a 1.1 reader rejects a 1.2 file with either), or BANDS without DIGESTS", "§4", 4),
    "E_RESERVED": ("a reserved field or bit is not zero, including chunk offset 4 in a file without DIGESTS, site flag bits 2-7 and sign bitmap padding", "§1, §4, §5, §5.1, §5.3, §8.3, §10", 5),
    "E_SCHEME": ("header scheme byte not 1 (paper), 2 (symmetric) or 3 (none: no sites, since 1.2; a 1.1 reader rejects 3); scheme 3 without DIGESTS (1.5)", "§4", 6),
    "E_CODEC": ("metadata, section, residual-group or planes-group codec not 0 (raw) or 1 (zstd); section codec 2 (planes) except on the payload of a file with PLANES; a band section not raw (1.4); codec 4 (parts) except on the payload of a file with PARTS, or a part's codec not allowed (1.5)", "§4, §5.3, §8.2, §8.4, §8.6, §8.9", 7),
    "E_ZSTD": ("a zstd field that is not exactly one valid zstd frame (unparseable header, damaged data, several or skippable frames, bytes after the frame)", "§4.1, §8.2, §8.4", 8),
    "E_METADATA": ("metadata not UTF-8, not JSON, or not a JSON object", "§4.1", 9),
    "E_CRC_HEADER": ("header_crc mismatch", "§3, §4", 10),
    "E_CRC_CHUNK": ("chunk_crc mismatch", "§3, §5", 11),
    "E_CRC_INDEX_ENTRY": ("an index entry's crc differs from its chunk's chunk_crc", "§3, §10.1", 12),
    "E_CRC_INDEX": ("index_crc mismatch (random access)", "§3, §10.2", 13),
    "E_CRC_FOOTER": ("footer_crc mismatch", "§3, §10.2", 14),
    "E_BOUNDS": ("an offset or length out of bounds, not contiguous, overlapping or overflowing (header, index, index entries, chunk_length, descriptor/table, sections)", "§1, §2, §5, §5.3, §10", 15),
    "E_INDEX": ("index chunk_count or index_length disagrees with the header; streaming: index bytes or footer fields disagree with the chunks read", "§10.1, §10.3", 16),
    "E_CHUNK_ORDER": ("a chunk's chunk_index differs from its position", "§5, §10.1", 17),
    "E_DESCRIPTOR": ("the descriptor does not parse to exactly Ld bytes (incl. invalid UTF-8), duplicate tensor name, unknown op kind, op index out of range, a tensor not pushed exactly once, a site not used exactly once; MAY: a tensor name in two chunks", "§1, §5.1, §5.2, §11.4", 18),
    "E_DTYPE": ("unknown symbol or tensor dtype code, or a tensor narrower than the symbols", "§5.1, §6.1", 19),
    "E_SITE": ("a site's anchor does not exist or does not fit (axis, dims[axis] = D, D >= 2), or its PUSH precedes the SITE", "§5.1, §5.2", 20),
    "E_SECTION_KIND": ("unknown section kind (6, band, in a file without BANDS), payload naming a site, a section naming a non-existent site, a kind not allowed for its site", "§5.3, §8.1", 21),
    "E_SECTION_DUPLICATE": ("two sections of one (kind, site), x_residuals and x_patches on one site in a file without MIXED_CORRECTIONS, two payloads", "§8.1", 22),
    "E_SECTION_MISSING": ("no payload section, a non-plain PAPER site without signs, or (1.4, BANDS) a non-plain site without a band section", "§8.1", 23),
    "E_SECTION_SIZE": ("a section's stored/declared/decoded sizes disagree (raw stored != decoded, zstd content size absent or != decoded_length, signs != ceil(D/8), band not 8 or 24 bytes), decompressed metadata size != declared, a planes group not of its size, a raw or zstd part not of p_k·W/8 bytes (1.5)", "§4.1, §8.2, §8.6, §8.9", 24),
    "E_SECTION_CONTENT": ("malformed correction content: varints (unterminated, > 10 bytes, >= 2^64, wrong number, left-over bytes), residual groups running past or left over, ordinal out of range, patch count/values/gaps/positions; a malformed planes payload (segments, classes, groups); a band width not finite or not > 0 (1.4); a malformed parts payload (part count, records, cover, bytes) (1.5)", "§8.4, §8.5, §8.6, §8.8, §8.9", 25),
    "E_SYMBOL_COUNT": ("payload decoded_length != P*W/8, a pop underflows, symbols left on the stack", "§6.3, §7.1", 26),
    "E_LIMIT_COUNT": ("more chunks, tensors, sites or sections than allowed, a descriptor longer than 16 MiB, more than 65,536 planes segments, more than 65,536 parts or 1,024 tables in the codec-3 parts of one payload (1.5)", "§4, §5, §5.1, §8.6, §8.9, §11.1", 27),
    "E_LIMIT_METADATA": ("metadata over 64 MiB, stored or (zstd) declared", "§4, §4.1, §11.1", 27),
    "E_LIMIT_NDIM": ("a tensor with more than 8 dimensions", "§5.1, §11.1", 27),
    "E_LIMIT_TENSOR": ("a tensor with more than 2^40 elements (product of dims, computed without overflow)", "§5.1, §11.1", 27),
    "E_LIMIT_DIM": ("a site dimension D over 32,768", "§5.1, §11.1", 27),
    "E_LIMIT_SECTION": ("a section or residual group declaring more decoded bytes than its kind allows (decompression bombs)", "§8.2, §8.4, §11.1", 27),
    "E_LIMIT_MEMORY": ("(a reader's own limit, MAY) a chunk whose declared working set exceeds the reader's memory budget", "§11.4, §11.5", None),
    "E_TRAILING": ("bytes after the footer when reading forward from a stream", "§2, §10.3", 28),
    "E_DIGEST": ("(1.2, DIGESTS) a chunk's decoded tensors' CRC32C differs from its content_crc: the reader did not decode what the encoder's own decoding produced (the one outcome that depends on the reader's arithmetic; a reader within the band of SPEC.md §9 never meets it on a file a conforming writer wrote); also an x_residuals section that does not fit the contexts of the reader's own regenerated values, at a site with a residual position (1.5)", "§5.4, §7.1, §8.4, §9", 29),
    # not about container validity (bbformat/errors.py)
    "E_INPUT": ("bad input to the tools: paths, options, checkpoint files", "§11.2 (closing note)", None),
    "E_EXISTS": ("an output exists and was not named for replacement (pack/unpack/demo --force, overwrite=True); nothing is written", "§11.2 (closing note)", None),
    "E_UNSUPPORTED_MODEL": ("an architecture, dtype or state dict the encoder refuses", "§11.2 (closing note)", None),
    "E_VERIFY": ("pack --verify found the decoded container differs from the encoder's intent", "§11.2 (closing note)", None),
    "E_OUTPUT": ("the output cannot be written (permissions, I/O error); nothing partial is left", "§11.2 (closing note)", None),
    "E_NO_SPACE": ("the output's file system is full or a file-size limit was hit; nothing partial is left", "§11.2 (closing note)", None),
    "E_DEVICE": ("the device chosen for the linear algebra (--device) is missing, cannot run float64 linear algebra, or ran out of memory; nothing is written", "§11.2 (closing note)", None),
    "E_WRITER_STATE": ("Writer calls out of order (e.g. close() before every declared chunk)", "§11.2 (closing note)", None),
    "E_FORMAT": ("class default of FormatError (never raised without a specific code)", "—", None),
    "E_CRC": ("class default of IntegrityError (never raised without a specific code)", "—", None),
    "E_LIMIT": ("class default of LimitError (never raised without a specific code)", "—", None),
    "E_BBFORMAT": ("class default of BBFormatError (never raised without a specific code)", "—", None),
}
CLASS_OF = {"E_EXISTS": bberr.OutputExistsError, "E_DIGEST": bberr.DigestError, "E_OUTPUT": bberr.OutputError, "E_NO_SPACE": bberr.NoSpaceError, "E_DEVICE": bberr.DeviceError, "E_INPUT": bberr.InputError, "E_UNSUPPORTED_MODEL": bberr.UnsupportedModelError, "E_VERIFY": bberr.VerifyError,
            "E_FORMAT": bberr.FormatError, "E_CRC": bberr.IntegrityError, "E_LIMIT": bberr.LimitError, "E_BBFORMAT": bberr.BBFormatError}


def class_of(code: str) -> type:
    if code in CLASS_OF:
        return CLASS_OF[code]
    if code == "E_WRITER_STATE":
        from bbformat.writer import WriterStateError

        return WriterStateError
    if code.startswith("E_CRC_"):
        return bberr.IntegrityError
    if code.startswith("E_LIMIT_"):
        return bberr.LimitError
    return bberr.FormatError


@dataclass
class Vec:
    id: str
    category: str
    data: bytes
    section: str
    description: str
    expected: str
    code: str | None = None
    also: tuple[str, ...] = ()
    rules: tuple[int, ...] = ()
    tol: float | None = None
    may_reject: bool = False
    eig: bool = True  # bytes depend on the eigensolver (a non-plain site was encoded)
    note: str | None = None
    tensors: dict | None = None  # optional vectors the reference rejects: what an accepting reader returns
    accept_as: bytes | None = None  # ... or a container that decodes to it
    since: str = "1.0"  # the SPEC version whose rules give this vector its expected outcome


class Suite:
    def __init__(self, out: Path, check: bool) -> None:
        self.out = out
        self.check = check
        self.vecs: list[Vec] = []
        self.variants = numerics_variants() if check else []
        self.diffs: list[float] = []  # |alternative - reference| in ulps, for every value that differs
        self.calls: dict[str, int] = {}  # variant -> eigensolver calls made through it (proof the self-check ran)

    def _add(self, v: Vec) -> None:
        assert not any(x.id == v.id for x in self.vecs), v.id
        self.vecs.append(v)

    def valid(self, vid: str, data: bytes, section: str, description: str, tol: float | None = None, eig: bool = True,
              since: str = "1.0") -> None:
        self._add(Vec(vid, "valid", data, section, description, "accept", tol=tol, eig=eig, since=since))

    def invalid(self, vid: str, data: bytes, section: str, description: str, code: str, rules: tuple[int, ...] | int,
                also: tuple[str, ...] = (), eig: bool = True, note: str | None = None, since: str = "1.0") -> None:
        assert vid.startswith("x_"), vid
        rules = (rules,) if isinstance(rules, int) else rules
        self._add(Vec(vid, "invalid", data, section, description, "reject", code, tuple(also), rules, eig=eig, note=note, since=since))

    def optional(self, vid: str, data: bytes, section: str, description: str, expected: str, code: str, tol: float | None = None,
                 eig: bool = True, note: str | None = None, tensors: dict | None = None, accept_as: bytes | None = None) -> None:
        """A vector a reader MAY reject (SPEC.md 11.4): `expected` is the reference's outcome, `code`
        the code of a rejecting reader; for a reference reject, `tensors` is what an accepting
        reader must return."""
        assert vid.startswith("o_"), vid
        self._add(Vec(vid, "optional", data, section, description, expected, code, tol=tol, may_reject=True, eig=eig, note=note,
                      tensors=tensors, accept_as=accept_as))

    # ---- writing -----------------------------------------------------------------------------

    def _stream_code(self, data: bytes) -> str:
        try:
            for _ in iter_stream(io.BytesIO(data)):
                pass
        except bberr.BBFormatError as exc:
            return exc.code
        return "accept"

    def finish(self) -> dict:
        out = self.out
        for sub in ("valid", "invalid", "optional", "expected"):
            shutil.rmtree(out / sub, ignore_errors=True)
            (out / sub).mkdir(parents=True)
        entries = []
        classes: dict[str, set[str]] = {}
        problems: list[str] = []
        for v in self.vecs:
            rel = f"{v.category}/{v.id}.bb"
            path = out / rel
            path.write_bytes(v.data)
            res = impl_python.decode_path(path)
            e: dict = {"id": v.id, "path": rel, "spec_version": v.since, "spec_section": v.section, "description": v.description,
                       "expected": v.expected, "category": v.category, "size": len(v.data), "eigensolver_dependent": v.eig}
            if v.note:
                e["note"] = v.note
            stream = self._stream_code(v.data)
            if v.expected == "reject":
                if res["result"] != "reject" or res["code"] != v.code:
                    problems.append(f"{v.id}: reference gives {res.get('code', 'accept')}, manifest says {v.code}: {res.get('message', '')}")
                    continue
                classes.setdefault(v.code, set()).add(res["class"])
                also = list(v.also)
                if stream not in (v.code, "accept") and stream not in also and v.category == "invalid":
                    also.append(stream)
                e["code"] = v.code
                if also:
                    e["also_allowed"] = sorted(set(also))
                if v.rules:
                    e["rules"] = list(v.rules)
                if v.tensors is not None:
                    e["tensors"] = v.tensors
                if v.accept_as is not None:
                    alt = out / "accept_as.tmp.bb"
                    alt.write_bytes(v.accept_as)
                    e["tensors"] = self._tensors(v, alt, impl_python.decode_path(alt))
                    alt.unlink()
                e["stream_code"] = stream
            else:
                if res["result"] != "accept":
                    problems.append(f"{v.id}: reference rejects with {res['code']}: {res['message']}")
                    continue
                e["tensors"] = self._tensors(v, path, res)
                if v.code:
                    e["code"] = v.code
                e["stream_code"] = stream
                if stream != "accept" and v.category == "valid":
                    problems.append(f"{v.id}: the reference stream reader rejects it with {stream}")
            if v.may_reject:
                e["may_reject"] = True
            if self.check:
                problems += self._self_check(v, path, e)
            entries.append(e)
        if problems:
            raise GenError("\n".join(problems))
        manifest = {"spec_version": SPEC_VERSION, "generator": generator_info(), "expected_layout": EXPECTED_LAYOUT, "vectors": entries}
        (out / "manifest.json").write_text(json.dumps(manifest, sort_keys=True, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        (out / "ERRORS.md").write_text(errors_md(entries, classes), encoding="utf-8")
        return manifest

    def _tensors(self, v: Vec, path: Path, res: dict) -> dict:
        regen: dict[str, int] = {}
        with Reader(path) as r:
            for i in range(len(r)):
                regen.update(regenerated(r.read_chunk(i).program))
            meta_tol = r.metadata.get("tolerance")
            digests = r.has_digests
        tau = v.tol if v.tol is not None else (float(meta_tol) if isinstance(meta_tol, (int, float)) and np.isfinite(meta_tol) and meta_tol >= 0 else 0.0)
        out = {}
        for k, name in enumerate(sorted(res["tensors"])):
            got = res["tensors"][name]
            entry = {"dtype": got["dtype"], "shape": got["shape"], "sha256": got["sha256"], "regenerated": regen.get(name, 0), "tolerance": None}
            if regen.get(name, 0) and not digests:  # with DIGESTS every value is bit-exact (SPEC.md 5.4): tolerance null
                rel = f"expected/{v.id}/{k}.bin"
                (self.out / rel).parent.mkdir(parents=True, exist_ok=True)
                (self.out / rel).write_bytes(got["bytes"])
                entry["tolerance"] = {"abs": tau, "ulp": 2}
                entry["file"] = rel
            out[name] = entry
        return out

    def _self_check(self, v: Vec, path: Path, e: dict) -> list[str]:
        problems = []
        regen = sum(t.get("regenerated", 0) for t in (e.get("tensors") or {}).values()) if e["expected"] == "accept" else 0
        for var in self.variants:
            calls: dict[str, int] = {}
            res = decode_with(path, var, calls)
            self.calls[var[0]] = self.calls.get(var[0], 0) + calls.get("eigh", 0)
            # the variant really decoded: every finite Gram matrix went to its eigensolver, and a
            # vector with regenerated values used its Gram and regeneration
            if calls.get("eigh", 0) != calls.get("gram_finite", 0) or (regen and not (calls.get("gram") and calls.get("regenerate"))):
                problems.append(f"{v.id}: with {var[0]}: the patched numerics did not take effect: {calls}")
            if e["expected"] == "reject":
                if res["result"] != "reject" or res["code"] not in [e["code"], *e.get("also_allowed", [])]:
                    problems.append(f"{v.id}: with {var[0]}: {res.get('code', 'accept')} instead of {e['code']}")
                continue
            if res["result"] != "accept":
                problems.append(f"{v.id}: with {var[0]}: rejected with {res['code']}: {res['message']}")
                continue
            for name, want in e["tensors"].items():
                got = res["tensors"].get(name)
                if got is None:
                    problems.append(f"{v.id}: with {var[0]}: tensor {name!r} missing")
                elif got["sha256"] != want["sha256"]:
                    if want["tolerance"] is None:
                        problems.append(f"{v.id}: with {var[0]}: tensor {name!r} differs; it must be bit-exact (stored values, or a file with digests)")
                    else:
                        ref = (self.out / want["file"]).read_bytes()
                        why = runner.within(ref, got["bytes"], want["dtype"], want["tolerance"])
                        if why:
                            problems.append(f"{v.id}: with {var[0]}: tensor {name!r}: {why}")
                        a, b = runner.values(ref, want["dtype"]), runner.values(got["bytes"], want["dtype"])
                        for r, g in zip(a, b):
                            if r != g and r == r:
                                self.diffs.append(abs(g - r) / runner.ulp(r, want["dtype"]))
        return problems


EXPECTED_LAYOUT = ("expected/<id>/<k>.bin: the reference reader's decoded tensor, raw little-endian element bytes in C order "
                   "(float16/bfloat16: 2 bytes, float32: 4 bytes per element), for every tensor whose tolerance is not null; "
                   "k is the tensor's position in the sorted list of the vector's tensor names; the tensor entry's \"file\" "
                   "names it (relative to conformance/).")


def blas_kernel() -> str:
    """The kernel OpenBLAS picked for this CPU (threadpoolctl's `architecture`, e.g. Haswell or
    SkylakeX; OPENBLAS_CORETYPE overrides it): eigensolver-dependent bytes follow it."""
    from threadpoolctl import threadpool_info

    kinds = sorted({str(i.get("architecture")) for i in threadpool_info() if i.get("user_api") == "blas"})
    return ",".join(kinds) or "unknown"


def generator_info() -> dict:
    cfg = np.show_config(mode="dicts")["Build Dependencies"]
    return {
        "script": "conformance/generate.py",
        "bbformat": bbformat.__version__,
        "numpy": np.__version__,
        "blas": f"{cfg['blas'].get('name')} {cfg['blas'].get('version')}",
        "lapack": f"{cfg['lapack'].get('name')} {cfg['lapack'].get('version')}",
        "zstandard": zstandard.__version__,
        "libzstd": ".".join(str(x) for x in zstandard.ZSTD_VERSION),
        "machine": platform.machine(),
        "blas_kernel": blas_kernel(),
        "python": platform.python_version(),
        "torch": __import__("torch").__version__,
    }


def errors_md(entries: list[dict], classes: dict[str, set[str]]) -> str:
    by_code: dict[str, list[str]] = {}
    also: dict[str, list[str]] = {}
    for e in entries:
        if e.get("code") and e["expected"] == "reject":
            by_code.setdefault(e["code"], []).append(e["id"])
        elif e.get("code"):
            also.setdefault(e["code"], []).append(e["id"])
        for c in e.get("also_allowed", []):
            also.setdefault(c, []).append(e["id"])
    lines = [
        "# Error codes",
        "",
        "Generated by `conformance/generate.py` from `manifest.json`; do not edit. Every `E_` code of SPEC.md",
        "(and of `bbformat/errors.py`): what it means, where SPEC.md defines it, its item of §11.2 (the",
        "MUST-reject list), the exception class the Python reference raises, the `bbformat` CLI exit status",
        "(README's exit-code table), and the conformance vectors that exercise it. \"Expected\" vectors",
        "report the code in the reference reader (random access); \"also allowed\" vectors list it in",
        "`also_allowed` (a forward/streaming reader's code, or another rule the vector necessarily breaks)",
        "or, for optional vectors, as the code a rejecting reader gives.",
        "",
        "The conformance decoder protocol itself exits 0 (accept) or 1 (reject) whatever the code, E_DIGEST included (its",
        "CLI exit status 9 belongs to the `bbformat` tool, not to the protocol).",
        "",
        "| code | meaning | SPEC | §11.2 item | Python class | CLI exit | vectors (expected) | vectors (also allowed / optional) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for code, (meaning, sec, item) in CODES.items():
        cls = class_of(code)
        seen = classes.get(code)
        if seen and seen != {cls.__name__}:
            raise GenError(f"{code}: raised as {seen}, documented as {cls.__name__}")
        vs = ", ".join(f"`{i}`" for i in by_code.get(code, [])) or "—"
        al = ", ".join(f"`{i}`" for i in also.get(code, [])) or "—"
        lines.append(f"| `{code}` | {meaning} | {sec} | {item if item is not None else '—'} | `{cls.__name__}` | {cls.exit_status} | {vs} | {al} |")
    return "\n".join(lines) + "\n"


# =============================================================================================
# Vectors (definitions follow main's helpers; see add_all at the end)
# =============================================================================================


def mod(bb: BB, **changes: object) -> BB:
    x = bb.copy()
    for k, v in changes.items():
        setattr(x, k, v)
    return x


def meta(scheme: str, tol: float, **extra: object) -> bytes:
    return meta_bytes({"format": "bbformat", "format_version": "1.0", "scheme": scheme, "tolerance": tol, **extra})


def single(enc, scheme: str, tol: float) -> BB:  # type: ignore[no-untyped-def]
    return BB([chk_from(enc)], scheme=1 if scheme == "paper" else 2, meta=meta(scheme, tol))


def kinds(c: Chk) -> list[int]:
    return [s.kind for s in c.secs]


def nonplain(enc) -> bool:  # type: ignore[no-untyped-def]
    return all(not s.plain for s in enc.program.sites)


def site_chunk(seed: int, scheme: str, tol: float, dtype: str = "float16", D: int = 16, rows: int = 20, src_rows: int = 12,
               force: bool = False, follower: bool = True, name: str = "block0", bands: bool = False):  # type: ignore[no-untyped-def]
    """One chunk: src (pushed first; the site's bits come from its last n(D) values), the anchor
    (D, rows) on axis 0 with a well-separated Gram spectrum, and a follower (3, D) on axis 1.
    bands: the 1.4 encoder's (band sections), else the 1.1 encoder's."""
    rng = np.random.default_rng(seed)
    ts = {"src": t(rng, (src_rows, D), dtype), "anchor": RawTensor.from_f64(separated(rng, rows, D).T, dtype)}
    fol: tuple = ()
    if follower:
        ts["follower"] = t(rng, (3, D), dtype)
        fol = (AxisRef("follower", 1),)
    lay = ChunkLayout(name, tuple(ts), (SiteSpec("site0", D, AxisRef("anchor", 0), fol),))
    return encode(lay, ts, scheme, tol, force, band=bands, bands=bands)


def f32_chunk(seed: int, name: str = "block1") -> Chk:
    rng = np.random.default_rng(seed)
    enc = encode_chunk(ChunkLayout(name, ("bias",)), {"bias": t(rng, (3, 4), "float32", 1.0)}, {}, "symmetric", 0.0, band=False)
    return chk_from(enc)


def assert_intended(data: bytes, encs: list) -> None:  # type: ignore[type-arg]
    """The reference decodes what the encoder intended (tau = 0) - a sanity check of the bases."""
    with Reader(io.BytesIO(data)) as r:
        for i, enc in enumerate(encs):
            if enc is None:
                continue
            got = r.decode_block(i).tensors
            for n, want in enc.intended.items():
                assert got[n].equal(want), (i, n)


def base_bf16_sym() -> BB:
    """One bfloat16 chunk with a non-plain symmetric site (the first seed from 401 giving one)."""
    for seed in range(401, 500):
        enc = site_chunk(seed, "symmetric", 0.0, dtype="bfloat16")
        if nonplain(enc):
            return BB([chk_from(enc)], scheme=2, meta=meta("symmetric", 0.0))
    raise GenError("no bfloat16 seed with a non-plain site")


def base_sym() -> BB:
    """Two chunks: a float16 chunk with a non-plain symmetric site (D = 16) whose corrections are
    an x_residuals section, and a float32 chunk without sites. The base of most invalid vectors."""
    for seed in range(101, 200):
        enc = site_chunk(seed, "symmetric", 0.0)
        if nonplain(enc) and SectionKind.X_RESIDUALS in [s.kind for s in enc.sections]:
            break
    else:
        raise GenError("no seed gives an x_residuals site")
    bb = BB([chk_from(enc), f32_chunk(7)], scheme=2, meta=meta("symmetric", 0.0))
    assert_intended(bb.build(), [enc])
    return bb


def base_paper() -> BB:
    """One paper chunk (D = 12: sign padding bits 12-15) with signs, x_patches and anchor_patches
    (count-0 sections where the encoder needed none), then a float32 chunk."""
    enc = site_chunk(202, "paper", 0.005, D=12, rows=16, src_rows=10, force=True, follower=False)
    c = chk_from(enc)
    assert c.secs[0].kind == SectionKind.PAYLOAD and c.secs[1].kind == SectionKind.SIGNS, kinds(c)
    if SectionKind.X_PATCHES not in kinds(c):
        c.secs.insert(2, raw_sec(SectionKind.X_PATCHES, 0, b"\x00"))
    if SectionKind.ANCHOR_PATCHES not in kinds(c):
        c.secs.append(raw_sec(SectionKind.ANCHOR_PATCHES, 0, b"\x00"))
    return BB([c, f32_chunk(8)], scheme=1, meta=meta("paper", 0.005))


def base_plain() -> BB:
    """A symmetric chunk whose site is PLAIN (too few symbols below it)."""
    rng = np.random.default_rng(303)
    ts = {"a": t(rng, (3,)), "w": t(rng, (4, 5))}
    enc = encode_chunk(ChunkLayout("plain", ("a", "w"), (SiteSpec("s", 4, AxisRef("w", 0)),)), ts, {}, "symmetric", 0.0, band=False)
    assert enc.program.sites[0].plain
    return BB([chk_from(enc)], scheme=2, meta=meta("symmetric", 0.0))


def no_correction_chunk(scheme: str, D: int, tol: float) -> "tuple[Chk, object]":
    """A deterministic search for a seed whose site needs no correction section (src (D, D),
    anchor (D, D + 2) normal; about one seed in a hundred for D = 4 at tolerance 0)."""
    for seed in range(1000, 5000):
        rng = np.random.default_rng(seed)
        ts = {"src": t(rng, (D, D)), "anchor": t(rng, (D, D + 2))}
        lay = ChunkLayout("nocorr", ("src", "anchor"), (SiteSpec("site0", D, AxisRef("anchor", 0)),))
        enc = encode(lay, ts, scheme, tol, force=True)
        if [s.kind for s in enc.sections] == ([SectionKind.PAYLOAD, SectionKind.SIGNS] if scheme == "paper" else [SectionKind.PAYLOAD]):
            return chk_from(enc), enc
    raise GenError(f"no seed without corrections for {scheme} D={D}")


def tiny_checkpoint(arch: str, seed: int, dtype: str = "float16", layers: int = 3):  # type: ignore[no-untyped-def]
    """The tiny checkpoint (bbformat.testing.make_tiny_checkpoint) that tiny_model packs."""
    from bbformat.testing import make_tiny_checkpoint

    return make_tiny_checkpoint(arch, seed=seed, layers=layers, hidden=32, heads=4, kv_heads=2, vocab=32, max_positions=16, dtype=dtype)


def tiny_model(arch: str, scheme: str, seed: int, tol: float | None, dtype: str = "float16", layers: int = 3,
               format_version: str = "1.1", entropy: str | None = "none"):  # type: ignore[no-untyped-def]
    """bbformat.api.pack of a tiny checkpoint: (the file's bytes, pack's report). format_version
    "1.1" (the default here) is what every vector before 1.2 was written with; entropy None is
    what pack defaulted to when those vectors were written: "auto" for scheme "none", else
    "none" (since 2026-11-28 pack's default is "auto" for every scheme)."""
    from bbformat.checkpoint import write_checkpoint
    from bbformat.api import pack

    if entropy is None:
        entropy = "auto" if scheme == "none" else "none"

    ck = tiny_checkpoint(arch, seed, dtype, layers)
    with tempfile.TemporaryDirectory() as d:
        write_checkpoint(ck, Path(d) / "m")
        rep = pack(Path(d) / "m", Path(d) / "m.bb", scheme=scheme, tolerance=tol, verify=True, format_version=format_version, entropy=entropy)
        return (Path(d) / "m.bb").read_bytes(), rep


def largest_d() -> tuple[int, bytes]:
    """The largest D (symmetric, float16, tolerance 0) whose container stays under 1 MiB: the
    anchor is D x D (a Gram of full rank needs at least D rows; fewer would make eigenvectors
    arbitrary) and the source exactly n(D) values, all regenerated. The payload then holds
    D*D + 2*D float16-sized symbols and the residual corrections about D*D/4 bytes, so
    D is about sqrt(1 MiB / 2.25) = 682; the exact D is found by trying downwards."""
    for D in range(686, 600, -1):
        rng = np.random.default_rng(4242)
        ts = {"src": t(rng, (D * (D + 1) // 2,)), "anchor": RawTensor.from_f64(separated(rng, D, D).T, "float16")}
        lay = ChunkLayout("large", ("src", "anchor"), (SiteSpec("site_large", D, AxisRef("anchor", 0)),))
        enc = encode_chunk(lay, ts, {}, "symmetric", 0.0, band=False)
        data = single(enc, "symmetric", 0.0).build()
        if len(data) < 1 << 20 and nonplain(enc):
            return D, data
    raise GenError("no D fits")


def edge_chunks() -> tuple[Chk, Chk]:
    """Scalars, zero-size and 8-dimensional tensors, stored infinities, NaNs, signed zeros and
    subnormals (one chunk); a chunk with no tensors, an empty name and an empty payload."""
    rng = np.random.default_rng(616)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 6e-8, -6e-8, 65504.0, 1e-5, -2.0], dtype=np.float16)
    rec = program_rec("edges", 1, [("scalar16", 1, []), ("scalar32", 3, []), ("empty", 1, [0]), ("empty3d", 1, [2, 0, 3]),
                                   ("empty32", 3, [0]), ("rank8", 1, [1, 2, 1, 2, 1, 2, 1, 3]), ("special", 1, [10]),
                                   ("special_bf16", 2, [4]), ("nan_f32", 3, [2])],
                      [], [(OpKind.PUSH, i) for i in range(9)])
    payload = (np.array([0.5], np.float16).tobytes() + np.array([-1.25], "<f4").tobytes() + t(rng, (24,)).tobytes() + special.tobytes()
               + struct.pack("<4H", 0x7F80, 0xFF80, 0x7FC1, 0x0001) + struct.pack("<2I", 0x7FA00001, 0xFFC00000))
    edges = Chk(rec, [raw_sec(SectionKind.PAYLOAD, NO_SITE, payload)])
    empty = Chk(program_rec("", 1, [], [], []), [raw_sec(SectionKind.PAYLOAD, NO_SITE, b"")])
    return edges, empty


def add_valid(S: Suite) -> None:
    bs = base_sym()
    S.valid("sym_f16_exact", bs.build(), "§7.1, §8.4",
            "symmetric scheme, tolerance 0, float16: a non-plain site (D=16) with a follower, x_residuals corrections; second chunk float32 without sites")
    enc = site_chunk(111, "symmetric", 0.01)
    S.valid("sym_f16_tol", single(enc, "symmetric", 0.01).build(), "§7.1, §9", "symmetric scheme, tolerance 0.01, float16 (D=16)")
    enc = site_chunk(121, "paper", 0.0, D=16, rows=24, force=True, follower=False)
    S.valid("paper_f16_exact", single(enc, "paper", 0.0).build(), "§7.1, §7.3, §8.3, §8.5",
            "paper scheme, tolerance 0, float16 (D=16): signs, x_patches and anchor_patches")
    paper_exact_chunk = chk_from(enc)
    enc = site_chunk(131, "paper", 0.005, D=16, rows=24, follower=False)
    S.valid("paper_f16_tol", single(enc, "paper", 0.005).build(), "§7.1, §7.3, §9", "paper scheme, tolerance 0.005, float16 (D=16)")
    for vid, scheme, tol, dtype, seed in (("sym_bf16_exact", "symmetric", 0.0, "bfloat16", 141), ("paper_bf16_tol", "paper", 0.01, "bfloat16", 151),
                                          ("sym_f32_tol", "symmetric", 1e-6, "float32", 161), ("paper_f32_exact", "paper", 0.0, "float32", 171),
                                          ("sym_bf16_tol", "symmetric", 0.02, "bfloat16", 181), ("sym_f32_exact", "symmetric", 0.0, "float32", 191)):
        enc = site_chunk(seed, scheme, tol, dtype=dtype, D=12, rows=16, src_rows=8, force=True, follower=scheme == "symmetric")
        S.valid(vid, single(enc, scheme, tol).build(), "§6, §7.2, §7.4",
                f"{scheme} scheme, tolerance {tol}, {dtype} (W = {16 if dtype != 'float32' else 32}; eigenvalues as float{32 if dtype != 'float32' else 64})")

    for vid, arch, scheme, seed, tol, dtype in (("model_opt_sym", "opt", "symmetric", 1, 0.0, "float16"),
                                               ("model_opt_paper", "opt", "paper", 2, None, "float16"),
                                               ("model_llama_sym", "llama", "symmetric", 3, 0.0, "float16"),
                                               ("model_llama_paper", "llama", "paper", 4, None, "float16"),
                                               ("model_llama_sym_bf16", "llama", "symmetric", 5, 0.0, "bfloat16")):
        extra = "biases, " if arch == "opt" else "GQA (4 heads, 2 key/value heads), "
        S.valid(vid, tiny_model(arch, scheme, seed, tol, dtype)[0], "§12.1",
                f"bbformat.api.pack of a tiny sliced {arch.upper() if arch == 'opt' else 'Llama'} model ({extra}3 layers, per-layer widths differ), "
                f"{scheme} scheme, tolerance {'default' if tol is None else tol}, {dtype}: 5 chunks")

    S.valid("plain_few_symbols", base_plain().build(), "§5.1, §12.3", "a site stored PLAIN (fewer than n(D) symbols below it): no sections, SITE does nothing", eig=False)
    rng = np.random.default_rng(313)
    ts = {"src": t(rng, (6, 4)), "w": t(rng, (4, 6))}
    enc = encode_chunk(ChunkLayout("plain2", ("src", "w"), (SiteSpec("s", 4, AxisRef("w", 0)),)), ts, {}, "symmetric", 0.0, band=False)
    assert enc.program.sites[0].plain and enc.reports[0].plain_reason.startswith("side information"), enc.reports
    S.valid("plain_side_info", single(enc, "symmetric", 0.0).build(), "§12.3", "a site stored PLAIN by fallback: its corrections would cost more than the bits saved")
    enc = encode_chunk(ChunkLayout("plain3", ("src", "w"), (SiteSpec("s", 4, AxisRef("w", 0)),)), ts, {}, "paper", 0.0, band=False)
    assert site_flags(enc) == [SiteFlag.PLAIN | SiteFlag.PAPER], site_flags(enc)
    S.valid("plain_paper_flags", single(enc, "paper", 0.0).build(), "§5.1", "a site with both PLAIN and PAPER flags (paper scheme fallback): no sections, no sign bitmap")

    c, enc = no_correction_chunk("symmetric", 4, 0.0)
    S.valid("sym_no_corrections", BB([c], meta=meta("symmetric", 0.0)).build(), "§8.1", "a non-plain symmetric site with no correction section at all (D=4, tolerance 0)")
    c2 = c.copy()
    c2.secs.append(raw_sec(SectionKind.X_PATCHES, 0, b"\x00"))
    S.valid("sym_empty_x_patches", BB([c2], meta=meta("symmetric", 0.0)).build(), "§8.5", "an x_patches section with count 0 (1 byte)")
    c3 = c.copy()
    c3.secs.append(raw_sec(SectionKind.X_RESIDUALS, 0, residual_section(approx_of(c)[0], "float16")))
    S.valid("sym_zero_residuals", BB([c3], meta=meta("symmetric", 0.0)).build(), "§8.4", "an x_residuals section whose residuals are all 0 (one group per exponent context)")
    cm = c.copy()
    mu_at = 4 * 4 - 10  # src has 16 symbols, the block took the last n(4) = 10, mu (4 float32) follows
    pay = bytearray(cm.secs[0].stored)
    mu = np.frombuffer(bytes(pay[2 * mu_at : 2 * mu_at + 16]), "<f4")
    assert np.all(np.diff(mu) > 0), mu
    pay[2 * mu_at : 2 * mu_at + 16] = mu[::-1].astype("<f4").tobytes()
    cm.secs[0] = raw_sec(SectionKind.PAYLOAD, NO_SITE, bytes(pay))
    S.valid("sym_mu_descending", BB([cm], meta=meta("symmetric", 0.0)).build(), "§7.2", "eigenvalues mu stored in descending order (a reader must not rely on ascending mu)")
    ci = c.copy()
    pay = bytearray(ci.secs[0].stored)
    pay[2 * mu_at + 12 : 2 * mu_at + 16] = np.array([np.inf], "<f4").tobytes()  # the largest eigenvalue
    ci.secs[0] = raw_sec(SectionKind.PAYLOAD, NO_SITE, bytes(pay))
    S.valid("sym_mu_infinite", BB([ci], meta=meta("symmetric", 0.0)).build(), "§7.2",
            "an eigenvalue mu = +infinity (non-finite mu are not rejected): regenerated values become infinities or NaNs")
    pc, penc = no_correction_chunk("paper", 6, 0.005)
    S.valid("paper_signs_only", BB([pc], scheme=1, meta=meta("paper", 0.005)).build(), "§8.1, §8.3", "a non-plain paper site whose only section is its sign bitmap (D=6, tolerance 0.005)")
    for vid, ch, scheme, what in (("nonfinite_anchor_sym", c, "symmetric", "+infinity"), ("nonfinite_anchor_paper", pc, "paper", "NaN")):
        x = ch.copy()
        pay = bytearray(x.secs[0].stored)
        pay[-2:] = b"\x00\x7c" if what == "+infinity" else b"\x00\x7e"  # the anchor is pushed last: its last element
        x.secs[0] = raw_sec(SectionKind.PAYLOAD, NO_SITE, bytes(pay))
        S.valid(vid, BB([x], scheme=1 if scheme == "paper" else 2, meta=meta(scheme, 0.0)).build(), "§7.5, §9 item 4",
                f"{scheme} site whose stored anchor holds a {what}: the Gram matrix is not finite, so E is all NaN and every regenerated "
                f"value{' and the un-rotated anchor' if scheme == 'paper' else ''} is a NaN (any NaN matches); not a reason to reject")
    pc2 = pc.copy()
    pc2.secs += [raw_sec(SectionKind.X_PATCHES, 0, b"\x00"), raw_sec(SectionKind.ANCHOR_PATCHES, 0, b"\x00")]
    S.valid("paper_empty_patches", BB([pc2], scheme=1, meta=meta("paper", 0.005)).build(), "§8.5", "paper site with x_patches and anchor_patches of count 0")

    # zstd everywhere the format allows it
    z = bs.chunks[0].copy()
    ap = approx_of(z)[0]
    from bbformat.codec.section_kinds import decode_residuals

    rsec = z.sec(SectionKind.X_RESIDUALS)
    r = decode_residuals(rsec.stored, ap, "float16")
    z.secs = [zstd_sec(SectionKind.PAYLOAD, NO_SITE, z.secs[0].stored), raw_sec(SectionKind.X_RESIDUALS, 0, residual_section(ap, "float16", r, codec=1))]
    S.valid("zstd_sym", BB([z, bs.chunks[1]], meta=meta("symmetric", 0.0)).build(), "§8.2, §8.4",
            "zstd payload (the writer never compresses it) and x_residuals with every group zstd-compressed")
    zp = paper_exact_chunk.copy()
    assert kinds(zp) == [SectionKind.PAYLOAD, SectionKind.SIGNS, SectionKind.X_PATCHES, SectionKind.ANCHOR_PATCHES], kinds(zp)
    zp.secs = [zstd_sec(s.kind, s.site, s.stored if s.codec == 0 else zstandard.ZstdDecompressor().decompress(s.stored)) for s in zp.secs]
    S.valid("zstd_paper", BB([zp], scheme=1, meta=meta("paper", 0.0)).build(), "§8.2", "paper chunk with every section zstd-compressed: payload, signs, x_patches, anchor_patches")
    z2 = c2.copy()
    z2.secs[-1] = zstd_sec(SectionKind.X_PATCHES, 0, b"\x00")
    S.valid("zstd_tiny_section", BB([z2], meta=meta("symmetric", 0.0)).build(), "§8.2", "a zstd section whose frame is larger than its 1 decoded byte (valid, merely wasteful)")
    small = meta_bytes({"format": "bbformat", "tolerance": 0.0, "note": "zstd metadata"})
    S.valid("metadata_zstd_small", BB([], meta=ZSTD.compress(small), meta_codec=1).build(), "§4.1",
            "zero chunks; metadata_codec 1: a small JSON object in one zstd frame", eig=False)
    buf = io.BytesIO()
    w = bbformat.Writer(buf, "symmetric", 1, {"format": "bbformat", "tolerance": 0.0, "files": {"tokenizer.json": "tok " * 3000}},
                        format_version="1.1")
    w.add_chunk(enc.program, enc.sections)
    w.close()
    assert buf.getvalue()[21] == 1
    S.valid("metadata_zstd_writer", buf.getvalue(), "§4.1", "large metadata that the writer zstd-compressed (metadata_codec 1), one chunk")

    D, data = largest_d()
    S.valid("large_d", data, "§7.5, §11.1",
            f"the largest site dimension that keeps the file under 1 MiB: D = {D} (float16, symmetric, tolerance 0); the anchor is "
            f"D x D with a well-separated Gram spectrum, the source exactly n(D) = {D * (D + 1) // 2} values, all regenerated")

    # propagation: regenerated values of one site form the anchor of an earlier site (SPEC 9 item 3)
    rng = np.random.default_rng(515)
    ts = {"src": t(rng, (8, 10)), "t1": RawTensor.from_f64(separated(rng, 14, 10).T, "float16"),
          "t2": RawTensor.from_f64(separated(rng, 12, 10).T, "float16"), "t3": RawTensor.from_f64(separated(rng, 12, 10).T, "float16")}
    lay = ChunkLayout("chain", ("src", "t1", "t2", "t3"), (SiteSpec("A", 10, AxisRef("t1", 0)), SiteSpec("B", 10, AxisRef("t2", 0)),
                                                          SiteSpec("C", 10, AxisRef("t3", 0))))
    enc = encode(lay, ts, "symmetric", 0.0, force=True)
    data = single(enc, "symmetric", 0.0).build()
    assert_intended(data, [enc])
    S.valid("chain_propagation", data, "§9 item 3",
            "three chained sites in one chunk: C regenerates the tail of t2, the anchor of B, which regenerates the tail of t1, the anchor of A")

    # shapes and values at the edges, all stored
    edges, empty = edge_chunks()
    S.valid("shapes_edge", BB([edges, empty], meta=meta("symmetric", 0.0)).build(), "§5.1, §6",
            "scalars (ndim 0), zero-size tensors ((0,), (2,0,3), float32 (0,)), an 8-dimensional tensor, stored infinities, NaNs (signalling "
            "and quiet), signed zeros and subnormals; a second chunk with no tensors, an empty name and an empty payload", eig=False)
    S.valid("zero_chunks", BB([], meta=b"{}").build(), "§2", "a container with no chunks: header, empty index, footer (86 bytes)", eig=False)
    rec = program_rec("zeros", 1, [("big_but_empty", 1, [1 << 20, 1 << 20, 0]), ("after", 1, [2])], [], [(OpKind.PUSH, 0), (OpKind.PUSH, 1)])
    S.valid("zero_size_large_dims", BB([Chk(rec, [raw_sec(SectionKind.PAYLOAD, NO_SITE, b"\x00\x3c\x00\xbc")])]).build(), "§5.1",
            "a tensor of dims (2^20, 2^20, 0): 0 elements whatever its other dims", eig=False)
    for vid, text, what in (("metadata_duplicate_keys", b'{"a":1,"a":2,"tolerance":0.0}', "an object with a duplicate key"),
                            ("metadata_big_float", b'{"a":1e999,"b":-1e999,"c":1e-999}', "numbers beyond float64 range (1e999, -1e999, 1e-999)"),
                            ("metadata_nesting_512", b'{"a":' + b"[" * 511 + b"]" * 511 + b"}", "objects and arrays nested 512 levels deep"),
                            ("metadata_integer_4300_digits", b'{"a":' + b"9" * 4300 + b"}", "an integer of 4,300 digits"),
                            ("metadata_unicode", '{"ü":"⚙ \\ud83d\\ude00 \\u0000","":[]}'.encode(), "non-ASCII keys, escaped surrogate pairs, an escaped NUL, an empty key")):
        S.valid(vid, BB([], meta=text).build(), "§4.1", f"zero chunks; metadata with {what}: a reader MUST NOT reject", eig=False)
    S.valid("minor_version_7", mod(bs, hdr={"minor": 7}).build(), "§4, §11.4", "minor version 7 in header and footer (a reader MUST accept any minor of major 1)")
    S.valid("optional_flags_set", BB([c], meta=meta("symmetric", 0.0), hdr={"optional_flags": 0xFFFFFFFF}).build(), "§4, §11.4",
            "every optional_flags bit set (a reader MUST ignore them)")
    odd_meta = meta_bytes({"format": "bbformat", "format_version": "1.99", "scheme": "paper", "tolerance": "not a number",
                           "x-unknown": {"nested": [1, 2.5, None, True, "ü"]}, "keys": 7})
    S.valid("metadata_unknown_keys", BB([c], meta=odd_meta).build(), "§4.1, §9 item 5, §11.4",
            "metadata with unknown keys, a non-numeric tolerance, a wrong scheme and wrong-typed known keys (a reader MUST NOT reject)")
    cf = bs.chunks[0].copy()
    cf.rec["sites"][0]["followers"] = [dict(tensor="no such tensor", axis=200, reserved=0), dict(tensor="émbed.⚙", axis=0, reserved=0),
                                      dict(tensor="", axis=255, reserved=0)]
    cf.rec["sites"][0]["name"] = "sïte ∑"
    S.valid("followers_unknown", BB([cf, bs.chunks[1]], meta=meta("symmetric", 0.0)).build(), "§5.1",
            "followers that name unknown tensors and out-of-range axes, non-ASCII UTF-8 names (a reader MUST NOT reject)")
    rz = paper_exact_chunk.copy()
    rz.secs = rz.secs[::-1]
    S.valid("sections_reordered", BB([rz], scheme=1, meta=meta("paper", 0.0)).build(), "§8.1", "section table in reverse order (anchor_patches, x_patches, signs, payload)")

    rng = np.random.default_rng(717)
    w = separated(rng, 16, 12).T  # (12, 16): axis 0 D=12, axis 1 D=16
    ts = {"src": t(rng, (16, 16)), "w": RawTensor.from_f64(w, "float16")}
    lay = ChunkLayout("two", ("src", "w"), (SiteSpec("rows", 12, AxisRef("w", 0)), SiteSpec("cols", 16, AxisRef("w", 1))))
    enc = encode(lay, ts, "symmetric", 0.0, force=True)
    data = single(enc, "symmetric", 0.0).build()
    assert_intended(data, [enc])
    S.valid("two_sites_one_anchor", data, "§7.1", "one tensor anchors two sites (axis 0, D=12, and axis 1, D=16)")

    rng = np.random.default_rng(818)
    m = separated(rng, 20, 12)
    a3 = np.moveaxis(m.reshape(4, 5, 12), -1, 1)
    ts = {"src": t(rng, (9, 12)), "a3": RawTensor.from_f64(a3, "float16")}
    enc = encode(ChunkLayout("axis1", ("src", "a3"), (SiteSpec("mid", 12, AxisRef("a3", 1)),)), ts, "symmetric", 0.0, force=True)
    S.valid("anchor_3d_axis1", single(enc, "symmetric", 0.0).build(), "§7.1", "anchor of shape (4, 12, 5), site on axis 1 (M = moveaxis(A, 1, -1).reshape(20, 12))")
    enc = encode(ChunkLayout("axis1p", ("src", "a3"), (SiteSpec("mid", 12, AxisRef("a3", 1)),)), ts, "paper", 0.005, force=True)
    S.valid("paper_anchor_3d_axis1", single(enc, "paper", 0.005).build(), "§7.1 step 9", "paper site on axis 1 of a 3-D anchor: un-rotation moves the axis back")

    rng = np.random.default_rng(919)
    ts = {"bias32": t(rng, (5,), "float32"), "src": t(rng, (8, 12)), "anchor32": RawTensor.from_f64(separated(rng, 16, 12).T, "float32"),
          "follower32": t(rng, (12,), "float32")}
    lay = ChunkLayout("mixed", tuple(ts), (SiteSpec("s", 12, AxisRef("anchor32", 0), (AxisRef("follower32", 0),)),))
    enc = encode(lay, ts, "symmetric", 0.0, force=True)
    assert enc.program.symbol_dtype == "float16"
    S.valid("mixed_widths", single(enc, "symmetric", 0.0).build(), "§6.2", "float32 tensors (two symbols each, low half first) in a W = 16 chunk, including a float32 anchor")
    ts = {"first": t(rng, (4,)), "src": t(rng, (8, 12), "bfloat16"), "w": RawTensor.from_f64(separated(rng, 16, 12).T, "float16")}
    enc = encode(ChunkLayout("mixed16", tuple(ts), (SiteSpec("s", 12, AxisRef("w", 0)),)), ts, "symmetric", 0.0, force=True)
    assert enc.program.symbol_dtype == "float16"
    S.valid("bf16_tensor_f16_symbols", single(enc, "symmetric", 0.0).build(), "§6.2",
            "symbol dtype float16 while the popped block lies in a bfloat16 tensor: block values are read and regenerated as float16")
    for D in (2, 3):
        rng = np.random.default_rng(1000 + D)
        ts = {"src": t(rng, (8,)), "w": RawTensor.from_f64(separated(rng, 5, D).T, "float16")}
        enc = encode(ChunkLayout(f"d{D}", ("src", "w"), (SiteSpec("s", D, AxisRef("w", 0)),)), ts, "symmetric", 0.0, force=True)
        assert nonplain(enc)
        S.valid(f"site_d{D}", single(enc, "symmetric", 0.0).build(), "§6.3, §5.2",
                f"a non-plain site of D = {D} ({'the minimum; ' if D == 2 else ''}it pops n(D) = {D * (D + 1) // 2} symbols and pushes {2 * D})")


def frame_header_len(frame: bytes) -> int:
    fhd = frame[4]
    fcs_flag, single_seg, dict_flag = fhd >> 6, (fhd >> 5) & 1, fhd & 3
    fcs = {0: 1 if single_seg else 0, 1: 2, 2: 4, 3: 8}[fcs_flag]
    return 5 + (0 if single_seg else 1) + {0: 0, 1: 1, 2: 2, 3: 4}[dict_flag] + fcs


def fcs_lie(frame: bytes, delta: int) -> bytes:
    """The frame with its Frame_Content_Size field changed by delta (same field size)."""
    fhd = frame[4]
    fcs_flag, single_seg, dict_flag = fhd >> 6, (fhd >> 5) & 1, fhd & 3
    size = {0: 1 if single_seg else 0, 1: 2, 2: 4, 3: 8}[fcs_flag]
    off = 5 + (0 if single_seg else 1) + {0: 0, 1: 1, 2: 2, 3: 4}[dict_flag]
    bias = 256 if fcs_flag == 1 else 0
    val = int.from_bytes(frame[off : off + size], "little") + bias
    return frame[:off] + (val + delta - bias).to_bytes(size, "little") + frame[off + size :]


def bad_block_type(frame: bytes) -> bytes:
    """Set the first block's Block_Type to 3 (reserved): libzstd reports corruption."""
    h = frame_header_len(frame)
    b0 = frame[h]
    return frame[:h] + bytes([(b0 & ~0x06) | 0x06]) + frame[h + 1 :]


SKIPPABLE = struct.pack("<II", 0x184D2A50, 4) + b"skip"


def add_invalid(S: Suite) -> None:  # noqa: C901 - one list of vectors
    bs = base_sym()
    good = bs.build()
    lay = bs.layout()
    H = lay["H"]
    c0, c1 = lay["chunks"]
    end = len(good) - 40
    bp = base_paper()
    bpl = base_plain()
    inv = S.invalid

    # ---- 1 E_MAGIC ------------------------------------------------------------------------
    inv("x_magic_leading", patch(good, 0, b"\x88"), "§4", "leading file magic's first byte 0x88", "E_MAGIC", 1)
    inv("x_magic_leading_last", patch(good, 7, b"\x0b"), "§4", "leading file magic's last byte changed", "E_MAGIC", 1)
    inv("x_magic_short_file", good[:7], "§10.2", "a 7-byte file (shorter than the magic)", "E_MAGIC", 1)
    inv("x_magic_empty_file", b"", "§10.2", "an empty file", "E_MAGIC", 1, eig=False)
    for i in (0, 1):
        x = bs.copy()
        x.chunks[i].head["magic"] = b"BBCX"
        inv(f"x_magic_chunk{i}", x.build(), "§5", f"chunk {i}'s magic BBCX (CRCs resealed)", "E_MAGIC", 1)
    inv("x_magic_index", mod(bs, index_magic=b"BBIY").build(), "§10.1", "index magic BBIY (index_crc resealed)", "E_MAGIC", 1)
    zb = BB([], meta=b'{"pad":"xxxx"}').build()
    zh = len(zb) - 48  # H
    short_index = zb[:zh] + b"\x00\x00\x00\x00" + b"BBIX" + zb[-40:]
    short_index = reseal_footer(patch(patch(short_index, len(short_index) - 40, struct.pack("<Q", zh + 4)), len(short_index) - 32, struct.pack("<Q", 4)))
    inv("x_magic_index_short", short_index, "§10.1", "zero chunks, index_offset = H + 4, index_length 4: an index shorter than 8 bytes (just BBIX)", "E_MAGIC", 1, eig=False)
    inv("x_footer_magic", patch(good, len(good) - 1, b"\x0b"), "§10.2",
        "footer magic's last byte changed: random access finds no footer magic (E_TRUNCATED); a forward reader reports E_MAGIC",
        "E_TRUNCATED", (2, 1))
    inv("x_footer_magic_zeroed", good[:-8] + bytes(8), "§10.2", "footer magic zeroed", "E_TRUNCATED", (2, 1))

    # ---- 2 E_TRUNCATED -------------------------------------------------------------------
    cuts = {
        "x_trunc_83_bytes": 83, "x_trunc_after_magic": 8, "x_trunc_header_fixed": 32, "x_trunc_in_metadata": 32 + lay["M"] // 2,
        "x_trunc_before_header_crc": H - 4, "x_trunc_after_header": H, "x_trunc_in_chunk_head": H + 16,
        "x_trunc_in_descriptor": c0["desc"] + 20, "x_trunc_in_section_table": c0["table"] + 40, "x_trunc_in_payload": c0["data"] + 100,
        "x_trunc_in_corrections": c0["end"] - 10, "x_trunc_before_chunk_crc": c0["end"] - 4, "x_trunc_after_chunk0": c0["end"],
        "x_trunc_after_chunk1": c1["end"], "x_trunc_in_index": lay["index"] + 20, "x_trunc_before_footer": end,
        "x_trunc_in_footer": end + 20, "x_trunc_footer_last_byte": len(good) - 1,
    }
    for vid, cut in cuts.items():
        inv(vid, good[:cut], "§2, §10.2", f"the file cut after {cut} of {len(good)} bytes", "E_TRUNCATED", 2)
    inv("x_trailing_byte", good + b"\x00", "§10.2, §10.3",
        "one byte after the footer: random access finds no footer magic at the end; a forward reader reports E_TRAILING", "E_TRUNCATED", (28, 2))
    inv("x_trailing_footer_copy", good + good[-40:], "§10.2, §10.3",
        "a second copy of the footer after the footer: random access finds an index that does not end at file_size - 40; forward: E_TRAILING",
        "E_BOUNDS", (28, 15))

    # ---- 3 E_VERSION -----------------------------------------------------------------------
    inv("x_version_header_major2", mod(bs, hdr={"major": 2}, ftr={"major": 1}).build(), "§4", "header major 2 (footer 1)", "E_VERSION", 3)
    inv("x_version_major2_both", mod(bs, hdr={"major": 2}).build(), "§4, §10.2", "major 2 in header and footer", "E_VERSION", 3)
    inv("x_version_major0", mod(bs, hdr={"major": 0}).build(), "§4", "major 0 in header and footer", "E_VERSION", 3)
    inv("x_version_footer_major2", mod(bs, ftr={"major": 2}).build(), "§10.2", "footer major 2 (header 1)", "E_VERSION", 3)
    inv("x_version_footer_major65535", mod(bs, ftr={"major": 0xFFFF}).build(), "§10.2", "footer major 65535", "E_VERSION", 3)
    inv("x_version_minor_header", mod(bs, hdr={"minor": 1}, ftr={"minor": 0}).build(), "§10.2", "header minor 1, footer minor 0", "E_VERSION", 3)
    inv("x_version_minor_footer", mod(bs, ftr={"minor": 3}).build(), "§10.2", "header minor 0, footer minor 3", "E_VERSION", 3)

    # ---- 4 E_REQUIRED_FLAG, 6 E_SCHEME ---------------------------------------------------------
    # bit 0 is PLANES since 1.1 (add_planes), bits 1 and 2 DIGESTS and MIXED_CORRECTIONS since 1.2 (add_v12), bit 3 EXPONENT
    # since 1.3 (add_exponent, which holds the unknown-bit vectors now)
    for sc in (0, 4, 255):  # 3 is `none` since 1.2 (add_v12: o_scheme_3_with_sites, which was x_scheme_3)
        inv(f"x_scheme_{sc}", mod(bs, scheme=sc).build(), "§4", f"header scheme {sc}", "E_SCHEME", 6)

    # ---- 5 E_RESERVED ------------------------------------------------------------------------
    for b in (0x01, 0x100):
        inv(f"x_reserved_header_{b:#x}", mod(bs, hdr={"reserved": b}).build(), "§4", f"header reserved u16 = {b:#x}", "E_RESERVED", 5)
    for fld, off in (("reserved0", 4), ("reserved1", 28)):
        x = bs.copy()
        x.chunks[1].head[fld] = 0x80000000
        inv(f"x_reserved_chunk_head{off}", x.build(), "§5", f"chunk 1 header reserved field at +{off} = 0x80000000", "E_RESERVED", 5)
    for fld in ("reserved0", "reserved1"):
        x = bs.copy()
        x.chunks[0].rec[fld] = 1
        inv(f"x_reserved_descriptor_{fld[-1]}", x.build(), "§5.1", f"descriptor reserved {'u8' if fld == 'reserved0' else 'u16'} = 1", "E_RESERVED", 5)
    x = bs.copy()
    x.chunks[0].rec["tensors"][1]["reserved"] = 0x8000
    inv("x_reserved_tensor", x.build(), "§5.1", "tensor record reserved = 0x8000", "E_RESERVED", 5)
    x = bs.copy()
    x.chunks[0].rec["sites"][0]["reserved"] = 1
    inv("x_reserved_site", x.build(), "§5.1", "site record reserved = 1", "E_RESERVED", 5)
    x = bs.copy()
    x.chunks[0].rec["sites"][0]["followers"][0]["reserved"] = 1
    inv("x_reserved_follower", x.build(), "§5.1", "follower reserved u8 = 1", "E_RESERVED", 5)
    for fld in ("reserved0", "reserved1"):
        x = bs.copy()
        x.chunks[0].rec["ops"][-1][fld] = 2
        inv(f"x_reserved_op_{fld[-1]}", x.build(), "§5.1", f"last op's reserved {'u8' if fld == 'reserved0' else 'u16'} = 2", "E_RESERVED", 5)
    for bit in range(2, 8):
        x = bs.copy()
        x.chunks[0].rec["sites"][0]["flags"] |= 1 << bit
        inv(f"x_reserved_site_flag_bit{bit}", x.build(), "§5.1, §5.2", f"site flags bit {bit} set", "E_RESERVED", 5)
    x = bs.copy()
    x.chunks[0].secs[1].reserved = 1
    inv("x_reserved_section_entry", x.build(), "§5.3", "section entry reserved = 1 (x_residuals entry)", "E_RESERVED", 5)

    def entry_reserved(es: list[dict]) -> None:
        es[1]["reserved"] = 1

    inv("x_reserved_index_entry", mod(bs, entry_edit=entry_reserved).build(), "§10.1", "index entry 1 reserved = 1 (index_crc resealed)", "E_RESERVED", 5)
    inv("x_reserved_footer", mod(bs, ftr={"reserved": 1}).build(), "§10.2", "footer reserved = 1 (footer_crc resealed)", "E_RESERVED", 5)
    x = bp.copy()
    sg = x.chunks[0].sec(SectionKind.SIGNS)
    sg.stored = sg.stored[:1] + bytes([sg.stored[1] | 0x80])
    inv("x_reserved_sign_padding", x.build(), "§8.3", "sign bitmap padding bit 15 set (D = 12)", "E_RESERVED", 5)
    x = bp.copy()
    sg = x.chunks[0].sec(SectionKind.SIGNS)
    sg.stored = sg.stored[:1] + bytes([sg.stored[1] | 0x10])
    inv("x_reserved_sign_padding_first", x.build(), "§8.3", "sign bitmap padding bit 12 (the first padding bit) set (D = 12)", "E_RESERVED", 5)

    # ---- 7 E_CODEC ------------------------------------------------------------------------------
    for cd in (2, 255):
        inv(f"x_codec_metadata_{cd}", mod(bs, meta_codec=cd).build(), "§4", f"metadata_codec {cd}", "E_CODEC", 7)
    x = bs.copy()
    x.chunks[0].secs[0].codec = 2
    inv("x_codec_payload_2", x.build(), "§5.3", "payload section codec 2", "E_CODEC", 7)
    x = bs.copy()
    x.chunks[0].secs[1].codec = 7
    inv("x_codec_section_7", x.build(), "§5.3", "x_residuals section codec 7", "E_CODEC", 7)
    ap0 = approx_of(bs.chunks[0])[0]

    def with_residuals(sec_bytes: bytes, chunk: Chk | None = None) -> BB:
        x = bs.copy()
        ch = x.chunks[0] if chunk is None else chunk
        ch.secs = [ch.secs[0], raw_sec(SectionKind.X_RESIDUALS, 0, sec_bytes)]
        x.chunks[0] = ch
        return x

    groups = np.unique(residual_contexts(ap0, "float16"), return_counts=True)[1]
    g_big = int(np.argmax(groups))  # a group with several values
    assert groups[g_big] >= 5
    good_res = residual_section(ap0, "float16")
    first_group_len = 2 + int(groups[0])  # varint length (1 byte) + codec byte + count one-byte varints
    inv("x_codec_residual_group_2", with_residuals(patch(good_res, 1, b"\x02")).build(), "§8.4", "residual group codec 2", "E_CODEC", 7)

    # ---- 8 E_ZSTD --------------------------------------------------------------------------------
    js = meta_bytes({"format": "bbformat", "tolerance": 0.0, "padding": "x" * 200})
    fr = ZSTD.compress(js)
    for vid, stored, what in (
        ("x_zstd_metadata_not_a_frame", js, "metadata_codec 1 but the metadata is raw JSON"),
        ("x_zstd_metadata_truncated", fr[:-3], "a zstd metadata frame missing its last 3 bytes"),
        ("x_zstd_metadata_two_frames", fr + ZSTD.compress(b"{}"), "two zstd frames"),
        ("x_zstd_metadata_skippable_first", SKIPPABLE + fr, "a skippable frame before the zstd frame"),
        ("x_zstd_metadata_skippable_after", fr + SKIPPABLE, "a skippable frame after the zstd frame"),
        ("x_zstd_metadata_trailing_byte", fr + b"\x00", "one byte after the zstd frame"),
        ("x_zstd_metadata_bad_block", bad_block_type(fr), "a zstd frame whose first block has the reserved block type 3"),
        ("x_zstd_metadata_short_header", fr[:3], "3 bytes: not even a frame header"),
    ):
        inv(vid, BB([], meta=stored, meta_codec=1).build(), "§4.1, §8.2", what, "E_ZSTD", 8, eig=False)
    inv("x_zstd_metadata_fcs_lie", BB([], meta=fcs_lie(fr, 5), meta_codec=1).build(), "§4.1",
        "a metadata frame whose header declares 5 bytes more than its blocks hold (damaged: zstd decoders detect it)", "E_ZSTD", 8, eig=False)
    inv("x_zstd_metadata_fcs_lie_smaller", BB([], meta=fcs_lie(fr, -5), meta_codec=1).build(), "§4.1",
        "a metadata frame whose header declares 5 bytes fewer than its blocks hold", "E_ZSTD", 8, eig=False)

    pay = bs.chunks[0].secs[0].stored
    pfr = ZSTD.compress(pay)

    def zpay(stored: bytes, decoded: int | None = None) -> BB:
        x = bs.copy()
        x.chunks[0].secs[0] = Sec(SectionKind.PAYLOAD, NO_SITE, stored, len(pay) if decoded is None else decoded, 1)
        return x

    for vid, stored, what in (
        ("x_zstd_section_garbage", b"\x00" * 40, "a zstd payload section of 40 zero bytes (no frame magic)"),
        ("x_zstd_section_empty", b"", "a zstd payload section of 0 stored bytes"),
        ("x_zstd_section_truncated", pfr[:-4], "a zstd payload frame missing its last 4 bytes"),
        ("x_zstd_section_two_frames", pfr + ZSTD.compress(b"ab"), "a zstd payload: the frame, then a second frame"),
        ("x_zstd_section_skippable_first", SKIPPABLE + pfr, "a zstd payload: a skippable frame, then the frame"),
        ("x_zstd_section_skippable_after", pfr + SKIPPABLE, "a zstd payload: the frame, then a skippable frame"),
        ("x_zstd_section_skippable_only", struct.pack("<II", 0x184D2A5F, len(pay)) + pay, "a zstd payload that is one skippable frame (magic 0x184D2A5F) holding the payload bytes"),
        ("x_zstd_section_trailing_byte", pfr + b"\x00", "a zstd payload: the frame, then one zero byte"),
        ("x_zstd_section_bad_block", bad_block_type(pfr), "a zstd payload frame whose first block has the reserved block type 3"),
    ):
        inv(vid, zpay(stored).build(), "§8.2", what, "E_ZSTD", 8)
    for d in (8, -8):
        inv(f"x_zstd_section_fcs_lie_{'larger' if d > 0 else 'smaller'}", zpay(fcs_lie(pfr, d), len(pay)).build(), "§8.2",
            f"a zstd payload frame whose header declares {abs(d)} bytes {'more' if d > 0 else 'fewer'} than the payload's true size, "
            "which the table entry declares: Frame_Content_Size != decoded_length", "E_SECTION_SIZE", 24)
    # A side section whose frame and table entry both lie: the frame is damaged.
    rawres = encode_varints(zigzag(np.zeros(int(groups[0]), np.int64)))
    for d in (3, -3):
        x = bs.copy()
        side = patches([0], [int(ap0[0])], 16)
        sfr = fcs_lie(ZSTD.compress(side * 1), d)
        x.chunks[0].secs[1] = Sec(SectionKind.X_PATCHES, 0, sfr, len(side) + d, 1)
        inv(f"x_zstd_frame_size_lie_{'larger' if d > 0 else 'smaller'}", x.build(), "§8.2",
            f"an x_patches zstd frame whose header and table entry both declare {abs(d)} bytes {'more' if d > 0 else 'fewer'} than the frame's "
            "blocks hold (damaged: zstd decoders detect it)", "E_ZSTD", 8)
    grp_frame = ZSTD.compress(rawres)

    def res_with_group0(group: bytes, codec: int = 1) -> bytes:
        rest = good_res[first_group_len:]
        return varint(len(group)) + bytes([codec]) + group + rest

    assert res_with_group0(rawres, 0) == good_res
    inv("x_zstd_residual_group_garbage", with_residuals(res_with_group0(b"\x01\x02\x03\x04\x05\x06")).build(), "§8.4",
        "a zstd residual group of 6 bytes that are not a frame", "E_ZSTD", 8)
    inv("x_zstd_residual_group_two_frames", with_residuals(res_with_group0(grp_frame + grp_frame)).build(), "§8.4",
        "a zstd residual group holding two frames", "E_ZSTD", 8)
    inv("x_zstd_residual_group_truncated", with_residuals(res_with_group0(grp_frame[:-2])).build(), "§8.4",
        "a zstd residual group whose frame misses its last 2 bytes", "E_ZSTD", 8)

    # ---- 9 E_METADATA ------------------------------------------------------------------------
    for vid, text, what in (
        ("x_metadata_not_utf8", b'{"a":"\xff"}', "a 0xFF byte inside a JSON string"),
        ("x_metadata_overlong_utf8", b'{"a":"\xc0\xaf"}', "an overlong UTF-8 encoding of '/'"),
        ("x_metadata_surrogate_utf8", b'{"a":"\xed\xa0\x80"}', "a UTF-8-encoded surrogate (U+D800)"),
        ("x_metadata_truncated_utf8", b'{"a":"\xe2\x82"}', "a truncated 3-byte UTF-8 sequence"),
        ("x_metadata_not_json", b'{"a":}', "not JSON"),
        ("x_metadata_empty", b"", "metadata_length 0 (empty text is not JSON)"),
        ("x_metadata_array", b"[1,2]", "a JSON array"),
        ("x_metadata_string", b'"object"', "a JSON string"),
        ("x_metadata_number", b"42", "a JSON number"),
        ("x_metadata_null", b"null", "JSON null"),
        ("x_metadata_trailing_garbage", b'{"a":1}x', "an object followed by a stray character"),
        ("x_metadata_two_objects", b"{}{}", "two objects"),
        ("x_metadata_single_quotes", b"{'a':1}", "single-quoted keys"),
        ("x_metadata_control_char", b'{"a":"\x01"}', "an unescaped control character in a string"),
        ("x_metadata_unterminated", b'{"a":"b', "an unterminated string"),
    ):
        inv(vid, BB([], meta=text).build(), "§4.1", f"metadata: {what}", "E_METADATA", 9, eig=False)
    inv("x_metadata_bom", BB([], meta=b'\xef\xbb\xbf{"a":1}').build(), "§4.1", "metadata starting with a UTF-8 byte order mark (not JSON whitespace)",
        "E_METADATA", 9, eig=False)
    inv("x_metadata_zstd_array", BB([], meta=ZSTD.compress(b"[1]"), meta_codec=1).build(), "§4.1", "zstd metadata that decodes to a JSON array",
        "E_METADATA", 9, eig=False)

    # ---- 10-14 CRCs --------------------------------------------------------------------------------
    inv("x_crc_header_metadata", patch(good, 40, bytes([good[40] ^ 0x01])), "§3, §4", "a metadata byte changed, header_crc not updated",
        "E_CRC_HEADER", 10)
    inv("x_crc_header_optional_flags", patch(good, 16, b"\x01"), "§3, §4", "optional_flags changed, header_crc not updated", "E_CRC_HEADER", 10)
    inv("x_crc_header_field", mod(bs, hdr={"crc": crc32c(bs.header()[:-4]) ^ 0x80000000}).build(), "§3", "header_crc's top bit flipped",
        "E_CRC_HEADER", 10)
    for i, (where, off) in enumerate((("payload", c0["data"] + 50), ("chunk_index field", c1["start"] + 16))):
        inv(f"x_crc_chunk{i}_{where.split()[0]}", patch(good, off, bytes([good[off] ^ 0x04])), "§3, §5",
            f"chunk {i}: a {where} byte changed, chunk_crc not updated (the index entry copies the stale chunk_crc)", "E_CRC_CHUNK", 11)
    x = bs.copy()
    x.chunks[0].crc = 0x12345678
    inv("x_crc_chunk_field", x.build(), "§3, §5", "chunk 0's chunk_crc field replaced (the index entry holds the same wrong value)", "E_CRC_CHUNK", 11)
    for i in (0, 1):
        def bad_crc(es: list[dict], i: int = i) -> None:
            es[i]["crc"] ^= 0x00010000

        inv(f"x_crc_index_entry{i}", mod(bs, entry_edit=bad_crc).build(), "§10.1", f"index entry {i}'s crc differs from chunk {i}'s (index_crc resealed)",
            "E_CRC_INDEX_ENTRY", 12)
    io0 = lay["index"]
    inv("x_crc_index_byte", patch(good, io0 + 8 + 24 + 20, b"\x01"), "§3, §10.2", "an index byte changed (entry 1 reserved), index_crc not updated",
        "E_CRC_INDEX", 13)
    inv("x_crc_index_field", mod(bs, index_crc=0).build(), "§3, §10.2", "footer index_crc = 0 (footer_crc resealed)", "E_CRC_INDEX", 13)
    inv("x_crc_footer_offset", patch(good, end, bytes([good[end] ^ 0x01])), "§3, §10.2", "footer index_offset changed, footer_crc not updated",
        "E_CRC_FOOTER", 14)
    inv("x_crc_footer_field", patch(good, end + 28, bytes([good[end + 28] ^ 0x01])), "§3, §10.2", "footer_crc changed", "E_CRC_FOOTER", 14)
    inv("x_crc_footer_before_version", patch(good, end + 20, b"\x02"), "§10.2", "footer major 2 without resealing: footer_crc is checked first",
        "E_CRC_FOOTER", 14)
    inv("x_crc_footer_before_reserved", patch(good, end + 24, b"\x01"), "§10.2", "footer reserved 1 without resealing: footer_crc is checked first",
        "E_CRC_FOOTER", 14)

    # ---- 15 E_BOUNDS ---------------------------------------------------------------------------
    size = len(good)
    inv("x_bounds_header_past_eof", mod(bs, hdr={"metadata_length": size}).build(), "§2, §4", "metadata_length = file size: H > file_size - 48",
        "E_BOUNDS", 15)
    inv("x_bounds_header_into_index", mod(bs, hdr={"metadata_length": size - 48 - 36 + 1}).build(), "§2", "H = file_size - 47 (one past the bound)",
        "E_BOUNDS", 15)
    for vid, fo, what in (
        ("x_bounds_index_offset_below_h", {"index_offset": H - 1, "index_length": end - H + 1}, "index_offset = H - 1 (index_length keeps the end)"),
        ("x_bounds_index_offset_zero", {"index_offset": 0, "index_length": end}, "index_offset = 0"),
        ("x_bounds_index_end_short", {"index_length": end - io0 - 1}, "index_offset + index_length = file_size - 41"),
        ("x_bounds_index_end_long", {"index_length": end - io0 + 1}, "index_offset + index_length = file_size - 39"),
        ("x_bounds_index_offset_past_eof", {"index_offset": size + 100, "index_length": 56}, "index_offset past the end of the file"),
        ("x_bounds_index_u64_wrap", {"index_offset": end + 8, "index_length": (1 << 64) - 8}, "index_offset = end + 8, index_length = 2^64 - 8: the sum wraps to file_size - 40"),
        ("x_bounds_index_offset_max", {"index_offset": U64, "index_length": end + 1}, "index_offset = 2^64 - 1, index_length = end + 1 (wraps to the end)"),
        ("x_bounds_index_length_max", {"index_length": U64}, "index_length = 2^64 - 1"),
    ):
        inv(vid, mod(bs, ftr=fo).build(), "§10.2", what + " (footer_crc resealed)", "E_BOUNDS", 15)

    def edit(fn: Callable[[list[dict]], None]) -> bytes:
        return mod(bs, entry_edit=fn).build()

    entry_cases = (
        ("x_bounds_entry0_offset", lambda es: es[0].update(offset=H + 1), "index entry 0 offset = H + 1"),
        ("x_bounds_entry0_offset_zero", lambda es: es[0].update(offset=0), "index entry 0 offset = 0"),
        ("x_bounds_entry1_gap", lambda es: es[1].update(offset=es[1]["offset"] + 4), "index entry 1 starts 4 bytes after chunk 0 ends"),
        ("x_bounds_entry1_overlap", lambda es: es[1].update(offset=es[1]["offset"] - 4), "index entry 1 overlaps chunk 0 by 4 bytes"),
        ("x_bounds_entry_short", lambda es: es[0].update(length=35), "index entry 0 length 35 (< 36)"),
        ("x_bounds_entry_zero_length", lambda es: es[0].update(length=0), "index entry 0 length 0"),
        ("x_bounds_entry_past_index", lambda es: es[1].update(length=es[1]["length"] + 8), "index entry 1 runs 8 bytes into the index"),
        ("x_bounds_entry_length_max", lambda es: es[1].update(length=U64), "index entry 1 length 2^64 - 1"),
        ("x_bounds_entry_length_wrap", lambda es: (es[0].update(length=U64), es[1].update(offset=H - 1)),
         "index entry 0 length 2^64 - 1 and entry 1 offset H - 1 (consistent modulo 2^64)"),
        ("x_bounds_entry_offset_max", lambda es: es[1].update(offset=U64), "index entry 1 offset 2^64 - 1"),
        ("x_bounds_chunks_end_early", lambda es: es[1].update(length=es[1]["length"] - 4), "the chunks (by the index) end 4 bytes before the index"),
    )
    for vid, fn, what in entry_cases:
        inv(vid, edit(fn), "§10.1", what + " (index_crc resealed)", "E_BOUNDS", 15)
    for vid, delta, what in (("x_bounds_chunk_length_larger", 8, "+8"), ("x_bounds_chunk_length_smaller", -8, "-8")):
        x = bs.copy()
        x.chunks[0].head["chunk_length"] = c0["end"] - c0["start"] + delta
        inv(vid, x.build(), "§5, §10.1", f"chunk 0's chunk_length field {what}: differs from its index entry", "E_BOUNDS", 15)
    x = bs.copy()
    x.chunks[1].head["chunk_length"] = U64
    inv("x_bounds_chunk_length_max", x.build(), "§5", "chunk 1's chunk_length field 2^64 - 1", "E_BOUNDS", 15)
    x = bs.copy()
    x.chunks[1].head["chunk_length"] = 35
    inv("x_bounds_chunk_length_35", x.build(), "§5, §10.3", "chunk 1's chunk_length field 35 (streaming: < 36)", "E_BOUNDS", 15)
    x = bs.copy()
    x.chunks[0].head["descriptor_length"] = c0["end"] - c0["start"]
    inv("x_bounds_descriptor_past_chunk", x.build(), "§5", "descriptor_length = chunk_length", "E_BOUNDS", 15)
    x = bs.copy()
    x.chunks[0].head["section_count"] = 1000
    inv("x_bounds_table_past_chunk", x.build(), "§5", "section_count 1000: the section table runs past the chunk", "E_BOUNDS", 15)
    x = bs.copy()
    clen = c0["end"] - c0["start"]
    dl = c0["table"] - c0["desc"]
    x.chunks[0].head["section_count"] = (clen - 4 - 32 - dl) // 32 + 1
    inv("x_bounds_table_into_crc", x.build(), "§5", "section_count one more than fits before chunk_crc", "E_BOUNDS", 15)
    sec_cases = (
        ("x_bounds_section0_offset", 0, {"offset": lambda e: e + 1}, "section 0 offset one past the table end"),
        ("x_bounds_section0_offset_zero", 0, {"offset": lambda e: 0}, "section 0 offset 0 (inside the chunk header)"),
        ("x_bounds_section_gap", 1, {"offset": lambda e: e + 2}, "section 1 starts 2 bytes after section 0 ends"),
        ("x_bounds_section_overlap", 1, {"offset": lambda e: e - 2}, "section 1 overlaps section 0 by 2 bytes"),
        ("x_bounds_section_offset_max", 1, {"offset": lambda e: U64}, "section 1 offset 2^64 - 1"),
        ("x_bounds_section_past_chunk", 1, {"stored_length": lambda e: e + 1, "decoded_length": lambda e: e + 1}, "the last section runs 1 byte into chunk_crc"),
        ("x_bounds_section_length_max", 1, {"stored_length": lambda e: U64}, "section 1 stored_length 2^64 - 1"),
        ("x_bounds_section_length_wrap", 0, {"stored_length": lambda e: U64 - 100}, "section 0 stored_length 2^64 - 101 (offset + length wraps)"),
    )
    for vid, k, fields, what in sec_cases:
        x = bs.copy()
        s = x.chunks[0].secs[k]
        tbl_end = c0["data"] - c0["start"]
        cur = {"offset": tbl_end + sum(len(q.stored) for q in x.chunks[0].secs[:k]), "stored_length": len(s.stored), "decoded_length": s.decoded_length}
        s.over = {f: fn(cur[f]) for f, fn in fields.items()}
        inv(vid, x.build(), "§5.3", what, "E_BOUNDS", 15)
    x = bs.copy()
    x.chunks[0].tail = b"\x00\x00\x00"
    inv("x_bounds_bytes_before_crc", x.build(), "§5.3", "3 bytes between the last section and chunk_crc", "E_BOUNDS", 15)
    x = bs.copy()
    x.chunks[1].tail = b"\x00"
    inv("x_bounds_byte_before_crc_chunk1", x.build(), "§5.3", "chunk 1: 1 byte between its payload and chunk_crc", "E_BOUNDS", 15)

    # ---- 16 E_INDEX, 17 E_CHUNK_ORDER -----------------------------------------------------------
    inv("x_index_count_larger", mod(bs, index_count=3).build(), "§10.1", "index chunk_count 3, header 2", "E_INDEX", 16)
    inv("x_index_count_smaller", mod(bs, index_count=1).build(), "§10.1", "index chunk_count 1, header 2", "E_INDEX", 16)
    inv("x_index_count_max", mod(bs, index_count=0xFFFFFFFF).build(), "§10.1", "index chunk_count 2^32 - 1", "E_INDEX", 16)
    inv("x_index_length_extra", mod(bs, index_extra=b"\x00" * 4).build(), "§10.1", "4 extra bytes in the index (index_length = 8 + 24N + 4)", "E_INDEX", 16)
    inv("x_index_extra_entry", mod(bs, index_extra=b"\x00" * 24).build(), "§10.1", "a third index entry (24 zero bytes) with chunk_count 2", "E_INDEX", 16)
    x = bs.copy()
    x.chunks[0].head["chunk_index"], x.chunks[1].head["chunk_index"] = 1, 0
    inv("x_chunk_order_swapped", x.build(), "§5, §10.1", "chunk_index 1 then 0", "E_CHUNK_ORDER", 17)
    x = bs.copy()
    x.chunks[1].head["chunk_index"] = 0
    inv("x_chunk_order_duplicate", x.build(), "§5", "both chunks say chunk_index 0", "E_CHUNK_ORDER", 17)
    x = bs.copy()
    x.chunks[1].head["chunk_index"] = 0xFFFFFFFF
    inv("x_chunk_order_max", x.build(), "§5", "chunk 1 says chunk_index 2^32 - 1", "E_CHUNK_ORDER", 17)

    # ---- 18 E_DESCRIPTOR -----------------------------------------------------------------------
    d0 = bs.chunks[0].descriptor()
    x = bs.copy()
    x.chunks[0].desc = d0[:-5]
    inv("x_descriptor_record_past_end", x.build(), "§5.1", "descriptor cut 5 bytes short (the last op runs past Ld)", "E_DESCRIPTOR", 18)
    x = bs.copy()
    x.chunks[0].desc = d0 + b"\x00\x00\x00"
    inv("x_descriptor_leftover_bytes", x.build(), "§5.1", "3 bytes left over after the last op", "E_DESCRIPTOR", 18)
    x = bs.copy()
    x.chunks[1].desc = b""
    inv("x_descriptor_empty", x.build(), "§5.1", "descriptor_length 0", "E_DESCRIPTOR", 18)
    x = bs.copy()
    x.chunks[1].desc = b"\xff\xff" + x.chunks[1].descriptor()[2:]
    inv("x_descriptor_name_past_end", x.build(), "§5.1", "chunk name length 65535 runs past the descriptor", "E_DESCRIPTOR", 18)
    for vid, k, bad, what in (("x_descriptor_utf8_chunk_name", "name", b"\xff", "chunk name"),
                              ("x_descriptor_utf8_tensor_name", "tensor", b"\xc0\x80", "tensor name (overlong NUL)"),
                              ("x_descriptor_utf8_site_name", "site", b"\xed\xa0\x80", "site name (surrogate U+D800)"),
                              ("x_descriptor_utf8_follower_name", "follower", b"\xe2\x82", "follower name (truncated sequence)"),
                              ("x_descriptor_utf8_above_max", "tensor2", b"\xf4\x90\x80\x80", "tensor name (U+110000)")):
        x = bs.copy()
        ch = x.chunks[0]
        marker = {"name": b"~" * len(bad), "tensor": b"!" * len(bad), "site": b"#" * len(bad), "follower": b"%" * len(bad),
                  "tensor2": b"^" * len(bad)}[k]
        m = marker.decode()
        if k == "name":
            ch.rec["name"] = m
        elif k in ("tensor", "tensor2"):
            ch.rec["tensors"][0 if k == "tensor" else 2]["name"] = m
        elif k == "site":
            ch.rec["sites"][0]["name"] = m
        else:
            ch.rec["sites"][0]["followers"][0]["tensor"] = m
        desc_replace(ch, marker, bad)
        inv(vid, x.build(), "§1, §5.1", f"invalid UTF-8 in a {what}", "E_DESCRIPTOR", 18)
    x = bs.copy()
    x.chunks[0].rec["tensors"][2]["name"] = x.chunks[0].rec["tensors"][0]["name"]
    inv("x_descriptor_duplicate_tensor_name", x.build(), "§5.1", "two tensors named 'src' in one chunk", "E_DESCRIPTOR", 18)
    for kd in (0, 3, 255):
        x = bs.copy()
        x.chunks[0].rec["ops"][0]["kind"] = kd
        inv(f"x_descriptor_op_kind_{kd}", x.build(), "§5.1", f"op kind {kd}", "E_DESCRIPTOR", 18)
    ops0 = bs.chunks[0].rec["ops"]
    push_k = next(k for k, o in enumerate(ops0) if o["kind"] == OpKind.PUSH)
    site_k = next(k for k, o in enumerate(ops0) if o["kind"] == OpKind.SITE)
    for vid, k, idx, what in (("x_descriptor_push_index_range", push_k, 3, "PUSH 3 in a chunk of 3 tensors"),
                              ("x_descriptor_push_index_max", push_k, 0xFFFFFFFF, "PUSH 2^32 - 1"),
                              ("x_descriptor_site_index_range", site_k, 1, "SITE 1 in a chunk of 1 site")):
        x = bs.copy()
        x.chunks[0].rec["ops"][k]["index"] = idx
        inv(vid, x.build(), "§5.1", what, "E_DESCRIPTOR", 18)
    x = bs.copy()
    x.chunks[0].rec["ops"].append(dict(ops0[-1]))
    inv("x_descriptor_tensor_pushed_twice", x.build(), "§5.2", "the last tensor pushed twice", "E_DESCRIPTOR", 18)
    x = bs.copy()
    x.chunks[0].rec["ops"] = [o for o in ops0 if not (o["kind"] == OpKind.PUSH and o["index"] == 2)]
    inv("x_descriptor_tensor_not_pushed", x.build(), "§5.2", "a tensor without a PUSH", "E_DESCRIPTOR", 18)
    x = bs.copy()
    x.chunks[0].rec["ops"] = [dict(ops0[site_k])] + [dict(o) for o in ops0]
    inv("x_descriptor_site_twice", x.build(), "§5.2", "the site's SITE op appears twice", "E_DESCRIPTOR", 18)
    x = bs.copy()
    x.chunks[0].rec["ops"] = [o for o in ops0 if o["kind"] != OpKind.SITE]
    inv("x_descriptor_site_missing", x.build(), "§5.2", "a site without a SITE op", "E_DESCRIPTOR", 18)
    x = bs.copy()
    dd = bytearray(x.chunks[1].descriptor())
    nl = struct.unpack("<H", dd[:2])[0]
    dd[2 + nl + 4 : 2 + nl + 8] = struct.pack("<I", 70000)
    x.chunks[1].desc = bytes(dd)
    inv("x_descriptor_tensor_count_lie", x.build(), "§5.1, §11.1",
        "tensor_count 70000 with one tensor record: the records run past Ld (the reference parses first); the count is also over the limit",
        "E_DESCRIPTOR", (18, 27), also=("E_LIMIT_COUNT",))
    x = bs.copy()
    dd = x.chunks[1].descriptor()
    x.chunks[1].desc = dd[:-12] + struct.pack("<I", 0xFFFFFFFF) + dd[-8:]
    inv("x_descriptor_op_count_lie", x.build(), "§5.1", "op_count 2^32 - 1 with one op record", "E_DESCRIPTOR", 18)

    # ---- 19 E_DTYPE, 20 E_SITE -------------------------------------------------------------------
    for v in (0, 4, 255):
        x = bs.copy()
        x.chunks[0].rec["symbol_dtype"] = v
        inv(f"x_dtype_symbol_{v}", x.build(), "§5.1, §6.1", f"symbol_dtype {v}", "E_DTYPE", 19)
    for v in (0, 9):
        x = bs.copy()
        x.chunks[0].rec["tensors"][1]["dtype"] = v
        inv(f"x_dtype_tensor_{v}", x.build(), "§5.1, §6.1", f"tensor dtype {v}", "E_DTYPE", 19)
    x = bs.copy()
    x.chunks[1].rec["tensors"].append(dict(name="half", dtype=1, ndim=1, reserved=0, dims=[2]))
    x.chunks[1].rec["ops"].append(dict(kind=OpKind.PUSH, reserved0=0, reserved1=0, index=1))
    x.chunks[1].secs[0] = raw_sec(SectionKind.PAYLOAD, NO_SITE, x.chunks[1].secs[0].stored + b"\x00\x3c\x00\x3c")
    inv("x_dtype_narrower_than_symbols", x.build(), "§5.1, §6.2", "a float16 tensor in a chunk of float32 symbols", "E_DTYPE", 19)

    def site_edit(**kv: int) -> bytes:
        x = bs.copy()
        x.chunks[0].rec["sites"][0].update(kv)
        return x.build()

    inv("x_site_anchor_range", site_edit(anchor=3), "§5.2", "anchor 3 in a chunk of 3 tensors", "E_SITE", 20)
    inv("x_site_anchor_max", site_edit(anchor=0xFFFFFFFF), "§5.2", "anchor 2^32 - 1", "E_SITE", 20)
    inv("x_site_axis_range", site_edit(anchor_axis=2), "§5.2", "anchor_axis 2 on a 2-D anchor", "E_SITE", 20)
    inv("x_site_axis_255", site_edit(anchor_axis=255), "§5.2", "anchor_axis 255", "E_SITE", 20)
    inv("x_site_dim_mismatch", site_edit(dim=17), "§5.2", "D = 17 where dims[anchor_axis] = 16", "E_SITE", 20)
    inv("x_site_other_axis", site_edit(anchor_axis=1), "§5.2", "anchor_axis 1 (size 20) with D = 16", "E_SITE", 20)
    inv("x_site_wrong_anchor", site_edit(anchor=2), "§5.2", "anchor = the (3, 16) follower, axis 0 (size 3) with D = 16", "E_SITE", 20)
    for D in (1, 0):
        rec = program_rec("d", 1, [("src", 1, [10]), ("w", 1, [D, 4])], [("s", D, 1, 0, 0)], [(OpKind.PUSH, 0), (OpKind.SITE, 0), (OpKind.PUSH, 1)])
        p_sym = 10 + 4 * D + 2 * D - D * (D + 1) // 2
        inv(f"x_site_dim_{D}", BB([Chk(rec, [raw_sec(SectionKind.PAYLOAD, NO_SITE, bytes(2 * p_sym))])]).build(), "§5.1, §5.2",
            f"a site of D = {D} on a ({D}, 4) anchor", "E_SITE", 20, eig=False)
    rec = program_rec("s", 1, [("src", 1, [10]), ("sc", 1, [])], [("s", 2, 1, 0, 0)], [(OpKind.PUSH, 0), (OpKind.SITE, 0), (OpKind.PUSH, 1)])
    inv("x_site_scalar_anchor", BB([Chk(rec, [raw_sec(SectionKind.PAYLOAD, NO_SITE, bytes(2 * 12))])]).build(), "§5.2",
        "a site anchored on a scalar (ndim 0, anchor_axis 0)", "E_SITE", 20, eig=False)
    x = bs.copy()
    ops = x.chunks[0].rec["ops"]
    x.chunks[0].rec["ops"] = [o for o in ops if o["kind"] == OpKind.PUSH] + [o for o in ops if o["kind"] == OpKind.SITE]
    inv("x_site_order", x.build(), "§5.2", "the anchor's PUSH comes before the site's SITE op", "E_SITE", 20)

    # ---- 21 E_SECTION_KIND, 22 E_SECTION_DUPLICATE, 23 E_SECTION_MISSING ---------------------------
    for kd in (0, 6, 255):
        x = bs.copy()
        x.chunks[0].secs[1].kind = kd
        inv(f"x_section_kind_{kd}", x.build(), "§5.3, §8.1", f"section kind {kd}", "E_SECTION_KIND", 21)
    x = bs.copy()
    x.chunks[0].secs[0].site = 0
    inv("x_section_payload_names_site", x.build(), "§8.1", "payload section with site 0", "E_SECTION_KIND", 21)
    x = bs.copy()
    x.chunks[0].secs[1].site = 1
    inv("x_section_site_range", x.build(), "§8.1", "x_residuals for site 1 (the chunk has 1 site)", "E_SECTION_KIND", 21)
    x = bs.copy()
    x.chunks[0].secs[1].site = NO_SITE
    inv("x_section_site_none", x.build(), "§8.1", "x_residuals with site 0xFFFFFFFF", "E_SECTION_KIND", 21)
    x = bpl.copy()
    x.chunks[0].secs.insert(0, raw_sec(SectionKind.X_PATCHES, 0, b"\x00"))
    inv("x_section_on_plain_site", x.build(), "§8.1", "an x_patches section (count 0) on a PLAIN site, before the payload", "E_SECTION_KIND", 21, eig=False)
    x = bs.copy()
    x.chunks[0].secs.append(raw_sec(SectionKind.SIGNS, 0, b"\x00\x00"))
    inv("x_section_signs_on_symmetric", x.build(), "§8.1", "a signs section on a symmetric-mode site", "E_SECTION_KIND", 21)
    x = bs.copy()
    x.chunks[0].secs.append(raw_sec(SectionKind.ANCHOR_PATCHES, 0, b"\x00"))
    inv("x_section_anchor_patches_on_symmetric", x.build(), "§8.1", "an anchor_patches section on a symmetric-mode site", "E_SECTION_KIND", 21)
    x = bp.copy()
    x.chunks[0].secs = [s for s in x.chunks[0].secs if s.kind != SectionKind.X_PATCHES] + [raw_sec(SectionKind.X_RESIDUALS, 0, b"")]
    inv("x_section_residuals_on_paper", x.build(), "§8.1", "an x_residuals section on a PAPER site", "E_SECTION_KIND", 21)
    pf = BB([chk_from(encode_chunk(ChunkLayout("plain3", ("src", "w"), (SiteSpec("s", 4, AxisRef("w", 0)),)),
                                   {"src": t(np.random.default_rng(313), (6, 4)), "w": t(np.random.default_rng(314), (4, 6))}, {}, "paper", 0.0, band=False))],
            scheme=1, meta=meta("paper", 0.0))
    assert pf.chunks[0].rec["sites"][0]["flags"] == 3
    pf.chunks[0].secs.append(raw_sec(SectionKind.SIGNS, 0, b"\x00"))
    inv("x_section_signs_on_plain_paper", pf.build(), "§8.1", "a signs section on a site with PLAIN and PAPER set", "E_SECTION_KIND", 21)

    x = bs.copy()
    x.chunks[1].secs.append(x.chunks[1].secs[0])
    inv("x_dup_payload", x.build(), "§8.1", "two payload sections", "E_SECTION_DUPLICATE", 22)
    x = bs.copy()
    x.chunks[0].secs.append(x.chunks[0].secs[1])
    inv("x_dup_residuals", x.build(), "§8.1", "two x_residuals sections for one site", "E_SECTION_DUPLICATE", 22)
    x = bs.copy()
    x.chunks[0].secs.append(raw_sec(SectionKind.X_PATCHES, 0, b"\x00"))
    inv("x_dup_residuals_and_patches", x.build(), "§8.1", "x_residuals and x_patches on one site", "E_SECTION_DUPLICATE", 22)
    for kd, nm in ((SectionKind.SIGNS, "signs"), (SectionKind.X_PATCHES, "x_patches"), (SectionKind.ANCHOR_PATCHES, "anchor_patches")):
        x = bp.copy()
        x.chunks[0].secs.append(copy.deepcopy(x.chunks[0].sec(kd)))
        inv(f"x_dup_{nm}", x.build(), "§8.1", f"two {nm} sections for one PAPER site", "E_SECTION_DUPLICATE", 22)

    x = bs.copy()
    x.chunks[0].secs = x.chunks[0].secs[1:]
    inv("x_missing_payload", x.build(), "§8.1", "a chunk with an x_residuals section and no payload", "E_SECTION_MISSING", 23)
    x = bs.copy()
    x.chunks[1].secs = []
    inv("x_missing_all_sections", x.build(), "§5.3, §8.1", "a chunk with section_count 0", "E_SECTION_MISSING", 23)
    x = bp.copy()
    x.chunks[0].secs = [s for s in x.chunks[0].secs if s.kind != SectionKind.SIGNS]
    inv("x_missing_signs", x.build(), "§8.1", "a non-plain PAPER site without a signs section", "E_SECTION_MISSING", 23)

    # ---- 24 E_SECTION_SIZE ---------------------------------------------------------------------------
    x = bs.copy()
    s0 = x.chunks[0].secs[0]
    x.chunks[0].secs[0] = Sec(SectionKind.PAYLOAD, NO_SITE, s0.stored[:-2], s0.decoded_length)
    inv("x_size_raw_payload", x.build(), "§8.2", "raw payload: stored_length 2 less than decoded_length (which is P*W/8)", "E_SECTION_SIZE", 24)
    x = bs.copy()
    s1 = x.chunks[0].secs[1]
    s1.decoded_length += 1
    inv("x_size_raw_side", x.build(), "§8.2", "raw x_residuals: decoded_length = stored_length + 1", "E_SECTION_SIZE", 24)
    nocs = zstandard.ZstdCompressor(level=3, write_content_size=False).compress(pay)
    inv("x_size_zstd_no_content_size", zpay(nocs).build(), "§8.2", "a zstd payload frame without Frame_Content_Size", "E_SECTION_SIZE", 24)
    short = ZSTD.compress(pay[:-2])
    inv("x_size_zstd_declared_larger", zpay(short, len(pay)).build(), "§8.2",
        "zstd payload: the frame holds 2 bytes fewer than decoded_length (= P*W/8)", "E_SECTION_SIZE", 24)
    x = bs.copy()
    side = s1.stored
    x.chunks[0].secs[1] = Sec(SectionKind.X_RESIDUALS, 0, ZSTD.compress(side), len(side) - 1, 1)
    inv("x_size_zstd_declared_smaller", x.build(), "§8.2", "zstd x_residuals: decoded_length 1 less than the frame's content size", "E_SECTION_SIZE", 24)
    for n, what in ((1, "1 byte"), (0, "0 bytes")):
        x = bp.copy()
        sg = x.chunks[0].sec(SectionKind.SIGNS)
        sg.stored, sg.decoded_length = sg.stored[:n], n
        inv(f"x_size_signs_{n}", x.build(), "§8.2, §8.3", f"a sign bitmap of {what} for D = 12 (needs 2)", "E_SECTION_SIZE", 24)
    x = bp.copy()
    sg = x.chunks[0].sec(SectionKind.SIGNS)
    data2 = sg.stored
    x.chunks[0].secs[x.chunks[0].secs.index(sg)] = Sec(SectionKind.SIGNS, 0, ZSTD.compress(data2[:1]), 1, 1)
    inv("x_size_signs_zstd_short", x.build(), "§8.2", "a zstd sign bitmap decoding to 1 byte for D = 12", "E_SECTION_SIZE", 24)

    # ---- 25 E_SECTION_CONTENT: residuals ------------------------------------------------------------
    R_ = lambda b: with_residuals(b).build()  # noqa: E731
    inv("x_content_residual_header_unterminated", R_(b"\x80\x80"), "§8.4", "x_residuals: the first group length varint never ends", "E_SECTION_CONTENT", 25)
    inv("x_content_residual_header_too_long", R_(b"\x80" * 10 + b"\x00" + good_res[1:]), "§8.4",
        "x_residuals: an 11-byte group length varint", "E_SECTION_CONTENT", 25)
    inv("x_content_residual_no_codec_byte", R_(b"\x05"), "§8.4", "x_residuals: a group length and nothing else", "E_SECTION_CONTENT", 25)
    inv("x_content_residual_group_past_section", R_(varint(len(good_res) + 10) + good_res[1:]), "§8.4",
        "x_residuals: the first group's length runs past the section", "E_SECTION_CONTENT", 25)
    inv("x_content_residual_too_few", R_(res_with_group0(rawres[:-1], 0)), "§8.4", "x_residuals: first group one varint short", "E_SECTION_CONTENT", 25)
    inv("x_content_residual_too_many", R_(res_with_group0(rawres + b"\x00", 0)), "§8.4", "x_residuals: first group one varint too many", "E_SECTION_CONTENT", 25)
    inv("x_content_residual_leftover_byte", R_(res_with_group0(rawres + b"\x80", 0)), "§8.4",
        "x_residuals: first group ends inside an unterminated varint", "E_SECTION_CONTENT", 25)

    def long_varint(k: int, raw: bytes) -> bytes:
        return (b"\x80" * 10 + b"\x00" + raw[1:]) if k == g_big else raw

    inv("x_content_residual_varint_too_long", R_(residual_section(ap0, "float16", group_edit=long_varint)), "§8.4",
        f"x_residuals: an 11-byte varint (of value 0) in a group of {int(groups[g_big])} values", "E_SECTION_CONTENT", 25)

    def over_u64(k: int, raw: bytes) -> bytes:
        return (b"\xff" * 9 + b"\x02" + raw[1:]) if k == g_big else raw

    inv("x_content_residual_varint_over_u64", R_(residual_section(ap0, "float16", group_edit=over_u64)), "§1, §8.4",
        "x_residuals: a 10-byte varint whose value is 2^64 or more", "E_SECTION_CONTENT", 25)
    inv("x_content_residual_bytes_after_groups", R_(good_res + b"\x00"), "§8.4", "x_residuals: one byte after the last group", "E_SECTION_CONTENT", 25)
    last_len = 2 + int(groups[-1])
    inv("x_content_residual_missing_group", R_(good_res[:-last_len]), "§8.4", "x_residuals: the last group is missing", "E_SECTION_CONTENT", 25)
    for vid, delta, what in (("x_content_residual_ordinal_high", 1 << 16, "above 2^15 - 1"), ("x_content_residual_ordinal_low", -(1 << 16), "below -2^15")):
        r = np.zeros(ap0.size, np.int64)
        r[0] = delta
        inv(vid, R_(residual_section(ap0, "float16", r)), "§8.4", f"x_residuals: a residual moving value 0's ordinal {what}", "E_SECTION_CONTENT", 25)

    # ---- 25 E_SECTION_CONTENT: patches ---------------------------------------------------------------
    n = int(ap0.size)

    def with_xp(b: bytes, codec: int = 0) -> bytes:
        x = bs.copy()
        x.chunks[0].secs = [x.chunks[0].secs[0], zstd_sec(SectionKind.X_PATCHES, 0, b) if codec else raw_sec(SectionKind.X_PATCHES, 0, b)]
        return x.build()

    ok = patches([0, 5], [int(ap0[0]), int(ap0[5])], 16)
    for vid, b, what in (
        ("x_content_patches_empty", b"", "an x_patches section of 0 bytes (no count)"),
        ("x_content_patches_count_unterminated", b"\x80", "the count varint never ends"),
        ("x_content_patches_count_too_long", b"\x80" * 10 + b"\x00", "an 11-byte count varint"),
        ("x_content_patches_count_over_u64", b"\xff" * 9 + b"\x02", "a 10-byte count varint of value 2^64 or more"),
        ("x_content_patches_count_exceeds", patches(list(range(n)) + [n], [0] * (n + 1), 16), f"count {n + 1} for a block of {n} values"),
        ("x_content_patches_values_short", b"\x02\x00\x04\x00", "count 2 needs 4 value bytes; 3 bytes follow the count"),
        ("x_content_patches_gaps_short", b"\x02\x00" + ok[3:], "count 2 but one gap varint before the values"),
        ("x_content_patches_gaps_extra", b"\x02\x00\x04\x00" + ok[3:], "count 2 but three gap bytes (an extra varint)"),
        ("x_content_patches_gap_unterminated", b"\x02\x00\x84" + ok[3:], "the last gap varint runs into the values"),
        ("x_content_patches_gap_too_long", b"\x01" + b"\x80" * 10 + b"\x00" + ok[3:5], "an 11-byte gap varint"),
        ("x_content_patches_position_range", patches([n], [0], 16), f"position {n} in a block of {n} values"),
        ("x_content_patches_position_wrap", b"\x02\x03" + varint(U64) + ok[3:], "gaps 3 and 2^64 - 1: the second position wraps to 3 modulo 2^64"),
        ("x_content_patches_gap_huge", b"\x01" + varint(1 << 63) + ok[3:5], "gap 2^63"),
    ):
        inv(vid, with_xp(b), "§8.5", f"x_patches: {what}", "E_SECTION_CONTENT", 25)
    inv("x_content_patches_zstd", with_xp(patches([n + 3], [0], 16), codec=1), "§8.5", "zstd x_patches with a position out of range",
        "E_SECTION_CONTENT", 25)
    A = 12 * 16

    def with_ap(b: bytes) -> bytes:
        x = bp.copy()
        x.chunks[0].secs = [s for s in x.chunks[0].secs if s.kind != SectionKind.ANCHOR_PATCHES] + [raw_sec(SectionKind.ANCHOR_PATCHES, 0, b)]
        return x.build()

    def with_pxp(b: bytes) -> bytes:
        x = bp.copy()
        x.chunks[0].secs = [s for s in x.chunks[0].secs if s.kind != SectionKind.X_PATCHES] + [raw_sec(SectionKind.X_PATCHES, 0, b)]
        return x.build()

    inv("x_content_anchor_patches_position_range", with_ap(patches([A], [0], 16)), "§8.5", f"anchor_patches: position {A} for an anchor of {A} elements",
        "E_SECTION_CONTENT", 25)
    inv("x_content_anchor_patches_count_exceeds", with_ap(patches(list(range(A + 1)), [0] * (A + 1), 16)), "§8.5",
        f"anchor_patches: count {A + 1} for {A} elements", "E_SECTION_CONTENT", 25)
    inv("x_content_anchor_patches_values_short", with_ap(b"\x02\x00\x00\x00"), "§8.5", "anchor_patches: count 2 (4 value bytes) with 3 bytes after the count",
        "E_SECTION_CONTENT", 25)
    inv("x_content_anchor_patches_empty", with_ap(b""), "§8.5", "anchor_patches of 0 bytes", "E_SECTION_CONTENT", 25)
    inv("x_content_paper_x_patches_range", with_pxp(patches([78], [0], 16)), "§8.5", "x_patches on a PAPER site (n = 78): position 78",
        "E_SECTION_CONTENT", 25)

    # ---- 26 E_SYMBOL_COUNT ---------------------------------------------------------------------------
    for vid, stored, what in (("x_symbols_payload_long", pay + b"\x00\x3c", "one symbol more than P (a symbol would be left over)"),
                              ("x_symbols_payload_short", pay[:-2], "one symbol fewer than P"),
                              ("x_symbols_payload_odd", pay + b"\x00", "P*W/8 + 1 bytes"),
                              ("x_symbols_payload_empty", b"", "an empty payload")):
        x = bs.copy()
        x.chunks[0].secs[0] = raw_sec(SectionKind.PAYLOAD, NO_SITE, stored)
        inv(vid, x.build(), "§6.3", f"payload: {what}", "E_SYMBOL_COUNT", 26)
    x = bs.copy()
    x.chunks[0].secs[0].over = {"decoded_length": U64}
    inv("x_symbols_decoded_length_max", x.build(), "§6.3, §8.2", "payload decoded_length 2^64 - 1 (stored_length correct)", "E_SYMBOL_COUNT", 26)
    rec = program_rec("u", 1, [("a", 1, [10]), ("w", 1, [4, 6])], [("s", 4, 1, 0, 0)], [(OpKind.SITE, 0), (OpKind.PUSH, 0), (OpKind.PUSH, 1)])
    inv("x_symbols_underflow_push", BB([Chk(rec, [raw_sec(SectionKind.PAYLOAD, NO_SITE, bytes(2 * 32))])]).build(), "§6.3, §7.1",
        "ops SITE 0, PUSH a, PUSH w with P = 32 correct: decoding pops w (24), then a (10) from 8 symbols", "E_SYMBOL_COUNT", 26, eig=False)
    rec = program_rec("u", 1, [("a", 1, [5]), ("w", 1, [2, 3])], [("s", 2, 1, 0, 0)], [(OpKind.SITE, 0), (OpKind.PUSH, 0), (OpKind.PUSH, 1)])
    inv("x_symbols_underflow_mu", BB([Chk(rec, [raw_sec(SectionKind.PAYLOAD, NO_SITE, bytes(2 * 12))])]).build(), "§6.3, §7.1",
        "ops SITE 0 (D = 2), PUSH a, PUSH w with P = 12 correct: the SITE step pops 4 eigenvalue symbols from 1", "E_SYMBOL_COUNT", 26, eig=False)
    rec = program_rec("neg", 1, [("w", 1, [16, 1])], [("s", 16, 0, 0, 0)], [(OpKind.SITE, 0), (OpKind.PUSH, 0)])
    inv("x_symbols_negative_p", BB([Chk(rec, [raw_sec(SectionKind.PAYLOAD, NO_SITE, b"")])]).build(), "§6.3",
        "a (16, 1) anchor and a non-plain D = 16 site: P = 16 + 32 - 136 = -88, which no decoded_length matches (empty payload)",
        "E_SYMBOL_COUNT", 26, eig=False)
    rec = program_rec("huge", 1, [("small", 1, [4]), ("huge", 3, [1 << 20, 1 << 20])], [], [(OpKind.PUSH, 0), (OpKind.PUSH, 1)])
    inv("x_symbols_huge_tensor", BB([Chk(rec, [raw_sec(SectionKind.PAYLOAD, NO_SITE, bytes(8))])]).build(), "§6.3, §11.1",
        "a float32 tensor of exactly 2^40 elements (2^41 symbols) and an 8-byte payload: P*W/8 = 2^42 + 8", "E_SYMBOL_COUNT", 26, eig=False)

    # ---- 27 limits ---------------------------------------------------------------------------------
    inv("x_limit_chunk_count", mod(bs, hdr={"chunk_count": 65537}).build(), "§4, §11.1", "header chunk_count 65,537", "E_LIMIT_COUNT", 27)
    inv("x_limit_chunk_count_max", mod(bs, hdr={"chunk_count": 0xFFFFFFFF}).build(), "§4", "header chunk_count 2^32 - 1", "E_LIMIT_COUNT", 27)
    inv("x_limit_metadata_length", mod(bs, hdr={"metadata_length": (64 << 20) + 1}).build(), "§4, §11.1", "metadata_length 64 MiB + 1",
        "E_LIMIT_METADATA", 27)
    inv("x_limit_metadata_length_max", mod(bs, hdr={"metadata_length": 0xFFFFFFFF}).build(), "§4", "metadata_length 2^32 - 1", "E_LIMIT_METADATA", 27)
    bomb = zstandard.ZstdCompressor(level=1, write_content_size=True).compress(bytes((64 << 20) + 1))
    inv("x_limit_metadata_zstd_declared", BB([], meta=bomb, meta_codec=1).build(), "§4.1",
        f"a {len(bomb)}-byte zstd metadata frame declaring 64 MiB + 1 bytes (checked before decompressing)", "E_LIMIT_METADATA", 27, eig=False)
    inv("x_limit_metadata_zstd_no_size", BB([], meta=zstandard.ZstdCompressor(level=3, write_content_size=False).compress(b"{}"), meta_codec=1).build(),
        "§4.1", "a zstd metadata frame without a content size (counts as 2^64 - 1)", "E_LIMIT_METADATA", 27, eig=False)
    x = bs.copy()
    x.chunks[0].head["descriptor_length"] = (16 << 20) + 1
    inv("x_limit_descriptor_length", x.build(), "§5, §11.1", "descriptor_length 16 MiB + 1", "E_LIMIT_COUNT", 27)
    x = bs.copy()
    x.chunks[0].head["section_count"] = 16385
    inv("x_limit_section_count", x.build(), "§5, §11.1", "section_count 16,385", "E_LIMIT_COUNT", 27)
    many = (struct.pack("<H", 4) + b"many" + b"\x01\x00\x00\x00" + struct.pack("<I", 65537) + b"\x00\x00\x01\x00\x00\x00" * 65537
            + struct.pack("<II", 0, 0))
    inv("x_limit_tensor_count", BB([Chk({}, [raw_sec(SectionKind.PAYLOAD, NO_SITE, b"")], desc=many)]).build(), "§5.1, §11.1",
        "65,537 tensor records (empty names, scalars, no ops)", "E_LIMIT_COUNT", 27, eig=False)
    rec = program_rec("many", 1, [("w", 1, [2, 2])], [("", 2, 0, 0, 1)] * 4097, [])
    inv("x_limit_site_count", BB([Chk(rec, [raw_sec(SectionKind.PAYLOAD, NO_SITE, b"")])]).build(), "§5.1, §11.1", "4,097 site records", "E_LIMIT_COUNT", 27,
        eig=False)
    for nd in (9, 255):
        rec = program_rec("nd", 1, [("t", 1, [1] * nd)], [], [(OpKind.PUSH, 0)])
        inv(f"x_limit_ndim_{nd}", BB([Chk(rec, [raw_sec(SectionKind.PAYLOAD, NO_SITE, b"\x00\x00")])]).build(), "§5.1, §11.1",
            f"a tensor of {nd} dimensions (all 1)", "E_LIMIT_NDIM", 27, eig=False)
    for vid, dims, what in (("x_limit_tensor_elements", [1 << 20, (1 << 20) + 1], "2^40 + 2^20 elements"),
                            ("x_limit_tensor_u64_wrap", [1 << 32, 1 << 32], "dims 2^32 x 2^32: the product wraps to 0 in 64 bits"),
                            ("x_limit_tensor_wrap_small", [(1 << 63) + 1, 2], "dims (2^63 + 1) x 2: the product wraps to 2"),
                            ("x_limit_tensor_dim_max", [U64], "one dim of 2^64 - 1")):
        rec = program_rec("big", 1, [("t", 1, dims)], [], [(OpKind.PUSH, 0)])
        inv(vid, BB([Chk(rec, [raw_sec(SectionKind.PAYLOAD, NO_SITE, b"\x00\x00\x00\x00")])]).build(), "§1, §5.1, §11.1", what, "E_LIMIT_TENSOR", 27, eig=False)
    for D in (32769, 0xFFFFFFFF):
        inv(f"x_limit_dim_{D}", site_edit(dim=D), "§5.1, §11.1", f"site D = {D}", "E_LIMIT_DIM", 27)
    x = bp.copy()
    sg = x.chunks[0].sec(SectionKind.SIGNS)
    sg.stored, sg.decoded_length = sg.stored + b"\x00", 3
    inv("x_limit_section_signs", x.build(), "§8.2", "a 3-byte sign bitmap for D = 12 (limit 2)", "E_LIMIT_SECTION", 27)
    lim_res = 11 * 32 + 3 * n
    inv("x_limit_section_residuals", R_(bytes(lim_res + 1)), "§8.2", f"raw x_residuals of {lim_res + 1} bytes (limit {lim_res})", "E_LIMIT_SECTION", 27)
    lim_xp = 10 + n * 12
    for vid, dl, what in (("x_limit_section_x_patches_bomb", lim_xp + 1, "one byte over the limit"),
                          ("x_limit_section_bomb_100mb", 100_000_000, "100,000,000 bytes")):
        x = bs.copy()
        x.chunks[0].secs[1] = Sec(SectionKind.X_PATCHES, 0, zstandard.ZstdCompressor(level=1, write_content_size=True).compress(bytes(dl)), dl, 1)
        inv(vid, x.build(), "§8.2, §11.1", f"a small zstd x_patches frame declaring {what} (limit {lim_xp})", "E_LIMIT_SECTION", 27)
    x = bp.copy()
    lim_ap = 10 + A * 12
    x.chunks[0].secs = [s for s in x.chunks[0].secs if s.kind != SectionKind.ANCHOR_PATCHES] + [
        Sec(SectionKind.ANCHOR_PATCHES, 0, zstandard.ZstdCompressor(level=1, write_content_size=True).compress(bytes(lim_ap + 1)), lim_ap + 1, 1)]
    inv("x_limit_section_anchor_patches", x.build(), "§8.2", f"zstd anchor_patches declaring {lim_ap + 1} bytes (limit {lim_ap})", "E_LIMIT_SECTION", 27)
    cnt0 = int(groups[0])
    inv("x_limit_residual_group_raw", R_(res_with_group0(bytes(3 * cnt0 + 1), 0)), "§8.4",
        f"a raw residual group of {3 * cnt0 + 1} bytes for {cnt0} values (limit {3 * cnt0})", "E_LIMIT_SECTION", 27)
    inv("x_limit_residual_group_zstd", R_(res_with_group0(ZSTD.compress(bytes(3 * cnt0 + 1)))), "§8.4",
        f"a zstd residual group declaring {3 * cnt0 + 1} bytes for {cnt0} values", "E_LIMIT_SECTION", 27)
    inv("x_limit_residual_group_no_size", R_(res_with_group0(zstandard.ZstdCompressor(level=3, write_content_size=False).compress(rawres))),
        "§8.4", "a zstd residual group frame without a content size (counts as 2^64 - 1)", "E_LIMIT_SECTION", 27)


def add_optional(S: Suite) -> None:
    bs = base_sym()
    c, _ = no_correction_chunk("symmetric", 4, 0.0)
    c2 = c.copy()
    c2.rec["name"] = "again"
    S.optional("o_duplicate_tensor_across_chunks", BB([c, c2], meta=meta("symmetric", 0.0)).build(), "§7.1, §11.4",
               "the same tensor names (and bytes) in two chunks: the reference rejects; an accepting reader returns the last chunk's tensors",
               "reject", "E_DESCRIPTOR", accept_as=BB([c2], meta=meta("symmetric", 0.0)).build())
    S.optional("o_scheme_contradicts_sites", mod(bs, scheme=1).build(), "§4, §11.4", "header scheme paper, sites in symmetric mode", "accept", "E_SCHEME")
    for vid, text in (("o_metadata_nan", b'{"tolerance":NaN}'), ("o_metadata_infinity", b'{"tolerance":-Infinity}')):
        S.optional(vid, BB([], meta=text).build(), "§4.1, §11.4", f"metadata JSON with a non-RFC 8259 literal: {text.decode()}", "accept", "E_METADATA", eig=False)
    S.optional("o_metadata_nesting_600", BB([], meta=b'{"a":' + b"[" * 599 + b"]" * 599 + b"}").build(), "§4.1",
               "metadata nested 600 levels deep (over the 512 a reader must accept; the reference accepts up to about 980)", "accept", "E_METADATA",
               eig=False)
    deep = b'{"a":' + b"[" * 100000 + b"]" * 100000 + b"}"
    S.optional("o_metadata_deep_nesting", BB([], meta=ZSTD.compress(deep), meta_codec=1).build(), "§4.1",
               "zstd metadata: valid JSON nested 100,000 deep (RFC 8259 §9 lets a parser limit depth); the reference rejects", "reject", "E_METADATA",
               eig=False, tensors={})
    S.optional("o_metadata_integer_4301_digits", BB([], meta=b'{"a":' + b"7" * 4301 + b"}").build(), "§4.1",
               "metadata with a 4,301-digit integer (over the 4,300 a reader must accept); the reference rejects", "reject", "E_METADATA", eig=False,
               tensors={})
    rec = program_rec("wide", 1, [("w", 1, [32768])], [("max_d", 32768, 0, 0, SiteFlag.PLAIN)], [(OpKind.SITE, 0), (OpKind.PUSH, 0)])
    w = np.random.default_rng(99).normal(0, 0.05, 32768).astype("<f2").tobytes()
    S.optional("o_site_d_32768_plain", BB([Chk(rec, [raw_sec(SectionKind.PAYLOAD, NO_SITE, w)])]).build(), "§11.1, §11.4",
               "a PLAIN site of D = 32,768 (the limit) on a (32768,) anchor: valid, but beyond a small reader's own limits", "accept", "E_LIMIT_DIM",
               eig=False)
    rec = program_rec("z", 1, [("zero_but_large", 1, [1 << 40, 1 << 40, 0]), ("one", 1, [1])], [], [(OpKind.PUSH, 0), (OpKind.PUSH, 1)])
    S.optional("o_zero_size_large_dims", BB([Chk(rec, [raw_sec(SectionKind.PAYLOAD, NO_SITE, b"\x00\x3c")])]).build(), "§1, §5.1, §11.4",
               "a tensor of dims (2^40, 2^40, 0): 0 elements, every dim within 2^40, but the non-zero dims multiply to 2^80 (a running "
               "64-bit product overflows); the reference refuses it as its own limit (numpy cannot represent the shape)", "reject",
               "E_LIMIT_TENSOR", eig=False,
               tensors={"zero_but_large": {"dtype": "float16", "shape": [1 << 40, 1 << 40, 0], "sha256": hashlib.sha256(b"").hexdigest(), "tolerance": None},
                        "one": {"dtype": "float16", "shape": [1], "sha256": hashlib.sha256(b"\x00\x3c").hexdigest(), "tolerance": None}})
    rec = program_rec("z", 1, [("zero_but_huge", 1, [U64, 0]), ("one", 1, [1])], [], [(OpKind.PUSH, 0), (OpKind.PUSH, 1)])
    S.optional("o_zero_size_huge_dim", BB([Chk(rec, [raw_sec(SectionKind.PAYLOAD, NO_SITE, b"\x00\x3c")])]).build(), "§1, §5.1, §11.4",
               "a tensor of dims (2^64 - 1, 0): 0 elements, but a dim (and the partial product) is over 2^40; the reference refuses dims "
               "over 2^40 as its own limit", "reject", "E_LIMIT_TENSOR", eig=False,
               tensors={"zero_but_huge": {"dtype": "float16", "shape": [U64, 0], "sha256": hashlib.sha256(b"").hexdigest(), "tolerance": None},
                        "one": {"dtype": "float16", "shape": [1], "sha256": hashlib.sha256(b"\x00\x3c").hexdigest(), "tolerance": None}})


# =============================================================================================
# Version 1.1: payload codec 2, "planes" (SPEC.md 8.6)
# =============================================================================================

PLANES_FLAG = 0x1


def pgroup(raw: bytes, codec: int = 0, length: int | None = None) -> bytes:
    """One planes group: varint L, codec byte, data (`length` overrides L)."""
    data = ZSTD.compress(raw) if codec == 1 else raw
    return varint(len(data) if length is None else length) + bytes([codec]) + data


def planes_bytes(sym: np.ndarray, w: int, segs: list[tuple], codec: Callable[[int], int] = lambda i: 0,
                 head: bytes | None = None, maps_group: bytes | None = None) -> bytes:
    """Codec-2 bytes written position by position (independently of bbformat/codec/entropy.py).
    segs: (n, r, K, row classes, column classes); codec(i) is the codec of the i-th group."""
    sym = [int(x) for x in sym]
    nb = w // 8
    out = bytearray(varint(len(segs)) if head is None else b"")
    if head is None:
        for n, r, k, _, _ in segs:
            out += varint(n) + varint(r) + bytes([k])
    else:
        out += head
    maps = b"".join(bytes(rc) + bytes(cc) for n, r, k, rc, cc in segs if k > 1)
    gi = 0
    out += pgroup(maps, codec(gi)) if maps_group is None else maps_group
    gi += 1
    pos = 0
    for n, r, k, rc, cc in segs:
        streams: list[bytearray] = [bytearray() for _ in range(k * k)]
        for i in range(n):
            c = rc[i // r] * k + cc[i % r] if k > 1 else 0
            streams[c].append(sym[pos + i] >> (w - 8))
        for st in streams:
            out += pgroup(bytes(st), codec(gi))
            gi += 1
        pos += n
    for b in range(nb - 2, -1, -1):
        out += pgroup(bytes((x >> (8 * b)) & 0xFF for x in sym), codec(gi))
        gi += 1
    return bytes(out)


def payload_symbols(c: Chk) -> tuple[np.ndarray, int]:
    sec = c.sec(SectionKind.PAYLOAD)
    data = sec.stored if sec.codec == 0 else zstandard.ZstdDecompressor().decompress(sec.stored)
    w = R.DESCRIPTOR.parse(c.descriptor()).symbol_dtype
    bits = {1: 16, 2: 16, 3: 32}[w]
    return np.frombuffer(data, dtype=f"<u{bits // 8}"), bits


def with_codec(bb: BB, chunk: int, stored: bytes, codec: int, flags: int, minor: int, kind: int = SectionKind.PAYLOAD) -> BB:
    """A copy of bb whose chunk's section of `kind` holds `stored` under `codec`, the header's
    required flags and minor set."""
    x = bb.copy()
    x.hdr.update(required_flags=flags, minor=minor)
    sec = x.chunks[chunk].sec(kind)
    sec.stored, sec.codec = stored, codec
    return x


def with_planes(bb: BB, chunk: int, stored: bytes, flags: int = PLANES_FLAG, minor: int = 1, kind: int = SectionKind.PAYLOAD) -> BB:
    return with_codec(bb, chunk, stored, 2, flags, minor, kind)


def classes(n: int, seed: int, k: int) -> list[int]:
    return [int(v) for v in np.random.default_rng(seed).integers(0, k, n)]


def seg(n: int, r: int, k: int, seed: int) -> tuple:
    rows = -(-n // r)
    return (n, r, k, classes(rows, seed, k), classes(r, seed + 1, k)) if k > 1 else (n, r, 1, [], [])


@contextlib.contextmanager
def table_grain(grain: int) -> Iterator[None]:
    """The reference writer's codec-3 frequencies in multiples of 2^grain while inside: 0 for the
    vectors written before its default became 2 (so that they regenerate byte-identically)."""
    from bbformat.codec import exponent

    was, exponent.TABLE_GRAIN = exponent.TABLE_GRAIN, grain
    try:
        yield
    finally:
        exponent.TABLE_GRAIN = was


def writer_file(seed: int, entropy: str, format_version: str, dtype: str, grain: int = 0) -> tuple[bytes, list[int]]:
    """The reference writer's file of a tiny 2-layer Llama (pack --verify) and its payload codecs."""
    from bbformat.api import pack
    from bbformat.checkpoint import write_checkpoint
    from bbformat.testing import make_tiny_checkpoint

    ck = make_tiny_checkpoint("llama", seed=seed, layers=2, hidden=32, heads=4, kv_heads=2, vocab=32, max_positions=16, dtype=dtype)
    with tempfile.TemporaryDirectory() as d, table_grain(grain):
        write_checkpoint(ck, Path(d) / "m")
        pack(Path(d) / "m", Path(d) / "m.bb", verify=True, entropy=entropy, format_version=format_version)
        data = (Path(d) / "m.bb").read_bytes()
    with Reader(io.BytesIO(data)) as r:
        return data, [r.read_chunk(i).sections[0]["codec"] for i in range(len(r))]


def add_planes(S: Suite) -> None:  # noqa: C901 - one list of vectors
    V = "1.1"
    bs = base_sym()
    c0 = bs.chunks[0]
    sym, w = payload_symbols(c0)
    P = sym.size
    one = [seg(P, P, 1, 0)]
    # a layout with every feature: several segments, partial last rows, K = 1, 2, 4 and 16
    # (256 groups, most of them empty), row length 1 and row length n
    a, b, c = 100, 37, 5
    mixed = [seg(a, 7, 4, 11), seg(b, 1, 2, 12), seg(c, c, 1, 0), seg(P - a - b - c, 9, 16, 13)]
    zall = lambda i: 1  # noqa: E731
    zodd = lambda i: i % 2  # noqa: E731

    S.valid("v_planes_one_segment_raw", with_planes(bs, 0, planes_bytes(sym, w, one)).build(), "§8.6",
            "float16 payload as codec 2: one segment, K = 1, raw groups; a float32 chunk stays raw", since=V)
    S.valid("v_planes_one_segment_zstd", with_planes(bs, 0, planes_bytes(sym, w, one, zall)).build(), "§8.6",
            "codec 2, one segment, every group (including the empty class-map group) one zstd frame", since=V)
    S.valid("v_planes_contexts", with_planes(bs, 0, planes_bytes(sym, w, mixed, zodd)).build(), "§8.6",
            "codec 2 with 4 segments (K = 4, 2, 1, 16; row lengths 7, 1, n, 9; partial last rows; empty groups), raw and zstd groups alternating",
            since=V)
    # float32 symbols: three lower planes
    c1 = bs.chunks[1]
    s32, w32 = payload_symbols(c1)
    assert w32 == 32
    S.valid("v_planes_float32", with_planes(bs, 1, planes_bytes(s32, w32, [seg(s32.size, 4, 2, 21)], zodd)).build(), "§8.6",
            "codec 2 on a float32 chunk (W = 32: top plane and three lower planes), K = 2", since=V)
    both = with_planes(bs, 0, planes_bytes(sym, w, mixed))
    both.chunks[1].sec(SectionKind.PAYLOAD).stored, both.chunks[1].sec(SectionKind.PAYLOAD).codec = planes_bytes(s32, w32, [seg(s32.size, 3, 1, 0)]), 2
    S.valid("v_planes_both_chunks", both.build(), "§8.6", "codec 2 in both chunks of a file", since=V)
    # bfloat16 and a PAPER chunk
    bf = base_bf16_sym()
    sb, wb = payload_symbols(bf.chunks[0])
    S.valid("v_planes_bfloat16", with_planes(bf, 0, planes_bytes(sb, wb, [seg(sb.size, 16, 4, 31)], zodd)).build(), "§8.6",
            "codec 2 on a bfloat16 chunk with a non-plain site, K = 4", since=V)
    bp = base_paper()
    sp, wp = payload_symbols(bp.chunks[0])
    S.valid("v_planes_paper", with_planes(bp, 0, planes_bytes(sp, wp, [seg(sp.size // 2, 12, 2, 41), seg(sp.size - sp.size // 2, 5, 1, 0)])).build(),
            "§8.6", "codec 2 on a PAPER chunk (signs, x_patches, anchor_patches)", since=V)
    # the flag without codec 2: valid in 1.1 (x_required_flag_bit0 of 1.0, same bytes, now accepted)
    S.valid("v_planes_flag_minor0", mod(bs, hdr={"required_flags": PLANES_FLAG}).build(), "§4",
            "required_flags bit 0 (PLANES) set, minor 0, no codec-2 payload: rejected by 1.0 readers (it was x_required_flag_bit0), accepted since 1.1",
            since=V)
    S.valid("v_planes_flag_unused", mod(bs, hdr={"required_flags": PLANES_FLAG, "minor": 1}).build(), "§4",
            "version 1.1 with PLANES set and no codec-2 payload", since=V)
    # the reference writer: pack --entropy planes / auto
    for mode in ("planes", "auto"):
        data, codecs = writer_file(5, mode, "1.1", "float16")
        assert 2 in codecs, codecs
        S.valid(f"v_planes_writer_{mode}", data, "§8.6", f"the reference writer, pack --entropy {mode} (Llama, 2 layers); payload codecs {codecs}",
                since=V)

    def inv(vid: str, data: bytes, what: str, code: str, rule: int, section: str = "§8.6") -> None:
        S.invalid(vid, data, section, what, code, rule, since=V)

    good = planes_bytes(sym, w, mixed)
    inv("x_planes_without_flag", with_planes(bs, 0, good, flags=0, minor=0).build(), "codec 2 payload in a file without PLANES", "E_CODEC", 7)
    inv("x_planes_without_flag_minor1", with_planes(bs, 0, good, flags=0).build(), "codec 2 payload, minor 1, PLANES not set", "E_CODEC", 7)
    res = bs.chunks[0].sec(SectionKind.X_RESIDUALS)
    x = with_planes(bs, 0, good)
    x.chunks[0].sec(SectionKind.X_RESIDUALS).codec = 2
    inv("x_planes_on_residuals", x.build(), "codec 2 on an x_residuals section", "E_CODEC", 7)
    assert res.codec in (0, 1)
    x = with_planes(bs, 0, good)
    x.chunks[0].sec(SectionKind.PAYLOAD).codec = 3
    inv("x_planes_section_codec3", x.build(), "section codec 3 with PLANES set", "E_CODEC", 7)
    S.valid("v_mixed_flag_planes_minor1", with_planes(bs, 0, good, flags=0x5).build(), "§4, §8.1",
            "required_flags PLANES and bit 2 (MIXED_CORRECTIONS) set, minor 1, no site with both corrections: rejected by 1.1 readers "
            "(it was x_required_flag_planes_and_bit2), accepted since 1.2", since="1.2")

    def head(records: list[tuple[int, int, int]], count: int | None = None) -> bytes:
        h = varint(len(records) if count is None else count)
        for n, r, k in records:
            h += varint(n) + varint(r) + bytes([k])
        return h

    def bad_head(vid: str, records: list[tuple[int, int, int]], what: str, count: int | None = None, code: str = "E_SECTION_CONTENT",
                 rule: int = 25) -> None:
        inv(vid, with_planes(bs, 0, head(records, count) + good[len(head([(m[0], m[1], m[2]) for m in mixed])):]).build(), what, code, rule)

    recs = [(m[0], m[1], m[2]) for m in mixed]
    bad_head("x_planes_segments_0", [], "segment_count 0", count=0)
    bad_head("x_planes_segments_over_p", recs, f"segment_count P + 1 = {P + 1}", count=P + 1)
    inv("x_planes_segments_65537", with_planes(bs, 0, varint(65537)).build(), "segment_count 65,537 (over the limit, checked first)",
        "E_LIMIT_COUNT", 27)
    bad_head("x_planes_seglen_0", [(0, 1, 1)] + recs, "a segment of length 0")
    bad_head("x_planes_seglen_over", [(recs[0][0] + 1,) + recs[0][1:]] + recs[1:], "segment lengths sum past P")
    bad_head("x_planes_rowlen_0", [(recs[0][0], 0, recs[0][2])] + recs[1:], "row_length 0")
    bad_head("x_planes_rowlen_over_n", [(recs[0][0], recs[0][0] + 1, recs[0][2])] + recs[1:], "row_length > the segment's length")
    bad_head("x_planes_classes_0", [(recs[0][0], recs[0][1], 0)] + recs[1:], "class count 0")
    bad_head("x_planes_classes_17", [recs[0], recs[1], recs[2], (recs[3][0], recs[3][1], 17)], "class count 17")
    bad_head("x_planes_cover_short", recs[:3] + [(recs[3][0] - 1, recs[3][1], recs[3][2])], "segments cover P - 1 symbols")
    short = head(recs)[:-1]
    inv("x_planes_records_truncated", with_planes(bs, 0, short).build(), "the section ends inside the segment records", "E_SECTION_CONTENT", 25)
    inv("x_planes_varint_unterminated", with_planes(bs, 0, b"\x81" + b"\xff" * 3).build(), "segment_count varint unterminated",
        "E_SECTION_CONTENT", 25)
    inv("x_planes_varint_12_bytes", with_planes(bs, 0, b"\x81" + b"\x80" * 10 + b"\x00").build(), "segment_count varint of 12 bytes",
        "E_SECTION_CONTENT", 25)
    # classes out of range
    inv("x_planes_rowclass_ge_k", with_planes(bs, 0, _planes_bad_maps(sym, w, mixed, seg_i=0, row=True)).build(), "a row class equal to K (4)",
        "E_SECTION_CONTENT", 25)
    inv("x_planes_colclass_ge_k", with_planes(bs, 0, _planes_bad_maps(sym, w, mixed, seg_i=3, row=False)).build(),
        "a column class equal to K (16)", "E_SECTION_CONTENT", 25)
    # groups
    maps = b"".join(bytes(m[3]) + bytes(m[4]) for m in mixed if m[2] > 1)
    inv("x_planes_maps_short", with_planes(bs, 0, planes_bytes(sym, w, mixed, maps_group=pgroup(maps[:-1]))).build(),
        "raw class-map group one byte short of its G", "E_SECTION_SIZE", 24)
    inv("x_planes_maps_zstd_size", with_planes(bs, 0, planes_bytes(sym, w, mixed, maps_group=pgroup(maps + b"\x00", 1))).build(),
        "zstd class-map group declaring G + 1 bytes", "E_SECTION_SIZE", 24)
    nofcs = zstandard.ZstdCompressor(level=3, write_content_size=False).compress(maps)
    inv("x_planes_maps_zstd_no_size", with_planes(bs, 0, planes_bytes(sym, w, mixed, maps_group=varint(len(nofcs)) + b"\x01" + nofcs)).build(),
        "zstd class-map group without Frame_Content_Size", "E_SECTION_SIZE", 24)
    two = ZSTD.compress(maps) + ZSTD.compress(b"x")
    inv("x_planes_maps_two_frames", with_planes(bs, 0, planes_bytes(sym, w, mixed, maps_group=varint(len(two)) + b"\x01" + two)).build(),
        "class-map group: a frame of the right size, then a second frame", "E_ZSTD", 8)
    inv("x_planes_group_codec2", with_planes(bs, 0, planes_bytes(sym, w, mixed, maps_group=varint(len(maps)) + b"\x02" + maps)).build(),
        "a group with codec 2", "E_CODEC", 7)
    inv("x_planes_group_past_end", with_planes(bs, 0, planes_bytes(sym, w, mixed, maps_group=varint(len(good)) + b"\x00" + maps)).build(),
        "a group length running past the section", "E_SECTION_CONTENT", 25)
    inv("x_planes_trailing", with_planes(bs, 0, good + b"\x00").build(), "a byte after the last group", "E_SECTION_CONTENT", 25)
    inv("x_planes_truncated", with_planes(bs, 0, good[:-1]).build(), "the last group one byte short", "E_SECTION_CONTENT", 25)
    inv("x_planes_no_lower_plane", with_planes(bs, 0, good[: len(good) - (P + len(varint(P)) + 1)]).build(),
        "the lower plane's group missing", "E_SECTION_CONTENT", 25)


def _planes_bad_maps(sym: np.ndarray, w: int, segs: list[tuple], seg_i: int, row: bool) -> bytes:
    """Codec-2 bytes whose class maps hold K in one place (the groups as for class 0 there)."""
    n, r, k, rc, cc = segs[seg_i]
    rc2, cc2 = list(rc), list(cc)
    (rc2 if row else cc2)[0] = 0
    good = [s if j != seg_i else (n, r, k, rc2, cc2) for j, s in enumerate(segs)]
    body = planes_bytes(sym, w, good)
    maps = b"".join(bytes(m[3]) + bytes(m[4]) for m in good if m[2] > 1)
    off = sum(len(m[3]) + len(m[4]) for m in good[:seg_i] if m[2] > 1) + (0 if row else len(rc2))
    bad = maps[:off] + bytes([k]) + maps[off + 1 :]
    hlen = len(varint(len(segs))) + sum(len(varint(m[0])) + len(varint(m[1])) + 1 for m in segs)
    old = pgroup(maps)
    assert body[hlen : hlen + len(old)] == old
    return body[:hlen] + pgroup(bad) + body[hlen + len(old) :]


# =============================================================================================
# Version 1.2: content digests (SPEC.md 5.4), the encoder's band (9, 12.6), mixed corrections (8.4)
# =============================================================================================

DIGESTS_FLAG, MIXED_FLAG = RequiredFlag.DIGESTS, RequiredFlag.MIXED_CORRECTIONS
V12_FLAGS = DIGESTS_FLAG | MIXED_FLAG


def meta12(scheme: str, tol: float) -> bytes:
    return meta_bytes({"format": "bbformat", "format_version": "1.2", "scheme": scheme, "tolerance": tol})


def v12(chunks: list[Chk], scheme: str = "symmetric", tol: float = 0.0, flags: int = V12_FLAGS) -> BB:
    """A minor-2 container with the given required flags (default DIGESTS and MIXED_CORRECTIONS)."""
    return BB(chunks, scheme=1 if scheme == "paper" else 2, meta=meta12(scheme, tol), hdr={"required_flags": flags, "minor": 2})


def digest_chk(enc) -> Chk:  # type: ignore[no-untyped-def]
    """An encoder's chunk whose offset 4 holds the CRC32C of the encoder's own decoding (SPEC.md 5.4)."""
    c = chk_from(enc)
    c.head["reserved0"] = content_crc(enc.program, enc.intended)
    return c


def sealed(bb: BB) -> BB:
    """bb with every chunk's content_crc set from the reference reader's decoding (for chunks
    without non-plain sites, whose values are all stored bits)."""
    x = bb.copy()
    plain = mod(x, hdr={}, meta=b"{}")
    with Reader(io.BytesIO(plain.build())) as r:
        for i, c in enumerate(x.chunks):
            ch = r.read_chunk(i)
            assert all(s.plain for s in ch.program.sites), "sealed() is for chunks of stored values"
            c.head["reserved0"] = content_crc(ch.program, r.decode_block(i).tensors)
    return x


def written(encs: list, scheme: str, tol: float) -> bytes:  # type: ignore[type-arg]
    """The reference Writer's 1.2 file of encoded chunks (Writer.add_encoded records each digest)."""
    buf = io.BytesIO()
    w = bbformat.Writer(buf, scheme, len(encs), {"format": "bbformat", "format_version": "1.2", "scheme": scheme, "tolerance": tol})
    assert w.digests and w.mixed_corrections
    for e in encs:
        w.add_encoded(e)
    w.close()
    return buf.getvalue()


def file_chunks(data: bytes) -> list[tuple[int, int]]:
    """(offset, length) of every chunk, from the index."""
    io_ = struct.unpack_from("<Q", data, len(data) - 40)[0]
    n = struct.unpack_from("<I", data, io_ + 4)[0]
    return [struct.unpack_from("<QQ", data, io_ + 8 + 24 * i) for i in range(n)]


def content_crcs(data: bytes) -> list[int]:
    return [struct.unpack_from("<I", data, off + 4)[0] for off, _ in file_chunks(data)]


def with_content_crc(data: bytes, i: int, value: int) -> bytes:
    """Chunk i's content_crc set to value, its chunk_crc, index entry crc, index_crc and
    footer_crc resealed: only the digest is wrong."""
    io_ = struct.unpack_from("<Q", data, len(data) - 40)[0]
    off, length = file_chunks(data)[i]
    d = bytearray(data)
    d[off + 4 : off + 8] = struct.pack("<I", value)
    crc = crc32c(bytes(d[off : off + length - 4]))
    d[off + length - 4 : off + length] = struct.pack("<I", crc)
    d[io_ + 8 + 24 * i + 16 : io_ + 8 + 24 * i + 20] = struct.pack("<I", crc)
    return reseal_footer(bytes(d))


def with_required_flags(data: bytes, flags: int) -> bytes:
    """The header's required_flags replaced, header_crc resealed."""
    m = struct.unpack_from("<I", data, 28)[0]
    d = patch(data, 12, struct.pack("<I", flags))
    return patch(d, 32 + m, struct.pack("<I", crc32c(d[: 32 + m])))


def site_kinds(data: bytes) -> list[dict[int, set[int]]]:
    """Per chunk: site -> the kinds of its sections."""
    out = []
    with Reader(io.BytesIO(data)) as r:
        for i in range(len(r)):
            ks: dict[int, set[int]] = {}
            for e in r.read_chunk(i).sections:
                if e["site"] != NO_SITE:
                    ks.setdefault(e["site"], set()).add(e["kind"])
            out.append(ks)
    return out


def mixed_sites(data: bytes) -> int:
    return sum(1 for ks in site_kinds(data) for k in ks.values() if {SectionKind.X_RESIDUALS, SectionKind.X_PATCHES} <= k)


def f32_site(seed: int, scheme: str, tol: float, hi: float, D: int = 16, bands: bool = False):  # type: ignore[no-untyped-def]
    """One float32 chunk (W = 32) encoded by the 1.2 encoder (band=True): src (D, D), an anchor
    (D, 2D) on axis 0 whose Gram eigenvalues are linearly spaced in [1, hi] (times scale^2; hi
    close to 1 makes them clustered, so that a second eigensolver disagrees more and the band is
    wider), and in symmetric a follower (3, D) on axis 1."""
    rng = np.random.default_rng(seed)
    ts = {"src": t(rng, (D, D), "float32"), "anchor": RawTensor.from_f64(separated(rng, 2 * D, D, 1.0, hi).T, "float32")}
    fol: tuple = ()
    if scheme == "symmetric":
        ts["follower"] = t(rng, (3, D), "float32")
        fol = (AxisRef("follower", 1),)
    lay = ChunkLayout(f"band{seed}", tuple(ts), (SiteSpec("site0", D, AxisRef("anchor", 0), fol),))
    return encode(lay, ts, scheme, tol, force=True, band=True, bands=bands)


def find_site(what: str, make: Callable, ok: Callable, seeds: range = range(1, 60)):  # type: ignore[no-untyped-def]
    for seed in seeds:
        enc = make(seed)
        if nonplain(enc) and ok(enc):
            return enc
    raise GenError(f"no seed gives {what}")


def add_v12(S: Suite) -> None:  # noqa: C901 - one list of vectors
    V = "1.2"

    # ---- the reference writer: pack (format 1.2 is its default) ---------------------------------
    packs: dict[tuple[str, str], bytes] = {}
    short = {"float16": "f16", "bfloat16": "bf16", "float32": "f32"}
    for scheme, arch, seed in (("symmetric", "llama", 21), ("paper", "opt", 22)):
        for dtype in ("float16", "bfloat16", "float32"):
            data, rep = tiny_model(arch, scheme, seed, None, dtype, layers=2, format_version="1.2")
            with Reader(io.BytesIO(data)) as r:
                assert (r.header.required_flags, r.header.minor, r.metadata["format_version"]) == (V12_FLAGS, 2, "1.2"), r.header
            assert all(content_crcs(data)), "a chunk of a tiny model with a zero content_crc"
            banded = sum(s.banded for s in rep.sites)
            nonplain_sites = sum(1 for s in rep.sites if s.plain_reason is None)
            assert nonplain_sites, (scheme, dtype)
            if (scheme, dtype) == ("symmetric", "float32"):  # W = 32: residuals pay, and the band puts a few values in x_patches
                assert mixed_sites(data) > 0, "pack's float32 symmetric model has no site with both x_residuals and x_patches"
            packs[(scheme, dtype)] = data
            S.valid(f"v_digest_pack_{'sym' if scheme == 'symmetric' else 'paper'}_{short[dtype]}", data, "§5.4, §9, §12.6",
                    f"bbformat.api.pack (format 1.2, its default) of a tiny sliced {'Llama' if arch == 'llama' else 'OPT'} model (2 layers), "
                    f"{scheme} scheme, default tolerance, {dtype}: DIGESTS and MIXED_CORRECTIONS set, every chunk's content_crc recorded; "
                    f"{nonplain_sites} non-plain sites, {banded} values stored only because they lie in the encoder's band, "
                    f"{mixed_sites(data)} sites with both x_residuals and x_patches. Any conforming reader decodes it bit-exactly", since=V)
    data, _ = tiny_model("llama", "symmetric", 5, 0.0, "float16", layers=2, format_version="1.2", entropy="planes")
    with Reader(io.BytesIO(data)) as r:
        codecs = [r.read_chunk(i).sections[0]["codec"] for i in range(len(r))]
        flags = r.header.required_flags
    assert 2 in codecs and flags == V12_FLAGS | PLANES_FLAG, (codecs, flags)
    S.valid("v_digest_pack_planes", data, "§4, §5.4, §8.6",
            f"pack --entropy planes in format 1.2 (Llama, 2 layers, float16): all three required flags set (PLANES, DIGESTS, "
            f"MIXED_CORRECTIONS); payload codecs {codecs}", since=V)

    # ---- scheme none (header code 3): chunks without sites, the entropy stage alone -------------
    import torch

    ck = tiny_checkpoint("llama", 23, "float16", layers=2)
    data, _ = tiny_model("llama", "none", 23, None, "float16", layers=2, format_version="1.2", entropy=None)
    src = {k: v.contiguous().view(torch.uint8).numpy().tobytes() for k, v in ck.state_dict.items()}
    got: dict[str, bytes] = {}
    with Reader(io.BytesIO(data)) as r:
        assert (r.header.scheme, r.header.required_flags & ~PLANES_FLAG, r.header.minor) == ("none", V12_FLAGS, 2), r.header
        flags = r.header.required_flags
        assert all(not r.read_program(i).sites for i in range(len(r))), "pack --scheme none wrote a site"
        codecs = [r.read_chunk(i).sections[0]["codec"] for i in range(len(r))]
        for i in range(len(r)):
            got.update((k, v.tobytes()) for k, v in r.decode_block(i).tensors.items())
    assert got == src, "pack --scheme none did not give back the checkpoint's bits"
    assert (2 in codecs) == bool(flags & PLANES_FLAG), (codecs, flags)
    assert len(data) < 64 << 10, len(data)
    S.valid("v_scheme_none_pack", data, "§4, §8.6, §12.2",
            f"bbformat.api.pack --scheme none (format 1.2, entropy auto, its default for the scheme) of a tiny sliced Llama "
            f"model (2 layers, float16): header scheme 3, required_flags {flags:#x}, no chunk has a site, payload codecs {codecs}; "
            f"the decoded tensors are the checkpoint's {len(src)} tensors bit for bit", eig=False, since=V)

    # ---- sites near rounding boundaries: the encoder's band ---------------------------------
    # float32 anchors with clustered Gram spectra; tolerance > 0 leaves the values that the
    # reference rounds right, and those within the band of a rounding boundary are stored.
    enc_band = find_site("a symmetric site whose only stored values are band values",
                         lambda seed: f32_site(seed, "symmetric", 1e-4, 1.001),
                         lambda e: e.reports[0].banded > 0 and e.reports[0].banded == e.reports[0].corrected
                         and [s.kind for s in e.sections] == [SectionKind.PAYLOAD, SectionKind.X_PATCHES])
    r0 = enc_band.reports[0]
    S.valid("v_band_sym_f32", written([enc_band], "symmetric", 1e-4), "§9, §12.6",
            f"a float32 symmetric site (D = 16, clustered anchor spectrum, tolerance 1e-4) whose reference results are all within "
            f"tolerance, {r0.banded} of them within the encoder's band of a float32 rounding boundary: its x_patches section holds "
            f"exactly those {r0.banded} values, which another correct reader could round the other way", since=V)
    enc_bp = find_site("a paper site with band values", lambda seed: f32_site(seed, "paper", 1e-4, 1.01),
                       lambda e: e.reports[0].banded > 0 and e.reports[0].banded == e.reports[0].corrected)
    S.valid("v_band_paper_f32", written([enc_bp], "paper", 1e-4), "§9, §12.6",
            f"a float32 PAPER site (D = 16, tolerance 1e-4): {enc_bp.reports[0].banded} regenerated block values and un-rotated anchor "
            f"elements lie within the band and are stored (x_patches, anchor_patches); nothing else needed a correction", since=V)

    # ---- MIXED_CORRECTIONS: x_residuals and x_patches on one site ---------------------------
    enc_mix = find_site("a site with x_residuals and x_patches", lambda seed: f32_site(seed, "symmetric", 1e-6, 1.001),
                        lambda e: [s.kind for s in e.sections] == [SectionKind.PAYLOAD, SectionKind.X_PATCHES, SectionKind.X_RESIDUALS] and e.reports[0].banded > 0)
    rng = np.random.default_rng(1212)
    enc_bias = encode_chunk(ChunkLayout("bias12", ("bias",)), {"bias": t(rng, (3, 4), "float32", 1.0)}, {}, "symmetric", 0.0)
    mixed_data = written([enc_mix, enc_bias], "symmetric", 1e-6)
    mbb = v12([digest_chk(enc_mix), digest_chk(enc_bias)], tol=1e-6)
    assert mbb.build() == mixed_data, "this script's byte model differs from the reference writer"
    assert mixed_sites(mixed_data) == 1
    rm = enc_mix.reports[0]
    S.valid("v_mixed_sym_f32", mixed_data, "§8.1, §8.4, §8.5",
            f"a float32 symmetric site (D = 16, clustered anchor spectrum, tolerance 1e-6, written by the reference Writer) with "
            f"x_patches holding its {rm.banded} band values and x_residuals the {rm.corrected - rm.banded} corrections beyond "
            f"tolerance, grouped over the residual positions (every position not patched); a second chunk without sites", since=V)
    x = mbb.copy()
    x.chunks[0].secs = x.chunks[0].secs[::-1]
    S.valid("v_mixed_sections_reordered", x.build(), "§8.1, §8.4",
            "the mixed site of v_mixed_sym_f32 with its section table reversed (x_residuals before x_patches, payload last): "
            "a reader applies x_patches first whatever the table order", since=V)
    S.valid("v_digest_only_flag", v12([digest_chk(enc_band)], tol=1e-4, flags=DIGESTS_FLAG).build(), "§4, §5.4",
            "v_band_sym_f32's chunk in a file with DIGESTS but not MIXED_CORRECTIONS (the site has x_patches only): valid", since=V)
    edges, empty = edge_chunks()
    S.valid("v_digest_edges", sealed(v12([edges, empty])).build(), "§5.4",
            "the chunks of shapes_edge with DIGESTS: scalars, zero-size tensors (which add no bytes to the digest), stored NaN "
            "payloads and signed zeros (digested as stored), and a chunk with no tensors, whose content_crc is 0", eig=False, since=V)

    bs = base_sym()
    S.invalid("x_scheme_3_without_digests_sites", mod(bs, scheme=3).build(), "§4",
              "header scheme 3 (none) in a 1.0 file (no DIGESTS) whose chunks have sites: scheme 3 without DIGESTS is E_SCHEME "
              "(1.5), as a 1.0/1.1 reader reports it (it was x_scheme_3, then, from 1.2 to 1.5, the optional o_scheme_3_with_sites)",
              "E_SCHEME", 6, since="1.5")

    # ---- 29 E_DIGEST ----------------------------------------------------------------------------
    S.invalid("x_digest_flag_set_crc_zero", mod(bs, hdr={"required_flags": DIGESTS_FLAG}).build(), "§4, §5.4",
              "required_flags bit 1 (DIGESTS) set, minor 0, in a file written without digests (every content_crc 0): chunk 0 "
              "decodes to tensors whose CRC32C is not 0. Rejected by 1.1 readers as E_REQUIRED_FLAG (it was x_required_flag_bit1)",
              "E_DIGEST", 29, since=V)
    x = mbb.copy()
    x.chunks[1].head["reserved0"] ^= 0x00000100
    S.invalid("x_digest_chunk1_stored_values", x.build(), "§5.4",
              "v_mixed_sym_f32 with chunk 1's content_crc (a chunk of stored values only) changed in one bit, every CRC resealed: "
              "chunk 0 verifies, chunk 1 does not, whatever the reader's arithmetic", "E_DIGEST", 29, since=V)
    x = mbb.copy()
    pay = bytearray(x.chunks[1].secs[0].stored)
    pay[0] ^= 0x01
    x.chunks[1].secs[0] = raw_sec(SectionKind.PAYLOAD, NO_SITE, bytes(pay))
    S.invalid("x_digest_payload_changed", x.build(), "§5.4",
              "v_mixed_sym_f32 with the lowest bit of chunk 1's first float32 value flipped and chunk_crc (and the index) resealed: "
              "the CRCs hold, the decoded values miss the recorded digest", "E_DIGEST", 29, since=V)
    data = packs[("symmetric", "float16")]
    with Reader(io.BytesIO(data)) as r:
        target = next(i for i in range(len(r)) if any(not s.plain for s in r.read_chunk(i).program.sites))
    S.invalid("x_digest_pack_site_chunk", with_content_crc(data, target, content_crcs(data)[target] ^ 0x80000000), "§5.4",
              f"v_digest_pack_sym_f16 with the content_crc of chunk {target} (the first with a non-plain site) changed in its top "
              "bit; chunk_crc, the index entry, index_crc and footer_crc resealed", "E_DIGEST", 29, since=V)
    S.invalid("x_digest_empty_chunk_nonzero", v12([Chk(program_rec("", 1, [], [], []), [raw_sec(SectionKind.PAYLOAD, NO_SITE, b"")],
                                                      head={"reserved0": 1})]).build(), "§5.4",
              "a chunk with no tensors whose content_crc is 1 (the digest of nothing is 0)", "E_DIGEST", 29, eig=False, since=V)

    # ---- DIGESTS and MIXED_CORRECTIONS cleared --------------------------------------------------
    assert v12([digest_chk(enc_mix), digest_chk(enc_bias)], tol=1e-6, flags=DIGESTS_FLAG).build() == with_required_flags(mixed_data, DIGESTS_FLAG)
    S.invalid("x_mixed_without_flag", with_required_flags(mixed_data, DIGESTS_FLAG), "§8.1",
              "v_mixed_sym_f32 with required_flags bit 2 (MIXED_CORRECTIONS) cleared (header_crc resealed): x_residuals and "
              "x_patches on one site", "E_SECTION_DUPLICATE", 22, since=V)
    data = packs[("symmetric", "float16")]
    S.invalid("x_digests_flag_cleared", with_required_flags(data, MIXED_FLAG), "§4, §5",
              "v_digest_pack_sym_f16 with required_flags bit 1 (DIGESTS) cleared (header_crc resealed): each chunk's offset 4 is "
              "reserved again and holds a non-zero content_crc", "E_RESERVED", 5, since=V)

    # ---- the residual positions of a mixed site -------------------------------------------------
    c = digest_chk(enc_mix)
    ap = approx_of(c, 0, V12_FLAGS)[0]
    from bbformat.codec.section_kinds import decode_patches, decode_residuals

    xp, xr = c.sec(SectionKind.X_PATCHES), c.sec(SectionKind.X_RESIDUALS)
    unz = lambda sec: sec.stored if sec.codec == 0 else zstandard.ZstdDecompressor().decompress(sec.stored)  # noqa: E731
    pos, _ = decode_patches(unz(xp), ap.size, 32)
    keep = np.ones(ap.size, bool)
    keep[pos] = False
    r = decode_residuals(unz(xr), ap, "float32", keep)
    assert pos.size and np.all(r[~keep] == 0)
    x = v12([c.copy(), digest_chk(enc_bias)], tol=1e-6)
    x.chunks[0].secs = [s for s in x.chunks[0].secs if s.kind != SectionKind.X_RESIDUALS] + [raw_sec(SectionKind.X_RESIDUALS, 0, residual_section(ap, "float32", r))]
    S.invalid("x_mixed_residuals_over_patched", x.build(), "§8.4",
              f"v_mixed_sym_f32 with its x_residuals rebuilt over every block position, the {pos.size} patched ones included (with "
              "residual 0): groups hold more varints than their residual positions. In a file with DIGESTS such a failure is "
              "E_DIGEST on every reader (1.5; it was E_SECTION_CONTENT, E_DIGEST allowed): the groups follow the contexts of the "
              "reader's own values", "E_DIGEST", 29, since="1.5")

    # ---- SPEC.md 8.4's edge cases (settled in 1.3; the rules are 1.2's) ---------------------------
    c0, enc0 = no_correction_chunk("symmetric", 4, 0.0)  # its reference approx is the block itself
    ap0 = approx_of(c0)[0]
    both = digest_chk(enc0)
    both.secs += [raw_sec(SectionKind.X_PATCHES, 0, b"\x00"), raw_sec(SectionKind.X_RESIDUALS, 0, residual_section(ap0, "float16"))]
    S.valid("v_mixed_patches_count0", v12([both]).build(), "§8.4, §8.5",
            "a symmetric site with an x_patches section of count 0 beside its x_residuals (all residuals 0): no position is "
            "patched, so every position is a residual position", since=V)
    every = varint(ap0.size) + bytes(ap0.size) + ap0.astype("<u2").tobytes()  # positions 0..n-1 (every gap 0), the block's values
    full = digest_chk(enc0)
    full.secs += [raw_sec(SectionKind.X_PATCHES, 0, every), raw_sec(SectionKind.X_RESIDUALS, 0, b"")]
    S.valid("v_mixed_residuals_empty", v12([full]).build(), "§8.4, §8.5",
            "a symmetric site whose x_patches lists every block position: no residual position is left, so its x_residuals "
            "section is zero groups, 0 bytes", eig=False, since=V)
    x = digest_chk(enc0)
    x.secs += [raw_sec(SectionKind.X_PATCHES, 0, every), raw_sec(SectionKind.X_RESIDUALS, 0, b"\x01\x00\x00")]
    S.invalid("x_mixed_residuals_no_positions", v12([x]).build(), "§8.4",
              "v_mixed_residuals_empty with a one-group x_residuals section (1 raw byte, a 0 varint) where no residual position "
              "is left: the section does not fill exactly zero groups. No regenerated value is involved, so it is the file's "
              "error on every reader, DIGESTS or not (1.5; E_DIGEST was allowed before)", "E_SECTION_CONTENT", 25, since="1.5")


def add_phi(S: Suite) -> None:
    """pack's site layouts for the rest of the TransformerCompression family (SPEC.md 12.1):
    Phi-2's one site per parallel block, whose anchor (dense) has an axis-0 follower that also
    writes the stream (fc2, and both biases); Phi-3's fused qkv_proj and gate_up_proj, one
    follower each. Format 1.2, pack's defaults but for the scheme."""
    V = "1.2"
    for arch, scheme, seed in (("phi2", "symmetric", 41), ("phi2", "paper", 42), ("phi3", "symmetric", 43)):
        data, rep = tiny_model(arch, scheme, seed, None, "float16", layers=2, format_version="1.2", entropy=None)
        nonplain_sites = sum(1 for s in rep.sites if s.plain_reason is None)
        with Reader(io.BytesIO(data)) as r:
            programs = [r.read_program(i) for i in range(len(r))]
        followers = max(len(s.followers) for p in programs for s in p.sites)
        assert nonplain_sites, (arch, scheme)
        what = ("Phi-2 (parallel blocks: one site per layer, anchor self_attn.dense with mlp.fc2 and both biases as axis-0 "
                "followers)" if arch == "phi2" else "Phi-3 (fused qkv_proj and gate_up_proj: one follower each)")
        S.valid(f"v_model_{arch}_{'sym' if scheme == 'symmetric' else 'paper'}", data, "§5.1, §12.1",
                f"bbformat.api.pack (format 1.2) of a tiny sliced {what}, 2 layers, float16, {scheme} scheme, default tolerance: "
                f"{len(programs)} chunks, {nonplain_sites} non-plain sites, up to {followers} followers on a site", since=V)


# =============================================================================================
# Version 1.3: payload codec 3, "exponent" (SPEC.md 8.7)
# =============================================================================================

EXPONENT_FLAG = 0x8
EXP_FIELDS = {1: (10, 5, 16), 2: (7, 8, 16), 3: (23, 8, 32)}  # symbol dtype code -> (s, e, W), SPEC.md 8.7


def exp_table(counts: dict[int, int], grain: int = 0) -> list[tuple[int, int]]:
    """A valid table for these counts, by a rule of its own (not the package's): every used
    symbol 1 + its share of the rest, the remainder to the most frequent (ties: lowest), in
    units of 2^grain (every frequency a multiple of it)."""
    used = sorted(counts)
    units = (1 << 14) >> grain
    assert len(used) <= units
    spare = units - len(used)
    n = sum(counts.values())
    f = {a: 1 + spare * counts[a] // n for a in used}
    top = max(used, key=lambda a: (counts[a], -a))
    f[top] += units - sum(f.values())
    return [(a, f[a] << grain) for a in used]


def exp_symbols(sym: np.ndarray, dtype_code: int, t: int) -> tuple[list[int], list[int], int, int, int]:
    """(codes, rest fields, code bits B, shift c, rest bits R) of symbols with t joined bits."""
    s, e, w = EXP_FIELDS[dtype_code]
    c, b = s - t, e + t
    codes = [(int(x) >> c) & ((1 << b) - 1) for x in sym]
    rests = [((int(x) >> (w - 1)) << c) | (int(x) & ((1 << c) - 1)) for x in sym]
    return codes, rests, b, c, w - b


def exp_bytes(sym: np.ndarray, dtype_code: int, t: int, segs: list[tuple[int, int, int, list[int]]], lanes: int,
              codec: Callable[[int], int] = lambda i: 0, nonminimal: bool = False,
              grain: Callable[[int, int], int] = lambda j, k: 0) -> bytes:
    """Codec-3 bytes written symbol by symbol, from SPEC.md 8.7 (independently of
    bbformat/codec/exponent.py and rans.py). segs: (n, r, K, column classes); grain(j, k): the
    frequencies of segment j's class k are multiples of 2^grain."""
    codes, rests, b, _, rb = exp_symbols(sym, dtype_code, t)
    P = len(codes)
    table_of: list[tuple[int, int]] = []  # (segment, class) of every symbol
    pos = 0
    for j, (n, r, k, cc) in enumerate(segs):
        table_of += [(j, cc[i % r] if k > 1 else 0) for i in range(n)]
        pos += n
    assert pos == P
    tables: dict[tuple[int, int], list[tuple[int, int]]] = {}
    raw_tables = b""
    for j, (n, r, k, cc) in enumerate(segs):
        for cl in range(k):
            counts: dict[int, int] = {}
            for i, key in enumerate(table_of):
                if key == (j, cl):
                    counts[codes[i]] = counts.get(codes[i], 0) + 1
            tab = exp_table(counts or {0: 1}, grain(j, cl))
            tables[(j, cl)] = tab
            raw_tables += varint(len(tab))
            prev = -1
            for a, f in tab:
                raw_tables += (varint(a - prev - 1) if not nonminimal else bytes([0x80 | (a - prev - 1) & 0x7F, (a - prev - 1) >> 7])) + varint(f)
                prev = a
    x = [1 << 16] * lanes
    words: list[int] = []
    for i in range(P - 1, -1, -1):
        tab = tables[table_of[i]]
        start = sum(f for a, f in tab if a < codes[i])
        f = dict(tab)[codes[i]]
        lane = i % lanes
        if x[lane] >= f << 18:
            words.append(x[lane] & 0xFFFF)
            x[lane] >>= 16
        x[lane] = (x[lane] // f << 14) + x[lane] % f + start
    stream = struct.pack(f"<{lanes}I", *x) + struct.pack(f"<{len(words)}H", *reversed(words))
    b0, b1 = divmod(rb, 8)
    rest = b"".join(r.to_bytes(b0, "little") for r in [v & ((1 << (8 * b0)) - 1) for v in rests]) if b0 else b""
    for g in range(-(-P // 8)):
        v = 0
        for k in range(8):
            if 8 * g + k < P:
                v |= (rests[8 * g + k] >> (8 * b0)) << (b1 * k)
        rest += v.to_bytes(b1, "little") if b1 else b""
    out = bytes([t]) + varint(len(segs)) + b"".join(varint(n) + varint(r) + bytes([k]) for n, r, k, _ in segs) + varint(lanes)
    out += pgroup(b"".join(bytes(cc) for n, r, k, cc in segs if k > 1), codec(0))
    out += varint(len(raw_tables)) + pgroup(raw_tables, codec(1))
    return out + varint(len(stream)) + stream + rest


def with_exponent(bb: BB, chunk: int, stored: bytes, flags: int = EXPONENT_FLAG, minor: int = 3) -> BB:
    return with_codec(bb, chunk, stored, 3, flags, minor)


def symbol_dtype(c: Chk) -> int:
    return int(R.DESCRIPTOR.parse(c.descriptor()).symbol_dtype)


def vint(b: bytes, off: int) -> tuple[int, int]:
    """(value, length) of the varint at b[off:]."""
    v = k = 0
    while True:
        v |= (b[off + k] & 0x7F) << (7 * k)
        k += 1
        if b[off + k - 1] < 0x80:
            return v, k


def eseg(n: int, r: int, k: int, seed: int) -> tuple[int, int, int, list[int]]:
    return (n, r, k, classes(r, seed, k)) if k > 1 else (n, r, 1, [])


def decoded_tensors(data: bytes) -> dict[str, str]:
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "v.bb"
        p.write_bytes(data)
        res = impl_python.decode_path(p)
    assert res["result"] == "accept", res
    return {n: v["sha256"] for n, v in res["tensors"].items()}


def add_exponent(S: Suite) -> None:  # noqa: C901 - one list of vectors
    V = "1.3"
    bs = base_sym()
    c0, c1 = bs.chunks[0], bs.chunks[1]
    sym, _ = payload_symbols(c0)
    d0 = symbol_dtype(c0)
    P = sym.size
    a, b, c = 100, 37, 5
    mixed = [eseg(a, 7, 4, 11), eseg(b, 1, 2, 12), eseg(c, c, 1, 0), eseg(P - a - b - c, 9, 16, 13)]
    one = [eseg(P, P, 1, 0)]
    zodd = lambda i: i % 2  # noqa: E731
    want = decoded_tensors(bs.build())  # every valid vector below decodes to the base's tensors

    def valid(vid: str, bb: BB, what: str, section: str = "§8.7") -> None:
        data = bb.build()
        assert decoded_tensors(data) == want, vid
        S.valid(vid, data, section, what, since=V)

    valid("v_exponent_one_segment", with_exponent(bs, 0, exp_bytes(sym, d0, 0, one, 1)),
          "float16 payload as codec 3: t = 0, one segment, K = 1, one lane, raw groups; the float32 chunk stays raw")
    valid("v_exponent_contexts_lanes", with_exponent(bs, 0, exp_bytes(sym, d0, 2, mixed, 7, zodd)),
          "codec 3 with 4 segments (K = 4, 2, 1, 16; row lengths 7, 1, n, 9; classes without symbols), t = 2, 7 lanes, a zstd tables group")
    valid("v_exponent_lane_per_symbol", with_exponent(bs, 0, exp_bytes(sym, d0, 1, one, P)), "codec 3 with Q = P lanes: every lane codes one symbol")
    valid("v_exponent_max_joined_f16", with_exponent(bs, 0, exp_bytes(sym, d0, 7, [eseg(P, 16, 4, 3)], 5)),
          "float16 with t = 7 (a 12-bit code, 4 rest bits: half a byte per symbol), K = 4")
    valid("v_exponent_nonminimal_varints", with_exponent(bs, 0, exp_bytes(sym, d0, 0, one, 3, nonminimal=True)),
          "codec 3 whose table gaps are written as two-byte (non-minimal) varints")
    s32, _ = payload_symbols(c1)
    d1 = symbol_dtype(c1)
    assert EXP_FIELDS[d1][2] == 32
    for t in (0, 3, 4):
        valid(f"v_exponent_float32_t{t}", with_exponent(bs, 1, exp_bytes(s32, d1, t, [eseg(s32.size, 4, 2, 21)], 2)),
              f"codec 3 on a float32 chunk, t = {t} ({24 - t} rest bits: {(24 - t) // 8} bytes and {(24 - t) % 8} packed bits per symbol), K = 2")
    both = with_exponent(bs, 0, exp_bytes(sym, d0, 2, mixed, 4))
    both.chunks[1].sec(SectionKind.PAYLOAD).stored = exp_bytes(s32, d1, 1, [eseg(s32.size, 3, 1, 0)], 1)
    both.chunks[1].sec(SectionKind.PAYLOAD).codec = 3
    valid("v_exponent_both_chunks", both, "codec 3 in both chunks of a file")
    mixed_codecs = with_exponent(bs, 1, exp_bytes(s32, d1, 2, [eseg(s32.size, 12, 1, 0)], 1), flags=0x9)
    mixed_codecs.chunks[0].sec(SectionKind.PAYLOAD).stored = planes_bytes(sym, 16, [seg(P, P, 1, 0)])
    mixed_codecs.chunks[0].sec(SectionKind.PAYLOAD).codec = 2
    valid("v_exponent_and_planes", mixed_codecs, "codec 2 in chunk 0 and codec 3 in chunk 1 of a file with PLANES and EXPONENT")
    bf = base_bf16_sym()
    sb, _ = payload_symbols(bf.chunks[0])
    db = symbol_dtype(bf.chunks[0])
    assert EXP_FIELDS[db] == (7, 8, 16)
    for t in (0, 1, 4):
        data = with_exponent(bf, 0, exp_bytes(sb, db, t, [eseg(sb.size, 16, 4, 31)], 3)).build()
        assert decoded_tensors(data) == decoded_tensors(bf.build())
        S.valid(f"v_exponent_bfloat16_t{t}", data, "§8.7", f"codec 3 on a bfloat16 chunk with a non-plain site, t = {t}, K = 4", since=V)
    bp = base_paper()
    sp, _ = payload_symbols(bp.chunks[0])
    dp = symbol_dtype(bp.chunks[0])
    data = with_exponent(bp, 0, exp_bytes(sp, dp, 2, [eseg(sp.size // 2, 12, 2, 41), eseg(sp.size - sp.size // 2, 5, 1, 0)], 2)).build()
    assert decoded_tensors(data) == decoded_tensors(bp.build())
    S.valid("v_exponent_paper", data, "§8.7", "codec 3 on a PAPER chunk (signs, x_patches, anchor_patches)", since=V)
    S.valid("v_exponent_flag_minor0", mod(bs, hdr={"required_flags": EXPONENT_FLAG}).build(), "§4",
            "required_flags bit 3 (EXPONENT) set, minor 0, no codec-3 payload: rejected by 1.2 readers (it was x_required_flag_bit3), "
            "accepted since 1.3", since=V)
    S.valid("v_exponent_flag_planes_unused", with_planes(bs, 0, planes_bytes(sym, 16, [seg(P, P, 1, 0)]), flags=0x9).build(), "§4",
            "required_flags PLANES and EXPONENT, a codec-2 payload and no codec-3 one (it was x_required_flag_planes_and_bit3)", since=V)
    for mode in ("exponent", "auto"):
        data, codecs = writer_file(6, mode, "1.3", "bfloat16")
        assert 3 in codecs, codecs
        S.valid(f"v_exponent_writer_{mode}", data, "§8.7",
                f"the reference writer, pack --entropy {mode} (Llama, bfloat16, 2 layers, format 1.3); payload codecs {codecs}", since=V)

    # frequencies sharing a power-of-two factor (8.7, informative: a decoder may look entries up by groups of slots)
    valid("v_exponent_table_grain2", with_exponent(bs, 0, exp_bytes(sym, d0, 2, mixed, P, grain=lambda j, k: 2)),
          "codec 3 whose frequencies are all multiples of 4 (as the reference writer's since 2026-11-27), 4 segments, Q = P lanes")
    valid("v_exponent_table_grains_mixed", with_exponent(bs, 0, exp_bytes(sym, d0, 2, mixed, 7, grain=lambda j, k: (2, 0, 3, 5)[(j + k) % 4])),
          "codec 3 whose tables' frequencies are multiples of 4, 1, 8 or 32 by segment and class, mixed within each segment")
    data = with_exponent(bf, 0, exp_bytes(sb, db, 2, [eseg(sb.size, 16, 4, 31)], sb.size, grain=lambda j, k: 2)).build()
    assert decoded_tensors(data) == decoded_tensors(bf.build())
    S.valid("v_exponent_bfloat16_grain2", data, "§8.7", "codec 3 on a bfloat16 chunk with a non-plain site, t = 2, K = 4, every frequency a multiple of 4", since=V)
    data, codecs = writer_file(6, "auto", "1.3", "bfloat16", grain=2)
    assert 3 in codecs, codecs
    S.valid("v_exponent_writer_grain2", data, "§8.7",
            f"the reference writer since 2026-11-27 (codec-3 frequencies multiples of 4), pack --entropy auto (Llama, bfloat16, 2 layers, format 1.3); "
            f"payload codecs {codecs}", since=V)

    def inv(vid: str, data: bytes, what: str, code: str = "E_SECTION_CONTENT", rule: int = 25, section: str = "§8.7") -> None:
        S.invalid(vid, data, section, what, code, rule, since=V)

    good = exp_bytes(sym, d0, 2, mixed, 7)
    inv("x_exponent_without_flag", with_exponent(bs, 0, good, flags=0, minor=0).build(), "codec 3 payload in a file without required flags",
        "E_CODEC", 7)
    inv("x_exponent_planes_flag_only", with_exponent(bs, 0, good, flags=0x1, minor=1).build(), "codec 3 payload with only PLANES set",
        "E_CODEC", 7)
    x = with_exponent(bs, 0, good)
    x.chunks[0].sec(SectionKind.X_RESIDUALS).codec = 3
    inv("x_exponent_on_residuals", x.build(), "codec 3 on an x_residuals section", "E_CODEC", 7)
    x = with_exponent(bs, 0, good)
    x.chunks[0].sec(SectionKind.PAYLOAD).codec = 4
    inv("x_exponent_section_codec4", x.build(), "section codec 4 with EXPONENT set", "E_CODEC", 7)
    for bit in (4, 31):  # rejected since 1.0; bit 4 is BANDS since 1.4, still rejected here: BANDS without DIGESTS
        S.invalid(f"x_required_flag_bit{bit}", mod(bs, hdr={"required_flags": 1 << bit}).build(), "§4",
                  f"required_flags bit {bit} set" + (" (BANDS since 1.4: without DIGESTS, still E_REQUIRED_FLAG)" if bit == 4 else ""),
                  "E_REQUIRED_FLAG", 4)
    S.invalid("x_required_flag_planes_and_bit4", with_planes(bs, 0, planes_bytes(sym, 16, [seg(P, P, 1, 0)]), flags=0x11).build(), "§4",
              "required_flags PLANES and bit 4 set (BANDS since 1.4: without DIGESTS, still E_REQUIRED_FLAG)", "E_REQUIRED_FLAG", 4,
              since="1.1")

    small = exp_bytes(sym, d0, 0, one, 2)  # t | N=1 | n r K | Q | maps | T | tables | S | stream | rest
    head_len = 1 + len(varint(1) + varint(P) + varint(P) + b"\x01")
    assert small[head_len] == 2

    def at(data: bytes, off: int, new: bytes, drop: int = 1) -> bytes:
        return data[:off] + new + data[off + drop :]

    def ex(data: bytes) -> bytes:
        return with_exponent(bs, 0, data).build()

    inv("x_exponent_joined_over", ex(at(small, 0, bytes([8]))), "t = 8 for float16 (at most min(10, 12 - 5) = 7)")
    inv("x_exponent_segments_0", ex(at(small, 1, varint(0))), "segment_count 0")
    inv("x_exponent_segments_65537", ex(bytes([0]) + varint(65537)), "segment_count 65,537 (over the limit, checked first)", "E_LIMIT_COUNT", 27)
    inv("x_exponent_seglen_over", ex(at(small, 1, varint(1) + varint(P + 1) + varint(P) + b"\x01", head_len - 1)), "a segment longer than P")
    inv("x_exponent_cover", ex(at(small, 1, varint(1) + varint(P - 1) + varint(P - 1) + b"\x01", head_len - 1)), "segments covering P - 1 symbols")
    inv("x_exponent_rowlen_0", ex(at(small, 1, varint(1) + varint(P) + varint(0) + b"\x01", head_len - 1)), "row_length 0")
    inv("x_exponent_classes_17", ex(at(small, 1, varint(1) + varint(P) + varint(P) + b"\x11", head_len - 1)), "K = 17")
    many = bytes([0]) + varint(65) + b"".join(varint(1) + varint(1) + b"\x10" for _ in range(64)) + varint(P - 64) + varint(1) + b"\x10"
    inv("x_exponent_tables_1040", ex(many + varint(1)), "65 segments with K = 16: 1,040 tables, over 1,024", "E_LIMIT_COUNT", 27)
    inv("x_exponent_lanes_0", ex(at(small, head_len, varint(0))), "lanes Q = 0")
    inv("x_exponent_lanes_over_p", ex(at(small, head_len, varint(P + 1))), f"lanes Q = P + 1 = {P + 1}")
    # the class maps group of `good`: one byte class >= K
    gm = exp_bytes(sym, d0, 2, [eseg(P, 9, 4, 5)], 7)
    gh = 1 + len(varint(1) + varint(P) + varint(9) + b"\x04") + 1  # t, records, Q (one byte)
    assert gm[gh : gh + 2] == varint(9) + b"\x00"
    inv("x_exponent_class_ge_k", ex(at(gm, gh + 2 + 4, b"\x04")), "column class 4 with K = 4")
    inv("x_exponent_maps_group_size", ex(gm[:gh] + varint(10) + b"\x00" + gm[gh + 2 : gh + 11] + b"\x00" + gm[gh + 11 :]),
        "class-map group of 10 raw bytes where G = 9", "E_SECTION_SIZE", 24)
    inv("x_exponent_maps_group_codec2", ex(at(gm, gh + 1, b"\x02")), "class-map group codec 2", "E_CODEC", 7)
    # tables: the small payload's (one table) at offset tl
    tl = head_len + 1 + 2  # Q, empty maps group 00 00
    tlen = small[tl]
    assert tlen < 0x80 and small[tl + 1] == tlen and small[tl + 2] == 0  # T, group L = T, raw
    tables = small[tl + 3 : tl + 3 + tlen]
    after = small[tl + 3 + tlen :]

    def with_tables(raw: bytes, declared: int | None = None) -> bytes:
        return small[:tl] + varint(len(raw) if declared is None else declared) + varint(len(raw)) + b"\x00" + raw + after

    bound = 1 * 10 * (1 + 2 * 32)
    inv("x_exponent_tables_length_over", ex(small[:tl] + varint(bound + 1) + b"\x00"), f"tables_length {bound + 1} over (sum K) * 10 * (1 + 2 * 2^B)")
    inv("x_exponent_tables_group_size", ex(with_tables(tables, tlen + 1)), "tables group of T - 1 bytes", "E_SECTION_SIZE", 24)
    m = tables[0]
    inv("x_exponent_table_count_0", ex(with_tables(b"\x00" + tables[1:])), "a table with 0 entries")
    inv("x_exponent_table_count_over", ex(with_tables(varint(33) + tables[1:])), "a table with 33 entries for a 5-bit code")
    inv("x_exponent_table_short", ex(with_tables(varint(m + 1) + tables[1:])), "a table with one entry more than its bytes hold")
    inv("x_exponent_table_gap_over", ex(with_tables(tables[:1] + varint(32) + tables[2:])), "a first gap of 32 (symbol 32 for a 5-bit code)")
    _, g0 = vint(tables, 1)
    _, f0 = vint(tables, 1 + g0)
    inv("x_exponent_table_freq_0", ex(with_tables(tables[: 1 + g0] + b"\x00" + tables[1 + g0 + f0 :])), "a frequency of 0")
    inv("x_exponent_table_sum", ex(with_tables(tables[:-1] + bytes([tables[-1] ^ 1]))), "frequencies not summing to 2^14")
    inv("x_exponent_tables_trailing", ex(with_tables(tables + b"\x00")), "a byte after the last table")
    so = tl + 3 + tlen  # stream_length
    sv, sl = vint(small, so)
    stream = small[so + sl : so + sl + sv]
    rest = small[so + sl + sv :]

    def with_stream(st: bytes, declared: int | None = None, tail: bytes | None = None) -> bytes:
        return small[:so] + varint(len(st) if declared is None else declared) + st + (rest if tail is None else tail)

    inv("x_exponent_stream_length_over", ex(with_stream(stream, 4 * 2 + 2 * P + 2)), "stream_length over 4Q + 2P")
    inv("x_exponent_stream_past_section", ex(small[:so] + varint(sv) + stream[: sv - 3]), "a stream running past the section")
    inv("x_exponent_stream_short", ex(with_stream(stream[:6], tail=b"")), "a stream shorter than its 2 lanes' states")
    inv("x_exponent_stream_odd", ex(with_stream(stream + b"\x00")), "a stream with half a word")
    inv("x_exponent_state_low", ex(with_stream(struct.pack("<I", 0xFFFF) + stream[4:])), "a lane starting at 2^16 - 1")
    inv("x_exponent_words_left", ex(with_stream(stream + b"\x00\x00")), "a word left over after the last symbol")
    inv("x_exponent_stream_ends_early", ex(with_stream(stream[:-2])), "a stream one word short")
    st = bytearray(stream)
    st[0] ^= 0x01
    inv("x_exponent_final_state", ex(with_stream(bytes(st))), "lane 0's state changed: the lane does not end at 2^16")
    inv("x_exponent_rest_short", ex(small[:-1]), "the rest one byte short")
    inv("x_exponent_trailing", ex(small + b"\x00"), "a byte after the rest")
    assert s32.size % 8  # the float32 chunk: t = 3 leaves 21 rest bits, 5 of them packed, with padding fields in the last group
    pad = exp_bytes(s32, d1, 3, [eseg(s32.size, 4, 1, 0)], 1)
    assert decoded_tensors(with_exponent(bs, 1, pad).build()) == want
    inv("x_exponent_rest_padding", with_exponent(bs, 1, pad[:-1] + bytes([pad[-1] | 0x80])).build(),
        f"float32 chunk, t = 3: a non-zero padding field after its last symbol ({s32.size} symbols)")
    inv("x_exponent_table_freq_over", ex(with_tables(tables[: 1 + g0] + varint(2**14 + 1) + tables[1 + g0 + f0 :])),
        "a frequency of 2^14 + 1")
    two = varint(2) + varint(20) + varint(2**13) + varint(20) + varint(2**13)  # codes 20 and 41: each gap < 32, the code not
    inv("x_exponent_table_code_over", ex(with_tables(two)), "a table whose gaps are each < 2^B = 32 but whose second code is 41")
    zt = zstandard.ZstdCompressor(write_content_size=False).compress(tables)
    inv("x_exponent_tables_zstd_no_size", ex(small[:tl] + varint(tlen) + varint(len(zt)) + b"\x01" + zt + after),
        "a zstd tables group whose frame declares no content size", "E_SECTION_SIZE", 24)
    over = bytes([0]) + varint(65) + b"".join(varint(1) + varint(1) + b"\x10" for _ in range(65))
    inv("x_exponent_tables_over_and_cover", ex(over + varint(1)),
        "65 segments with K = 16 (1,040 tables) that do not cover P: the cover is checked first")
    bad_both = at(gm, gh + 2 + 4, b"\x04")
    tpos = gh + 2 + 9  # tables_length, then the tables group: its codec byte made 2
    _, tlen_len = vint(bad_both, tpos)
    _, glen_len = vint(bad_both, tpos + tlen_len)
    bad_both = at(bad_both, tpos + tlen_len + glen_len, b"\x02")
    inv("x_exponent_class_and_tables", ex(bad_both), "a column class >= K and a tables group of codec 2: the classes are checked first")


BANDS_FLAG = RequiredFlag.BANDS
V14_FLAGS = V12_FLAGS | BANDS_FLAG


def v14(chunks: list[Chk], scheme: str = "symmetric", tol: float = 0.0, flags: int = V14_FLAGS) -> BB:
    """A minor-4 container (default flags DIGESTS, MIXED_CORRECTIONS and BANDS), as the reference Writer writes it."""
    meta = meta_bytes({"format": "bbformat", "format_version": "1.4", "scheme": scheme, "tolerance": tol})
    return BB(chunks, scheme=1 if scheme == "paper" else 2, meta=meta, hdr={"required_flags": flags, "minor": 4})


def written14(encs: list, scheme: str, tol: float) -> bytes:  # type: ignore[type-arg]
    """The reference Writer's 1.4 file of encoded chunks (their band sections included)."""
    buf = io.BytesIO()
    w = bbformat.Writer(buf, scheme, len(encs), {"format": "bbformat", "format_version": "1.4", "scheme": scheme, "tolerance": tol},
                        format_version="1.4")
    assert w.bands
    for e in encs:
        w.add_encoded(e)
    w.close()
    return buf.getvalue()


def file_margin(data: bytes) -> float:
    """The reference reader's smallest band margin over a 1.4 file (SPEC.md 9 item 7)."""
    with Reader(io.BytesIO(data), margins=True) as r:
        margins = [b.margin for b in r.iter_blocks() if b.margin is not None]
    assert margins, "no band margin"
    return min(margins)


def add_v14(S: Suite) -> None:  # noqa: C901 - one list of vectors
    V = "1.4"
    short = {"float16": "f16", "bfloat16": "bf16", "float32": "f32"}
    for scheme, arch, seed, dtypes in (("symmetric", "llama", 21, ("float16", "bfloat16", "float32")), ("paper", "opt", 22, ("float16", "float32"))):
        for dtype in dtypes:
            data, rep = tiny_model(arch, scheme, seed, None, dtype, layers=2, format_version="1.4")
            with Reader(io.BytesIO(data)) as r:
                assert (r.header.required_flags, r.header.minor, r.metadata["format_version"]) == (V14_FLAGS, 4, "1.4"), r.header
            rotated = sum(1 for s in rep.sites if s.plain_reason is None)
            banded = sum(1 for ks in site_kinds(data) for kinds in ks.values() if SectionKind.BAND in kinds)
            assert rotated and banded == rotated, (scheme, dtype, rotated, banded)
            m = file_margin(data)
            assert m > 1, m
            S.valid(f"v_bands_pack_{'sym' if scheme == 'symmetric' else 'paper'}_{short[dtype]}", data, "§8.8, §9, §12.6",
                    f"bbformat.api.pack (format 1.4, its default) of a tiny sliced {'Llama' if arch == 'llama' else 'OPT'} model "
                    f"(2 layers), {scheme} scheme, {dtype}: BANDS set, a band section on each of its {rotated} non-plain sites; "
                    f"the reference reader's smallest margin is {m:.4g} (> 1 by construction)", since=V)

    enc_s = find_site("a symmetric site with band values", lambda seed: f32_site(seed, "symmetric", 1e-4, 1.001, bands=True),
                      lambda e: e.reports[0].banded > 0)
    enc_p = find_site("a paper site with band values", lambda seed: f32_site(seed, "paper", 1e-4, 1.01, bands=True),
                      lambda e: e.reports[0].banded > 0)
    sym = v14([digest_chk(enc_s)], "symmetric", 1e-4)
    pap = v14([digest_chk(enc_p)], "paper", 1e-4)
    assert sym.build() == written14([enc_s], "symmetric", 1e-4) and pap.build() == written14([enc_p], "paper", 1e-4), \
        "this script's byte model differs from the reference writer"
    ws = np.frombuffer(sym.chunks[0].sec(SectionKind.BAND).stored, "<f8")
    wp = np.frombuffer(pap.chunks[0].sec(SectionKind.BAND).stored, "<f8")
    assert ws.size == 1 and wp.size == 3
    S.valid("v_bands_sym_f32", sym.build(), "§8.8, §9",
            f"v_band_sym_f32's kind of site (float32, D = 16, clustered spectrum, tolerance 1e-4) written by the 1.4 encoder: "
            f"{enc_s.reports[0].banded} band values in x_patches and a band section holding δ_x = {ws[0]:.6g}; reference margin "
            f"{file_margin(sym.build()):.4g}", since=V)
    S.valid("v_bands_paper_f32", pap.build(), "§8.8, §9",
            f"a float32 PAPER site (D = 16, tolerance 1e-4) written by the 1.4 encoder: a 24-byte band section (δ_x, δ_a, δ_c = "
            f"{', '.join(f'{w:.6g}' for w in wp)}); reference margin {file_margin(pap.build()):.4g}", since=V)

    def band_bytes(*w: float) -> bytes:
        return struct.pack(f"<{len(w)}d", *w)

    def with_band(bb: BB, data: bytes, codec: int = 0) -> BB:
        x = bb.copy()
        sec = x.chunks[0].sec(SectionKind.BAND)
        sec.stored, sec.decoded_length, sec.codec = (data, len(data), 0) if codec == 0 else (ZSTD.compress(data), len(data), 1)
        return x

    want = decoded_tensors(sym.build())
    odd = with_band(sym, band_bytes(2.0 ** -1074)).build()
    assert decoded_tensors(odd) == want
    S.valid("v_bands_width_tiny", odd, "§8.8", "v_bands_sym_f32 with δ_x the smallest subnormal float64 (finite and > 0: valid; "
            "decoding does not use the widths, so the tensors are v_bands_sym_f32's; the margin is then huge)", since=V)
    flagged = sealed(v14([edge_chunks()[0]])).build()
    S.valid("v_bands_flag_no_sites", flagged, "§4, §8.8", "BANDS set in a file whose one chunk has no sites: no band section is needed",
            eig=False, since=V)

    def inv(vid: str, data: bytes, what: str, code: str, rule: int) -> None:
        S.invalid(vid, data, "§8.8", what, code, rule, since=V)

    for name, w in (("zero", 0.0), ("negative_zero", -0.0), ("negative", -1e-12), ("nan", float("nan")), ("inf", float("inf"))):
        inv(f"x_band_width_{name}", with_band(sym, band_bytes(w)).build(), f"v_bands_sym_f32 with δ_x = {w}", "E_SECTION_CONTENT", 25)
    inv("x_band_width_paper_third_zero", with_band(pap, band_bytes(wp[0], wp[1], 0.0)).build(),
        "v_bands_paper_f32 with δ_c = 0 (the other two as written)", "E_SECTION_CONTENT", 25)
    inv("x_band_size_paper_8", with_band(pap, band_bytes(wp[0])).build(), "a PAPER site's band section of 8 bytes (24 needed)",
        "E_SECTION_SIZE", 24)
    inv("x_band_size_sym_24", with_band(sym, band_bytes(ws[0], ws[0], ws[0])).build(), "a symmetric site's band section of 24 bytes "
        "(8 needed)", "E_SECTION_SIZE", 24)
    inv("x_band_zstd", with_band(sym, band_bytes(ws[0]), codec=1).build(), "the band section stored as zstd (raw only)", "E_CODEC", 7)
    x = sym.copy()
    x.chunks[0].secs = [c for c in x.chunks[0].secs if c.kind != SectionKind.BAND]
    inv("x_band_missing", x.build(), "v_bands_sym_f32 without its band section (BANDS set)", "E_SECTION_MISSING", 23)
    x = sym.copy()
    x.chunks[0].secs.append(copy.deepcopy(x.chunks[0].sec(SectionKind.BAND)))
    inv("x_band_duplicate", x.build(), "two band sections for one site", "E_SECTION_DUPLICATE", 22)
    x = sym.copy()
    x.hdr["required_flags"] = V12_FLAGS
    inv("x_band_without_flag", x.build(), "v_bands_sym_f32 in a file without BANDS: kind 6 is unknown there", "E_SECTION_KIND", 21)
    for vid, site, what in (("x_band_site_out_of_range", 1, "site 1 of a chunk with one site"),
                            ("x_band_no_site", NO_SITE, "the payload's site field 0xFFFFFFFF")):
        x = sym.copy()
        extra = copy.deepcopy(x.chunks[0].sec(SectionKind.BAND))
        extra.site = site
        x.chunks[0].secs.append(extra)  # site 0 keeps its own band section
        inv(vid, x.build(), f"a second band section naming {what}", "E_SECTION_KIND", 21)
    x = sym.copy()
    sec = x.chunks[0].sec(SectionKind.BAND)
    sec.stored, sec.codec = ZSTD.compress(sec.stored), 1
    x.hdr["required_flags"] = V12_FLAGS
    inv("x_band_zstd_without_flag", x.build(), "a zstd band section in a file without BANDS: the unknown kind is reported "
        "before the codec", "E_SECTION_KIND", 21)
    x = mod(sym, hdr={"required_flags": MIXED_FLAG | BANDS_FLAG, "minor": 4})
    x.chunks[0].head["reserved0"] = 0  # without DIGESTS offset 4 is reserved: only the header rule is broken
    inv("x_bands_without_digests", x.build(), "BANDS and MIXED_CORRECTIONS set without DIGESTS", "E_REQUIRED_FLAG", 4)
    x = pap.copy()
    x.chunks[0].secs = [x.chunks[0].secs[0], *x.chunks[0].secs[1:][::-1]]
    assert [c.kind for c in x.chunks[0].secs] != [c.kind for c in pap.chunks[0].secs]
    S.valid("v_bands_sections_reordered", x.build(), "§8.1, §8.8", "v_bands_paper_f32 with its site's sections in the reverse of "
            "the writer's order (band after the patches): valid, the same tensors", since=V)
    # bit 5 is PARTS since 1.5: x_required_flag_bit5 (this file with bit 5 set) became v_parts_flag_minor4, and
    # add_v15 holds the unknown-bit vector now
    S.valid("v_parts_flag_minor4", mod(sym, hdr={"required_flags": V14_FLAGS | 1 << 5, "minor": 4}).build(), "§4",
            "v_bands_sym_f32 with required_flags bit 5 (PARTS) set too and minor 4: rejected by 1.4 readers (it was "
            "x_required_flag_bit5), accepted since 1.5 (a minor alone never changes meaning)", since="1.5")


PARTS_FLAG = int(RequiredFlag.PARTS)
V15_ALL = PLANES_FLAG | EXPONENT_FLAG | PARTS_FLAG


def parts_bytes(parts: list[tuple[int, int, bytes]], count: int | None = None) -> bytes:
    """Codec-4 bytes from SPEC.md 8.9 (independently of bbformat/codec/parts.py): the part
    count, the records (codec u8, symbols, stored length), then the parts' bytes."""
    head = varint(len(parts) if count is None else count)
    head += b"".join(bytes([c]) + varint(n) + varint(len(b)) for c, n, b in parts)
    return head + b"".join(b for _, _, b in parts)


def with_parts(bb: BB, chunk: int, stored: bytes, flags: int = V15_ALL, minor: int = 5) -> BB:
    return with_codec(bb, chunk, stored, 4, flags, minor)


def written15(encs: list, scheme: str, tol: float, part_symbols: int) -> bytes:  # type: ignore[type-arg]
    """The reference Writer's 1.5 file (--entropy auto) of encoded chunks, payloads of more than
    `part_symbols` symbols cut into parts."""
    buf = io.BytesIO()
    meta = {"format": "bbformat", "format_version": "1.5", "scheme": scheme, "tolerance": tol}
    w = bbformat.Writer(buf, scheme, len(encs), meta, entropy="auto", format_version="1.5", part_symbols=part_symbols, threads=1)
    with table_grain(0):
        for e in encs:
            w.add_encoded(e)
        w.close()
    return buf.getvalue()


def add_v15(S: Suite) -> None:  # noqa: C901 - one list of vectors
    V = "1.5"
    bs = base_sym()
    c0, c1 = bs.chunks[0], bs.chunks[1]
    sym, _ = payload_symbols(c0)
    d0 = symbol_dtype(c0)
    s32, _ = payload_symbols(c1)
    d1 = symbol_dtype(c1)
    P = sym.size
    assert P > 300 and s32.size == 12
    want = decoded_tensors(bs.build())

    def raw(lo: int, hi: int, s: np.ndarray = sym) -> tuple[int, int, bytes]:
        return (0, hi - lo, s[lo:hi].tobytes())

    def zst(lo: int, hi: int, s: np.ndarray = sym) -> tuple[int, int, bytes]:
        return (1, hi - lo, ZSTD.compress(s[lo:hi].tobytes()))

    def pla(lo: int, hi: int, segs: list[tuple] | None = None) -> tuple[int, int, bytes]:
        return (2, hi - lo, planes_bytes(sym[lo:hi], 16, segs or [seg(hi - lo, hi - lo, 1, 0)]))

    def exo(lo: int, hi: int, t: int, segs: list[tuple] | None = None, lanes: int = 3, s: np.ndarray = sym, d: int = d0) -> tuple[int, int, bytes]:
        return (3, hi - lo, exp_bytes(s[lo:hi], d, t, segs or [eseg(hi - lo, hi - lo, 1, 0)], lanes))

    def valid(vid: str, bb: BB, what: str, section: str = "§8.9") -> None:
        data = bb.build()
        assert decoded_tensors(data) == want, vid
        S.valid(vid, data, section, what, since=V)

    a, b, c = 100, 220, 300
    four = [raw(0, a), zst(a, b), pla(b, c, [seg(40, 8, 4, 51), seg(c - b - 40, 5, 1, 0)]), exo(c, P, 2, [eseg(P - c, 7, 4, 52)], 5)]
    valid("v_parts_four_codecs", with_parts(bs, 0, parts_bytes(four)),
          f"the float16 payload (P = {P}) as 4 parts: raw ({a} symbols), zstd, codec 2 (two segments, K = 4 and 1), codec 3 "
          "(t = 2, K = 4, 5 lanes); PLANES, EXPONENT and PARTS set")
    valid("v_parts_raw_and_zstd_only", with_parts(bs, 0, parts_bytes([zst(0, 1), raw(1, 200), zst(200, P)]), flags=PARTS_FLAG),
          "PARTS alone (no PLANES, no EXPONENT): a zstd part of one symbol, a raw part, a zstd part")
    valid("v_parts_exponent_mid_row", with_parts(bs, 0, parts_bytes([exo(0, 163, 1, [eseg(163, 16, 4, 53)], 4),
                                                                      exo(163, P, 3, [eseg(P - 163, 16, 2, 54)], 7)])),
          "two codec-3 parts cut inside a row (163 = 10·16 + 3: a cut need not fall on a row), different t, K and lanes")
    ones = [raw(i, i + 1) for i in range(5)] + [exo(5, P, 0)]
    valid("v_parts_one_symbol_parts", with_parts(bs, 0, parts_bytes(ones)), "five raw parts of one symbol each, then one codec-3 part")
    f32 = [(3, 4, exp_bytes(s32[:4], d1, 3, [eseg(4, 2, 2, 55)], 2)), (2, 4, planes_bytes(s32[4:8], 32, [seg(4, 4, 1, 0)])),
           (0, 4, s32[8:].tobytes())]
    valid("v_parts_float32", with_parts(bs, 1, parts_bytes(f32)), "the float32 chunk's 12 symbols as codec 3 (t = 3), codec 2 and raw parts")
    both = with_parts(bs, 0, parts_bytes(four))
    both.chunks[1].sec(SectionKind.PAYLOAD).stored = parts_bytes(f32)
    both.chunks[1].sec(SectionKind.PAYLOAD).codec = 4
    valid("v_parts_both_chunks", both, "codec 4 in both chunks of a file")
    S.valid("v_parts_flag_unused", mod(bs, hdr={"required_flags": PARTS_FLAG, "minor": 5}).build(), "§4",
            "required_flags bit 5 (PARTS) set, minor 5, no codec-4 payload: rejected by 1.4 readers, accepted since 1.5", since=V)

    encs = [find_site("a rotated bfloat16 site", lambda seed: site_chunk(seed, "symmetric", 0.0, "bfloat16", D=16, rows=40,
                                                                          src_rows=30, bands=True), lambda e: True, range(131, 200))]
    data = written15(encs, "symmetric", 0.0, 200)
    with Reader(io.BytesIO(data)) as r:
        codecs = [r.read_chunk(i).sections[0]["codec"] for i in range(len(r))]
        assert r.header.minor == 5 and codecs == [4], codecs
    assert decoded_tensors(data) == decoded_tensors(written14(encs, "symmetric", 0.0))
    S.valid("v_parts_writer", data, "§8.9, §12",
            "the reference writer (format 1.5, --entropy auto, payloads cut every 200 symbols) of a bfloat16 chunk with a "
            "rotated symmetric site: its payload is codec 4; the same tensors as its 1.4 file", since=V)

    def inv(vid: str, data: bytes, what: str, code: str = "E_SECTION_CONTENT", rule: int = 25, section: str = "§8.9") -> None:
        S.invalid(vid, data, section, what, code, rule, since=V)

    good = parts_bytes(four)

    def px(stored: bytes, flags: int = V15_ALL) -> bytes:
        return with_parts(bs, 0, stored, flags=flags).build()

    inv("x_parts_without_flag", px(good, PLANES_FLAG | EXPONENT_FLAG), "codec 4 payload with PLANES and EXPONENT but not PARTS",
        "E_CODEC", 7)
    x = with_parts(bs, 0, good)
    x.chunks[0].sec(SectionKind.X_RESIDUALS).codec = 4
    inv("x_parts_on_residuals", x.build(), "codec 4 on an x_residuals section", "E_CODEC", 7)
    for n in (0, 1):
        inv(f"x_parts_count_{n}", px(parts_bytes([raw(0, P)], count=n) if n else varint(0)), f"part_count {n} (at least 2)")
    inv("x_parts_count_over_p", px(varint(P + 1)), f"part_count P + 1 = {P + 1}")
    inv("x_parts_count_65537", px(varint(65537)), "part_count 65,537 (over the limit, checked first)", "E_LIMIT_COUNT", 27)
    for code in (4, 5):
        inv(f"x_parts_part_codec_{code}", px(parts_bytes([(code, 100, sym[:100].tobytes()), raw(100, P)])),
            f"a part of codec {code}" + (" (parts inside parts)" if code == 4 else ""), "E_CODEC", 7)
    inv("x_parts_part_planes_without_flag", px(parts_bytes([pla(0, 100), raw(100, P)]), EXPONENT_FLAG | PARTS_FLAG),
        "a codec-2 part in a file without PLANES", "E_CODEC", 7)
    inv("x_parts_part_exponent_without_flag", px(parts_bytes([exo(0, 100, 0), raw(100, P)]), PLANES_FLAG | PARTS_FLAG),
        "a codec-3 part in a file without EXPONENT", "E_CODEC", 7)
    inv("x_parts_symbols_0", px(parts_bytes([(0, 0, b""), raw(0, P)])), "a part of 0 symbols")
    inv("x_parts_symbols_over", px(varint(2) + b"\x00" + varint(P + 1) + varint(2 * P + 2)), "a first part of P + 1 symbols")
    inv("x_parts_cover", px(parts_bytes([raw(0, 100), raw(100, P - 1)])), "parts holding P - 1 symbols")
    rec = parts_bytes([raw(0, 100), raw(100, P)])
    inv("x_parts_length_over", px(rec[:-1]), "the last part's bytes one short of its stored length (past the section)")
    inv("x_parts_trailing", px(rec + b"\x00"), "a byte after the last part")
    inv("x_parts_records_cut", px(varint(2) + b"\x00" + varint(100)), "the section ends inside the first record")
    inv("x_parts_raw_length", px(varint(2) + b"\x00" + varint(100) + varint(199) + b"\x00" + varint(P - 100) + varint(2 * (P - 100))
                                 + sym[:100].tobytes()[:199] + sym[100:].tobytes()),
        "a raw part of 100 symbols storing 199 bytes", "E_SECTION_SIZE", 24)
    inv("x_parts_zstd_size", px(parts_bytes([(1, 100, ZSTD.compress(sym[:99].tobytes())), raw(100, P)])),
        "a zstd part of 100 symbols whose frame declares 198 bytes", "E_SECTION_SIZE", 24)
    inv("x_parts_zstd_two_frames", px(parts_bytes([(1, 100, ZSTD.compress(sym[:100].tobytes()) + ZSTD.compress(b"")), raw(100, P)])),
        "a zstd part holding its frame and then an empty second frame", "E_ZSTD", 8)
    bad_exp = bytearray(exo(0, 100, 0)[2])
    q_at = 1 + len(varint(1) + varint(100) + varint(100)) + 1
    assert bad_exp[q_at] == 3
    bad_exp[q_at] = 0
    inv("x_parts_exponent_lanes_0", px(parts_bytes([(3, 100, bytes(bad_exp)), raw(100, P)])), "a codec-3 part with Q = 0 lanes")
    bad_planes = pla(0, 96, [seg(96, 8, 4, 56)])[2]
    maps_at = len(varint(1) + varint(96) + varint(8) + b"\x04") + 2  # the class-map group: L, codec, then the row classes
    bad_planes = bad_planes[:maps_at] + b"\x04" + bad_planes[maps_at + 1 :]
    inv("x_parts_planes_class", px(parts_bytes([(2, 96, bad_planes), raw(96, P)])), "a codec-2 part with a row class 4 where K = 4")
    heavy = bytes([0]) + varint(33) + b"".join(varint(1) + varint(1) + b"\x10" for _ in range(32)) + varint(1) + varint(1) + b"\x10"
    tables2 = [(3, 33, heavy), (3, 33, heavy), raw(66, P)]
    inv("x_parts_tables_1056", px(parts_bytes(tables2)),
        "two codec-3 parts declaring 33·16 = 528 tables each (each within 1,024 alone; 1,056 together)", "E_LIMIT_COUNT", 27)
    inv("x_parts_tables_before_parts", px(parts_bytes([(1, 30, ZSTD.compress(b"\x00" * 10)), (3, 33, heavy), (3, 33, heavy), raw(96, P)])),
        "a zstd part 0 whose frame declares the wrong size, then codec-3 parts over 1,024 tables: the tables are counted before "
        "any part is decoded", "E_LIMIT_COUNT", 27)
    size_bad = (1, 100, ZSTD.compress(sym[100:110].tobytes()))
    exp_bad = (3, 100, exo(200, 300, 1)[2] + b"\x00")
    inv("x_parts_first_failure_content", px(parts_bytes([raw(0, 100), exp_bad, size_bad, raw(300, P)])),
        "part 1 breaks §8.7 (a byte after its rest fields), part 2 §8.2 (a zstd size): the lowest-numbered failure is reported")
    exp_bad = (3, 100, exo(100, 200, 1)[2] + b"\x00")
    size_bad = (1, 100, ZSTD.compress(sym[200:210].tobytes()))
    inv("x_parts_first_failure_size", px(parts_bytes([raw(0, 100), size_bad, exp_bad, raw(300, P)])),
        "part 1 breaks §8.2 (a zstd size), part 2 §8.7: the lowest-numbered failure is reported", "E_SECTION_SIZE", 24)
    # the outside implementer's questions on §8.9 (tools/bbread-c/SPEC_NOTES.md, Version 1.5), settled in the text and here
    recs = [bytes([c]) + varint(n) + varint(len(b)) for c, n, b in four]
    recs[1] = bytes([four[1][0]]) + varint(four[1][1]) + varint(1000)  # within the bytes after it, not within those left
    recs[2] = bytes([9]) + recs[2][1:]
    claimed = varint(4) + b"".join(recs) + b"".join(b for _, _, b in four)
    assert len(claimed) - len(varint(4) + b"".join(recs[:2])) > 1000 > len(claimed) - len(varint(4) + b"".join(recs[:2])) - 200
    inv("x_parts_length_claimed", px(claimed), "part 1's stored length 1,000 fits the bytes after its record but not those left "
        "once part 0's are taken; record 2's codec 9 is never read: the bound counts the earlier parts' bytes")
    inv("x_parts_length_bound_before_raw_size", px(varint(2) + b"\x00" + varint(100) + varint(100_000)),
        "a raw part whose stored length is both past the section and not p_k·W/8: the bound is checked first")
    inv("x_parts_codec_before_symbols", px(varint(2) + bytes([9]) + varint(0) + varint(0)),
        "a first record with codec 9 and 0 symbols: the codec is checked first", "E_CODEC", 7)
    inv("x_parts_empty", px(b""), "an empty codec-4 section (no part count)")
    no_size = zstandard.ZstdCompressor(write_content_size=False).compress(sym[:100].tobytes())
    inv("x_parts_zstd_no_size", px(parts_bytes([(1, 100, no_size), raw(100, P)])), "a zstd part whose frame declares no content size",
        "E_SECTION_SIZE", 24)
    zbad = (1, 100, ZSTD.compress(sym[:90].tobytes()))
    inv("x_parts_lanes_not_leading", px(parts_bytes([zbad, raw(100, 300), (3, 100, bytes(bad_exp)), raw(400, P)])),
        "part 0 a zstd part of the wrong size, part 2 a codec-3 part with Q = 0: lanes are not a leading field, so part 0's "
        "failure is the one reported", "E_SECTION_SIZE", 24)
    short_cover = bytes([0]) + varint(33) + b"".join(varint(1) + varint(1) + b"\x10" for _ in range(33))  # 33 of 34 symbols
    inv("x_parts_cover_before_count", px(parts_bytes([(3, 33, heavy), (3, 34, short_cover), raw(67, P)])),
        "a second codec-3 part whose 33 segments (K = 16, 1,056 tables in all) cover 33 of its 34 symbols: the cover, a leading "
        "field, fails before the count is taken")
    late_bad = bytes([0]) + varint(33) + b"".join(varint(1) + varint(1) + b"\x10" for _ in range(32)) + varint(1) + varint(0) + b"\x10"
    inv("x_parts_count_after_part", px(parts_bytes([(3, 33, heavy), (3, 33, late_bad), raw(66, P)])),
        "the running count passes 1,024 at segment 31 of the second codec-3 part, whose segment 32 has row length 0: the "
        "count is taken after the part's leading fields")
    t_bad = bytes([255]) + exo(100, 200, 0)[2][1:]
    inv("x_parts_leading_before_decode", px(parts_bytes([zbad, (3, 100, t_bad), raw(200, P)])),
        "part 0 a zstd part of the wrong size, part 1 a codec-3 part with t = 255: part 1's leading field is checked before "
        "any part is decoded")
    planes0 = varint(0)
    inv("x_parts_planes_no_leading", px(parts_bytes([zbad, (2, 100, planes0), raw(200, P)])),
        "part 0 a zstd part of the wrong size, part 1 a codec-2 part with segment count 0: codec 2 has no leading fields, so "
        "part 0's failure is reported", "E_SECTION_SIZE", 24)
    # bit 6 is DTYPES since 1.6: x_required_flag_bit6 (these bytes) became v_dtypes_flag_minor5, and add_v16 holds the
    # unknown-bit vector now
    S.valid("v_dtypes_flag_minor5", mod(bs, hdr={"required_flags": V15_ALL | 1 << 6, "minor": 5}).build(), "§4",
            "required_flags PLANES, EXPONENT, PARTS and bit 6 (DTYPES) with minor 5, no dtype code above 3: rejected by 1.5 "
            "readers (it was x_required_flag_bit6), accepted since 1.6 (a minor alone never changes meaning)", since="1.6")


def add_v15_rules(S: Suite) -> None:
    """1.5's settled questions (issue 41): x_residuals that do not fit the reader's own contexts
    in a file with DIGESTS are E_DIGEST on every reader (SPEC.md 8.4); scheme 3 needs DIGESTS (§4)."""
    V = "1.5"
    bs = base_sym()
    ap0 = approx_of(bs.chunks[0])[0]
    dig = mod(bs, hdr={"required_flags": DIGESTS_FLAG, "minor": 2})
    with Reader(io.BytesIO(bs.build())) as r:  # tolerance 0: the reference decoding is the encoder's
        for i, c in enumerate(dig.chunks):
            c.head["reserved0"] = content_crc(r.read_chunk(i).program, r.decode_block(i).tensors)
    with Reader(io.BytesIO(dig.build())) as r:
        assert all(r.decode_block(i).exact for i in range(len(r)))

    def res(sec_bytes: bytes) -> bytes:
        x = dig.copy()
        x.chunks[0].secs = [x.chunks[0].secs[0], raw_sec(SectionKind.X_RESIDUALS, 0, sec_bytes)]
        return x.build()

    good = residual_section(ap0, "float16")
    groups = np.unique(residual_contexts(ap0, "float16"), return_counts=True)[1]
    r = np.zeros(ap0.size, np.int64)
    r[0] = 1 << 16
    base = ("base_sym with DIGESTS (each content_crc the reference decoding's) and its x_residuals section ")
    for vid, data, what, old in (
        ("x_digest_residual_ordinal_high", res(residual_section(ap0, "float16", r)), "moving value 0's ordinal above 2^15 - 1",
         "x_content_residual_ordinal_high"),
        ("x_digest_residual_missing_group", res(good[: -(2 + int(groups[-1]))]), "without its last group", "x_content_residual_missing_group"),
        ("x_digest_residual_bytes_after_groups", res(good + b"\x00"), "with one byte after its last group",
         "x_content_residual_bytes_after_groups"),
        ("x_digest_residual_group_codec_2", res(patch(good, 1, b"\x02")), "with group 0's codec 2", "x_codec_residual_group_2"),
    ):
        S.invalid(vid, data, "§8.4, §5.4", base + what + f": the groups follow the contexts of the reader's own regenerated values, so "
                  f"in a file with DIGESTS the failure is E_DIGEST on every reader, the reference included (without DIGESTS: {old})",
                  "E_DIGEST", 29, since=V)
    one = BB([f32_chunk(11, "bias_only")], scheme=3, meta=meta("none", 0.0))
    S.invalid("x_scheme_3_without_digests", one.build(), "§4",
              "header scheme 3 (none), chunks without sites, required_flags 0 (no DIGESTS): a writer MUST NOT write it and a reader "
              "rejects it as E_SCHEME, the code a 1.0/1.1 reader gives scheme 3", "E_SCHEME", 6, eig=False, since=V)
    ok = mod(one, hdr={"required_flags": DIGESTS_FLAG, "minor": 2})
    ok.chunks[0].head["reserved0"] = sealed(mod(one, scheme=2)).chunks[0].head["reserved0"]  # sealed reads without flags: scheme 2
    S.valid("v_scheme_3_digests_minimal", ok.build(), "§4, §5.4",
            "x_scheme_3_without_digests with DIGESTS set (minor 2) and the chunk's content_crc: valid", eig=False, since=V)


DTYPES_FLAG = int(RequiredFlag.DTYPES)
V16_FLAGS = DIGESTS_FLAG | DTYPES_FLAG
# SPEC.md 6.1's table, written out here (not taken from bbformat.constants): name -> (code, bits)
DT16 = {"float16": (1, 16), "bfloat16": (2, 16), "float32": (3, 32), "float64": (4, 64), "int8": (5, 8), "uint8": (6, 8),
        "int16": (7, 16), "uint16": (8, 16), "int32": (9, 32), "uint32": (10, 32), "int64": (11, 64), "uint64": (12, 64),
        "bool": (13, 8), "float8_e4m3fn": (14, 8), "float8_e5m2": (15, 8)}


def dt_tensor(seed: int, dtype: str, shape: tuple) -> tuple[str, tuple, bytes]:
    """(dtype, shape, little-endian element bytes) of a tensor of arbitrary bit patterns, low
    in entropy so that the entropy codecs have something to do (bool: bytes 0 and 1)."""
    n = int(np.prod(shape, dtype=np.int64)) * DT16[dtype][1] // 8
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 2, n) if dtype == "bool" else rng.integers(0, 4, n) * rng.integers(0, 64, n)
    return dtype, shape, data.astype(np.uint8).tobytes()


def dt_chunk(name: str, sym: str, tensors: dict[str, tuple[str, tuple, bytes]], sites: list[tuple] | None = None) -> Chk:
    """A chunk of these tensors pushed in order (no site takes bits back, so the payload is their
    bytes in order, SPEC.md 6.3), raw payload, content_crc of SPEC.md 5.4 in the header field."""
    recs = [(n, DT16[d][0], shape) for n, (d, shape, _) in tensors.items()]
    ops = [(OpKind.SITE, i) for i in range(len(sites or []))] + [(OpKind.PUSH, i) for i in range(len(recs))]
    data = b"".join(b for _, _, b in tensors.values())
    c = Chk(program_rec(name, DT16[sym][0], recs, sites or [], ops), [raw_sec(SectionKind.PAYLOAD, NO_SITE, data)])
    c.head["reserved0"] = crc32c(data)
    return c


def dt_file(chunks: list[Chk], flags: int = V16_FLAGS, minor: int = 6, scheme: int = 3) -> BB:
    return BB(chunks, scheme=scheme, meta=meta("none" if scheme == 3 else "symmetric", 0.0), hdr={"required_flags": flags, "minor": minor})


def dt_expected(chunks: list[dict[str, tuple[str, tuple, bytes]]]) -> dict[str, tuple[str, list, str]]:
    return {n: (d, list(shape), hashlib.sha256(b).hexdigest()) for ts in chunks for n, (d, shape, b) in ts.items()}


def add_v16(S: Suite) -> None:  # noqa: C901 - one list of vectors
    """1.6: dtype codes 4-15 and W = 8 (SPEC.md 6.1, 6.2), DTYPES (bit 6); expected tensors are the
    bytes this function made (hashed here), checked against the reference's decoding."""
    V = "1.6"

    def valid(vid: str, bb: BB, tensors: list[dict], what: str, section: str = "§6.1, §6.2") -> None:
        data = bb.build()
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "v.bb"
            path.write_bytes(data)
            res = impl_python.decode_path(path)
        assert res["result"] == "accept", (vid, res)
        got = {n: (v["dtype"], v["shape"], v["sha256"]) for n, v in res["tensors"].items()}
        assert got == dt_expected(tensors), vid
        S.valid(vid, data, section, what, eig=False, since=V)

    def inv(vid: str, data: bytes, what: str, code: str, rule: int, section: str = "§6.1, §6.2") -> None:
        S.invalid(vid, data, section, what, code, rule, eig=False, since=V)

    for k, dt in enumerate(n for n, (code, _) in DT16.items() if code > 3):
        wide = DT16[dt][1] == 64
        ts = {f"t_{dt}": dt_tensor(100 + k, dt, (3, 5))}
        valid(f"v_dtypes_{dt}", dt_file([dt_chunk("one", "uint32" if wide else dt, ts)]), [ts],
              f"one {dt} tensor of 3 x 5 elements alone in a chunk, symbol dtype "
              + ("uint32 (W = 32: two symbols an element)" if wide else f"{dt} (W = {DT16[dt][1]})") + ", raw payload")
    w8 = {"bits": dt_tensor(1, "bool", (5,)), "half": dt_tensor(2, "float16", (3, 4)), "long": dt_tensor(3, "int64", (3,)),
          "e5m2": dt_tensor(4, "float8_e5m2", (2, 3, 3)), "none": dt_tensor(5, "uint8", (0, 4)), "scalar": dt_tensor(6, "int8", ()),
          "wide": dt_tensor(7, "float64", (1, 2))}
    w16 = {"ids": dt_tensor(8, "int16", (4, 7)), "act": dt_tensor(9, "bfloat16", (6, 9)), "w32": dt_tensor(10, "float32", (5,)),
           "u64": dt_tensor(11, "uint64", (2,))}
    w32 = {"f64": dt_tensor(12, "float64", (3, 3)), "i32": dt_tensor(13, "int32", (7,)), "f32": dt_tensor(14, "float32", (2, 2))}
    c8, c16, c32 = dt_chunk("w8", "bool", w8), dt_chunk("w16", "bfloat16", w16), dt_chunk("w32", "int32", w32)
    mixed = dt_file([c8, c16, c32])
    valid("v_dtypes_mixed", mixed, [w8, w16, w32],
          "three chunks mixing new dtypes with floats: W = 8 (symbol dtype bool; bool, float16, int64, float8_e5m2, a 0-element "
          "uint8, a 0-d int8 and float64 tensors), W = 16 (symbol dtype bfloat16; int16, bfloat16, float32, uint64), W = 32 "
          "(symbol dtype int32; float64, int32, float32); 64-bit elements are 8, 4 and 2 symbols")
    p8 = b"".join(b for _, _, b in w8.values())
    sym8 = np.frombuffer(p8, np.uint8)
    n8 = sym8.size
    valid("v_dtypes_w8_zstd", with_codec(mixed, 0, ZSTD.compress(p8), 1, V16_FLAGS, 6), [w8, w16, w32],
          "v_dtypes_mixed with the W = 8 payload as one zstd frame", "§8.2")
    pl = planes_bytes(sym8, 8, [seg(20, 5, 4, 61), seg(n8 - 20, 9, 1, 0)])
    valid("v_dtypes_w8_planes", with_codec(mixed, 0, pl, 2, V16_FLAGS | PLANES_FLAG, 6), [w8, w16, w32],
          "v_dtypes_mixed with the W = 8 payload in codec 2: a top plane only (the whole symbol), no lower plane; two segments, "
          "the first with K = 4 row and column classes", "§8.6")
    parts = parts_bytes([(0, 9, sym8[:9].tobytes()), (1, 11, ZSTD.compress(sym8[9:20].tobytes())),
                         (2, n8 - 20, planes_bytes(sym8[20:], 8, [seg(n8 - 20, 4, 1, 0)]))])
    valid("v_dtypes_w8_parts", with_codec(mixed, 0, parts, 4, V16_FLAGS | PLANES_FLAG | PARTS_FLAG, 6), [w8, w16, w32],
          "v_dtypes_mixed with the W = 8 payload in codec 4: a raw, a zstd and a planes part", "§8.9")
    p16 = np.frombuffer(b"".join(b for _, _, b in w16.values()), "<u2")
    ex = exp_bytes(p16, 2, 1, [eseg(p16.size, 7, 1, 0)], 3)
    valid("v_dtypes_w16_exponent", with_codec(mixed, 1, ex, 3, V16_FLAGS | EXPONENT_FLAG, 6), [w8, w16, w32],
          "v_dtypes_mixed with the W = 16 payload (symbol dtype bfloat16) in codec 3: the symbols' fields are bfloat16's "
          "whatever the tensors they come from (int16, uint64)", "§8.7")
    f64 = {"f64": dt_tensor(15, "float64", (2, 5))}
    c64 = dt_chunk("f64_in_16", "int16", f64)
    s64 = np.frombuffer(f64["f64"][2], "<u2")
    valid("v_dtypes_float64_w16_planes", with_codec(dt_file([c64]), 0, planes_bytes(s64, 16, [seg(s64.size, 20, 1, 0)]), 2,
                                                     V16_FLAGS | PLANES_FLAG, 6), [f64],
          "a float64 tensor in a chunk of symbol dtype int16: 4 symbols an element, low half first; codec 2", "§6.2, §8.6")

    # invalid: the flag, the codes, the widths
    inv("x_dtypes_without_flag", mod(mixed, hdr={"required_flags": DIGESTS_FLAG, "minor": 2}).build(),
        "v_dtypes_mixed without DTYPES (minor 2): chunk 0's symbol dtype 13 (bool) is an unknown code, as for a 1.5 reader",
        "E_DTYPE", 19)
    inv("x_dtypes_tensor_without_flag", mod(dt_file([c16]), hdr={"required_flags": DIGESTS_FLAG, "minor": 2}).build(),
        "the W = 16 chunk of v_dtypes_mixed alone, without DTYPES: symbol dtype bfloat16 is known, tensor dtype 7 (int16) is not",
        "E_DTYPE", 19)
    x = dt_file([dt_chunk("c", "uint8", {"a": dt_tensor(20, "uint8", (4,))})])
    x.chunks[0].rec["tensors"][0]["dtype"] = 16
    inv("x_dtypes_code_16", x.build(), "a tensor of dtype code 16 in a file with DTYPES: unknown", "E_DTYPE", 19)
    inv("x_dtypes_symbol_float64", dt_file([dt_chunk("c", "float64", f64)]).build(),
        "a chunk of one float64 tensor whose symbol dtype is float64: a 64-bit symbol dtype (W = 64) is not allowed", "E_DTYPE", 19)
    inv("x_dtypes_symbol_uint64", dt_file([dt_chunk("c", "uint64", {"a": dt_tensor(21, "uint64", (3,))})]).build(),
        "a chunk of one uint64 tensor whose symbol dtype is uint64", "E_DTYPE", 19)
    inv("x_dtypes_narrower_than_symbols", dt_file([dt_chunk("c", "int16", {"a": dt_tensor(22, "int16", (2,)),
                                                                         "b": dt_tensor(23, "int8", (4,))})]).build(),
        "an int8 tensor in a chunk of symbol dtype int16 (W = 16)", "E_DTYPE", 19)
    c = dt_chunk("w16", "int16", w16)
    c.secs[0].stored, c.secs[0].codec = ex, 3
    inv("x_dtypes_exponent_int_symbols", dt_file([c], V16_FLAGS | EXPONENT_FLAG).build(),
        "the W = 16 chunk of v_dtypes_w16_exponent with symbol dtype int16 instead of bfloat16 (the same codec-3 bytes, which "
        "would decode with bfloat16's fields): codec 3 needs a float16, bfloat16 or float32 symbol dtype", "E_CODEC", 7, "§8.7")
    c = dt_chunk("w16", "uint16", w16)
    c.secs[0].stored = parts_bytes([(0, 10, p16[:10].tobytes()), (3, p16.size - 10, exp_bytes(p16[10:], 2, 0, [eseg(p16.size - 10, 7, 1, 0)], 2))])
    c.secs[0].codec = 4
    inv("x_dtypes_parts_exponent_int_symbols", dt_file([c], V16_FLAGS | EXPONENT_FLAG | PARTS_FLAG).build(),
        "a codec-4 payload of symbol dtype uint16 whose part 1 is codec 3: E_CODEC with the part's codec", "E_CODEC", 7, "§8.7, §8.9")
    anchor = {"a": dt_tensor(24, "int16", (2, 2))}
    inv("x_dtypes_site_int_anchor", dt_file([dt_chunk("c", "float16", {**anchor, "h": dt_tensor(25, "float16", (3,))},
                                                      [("s", 2, 0, 0, SiteFlag.PLAIN)])], scheme=2).build(),
        "a PLAIN site (D = 2) whose anchor is int16, symbol dtype float16: every site needs a float anchor", "E_SITE", 20, "§5.2")
    inv("x_dtypes_site_int_symbols", dt_file([dt_chunk("c", "int16", {"a": dt_tensor(26, "float16", (2, 2))},
                                                       [("s", 2, 0, 0, SiteFlag.PLAIN)])], scheme=2).build(),
        "a PLAIN site whose anchor is float16 in a chunk of symbol dtype int16: every site needs float symbols", "E_SITE", 20, "§5.2")
    inv("x_dtypes_site_w8", dt_file([dt_chunk("c", "bool", {"a": dt_tensor(27, "float16", (2, 2)), "b": dt_tensor(28, "bool", (1,))},
                                              [("s", 2, 0, 1, SiteFlag.PLAIN)])], scheme=2).build(),
        "a PLAIN site with a float16 anchor in a W = 8 chunk (symbol dtype bool)", "E_SITE", 20, "§5.2")
    inv("x_required_flag_bit7", mod(mixed, hdr={"required_flags": V16_FLAGS | 1 << 7, "minor": 6}).build(),
        "v_dtypes_mixed with required_flags bit 7 set too (unknown in 1.6)", "E_REQUIRED_FLAG", 4, "§4")
    dtypes_writer_file(S, V)


def dtypes_writer_file(S: Suite, V: str) -> None:
    """The reference Writer's own 1.6 file (--entropy auto, parts of 200 symbols)."""
    chunks = [{"emb": dt_tensor(30, "bfloat16", (40, 16)), "pos": dt_tensor(31, "int64", (40,))},
              {"mask": dt_tensor(32, "bool", (600,)), "scale": dt_tensor(33, "float8_e4m3fn", (25, 20))},
              {"big": dt_tensor(34, "uint64", (130,)), "f": dt_tensor(35, "float64", (3,))}]
    buf = io.BytesIO()
    w = bbformat.Writer(buf, "none", len(chunks), {"format": "bbformat", "format_version": "1.6", "scheme": "none", "tolerance": 0.0},
                        entropy="auto", format_version="1.6", part_symbols=200, threads=1, dtypes=True)
    for i, ts in enumerate(chunks):
        raws = {n: RawTensor(d, np.frombuffer(b, f"<u{DT16[d][1] // 8}").reshape(shape)) for n, (d, shape, b) in ts.items()}
        w.add_encoded(encode_chunk(ChunkLayout(f"c{i}", tuple(raws), ()), raws, {}, "symmetric", 0.0))
    w.close()
    data = buf.getvalue()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "v.bb"
        path.write_bytes(data)
        res = impl_python.decode_path(path)
    assert {n: (v["dtype"], v["shape"], v["sha256"]) for n, v in res["tensors"].items()} == dt_expected(chunks)
    S.valid("v_dtypes_writer_auto", data, "§6.2, §12",
            "the reference Writer's 1.6 file, --entropy auto with parts of 200 symbols: W = 16 (bfloat16 symbols, int64), W = 8 "
            "(bool symbols, float8_e4m3fn), W = 32 (uint32 symbols for uint64 and float64 tensors)", eig=False, since=V)


def add_all(S: Suite) -> None:
    add_valid(S)
    add_invalid(S)
    add_optional(S)
    add_planes(S)
    add_v12(S)
    add_phi(S)
    add_exponent(S)
    add_v14(S)
    add_v15(S)
    add_v15_rules(S)
    add_v16(S)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=HERE)
    ap.add_argument("--no-check", action="store_true", help="skip the alternative-numerics self-check")
    a = ap.parse_args(argv)
    suite = Suite(a.out, not a.no_check)
    add_all(suite)
    m = suite.finish()
    n = {c: sum(1 for v in m["vectors"] if v["category"] == c) for c in ("valid", "invalid", "optional")}
    total = sum(p.stat().st_size for p in a.out.rglob("*") if p.is_file() and p.suffix in (".bb", ".bin", ".json", ".md"))
    checked = "; ".join(v[0] for v in suite.variants) or "none (--no-check)"
    print(f"{len(m['vectors'])} vectors ({n['valid']} valid, {n['invalid']} invalid, {n['optional']} optional), "
          f"{total / 2**20:.2f} MiB; alternative numerics checked: {checked}")
    if suite.variants:
        d = suite.diffs
        print(f"values differing from the reference under alternative numerics: {len(d)}" + (f", at most {max(d):g} ulp" if d else ""))
        print("eigensolver calls through each variant: " + "; ".join(f"{k}: {n}" for k, n in suite.calls.items()))
        if not all(suite.calls.get(x[0]) for x in suite.variants):
            raise GenError(f"an alternative eigensolver was never called: {suite.calls}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

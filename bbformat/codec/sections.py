"""Side-information sections: sign bitmaps and corrections, to and from bytes."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import zstandard

from ..errors import FormatError, LimitError
from .dtypes import RawTensor, bits_of, bits_to_ordinal, ordinal_to_bits, uint_dtype
from .program import BlockProgram, SiteFix
from .varint import MAX_VARINT_BYTES, decode_varints, encode_varints, unzigzag, varint_bytes, zigzag

KIND_PAYLOAD = 1
KIND_SIGNS = 2
KIND_X_RESIDUALS = 3
KIND_X_PATCHES = 4
KIND_ANCHOR_PATCHES = 5
KIND_NAMES = {1: "payload", 2: "signs", 3: "x_residuals", 4: "x_patches", 5: "anchor_patches"}

CODEC_RAW = 0
CODEC_ZSTD = 1
ZSTD_FRAME_MAGIC = b"\x28\xb5\x2f\xfd"
ZSTD_LEVEL = 19
NO_SITE = 0xFFFFFFFF
Buffer = bytes | bytearray | memoryview  # section bytes are read through views, not copied
SECTION_ENTRY_BYTES = 32


@dataclass
class Section:
    kind: int
    site: int
    data: bytes  # decoded bytes
    codec: int = CODEC_RAW
    stored: bytes = b""

    def finish(self, allow_zstd: bool = True) -> "Section":
        """Choose the smaller of raw and zstd for storage (deterministic)."""
        self.codec, self.stored = CODEC_RAW, self.data
        if allow_zstd and len(self.data) > 64:
            z = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True, write_checksum=False)
            comp = z.compress(self.data)
            if len(comp) < len(self.data):
                self.codec, self.stored = CODEC_ZSTD, comp
        return self

    @property
    def cost(self) -> int:
        return len(self.stored) + SECTION_ENTRY_BYTES


def _patch_positions(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(positions, gaps before each) of the corrected values, as x_patches stores them."""
    pos = np.flatnonzero(mask.reshape(-1)).astype(np.int64)
    return pos, np.diff(np.concatenate(([-1], pos))) - 1


def encode_patches(mask: np.ndarray, true_bits: np.ndarray, value_bits: int) -> bytes:
    pos, gaps = _patch_positions(mask)
    vals = true_bits.reshape(-1)[pos].astype(uint_dtype(value_bits))
    return encode_varints(np.array([pos.size], np.uint64)) + encode_varints(gaps.astype(np.uint64)) + vals.tobytes()


def decode_patches(data: bytes, n_total: int, value_bits: int) -> tuple[np.ndarray, np.ndarray]:
    b = np.frombuffer(data, dtype=np.uint8)
    # the count is the first varint
    end = int(np.argmax((b & 0x80) == 0)) if b.size else -1
    if b.size == 0 or (b[end] & 0x80):
        raise FormatError("patch section has no count", "E_SECTION_CONTENT")
    count = int(decode_varints(data[: end + 1], 1)[0])
    vbytes = value_bits // 8
    if count > n_total or count * vbytes > len(data) - end - 1:
        raise FormatError("patch count exceeds the values it can correct", "E_SECTION_CONTENT")
    gap_bytes = len(data) - end - 1 - count * vbytes
    gaps = decode_varints(data[end + 1 : end + 1 + gap_bytes], count)
    pos = np.cumsum(gaps.astype(np.int64) + 1) - 1
    if count and (pos[-1] >= n_total or np.any(gaps > np.uint64(n_total))):
        raise FormatError("patch position out of range", "E_SECTION_CONTENT")
    vals = np.frombuffer(data, dtype=uint_dtype(value_bits), count=count, offset=end + 1 + gap_bytes)
    return pos, vals


EXPONENT_FIELD = {"float16": (10, 5), "bfloat16": (7, 8), "float32": (23, 8)}


def residual_contexts(approx_bits: np.ndarray, dtype: str) -> np.ndarray:
    """Context of each regenerated value: the exponent field of its rounded approximation.

    Residuals in ulps grow as the exponent shrinks, so coding each context as its own
    stream costs markedly fewer bits than one stream."""
    shift, nbits = EXPONENT_FIELD[dtype]
    return ((approx_bits.astype(np.int64) >> shift) & ((1 << nbits) - 1)).astype(np.int64)


def context_groups(approx_bits: np.ndarray, dtype: str, keep: np.ndarray | None = None) -> list[tuple[int, np.ndarray]]:
    """(context, positions in increasing order) for every context that occurs, ascending:
    one stable sort instead of a pass per context. keep: the residual positions (SPEC.md 8.4;
    a site's patched positions are not), default all."""
    if keep is not None:
        where = np.flatnonzero(keep)
        return [(c, where[pos]) for c, pos in context_groups(approx_bits.reshape(-1)[where], dtype)]
    ctx = residual_contexts(approx_bits, dtype)
    counts = np.bincount(ctx, minlength=1 << EXPONENT_FIELD[dtype][1])
    order = np.argsort(ctx.astype(np.uint8), kind="stable")  # contexts < 256: a radix sort
    ends = np.cumsum(counts)
    return [(int(c), order[ends[c] - counts[c] : ends[c]]) for c in np.flatnonzero(counts)]


class ByteCursor:
    """Reads a section's varints, bytes and groups in order; every overrun is E_SECTION_CONTENT."""

    def __init__(self, data: Buffer, what: str) -> None:
        self.data = memoryview(data)
        self.pos = 0
        self.what = what

    def varint(self, what: str) -> int:
        v = shift = 0
        end = self.pos
        while end < len(self.data) and end - self.pos < MAX_VARINT_BYTES:
            byte = self.data[end]
            v |= (byte & 0x7F) << shift
            shift += 7
            end += 1
            if not byte & 0x80:
                if v >> 64:
                    raise FormatError(f"{self.what}: {what} is 2^64 or more", "E_SECTION_CONTENT")
                self.pos = end
                return v
        raise FormatError(f"{self.what}: {what} is not a complete varint", "E_SECTION_CONTENT")

    def u8(self, what: str) -> int:
        if self.pos >= len(self.data):
            raise FormatError(f"{self.what}: {what} is missing", "E_SECTION_CONTENT")
        self.pos += 1
        return int(self.data[self.pos - 1])

    def group(self, what: str) -> tuple[int, memoryview]:
        """(codec, stored bytes) of the next group (SPEC.md 8.4, 8.6): a varint L, a codec byte
        and L bytes. The codec's value is the caller's to check."""
        length = self.varint(f"{what} length")
        codec = self.u8(f"{what} codec")
        if length > len(self.data) - self.pos:
            raise FormatError(f"{self.what}: {what} runs past the section", "E_SECTION_CONTENT")
        stored = self.data[self.pos : self.pos + length]  # a view: no copy of the group
        self.pos += length
        return codec, stored

    @property
    def done(self) -> bool:
        return self.pos == len(self.data)


def encode_group(raw: bytes, z: zstandard.ZstdCompressor, zstd_above: int = 0) -> bytes:
    """One group: varint L, codec byte, L bytes; zstd where that is smaller than raw (tried only
    for groups longer than zstd_above bytes)."""
    codec, data = CODEC_RAW, raw
    if len(raw) > zstd_above:
        comp = z.compress(raw)
        if len(comp) < len(raw):
            codec, data = CODEC_ZSTD, comp
    return encode_varints(np.array([len(data)], np.uint64)) + bytes([codec]) + data


def _residuals(mask: np.ndarray, true_bits: np.ndarray, approx_bits: np.ndarray, dtype: str) -> np.ndarray:
    width = bits_of(dtype)
    return np.where(mask, bits_to_ordinal(true_bits, width) - bits_to_ordinal(approx_bits, width), 0)


def encode_residuals(mask: np.ndarray, true_bits: np.ndarray, approx_bits: np.ndarray, dtype: str,
                     keep: np.ndarray | None = None) -> bytes:
    r = _residuals(mask, true_bits, approx_bits, dtype)
    out = []
    z = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True, write_checksum=False)
    for _, where in context_groups(approx_bits, dtype, keep):
        out.append(encode_group(encode_varints(zigzag(r[where])), z))
    return b"".join(out)


def decode_residuals(data: bytes, approx_bits: np.ndarray, dtype: str, keep: np.ndarray | None = None) -> np.ndarray:
    """The residual of every block position (0 where keep is False: a patched position)."""
    width = bits_of(dtype)
    out = np.zeros(approx_bits.size, dtype=np.int64)
    cur = ByteCursor(data, "x_residuals")
    for _, where in context_groups(approx_bits, dtype, keep):
        codec, stored = cur.group("residual group")
        limit = where.size * (3 if width == 16 else 5)
        raw: Buffer
        if codec == CODEC_RAW:
            raw = stored
            if len(raw) > limit:
                raise LimitError("residual group is larger than its values allow", "E_LIMIT_SECTION")
        else:
            if codec != CODEC_ZSTD:
                raise FormatError(f"unknown residual group codec {codec}", "E_CODEC")
            declared = frame_content_size(stored)
            if declared > limit:
                raise LimitError("residual group declares more bytes than its values allow", "E_LIMIT_SECTION")
            raw = decompress(stored, CODEC_ZSTD, declared, limit)
        out[where] = unzigzag(decode_varints(raw, where.size))
    if not cur.done:
        raise FormatError("bytes after the last residual group", "E_SECTION_CONTENT")
    return out


def count_residual_corrections(data: bytes) -> int:
    """Nonzero residuals in an X_RESIDUALS section, without decoding the site (for inspect)."""
    cur, total = ByteCursor(data, "x_residuals"), 0
    while not cur.done:
        codec, chunk = cur.group("residual group")
        raw = zstandard.ZstdDecompressor().decompress(chunk) if codec == CODEC_ZSTD else bytes(chunk)
        b = np.frombuffer(raw, np.uint8)
        n = int(np.count_nonzero((b & 0x80) == 0))
        total += int(np.count_nonzero(decode_varints(raw, n)))
    return total


def build_site_sections(program: BlockProgram, site: int, fix: SiteFix) -> list[Section]:
    s = program.sites[site]
    w = program.symbol_bits
    out: list[Section] = []
    if s.paper:
        assert fix.signs is not None
        out.append(Section(KIND_SIGNS, site, np.packbits(fix.signs, bitorder="little").tobytes()).finish(False))
    if fix.x_mask is not None and fix.x_mask.any():
        assert fix.x_true is not None and fix.x_approx is not None
        cands: list[list[Section]] = [[Section(KIND_X_PATCHES, site, encode_patches(fix.x_mask, fix.x_true, w)).finish()]]
        if not s.paper:
            cands.append(_residual_sections(program, site, fix))
        out.extend(min(cands, key=lambda secs: (sum(c.cost for c in secs), secs[-1].kind)))
    if s.paper and fix.anchor_mask is not None and fix.anchor_mask.any():
        assert fix.anchor_true is not None
        vb = bits_of(program.tensors[s.anchor].dtype)
        out.append(Section(KIND_ANCHOR_PATCHES, site, encode_patches(fix.anchor_mask, fix.anchor_true, vb)).finish())
    return out


def _residual_sections(program: BlockProgram, site: int, fix: SiteFix) -> list[Section]:
    """x_residuals, preceded by x_patches of the band's values if there are any (SPEC.md 8.4,
    MIXED_CORRECTIONS): a value in the band is stored, never given a residual."""
    assert fix.x_mask is not None and fix.x_true is not None and fix.x_approx is not None
    band = fix.x_band if fix.x_band is not None and fix.x_band.any() else None
    out = []
    if band is not None:
        out.append(Section(KIND_X_PATCHES, site, encode_patches(band, fix.x_true, program.symbol_bits)).finish())
    keep = None if band is None else ~band
    res = encode_residuals(fix.x_mask, fix.x_true, fix.x_approx, program.symbol_dtype, keep)
    return [*out, Section(KIND_X_RESIDUALS, site, res).finish(False)]


def side_cost_bound(program: BlockProgram, site: int, fix: SiteFix) -> int:
    """An upper bound on sum(c.cost for c in build_site_sections(program, site, fix)) that
    compresses nothing: every section and group stored raw. The encoder decides with it
    that a site pays for itself, and leaves the zstd work for later (EncodedChunk.finish)."""
    s = program.sites[site]
    w = program.symbol_bits
    total = 0
    if s.paper:
        total += (s.dim + 7) // 8 + SECTION_ENTRY_BYTES
    if fix.x_mask is not None and fix.x_mask.any():
        assert fix.x_true is not None and fix.x_approx is not None
        cands = [_patches_bytes(fix.x_mask, w)]
        if not s.paper:
            r = _residuals(fix.x_mask, fix.x_true, fix.x_approx, program.symbol_dtype)
            band = fix.x_band if fix.x_band is not None and fix.x_band.any() else None
            raw = 0 if band is None else _patches_bytes(band, w) + SECTION_ENTRY_BYTES
            for _, where in context_groups(fix.x_approx, program.symbol_dtype, None if band is None else ~band):
                n = varint_bytes(zigzag(r[where]))
                raw += varint_bytes(np.array([n], np.uint64)) + 1 + n
            cands.append(raw)
        total += min(cands) + SECTION_ENTRY_BYTES
    if s.paper and fix.anchor_mask is not None and fix.anchor_mask.any():
        total += _patches_bytes(fix.anchor_mask, bits_of(program.tensors[s.anchor].dtype)) + SECTION_ENTRY_BYTES
    return total


def _patches_bytes(mask: np.ndarray, value_bits: int) -> int:
    """len(encode_patches(mask, ..., value_bits))."""
    pos, gaps = _patch_positions(mask)
    return varint_bytes(np.array([pos.size], np.uint64)) + varint_bytes(gaps.astype(np.uint64)) + pos.size * (value_bits // 8)


def decoded_limit(program: BlockProgram, kind: int, site: int) -> int:
    """The largest decoded size a section of this kind may declare (SPEC.md 5.4)."""
    w = program.symbol_bits
    if kind == KIND_PAYLOAD:
        return program.payload_symbols() * (w // 8)
    s = program.sites[site]
    if kind == KIND_SIGNS:
        return (s.dim + 7) // 8
    if kind == KIND_X_RESIDUALS:
        return (1 << EXPONENT_FIELD[program.symbol_dtype][1]) * 11 + s.n_pop * (3 if w == 16 else 5)
    if kind == KIND_X_PATCHES:
        return 10 + s.n_pop * (10 + w // 8)
    if kind == KIND_ANCHOR_PATCHES:
        a = program.tensors[s.anchor]
        return 10 + a.numel * (10 + bits_of(a.dtype) // 8)
    raise FormatError(f"unknown section kind {kind}", "E_SECTION_KIND")


def frame_content_size(data: Buffer) -> int:
    """Frame_Content_Size of the zstd frame that `data` starts with (2^64 - 1 when the header
    has none). Anything but a zstd frame header, including a skippable frame, is E_ZSTD."""
    if bytes(data[:4]) != ZSTD_FRAME_MAGIC:
        raise FormatError("not a zstd frame (bad frame magic; skippable frames are not allowed)", "E_ZSTD")
    try:
        return int(zstandard.get_frame_parameters(data).content_size)
    except zstandard.ZstdError as exc:
        raise FormatError(f"bad zstd frame: {exc}", "E_ZSTD") from None


def decompress(stored: Buffer, codec: int, declared: int, limit: int) -> Buffer:
    if declared > limit:
        raise LimitError(f"section declares {declared} decoded bytes, limit is {limit}", "E_LIMIT_SECTION")
    if codec == CODEC_RAW:
        if len(stored) != declared:
            raise FormatError("raw section length differs from its declared size", "E_SECTION_SIZE")
        return stored
    if codec != CODEC_ZSTD:
        raise FormatError(f"unknown section codec {codec}", "E_CODEC")
    if frame_content_size(stored) != declared:
        raise FormatError("zstd frame content size differs from the declared size", "E_SECTION_SIZE")
    try:
        dobj = zstandard.ZstdDecompressor().decompressobj()
        data = dobj.decompress(stored)
        if not dobj.eof or dobj.unused_data:
            raise FormatError("zstd section is not exactly one frame", "E_ZSTD")
    except zstandard.ZstdError as exc:
        raise FormatError(f"bad zstd data: {exc}", "E_ZSTD") from None
    if len(data) != declared:
        raise FormatError("zstd section decodes to a size other than declared", "E_SECTION_SIZE")
    return data


class StoredCorrector:
    """The decoder's corrector: reads sign and correction sections."""

    def __init__(self, program: BlockProgram, sections: dict[tuple[int, int], bytes]) -> None:
        self.program = program
        self.sections = sections
        for s_idx, s in enumerate(program.sites):
            if s.plain:
                continue
            if s.paper and (KIND_SIGNS, s_idx) not in sections:
                raise FormatError(f"site {s.name!r} has no sign section", "E_SECTION_MISSING")

    def signs(self, site: int) -> np.ndarray:
        d = self.program.sites[site].dim
        data = self.sections[(KIND_SIGNS, site)]
        bits = np.unpackbits(np.frombuffer(data, np.uint8), bitorder="little")
        if np.any(bits[d:]):
            raise FormatError("sign bitmap padding bits must be zero", "E_RESERVED")
        return bits[:d].astype(bool)

    def correct_x(self, site: int, approx: np.ndarray, regenerated: np.ndarray | None = None) -> np.ndarray:
        w = self.program.symbol_bits
        n = approx.size
        res = self.sections.get((KIND_X_RESIDUALS, site))
        pat = self.sections.get((KIND_X_PATCHES, site))
        out = approx
        keep = None
        if pat is not None:  # first: with residuals too (MIXED_CORRECTIONS), patched positions take none
            pos, vals = decode_patches(pat, n, w)
            out = approx.copy()
            out[pos] = vals
            if res is not None:
                keep = np.ones(n, dtype=bool)
                keep[pos] = False
        if res is not None:
            r = decode_residuals(res, approx, self.program.symbol_dtype, keep)
            o = bits_to_ordinal(approx, w) + r
            lim = 1 << (w - 1)
            if np.any(o < -lim) or np.any(o >= lim):
                raise FormatError("residual moves a value out of range", "E_SECTION_CONTENT")
            corrected = ordinal_to_bits(o, w)
            out = corrected if keep is None else np.where(keep, corrected, out).astype(out.dtype)
        return out

    def correct_anchor(self, site: int, approx: RawTensor, unrotated: np.ndarray | None = None) -> RawTensor:
        pat = self.sections.get((KIND_ANCHOR_PATCHES, site))
        if pat is None:
            return approx
        flat = approx.bits.reshape(-1).copy()
        pos, vals = decode_patches(pat, flat.size, bits_of(approx.dtype))
        flat[pos] = vals
        return RawTensor(approx.dtype, flat.reshape(approx.shape))

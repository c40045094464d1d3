"""The container bytes: round trips, golden bytes, and every MUST-reject rule."""
from __future__ import annotations

import hashlib
import io
import struct
from pathlib import Path

import numpy as np
import pytest

from bbformat.constants import CHUNK_FIXED_SIZE, HEADER_FIXED_SIZE, Codec, OpKind, SectionKind
from bbformat import FormatError, Reader, iter_stream
from bbformat.codec.sections import Section
from bbformat.container import records as R
from bbformat.container.chunks import build_chunk, parse_chunk
from bbformat.container.crc import CHECK_VALUE, crc32c
from bbformat.container.rebuild import Parts, join, reseal_chunk, reseal_footer, reseal_header, split
from bbformat.errors import IntegrityError, LimitError
from bbformat.writer import Writer, WriterStateError

from conftest import sample_container

HERE = Path(__file__).parent


def _read(data: bytes, tmp_path: Path) -> list:
    p = tmp_path / "x.bb"
    p.write_bytes(data)
    with Reader(p) as r:
        return list(r.iter_blocks("reverse"))


def _stream(data: bytes) -> list:
    return list(iter_stream(io.BytesIO(data)))


def _code(data: bytes, tmp_path: Path) -> str:
    with pytest.raises(FormatError) as ei:
        _read(data, tmp_path)
    return ei.value.code


def test_crc32c_check_value() -> None:
    assert crc32c(b"123456789") == CHECK_VALUE == 0xE3069283


def test_round_trip_and_stream_agree(sample_bytes: bytes, tmp_path: Path) -> None:
    blocks = _read(sample_bytes, tmp_path)
    streamed = _stream(sample_bytes)
    assert [b.name for b in blocks] == ["block1", "block0"]
    a = {n: t for b in blocks for n, t in b.tensors.items()}
    s = {n: t for b in streamed for n, t in b.tensors.items()}
    assert a.keys() == s.keys() == {"src", "anchor", "follower", "bias"}
    assert all(a[n].equal(s[n]) for n in a)


def test_sample_exercises_a_rotation_with_corrections(sample_bytes: bytes) -> None:
    ch = parse_chunk(split(sample_bytes).chunks[0])
    assert not ch.program.sites[0].plain
    assert {e["kind"] for e in ch.sections} & {3, 4}


def test_output_is_deterministic() -> None:
    assert sample_container() == sample_container()


def test_golden_bytes(sample_bytes: bytes) -> None:
    """The committed fixture pins exact bytes; it must decode forever (numcodecs style)."""
    golden = HERE / "fixtures" / "sample_v1_0.bb"
    assert golden.read_bytes() == sample_bytes
    assert hashlib.sha256(sample_bytes).hexdigest() == (HERE / "fixtures" / "sample_v1_0.sha256").read_text().split()[0]


def test_writer_state_machine(tmp_path: Path) -> None:
    buf = io.BytesIO()
    w = Writer(buf, "symmetric", 0, {})
    w.close()
    with pytest.raises(WriterStateError):
        w.close()
    w2 = Writer(io.BytesIO(), "symmetric", 1, {})
    with pytest.raises(WriterStateError):
        w2.close()  # a declared chunk is missing


@pytest.mark.parametrize("scheme, meta", [("bogus", {}), ("symmetric", {"x": object()}), ("symmetric", {"x": float("nan")}),
                                          ("symmetric", {"x": "y" * (64 << 20)})])
def test_writer_refuses_bad_header_before_any_file(tmp_path: Path, scheme: str, meta: dict) -> None:
    """An unknown scheme, metadata that is not plain JSON, or metadata over the readers' limit
    is an InputError before a temp file exists."""
    from bbformat.errors import InputError

    with pytest.raises(InputError):
        Writer(tmp_path / "m.bb", scheme, 0, meta)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("chunks", [0, 2])
def test_background_header_writes_the_same_bytes(tmp_path: Path, chunks: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the metadata compressed on a thread, chunks wait for the header and the file is
    byte for byte the one a plain writer makes, whether the header is ready or not."""
    import threading

    from bbformat.codec.encoder import encode_chunk
    from bbformat.codec.layout import ChunkLayout
    from bbformat.codec.dtypes import RawTensor
    from bbformat.container import framing

    meta = {"files": {"tokenizer.json": "x" * 100_000 + "".join(map(str, range(20_000)))}}
    encs = [encode_chunk(ChunkLayout(f"b{i}", ("t",), ()), {"t": RawTensor.from_f64(np.full((4, 4), i + 0.5), "float16")}, {},
                         "symmetric", 0.0) for i in range(chunks)]
    plain = io.BytesIO()
    w = Writer(plain, "symmetric", chunks, meta)
    for e in encs:
        w.add_encoded(e)
    w.close()
    gate = threading.Event()
    real = framing.seal_header

    def slow_seal(fields):  # type: ignore[no-untyped-def]
        gate.wait(10)  # the header is not ready until every chunk has been added
        return real(fields)

    monkeypatch.setattr("bbformat.writer.seal_header", slow_seal)
    with Writer(tmp_path / "m.bb", "symmetric", chunks, meta, background_header=True) as bg:
        for e in encs:
            bg.add_encoded(e)
        assert bg.bytes_written == 0  # nothing written ahead of the header
        gate.set()
    assert (tmp_path / "m.bb").read_bytes() == plain.getvalue()


def test_background_header_abort_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError):
        with Writer(tmp_path / "m.bb", "symmetric", 1, {"x": "y" * 50_000}, background_header=True):
            raise RuntimeError("interrupted")
    assert list(tmp_path.iterdir()) == []


def test_atomic_write_leaves_nothing_on_failure(tmp_path: Path) -> None:
    out = tmp_path / "m.bb"
    with pytest.raises(RuntimeError):
        with Writer(out, "symmetric", 1, {}):
            raise RuntimeError("interrupted")
    assert list(tmp_path.iterdir()) == []


def test_empty_container_round_trips(tmp_path: Path) -> None:
    buf = io.BytesIO()
    Writer(buf, "paper", 0, {"a": 1}).close()
    p = tmp_path / "e.bb"
    p.write_bytes(buf.getvalue())
    with Reader(p) as r:
        assert len(r) == 0 and r.header.scheme == "paper" and r.metadata == {"a": 1}


# ---- MUST-reject rules (SPEC.md section 10) ---------------------------------------


def _patch(data: bytes, offset: int, new: bytes) -> bytes:
    return data[:offset] + new + data[offset + len(new) :]


def _with_header(data: bytes, offset: int, new: bytes) -> bytes:
    p = split(data)
    return join(Parts(reseal_header(_patch(p.header, offset, new)), p.chunks))


def _with_chunk(data: bytes, i: int, offset: int, new: bytes) -> bytes:
    p = split(data)
    p.chunks[i] = reseal_chunk(_patch(p.chunks[i], offset, new))
    return join(p)


def _rebuild_chunk(data: bytes, i: int, edit) -> bytes:  # type: ignore[no-untyped-def]
    p = split(data)
    ch = parse_chunk(p.chunks[i])
    secs = []
    for e in ch.sections:
        raw = ch.payload.tobytes() if e["kind"] == SectionKind.PAYLOAD else ch.side[(e["kind"], e["site"])]
        s = Section(e["kind"], e["site"], raw)
        s.codec, s.stored = e["codec"], p.chunks[i][e["offset"] : e["offset"] + e["stored_length"]]
        secs.append(s)
    program, secs = edit(ch.program, secs)
    p.chunks[i] = build_chunk(i, program, secs)
    return join(p)


def test_reject_bad_leading_magic(sample_bytes: bytes, tmp_path: Path) -> None:
    assert _code(b"X" + sample_bytes[1:], tmp_path) == "E_MAGIC"


def test_reject_bad_trailing_magic(sample_bytes: bytes, tmp_path: Path) -> None:
    assert _code(sample_bytes[:-1] + b"X", tmp_path) == "E_TRUNCATED"


def test_reject_unknown_major_version(sample_bytes: bytes, tmp_path: Path) -> None:
    assert _code(_with_header(sample_bytes, 8, struct.pack("<H", 2)), tmp_path) == "E_VERSION"


def test_accept_newer_minor_version(sample_bytes: bytes, tmp_path: Path) -> None:
    # the footer repeats the version; both must change together
    data = bytearray(_with_header(sample_bytes, 10, struct.pack("<H", 7)))
    data[-18:-16] = struct.pack("<H", 7)
    assert len(_read(reseal_footer(bytes(data)), tmp_path)) == 2


@pytest.mark.parametrize("flags", [0x10, 0x11, 0x80000000])
def test_reject_unknown_required_flag(sample_bytes: bytes, tmp_path: Path, flags: int) -> None:
    """Bit 0 (PLANES) is known since 1.1 (tests/test_entropy.py), bits 1 and 2 since 1.2
    (tests/test_digests.py), bit 3 since 1.3 (tests/test_exponent.py); any other bit is refused."""
    assert _code(_with_header(sample_bytes, 12, struct.pack("<I", flags)), tmp_path) == "E_REQUIRED_FLAG"


def test_ignore_unknown_optional_flag(sample_bytes: bytes, tmp_path: Path) -> None:
    assert len(_read(_with_header(sample_bytes, 16, struct.pack("<I", 0x80)), tmp_path)) == 2


@pytest.mark.parametrize("offset", [22, 23])
def test_reject_reserved_header_bits(sample_bytes: bytes, tmp_path: Path, offset: int) -> None:
    assert _code(_with_header(sample_bytes, offset, b"\x01"), tmp_path) == "E_RESERVED"


def test_reject_unknown_metadata_codec(sample_bytes: bytes, tmp_path: Path) -> None:
    assert _code(_with_header(sample_bytes, 21, b"\x07"), tmp_path) == "E_CODEC"


def test_reject_metadata_codec_mismatch(sample_bytes: bytes, tmp_path: Path) -> None:
    assert _code(_with_header(sample_bytes, 21, b"\x01"), tmp_path) == "E_ZSTD"  # says zstd, holds JSON


def test_large_metadata_is_compressed_and_round_trips(tmp_path: Path) -> None:
    meta = {"files": {"tokenizer.json": "x" * 100_000}}
    buf = io.BytesIO()
    Writer(buf, "symmetric", 0, meta).close()
    assert len(buf.getvalue()) < 10_000
    p = tmp_path / "m.bb"
    p.write_bytes(buf.getvalue())
    with Reader(p) as r:
        assert r.metadata == meta


def test_reject_unknown_scheme(sample_bytes: bytes, tmp_path: Path) -> None:
    assert _code(_with_header(sample_bytes, 20, b"\x09"), tmp_path) == "E_SCHEME"


@pytest.mark.parametrize("offset", [4, 28])
def test_reject_reserved_chunk_header_bits(sample_bytes: bytes, tmp_path: Path, offset: int) -> None:
    assert _code(_with_chunk(sample_bytes, 0, offset, b"\x01"), tmp_path) == "E_RESERVED"


def test_reject_header_crc_mismatch(sample_bytes: bytes, tmp_path: Path) -> None:
    p = split(sample_bytes)
    hdr = _patch(p.header, 40, bytes([p.header[40] ^ 1]))
    assert _code(join(Parts(hdr, p.chunks)), tmp_path) == "E_CRC_HEADER"


@pytest.mark.parametrize("i", [0, 1])
def test_reject_chunk_crc_mismatch(sample_bytes: bytes, tmp_path: Path, i: int) -> None:
    p = split(sample_bytes)
    c = p.chunks[i]
    p.chunks[i] = _patch(c, len(c) - 10, bytes([c[len(c) - 10] ^ 0x10]))
    data = join(p)  # the index is rebuilt from the (stale) chunk CRC field
    with pytest.raises(IntegrityError) as ei:
        _read(data, tmp_path)
    assert ei.value.code == "E_CRC_CHUNK"
    with pytest.raises(IntegrityError):
        _stream(data)


def test_reject_index_entry_crc_mismatch(sample_bytes: bytes, tmp_path: Path) -> None:
    data = bytearray(sample_bytes)
    index_off = struct.unpack("<Q", data[-40:-32])[0]
    data[index_off + 8 + 16] ^= 1  # first entry's crc
    assert _code(reseal_footer(bytes(data)), tmp_path) == "E_CRC_INDEX_ENTRY"


def test_reject_index_crc_mismatch(sample_bytes: bytes, tmp_path: Path) -> None:
    data = bytearray(sample_bytes)
    index_off = struct.unpack("<Q", data[-40:-32])[0]
    data[index_off + 8 + 20] ^= 1  # a reserved byte inside the index, caught by the CRC first
    assert _code(bytes(data), tmp_path) == "E_CRC_INDEX"


def test_reject_footer_crc_mismatch(sample_bytes: bytes, tmp_path: Path) -> None:
    data = bytearray(sample_bytes)
    data[-16] ^= 1  # inside the reserved word, covered by the footer CRC
    assert _code(bytes(data), tmp_path) == "E_CRC_FOOTER"


def test_reject_reserved_footer_bits(sample_bytes: bytes, tmp_path: Path) -> None:
    data = bytearray(sample_bytes)
    data[-16] = 1
    assert _code(reseal_footer(bytes(data)), tmp_path) == "E_RESERVED"


def _boundaries(data: bytes) -> list[int]:
    p = split(data)
    cuts = [0, 8, HEADER_FIXED_SIZE, len(p.header) - 4, len(p.header)]
    pos = len(p.header)
    for c in p.chunks:
        ch = parse_chunk(c)
        d_len = struct.unpack("<I", c[20:24])[0]
        cuts += [pos + CHUNK_FIXED_SIZE, pos + CHUNK_FIXED_SIZE + d_len]
        cuts += [pos + e["offset"] for e in ch.sections]
        pos += len(c)
        cuts += [pos - 4, pos]
    cuts += [len(data) - 40, len(data) - 8, len(data) - 1]
    return sorted(set(cuts))


def test_reject_truncation_at_every_boundary(sample_bytes: bytes, tmp_path: Path) -> None:
    for cut in _boundaries(sample_bytes):
        data = sample_bytes[:cut]
        code = _code(data, tmp_path)
        assert code in ("E_TRUNCATED", "E_MAGIC"), (cut, code)
        if cut >= 8:
            assert code == "E_TRUNCATED", cut
        with pytest.raises(FormatError) as ei:
            _stream(data)
        assert ei.value.code in ("E_TRUNCATED", "E_MAGIC"), (cut, ei.value.code)


def _with_footer(data: bytes, index_offset: int | None = None, index_length: int | None = None) -> bytes:
    d = bytearray(data)
    if index_offset is not None:
        d[-40:-32] = struct.pack("<Q", index_offset)
    if index_length is not None:
        d[-32:-24] = struct.pack("<Q", index_length)
    return reseal_footer(bytes(d), index_crc=False)


@pytest.mark.parametrize("off,length", [(2**64 - 1, None), (None, 2**64 - 8), (10**9, None), (3, None)])
def test_reject_index_pointer_out_of_bounds(sample_bytes: bytes, tmp_path: Path, off, length) -> None:  # type: ignore[no-untyped-def]
    assert _code(_with_footer(sample_bytes, off, length), tmp_path) == "E_BOUNDS"


def _with_index_entry(data: bytes, i: int, offset: int | None = None, length: int | None = None) -> bytes:
    d = bytearray(data)
    index_off = struct.unpack("<Q", d[-40:-32])[0]
    base = index_off + 8 + 24 * i
    if offset is not None:
        d[base : base + 8] = struct.pack("<Q", offset)
    if length is not None:
        d[base + 8 : base + 16] = struct.pack("<Q", length)
    return reseal_footer(bytes(d))


@pytest.mark.parametrize("i,off,length", [(0, 0, None), (1, 2**64 - 16, None), (0, None, 2**64 - 1), (1, None, 10**8), (0, None, 40)])
def test_reject_overlapping_or_overflowing_chunks(sample_bytes: bytes, tmp_path: Path, i, off, length) -> None:  # type: ignore[no-untyped-def]
    assert _code(_with_index_entry(sample_bytes, i, off, length), tmp_path) == "E_BOUNDS"


def test_reject_zstd_size_lie(tmp_path: Path) -> None:
    data = sample_container()

    import zstandard

    def edit(program, secs):  # type: ignore[no-untyped-def]
        s = next(s for s in secs if s.kind == SectionKind.PAYLOAD)
        s.codec, s.stored = Codec.ZSTD, zstandard.ZstdCompressor(level=3).compress(s.data[:-2])
        return program, secs  # the entry declares len(s.data); the frame holds 2 bytes fewer

    assert _code(_rebuild_chunk(data, 0, edit), tmp_path) == "E_SECTION_SIZE"


def _raise_content_size(frame: bytes) -> bytes:
    """A zstd frame whose header's Frame_Content_Size (RFC 8878 3.1.1.1) is one more than the
    data it holds: the field found from the header's flags, whatever layout the library chose."""
    fhd = frame[4]
    single = (fhd >> 5) & 1
    at = 5 + (0 if single else 1) + (0, 1, 2, 4)[fhd & 3]
    size = (1 if single else 0, 2, 4, 8)[fhd >> 6]
    assert size, "the frame must carry its content size"
    value = int.from_bytes(frame[at : at + size], "little") + 1
    return frame[:at] + value.to_bytes(size, "little") + frame[at + size :]


def test_a_frame_decoding_short_of_its_content_size_is_zstd() -> None:
    """SPEC.md 8.2: data decoding to another size than the frame's Frame_Content_Size is
    E_ZSTD (a damaged frame), after the content size has matched the declared length. libzstd
    itself refuses such a frame, so this checks the rule through the real decompression; the
    readers' own size checks after it only restate it (the C reader's have no vector: no
    frame reaches them)."""
    import zstandard

    from bbformat.zstdframe import decompress, frame_content_size

    data = bytes(range(100)) * 3
    frame = _raise_content_size(zstandard.ZstdCompressor(level=3).compress(data))
    assert frame_content_size(frame) == 301
    with pytest.raises(FormatError) as e:
        decompress(frame, Codec.ZSTD, 301, 1000)
    assert e.value.code == "E_ZSTD"


def test_zstd_payload_is_accepted(tmp_path: Path) -> None:
    import zstandard

    def edit(program, secs):  # type: ignore[no-untyped-def]
        s = next(s for s in secs if s.kind == SectionKind.PAYLOAD)
        s.codec, s.stored = Codec.ZSTD, zstandard.ZstdCompressor(level=3).compress(s.data)
        return program, secs

    data = sample_container()
    a = {n: t for b in _read(data, tmp_path) for n, t in b.tensors.items()}
    b = {n: t for b in _read(_rebuild_chunk(data, 0, edit), tmp_path) for n, t in b.tensors.items()}
    assert all(a[n].equal(b[n]) for n in a)


def test_reject_decompression_bomb(tmp_path: Path) -> None:
    import zstandard

    def edit(program, secs):  # type: ignore[no-untyped-def]
        s = next(s for s in secs if s.kind in (3, 4))
        s.data = bytes(100_000_000)
        s.codec, s.stored = Codec.ZSTD, zstandard.ZstdCompressor(level=1).compress(s.data)
        return program, secs

    with pytest.raises(LimitError) as ei:
        _read(_rebuild_chunk(sample_container(), 0, edit), tmp_path)
    assert ei.value.code == "E_LIMIT_SECTION"


def test_reject_site_that_does_not_fit(sample_bytes: bytes, tmp_path: Path) -> None:
    def edit(program, secs):  # type: ignore[no-untyped-def]
        from dataclasses import replace

        program.sites[0] = replace(program.sites[0], dim=program.sites[0].dim + 1)
        return program, secs

    assert _code(_rebuild_chunk(sample_bytes, 0, edit), tmp_path) == "E_SITE"


def test_reject_anchor_pushed_before_site(sample_bytes: bytes, tmp_path: Path) -> None:
    def edit(program, secs):  # type: ignore[no-untyped-def]
        program.ops = [o for o in program.ops if o.kind == OpKind.PUSH] + [o for o in program.ops if o.kind != OpKind.PUSH]
        return program, secs

    assert _code(_rebuild_chunk(sample_bytes, 0, edit), tmp_path) == "E_SITE"


def test_reject_symbol_count_that_does_not_add_up(sample_bytes: bytes, tmp_path: Path) -> None:
    def edit(program, secs):  # type: ignore[no-untyped-def]
        s = next(s for s in secs if s.kind == SectionKind.PAYLOAD)
        s.data = s.stored = s.data + b"\x00\x00"
        return program, secs

    assert _code(_rebuild_chunk(sample_bytes, 0, edit), tmp_path) == "E_SYMBOL_COUNT"


def test_reject_tensor_pushed_twice(sample_bytes: bytes, tmp_path: Path) -> None:
    def edit(program, secs):  # type: ignore[no-untyped-def]
        program.ops = program.ops + [program.ops[-1]]
        return program, secs

    assert _code(_rebuild_chunk(sample_bytes, 0, edit), tmp_path) == "E_DESCRIPTOR"


def test_reject_unknown_section_kind_and_codec(sample_bytes: bytes, tmp_path: Path) -> None:
    def kind(program, secs):  # type: ignore[no-untyped-def]
        secs[-1].kind = 9
        return program, secs

    def codec(program, secs):  # type: ignore[no-untyped-def]
        secs[-1].codec = 7
        return program, secs

    assert _code(_rebuild_chunk(sample_bytes, 0, kind), tmp_path) == "E_SECTION_KIND"
    assert _code(_rebuild_chunk(sample_bytes, 0, codec), tmp_path) == "E_CODEC"


def test_reject_duplicate_section(sample_bytes: bytes, tmp_path: Path) -> None:
    def edit(program, secs):  # type: ignore[no-untyped-def]
        return program, secs + [secs[-1]]

    assert _code(_rebuild_chunk(sample_bytes, 0, edit), tmp_path) == "E_SECTION_DUPLICATE"


def test_reject_missing_sign_section(tmp_path: Path) -> None:
    data = sample_container("paper", 0.005)

    def edit(program, secs):  # type: ignore[no-untyped-def]
        return program, [s for s in secs if s.kind != 2]

    assert _code(_rebuild_chunk(data, 0, edit), tmp_path) == "E_SECTION_MISSING"


def test_reject_unknown_dtype(sample_bytes: bytes, tmp_path: Path) -> None:
    p = split(sample_bytes)
    c = p.chunks[1]
    # descriptor: name (u16 len + bytes), symbol dtype byte follows
    name_len = struct.unpack("<H", c[32:34])[0]
    assert _code(_with_chunk(sample_bytes, 1, 34 + name_len, b"\x09"), tmp_path) == "E_DTYPE"


def test_reject_trailing_bytes_in_stream(sample_bytes: bytes) -> None:
    with pytest.raises(FormatError) as ei:
        _stream(sample_bytes + b"\x00")
    assert ei.value.code == "E_TRAILING"


def test_reject_chunk_out_of_order(sample_bytes: bytes, tmp_path: Path) -> None:
    p = split(sample_bytes)
    p.chunks = [reseal_chunk(_patch(c, 16, struct.pack("<I", 1 - i))) for i, c in enumerate(p.chunks)]
    assert _code(join(p), tmp_path) == "E_CHUNK_ORDER"


def test_reject_residual_that_leaves_the_range(tmp_path: Path) -> None:
    from bbformat.codec.varint import encode_varints, zigzag

    def edit(program, secs):  # type: ignore[no-untyped-def]
        s = next(s for s in secs if s.kind in (3, 4))
        n = program.sites[0].n_pop
        s.kind = 3
        s.data = s.stored = encode_varints(zigzag(np.full(n, 70000)))
        s.codec = 0
        return program, secs

    assert _code(_rebuild_chunk(sample_container(), 0, edit), tmp_path) in ("E_SECTION_CONTENT", "E_LIMIT_SECTION")


def test_reject_metadata_that_is_not_json(tmp_path: Path) -> None:
    buf = io.BytesIO()
    Writer(buf, "symmetric", 0, {}).close()
    data = buf.getvalue()
    p = split(data)
    hdr = p.header[:32] + b"[1]" + p.header[34:]  # '{}' -> '[1' and length 2 -> 3
    hdr = hdr[:28] + struct.pack("<I", 3) + hdr[32:]
    hdr = hdr[:-4] + b"\x00\x00\x00\x00"
    assert _code(join(Parts(reseal_header(hdr), p.chunks)), tmp_path) == "E_METADATA"


def test_reject_index_count_mismatch(sample_bytes: bytes, tmp_path: Path) -> None:
    d = bytearray(sample_bytes)
    index_off = struct.unpack("<Q", d[-40:-32])[0]
    d[index_off + 4 : index_off + 8] = struct.pack("<I", 3)
    assert _code(reseal_footer(bytes(d)), tmp_path) == "E_INDEX"


@pytest.mark.parametrize("header_minor, footer_minor", [(3, 0), (0, 1), (1, 0)])
def test_reject_header_footer_version_mismatch(sample_bytes: bytes, tmp_path: Path, header_minor: int, footer_minor: int) -> None:
    data = bytearray(_with_header(sample_bytes, 10, struct.pack("<H", header_minor)))
    data[-18:-16] = struct.pack("<H", footer_minor)  # footer minor (SPEC.md 10.2)
    assert _code(reseal_footer(bytes(data), index_crc=False), tmp_path) == "E_VERSION"


def test_reject_reserved_site_flag(sample_bytes: bytes, tmp_path: Path) -> None:
    def edit(program, secs):  # type: ignore[no-untyped-def]
        from dataclasses import replace

        program.sites[0] = replace(program.sites[0], flags=program.sites[0].flags | 0x80)
        return program, secs

    assert _code(_rebuild_chunk(sample_bytes, 0, edit), tmp_path) == "E_RESERVED"


def test_reject_sign_bitmap_padding(tmp_path: Path) -> None:
    def edit(program, secs):  # type: ignore[no-untyped-def]
        s = next(s for s in secs if s.kind == 2)
        s.data = s.stored = s.data[:-1] + bytes([s.data[-1] | 0x80])  # D = 20: bits 20..23 are padding
        return program, secs

    data = sample_container("paper", 0.005, dim=20)
    assert not parse_chunk(split(data).chunks[0]).program.sites[0].plain
    assert _code(_rebuild_chunk(data, 0, edit), tmp_path) == "E_RESERVED"


# ---- regressions found by the conformance suite (conformance/, issue #4) ----------------------------


def test_reject_skippable_zstd_frames_as_zstd(tmp_path: Path) -> None:
    """A skippable frame is not a zstd frame (SPEC.md 8.2): E_ZSTD, not E_SECTION_SIZE."""
    import zstandard

    skippable = struct.pack("<II", 0x184D2A50, 4) + b"skip"

    def edit(program, secs):  # type: ignore[no-untyped-def]
        s = next(s for s in secs if s.kind == SectionKind.PAYLOAD)
        s.codec, s.stored = Codec.ZSTD, skippable + zstandard.ZstdCompressor(level=3).compress(s.data)
        return program, secs

    assert _code(_rebuild_chunk(sample_container(), 0, edit), tmp_path) == "E_ZSTD"
    hdr = build_header_raw(skippable + zstandard.ZstdCompressor(level=3).compress(b"{}"), codec=1)
    assert _code(join(Parts(hdr, [])), tmp_path) == "E_ZSTD"


def build_header_raw(meta: bytes, codec: int = 0) -> bytes:
    body = R.HEADER_FIXED.build(dict(major=1, minor=0, required_flags=0, optional_flags=0, scheme=2, metadata_codec=codec, reserved1=0,
                                     chunk_count=0, metadata_length=len(meta))) + meta
    return body + crc32c(body).to_bytes(4, "little")


@pytest.mark.parametrize("meta", [b'{"a":' + b"[" * 100000 + b"]" * 100000 + b"}", b'{"a":' + b"7" * 5000 + b"}"])
def test_metadata_past_json_limits_is_a_clean_reject(tmp_path: Path, meta: bytes) -> None:
    """Deep nesting (RecursionError) and 5,000-digit integers (ValueError) were uncaught."""
    assert _code(join(Parts(build_header_raw(meta), [])), tmp_path) == "E_METADATA"


def test_reject_varint_of_2_64_or_more() -> None:
    from bbformat.codec.varint import decode_varints

    assert int(decode_varints(b"\xff" * 9 + b"\x01", 1)[0]) == 2**64 - 1
    with pytest.raises(FormatError) as ei:
        decode_varints(b"\xff" * 9 + b"\x02", 1)  # used to wrap around to 2^63 - 1
    assert ei.value.code == "E_SECTION_CONTENT"


def test_huge_dim_of_an_empty_tensor_is_a_limit_not_a_crash(sample_bytes: bytes, tmp_path: Path) -> None:
    """dims (2^64 - 1, 0) hold 0 elements; numpy cannot represent the shape (OverflowError before)."""
    from dataclasses import replace

    def edit(program, secs):  # type: ignore[no-untyped-def]
        program.tensors.append(replace(program.tensors[0], name="empty", shape=(2**64 - 1, 0)))
        program.ops = program.ops + [replace(program.ops[-1], index=len(program.tensors) - 1)]
        return program, secs

    assert _code(_rebuild_chunk(sample_bytes, 1, edit), tmp_path) == "E_LIMIT_TENSOR"


def test_non_finite_anchor_gives_nan_block_not_an_error(tmp_path: Path) -> None:
    """SPEC.md 7.5: a non-finite Gram matrix makes E all NaN (numpy's eigh leaves some columns
    finite); the container is still valid. In paper mode the whole un-rotated anchor is NaN."""
    data = sample_container("paper", 0.005)

    def edit(program, secs):  # type: ignore[no-untyped-def]
        s = next(s for s in secs if s.kind == SectionKind.PAYLOAD)
        site = program.sites[0]
        at = 30 * 24 - site.n_pop + site.n_mu  # the anchor's first symbol: after src's stored part and mu
        s.data = s.stored = s.data[: 2 * at] + b"\x00\x7c" + s.data[2 * at + 2 :]  # +infinity
        return program, [s for s in secs if s.kind in (SectionKind.PAYLOAD, 2)]  # payload and signs; corrections no longer fit

    assert not parse_chunk(split(data).chunks[0]).program.sites[0].plain
    blocks = _read(_rebuild_chunk(data, 0, edit), tmp_path)
    t = next(b for b in blocks if b.index == 0).tensors
    src = t["src"].to_f64().reshape(-1)
    assert np.all(np.isnan(src[-300:])) and np.all(np.isfinite(src[:-300]))
    assert np.all(np.isnan(t["anchor"].to_f64()))

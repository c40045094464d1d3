"""Format 1.6 (SPEC.md 6.1, 6.2): dtype codes 4-15 as opaque bit patterns, W = 8 symbols, the
required flag DTYPES. Expected bytes are the inputs' own (numpy bytes, hashed here), never the
code under test's."""
from __future__ import annotations

import hashlib
import io
from pathlib import Path

import numpy as np
import pytest
import torch

from bbformat.api import read_tensors
from bbformat.codec.dtypes import RawTensor
from bbformat.codec.encoder import choose_symbol_dtype, encode_chunk
from bbformat.codec.layout import ChunkLayout, SiteSpec
from bbformat.codec.parts import read_parts
from bbformat.codec.payload import code_payload
from bbformat.constants import (DTYPE_BITS, ENTROPY_MODES, EXTENDED_DTYPES, SAFETENSORS_DTYPES, Codec, RequiredFlag,
                                required_flags_for)
from bbformat.container.program import AxisRef, TensorEntry, safetensors_dtype
from bbformat.errors import FormatError, InputError
from bbformat.reader import Reader
from bbformat.tensors import raw_to_torch, torch_dtype, torch_to_raw
from bbformat.writer import Writer
from conftest import assert_refused_without, sample_container

FIX = Path(__file__).parent / "fixtures"
NEW = sorted(EXTENDED_DTYPES)


def _raw(seed: int, dtype: str, shape: tuple[int, ...]) -> RawTensor:
    """Arbitrary bit patterns of a low-entropy kind (small values), so the entropy codecs code them."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape, dtype=np.int64)) * DTYPE_BITS[dtype] // 8
    data = (rng.integers(0, 4, n) * rng.integers(0, 64, n)).astype(np.uint8).tobytes()
    return RawTensor(dtype, np.frombuffer(data, f"<u{DTYPE_BITS[dtype] // 8}").reshape(shape).copy())


def _chunks() -> list[dict[str, RawTensor]]:
    """Every new dtype, 0-d, 0-element and odd counts among them, with floats mixed in: chunks of
    W = 8, 16, 32 and (all tensors 64 bits wide) 32 again, with uint32 symbols."""
    w8 = {f"w8_{d}_{k}": _raw(10 * i + k, d, shape) for i, d in enumerate(NEW) if DTYPE_BITS[d] == 8
          for k, shape in enumerate([(), (0, 3), (5, 7)])}
    w8["w8_half"] = _raw(1, "float16", (3, 3))
    w16 = {"w16_i16": _raw(2, "int16", (33,)), "w16_u16": _raw(3, "uint16", ()), "w16_bf": _raw(4, "bfloat16", (40, 40)),
           "w16_u64": _raw(5, "uint64", (3, 1)), "w16_f64": _raw(6, "float64", (0,))}
    w32 = {"w32_i32": _raw(7, "int32", (9,)), "w32_u32": _raw(8, "uint32", (2, 2)), "w32_f32": _raw(9, "float32", (4,)),
           "w32_i64": _raw(10, "int64", ())}
    wide = {"wide_f64": _raw(11, "float64", (300, 7)), "wide_i64": _raw(12, "int64", (5,))}
    return [w8, w16, w32, wide]


def _write(chunks: list[dict[str, RawTensor]], entropy: str, part_symbols: int = 500, **kw: object) -> bytes:
    buf = io.BytesIO()
    w = Writer(buf, "none", len(chunks), {"format": "bbformat", "scheme": "none", "tolerance": 0.0}, entropy=entropy,
               format_version="1.6", dtypes=True, part_symbols=part_symbols, threads=1, **kw)  # type: ignore[arg-type]
    for i, ts in enumerate(chunks):
        w.add_encoded(encode_chunk(ChunkLayout(f"c{i}", tuple(ts), ()), ts, {}, "symmetric", 0.0))
    w.close()
    return buf.getvalue()


def _decoded(data: bytes) -> dict[str, tuple[str, tuple[int, ...], str]]:
    with Reader(io.BytesIO(data)) as r:
        assert all(b.exact for b in r.iter_blocks())
        return {n: (t.dtype, t.shape, hashlib.sha256(t.tobytes()).hexdigest()) for b in r.iter_blocks() for n, t in b.tensors.items()}


def _want(chunks: list[dict[str, RawTensor]]) -> dict[str, tuple[str, tuple[int, ...], str]]:
    return {n: (t.dtype, t.shape, hashlib.sha256(t.bits.astype(t.bits.dtype.newbyteorder("<")).tobytes()).hexdigest())
            for c in chunks for n, t in c.items()}


@pytest.mark.parametrize("entropy", ENTROPY_MODES)
def test_every_dtype_round_trips_in_every_entropy_mode(entropy: str) -> None:
    chunks = _chunks()
    data = _write(chunks, entropy)
    assert _decoded(data) == _want(chunks)
    with Reader(io.BytesIO(data)) as r:
        assert r.header.minor == 6 and r.header.required_flags & RequiredFlag.DTYPES
        symbols = [r.read_chunk(i).program.symbol_dtype for i in range(len(r))]
        codecs = [r.read_chunk(i).sections[0]["codec"] for i in range(len(r))]
    assert symbols == ["bool", "bfloat16", "float32", "uint32"]  # the narrowest width's first float16/bfloat16/float32, else first
    if entropy == "none":
        assert set(codecs) == {Codec.RAW}
    elif entropy == "exponent":  # codec 3 only where the symbols are floats (SPEC.md 8.7): else raw
        assert codecs[0] == codecs[3] == Codec.RAW
    else:
        assert set(codecs) - {Codec.RAW}, codecs  # low-entropy bytes: something codes them


def test_w8_payload_uses_one_plane_and_codec_4() -> None:
    ts = {"mask": _raw(20, "bool", (999,)), "q": _raw(21, "float8_e5m2", (31, 31))}
    data = _write([ts], "planes", part_symbols=10 ** 6)
    with Reader(io.BytesIO(data)) as r:
        assert r.read_chunk(0).program.symbol_bits == 8
        assert r.read_chunk(0).sections[0]["codec"] == Codec.PLANES
    assert _decoded(data) == _want([ts])
    data = _write([ts], "planes", part_symbols=300)
    with Reader(io.BytesIO(data)) as r:
        assert r.read_chunk(0).sections[0]["codec"] == Codec.PARTS
    assert _decoded(data) == _want([ts])


def test_exponent_mode_never_codes_integer_symbols() -> None:
    prog = encode_chunk(ChunkLayout("c", ("a",), ()), {"a": _raw(30, "int16", (4000,))}, {}, "symmetric", 0.0).program
    data = _raw(30, "int16", (4000,)).tobytes()
    for mode in ("exponent", "auto"):
        codec, stored = code_payload(prog, data, mode, required_flags_for("1.6", "auto", dtypes=True), part_symbols=1000)
        assert codec != Codec.EXPONENT
        if codec == Codec.PARTS:
            assert Codec.EXPONENT not in {p.codec for p in read_parts(stored, 4000, 2, tuple(Codec))}


@pytest.mark.parametrize("name", sorted(SAFETENSORS_DTYPES.values()))
def test_torch_conversion_both_ways(name: str) -> None:
    t = _raw(40, name, (3, 5))
    tt = raw_to_torch(t)
    assert tt.dtype == torch_dtype(name) == getattr(torch, name) and tuple(tt.shape) == (3, 5)
    assert tt.reshape(-1).view(torch.uint8).numpy().tobytes() == t.bits.tobytes()
    back = torch_to_raw(tt)
    assert back.dtype == name and back.equal(t)
    scalar = raw_to_torch(_raw(41, name, ()), copy=False)
    assert scalar.shape == () and torch_to_raw(scalar).equal(_raw(41, name, ()))
    view = raw_to_torch(_raw(42, name, (3, 10)))[:, ::2]  # not contiguous: copied once
    assert torch_to_raw(view).bits.tobytes() == _raw(42, name, (3, 10)).bits[:, ::2].tobytes()


def test_read_tensors_gives_torch_tensors_back_bit_exact(tmp_path: Path) -> None:
    chunks = _chunks()
    path = tmp_path / "m.bb"
    path.write_bytes(_write(chunks, "auto"))
    got = read_tensors(path)
    for c in chunks:
        for n, t in c.items():
            assert got[n].dtype == torch_dtype(t.dtype) and tuple(got[n].shape) == t.shape
            assert got[n].reshape(-1).view(torch.uint8).numpy().tobytes() == t.tobytes()


def test_writer_refuses_what_a_reader_would() -> None:
    ts = {"i": _raw(50, "int8", (4,))}
    enc = encode_chunk(ChunkLayout("c", ("i",), ()), ts, {}, "symmetric", 0.0)
    w = Writer(io.BytesIO(), "none", 1, {}, format_version="1.6")
    with pytest.raises(InputError, match="int8"):
        w.add_encoded(enc)
    with pytest.raises(InputError, match="1.6"):
        Writer(io.BytesIO(), "none", 1, {}, format_version="1.5", dtypes=True)
    with pytest.raises(InputError, match="float4"):
        encode_chunk(ChunkLayout("c", ("x",), ()), {"x": RawTensor("float4", np.zeros(2, np.uint8))}, {}, "symmetric", 0.0)


@pytest.mark.parametrize("code", ["F8_E8M0", "F4", "F6_E2M3", "F6_E3M2", "C64", "f16"])
def test_unknown_safetensors_dtypes_are_named(code: str) -> None:
    with pytest.raises(InputError, match=code):
        safetensors_dtype(code)


def test_safetensors_names() -> None:
    assert {st: safetensors_dtype(st) for st in ("F8_E4M3", "BOOL", "U64", "BF16")} == \
        {"F8_E4M3": "float8_e4m3fn", "BOOL": "bool", "U64": "uint64", "BF16": "bfloat16"}


def test_symbol_dtype_choice() -> None:
    def entries(*dts: str) -> list[TensorEntry]:
        return [TensorEntry(f"t{i}", d, (2,)) for i, d in enumerate(dts)]

    assert choose_symbol_dtype(entries("int16", "bfloat16", "float16")) == "bfloat16"
    assert choose_symbol_dtype(entries("float32", "int32")) == "float32"
    assert choose_symbol_dtype(entries("int64", "float64")) == "uint32"
    assert choose_symbol_dtype(entries("float64", "uint8", "bool")) == "uint8"
    assert choose_symbol_dtype(entries("float16", "bfloat16")) == "float16"  # as before 1.6


def test_sites_need_float_symbols_and_anchors() -> None:
    site = SiteSpec("s", 4, AxisRef("a", 0), ())
    ts = {"src": _raw(60, "float16", (30, 4)), "a": _raw(61, "int16", (4, 6))}
    with pytest.raises(InputError, match="float"):
        encode_chunk(ChunkLayout("c", ("src", "a"), (site,)), ts, {}, "symmetric", 0.0)
    ts = {"src": _raw(62, "uint8", (30, 4)), "a": _raw(63, "float16", (4, 6))}
    with pytest.raises(InputError, match="uint8"):
        encode_chunk(ChunkLayout("c", ("src", "a"), (site,)), ts, {}, "symmetric", 0.0)


def test_a_float_file_stays_1_5_byte_for_byte() -> None:
    """Format "1.6" without new dtypes writes the 1.5 file: same flags, same bytes."""
    for entropy in ("none", "auto"):
        assert sample_container(format_version="1.6", entropy=entropy) == sample_container(format_version="1.5", entropy=entropy)
    with Reader(io.BytesIO(sample_container(format_version="1.6", entropy="auto"))) as r:
        assert r.header.minor == 5 and not r.header.required_flags & RequiredFlag.DTYPES


def test_new_codes_without_the_flag_are_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    """A file with DTYPES cleared (CRCs resealed) is E_DTYPE at its first new code, and a reader
    that does not know DTYPES refuses the file at the header."""
    from bbformat.container.rebuild import join, reseal_header, split

    data = _write([{"b": _raw(70, "bool", (3,))}], "none")
    parts = split(data)
    head = bytearray(parts.header)
    head[12:16] = (int.from_bytes(head[12:16], "little") & ~RequiredFlag.DTYPES).to_bytes(4, "little")
    parts.header = reseal_header(bytes(head))
    with pytest.raises(FormatError) as ei:
        with Reader(io.BytesIO(join(parts))) as r:
            list(r.iter_blocks())
    assert ei.value.code == "E_DTYPE"
    assert_refused_without(monkeypatch, RequiredFlag.DTYPES, data)


def _fixture_chunks() -> list[dict[str, RawTensor]]:
    return [{"emb": _raw(80, "bfloat16", (64, 16)), "pos": _raw(81, "int64", (64,)), "flag": _raw(82, "bool", ())},
            {"mask": _raw(83, "bool", (777,)), "scale": _raw(84, "float8_e4m3fn", (40, 25)), "zero": _raw(85, "uint16", (0, 2))},
            {"big": _raw(86, "uint64", (130,)), "f": _raw(87, "float64", (3, 3)), "i": _raw(88, "int32", (5,))}]


def test_golden_v1_6_fixture_decodes_forever(monkeypatch: pytest.MonkeyPatch) -> None:
    """Written once (numcodecs style): the 1.6 fixture (no sites: no BLAS in its bytes) pins the
    writer's bytes, decodes to its inputs, and a 1.5 reader refuses it at the header."""
    golden = (FIX / "sample_v1_6_dtypes.bb").read_bytes()
    assert hashlib.sha256(golden).hexdigest() == (FIX / "sample_v1_6_dtypes.sha256").read_text().split()[0]
    assert _write(_fixture_chunks(), "auto", part_symbols=200) == golden
    assert _decoded(golden) == _want(_fixture_chunks())
    assert_refused_without(monkeypatch, RequiredFlag.DTYPES, golden)

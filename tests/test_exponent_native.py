"""The compiled coder of payload codec 3 (bbformat/codec/_exponent_native.c) against the numpy
code, the reference: the decoder gives the same symbols on every input, and on damaged input
the same outcome (the same symbols, or a FormatError with the same code); the encoder writes
the same bytes. The conformance suite
(tests/test_conformance.py) runs every vector through the default, compiled path; here the
codec-3 vectors also go through numpy, so both stay conforming."""
from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bbformat
from bbformat.codec import exponent, rans
from bbformat.codec.exponent import NATIVE_DECODER, decode_exponent, encode_exponent
from bbformat.codec.varint import encode_varint
from bbformat.errors import BBFormatError
from conftest import DAMAGE, damage

needs_native = pytest.mark.skipif(not NATIVE_DECODER, reason="the compiled decoder is not built (no C compiler at install)")
CONF = Path(__file__).resolve().parent.parent / "conformance"
DTYPES = ("float16", "bfloat16", "float32")


def _symbols(dtype: str, n: int, seed: int, column_scales: bool = False) -> np.ndarray:
    """Weight-like symbols with some arbitrary bit patterns mixed in; `column_scales`: in rows
    of 10 (or any multiple), columns k and k+4 share one of 4 scales a factor 30 apart."""
    import torch

    rng = np.random.default_rng(seed)
    bits = 32 if dtype == "float32" else 16
    u = np.uint32 if bits == 32 else np.uint16
    scale = 0.02 * 30.0 ** (np.arange(n) % 10 % 4) if column_scales else 0.02
    t = torch.from_numpy(rng.standard_normal(n) * scale).to(getattr(torch, dtype))
    sym = t.view(torch.int32 if bits == 32 else torch.int16).numpy().view(u).copy()
    wild = rng.random(n) < 0.01
    sym[wild] = rng.integers(0, 2**bits, int(wild.sum()), dtype=np.uint64).astype(u)
    return sym


class _ScalarSteps:
    """The compiled module with its AVX2 steps turned off (decode's simd=0): the scalar loop."""

    def __init__(self, module: object) -> None:
        self.module = module

    def __getattr__(self, name: str) -> object:
        return getattr(self.module, name)

    def decode(self, *args: object) -> int:
        return self.module.decode(*args, False)  # type: ignore[attr-defined, no-any-return]


def _outcome(data: bytes, total: int, dtype: str, native: bool) -> tuple[str, bytes]:
    try:
        return "ok", decode_exponent(data, total, dtype, native=native).tobytes()
    except BBFormatError as e:
        return e.code, b""


def _three(data: bytes, total: int, dtype: str) -> list[tuple[str, bytes]]:
    """The outcome through numpy, the compiled decoder's scalar loop, and its SIMD steps (where
    this CPU has them; else the scalar loop twice)."""
    native = exponent._exponent_native
    out = [_outcome(data, total, dtype, False), _outcome(data, total, dtype, True)]
    exponent._exponent_native = _ScalarSteps(native)  # type: ignore[assignment]
    try:
        out.append(_outcome(data, total, dtype, True))
    finally:
        exponent._exponent_native = native
    return out


@needs_native
@settings(max_examples=60, deadline=None)
@given(st.sampled_from(DTYPES), st.lists(st.tuples(st.integers(1, 12_000), st.integers(1, 80)), min_size=1, max_size=4),
       st.integers(0, 2**32 - 1), st.sampled_from(exponent.JOINED_BITS_TRIED + (4,)), st.sampled_from([3, 8, 40, 2048]))
def test_native_equals_numpy_and_the_input(dtype: str, runs: list[tuple[int, int]], seed: int, joined: int,
                                           steps: int) -> None:
    """Many lanes (`steps` symbols each: runs of 8 lanes and more for the SIMD steps, cut by
    row and lane wraps) and few (the scalar tail)."""
    runs = [(n, min(r, n)) for n, r in runs]
    sym = _symbols(dtype, sum(n for n, _ in runs), seed)
    if joined > exponent.max_joined(dtype):
        joined = 0
    orig = exponent.JOINED_BITS_TRIED
    orig_steps = exponent.STEPS_PER_LANE
    exponent.JOINED_BITS_TRIED = (joined,)  # every joined width, so every rest layout (R mod 8, R div 8)
    exponent.STEPS_PER_LANE = steps
    try:
        data = encode_exponent(sym, dtype, runs)
        assert data is not None and data == encode_exponent(sym, dtype, runs, native=False)  # the compiled encoder too
    finally:
        exponent.JOINED_BITS_TRIED, exponent.STEPS_PER_LANE = orig, orig_steps
    want = ("ok", sym.astype(decode_exponent(data, sym.size, dtype).dtype).tobytes())
    assert _three(data, sym.size, dtype) == [want] * 3


@needs_native
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_rest_width_and_length_decodes_alike(dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every joined width t (so every rest layout: R = 1 + shift bits, R div 8 bytes and R mod 8
    bits) at payload lengths around the SIMD rest loops' strides (8 and 16 symbols) and their
    end tests: numpy, the scalar loop and the SIMD steps give the input's symbols."""
    for t in range(exponent.max_joined(dtype) + 1):
        monkeypatch.setattr(exponent, "JOINED_BITS_TRIED", (t,))
        for total in (*range(1, 41), 63, 64, 65, 127, 128, 129, 255, 1000, 1031):
            sym = _symbols(dtype, total, 1000 * t + total)
            data = encode_exponent(sym, dtype, [(total, min(total, 7))])
            assert data is not None
            want = ("ok", sym.astype(f"<u{exponent.DTYPE_BITS[dtype] // 8}").tobytes())
            assert _three(data, total, dtype) == [want] * 3, (t, total)


@needs_native
@settings(max_examples=40, deadline=None)
@given(st.sampled_from(DTYPES), st.integers(0, 2**32 - 1), st.lists(st.sampled_from([0, 1, 2, 3, 4, 5, 14]), min_size=1, max_size=6))
def test_every_table_grain_decodes_the_same(dtype: str, seed: int, grains: list[int]) -> None:
    """Tables whose frequencies share a factor 2^q (the compiled decoder's smaller tables; q is
    each segment's smallest over its classes, at most 4), mixed within a segment and across
    segments, cut by row and lane wraps: the same symbols on all three paths."""
    runs = [(9_000, 90), (5_000, 50), (3_001, 3_001)]  # columns of 4 scales: K = 4, one table in the last
    sym = _symbols(dtype, sum(n for n, _ in runs), seed, column_scales=True)
    calls = iter(range(10**6))
    quantize = rans.quantize

    def grained(counts: np.ndarray, grain: int = 0) -> np.ndarray:
        return quantize(counts, grains[next(calls) % len(grains)])

    orig, orig_steps = rans.quantize, exponent.STEPS_PER_LANE
    rans.quantize, exponent.STEPS_PER_LANE = grained, 40  # type: ignore[assignment]
    try:
        data = encode_exponent(sym, dtype, runs)
    finally:
        rans.quantize, exponent.STEPS_PER_LANE = orig, orig_steps  # type: ignore[assignment]
    assert data is not None and exponent.table_count(data, sym.size, dtype) == 9
    want = ("ok", sym.astype(decode_exponent(data, sym.size, dtype).dtype).tobytes())
    assert _three(data, sym.size, dtype) == [want] * 3


@functools.cache
def _damage_base(dtype: str) -> bytes:
    """20,000 symbols through 2,000 lanes (10 steps each): the decoder's unchecked steps (SIMD
    where the CPU has it) run until fewer words are left than a block has symbols."""
    sym = _symbols(dtype, 20_000, 3)
    orig = exponent.STEPS_PER_LANE
    exponent.STEPS_PER_LANE = 10
    try:
        return encode_exponent(sym, dtype, [(12_000, 60), (8_000, 40)]) or b""
    finally:
        exponent.STEPS_PER_LANE = orig


@needs_native
@settings(max_examples=200, deadline=None)
@given(st.sampled_from(DTYPES), st.integers(0, 2**32 - 1), st.sampled_from(DAMAGE))
def test_damage_gives_the_same_outcome_on_both(dtype: str, seed: int, how: str) -> None:
    base = _damage_base(dtype)
    data = damage(bytearray(base), np.random.default_rng(seed), how, len(base) // 3)  # mostly the stream and rest fields
    numpy_, simd, scalar = _three(bytes(data), 20_000, dtype)
    assert simd == numpy_ and scalar == numpy_


@needs_native
def test_every_codec3_vector_through_numpy_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """The vectors that use codec 3 decode to the same tensors (or the same error code) on the
    numpy path as on the compiled one."""
    manifest = json.loads((CONF / "manifest.json").read_text())
    ids = [v for v in manifest["vectors"] if "exponent" in v["id"]]
    assert len(ids) >= 50

    def run(v: dict) -> tuple[str, dict[str, bytes]]:
        try:
            with bbformat.Reader(CONF / v["path"]) as r:
                return "ok", {k: t.tobytes() for b in r.iter_blocks() for k, t in b.tensors.items()}
        except BBFormatError as e:
            return e.code, {}

    native = {v["id"]: run(v) for v in ids}
    monkeypatch.setattr(exponent, "_exponent_native", None)
    numpy_ = {v["id"]: run(v) for v in ids}
    assert native == numpy_
    assert any(code == "ok" for code, _ in native.values()) and any(code != "ok" for code, _ in native.values())


@needs_native
def test_the_wrong_arguments_are_a_value_error_not_a_crash() -> None:
    """The compiled function checks what exponent.py hands it (a bug there must not read out of bounds)."""
    native = exponent._exponent_native
    assert native is not None
    i64 = lambda *v: np.array(v, np.int64)  # noqa: E731
    u32 = lambda *v: np.array(v, np.uint32)  # noqa: E731
    good = dict(stream=b"\x00\x00\x01\x00", lanes=1, n=i64(1), r=i64(1), base=i64(0), has_map=np.zeros(1, np.uint8),
                maps=np.zeros(0, np.uint8), first=i64(0, 1), code=u32(3), freq=u32(2**14), rest=b"\x00" * 5, shift=4,
                width=16, out=np.zeros(1, np.uint16))  # one entry of frequency 2^14: x stays 2^16
    assert native.decode(*good.values()) == 0  # one symbol, one one-entry table: no word read
    for key, bad in [("base", i64(1)), ("freq", u32(2**14 - 1)), ("first", i64(0, 0)), ("first", i64(1, 1)),
                     ("first", i64(0)), ("code", u32(2**11)), ("rest", b"\x00"), ("out", np.zeros(2, np.uint16)),
                     ("shift", 15), ("lanes", 0), ("stream", b"\x00\x00\x01")]:
        with pytest.raises(ValueError, match="inconsistent arguments"):
            native.decode(*dict(good, **{key: bad}).values())
    two = dict(good, first=i64(0, 2), code=u32(1, 2), freq=u32(2**13, 2**13))
    assert native.decode(*two.values()) == 1  # tiles the slots: accepted; x = 2^16 then needs a word it lacks
    for freq in (u32(2**13, 2**13 + 1), u32(0, 2**14)):  # entries that do not tile the 2^14 slots
        with pytest.raises(ValueError, match="inconsistent arguments"):
            native.decode(*dict(two, freq=freq).values())
    wrap = dict(good, n=i64(2**62, 2**62, 2**62, 2**62 + 1), r=i64(1, 1, 1, 1), base=i64(0, 0, 0, 0),
                has_map=np.zeros(4, np.uint8))  # segment lengths whose sum wraps to 1
    with pytest.raises(ValueError, match="inconsistent arguments"):
        native.decode(*wrap.values())


def test_the_decoder_is_built_where_a_c_compiler_is() -> None:
    """The extension is optional (setup.py), so a broken build would pass silently: where the
    machine has a C compiler (CI installs one), the install must have built it."""
    import shutil

    assert NATIVE_DECODER or not (shutil.which("cc") or shutil.which("gcc"))


@needs_native
def test_the_simd_steps_run_where_the_cpu_has_them() -> None:
    """On x86-64 with AVX2 (every CI machine so far), the SIMD path is the one in use, so the
    comparisons above test it; elsewhere the scalar loop is, and SIMD is 0."""
    import platform

    native = exponent._exponent_native
    assert native is not None and native.SIMD in (0, 1)
    if platform.machine() in ("x86_64", "AMD64"):
        flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
        assert native.SIMD == (1 if " avx2" in flags else 0) or not flags


@needs_native
def test_the_decoder_builds_and_decodes_without_its_simd_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Built as on a CPU without AVX2 code paths (non-x86 hosts, MSVC): BBFORMAT_NO_SIMD leaves
    out every x86 intrinsic, so nothing outside that section may use one. The build decodes a
    writer-made payload of each dtype to its symbols."""
    import importlib.util
    import shutil
    import subprocess
    import sysconfig

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    src = Path(exponent.__file__).with_name("_exponent_native.c")
    so = tmp_path / ("_exponent_native" + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))
    cmd = [cc, "-O1", "-fPIC", "-shared", "-Werror", "-Wall", "-DBBFORMAT_NO_SIMD", f"-I{sysconfig.get_paths()['include']}", str(src), "-o", str(so)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    spec = importlib.util.spec_from_file_location("_exponent_native", so)
    assert spec is not None and spec.loader is not None
    plain = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plain)
    assert plain.SIMD == 0 and plain.ABI == exponent._exponent_native.ABI
    payloads = []
    for dtype in DTYPES:  # written by the installed build
        sym = _symbols(dtype, 5000, 7)
        data = encode_exponent(sym, dtype, [(3000, 40), (2000, 7)])
        assert data is not None
        payloads.append((dtype, sym, data))
    monkeypatch.setattr(exponent, "_exponent_native", plain)
    for dtype, sym, data in payloads:
        got = decode_exponent(data, sym.size, dtype)
        assert got.tobytes() == sym.astype(got.dtype).tobytes()


def _group(b: bytes) -> bytes:
    return encode_varint(len(b)) + b"\x00" + b


Parts = tuple[int, int, int, list[tuple[int, int, int]], list[np.ndarray], rans.Tables]  # shift, bits, lanes, segs, maps, tables


def _direct_payload(rng: np.random.Generator, dtype: str) -> tuple[bytes, bytes, bytes, int, np.ndarray, Parts]:
    """A codec-3 payload built here, not by the writer: any t, K = 1..16 with random class maps,
    segments up to 14,000 symbols (longer than the decoder's blocks, so class maps carry across
    them), any lane count, random tables and rest fields. (head, stream, rest, P, symbols, parts)."""
    from bbformat.codec.varint import encode_varints

    t = int(rng.integers(0, exponent.max_joined(dtype) + 1))
    w, shift, bits = exponent.split_fields(dtype, t)
    alphabet = 1 << bits
    segs = []
    for _ in range(int(rng.integers(1, 5))):
        n = int(rng.choice([rng.integers(1, 50), rng.integers(1, 3000), rng.integers(4000, 14000)]))
        r = int(rng.integers(1, min(n, 50) + 1)) if rng.random() < 0.8 else int(rng.integers(1, n + 1))
        segs.append((n, r, int(rng.choice([1, 1, 2, 4, 16, int(rng.integers(1, 17))]))))
    total = sum(n for n, _, _ in segs)
    lanes = int(rng.choice([1, int(rng.integers(1, min(total, 65536) + 1)), exponent.lanes_for(total), min(total, 65536)]))
    maps = [rng.integers(0, k, r).astype(np.uint8) for _, r, k in segs if k > 1]
    tabs, raw = [], b""
    for _, _, k in segs:
        for _ in range(k):
            m = int(rng.integers(1, min(alphabet, 40) + 1))
            syms = np.sort(rng.choice(alphabet, m, replace=False))
            if rng.random() < 0.3:
                f = np.ones(m, np.int64)
                f[0] += rans.M - m
            else:
                f = np.diff(np.concatenate(([0], np.sort(rng.choice(np.arange(1, rans.M), m - 1, replace=False)), [rans.M])))
            tabs.append((syms, f))
            pairs = np.empty(2 * m, np.uint64)
            pairs[0::2], pairs[1::2] = np.diff(syms, prepend=-1) - 1, f
            raw += encode_varint(m) + encode_varints(pairs)
    tables = rans.Tables.of(tabs)
    ids = exponent._Layout(segs, maps).table_ids(0, total).astype(np.int64)
    ent = tables.first[ids] + (rng.random(total) * np.diff(tables.first)[ids]).astype(np.int64)
    stream = rans.encode(lambda lo, hi: ent[lo:hi], total, lanes, tables)
    rest = rng.integers(0, 1 << (w - bits), total).astype(np.uint64)
    low, high = exponent.pack_rest(rest, w - bits)
    head = bytes([t]) + encode_varint(len(segs)) + b"".join(encode_varint(n) + encode_varint(r) + bytes([k]) for n, r, k in segs)
    head += encode_varint(lanes) + _group(b"".join(m.tobytes() for m in maps)) + encode_varint(len(raw)) + _group(raw)
    code = tables.symbol[ent].astype(np.uint64)
    sym = ((rest >> np.uint64(shift)) << np.uint64(w - 1)) | (code << np.uint64(shift)) | (rest & np.uint64((1 << shift) - 1))
    return head, stream, low + high, total, sym, (shift, bits, lanes, segs, maps, tables)


@needs_native
@settings(max_examples=40, deadline=None)
@given(st.sampled_from(DTYPES), st.integers(0, 2**32 - 1))
def test_arbitrary_payloads_and_their_damage(dtype: str, seed: int) -> None:
    """Payloads the writer would not make (many classes, odd lane counts, every t) decode to
    their symbols on all three paths; damaged streams and rest fields give one outcome."""
    rng = np.random.default_rng(seed)
    head, stream, rest, total, sym, _ = _direct_payload(rng, dtype)
    want = ("ok", sym.astype(f"<u{exponent.DTYPE_BITS[dtype] // 8}").tobytes())
    assert _three(head + encode_varint(len(stream)) + stream + rest, total, dtype) == [want] * 3
    for _ in range(4):
        s, r = bytearray(stream), bytearray(rest)
        how = int(rng.integers(0, 5))
        if how == 0:
            s[int(rng.integers(0, len(s)))] ^= 1 << int(rng.integers(0, 8))
        elif how == 1:
            del s[-2:]
        elif how == 2:
            s += bytes(rng.integers(0, 256, 2, dtype=np.uint8))
        elif how == 3 and r:
            r[-1] ^= 1 << int(rng.integers(0, 8))
        else:
            s = bytearray(rng.integers(0, 256, len(s), dtype=np.uint8).tobytes())
        numpy_, simd, scalar = _three(head + encode_varint(len(s)) + bytes(s) + bytes(r), total, dtype)
        assert simd == numpy_ and scalar == numpy_


@needs_native
@settings(max_examples=40, deadline=None)
@given(st.sampled_from(DTYPES), st.integers(0, 2**32 - 1))
def test_the_compiled_encoder_writes_the_reference_stream_of_any_payload(dtype: str, seed: int) -> None:
    """Payloads the writer would not make (up to 16 classes, odd lane counts, every t): the
    compiled encoder's stream and rest fields are those rans.encode and pack_rest wrote."""
    head, stream, rest, total, sym, (shift, bits, lanes, segs, maps, tables) = _direct_payload(np.random.default_rng(seed), dtype)
    native_sym = sym.astype(f"u{exponent.DTYPE_BITS[dtype] // 8}")
    assert bytes(exponent._encode_native(native_sym, shift, bits, lanes, segs, maps, tables)) == stream
    w = exponent.DTYPE_BITS[dtype]
    assert b"".join(bytes(p) for p in exponent._rest_native(native_sym, w, shift)) == rest
    assert b"".join(exponent._rest_numpy(native_sym, w, shift)) == rest


@needs_native
@pytest.mark.parametrize("r", [1, 7, 40, 300])
def test_histograms_and_column_means_agree_in_pieces(r: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """numpy counts in pieces of whole rows (here 16 symbols, so rows longer than a piece too);
    the compiled loop in one pass: the same counts and means."""
    monkeypatch.setattr(exponent, "REST_PIECE", 16)
    sym = _symbols("bfloat16", 5_003, 9)
    cls = np.random.default_rng(r).integers(0, 4, r).astype(np.uint8)
    for shift, bits in ((7, 8), (5, 10), (4, 11)):
        for c, k in ((None, 1), (cls, 4)):
            want = exponent._histogram(sym, shift, bits, r, c, k, native=False)
            assert want.sum() == sym.size
            assert np.array_equal(exponent._histogram(sym, shift, bits, r, c, k, native=True), want)
        assert np.array_equal(exponent._column_means(sym, shift, bits, r, True), exponent._column_means(sym, shift, bits, r, False))


@needs_native
def test_the_encoders_wrong_arguments_are_a_value_error_not_a_crash() -> None:
    native = exponent._exponent_native
    assert native is not None
    sym = np.array([0x3C00, 0x3C01], np.uint16)
    tab = rans.Tables.of([(np.array([0x3C00 >> 10]), np.array([rans.M]))])
    i64 = lambda *v: np.array(v, np.int64)  # noqa: E731
    good = dict(sym=sym, width=16, shift=10, bits=5, lanes=1, n=i64(2), r=i64(1), base=i64(0), has_map=np.zeros(1, np.uint8),
                maps=np.zeros(0, np.uint8), entry_of=tab.entry_of(32).astype(np.int32), freq=tab.freq, start=tab.start,
                out=np.zeros(8, np.uint8))
    assert native.encode(*good.values()) == 4  # two symbols of probability 1: the state stays 2^16, no word
    for key, bad in [("width", 8), ("bits", 0), ("shift", 12), ("lanes", 0), ("n", i64(3)), ("base", i64(1)),
                     ("has_map", np.ones(1, np.uint8)), ("entry_of", np.zeros(31, np.int32)), ("freq", np.zeros(1, np.uint32)),
                     ("start", np.zeros(2, np.uint32)), ("out", np.zeros(7, np.uint8)), ("entry_of", np.full(32, 1, np.int32))]:
        with pytest.raises(ValueError, match="inconsistent arguments"):
            native.encode(*dict(good, **{key: bad}).values())
    with pytest.raises(ValueError, match="no entry"):  # 0x3C01 >> 10 is the same code; 0x4000 >> 10 is not in the table
        native.encode(*dict(good, sym=np.array([0x3C00, 0x4000], np.uint16)).values())
    counts = np.zeros((1, 32), np.uint64)
    native.histogram(sym, 16, 10, 5, 1, b"", counts)
    assert counts[0, 0x3C00 >> 10] == 2
    for args in [(sym, 16, 10, 5, 0, b"", counts), (sym, 16, 10, 5, 2, b"\x01\x00", counts), (sym, 16, 12, 5, 1, b"", counts),
                 (sym, 16, 10, 5, 1, b"", np.zeros(31, np.uint64))]:
        with pytest.raises(ValueError, match="inconsistent arguments"):
            native.histogram(*args)
    with pytest.raises(ValueError, match="inconsistent arguments"):
        native.column_sums(sym, 16, 10, 5, 2, np.zeros(1, np.uint64))
    with pytest.raises(ValueError, match="inconsistent arguments"):
        native.pack_rest(sym, 16, 10, np.zeros(2, np.uint8), np.zeros(1, np.uint8))  # R = 11: 1 byte and 3 bits a symbol
    low, high = np.zeros(2, np.uint8), np.zeros(3, np.uint8)
    native.pack_rest(sym, 16, 10, low, high)
    assert low.tobytes() + high.tobytes() == b"".join(exponent._rest_numpy(sym, 16, 10))


def _table_bytes(rng: np.random.Generator, alphabet: int, k: int) -> bytes:
    """k valid tables of a `alphabet`-code alphabet, as stored (SPEC.md 8.7)."""
    out = bytearray()
    for _ in range(k):
        m = int(rng.integers(1, min(alphabet, 40) + 1))
        codes = np.sort(rng.choice(alphabet, m, replace=False))
        freq = rans.quantize(rng.integers(1, 1000, m))
        out += encode_varint(m)
        prev = -1
        for a, f in zip(codes, freq):
            out += encode_varint(int(a) - prev - 1) + encode_varint(int(f))
            prev = int(a)
    return bytes(out)


@needs_native
@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 12), st.integers(1, 5), st.sampled_from(["none", "flip", "cut", "add", "set"]))
def test_the_compiled_table_reader_accepts_exactly_what_numpy_accepts(seed: int, bits: int, k: int, how: str) -> None:
    """The same tables from valid bytes, and a refusal exactly where numpy refuses (it then
    gives the message): random tables, whole or with a byte flipped, cut, added or set."""
    rng = np.random.default_rng(seed)
    alphabet = 1 << bits
    raw = bytearray(_table_bytes(rng, alphabet, k))
    at = int(rng.integers(0, len(raw)))
    if how == "flip":
        raw[at] ^= 1 << int(rng.integers(0, 8))
    elif how == "cut":
        del raw[at:]
    elif how == "add":
        raw.insert(at, int(rng.integers(0, 256)))
    elif how == "set":
        raw[at] = int(rng.choice([0x00, 0x7F, 0x80, 0xFF]))
    segs = [(1, 1, k)]
    b = np.frombuffer(bytes(raw), np.uint8)
    try:
        want = exponent.read_tables(b, segs, alphabet, native=False)
    except BBFormatError as e:
        assert e.code == "E_SECTION_CONTENT"
        want = None
    count = k
    code, freq, start = (np.empty(len(raw) // 2 + 1, np.uint32) for _ in range(3))
    first = np.empty(count + 1, np.int64)
    got = exponent._exponent_native.tables(b, count, alphabet, code, freq, start, first)
    if want is None:
        assert got == -1
    else:
        assert got == want.freq.size
        for name, arr in (("symbol", code), ("freq", freq), ("start", start)):
            assert np.array_equal(arr[:got], getattr(want, name)), name
        assert np.array_equal(first, want.first)

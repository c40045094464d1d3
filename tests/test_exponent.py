"""Payload codec 3, "exponent" (SPEC.md 8.7): the rANS push/pop pair, the codec's round trip
on every dtype, an independent scalar decoder written from SPEC.md alone, and every rule a
reader must check."""
from __future__ import annotations

import functools
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bbformat.codec import exponent, rans
from bbformat.codec.exponent import decode_exponent, encode_exponent, lanes_for, max_joined, split_fields
from bbformat.constants import EXPONENT_FIELD, MAX_EXPONENT_TABLES, RANS_LOW, RANS_PRECISION_BITS
from bbformat.errors import FormatError, LimitError
from conftest import DAMAGE, assert_refused_without, damage, sample_container, sample_tensors

M = 1 << RANS_PRECISION_BITS
DTYPES = ("float16", "bfloat16", "float32")


def _weights(dtype: str, n: int, seed: int = 0) -> np.ndarray:
    """Gaussian-like weights with a few specials, as W-bit symbols."""
    import torch

    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n) * 0.02
    specials = [np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-30, 65000.0]
    x[rng.choice(n, len(specials), replace=False)] = specials
    t = torch.from_numpy(x).to(getattr(torch, dtype))
    bits = 32 if dtype == "float32" else 16
    return t.view(torch.int32 if bits == 32 else torch.int16).numpy().view(np.uint32 if bits == 32 else np.uint16).copy()


# ----------------------------------------------------------------------------- rANS


@st.composite
def _streams(draw: st.DrawFn) -> tuple[rans.Tables, np.ndarray, np.ndarray, int]:
    ntab = draw(st.integers(1, 4))
    alphabet = draw(st.integers(1, 40))
    tables = []
    for _ in range(ntab):
        counts = np.array(draw(st.lists(st.integers(0, 10**6), min_size=alphabet, max_size=alphabet)), np.int64)
        if counts.sum() == 0:
            counts[0] = 1
        f = rans.quantize(counts)
        s = np.flatnonzero(f)
        tables.append((s, f[s]))
    t = rans.Tables.of(tables)
    n = draw(st.integers(1, 600))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    tid = rng.integers(0, ntab, n)
    entry = np.array([rng.integers(t.first[k], t.first[k + 1]) for k in tid], np.int64)
    lanes = draw(st.integers(1, n))
    return t, tid, entry, lanes


@settings(max_examples=60, deadline=None)
@given(_streams())
def test_push_then_pop_restores_every_symbol_and_the_state(case: tuple[rans.Tables, np.ndarray, np.ndarray, int]) -> None:
    t, tid, entry, lanes = case
    stream = rans.encode(lambda lo, hi: entry[lo:hi], entry.size, lanes, t)
    got = rans.decode(stream, entry.size, lanes, t, lambda lo, hi: tid[lo:hi])  # checks every lane ends at 2^16
    assert np.array_equal(got, entry)


def test_push_and_pop_are_inverse_on_one_step() -> None:
    t = rans.Tables.of([(np.array([0, 3, 7]), rans.quantize(np.array([5, 0, 0, 90, 0, 0, 0, 5]))[[0, 3, 7]])])
    rng = np.random.default_rng(1)
    x0 = rng.integers(RANS_LOW, 1 << 32, 50, dtype=np.uint64)
    e = rng.integers(0, 3, 50)
    x, words = rans.push(x0.copy(), t.freq[e], t.start[e])
    assert (x >= RANS_LOW).all() and (x < (1 << 32)).all()
    xs = x.astype(np.uint32)
    got, pos = rans.pop(xs, np.zeros(50, np.uint32), t.lookup(), t, words.astype(np.uint32), 0)
    assert np.array_equal(got, e) and pos == words.size and np.array_equal(xs, x0.astype(np.uint32))


@given(st.lists(st.integers(0, 10**9), min_size=1, max_size=300))
def test_quantize_keeps_every_symbol_and_sums_to_m(counts: list[int]) -> None:
    c = np.array(counts, np.int64)
    if c.sum() == 0:
        c[0] = 1
    f = rans.quantize(c)
    assert int(f.sum()) == M
    assert ((f > 0) == (c > 0)).all()


@given(st.lists(st.integers(0, 10**9), min_size=1, max_size=300), st.integers(0, 14))
def test_quantize_with_a_grain_gives_multiples_of_it(counts: list[int], grain: int) -> None:
    """Frequencies in units of 2^grain where there are units enough for every symbol present
    (else the grain is lowered until there are), still summing to M; grain 0 is the plain rule."""
    c = np.array(counts, np.int64)
    if c.sum() == 0:
        c[0] = 1
    f = rans.quantize(c, grain)
    assert int(f.sum()) == M and ((f > 0) == (c > 0)).all()
    used = max(g for g in range(grain + 1) if np.count_nonzero(c) <= M >> g)
    assert (f % (1 << used) == 0).all()
    if used == grain and grain < 14:  # the plain rule in units of 2^grain: the same shares
        assert np.array_equal(f >> grain, _units(c, M >> grain))


def _units(c: np.ndarray, units: int) -> np.ndarray:
    """The plain rule (largest remainders, floors of 1) for `units` in all, written out again."""
    n = int(c.sum())
    f = [max(1, int(x) * units // n) if x > 0 else 0 for x in c]
    short = units - sum(f)
    order = sorted((i for i in range(c.size) if c[i] > 0), key=lambda i: (-(int(c[i]) * units % n), i))
    for i in order[:max(short, 0)]:
        f[i] += 1
    while short < 0:
        i = int(np.argmax(f))
        take = min(-short, f[i] - 1)
        f[i] -= take
        short += take
    return np.array(f, np.int64)


def _tables_of(data: bytes, total: int, dtype: str, monkeypatch: pytest.MonkeyPatch) -> rans.Tables:
    """The tables of a codec-3 payload of `total` symbols, as its decoder reads them."""
    got: list[rans.Tables] = []
    read = exponent.read_tables

    def keep(*args: object, **kw: object) -> rans.Tables:
        got.append(read(*args, **kw))  # type: ignore[arg-type]
        return got[-1]

    with monkeypatch.context() as m:
        m.setattr(exponent, "read_tables", keep)
        decode_exponent(data, total, dtype)
    assert len(got) == 1
    return got[0]


def test_the_writer_tables_are_multiples_of_its_grain(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference writer's frequencies are multiples of 2^TABLE_GRAIN (the compiled decoder's
    smaller tables), and its payload decodes (numpy and compiled) to its symbols; with grain 0
    they are not all multiples of 4 (so the check can fail)."""
    sym = _weights("bfloat16", 60_000)
    data = encode_exponent(sym, "bfloat16", [(60_000, 600)])
    assert data is not None
    tables = _tables_of(data, sym.size, "bfloat16", monkeypatch)
    assert exponent.TABLE_GRAIN == 2 and (tables.freq % 4 == 0).all() and tables.count >= 1
    monkeypatch.setattr(exponent, "TABLE_GRAIN", 0)
    plain = encode_exponent(sym, "bfloat16", [(60_000, 600)])
    assert plain is not None and (_tables_of(plain, sym.size, "bfloat16", monkeypatch).freq % 4 != 0).any()
    for native in (False, True):
        assert np.array_equal(decode_exponent(data, sym.size, "bfloat16", native=native), sym)


# ----------------------------------------------------------------------------- the codec


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_every_dtype(dtype: str) -> None:
    sym = _weights(dtype, 50_000)
    runs = [(30_000, 300), (12_000, 40), (7_999, 7_999), (1, 1)]
    data = encode_exponent(sym, dtype, runs)
    assert data is not None and len(data) < sym.nbytes
    assert np.array_equal(decode_exponent(data, sym.size, dtype), sym)
    assert np.array_equal(_scalar_decode(data, sym.size, dtype), sym)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("joined", [0, 1, 3])
def test_every_joined_width_round_trips(dtype: str, joined: int, monkeypatch: pytest.MonkeyPatch) -> None:
    import bbformat.codec.exponent as X

    monkeypatch.setattr(X, "JOINED_BITS_TRIED", (joined,))
    sym = _weights(dtype, 9_000, seed=joined)
    data = encode_exponent(sym, dtype, [(9_000, 90)])
    assert data is not None and data[0] == joined
    assert np.array_equal(decode_exponent(data, sym.size, dtype), sym)
    assert np.array_equal(_scalar_decode(data, sym.size, dtype), sym)


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(DTYPES), st.lists(st.tuples(st.integers(1, 3000), st.integers(1, 200)), min_size=1, max_size=5),
       st.integers(0, 2**32 - 1))
def test_arbitrary_bit_patterns_round_trip(dtype: str, shape: list[tuple[int, int]], seed: int) -> None:
    bits = 32 if dtype == "float32" else 16
    rng = np.random.default_rng(seed)
    runs = [(n, min(r, n)) for n, r in shape]
    total = sum(n for n, _ in runs)
    sym = rng.integers(0, 1 << bits, total, dtype=np.uint64).astype(np.uint32 if bits == 32 else np.uint16)
    data = encode_exponent(sym, dtype, runs)
    assert data is not None
    assert np.array_equal(decode_exponent(data, total, dtype), sym)


def test_deterministic() -> None:
    sym = _weights("bfloat16", 20_000, seed=3)
    assert encode_exponent(sym, "bfloat16", [(20_000, 200)]) == encode_exponent(sym.copy(), "bfloat16", [(20_000, 200)])


def test_lanes_stay_in_range() -> None:
    assert lanes_for(1) == 1 and lanes_for(10**12) == 1 << 16


# ----------------------------------------------------------------------------- an independent reader


class _Cur:
    def __init__(self, b: bytes) -> None:
        self.b, self.p = b, 0

    def u8(self) -> int:
        self.p += 1
        return self.b[self.p - 1]

    def varint(self) -> int:
        v = s = 0
        while True:
            c = self.u8()
            v |= (c & 0x7F) << s
            s += 7
            if c < 0x80:
                return v

    def take(self, n: int) -> bytes:
        self.p += n
        assert self.p <= len(self.b)
        return self.b[self.p - n : self.p]

    def group(self) -> bytes:
        import zstandard

        n, codec = self.varint(), self.u8()
        raw = self.take(n)
        return raw if codec == 0 else zstandard.ZstdDecompressor().decompress(raw)


def _scalar_decode(data: bytes, total: int, dtype: str) -> np.ndarray:
    """SPEC.md 8.7 read literally, one symbol at a time (no code shared with the package)."""
    shift, width = {"float16": (10, 5), "bfloat16": (7, 8), "float32": (23, 8)}[dtype]
    w = 32 if dtype == "float32" else 16
    c = _Cur(bytes(data))
    t = c.u8()
    cs, cb = shift - t, width + t
    segs = [(c.varint(), c.varint(), c.u8()) for _ in range(c.varint())]
    q = c.varint()
    maps_raw = c.group()
    maps, mp = [], 0
    for n, r, k in segs:
        maps.append(list(maps_raw[mp : mp + r]) if k > 1 else None)
        mp += r if k > 1 else 0
    tl = c.varint()
    tc = _Cur(c.group())
    assert len(tc.b) == tl
    tables = []
    for n, r, k in segs:
        per = []
        for _ in range(k):
            m, sym, cum, rows = tc.varint(), -1, 0, []
            for _ in range(m):
                sym += tc.varint() + 1
                f = tc.varint()
                rows.append((sym, cum, f))
                cum += f
            assert cum == 1 << 14
            per.append(rows)
        tables.append(per)
    stream = c.take(c.varint())
    x = list(struct.unpack_from(f"<{q}I", stream))
    wp = 4 * q
    codes = []
    table_of = []
    for (n, r, k), per, mp_ in zip(segs, tables, maps):
        table_of += [per[mp_[i % r]] if k > 1 else per[0] for i in range(n)]
    for i in range(total):
        lane = i % q
        slot = x[lane] & 0x3FFF
        sym, cum, f = next(e for e in table_of[i] if e[1] <= slot < e[1] + e[2])
        x[lane] = f * (x[lane] >> 14) + slot - cum
        if x[lane] < 1 << 16:
            x[lane] = (x[lane] << 16) | struct.unpack_from("<H", stream, wp)[0]
            wp += 2
        codes.append(sym)
    assert wp == len(stream) and all(v == 1 << 16 for v in x)
    rb = w - cb
    b0, b1 = divmod(rb, 8)
    low = c.take(total * b0)
    high = c.take(-(-total // 8) * b1)
    assert c.p == len(c.b)
    out = np.empty(total, np.uint64)
    for i in range(total):
        rest = int.from_bytes(low[i * b0 : (i + 1) * b0], "little")
        g = int.from_bytes(high[(i // 8) * b1 : (i // 8 + 1) * b1], "little")
        rest |= ((g >> (b1 * (i % 8))) & ((1 << b1) - 1)) << (8 * b0)
        sign, mant = rest >> cs, rest & ((1 << cs) - 1)
        out[i] = (sign << (w - 1)) | (codes[i] << cs) | mant
    return out.astype(np.uint32 if w == 32 else np.uint16)


# ----------------------------------------------------------------------------- rejections


def _small() -> tuple[np.ndarray, bytes]:
    import bbformat.codec.exponent as X

    sym = _weights("bfloat16", 300, seed=5)
    data = encode_exponent(sym, "bfloat16", [(300, 30)])
    assert data is not None and X.split_fields("bfloat16", data[0])[0] == 16
    return sym, data


def _fields(data: bytes) -> dict[str, int]:
    """Offsets of one-segment K=1 payload fields (all varints one byte except where noted)."""
    c = _Cur(data)
    out = {"t": 0}
    c.u8()
    c.varint()
    c.varint(), c.varint(), c.u8()
    out["lanes"] = c.p
    c.varint()
    out["maps"] = c.p
    c.group()
    out["tables_length"] = c.p
    c.varint()
    out["tables"] = c.p
    c.group()
    out["stream_length"] = c.p
    n = c.varint()
    out["stream"] = c.p
    c.take(n)
    out["rest"] = c.p
    return out


def _code(data: bytes, total: int = 300) -> str:
    with pytest.raises((FormatError, LimitError)) as ei:
        decode_exponent(data, total, "bfloat16")
    return ei.value.code


def test_the_small_payload_is_one_segment_without_classes() -> None:
    sym, data = _small()
    f = _fields(data)
    assert data[f["maps"] : f["maps"] + 2] == b"\x00\x00" and f["rest"] < len(data)
    assert np.array_equal(decode_exponent(data, 300, "bfloat16"), sym)


def test_reject_too_many_joined_bits() -> None:
    _, data = _small()
    assert _code(bytes([max_joined("bfloat16") + 1]) + data[1:]) == "E_SECTION_CONTENT"


@pytest.mark.parametrize("lanes", [0, 301])
def test_reject_lanes_out_of_range(lanes: int) -> None:
    _, data = _small()
    f = _fields(data)
    assert data[f["lanes"]] < 0x80
    from bbformat.codec.varint import encode_varint

    bad = data[: f["lanes"]] + encode_varint(lanes) + data[f["lanes"] + 1 :]
    assert _code(bad) == "E_SECTION_CONTENT"


def test_reject_wrong_final_state_and_leftover_words() -> None:
    _, data = _small()
    f = _fields(data)
    b = bytearray(data)
    b[f["stream"]] ^= 1  # lane 0's first state: decodes, but cannot end at 2^16
    assert _code(bytes(b)) == "E_SECTION_CONTENT"


def test_reject_a_lane_starting_below_2_16() -> None:
    _, data = _small()
    f = _fields(data)
    b = bytearray(data)
    b[f["stream"] : f["stream"] + 4] = struct.pack("<I", 5)
    assert _code(bytes(b)) == "E_SECTION_CONTENT"


def test_reject_nonzero_rest_padding(monkeypatch: pytest.MonkeyPatch) -> None:
    import bbformat.codec.exponent as X

    monkeypatch.setattr(X, "JOINED_BITS_TRIED", (2,))  # 6 rest bits: 301 symbols leave 3 padding fields
    sym = _weights("bfloat16", 301, seed=6)
    data = encode_exponent(sym, "bfloat16", [(301, 7)])
    assert data is not None and data[0] == 2
    assert np.array_equal(X.decode_exponent(data, 301, "bfloat16"), sym)
    b = bytearray(data)
    b[-1] |= 0x80
    with pytest.raises(FormatError) as ei:
        X.decode_exponent(bytes(b), 301, "bfloat16")
    assert ei.value.code == "E_SECTION_CONTENT"


def test_reject_trailing_and_missing_bytes() -> None:
    _, data = _small()
    assert _code(data + b"\x00") == "E_SECTION_CONTENT"
    assert _code(data[:-1]) == "E_SECTION_CONTENT"


def test_reject_a_table_not_summing_to_m() -> None:
    _, data = _small()
    f = _fields(data)
    b = bytearray(data)
    assert b[f["tables"] + 1] == 0  # a raw group
    tab = f["tables"] + 2
    c = _Cur(bytes(b[tab:]))
    c.varint(), c.varint()
    pos = tab + c.p  # the first frequency varint
    b[pos] ^= 1
    assert _code(bytes(b)) == "E_SECTION_CONTENT"


def test_too_many_tables_is_a_limit() -> None:
    from bbformat.codec.varint import encode_varint

    n = MAX_EXPONENT_TABLES + 1
    head = bytes([0]) + encode_varint(n) + b"".join(b"\x01\x01\x01" for _ in range(n))
    with pytest.raises(LimitError) as ei:
        decode_exponent(head + b"\x00" * 16, n, "bfloat16")
    assert ei.value.code == "E_LIMIT_COUNT"


def test_exponent_field_constants() -> None:
    for dtype in DTYPES:
        w, cs, cb = split_fields(dtype, 0)
        assert (cs, cb) == EXPONENT_FIELD[dtype] and cs + cb == w - 1


def test_pack_exponent_end_to_end(tmp_path: Path) -> None:
    """pack --entropy exponent and auto: 1.5 files (1.3 with --format-version 1.3) that verify and
    unpack to the same files as --entropy none; `--format-version 1.2 --entropy auto` never uses
    codec 3 (a 1.2 file)."""
    from bbformat.checkpoint import write_checkpoint
    from bbformat.cli import main
    from bbformat.summary import inspect
    from bbformat.testing import make_tiny_checkpoint

    for dtype in ("bfloat16", "float32"):
        m = tmp_path / dtype
        write_checkpoint(make_tiny_checkpoint("llama", seed=4, layers=2, hidden=32, heads=4, kv_heads=2, vocab=64,
                                              max_positions=16, dtype=dtype), m)
        runs = {"e": ["--entropy", "exponent"], "a": ["--entropy", "auto"], "n": ["--entropy", "none"],
                "a13": ["--entropy", "auto", "--format-version", "1.3"], "n13": ["--entropy", "none", "--format-version", "1.3"],
                "a12": ["--entropy", "auto", "--format-version", "1.2"]}
        for name, args in runs.items():
            assert main(["pack", str(m), str(tmp_path / f"{dtype}{name}.bb"), "--verify", "--quiet", *args]) == 0
        info = {k: inspect(tmp_path / f"{dtype}{k}.bb") for k in runs}
        assert info["e"]["version"] == info["a"]["version"] == "1.5" and info["a13"]["version"] == "1.3"
        assert info["n"]["version"] == "1.4"  # --entropy none: raw payloads, no parts
        assert info["a12"]["version"] == "1.2"
        assert "exponent" in {b["payload_codec"] for b in info["a"]["blocks"]}
        assert "exponent" in {b["payload_codec"] for b in info["a13"]["blocks"]}
        assert "exponent" not in {b["payload_codec"] for b in info["a12"]["blocks"]}
        assert (tmp_path / f"{dtype}a13.bb").stat().st_size < (tmp_path / f"{dtype}a12.bb").stat().st_size
        for name in runs:
            assert main(["verify", str(tmp_path / f"{dtype}{name}.bb")]) == 0
            assert main(["unpack", str(tmp_path / f"{dtype}{name}.bb"), str(tmp_path / f"u{dtype}{name}"), "--quiet"]) == 0
        # the same files within a format version (1.4 and 1.5 count their band sections as side
        # information, so which sites pay for themselves may differ from 1.3's)
        for group in (("n", "e", "a"), ("n13", "a13", "a12")):
            for name in group:
                for f in (tmp_path / f"u{dtype}{group[0]}").iterdir():
                    assert (tmp_path / f"u{dtype}{name}" / f.name).read_bytes() == f.read_bytes()


def test_exponent_needs_format_1_3(tmp_path: Path) -> None:
    from bbformat.cli import main

    assert main(["pack", str(tmp_path), str(tmp_path / "x.bb"), "--entropy", "exponent", "--format-version", "1.2"]) == 2
    import io

    from bbformat import Writer
    from bbformat.errors import InputError

    for fv in ("1.2", "1.1"):  # the Writer refuses it too, before anything is written
        with pytest.raises(InputError, match="needs format 1.3 or later"):
            Writer(io.BytesIO(), "symmetric", 0, {}, entropy="exponent", format_version=fv)
    for fv in ("1.3", "1.4"):
        Writer(io.BytesIO(), "symmetric", 0, {}, entropy="exponent", format_version=fv)


def test_golden_v1_3_fixture_decodes_forever(monkeypatch: pytest.MonkeyPatch) -> None:
    """Written once (numcodecs style): the 1.3 fixture pins the writer's bytes (codec 3 in its
    float16 chunk, tables of grain 0 as the writer wrote them then), verifies its digests, and
    decodes to the same tensors as the 1.2 writer's file of the same input; the 1.0, 1.1 and
    1.2 fixtures still decode (test_entropy.py, test_digests.py)."""
    import hashlib
    import io

    from bbformat import Reader

    fix = Path(__file__).parent / "fixtures"
    golden = (fix / "sample_v1_3_exponent.bb").read_bytes()
    assert hashlib.sha256(golden).hexdigest() == (fix / "sample_v1_3_exponent.sha256").read_text().split()[0]
    with monkeypatch.context() as m:
        m.setattr(exponent, "TABLE_GRAIN", 0)
        assert sample_container(format_version="1.3", entropy="exponent") == golden
    with Reader(io.BytesIO(golden)) as r:
        assert (r.header.minor, r.read_chunk(0).sections[0]["codec"]) == (3, 3) and r.has_digests
        blocks = list(r.iter_blocks())
        assert all(b.exact for b in blocks)
        new = {n: t.tobytes() for b in blocks for n, t in b.tensors.items()}
    assert new == sample_tensors("1.2")


def test_a_1_2_reader_refuses_a_1_3_file_cleanly(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader that knows the 1.2 flags only stops at the header with E_REQUIRED_FLAG."""
    from bbformat.constants import RequiredFlag

    assert_refused_without(monkeypatch, RequiredFlag.EXPONENT, (Path(__file__).parent / "fixtures" / "sample_v1_3_exponent.bb").read_bytes())


def test_decoding_stays_within_the_declared_working_set() -> None:
    """SPEC.md 11.5: a codec-3 chunk's working set counts its slot lookups (64 KiB a table)."""
    import io
    import tracemalloc

    from bbformat import Reader
    from bbformat.constants import Codec
    from bbformat.container.chunks import working_set_bytes

    data = (Path(__file__).parent.parent / "conformance" / "valid" / "v_exponent_writer_exponent.bb").read_bytes()
    with Reader(io.BytesIO(data)) as r:
        chunks = [r.read_chunk(i) for i in range(len(r))]
        assert all(c.sections[0]["codec"] == Codec.EXPONENT for c in chunks)
        for c in chunks:
            need = working_set_bytes(c.program, r.entries[c.index].length, exponent=True)
            tracemalloc.start()
            try:
                r.decode_block(c.index)
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
            assert peak <= 2 * need + (1 << 20), (c.index, peak, need)


@pytest.mark.parametrize("dtype, joined", [("float16", 0), ("bfloat16", 2), ("float32", 3)])
def test_rest_fields_in_pieces_keep_the_layout(dtype: str, joined: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rest fields are packed and unpacked in pieces (memory): all low bytes first, then the
    packed high bits, whatever the piece size (checked against the scalar reader)."""
    import bbformat.codec.exponent as X

    monkeypatch.setattr(X, "JOINED_BITS_TRIED", (joined,))
    sym = _weights(dtype, 1_003, seed=8)
    whole = encode_exponent(sym, dtype, [(1_003, 17)])
    monkeypatch.setattr(X, "REST_PIECE", 16)
    pieces = encode_exponent(sym, dtype, [(1_003, 17)])
    assert pieces == whole and pieces is not None
    assert np.array_equal(decode_exponent(pieces, sym.size, dtype), sym)
    assert np.array_equal(_scalar_decode(pieces, sym.size, dtype), sym)


@functools.lru_cache(maxsize=1)
def _damage_base() -> bytes:
    return encode_exponent(_weights("bfloat16", 2_000, seed=11), "bfloat16", [(1_500, 50), (500, 20)]) or b""


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from(DAMAGE))
def test_a_damaged_payload_is_a_format_error_or_decodes(seed: int, how: str) -> None:
    """Whatever the damage, the decoder returns `total` symbols or raises one of the format's
    errors: never an IndexError, a numpy error or a huge allocation."""
    import bbformat.codec.exponent as X

    data = damage(bytearray(_damage_base()), np.random.default_rng(seed), how)
    try:
        out = X.decode_exponent(bytes(data), 2_000, "bfloat16")
    except (FormatError, LimitError):
        return
    assert out.size == 2_000


def test_pack_and_inspect_report_bits_per_weight(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from bbformat.checkpoint import write_checkpoint
    from bbformat.cli import main
    from bbformat.summary import inspect
    from bbformat.testing import make_tiny_checkpoint

    write_checkpoint(make_tiny_checkpoint("llama", seed=2, layers=1, hidden=32, heads=4, kv_heads=2, vocab=64, max_positions=16,
                                          dtype="bfloat16"), tmp_path / "m")
    assert main(["pack", str(tmp_path / "m"), str(tmp_path / "m.bb"), "--entropy", "exponent"]) == 0
    t = inspect(tmp_path / "m.bb")["totals"]
    assert t["values"] == sum(int(np.prod(x["shape"])) for b in inspect(tmp_path / "m.bb")["blocks"] for x in b["tensors"])
    assert t["bits_per_weight"] == pytest.approx(8 * t["weights_bytes"] / t["values"]) and t["plain_bits_per_weight"] == 16
    assert f"{t['bits_per_weight']:.3f} bits per weight against 16" in capsys.readouterr().out
    assert main(["inspect", str(tmp_path / "m.bb")]) == 0
    import re

    assert re.search(rf"bits per weight +{t['bits_per_weight']:.3f} ", capsys.readouterr().out)

"""Payload codec 4, parts (SPEC.md 8.9, format 1.5): the cut points, the byte layout both ways,
the rules a reader checks (and their order), and the same bytes and symbols whatever the
threads."""
from __future__ import annotations

import io
import subprocess
import sys
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from bbformat import Reader, Writer
from bbformat.codec import exponent
from bbformat.codec.entropy import payload_segments
from bbformat.codec.exponent import encode_exponent, table_count
from bbformat.codec import parts, payload
from bbformat.codec.parts import cut_runs, encode_parts, part_cuts, population_cuts, population_plan, read_parts
from bbformat.codec.varint import encode_varint
from bbformat.codec.payload import COUNTS_REFERENCES, OutputBuffers, PartPool, code_payload, decode_payload, part_threads
from bbformat.codec.runner import in_turn, on_pool
from bbformat.constants import MAX_EXPONENT_TABLES, MAX_PAYLOAD_PARTS, PART_SYMBOLS, POPULATION_BLOCK, WRITER_PARTS, Codec, OpKind, RequiredFlag
from bbformat.container.program import BlockProgram, Op, TensorEntry
from bbformat.errors import FormatError, InputError, LimitError
from conftest import assert_refused_without, sample_container

ALL = int(RequiredFlag.PLANES | RequiredFlag.EXPONENT | RequiredFlag.PARTS)


def _program(shapes: list[tuple[int, int]], dtype: str = "bfloat16") -> BlockProgram:
    tensors = [TensorEntry(f"t{i}", dtype, s) for i, s in enumerate(shapes)]
    return BlockProgram("b", dtype, tensors, [], [Op(OpKind.PUSH, i) for i in range(len(shapes))])


def _weights(program: BlockProgram, seed: int = 0) -> bytes:
    n = program.payload_symbols()
    x = np.random.default_rng(seed).normal(0, 0.02, n).astype(np.float32)
    if program.symbol_dtype == "float32":
        return x.tobytes()
    if program.symbol_dtype == "float16":
        return x.astype(np.float16).tobytes()
    return (x.view(np.uint32) >> 16).astype("<u2").tobytes()


def test_cuts_fall_on_row_starts_and_cover_the_payload() -> None:
    runs = [(1000 * 37, 37), (5, 5), (3000 * 11, 11)]
    total = sum(n for n, _ in runs)
    cuts = part_cuts(runs, total, 10_000)
    assert cuts[0] == 0 and cuts[-1] == total and all(a < b for a, b in zip(cuts, cuts[1:]))
    assert len(cuts) - 1 == -(-total // 10_000)
    starts = [0, runs[0][0], runs[0][0] + runs[1][0]]
    for c in cuts[1:-1]:
        j = max(k for k, s in enumerate(starts) if s <= c)
        assert (c - starts[j]) % runs[j][1] == 0, c  # the start of a row of its run
    pieces = [cut_runs(runs, a, b) for a, b in zip(cuts, cuts[1:])]
    assert sum(n for p in pieces for n, _ in p) == total
    assert all(r <= n for p in pieces for n, r in p)


def test_cuts_are_capped_and_small_payloads_are_not_cut() -> None:
    assert part_cuts([(100, 10)], 100, 100) == [0, 100]
    assert len(part_cuts([(10**6, 1)], 10**6, 10)) - 1 == WRITER_PARTS


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0, 1, 2, 3]), st.integers(1, 40)), min_size=2, max_size=6), st.integers(0, 2**31))
def test_push_then_pop_restores_every_part(spec: list[tuple[int, int]], seed: int) -> None:
    """encode_parts then read_parts gives back each part's codec, span and bytes, for any codecs."""
    rng = np.random.default_rng(seed)
    parts = [(codec, n, rng.bytes(2 * n if codec == Codec.RAW else int(rng.integers(0, 30)))) for codec, n in spec]
    total = sum(n for _, n, _ in parts)
    got = read_parts(encode_parts(parts), total, 2, (0, 1, 2, 3))
    lo = 0
    for (codec, n, stored), p in zip(parts, got):
        assert (p.codec, p.lo, p.hi, bytes(p.stored)) == (codec, lo, lo + n, stored)
        lo += n


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("mode", ["auto", "exponent", "planes", "zstd"])
def test_large_payloads_are_cut_and_decode_to_the_same_symbols(dtype: str, mode: str) -> None:
    prog = _program([(300, 64), (7, 5), (200, 96)], dtype)
    data = _weights(prog)
    codec, stored = code_payload(prog, data, mode, ALL, part_symbols=8000)
    assert codec == Codec.PARTS
    parts = read_parts(stored, prog.payload_symbols(), prog.symbol_bits // 8, (0, 1, 2, 3))
    assert len(parts) == -(-prog.payload_symbols() // 8000)
    want = {"auto": None, "exponent": Codec.EXPONENT, "planes": Codec.PLANES, "zstd": Codec.ZSTD}[mode]
    assert want is None or {p.codec for p in parts} <= {want, Codec.RAW}
    with ThreadPoolExecutor(3) as pool:
        for run in (in_turn, on_pool(pool)):
            assert decode_payload(codec, stored, prog, ALL, run).tobytes() == data
    assert code_payload(prog, data, mode, ALL, part_symbols=10**9)[0] != Codec.PARTS  # one part: not cut
    assert code_payload(prog, data, mode, ALL & ~RequiredFlag.PARTS, part_symbols=8000)[0] != Codec.PARTS  # 1.4: not cut


def test_the_bytes_do_not_depend_on_threads() -> None:
    prog = _program([(500, 64)])
    data = _weights(prog, 3)
    with ThreadPoolExecutor(4) as pool:
        assert code_payload(prog, data, "auto", ALL, on_pool(pool), 3000) == code_payload(prog, data, "auto", ALL, in_turn, 3000)


def test_a_payload_whose_parts_are_all_raw_is_stored_raw() -> None:
    prog = _program([(100, 64)])
    data = np.random.default_rng(1).integers(0, 2**16, prog.payload_symbols(), dtype=np.uint16).tobytes()  # incompressible
    assert code_payload(prog, data, "auto", ALL, part_symbols=1000) == (Codec.RAW, data)


def test_codec3_parts_stay_within_the_payload_table_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """A part whose tables would pass 1,024 with the earlier parts' takes another codec."""
    import bbformat.codec.payload as payload

    monkeypatch.setattr(payload, "MAX_EXPONENT_TABLES", 2)
    prog = _program([(400, 64)])
    data = _weights(prog, 5)
    codec, stored = code_payload(prog, data, "auto", ALL, part_symbols=6400)
    parts = read_parts(stored, prog.payload_symbols(), 2, (0, 1, 2, 3))
    counts = [table_count(p.stored, p.hi - p.lo, "bfloat16") for p in parts if p.codec == Codec.EXPONENT]
    assert counts and sum(counts) <= 2 and len(counts) < len(parts)
    assert decode_payload(codec, stored, prog, ALL).tobytes() == data


# ----------------------------------------------------------------------------- cuts where the rows change codec

LOW_ROWS, ROWS, COLS = 700, 2000, 256  # rows 0..699 low-precision, the rest full precision


def _two_populations(seed: int = 0) -> tuple[BlockProgram, bytes]:
    """float32 rows: first float16-precision values (low 13 mantissa bits zero: codec 2's
    lower planes are nearly free), then full-precision ones (codec 3's exponent model wins)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 0.02, (ROWS, COLS)).astype(np.float32)
    x[:LOW_ROWS] = x[:LOW_ROWS].astype(np.float16).astype(np.float32)
    return _program([(ROWS, COLS)], "float32"), x.tobytes()


def _even_rule_payload(monkeypatch: pytest.MonkeyPatch, prog: BlockProgram, data: bytes, part_symbols: int) -> bytes:
    """The payload the writer stored before cuts followed the rows' codec: cuts part_cuts' alone."""
    with monkeypatch.context() as m:
        m.setattr(payload, "population_plan", lambda sym, dtype, runs, ps, **_: (part_cuts(runs, len(sym), ps), None))
        return code_payload(prog, data, "auto", ALL, part_symbols=part_symbols)[1]


@pytest.mark.parametrize("part_symbols", [PART_SYMBOLS, 200_000])
def test_a_cut_falls_where_the_rows_change_codec_and_the_payload_shrinks(monkeypatch: pytest.MonkeyPatch, part_symbols: int) -> None:
    prog, data = _two_populations()
    total = ROWS * COLS
    codec, stored = code_payload(prog, data, "auto", ALL, part_symbols=part_symbols)
    assert codec == Codec.PARTS
    parts = read_parts(stored, total, 4, (0, 1, 2, 3))
    assert LOW_ROWS * COLS in [p.lo for p in parts]  # the boundary, found inside a 64 Ki-symbol block
    assert parts[0].codec == Codec.PLANES and parts[-1].codec == Codec.EXPONENT
    assert all(p.hi - p.lo <= part_symbols for p in parts)
    assert len(stored) < len(_even_rule_payload(monkeypatch, prog, data, part_symbols))
    with ThreadPoolExecutor(3) as pool:
        for run in (in_turn, on_pool(pool)):
            assert decode_payload(codec, stored, prog, ALL, run).tobytes() == data
        assert code_payload(prog, data, "auto", ALL, on_pool(pool), part_symbols) == (codec, stored)


def test_each_parts_estimate_is_its_blocks_costs() -> None:
    """population_plan's estimate of each part: the same bounds as population_cuts; each part's
    bits the costs of the 64 Ki-symbol blocks it holds, a block its ends cut counted by the
    share of its symbols inside (summed here block by block); codec 2 estimated smaller on the
    low-precision rows only."""
    prog, data = _two_populations()
    sym, runs = np.frombuffer(data, "<u4"), payload_segments(prog)
    cuts, est = population_plan(sym, "float32", runs, 100_000)
    assert cuts == population_cuts(sym, "float32", runs, 100_000) and est is not None and len(est) == len(cuts) - 1
    blocks = parts._even_cuts(runs, 0, len(sym), len(sym) // POPULATION_BLOCK)  # the estimate's blocks (white box)
    costs = parts._block_costs(sym, "float32", blocks)
    labels = parts._labels(*costs)
    assert any(lo not in blocks for lo in cuts)  # some part ends inside a block
    for (lo, hi), e in zip(zip(cuts, cuts[1:]), est):
        by_hand, labelled = [0.0, 0.0], False
        for b, (a, z) in enumerate(zip(blocks, blocks[1:])):
            inside = max(0, min(z, hi) - max(a, lo))
            labelled |= inside > 0 and labels[b] == 2
            for k in (0, 1):
                by_hand[k] += costs[k][b] * inside / (z - a)
        assert (e.planes, e.exponent) == pytest.approx(by_hand, rel=1e-9) and e.planes_block == labelled
    assert est[0].planes < est[0].exponent and est[-1].planes > est[-1].exponent
    assert est[0].planes_block and not est[-1].planes_block  # the low-precision rows' blocks are labelled codec 2
    assert population_plan(sym[: 2 * COLS], "float32", [(2 * COLS, COLS)], 100_000)[1] is None  # under 2 estimate blocks


def test_auto_skips_codec_2_where_the_estimate_rules_it_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """At a margin of 2% (the full-precision rows' estimate is about 3% over codec 3) the
    payload's bytes do not change but codec 2 is tried on fewer parts; at the writer's own
    margin the bytes do not change either; at a margin below -1 only the parts over blocks
    labelled codec 2 (the low-precision rows) try it, and they still take it; None: every part
    tries it."""
    prog, data = _two_populations()
    tried: list[int] = []
    real = payload.encode_planes
    monkeypatch.setattr(payload, "encode_planes", lambda sym, *a, **k: tried.append(len(sym)) or real(sym, *a, **k))
    by_margin = []
    for margin in (None, 0.02, payload.PLANES_SKIP_MARGIN, -2.0):
        monkeypatch.setattr(payload, "PLANES_SKIP_MARGIN", margin)
        tried.clear()
        by_margin.append((code_payload(prog, data, "auto", ALL, part_symbols=100_000), len(tried)))
    (every, n_every), (tight, n_tight), (writer, n_writer), (labelled, n_labelled) = by_margin
    assert tight == every and writer == every and labelled == every
    assert 0 < n_labelled <= n_tight < n_every and n_labelled <= n_writer <= n_every
    assert read_parts(labelled[1], ROWS * COLS, 4, (0, 1, 2, 3))[0].codec == Codec.PLANES


def test_without_a_codec_2_block_the_margin_alone_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no estimate block labelled codec 2, a margin below -1 keeps codec 2 off every part;
    the payload still decodes."""
    prog, data = _two_populations()
    real = payload.population_plan

    def unlabelled(*a: object, **k: object) -> object:
        cuts, est = real(*a, **k)  # type: ignore[arg-type]
        return cuts, [e._replace(planes_block=False) for e in est]

    monkeypatch.setattr(payload, "population_plan", unlabelled)
    monkeypatch.setattr(payload, "PLANES_SKIP_MARGIN", -2.0)
    never = code_payload(prog, data, "auto", ALL, part_symbols=100_000)
    assert all(p.codec != Codec.PLANES for p in read_parts(never[1], ROWS * COLS, 4, (0, 1, 2, 3)))
    assert decode_payload(*never, prog, ALL).tobytes() == data


def test_a_part_codec_3_cannot_take_still_tries_codec_2(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where codec 3 cannot code a part (its tables would pass the limit: encode_exponent gives
    None), the skip rule does not apply: codec 2 is tried even where the estimate rules it out."""
    prog, data = _two_populations()
    monkeypatch.setattr(payload, "PLANES_SKIP_MARGIN", -2.0)
    monkeypatch.setattr(payload, "encode_exponent", lambda *a, **k: None)
    codec, stored = code_payload(prog, data, "auto", ALL, part_symbols=100_000)
    assert codec == Codec.PARTS and {p.codec for p in read_parts(stored, ROWS * COLS, 4, (0, 1, 2, 3))} == {Codec.PLANES}
    assert decode_payload(codec, stored, prog, ALL).tobytes() == data


def test_one_population_keeps_the_even_cuts() -> None:
    prog = _program([(ROWS, COLS)], "float32")
    sym = np.frombuffer(_weights(prog, 2), "<u4")
    runs = payload_segments(prog)
    for part_symbols in (PART_SYMBOLS, 100_000, 30_000):
        assert population_cuts(sym, "float32", runs, part_symbols) == part_cuts(runs, sym.size, part_symbols)


def test_population_cuts_keep_the_part_limits() -> None:
    """Rows that change codec every 1,000 rows: a cut at each change while the parts fit in
    max_parts, else part_cuts' even bounds; parts of at most part_symbols (and a row)."""
    rows, cols, stretch = 8000, 256, 1000
    x = np.random.default_rng(4).normal(0, 0.02, (rows, cols)).astype(np.float32)
    for lo in range(0, rows, 2 * stretch):
        x[lo : lo + stretch] = x[lo : lo + stretch].astype(np.float16).astype(np.float32)
    sym, runs = x.view("<u4").ravel(), [(rows * cols, cols)]
    changes = list(range(0, rows + 1, stretch))
    assert [c // cols for c in population_cuts(sym, "float32", runs, 1 << 21)] == changes
    assert population_cuts(sym, "float32", runs, 1 << 21, max_parts=5) == part_cuts(runs, sym.size, 1 << 21, 5)
    small = population_cuts(sym, "float32", runs, 50_000)
    assert set(changes) <= {c // cols for c in small} and all(c % cols == 0 for c in small)
    assert all(b - a <= 50_000 + cols for a, b in zip(small, small[1:]))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_population_cuts_of_random_stretches_are_valid_bounds(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    """Stretches of 50..3,000 rows, low or full precision at random (changes close together
    included): the cuts increase from 0 to the end, on row starts, each part at most
    part_symbols and a row."""
    rng = np.random.default_rng(seed)
    cols, ends = 64, np.cumsum(rng.integers(50, 3000, 12))
    x = rng.normal(0, 0.02, (int(ends[-1]), cols)).astype(np.float32)
    for lo, hi in zip(np.concatenate(([0], ends[:-1])), ends):
        if rng.random() < 0.5:
            x[lo:hi] = x[lo:hi].astype(np.float16).astype(np.float32)
    sym, runs = x.view("<u4").ravel(), [(x.size, cols)]
    cuts = population_cuts(sym, "float32", runs, 200_000)
    assert cuts[0] == 0 and cuts[-1] == x.size and all(a < b for a, b in zip(cuts, cuts[1:]))
    assert all(c % cols == 0 for c in cuts) and all(b - a <= 200_000 + cols for a, b in zip(cuts, cuts[1:]))
    with ThreadPoolExecutor(3) as pool:  # the estimate's stretches on threads, and other stretch counts: the same cuts
        assert population_cuts(sym, "float32", runs, 200_000, run=on_pool(pool)) == cuts
        for jobs in (1, 5, 1000):
            monkeypatch.setattr(parts, "ESTIMATE_JOBS", jobs)
            assert population_cuts(sym, "float32", runs, 200_000, run=on_pool(pool)) == cuts


# ----------------------------------------------------------------------------- the reader's rules


def _prog_p(p: int = 64) -> BlockProgram:
    return _program([(p // 8, 8)], "float16")


def _sym(p: int = 64, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 0.05, p).astype(np.float16).view("<u2")


def _exp(sym: np.ndarray, runs: list[tuple[int, int]] | None = None) -> bytes:
    out = encode_exponent(sym, "float16", runs or [(sym.size, 8)])
    assert out is not None
    return out


def _refused(stored: bytes, code: str, flags: int = ALL, p: int = 64) -> str:
    with pytest.raises(FormatError) as ei:
        decode_payload(Codec.PARTS, stored, _prog_p(p), flags)
    assert ei.value.code == code, ei.value
    return str(ei.value)


def _rec(codec: int, n: int, length: int) -> bytes:
    return bytes([codec]) + encode_varint(n) + encode_varint(length)


def test_four_codecs_in_one_payload_decode() -> None:
    s = _sym()
    z = zstandard.ZstdCompressor().compress(s[16:32].tobytes())
    parts = [(0, 16, s[:16].tobytes()), (1, 16, z), (3, 32, _exp(s[32:]))]
    out = decode_payload(Codec.PARTS, encode_parts(parts), _prog_p(), ALL)
    assert out.tobytes() == s.tobytes()


@pytest.mark.parametrize("count", [0, 1, 65])
def test_part_count_out_of_range(count: int) -> None:
    _refused(encode_varint(count), "E_SECTION_CONTENT")


def test_part_count_over_the_limit_is_a_limit_error() -> None:
    with pytest.raises(LimitError) as ei:
        decode_payload(Codec.PARTS, encode_varint(MAX_PAYLOAD_PARTS + 1), _prog_p(), ALL)
    assert ei.value.code == "E_LIMIT_COUNT"


@pytest.mark.parametrize("codec,flags", [(4, ALL), (5, ALL), (2, int(RequiredFlag.EXPONENT | RequiredFlag.PARTS)),
                                         (3, int(RequiredFlag.PLANES | RequiredFlag.PARTS))])
def test_part_codecs_the_file_does_not_allow(codec: int, flags: int) -> None:
    _refused(encode_varint(2) + _rec(codec, 32, 1) + _rec(0, 32, 64), "E_CODEC", flags)


def test_record_rules() -> None:
    s = _sym().tobytes()
    _refused(encode_varint(2) + _rec(0, 0, 0) + _rec(0, 64, 128) + s, "E_SECTION_CONTENT")  # a part of 0 symbols
    _refused(encode_varint(2) + _rec(0, 65, 130), "E_SECTION_CONTENT")  # more symbols than the payload
    _refused(encode_varint(2) + _rec(0, 32, 64) + _rec(0, 31, 62) + s[:126], "E_SECTION_CONTENT")  # not covering P
    _refused(encode_varint(2) + _rec(0, 32, 64) + _rec(0, 32, 65) + s, "E_SECTION_CONTENT")  # past the section
    _refused(encode_varint(2) + _rec(0, 32, 64) + _rec(0, 32, 64) + s + b"\0", "E_SECTION_CONTENT")  # a byte after the parts
    _refused(encode_varint(2) + _rec(0, 32, 62) + _rec(0, 32, 64) + s[:126], "E_SECTION_SIZE")  # raw length not p_k * W/8
    _refused(encode_varint(2) + _rec(0, 32, 64), "E_SECTION_CONTENT")  # the records promise bytes that are missing


def test_part_errors_are_their_codecs_errors() -> None:
    s = _sym()
    bad_size = zstandard.ZstdCompressor().compress(s[:31].tobytes())
    _refused(encode_parts([(1, 32, bad_size), (0, 32, s[32:].tobytes())]), "E_SECTION_SIZE")
    two_frames = zstandard.ZstdCompressor().compress(s[:16].tobytes()) + zstandard.ZstdCompressor().compress(s[16:32].tobytes())
    _refused(encode_parts([(0, 32, s[:32].tobytes()), (1, 32, two_frames)]), "E_SECTION_SIZE")
    _refused(encode_parts([(0, 32, s[:32].tobytes()), (3, 32, _exp(s[32:]) + b"\0")]), "E_SECTION_CONTENT")


def test_tables_of_all_codec3_parts_count_against_one_limit() -> None:
    """Two codec-3 parts of 520 tables each: each within 1,024, together over it; the count
    is checked before any part is decoded, so part 0's damage is not what is reported."""
    head = bytes([0]) + encode_varint(33) + b"".join(encode_varint(1) + encode_varint(1) + b"\x10" for _ in range(32)) + encode_varint(1) + encode_varint(1) + b"\x10"
    assert 33 * 16 > MAX_EXPONENT_TABLES // 2
    damaged = zstandard.ZstdCompressor().compress(b"\0" * 10)  # E_SECTION_SIZE, were it decoded
    parts = [(1, 30, damaged), (3, 33, head), (3, 33, head)]
    with pytest.raises(LimitError) as ei:
        decode_payload(Codec.PARTS, encode_parts(parts), _prog_p(96), ALL)
    assert ei.value.code == "E_LIMIT_COUNT"


@pytest.mark.parametrize("threads", [1, 4])
def test_the_lowest_numbered_failing_part_is_reported(threads: int) -> None:
    s = _sym(128)
    bad_stream = _exp(s[32:64]) + b"\0"  # E_SECTION_CONTENT: a byte after the rest fields
    bad_size = zstandard.ZstdCompressor().compress(s[:10].tobytes())  # E_SECTION_SIZE
    ok = s[96:].tobytes()
    with ThreadPoolExecutor(threads) as pool:
        for first, second, code in ((bytes(bad_stream), bad_size, "E_SECTION_CONTENT"), (bad_size, bytes(bad_stream), "E_SECTION_SIZE")):
            codecs = [3 if first is not bad_size else 1, 3 if second is not bad_size else 1]
            stored = encode_parts([(0, 32, s[:32].tobytes()), (codecs[0], 32, first), (codecs[1], 32, second), (0, 32, ok)])
            with pytest.raises(FormatError) as ei:
                decode_payload(Codec.PARTS, stored, _prog_p(128), ALL, on_pool(pool))
            assert ei.value.code == code


# ----------------------------------------------------------------------------- files


def test_writer_and_reader_threads_give_the_same_bytes_and_tensors() -> None:
    files = [sample_container(entropy="auto", format_version="1.5", part_symbols=200, seed=3) for _ in range(2)]
    assert files[0] == files[1]
    with Reader(io.BytesIO(files[0])) as r:
        assert r.header.minor == 5 and r.header.required_flags & RequiredFlag.PARTS
        assert {r.read_chunk(i).sections[0]["codec"] for i in range(len(r))} >= {Codec.PARTS}
    decoded = []
    for threads in (1, 3):
        with Reader(io.BytesIO(files[0]), threads=threads) as r:
            decoded.append({n: t.tobytes() for b in r.iter_blocks() for n, t in b.tensors.items()})
    assert decoded[0] == decoded[1]
    with Reader(io.BytesIO(sample_container(entropy="auto", format_version="1.4", seed=3))) as r:
        assert {n: t.tobytes() for b in r.iter_blocks() for n, t in b.tensors.items()} == decoded[0]


def test_writer_threads_do_not_change_the_bytes(tmp_path: object) -> None:
    prog_shape = (1200, 64)
    rng = np.random.default_rng(0)
    from bbformat.codec.dtypes import RawTensor
    from bbformat.codec.encoder import encode_chunk
    from bbformat.codec.layout import ChunkLayout

    t = {"w": RawTensor.from_f64(rng.normal(0, 0.02, prog_shape), "bfloat16")}
    out = []
    for threads in (1, 2):
        buf = io.BytesIO()
        w = Writer(buf, "none", 1, {"format": "bbformat", "scheme": "none", "tolerance": 0.0}, entropy="auto", format_version="1.5",
                   threads=threads, part_symbols=20_000)
        w.add_encoded(encode_chunk(ChunkLayout("b", ("w",), ()), t, {}, "symmetric", 0.0, band=True))
        w.close()
        out.append(buf.getvalue())
    assert out[0] == out[1]
    with Reader(io.BytesIO(out[0])) as r:
        assert r.read_chunk(0).sections[0]["codec"] == Codec.PARTS


def test_a_1_4_reader_refuses_a_parts_file(monkeypatch: pytest.MonkeyPatch) -> None:
    assert_refused_without(monkeypatch, RequiredFlag.PARTS, sample_container(entropy="auto", format_version="1.5", part_symbols=200))


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2"])
def test_threads_must_be_a_whole_number_of_at_least_one(bad: object) -> None:
    with pytest.raises(InputError):
        part_threads(bad)  # type: ignore[arg-type]
    with pytest.raises(InputError):
        Writer(io.BytesIO(), "none", 1, {}, threads=bad)  # type: ignore[arg-type]


def test_default_part_size() -> None:
    assert PART_SYMBOLS == 1 << 21 and WRITER_PARTS == 64
    assert payload_segments(_program([(4, 4)])) == [(16, 4)]


def test_golden_v1_5_fixture_decodes_forever(monkeypatch: pytest.MonkeyPatch) -> None:
    """Written once (numcodecs style): the 1.5 fixture (payloads cut every 200 symbols) pins
    the writer's bytes where the BLAS kernel is the one it was written under, decodes with
    every digest verified to the tensors of the 1.2 writer's file of the same input, and a
    1.4 reader refuses it at the header."""
    import hashlib
    from pathlib import Path

    from threadpoolctl import threadpool_info

    from conftest import sample_tensors
    from test_bands import FIXTURE_KERNEL

    fix = Path(__file__).parent / "fixtures"
    golden = (fix / "sample_v1_5_parts.bb").read_bytes()
    assert hashlib.sha256(golden).hexdigest() == (fix / "sample_v1_5_parts.sha256").read_text().split()[0]
    kernels = {str(i.get("architecture")) for i in threadpool_info() if i.get("user_api") == "blas"}
    if kernels == {FIXTURE_KERNEL}:  # band widths are measured float64 disagreements (SPEC.md 12.7)
        with monkeypatch.context() as m:
            m.setattr(exponent, "TABLE_GRAIN", 0)  # the tables the writer wrote then
            assert sample_container(entropy="auto", format_version="1.5", part_symbols=200) == golden
    for threads in (1, 2):
        with Reader(io.BytesIO(golden), threads=threads) as r:
            assert r.header.minor == 5 and r.header.required_flags & RequiredFlag.PARTS
            assert r.read_chunk(0).sections[0]["codec"] == Codec.PARTS
            blocks = list(r.iter_blocks())
            assert all(b.exact for b in blocks)
            assert {n: t.tobytes() for b in blocks for n, t in b.tensors.items()} == sample_tensors("1.2")
    assert_refused_without(monkeypatch, RequiredFlag.PARTS, golden)


def test_parts_decode_the_same_without_the_compiled_coder(monkeypatch: pytest.MonkeyPatch) -> None:
    """The numpy decoder writes codec-3 parts into their places as the compiled one does."""
    import bbformat.codec.exponent as exponent

    prog = _program([(300, 64)], "float32")
    data = _weights(prog, 9)
    codec, stored = code_payload(prog, data, "exponent", ALL, part_symbols=5000)
    assert codec == Codec.PARTS
    monkeypatch.setattr(exponent, "_exponent_native", None)
    with ThreadPoolExecutor(2) as pool:
        assert decode_payload(codec, stored, prog, ALL, on_pool(pool)).tobytes() == data


# ----------------------------------------------------------------------------- output buffers


needs_counts = pytest.mark.skipif(not COUNTS_REFERENCES, reason="reuse needs CPython's reference counts")


@needs_counts
def test_a_payload_buffer_is_reused_only_once_nothing_refers_to_it() -> None:
    pool = OutputBuffers(keep=4)
    u2 = np.dtype("<u2")
    a = pool.array(1000, u2)
    where = a.ctypes.data
    view = a[10:20].view(np.int16)  # what a block's tensors are: views of the payload
    del a
    b = pool.array(1000, u2)
    assert b.ctypes.data != where  # the view still refers to it
    view[:] = 7
    b[:] = 0
    assert (view == 7).all()
    del view
    c = pool.array(990, u2)  # within 1/8 of its size: the same memory
    assert c.ctypes.data == where and c.size == 990 and c.dtype == u2
    held = [pool.array(1000, u2) for _ in range(6)]  # more than `keep` at once: fresh ones beside
    assert len({h.ctypes.data for h in held} | {b.ctypes.data, c.ctypes.data}) == 8


@needs_counts
def test_a_free_buffer_of_another_size_gives_its_place_and_memory() -> None:
    pool = OutputBuffers(keep=4)
    big = pool.array(100_000, np.dtype("<u4"))
    del big
    small = pool.array(1000, np.dtype("<u4"))  # 400x smaller: not a fit; it takes the big one's place
    assert small.base is not None and small.base.nbytes == 4000
    assert len(pool._bufs) == 1 and pool._bufs[0] is small.base
    pool.clear()
    assert pool._bufs == [] and pool.array(0, np.dtype("<u2")).size == 0


@needs_counts
def test_release_free_drops_the_free_buffers_and_keeps_counting_the_held_ones() -> None:
    pool = OutputBuffers(keep=4)
    u1 = np.dtype(np.uint8)
    held, free = pool.scratch(1000, u1), pool.scratch(2000, u1)
    where = held.ctypes.data
    del free
    pool.release_free()
    assert [b.nbytes for b in pool._bufs] == [1000]  # the 2000 went; the held one stays counted
    del held
    assert pool.scratch(900, u1).ctypes.data == where  # dropped by its holder: the pool's again


@needs_counts
@pytest.mark.parametrize("workers", [1, 2])
def test_a_pass_ends_holding_only_what_its_caller_holds(workers: int) -> None:
    """After the last block of a pass, the reader keeps no free buffer beside what the caller
    does next (a loader's model): only the memory of blocks the caller still holds."""
    data = _same_size_blocks()
    with Reader(io.BytesIO(data), threads=2, share_payload=True) as r:
        blocks = r.iter_blocks(workers=workers)
        first = next(blocks)
        mid_pass = len(r._parts.buffers._bufs)
        for last in blocks:  # the loop's name holds the last block
            pass
        kept = r._parts.buffers._bufs
        assert mid_pass > 1 and kept  # the case is exercised: buffers were pooled, two blocks are held
        held = [t.bits for block in (first, last) for t in block.tensors.values()]
        assert all(any(np.shares_memory(t, b) for t in held) for b in kept)


GC_INSIDE_THE_POOL = """
import gc, io, sys, weakref
import numpy as np
sys.path.insert(0, sys.argv[1])
from test_parts import _same_size_blocks
from bbformat.reader import Reader

r = Reader(io.BytesIO(_same_size_blocks()), threads=1, share_payload=True, read_ahead_bytes=0)
finalised = 0
for k in range(40):  # a collection after k more container allocations: some land inside the pool's lock
    g = r.iter_blocks()
    next(g)
    alive = weakref.ref(g)
    cycle = [g]
    cycle.append(cycle)  # the pass left in a reference cycle: only the collector ends it
    del g, cycle
    gc.disable()
    gc.set_threshold(gc.get_count()[0] + k)
    gc.enable()
    r._parts.buffers.scratch(1 << 20, np.dtype(np.uint8))
    gc.disable()
    gc.set_threshold(700)
    finalised += alive() is None
    gc.collect()
    gc.enable()
print(finalised)
"""


def test_a_pass_the_collector_ends_inside_the_pool_does_not_deadlock() -> None:
    """A pass left in a reference cycle ends when the garbage collector runs, which an
    allocation inside the buffer pool's lock can trigger: the pass's release of its free
    buffers then must not wait for that lock (it did, for ever)."""
    r = subprocess.run([sys.executable, "-c", GC_INSIDE_THE_POOL, str(Path(__file__).parent)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert int(r.stdout) > 0  # passes were finalised while the pool was taking a buffer


MULTI_WORKER_PASS_ENDED_INSIDE_THE_POOL = """
import io, sys, threading
import numpy as np
sys.path.insert(0, sys.argv[1])
from test_parts import _same_size_blocks
from bbformat.reader import Reader

r = Reader(io.BytesIO(_same_size_blocks()), threads=1, share_payload=True, read_ahead_bytes=0)
real = r.decode_block
go, waiting = threading.Event(), threading.Event()

def decode_block(i):
    if i == 1:  # under way on the second worker when the pass ends; then it needs the pool
        waiting.set()
        go.wait()
        r._parts.buffers.scratch(1 << 20, np.dtype(np.uint8))
    return real(i)

r.decode_block = decode_block
g = r.iter_blocks(workers=2)
next(g)
waiting.wait()
with r._parts.buffers._held():  # inside the pool, as an allocation is when the collector runs
    go.set()
    g.close()  # the collector ending the pass here
r.close()  # waits for the block left under way
assert not [t for t in threading.enumerate() if t.name.startswith("bbformat-decode")]
print("closed")
"""


def test_a_multi_worker_pass_ended_inside_the_pool_does_not_wait_for_its_workers() -> None:
    """A multi-worker pass that ends while its thread is inside the buffer pool (the garbage
    collector finalising it during an allocation) does not wait for a block still under way
    that needs the pool (it waited for ever); the reader's close() waits for that block."""
    r = subprocess.run([sys.executable, "-c", MULTI_WORKER_PASS_ENDED_INSIDE_THE_POOL, str(Path(__file__).parent)],
                       capture_output=True, text=True, timeout=20)
    assert r.returncode == 0 and r.stdout.strip() == "closed", r.stderr[-2000:]


@needs_counts
def test_scratch_takes_a_free_buffer_up_to_twice_its_size_and_a_payload_one_to_an_eighth() -> None:
    pool = OutputBuffers(keep=4)
    u1 = np.dtype(np.uint8)
    big = pool.scratch(1000, u1)
    where = big.ctypes.data
    del big
    half = pool.scratch(500, u1)  # 1000 <= 2 x 500: the same memory
    assert half.ctypes.data == where and half.size == 500
    assert pool.array(500, u1).ctypes.data != where  # held
    del half
    assert pool.array(800, u1).ctypes.data != where  # 1000 is more than 800 + 1/8: not a payload's fit
    assert pool.scratch(499, u1).ctypes.data != where  # nor under half of it a scratch's


@needs_counts
def test_the_pool_keeps_no_more_bytes_than_it_lent_at_once() -> None:
    pool = OutputBuffers(keep=8)
    u1 = np.dtype(np.uint8)
    a, b = pool.scratch(1000, u1), pool.scratch(500, u1)  # 1500 lent at once
    del a, b
    c = pool.scratch(1200, u1)  # no fit: 2700 pooled, over 1500; the 500 goes back, then the 1000
    assert sorted(x.nbytes for x in pool._bufs) == [1200]
    d = pool.scratch(700, u1)  # 1900 lent at once: both kept
    assert sorted(x.nbytes for x in pool._bufs) == [700, 1200]
    del c, d
    assert pool.scratch(600, u1).base.nbytes == 700 and pool.scratch(1100, u1).base.nbytes == 1200
    full = OutputBuffers(keep=2)
    held = [full.scratch(100 * (k + 1), u1) for k in range(3)]  # none free: the third stays out of the pool
    assert len(full._bufs) == 2 and not any(held[2].base is x for x in full._bufs)


@needs_counts
def test_disowned_buffers_leave_the_pool_and_their_places_to_new_ones() -> None:
    """A buffer a loader keeps (Reader.hand_over) is disowned: the pool stops counting it, so
    the pool still has room to keep, and reuse, the buffers lent after it."""
    u1 = np.dtype(np.uint8)
    for disown in (False, True):
        pool = OutputBuffers(keep=2)
        kept = [pool.array(1000, u1) for _ in range(2)]  # a block's payloads, kept by the model
        if disown:
            pool.disown([k.base for k in kept])
        temp = pool.scratch(4000, u1)
        lent = weakref.ref(temp.base)
        del temp
        assert (lent() is not None) is disown  # without disown, the pool was full: it kept none
        again = pool.scratch(4000, u1)
        assert (again.base is lent()) is disown
        assert not any(np.shares_memory(again, k) for k in kept)
        assert all(not any(k.base is b for b in pool._bufs) for k in kept) is disown


@needs_counts
def test_scratch_comes_from_the_installed_pool_only_and_only_when_large() -> None:
    from bbformat.codec import scratch

    pool = OutputBuffers(keep=4)
    n = scratch.MIN_BYTES // 8
    with scratch.using(pool.scratch):
        a = scratch.empty((n // 4, 4), np.float64)
        small = scratch.empty(16, np.float64)
    assert a.shape == (n // 4, 4) and a.dtype == np.float64 and small.shape == (16,)
    assert any(np.shares_memory(a, b) for b in pool._bufs)
    assert not any(np.shares_memory(small, b) for b in pool._bufs)
    assert not any(np.shares_memory(scratch.empty(n, np.float64), b) for b in pool._bufs)  # none installed


def _blocks_of_sizes(sizes: tuple[int, ...], entropy: str) -> bytes:
    """A 1.5 container of one float32 tensor a block, `sizes` elements each (read chunks and
    payloads of several sizes, which the pool hands out again)."""
    from bbformat.codec.dtypes import RawTensor
    from bbformat.codec.encoder import encode_chunk
    from bbformat.codec.layout import ChunkLayout

    rng = np.random.default_rng(5)
    buf = io.BytesIO()
    w = Writer(buf, "symmetric", len(sizes), {"format": "bbformat", "scheme": "symmetric", "tolerance": 0.0},
               entropy=entropy, format_version="1.5")
    for k, n in enumerate(sizes):
        t = RawTensor.from_f64(rng.normal(0, 0.05, (n // 64, 64)), "float32")
        w.add_encoded(encode_chunk(ChunkLayout(f"block{k}", (f"t{k}",), ()), {f"t{k}": t}, {}, "symmetric", 0.0))
    w.close()
    return buf.getvalue()


@pytest.mark.parametrize("entropy", ["none", "exponent"])
def test_pooled_chunks_of_other_sizes_decode_the_same_and_held_ones_stay(entropy: str, tmp_path: Path) -> None:
    """Blocks of several sizes (2^18 float32 elements: pooled), read from a path: every block
    held at once equals a fresh reader's copy and stays read-only (a raw payload's tensors are
    views of the read chunk); then, dropped, the next pass reuses the read memory (the pool keeps
    what was held when the first pass ended), and two more passes give the same bytes."""
    sizes = (1 << 18, 3 << 16, 1 << 18, 5 << 16, 1 << 17)
    path = tmp_path / "sizes.bb"
    path.write_bytes(_blocks_of_sizes(sizes, entropy))
    with Reader(path) as fresh:  # not shared: owning copies
        want = [{n: t.tobytes() for n, t in b.tensors.items()} for b in fresh.iter_blocks()]
    assert [len(next(iter(w.values()))) for w in want] == [4 * n for n in sizes]
    with Reader(path, share_payload=True) as r:
        held = list(r.iter_blocks())
        assert [{n: t.tobytes() for n, t in b.tensors.items()} for b in held] == want
        if entropy == "none":
            assert not any(t.bits.flags.writeable for b in held for t in b.tensors.values())
        pooled = [(p.ctypes.data, p.ctypes.data + p.nbytes) for p in r._parts.buffers._bufs]
        del held
        reused = 0
        for _ in range(2):
            again = []
            for b in r.iter_blocks():
                again.append({n: t.tobytes() for n, t in b.tensors.items()})
                reused += any(lo <= t.bits.ctypes.data < hi for t in b.tensors.values() for lo, hi in pooled)
            assert again == want
        assert reused or not COUNTS_REFERENCES


def _same_size_blocks(n: int = 5) -> bytes:
    """A 1.5 container of n blocks of one layout (sample_container's first block, new values
    each): payloads of one size, which a pool that ignored a holder would hand out again."""
    from bbformat.codec.dtypes import RawTensor
    from bbformat.codec.encoder import encode_chunk
    from bbformat.codec.layout import ChunkLayout, SiteSpec
    from bbformat.container.program import AxisRef

    rng = np.random.default_rng(11)
    buf = io.BytesIO()
    w = Writer(buf, "symmetric", n, {"format": "bbformat", "scheme": "symmetric", "tolerance": 0.0}, entropy="auto",
               format_version="1.5", part_symbols=200)
    for k in range(n):
        names = (f"src{k}", f"anchor{k}", f"follower{k}")
        shapes = ((30, 24), (24, 28), (3, 24))
        ts = {m: RawTensor.from_f64(rng.normal(0, 0.05, sh), "float16") for m, sh in zip(names, shapes)}
        lay = ChunkLayout(f"block{k}", names, (SiteSpec(f"site{k}", 24, AxisRef(names[1], 0), (AxisRef(names[2], 1),)),))
        w.add_encoded(encode_chunk(lay, ts, {}, "symmetric", 0.0, band=True, bands=True))
    w.close()
    return buf.getvalue()


def test_blocks_held_by_the_caller_keep_their_tensors() -> None:
    """Every block of a parts container held at once, 2 workers decoding, its tensors views of
    the payloads: each block's tensors equal a fresh reader's decode of that block alone, so no
    held payload was written again; then, the blocks dropped, a second pass reuses the payload
    memory (where references are counted) and decodes the same tensors."""
    data = _same_size_blocks()
    with Reader(io.BytesIO(data), threads=2, share_payload=True) as r:  # tensors are views of their payload
        held = list(r.iter_blocks(workers=2))
        pooled = list(r._parts.buffers._bufs)
        views = [t.bits for b in held for t in b.tensors.values() if any(np.shares_memory(t.bits, p) for p in pooled)]
        assert views or not COUNTS_REFERENCES  # the case at risk is exercised
        spans = [(p.ctypes.data, p.ctypes.data + p.nbytes) for p in pooled]
        del pooled
        want = []
        for i in range(len(r)):
            with Reader(io.BytesIO(data)) as fresh:
                want.append({n: t.tobytes() for n, t in fresh.decode_block(i).tensors.items()})
        assert [{n: t.tobytes() for n, t in b.tensors.items()} for b in held] == want
        del held
        del views
        again, reused = [], 0
        for b in r.iter_blocks():
            again.append({n: t.tobytes() for n, t in b.tensors.items()})
            reused += any(lo <= t.bits.ctypes.data < hi for t in b.tensors.values() for lo, hi in spans)
        assert again == want
        assert reused or not COUNTS_REFERENCES


def test_a_job_that_runs_jobs_on_its_own_full_pool_does_not_wait_for_ever() -> None:
    """on_pool called from a job of the same pool runs the inner jobs in turn (a one-thread
    pool would otherwise wait for ever for jobs queued behind the one waiting); the failure
    of the first job in order is still the one raised."""
    import threading

    with ThreadPoolExecutor(1) as pool:
        run = on_pool(pool)
        out: list[object] = []
        t = threading.Thread(target=lambda: out.append(run([lambda: run([lambda: 1, lambda: 2]), lambda: run([lambda: 3])])),
                             daemon=True)
        t.start()
        t.join(20)
        assert not t.is_alive() and out == [[[1, 2], [3]]]

        def fail(k: int) -> int:
            raise ValueError(k)

        with pytest.raises(ValueError, match="0"):
            run([lambda: run([lambda: fail(0), lambda: fail(1)])])


def test_a_closed_part_pool_starts_no_threads() -> None:
    pool = PartPool(2)
    assert pool.runner()([lambda: 1]) == [1]
    pool.close()
    assert pool.runner() is in_turn

"""The compiled host path (bbformat/codec/_host_native.c through host_native.py) gives the
reference's bits and errors: widening every 16-bit pattern, rounding values next to every
rounding boundary (SPEC.md 7.4), boundary distances (the band and margins), and x_residuals
(SPEC.md 8.4), valid and damaged, in the same check order."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bbformat.codec import band, host_native
from bbformat.codec.dtypes import bits_to_f64, f64_to_bits
from bbformat.codec.section_kinds import correct_residuals, encode_group
from bbformat.codec.varint import encode_varints, zigzag
from bbformat.errors import BBFormatError
from bbformat.zstdframe import compressor

pytestmark = pytest.mark.skipif(not host_native.active(), reason="the compiled host path is not built")

DTYPES = ["float16", "bfloat16", "float32"]
UINT = {"float16": np.uint16, "bfloat16": np.uint16, "float32": np.uint32}


def reference(fn, *args):
    with host_native.reference_only():
        assert not host_native.active()
        return fn(*args)


def f64_bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, np.float64).view(np.uint64)


def all_patterns(dtype: str, rng: np.random.Generator) -> np.ndarray:
    """Every pattern of a 16-bit dtype; for float32 every exponent with random and edge fractions."""
    if dtype != "float32":
        return np.arange(1 << 16, dtype=np.uint16)
    exps = np.arange(256, dtype=np.uint32) << np.uint32(23)
    fracs = np.concatenate([np.array([0, 1, 2, 0x400000, 0x400001, 0x7FFFFE, 0x7FFFFF], np.uint32),
                            rng.integers(0, 1 << 23, 200, dtype=np.uint32)])
    mags = (exps[:, None] | fracs[None, :]).reshape(-1)
    return np.concatenate([mags, mags | np.uint32(1 << 31)])


def near_boundaries(dtype: str, rng: np.random.Generator) -> np.ndarray:
    """float64 values at, just below and just above every midpoint between neighbouring finite
    values (and the overflow threshold), the values themselves, and f64 specials."""
    bits = all_patterns(dtype, rng)
    v = reference(bits_to_f64, bits, dtype)
    v = np.unique(v[np.isfinite(v)])
    mids = (v[:-1] + v[1:]) / 2  # exact: both fit a float64 with room
    top = v[-1] + (v[-1] - v[-2]) / 2  # the overflow threshold (SPEC.md 7.4)
    pts = np.concatenate([v, mids, [top, -top]])
    near = np.concatenate([pts, np.nextafter(pts, np.inf), np.nextafter(pts, -np.inf)])
    nans = np.array([0x7FF8000000000000, 0xFFF8000000000000, 0x7FF0000000000001, 0x7FF4000000000000,
                     0xFFFFFFFFFFFFFFFF, 0x7FF0040000000000], np.uint64).view(np.float64)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, 5e-324, -5e-324, 2.2250738585072014e-308, 1e300, -1e300,
                         np.finfo(np.float64).max, -np.finfo(np.float64).max])
    anything = rng.integers(0, 1 << 64, 100_000, dtype=np.uint64, endpoint=False).view(np.float64)  # any float64 bits
    return np.concatenate([near, nans, specials, rng.standard_normal(20000) * 10.0 ** rng.integers(-45, 40, 20000), anything])


@pytest.mark.parametrize("dtype", DTYPES)
def test_widen_matches_reference(dtype):
    bits = all_patterns(dtype, np.random.default_rng(1))
    got, want = bits_to_f64(bits, dtype), reference(bits_to_f64, bits, dtype)
    finite = ~np.isnan(want)
    assert np.array_equal(np.isnan(got), ~finite)
    assert np.array_equal(f64_bits(got)[finite], f64_bits(want)[finite])  # -0, subnormals, infinities too
    # NaN payloads only feed a Gram matrix, where any NaN makes E NaN (SPEC.md 7.5); sign kept
    assert np.array_equal(np.signbit(got), np.signbit(want))
    assert bits_to_f64(bits.reshape(-1, 2)[:4].T, dtype).shape == (2, 4)  # any shape, any layout


@pytest.mark.parametrize("dtype", DTYPES)
def test_rounding_next_to_every_boundary(dtype):
    x = near_boundaries(dtype, np.random.default_rng(2))
    got, want = f64_to_bits(x, dtype), reference(f64_to_bits, x, dtype)
    assert got.dtype == want.dtype and got.shape == want.shape
    diff = np.flatnonzero(got != want)
    assert diff.size == 0, [(float(x[i]), int(got[i]), int(want[i])) for i in diff[:5]]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_rounding_in_avx2_lanes_equals_the_scalar_loop_and_the_reference(dtype):
    """map's AVX2 rounding (four values a step, where the CPU has AVX2) against its scalar loop
    (simd=0) and the numpy reference, on the values next to every boundary, NaNs and specials
    shuffled so that each meets every lane, from every start offset (and so every tail)."""
    lib = host_native.compiled
    if not lib.SIMD:
        pytest.skip("this CPU has no AVX2: map runs its scalar loop only")
    rng = np.random.default_rng(11)
    x = rng.permutation(near_boundaries(dtype, rng))
    code = host_native.DTYPE_CODES[dtype]
    want = reference(f64_to_bits, x, dtype)
    for start in range(4):
        part = np.ascontiguousarray(x[start:])
        simd, scalar = np.empty(part.size, np.uint16), np.empty(part.size, np.uint16)
        lib.map(host_native.MAP_ROUND, part, code, simd, 0.0, 1)
        lib.map(host_native.MAP_ROUND, part, code, scalar, 0.0, 0)
        assert np.array_equal(simd, scalar) and np.array_equal(simd, want[start:])


@pytest.mark.parametrize("dtype", DTYPES)
def test_band_distances_in_avx2_lanes_equal_the_scalar_loop_and_the_reference(dtype):
    """The band distance in AVX2 lanes (map's distance and in_band, min_distance with and
    without skipped positions) against the scalar loop (simd=0) and the numpy reference, on
    the values next to every boundary (subnormals, the smallest normal, the overflow
    threshold), NaNs and specials, shuffled, from every start offset."""
    lib = host_native.compiled
    if not lib.SIMD:
        pytest.skip("this CPU has no AVX2: map runs its scalar loop only")
    rng = np.random.default_rng(12)
    x = rng.permutation(near_boundaries(dtype, rng))
    want = reference(band.boundary_distance, x, dtype)
    code = host_native.DTYPE_CODES[dtype]
    for start in range(4):
        part = np.ascontiguousarray(x[start:])
        got = {simd: np.empty(part.size) for simd in (0, 1)}
        for simd in (0, 1):
            lib.map(host_native.MAP_DISTANCE, part, code, got[simd], 0.0, simd)
        assert np.array_equal(f64_bits(got[1]), f64_bits(got[0])) and np.array_equal(f64_bits(got[1]), f64_bits(want[start:]))
        for delta in (0.0, 1e-30, 1e-6):
            flags = {simd: np.empty(part.size, np.uint8) for simd in (0, 1)}
            for simd in (0, 1):
                lib.map(host_native.MAP_IN_BAND, part, code, flags[simd], delta, simd)
            assert np.array_equal(flags[1], flags[0]) and np.array_equal(flags[1], want[start:] <= delta)
        finite = want[start:] > 0
        for skip in (np.zeros(0, np.uint8), (~finite).astype(np.uint8), (rng.random(part.size) < 0.5).astype(np.uint8)):
            kept = want[start:] if skip.size == 0 else want[start:][skip == 0]
            expect = kept.min() if kept.size else np.inf
            assert lib.min_distance(part, code, skip, 1) == lib.min_distance(part, code, skip, 0) == expect


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_rounding_through_float32_to_odd_equals_appendix_c(dtype):
    """The compiled rounding (float32 rounded to odd, then to nearest even) against SPEC.md
    Appendix C's integer algorithm, compiled too, on the values next to every boundary."""
    x = near_boundaries(dtype, np.random.default_rng(7))
    x = x[~np.isnan(x)]
    direct = np.empty(x.size, np.uint16)
    host_native.compiled.round_int_to(x, host_native.DTYPE_CODES[dtype], direct)
    assert np.array_equal(f64_to_bits(x, dtype), direct)


def test_rounding_keeps_shape_and_takes_any_layout():
    x = np.random.default_rng(3).standard_normal((6, 5))
    for dtype in DTYPES:
        assert np.array_equal(f64_to_bits(x.T, dtype), reference(f64_to_bits, x.T, dtype))
        assert np.array_equal(f64_to_bits(x.astype(np.float32), dtype), reference(f64_to_bits, x.astype(np.float32), dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_boundary_distances_match_reference(dtype):
    x = near_boundaries(dtype, np.random.default_rng(4))
    got, want = band.boundary_distance(x, dtype), reference(band.boundary_distance, x, dtype)
    assert np.array_equal(f64_bits(got), f64_bits(want))
    for delta in (0.0, 1e-30, 1e-6, 1.0):
        assert np.array_equal(band.in_band(x, dtype, delta), reference(band.in_band, x, dtype, delta))
    skip = np.flatnonzero(want == want.min())
    for s in (None, skip, np.arange(x.size)):
        assert band.min_distance(x, dtype, s) == reference(band.min_distance, x, dtype, s)


def residual_section(approx: np.ndarray, values: np.ndarray, dtype: str, keep: np.ndarray | None,
                     rng: np.random.Generator) -> bytes:
    """An x_residuals section written independently of the decoder: group per context, ascending."""
    shift, nbits = {"float16": (10, 5), "bfloat16": (7, 8), "float32": (23, 8)}[dtype]
    ctx = (approx.astype(np.int64) >> shift) & ((1 << nbits) - 1)
    live = np.ones(approx.size, bool) if keep is None else keep
    z = compressor(3)
    out = b""
    for c in np.unique(ctx[live]):
        raw = encode_varints(zigzag(values[live & (ctx == c)]))
        out += encode_group(raw, z, zstd_above=0 if rng.random() < 0.5 else 1 << 30)
    return out


def outcome(fn, *args):
    try:
        return fn(*args)
    except BBFormatError as exc:
        return exc.code


def mutate(data: bytes, rng: np.random.Generator) -> bytes:
    b = bytearray(data)
    what = rng.integers(4)
    if what == 0 and b:  # flip a byte
        b[rng.integers(len(b))] ^= int(rng.integers(1, 256))
    elif what == 1:  # a byte more, somewhere
        b.insert(int(rng.integers(len(b) + 1)), int(rng.integers(256)))
    elif what == 2 and b:  # a byte less
        del b[int(rng.integers(len(b)))]
    else:  # cut the end
        b = b[: int(rng.integers(len(b) + 1))]
    return bytes(b)


@pytest.mark.parametrize("dtype", DTYPES)
def test_residuals_valid_and_damaged_match_reference(dtype):
    rng = np.random.default_rng(5)
    w = 32 if dtype == "float32" else 16
    seen: set[object] = set()
    for trial in range(150):
        n = int(rng.integers(1, 400))
        approx = reference(f64_to_bits, rng.standard_normal(n) * 10.0 ** rng.integers(-3, 3, n), dtype)
        values = rng.integers(-3, 4, n) * (rng.random(n) < 0.3)
        if trial % 7 == 0:  # moves out of range, or large
            values[rng.integers(n)] = int(rng.choice([1 << (w - 1), -(1 << (w - 1)) - 5, (1 << 62), 1 << 20]))
        keep = None if trial % 3 else rng.random(n) < 0.8
        base = approx.copy()
        if keep is not None:
            base[~keep] = rng.integers(0, 1 << w, int((~keep).sum()), dtype=np.uint64).astype(UINT[dtype])
        data = residual_section(approx, values, dtype, keep, rng)
        for d in [data] + [mutate(data, rng) for _ in range(6)]:
            got = outcome(correct_residuals, d, approx, base, dtype, keep)
            want = outcome(reference, correct_residuals, d, approx, base, dtype, keep)
            if isinstance(want, str):
                assert got == want, (trial, d.hex())
                seen.add(want)
            else:
                assert isinstance(got, np.ndarray) and got.dtype == want.dtype and np.array_equal(got, want)
                seen.add("ok")
    assert {"ok", "E_SECTION_CONTENT"} <= seen  # both kinds of outcome were exercised


def test_residual_varint_edge_cases_match_reference():
    """Varints of 10 bytes (2^63 and 2^64), 11 bytes, and a group with a varint too many or too few."""
    approx = np.array([0x3C00, 0x3C01, 0x3C02], np.uint16)  # one context: three positions
    ten = bytes([0xFF] * 9 + [0x01])  # 2^64 - 1 > out of range
    cases = {
        "ok": bytes([0x02, 0x00, 0x01]),
        "2^64": bytes([0xFF] * 9 + [0x02]),
        "11 bytes": bytes([0x80] * 10 + [0x00]),
        "too many": bytes([0, 0, 0, 0]),
        "too few": bytes([0, 0]),
        "continued": bytes([0, 0, 0x80]),
        "huge": ten + bytes([0, 0]),
    }
    for name, raw in cases.items():
        data = bytes([len(raw), 0]) + raw
        got = outcome(correct_residuals, data, approx, approx, "float16", None)
        want = outcome(reference, correct_residuals, data, approx, approx, "float16", None)
        if isinstance(want, str):
            assert got == want, name
        else:
            assert np.array_equal(got, want), name
    assert outcome(correct_residuals, bytes([3, 0, 2, 0, 1]), approx, approx, "float16", None).tolist() == [0x3C01] * 3


def test_reference_only_turns_the_compiled_path_off_and_back():
    assert host_native.active()
    with host_native.reference_only():
        with host_native.reference_only():
            assert not host_native.active()
        assert not host_native.active()
    assert host_native.active()


@pytest.mark.parametrize("dtype,top", [("float16", 0x7FFF), ("float32", 0x7FFFFFFF)])
def test_residuals_at_the_ends_of_the_ordinal_range(dtype, top):
    """ord ranges over [-2^(W-1), 2^(W-1) - 1]: the last pattern of each sign is reached, one
    step past it is E_SECTION_CONTENT (SPEC.md 8.4)."""
    u = UINT[dtype]
    for start, step, ok in [(top - 1, 1, top), (top - 1, 2, None), (top, 0, top),
                            ((top | (top + 1)) - 1, -1, top | (top + 1)), ((top | (top + 1)) - 1, -2, None)]:
        approx = np.array([start], u)
        raw = encode_varints(zigzag(np.array([step])))
        data = bytes([len(raw), 0]) + raw
        got = outcome(correct_residuals, data, approx, approx, dtype, None)
        want = outcome(reference, correct_residuals, data, approx, approx, dtype, None)
        if ok is None:
            assert got == want == "E_SECTION_CONTENT", (start, step)
        else:
            assert int(got[0]) == int(want[0]) == ok, (start, step)


@pytest.mark.parametrize("dtype", DTYPES)
def test_nonfinite_counts_match_torch(dtype):
    """pack's NaN/Inf refusal counts from the bit patterns as torch counts from the values."""
    torch = pytest.importorskip("torch")
    from bbformat.adapters.base import check_finite

    bits = all_patterns(dtype, np.random.default_rng(6))
    ints = np.int32 if dtype == "float32" else np.int16
    t = torch.from_numpy(bits.view(ints).copy()).view(getattr(torch, dtype))
    want = (int(torch.isnan(t).sum()), int(torch.isinf(t).sum()))
    assert want[0] > 0 and want[1] == 2
    assert host_native.nonfinite(bits, dtype) == want
    with pytest.raises(BBFormatError, match=f"{want[0]:,} NaN, 2 ±Inf"):
        check_finite({"w": t})
    with host_native.reference_only(), pytest.raises(BBFormatError, match=f"{want[0]:,} NaN, 2 ±Inf"):
        check_finite({"w": t})


def _read_all(path: Path, device: str) -> object:
    """Every block's tensors (bits), exactness and margin, or the error code the reader reports."""
    from bbformat.reader import Reader

    try:
        with Reader(path, margins=True, device=device) as r:
            return [(b.name, b.exact, b.margin, {k: (t.dtype, t.shape, t.bits.tobytes()) for k, t in b.tensors.items()})
                    for b in r.iter_blocks()]
    except BBFormatError as exc:
        return exc.code


@pytest.mark.parametrize("device", ["cpu", "torch:cpu"])
def test_every_conformance_vector_decodes_the_same_on_both_paths(device):
    """Valid and invalid vectors: the same tensors, digests, margins and error codes with the
    compiled host path and with the numpy reference (both backends: the reference and the
    GPU path on the CPU)."""
    import json

    if device != "cpu":
        pytest.importorskip("torch")
    root = Path(__file__).resolve().parent.parent / "conformance"
    vectors = json.loads((root / "manifest.json").read_text())["vectors"]
    codes: set[object] = set()
    for v in vectors:
        got = _read_all(root / v["path"], device)
        want = reference(_read_all, root / v["path"], device)
        assert got == want, v["id"]
        codes.add(got if isinstance(got, str) else "accept")
    assert {"accept", "E_DIGEST", "E_SECTION_CONTENT"} <= codes


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scheme,tol", [("symmetric", 0.0), ("symmetric", 1e-3), ("paper", None), ("none", None)])
def test_pack_writes_the_same_bytes_on_both_paths(tmp_path, dtype, scheme, tol):
    """The encoder (rotated tensors' rounding, its simulation of the decoder, the band, the
    NaN/Inf check) writes the same file with the compiled host path as with numpy, and both
    paths decode it to the same tensors."""
    from bbformat.api import pack
    from bbformat.checkpoint import write_checkpoint
    from bbformat.testing import make_tiny_checkpoint

    write_checkpoint(make_tiny_checkpoint("llama", seed=11, layers=2, dtype=dtype), tmp_path / "m")
    pack(tmp_path / "m", tmp_path / "c.bb", scheme=scheme, tolerance=tol, verify=True)
    with host_native.reference_only():
        pack(tmp_path / "m", tmp_path / "r.bb", scheme=scheme, tolerance=tol, verify=True)
    assert (tmp_path / "c.bb").read_bytes() == (tmp_path / "r.bb").read_bytes()
    got = _read_all(tmp_path / "c.bb", "cpu")
    assert got == reference(_read_all, tmp_path / "c.bb", "cpu") and not isinstance(got, str)


def test_zero_dimensional_arrays_keep_their_shape():
    for dtype in DTYPES:
        x = np.float64(1.5)
        assert f64_to_bits(x, dtype).shape == reference(f64_to_bits, x, dtype).shape == ()
        assert int(f64_to_bits(x, dtype)) == int(reference(f64_to_bits, x, dtype))
        b = np.array(15360, UINT[dtype])
        assert bits_to_f64(b, dtype).shape == () and float(bits_to_f64(b, dtype)) == float(reference(bits_to_f64, b, dtype))
        assert band.boundary_distance(x, dtype).shape == band.in_band(x, dtype, 0.1).shape == ()


@pytest.mark.parametrize("dtype", DTYPES)
def test_rounding_into_an_array_matches_reference(dtype):
    """f64_to_bits_into writes f64_to_bits's bits: in place where it can (C-contiguous, native
    width), through a temporary elsewhere (a strided view, the numpy path); edge values, odd and
    empty lengths."""
    from bbformat.codec.dtypes import f64_to_bits_into

    x = near_boundaries(dtype, np.random.default_rng(7))
    x = x[: x.size - (x.size % 2 == 0)]  # an odd length
    want = reference(f64_to_bits, x, dtype)
    for out in (np.zeros(x.size, UINT[dtype]), np.zeros((x.size, 2), UINT[dtype])[:, 1]):
        f64_to_bits_into(x, dtype, out)
        assert np.array_equal(out, want)
        out[...] = 0
        with host_native.reference_only():
            f64_to_bits_into(x, dtype, out)
        assert np.array_equal(out, want)
    empty = np.zeros(0, UINT[dtype])
    f64_to_bits_into(np.zeros(0), dtype, empty)
    block = np.zeros((3, 5), UINT[dtype])
    f64_to_bits_into(x[:15].reshape(3, 5), dtype, block)
    assert np.array_equal(block, want[:15].reshape(3, 5))


def test_rounding_into_refuses_an_array_it_cannot_fill():
    x = np.ones(4)
    for out in (np.zeros(3, np.uint16), np.zeros(4, np.uint32), np.zeros(8, np.uint16)[::2]):
        with pytest.raises(ValueError):
            host_native.round_to(x, "bfloat16", out)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scheme", ["symmetric", "paper"])
def test_pack_in_row_blocks_writes_the_same_bytes_on_both_paths(tmp_path, monkeypatch, dtype, scheme):
    """Every tensor large (codec/encoder.py's row blocks: rounded into the output in place, the
    Gram summed in place): the same file with the compiled path as with numpy."""
    from bbformat.api import pack
    from bbformat.checkpoint import write_checkpoint
    from bbformat.codec import encoder
    from bbformat.testing import make_tiny_checkpoint

    monkeypatch.setattr(encoder, "LARGE_F64_BYTES", 0)
    monkeypatch.setattr(encoder, "BLOCK_F64_BYTES", 8 * 64 * 7)
    write_checkpoint(make_tiny_checkpoint("llama", seed=12, layers=2, dtype=dtype), tmp_path / "m")
    pack(tmp_path / "m", tmp_path / "c.bb", scheme=scheme, tolerance=0.0, verify=True)
    with host_native.reference_only():
        pack(tmp_path / "m", tmp_path / "r.bb", scheme=scheme, tolerance=0.0, verify=True)
    assert (tmp_path / "c.bb").read_bytes() == (tmp_path / "r.bb").read_bytes()


torch = pytest.importorskip("torch")
TORCH_CPU = __import__("bbformat.codec.linalg", fromlist=["TorchLinalg"]).TorchLinalg("cpu")


@pytest.mark.parametrize("d", [0, 1, 2, 5, 64, 257])
def test_upper_triangle_matches_reference(d):
    """rotation.matrix_to_block and the backends' block(): the compiled copy gives the
    reference's bits, for C-ordered and transposed input; the block's length and order
    checked against an index formula."""
    from bbformat.codec.linalg import REFERENCE
    from bbformat.codec.rotation import block_size, matrix_to_block

    rng = np.random.default_rng(d)
    x = rng.normal(size=(d, d))
    x[rng.random((d, d)) < 0.05] = np.nan
    for m in (x, x.T):
        got = matrix_to_block(m)
        want = reference(matrix_to_block, m)
        assert got.size == block_size(d) and np.array_equal(f64_bits(got), f64_bits(want))
        rows, cols = np.triu_indices(d, 1)
        assert np.array_equal(f64_bits(got), f64_bits(np.concatenate([np.diag(m), m[rows, cols]])))
        assert np.array_equal(f64_bits(REFERENCE.block(m)), f64_bits(want))
        assert np.array_equal(f64_bits(TORCH_CPU.block(torch.from_numpy(m))), f64_bits(want))
        assert np.array_equal(f64_bits(reference(TORCH_CPU.block, torch.from_numpy(m))), f64_bits(want))


@pytest.mark.parametrize("d", [0, 1, 2, 5, 63, 64, 65, 129, 257])
def test_block_to_matrix_matches_reference_and_an_index_formula(d):
    """rotation.block_to_matrix, compiled (row copies, then the mirror in 64 x 64 tiles, so sizes
    around a tile's edge): the reference's bits, and X[i, j] = X[j, i] = the block's entry of
    (i, j) by np.triu_indices; NaN payloads and -0.0 kept."""
    from bbformat.codec.rotation import block_size, block_to_matrix, matrix_to_block

    rng = np.random.default_rng(100 + d)
    v = rng.normal(size=block_size(d))
    v[rng.random(v.size) < 0.05] = -0.0
    v[rng.random(v.size) < 0.02] = np.array([0x7FF8000000000123], np.uint64).view(np.float64)[0]
    got = block_to_matrix(v, d)
    want = reference(block_to_matrix, v, d)
    assert got.shape == (d, d) and np.array_equal(f64_bits(got), f64_bits(want))
    x = np.zeros((d, d))
    x[np.diag_indices(d)] = v[:d]
    rows, cols = np.triu_indices(d, 1)
    x[rows, cols] = x[cols, rows] = v[d:]
    assert np.array_equal(f64_bits(got), f64_bits(x))
    assert np.array_equal(f64_bits(matrix_to_block(got)), f64_bits(v))


def residual_groups_raw_size(approx: np.ndarray, values: np.ndarray, dtype: str, keep: np.ndarray | None) -> int:
    """x_residuals with every group stored raw, sized by encoding it (independent of raw_size)."""
    shift, nbits = {"float16": (10, 5), "bfloat16": (7, 8), "float32": (23, 8)}[dtype]
    ctx = (approx.astype(np.int64) >> shift) & ((1 << nbits) - 1)
    live = np.ones(approx.size, bool) if keep is None else keep
    total = 0
    for c in np.unique(ctx[live]):
        raw = encode_varints(zigzag(values[live & (ctx == c)]))
        total += len(encode_group(raw, compressor(3), zstd_above=1 << 62))
    return total


@pytest.mark.parametrize("dtype", DTYPES)
def test_residual_raw_size_and_deltas_match_reference_and_the_encoded_groups(dtype):
    """The encoder's bound on x_residuals (section_kinds' residual choice and raw_size): the
    compiled deltas and per-context sums equal the reference's, and the size equals the raw
    groups as encoded, with values of every varint length (1 to 10 bytes) and with keep."""
    from bbformat.codec.section_kinds import X_RESIDUALS, SiteContext, residual_deltas, residual_sizes

    rng = np.random.default_rng(7)
    w = 32 if dtype == "float32" else 16
    for trial in range(40):
        n = int(rng.integers(1, 3000))
        approx = reference(f64_to_bits, rng.standard_normal(n) * 10.0 ** rng.integers(-3, 3, n), dtype)
        true = approx.copy()
        mask = rng.random(n) < 0.4
        true[mask] = rng.integers(0, 1 << w, int(mask.sum()), dtype=np.uint64).astype(UINT[dtype])  # any pattern, either sign
        deltas = host_native.ordinal_deltas(true, approx, mask, dtype)
        assert np.array_equal(deltas, reference(residual_deltas, true, approx, mask, dtype))
        assert np.array_equal(residual_deltas(true, approx, mask, dtype), deltas)
        values = deltas.copy()
        if trial % 4 == 0:  # every varint length, 1 to 10 bytes (zigzag of 2^62 and more takes 10)
            big = [(-1) ** k * ((1 << (3 * k)) - 1) for k in range(21)] + [1 << 62, -(1 << 62), (1 << 63) - 1, -(1 << 63)]
            values[: min(n, len(big))] = big[: min(n, len(big))]
        keep = None if trial % 3 else rng.random(n) < 0.8
        got = host_native.residual_sizes(approx, values, dtype, keep)
        want = reference(residual_sizes, approx, values, dtype, keep)
        assert all(np.array_equal(a, b) for a, b in zip(residual_sizes(approx, values, dtype, keep), got))
        assert all(np.array_equal(a, b) and a.dtype == np.int64 for a, b in zip(got, want))
        program = type("P", (), {"symbol_dtype": dtype})()
        ctx = SiteContext(program, 0, approx=approx, keep=keep)  # type: ignore[arg-type]
        size = residual_groups_raw_size(approx, values, dtype, keep)
        assert X_RESIDUALS.raw_size(ctx, values) == size
        assert reference(X_RESIDUALS.raw_size, ctx, values) == size


def test_all_finite_matches_numpy():
    """NumpyLinalg.all_finite: one NaN or infinity anywhere (both signs, any payload, in the
    vectorised runs or their tail) makes it false; zeros, subnormals and the largest finite
    values do not."""
    from bbformat.codec.linalg import REFERENCE

    rng = np.random.default_rng(3)
    edge = np.array([0.0, -0.0, 5e-324, -5e-324, np.finfo(np.float64).max, -np.finfo(np.float64).max])
    bad = np.array([np.nan, -np.nan, np.inf, -np.inf, np.uint64(0x7FF0000000000001).view(np.float64)])
    for n in (0, 1, 7, 4095, 4096, 4097, 10_000):
        x = rng.normal(size=n)
        if n:
            x[rng.integers(0, n, 3)] = rng.choice(edge, 3)
        for m in (x, x.reshape(1, -1).T):
            assert REFERENCE.all_finite(m) is reference(REFERENCE.all_finite, m) is True
            assert TORCH_CPU.all_finite(torch.from_numpy(m)) is True
        for k in range(n and 4):
            y = x.copy()
            y[[0, n - 1, n // 2, int(rng.integers(0, n))][k]] = bad[int(rng.integers(0, bad.size))]
            assert REFERENCE.all_finite(y) is reference(REFERENCE.all_finite, y) is False
            assert TORCH_CPU.all_finite(torch.from_numpy(y)) is reference(TORCH_CPU.all_finite, torch.from_numpy(y)) is False


# ---------------------------------------------------------------- spread over threads


def _counting_runner(pool):  # type: ignore[no-untyped-def]
    calls = []

    def run(jobs):  # type: ignore[no-untyped-def]
        calls.append(len(jobs))
        return [f.result() for f in [pool.submit(j) for j in jobs]]

    return run, calls


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("threads", [2, 3, 7])
def test_spread_steps_give_the_bits_of_one_call(dtype, threads):
    """Widening, rounding, distances, the band test and the finiteness test of arrays above
    SPLIT_VALUES, cut into slices on threads: the same bits as one call and the reference, the
    work really cut; small arrays and other threads' calls stay whole."""
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(11)
    n = host_native.SPLIT_VALUES * 2 + 12_345
    x = rng.normal(0, 0.05, n)
    x[rng.integers(0, n, 50)] = [np.nan, np.inf, -np.inf, 0.0, -0.0] * 10
    bits = rng.integers(0, np.iinfo(UINT[dtype]).max, n, dtype=np.uint64).astype(UINT[dtype])
    one = (host_native.widen(bits, dtype), host_native.round_to(x, dtype), host_native.boundary_distance(x, dtype),
           host_native.in_band(x, dtype, 1e-3), host_native.all_finite(x), host_native.all_finite(np.abs(x[np.isfinite(x)])))
    with ThreadPoolExecutor(threads) as pool:
        run, calls = _counting_runner(pool)
        with host_native.spread(run, threads):
            got = (host_native.widen(bits, dtype), host_native.round_to(x, dtype), host_native.boundary_distance(x, dtype),
                   host_native.in_band(x, dtype, 1e-3), host_native.all_finite(x), host_native.all_finite(np.abs(x[np.isfinite(x)])))
            into = np.empty(n, UINT[dtype])
            host_native.round_to(x, dtype, into)
            small = host_native.widen(bits[:1000], dtype)
            elsewhere = pool.submit(lambda: host_native.widen(bits, dtype)).result()  # the pool's threads: not spread
    assert calls == [min(threads, n // (host_native.SPLIT_VALUES // 2))] * 7, calls  # slices of at least SPLIT_VALUES / 2
    assert np.array_equal(f64_bits(got[0]), f64_bits(one[0])) and np.array_equal(f64_bits(elsewhere), f64_bits(one[0]))
    assert np.array_equal(got[1], one[1]) and np.array_equal(into, one[1])
    assert np.array_equal(f64_bits(got[2]), f64_bits(one[2])) and np.array_equal(got[3], one[3])
    assert got[4] is one[4] is False and got[5] is one[5] is True
    assert np.array_equal(f64_bits(small), f64_bits(one[0][:1000]))
    assert np.array_equal(got[1], reference(f64_to_bits, x, dtype)) and np.array_equal(f64_bits(got[0]), f64_bits(reference(bits_to_f64, bits, dtype)))


def test_a_reader_with_part_threads_decodes_the_bits_of_one_thread(tmp_path):
    """A Reader with threads=2 spreads its blocks' element-wise steps: every chunk of a packed
    bfloat16 model above SPLIT_VALUES decodes to the bits (and digests) of threads=1."""
    import bbformat
    from bbformat.checkpoint import write_checkpoint
    from bbformat.reader import Reader
    from bbformat.testing import make_tiny_checkpoint

    write_checkpoint(make_tiny_checkpoint("llama", seed=4, layers=1, hidden=64, vocab=40_000, dtype="bfloat16"), tmp_path / "src")
    bbformat.pack(tmp_path / "src", tmp_path / "m.bb")
    blocks = {}
    for threads in (1, 2):
        with Reader(tmp_path / "m.bb", threads=threads, share_payload=True) as r:
            blocks[threads] = [(b.index, b.exact, {k: t.tobytes() for k, t in b.tensors.items()}) for b in r.iter_blocks()]
    assert blocks[1] == blocks[2] and all(b[1] is True for b in blocks[1])
    assert max(len(v) for b in blocks[1] for v in b[2].values()) // 2 > host_native.SPLIT_VALUES  # the embedding's anchor is spread


def test_pack_spreads_its_steps_and_writes_the_bytes_of_one_thread(tmp_path, monkeypatch):
    """pack(threads=2) cuts the encoder's large element-wise steps into slices and writes the
    bytes of pack(threads=1), which runs each in one call."""
    import bbformat
    from bbformat.checkpoint import write_checkpoint
    from bbformat.testing import make_tiny_checkpoint

    write_checkpoint(make_tiny_checkpoint("llama", seed=5, layers=1, hidden=64, vocab=40_000, dtype="bfloat16"), tmp_path / "src")
    cut = []
    real = host_native._slices

    def spy(n):  # type: ignore[no-untyped-def]
        plan = real(n)
        cut.append(plan is not None)
        return plan

    monkeypatch.setattr(host_native, "_slices", spy)
    out = {}
    for threads in (1, 2):
        cut.clear()
        bbformat.pack(tmp_path / "src", tmp_path / f"m{threads}.bb", threads=threads)
        out[threads] = ((tmp_path / f"m{threads}.bb").read_bytes(), any(cut))
    assert out[1][0] == out[2][0] and out[1][1] is False and out[2][1] is True


def test_rounding_keeps_an_f_order_only_when_asked():
    """f64_to_bits of an F-ordered array (an axis-0 rotation's result): C-ordered bits by
    default (what decoders hand over as a model's memory), F-ordered with keep_order (the
    encoder's rounded rotations), the same values either way."""
    x = np.asfortranarray(np.random.default_rng(9).normal(size=(40, 30)))
    plain, kept = f64_to_bits(x, "bfloat16"), f64_to_bits(x, "bfloat16", keep_order=True)
    assert plain.flags.c_contiguous and kept.flags.f_contiguous and not kept.flags.c_contiguous
    assert np.array_equal(plain, kept) and np.array_equal(plain, reference(f64_to_bits, x, "bfloat16"))

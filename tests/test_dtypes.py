"""Element types: exact rounding, ordinals, varints."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bbformat.codec.dtypes import (
    RawTensor,
    bits_to_f64,
    bits_to_ordinal,
    f64_to_bits,
    ordinal_to_bits,
    symbols_to_tensor,
    tensor_to_symbols,
)
from bbformat.codec.varint import decode_varints, encode_varints, unzigzag, zigzag
from bbformat.errors import FormatError

finite = st.floats(allow_nan=False, allow_infinity=False, width=64)


def _nearest_even_reference(x: float, dtype: str) -> int:
    """Brute force: the representable value nearest to x (ties to even bits), by exact fractions."""
    width = 32 if dtype == "float32" else 16
    cands = np.arange(0, 1 << (width - 1), dtype=np.uint64)
    vals = bits_to_f64(cands.astype(np.uint16), dtype)
    mag = abs(x)
    finite_mask = np.isfinite(vals)
    v = vals[finite_mask]
    b = cands[finite_mask]
    i = int(np.searchsorted(v, mag))
    best = None
    for j in (i - 1, i):
        if 0 <= j < v.size:
            d = abs(Fraction(float(v[j])) - Fraction(mag))
            key = (d, int(b[j]) & 1)
            if best is None or key < best[0]:
                best = (key, int(b[j]))
    assert best is not None
    top = Fraction(float(v[-1]))
    ulp = top - Fraction(float(v[-2]))
    if Fraction(mag) >= top + ulp / 2:
        # overflow: IEEE rounds to infinity at or beyond the halfway point to the next binade step
        bits = 0x7C00 if dtype == "float16" else 0x7F80
    else:
        bits = best[1]
    return bits | (0x8000 if np.signbit(x) else 0)


@settings(max_examples=300, deadline=None)
@given(st.one_of(finite, st.floats(min_value=-1e-3, max_value=1e-3), st.floats(min_value=-70000, max_value=70000)))
def test_round_to_nearest_even_matches_brute_force(x: float) -> None:
    for dtype in ("float16", "bfloat16"):
        got = int(f64_to_bits(np.array([x]), dtype)[0])
        assert got == _nearest_even_reference(x, dtype), (x, dtype, hex(got))


def test_bfloat16_has_no_double_rounding() -> None:
    # 1 + 2^-8 + 2^-30 lies just above a bf16 halfway point; rounding through
    # float32 first would land exactly on the halfway point and round to even (down).
    x = 1.0 + 2.0**-8 + 2.0**-30
    assert int(f64_to_bits(np.array([x]), "bfloat16")[0]) == 0x3F81
    assert int(torch.tensor(x, dtype=torch.float64).float().bfloat16().view(torch.int16)) & 0xFFFF == 0x3F80


@given(st.lists(st.integers(0, 0xFFFF), min_size=1, max_size=64))
def test_ordinal_is_a_monotone_bijection_16(bits: list[int]) -> None:
    b = np.array(bits, dtype=np.uint16)
    o = bits_to_ordinal(b, 16)
    assert np.array_equal(ordinal_to_bits(o, 16), b)
    v = bits_to_f64(b, "float16")
    ok = np.isfinite(v)
    vs, os_ = v[ok], o[ok]
    for i in range(vs.size):
        for j in range(vs.size):
            if vs[i] < vs[j]:
                assert os_[i] < os_[j]


def test_ordinal_and_zigzag_match_their_scalar_definitions() -> None:
    """bits_to_ordinal, ordinal_to_bits and unzigzag (in place on their own arrays) against the
    definitions written out per value, on every 16-bit pattern and 32-bit and 64-bit edges;
    their inputs are left as they were."""
    rng = np.random.default_rng(5)
    for w, bits in ((16, np.arange(1 << 16, dtype=np.uint16)),
                    (32, np.concatenate([np.array([0, 1, 0x7FFFFFFF, 0x80000000, 0x80000001, 0xFFFFFFFF], np.uint32),
                                         rng.integers(0, 1 << 32, 4000, dtype=np.uint64).astype(np.uint32)]))):
        before = bits.copy()
        sign = 1 << (w - 1)
        want = [(-(int(b) & (sign - 1)) - 1) if int(b) & sign else int(b) for b in bits]
        o = bits_to_ordinal(bits, w)
        assert o.dtype == np.int64 and o.tolist() == want and np.array_equal(bits, before)
        o_before = o.copy()
        assert np.array_equal(ordinal_to_bits(o, w), bits) and np.array_equal(o, o_before)
    u = np.concatenate([np.array([0, 1, 2, 3, 2**63, 2**63 + 1, 2**64 - 2, 2**64 - 1], np.uint64),
                        rng.integers(0, 2**64 - 1, 4000, dtype=np.uint64)])
    u_before = u.copy()
    want = [(int(x) >> 1) ^ -(int(x) & 1) for x in u]
    assert unzigzag(u).tolist() == want and np.array_equal(u, u_before)


def test_context_groups_sort_by_residual_contexts() -> None:
    """context_groups' one-byte contexts are residual_contexts' (the exponent field, SPEC.md
    8.4) on every 16-bit pattern and random 32-bit ones; positions ascend within a group."""
    from bbformat.codec.section_kinds import context_groups, residual_contexts

    rng = np.random.default_rng(2)
    cases = {"float16": np.arange(1 << 16, dtype=np.uint16), "bfloat16": rng.permutation(np.arange(1 << 16, dtype=np.uint16)),
             "float32": rng.integers(0, 1 << 32, 50_000, dtype=np.uint64).astype(np.uint32)}
    for dtype, bits in cases.items():
        ctx = residual_contexts(bits, dtype)
        groups = context_groups(bits, dtype)
        assert [c for c, _ in groups] == sorted(set(ctx.tolist()))
        for c, where in groups:
            assert np.array_equal(where, np.flatnonzero(ctx == c)), (dtype, c)
    assert unzigzag(np.uint64(5)).shape == () and int(unzigzag(np.uint64(5))) == -3


@given(st.lists(st.integers(-(2**40), 2**40), max_size=200))
def test_zigzag_varint_round_trip(values: list[int]) -> None:
    v = np.array(values, dtype=np.int64)
    data = encode_varints(zigzag(v))
    assert np.array_equal(unzigzag(decode_varints(data, v.size)), v)


@given(st.sampled_from(["float16", "bfloat16", "float32"]), st.sampled_from([16, 32]), st.integers(1, 7), st.integers(0, 2**31))
def test_tensor_symbol_round_trip(dtype: str, w: int, n: int, seed: int) -> None:
    if dtype != "float32" and w == 32:
        return
    rng = np.random.default_rng(seed)
    t = RawTensor.from_f64(rng.normal(size=(n, 3)), dtype)
    s = tensor_to_symbols(t, w)
    assert s.size == t.bits.size * (t.bits.dtype.itemsize * 8 // w)
    assert symbols_to_tensor(s, dtype, t.shape, w).equal(t)


@given(st.lists(st.integers(0, 2**64 - 1), max_size=200))
def test_varint_bytes_is_the_encoded_length(values: list[int]) -> None:
    from bbformat.codec.varint import varint_bytes

    u = np.array(values, dtype=np.uint64)
    assert varint_bytes(u) == len(encode_varints(u))
    assert varint_bytes(u) == sum(max(1, -(-int(v).bit_length() // 7)) for v in u)  # LEB128: 7 bits a byte


@given(st.binary(max_size=24), st.integers(0, 3))
def test_byte_cursor_varint_agrees_with_decode_varints(data: bytes, start: int) -> None:
    """The group reader's scalar varint and the vectorised decoder accept, reject and read
    the same bytes."""
    from bbformat.bytecursor import ByteCursor

    cur = ByteCursor(data, "t")
    cur.pos = min(start, len(data))
    rest = data[cur.pos :]
    n = next((i + 1 for i, b in enumerate(rest) if not b & 0x80), None)
    try:
        want = int(decode_varints(rest[:n], 1)[0]) if n is not None else None
    except FormatError:
        want = None
    try:
        got = cur.varint("v")
    except FormatError as exc:
        assert exc.code == "E_SECTION_CONTENT"
        got = None
    assert got == want
    if got is not None:
        assert cur.pos == min(start, len(data)) + n


@given(st.lists(st.integers(0, 127), max_size=64))
def test_single_byte_varints_fast_path(values: list[int]) -> None:
    data = bytes(values)
    assert decode_varints(data, len(values)).tolist() == values
    if values:
        with pytest.raises(FormatError):
            decode_varints(data, len(values) + 1)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_raw_to_torch_bits_and_sharing(dtype: str) -> None:
    from bbformat.tensors import raw_to_torch, torch_to_raw

    rng = np.random.default_rng(7)
    nv = np.uint32 if dtype == "float32" else np.uint16
    bits = rng.integers(0, np.iinfo(nv).max, size=(5, 6), dtype=nv, endpoint=True)
    raw = RawTensor(dtype, bits)
    iv = torch.int32 if dtype == "float32" else torch.int16

    def as_bits(t: torch.Tensor) -> np.ndarray:
        return t.view(iv).numpy().view(nv)

    for copy in (True, False):
        t = raw_to_torch(raw, copy=copy)
        assert torch_to_raw(t).equal(raw)  # the same bits, NaN payloads included
        assert np.shares_memory(as_bits(t), bits) is (not copy)
    # copy=False copies whatever torch cannot share safely: read-only, strided, byte-swapped
    readonly = bits.copy()
    readonly.setflags(write=False)
    for odd in (readonly, bits.T, bits.astype(np.dtype(nv).newbyteorder(">"))):
        t = raw_to_torch(RawTensor(dtype, odd), copy=False)
        assert np.array_equal(as_bits(t), odd)
        assert not np.shares_memory(as_bits(t), odd)


def test_bits_to_ordinal_orders_like_the_values_on_every_16_bit_pattern() -> None:
    """dtypes.bits_to_ordinal against its definition, independently: sorted by value (+0 after
    -0), the float16 and bfloat16 patterns get consecutive ordinals with +0 at 0; every width
    round-trips through ordinal_to_bits, including each width's extremes."""
    bits = np.arange(1 << 16, dtype=np.uint16)
    for dtype in ("float16", "bfloat16"):
        v = bits_to_f64(bits, dtype)
        finite = np.flatnonzero(np.isfinite(v))
        order = finite[np.lexsort((~np.signbit(v[finite]), v[finite]))]  # -0 before +0
        o = bits_to_ordinal(bits, 16)
        assert np.array_equal(np.diff(o[order]), np.ones(order.size - 1, np.int64))
        assert o[0] == 0 and o[0x8000] == -1
    rng = np.random.default_rng(3)
    for w in (8, 16, 32, 64):
        u = np.dtype(f"uint{w}").type
        top = (1 << w) - 1
        b = np.concatenate([np.array([0, 1, top >> 1, (top >> 1) + 1, top], np.uint64),
                            rng.integers(0, top, 1000, dtype=np.uint64, endpoint=True)]).astype(u)
        o = bits_to_ordinal(b, w)
        mag = (b.astype(np.uint64) & np.uint64(top >> 1)).astype(object)
        want = [-int(m) - 1 if int(x) >> (w - 1) else int(m) for x, m in zip(b, mag)]
        assert o.tolist() == want
        assert np.array_equal(ordinal_to_bits(o, w), b)
    assert bits_to_ordinal(np.uint16(0x8001), 16).shape == () and int(ordinal_to_bits(np.int64(-2), 16)) == 0x8001  # 0-d

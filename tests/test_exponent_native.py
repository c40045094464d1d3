"""The compiled decoder of payload codec 3 (bbformat/codec/_exponent_native.c) against the
numpy decoder, the reference: the same symbols on every input, and on damaged input the
same outcome (the same symbols, or a FormatError with the same code). The conformance suite
(tests/test_conformance.py) runs every vector through the default, compiled path; here the
codec-3 vectors also go through numpy, so both stay conforming."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bbformat
from bbformat.codec import exponent
from bbformat.codec.exponent import NATIVE_DECODER, decode_exponent, encode_exponent
from bbformat.errors import BBFormatError

needs_native = pytest.mark.skipif(not NATIVE_DECODER, reason="the compiled decoder is not built (no C compiler at install)")
CONF = Path(__file__).resolve().parent.parent / "conformance"
DTYPES = ("float16", "bfloat16", "float32")


def _symbols(dtype: str, n: int, seed: int) -> np.ndarray:
    """Weight-like symbols with some arbitrary bit patterns mixed in."""
    import torch

    rng = np.random.default_rng(seed)
    bits = 32 if dtype == "float32" else 16
    u = np.uint32 if bits == 32 else np.uint16
    t = torch.from_numpy(rng.standard_normal(n) * 0.02).to(getattr(torch, dtype))
    sym = t.view(torch.int32 if bits == 32 else torch.int16).numpy().view(u).copy()
    wild = rng.random(n) < 0.01
    sym[wild] = rng.integers(0, 2**bits, int(wild.sum()), dtype=np.uint64).astype(u)
    return sym


def _outcome(data: bytes, total: int, dtype: str, native: bool) -> tuple[str, bytes]:
    try:
        return "ok", decode_exponent(data, total, dtype, native=native).tobytes()
    except BBFormatError as e:
        return e.code, b""


@needs_native
@settings(max_examples=60, deadline=None)
@given(st.sampled_from(DTYPES), st.lists(st.tuples(st.integers(1, 3_000), st.integers(1, 80)), min_size=1, max_size=5),
       st.integers(0, 2**32 - 1), st.sampled_from(exponent.JOINED_BITS_TRIED + (4,)))
def test_native_equals_numpy_and_the_input(dtype: str, runs: list[tuple[int, int]], seed: int, joined: int) -> None:
    runs = [(n, min(r, n)) for n, r in runs]
    sym = _symbols(dtype, sum(n for n, _ in runs), seed)
    if joined > exponent.max_joined(dtype):
        joined = 0
    orig = exponent.JOINED_BITS_TRIED
    exponent.JOINED_BITS_TRIED = (joined,)  # every joined width, so every rest layout (R mod 8, R div 8)
    try:
        data = encode_exponent(sym, dtype, runs)
    finally:
        exponent.JOINED_BITS_TRIED = orig
    assert data is not None
    native = decode_exponent(data, sym.size, dtype, native=True)
    assert native.dtype == decode_exponent(data, sym.size, dtype, native=False).dtype
    assert native.tobytes() == decode_exponent(data, sym.size, dtype, native=False).tobytes() == sym.astype(native.dtype).tobytes()


def _damage_base(dtype: str) -> bytes:
    sym = _symbols(dtype, 5_000, 3)
    return encode_exponent(sym, dtype, [(3_000, 60), (2_000, 40)]) or b""


@needs_native
@settings(max_examples=200, deadline=None)
@given(st.sampled_from(DTYPES), st.integers(0, 2**32 - 1), st.sampled_from(["flip", "set", "cut", "insert"]))
def test_damage_gives_the_same_outcome_on_both(dtype: str, seed: int, how: str) -> None:
    data = bytearray(_damage_base(dtype))
    rng = np.random.default_rng(seed)
    at = int(rng.integers(len(data) // 3, len(data)))  # mostly the stream and the rest fields
    if how == "flip":
        data[at] ^= 1 << int(rng.integers(0, 8))
    elif how == "set":
        data[at] = int(rng.integers(0, 256))
    elif how == "cut":
        del data[at:]
    else:
        data[at:at] = bytes(rng.integers(0, 256, int(rng.integers(1, 9)), dtype=np.uint8))
    assert _outcome(bytes(data), 5_000, dtype, True) == _outcome(bytes(data), 5_000, dtype, False)


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
    tables = np.zeros(exponent.LUT_BYTES + 8, np.uint8)
    tables[exponent.LUT_BYTES : exponent.LUT_BYTES + 2] = [0xFF, 0x3F]  # one entry of frequency 2^14: x stays 2^16
    good = dict(stream=b"\x00\x00\x01\x00", lanes=1, n=i64(1), r=i64(1), base=i64(0), has_map=np.zeros(1, np.uint8),
                maps=np.zeros(0, np.uint8), tables=tables, offsets=np.zeros(1, np.uint64), sizes=np.ones(1, np.uint32),
                rest=b"\x00" * 5, shift=4, width=16, out=np.zeros(1, np.uint16))
    assert native.decode(*good.values()) == 0  # one symbol, one one-entry table: no word read
    for key, bad in [("base", i64(1)), ("sizes", np.full(1, 2, np.uint32)), ("rest", b"\x00"), ("out", np.zeros(2, np.uint16)),
                     ("shift", 15), ("lanes", 0), ("offsets", np.full(1, 8, np.uint64)), ("stream", b"\x00\x00\x01")]:
        args = dict(good, **{key: bad})
        if key == "sizes":  # a slot pointing past the table's entries
            args["tables"] = tables.copy()
            args["tables"][:2] = [5, 0]
            args["sizes"] = np.ones(1, np.uint32)
        with pytest.raises(ValueError, match="inconsistent arguments"):
            native.decode(*args.values())


def test_the_decoder_is_built_where_a_c_compiler_is() -> None:
    """The extension is optional (setup.py), so a broken build would pass silently: where the
    machine has a C compiler (CI installs one), the install must have built it."""
    import shutil

    assert NATIVE_DECODER or not (shutil.which("cc") or shutil.which("gcc"))

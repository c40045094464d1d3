"""The encoder's row-block path for large tensors (codec/encoder.py, LARGE_F64_BYTES), forced on
tiny models by lowering the thresholds: the container still decodes bit for bit to what the
encoder intended, the rotated values are the rounded product to within one unit in the last
place, and the Gram matrix summed over blocks has the same eigenvectors up to sign."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import bbformat
from bbformat.checkpoint import write_checkpoint
from bbformat.codec import encoder
from bbformat.codec import rotation as rot
from bbformat.codec.dtypes import RawTensor
from bbformat.testing import make_tiny_checkpoint


@pytest.fixture
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(encoder, "LARGE_F64_BYTES", 0)
    monkeypatch.setattr(encoder, "BLOCK_F64_BYTES", 8 * 64 * 7)  # 7 rows of 64 at a time: many ragged blocks


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("axis", [0, 1])
def test_rotate_rounded_blocks_is_the_rounded_product(small_blocks: None, dtype: str, axis: int) -> None:
    rng = np.random.default_rng(1)
    t = RawTensor.from_f64(rng.normal(0, 0.1, (100, 64) if axis == 1 else (64, 100)), dtype)
    r = np.linalg.qr(rng.normal(size=(64, 64)))[0]
    got = encoder.rotate_rounded_blocks(t, axis, r)
    want = RawTensor.from_f64(rot.rotate_axis(t.to_f64(), axis, r), dtype)
    assert got.shape == t.shape and got.bits.flags.c_contiguous
    # a block's product may round its last bit differently from one product over the whole matrix
    step = np.abs(want.to_f64()) * (2.0 ** -{"float16": 10, "bfloat16": 7, "float32": 23}[dtype])
    assert np.all(np.abs(got.to_f64() - want.to_f64()) <= step + 1e-30)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("axis", [0, 1])
def test_row_blocks_on_the_helper_thread_give_the_bits_of_one_block_at_a_time(small_blocks: None, dtype: str, axis: int) -> None:
    """rotate_rounded_blocks widens and rounds on a helper thread beside the products: the bits
    of the plain loop (widen, product, round, block by block), and canonical_rotation_of's
    summed Gram is the loop's sum in the same order (the same eigenvectors, bit for bit)."""
    rng = np.random.default_rng(3)
    t = RawTensor.from_f64(rng.normal(0, 0.1, (100, 64) if axis == 1 else (64, 100)), dtype)
    r = np.linalg.qr(rng.normal(size=(64, 64)))[0]
    m = rot.axis_matrix(t.bits, axis)
    step = encoder.BLOCK_F64_BYTES // (8 * 64)
    rows = [RawTensor.from_f64(RawTensor(dtype, m[i : i + step]).to_f64() @ r, dtype).bits for i in range(0, m.shape[0], step)]
    want = rot.from_axis_matrix(np.concatenate(rows), t.shape, axis)
    assert len(rows) > 3 and np.array_equal(encoder.rotate_rounded_blocks(t, axis, r).bits, want)
    g = None
    for i in range(0, m.shape[0], step):
        x = RawTensor(dtype, m[i : i + step]).to_f64()
        g = x.T @ x if g is None else g + x.T @ x
    assert np.array_equal(encoder.canonical_rotation_of(t, axis), np.linalg.eigh(g)[1])


def test_blocked_gram_has_the_same_eigenvectors(small_blocks: None) -> None:
    rng = np.random.default_rng(2)
    t = RawTensor.from_f64(rng.normal(0, 0.1, (300, 48)) * np.linspace(2, 0.5, 48), "float32")
    got = encoder.canonical_rotation_of(t, 1)
    want = encoder.canonical_rotation(t.to_f64(), 1)
    assert np.allclose(np.abs(np.sum(got * want, axis=0)), 1.0, atol=1e-8)


@pytest.mark.parametrize("scheme", ["symmetric", "paper"])
def test_pack_with_every_tensor_large_is_exact(small_blocks: None, tmp_path: Path, scheme: str) -> None:
    ckpt = make_tiny_checkpoint("llama", seed=5, layers=2)
    write_checkpoint(ckpt, tmp_path / "m")
    rep = bbformat.pack(tmp_path / "m", tmp_path / "m.bb", scheme=scheme, tolerance=0.0, verify=True)
    assert rep.container_bytes > 0
    out = bbformat.read_tensors(tmp_path / "m.bb")
    assert list(out) == list(ckpt.state_dict)


def test_row_block_jobs_run_in_the_callers_context(small_blocks: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The helper thread's widening and rounding see the caller's ContextVars (a pack's
    host_native.spread): a ContextVar set here is read back inside every job."""
    import contextvars

    from bbformat.codec import dtypes

    mark: contextvars.ContextVar[str] = contextvars.ContextVar("mark", default="unset")
    seen: list[str] = []
    widen, into = dtypes.bits_to_f64, dtypes.f64_to_bits_into

    def seen_widen(*a, **k):  # type: ignore[no-untyped-def]
        seen.append(mark.get())
        return widen(*a, **k)

    def seen_into(*a, **k):  # type: ignore[no-untyped-def]
        seen.append(mark.get())
        return into(*a, **k)

    monkeypatch.setattr(dtypes, "bits_to_f64", seen_widen)
    monkeypatch.setattr(encoder, "f64_to_bits_into", seen_into)
    rng = np.random.default_rng(4)
    t = RawTensor.from_f64(rng.normal(0, 0.1, (100, 64)), "bfloat16")
    r = np.linalg.qr(rng.normal(size=(64, 64)))[0]
    mark.set("caller")
    encoder.rotate_rounded_blocks(t, 1, r)
    encoder.canonical_rotation_of(t, 1)
    assert len(seen) > 10 and set(seen) == {"caller"}

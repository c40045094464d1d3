"""Error-feedback rounding of rotated tensors (encoder only) and calibrated pack."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import bbformat
from bbformat.checkpoint import read_checkpoint, write_checkpoint
from bbformat.codec.dtypes import RawTensor, bits_to_f64, f64_to_bits
from bbformat.codec.encoder import encode_chunk
from bbformat.codec.layout import ChunkLayout, SiteSpec
from bbformat.container.program import AxisRef
from bbformat.codec.decoder import decode_program
from bbformat.codec.rounding import function_error, quantize_moment, round_feedback
from bbformat.codec.sections import StoredCorrector, decoded_limit
from bbformat.zstdframe import decompress
from bbformat.testing import make_tiny_checkpoint, reference_logits

DTYPES = ["float16", "bfloat16", "float32"]


def _moment(rng: np.random.Generator, d: int, spike: float) -> np.ndarray:
    """E[x xᵀ] of inputs with one massive direction, like a residual stream."""
    x = rng.normal(size=(4 * d, d))
    x[:, 0] *= spike
    q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    x = x @ q.T
    return x.T @ x / x.shape[0]


@pytest.mark.parametrize("dtype", DTYPES)
def test_isotropic_moment_gives_nearest_rounding(dtype: str) -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(0, 0.05, (24, 10))
    got = round_feedback(x, 0, 3.0 * np.eye(24), dtype)
    assert np.array_equal(got, f64_to_bits(x, dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("axis", [0, 1])
def test_feedback_lowers_the_function_error(dtype: str, axis: int) -> None:
    rng = np.random.default_rng(2)
    x = rng.normal(0, 0.05, (32, 48))
    d = x.shape[axis]
    h = _moment(rng, d, 30.0)
    near = f64_to_bits(x, dtype)
    fb = round_feedback(x, axis, h, dtype)
    assert fb.shape == x.shape and fb.dtype == near.dtype
    assert np.all(np.isfinite(bits_to_f64(fb, dtype)))
    e_near, e_fb = function_error(x, near, axis, h, dtype), function_error(x, fb, axis, h, dtype)
    assert e_fb < 0.5 * e_near, (e_fb, e_near)
    # feedback moves values, but only by rounding-sized amounts
    ulp_scale = np.abs(x).max() * {"float16": 2**-10, "bfloat16": 2**-7, "float32": 2**-23}[dtype]
    assert np.abs(bits_to_f64(fb, dtype) - x).max() < 64 * ulp_scale


def test_unusable_moment_falls_back_to_nearest() -> None:
    x = np.random.default_rng(3).normal(0, 1, (8, 5))
    for h in (np.zeros((8, 8)), np.full((8, 8), np.nan), np.eye(7)):
        assert np.array_equal(round_feedback(x, 0, h, "float16"), f64_to_bits(x, "float16"))


def test_quantized_moment_absorbs_last_bit_noise() -> None:
    rng = np.random.default_rng(4)
    x = rng.normal(0, 0.05, (40, 30))
    h = _moment(rng, 40, 20.0)
    noisy = h * (1 + 1e-13 * rng.normal(size=h.shape))
    a = round_feedback(x, 0, quantize_moment(h), "float16")
    b = round_feedback(x, 0, quantize_moment(noisy), "float16")
    assert np.array_equal(a, b)


def test_encoder_with_moments_keeps_bits_back_exact() -> None:
    rng = np.random.default_rng(5)
    d = 16
    tensors = {
        "prefix": RawTensor.from_f64(rng.normal(0, 0.05, (d + 4, d)), "float16"),
        "anchor": RawTensor.from_f64(rng.normal(0, 0.05, (d, 40)), "float16"),
        "follower": RawTensor.from_f64(rng.normal(0, 0.05, (30, d)), "float16"),
    }
    layout = ChunkLayout("c", ("prefix", "anchor", "follower"), (SiteSpec("s", d, AxisRef("anchor", 0), (AxisRef("follower", 1),)),))
    h = _moment(rng, d, 25.0)
    plain = encode_chunk(layout, tensors, {}, "symmetric", 0.0)
    fed = encode_chunk(layout, tensors, {}, "symmetric", 0.0, moments={"follower": (1, h)})
    side = {(sec.kind, sec.site): decompress(sec.stored, sec.codec, len(sec.data), decoded_limit(fed.program, sec.kind, sec.site))
            for sec in fed.sections if sec.kind != 1}
    dec = decode_program(fed.program, fed.payload, StoredCorrector(fed.program, side))
    for name, t in fed.intended.items():
        assert dec[name].equal(t), name
    # same rotation, same anchor; only the follower's rounding differs, and for the better
    assert fed.intended["anchor"].equal(plain.intended["anchor"])
    r_f64 = _rotation_of(plain, tensors)
    exact = tensors["follower"].to_f64() @ r_f64
    h_rot = r_f64.T @ h @ r_f64
    e_plain = function_error(exact, plain.intended["follower"].bits, 1, h_rot, "float16")
    e_fed = function_error(exact, fed.intended["follower"].bits, 1, h_rot, "float16")
    assert e_fed < 0.6 * e_plain, (e_fed, e_plain)


def _rotation_of(enc, tensors):  # type: ignore[no-untyped-def]
    """R with anchor' ≈ Rᵀ anchor, recovered in float64 from the stored anchor."""
    a0, a1 = tensors["anchor"].to_f64(), enc.intended["anchor"].to_f64()
    u, _, vt = np.linalg.svd(a0 @ a1.T)
    return u @ vt


def test_calibrated_pack_is_exact_and_closer_to_the_input(tmp_path: Path) -> None:
    ckpt = make_tiny_checkpoint("llama", seed=11, layers=2, hidden=64)
    src = tmp_path / "src"
    write_checkpoint(ckpt, src)
    vocab = int(ckpt.hf_config["vocab_size"])
    tokens = torch.from_numpy(np.random.default_rng(0).integers(0, vocab, size=(8, 16)))
    errs = {}
    for mode, cal in (("nearest", None), ("feedback", tokens)):
        out = tmp_path / f"{mode}.bb"
        bbformat.pack(src, out, tolerance=0.0, verify=True, calibration=cal)
        with bbformat.open_container(out) as r:
            assert r.metadata.get("rounding", "nearest") == mode
        bbformat.unpack(out, tmp_path / mode)
        back = read_checkpoint(tmp_path / mode)
        ref = reference_logits(ckpt, tokens.numpy())
        errs[mode] = float(np.mean((reference_logits(back, tokens.numpy()) - ref) ** 2))
    assert errs["feedback"] < errs["nearest"], errs
    # deterministic: the same input and options give the same bytes
    again = tmp_path / "again.bb"
    bbformat.pack(src, again, tolerance=0.0, calibration=tokens)
    assert again.read_bytes() == (tmp_path / "feedback.bb").read_bytes()


def test_calibration_rejects_non_llama(tmp_path: Path) -> None:
    ckpt = make_tiny_checkpoint("opt", seed=1, layers=1)
    write_checkpoint(ckpt, tmp_path / "src")
    with pytest.raises(bbformat.BBFormatError, match="Llama"):
        bbformat.pack(tmp_path / "src", tmp_path / "o.bb", calibration=torch.zeros((2, 8), dtype=torch.long))
    assert not (tmp_path / "o.bb").exists()


def test_feedback_cache_keys_on_rotations_of_every_axis() -> None:
    """A tensor re-rounded under different rotations (a second planning pass) must not
    come back from the cache rounded under the old ones."""
    from bbformat.codec.encoder import round_rotated

    rng = np.random.default_rng(6)
    x = rng.normal(0, 0.05, (12, 10))
    r1 = np.linalg.qr(rng.normal(size=(10, 10)))[0]
    base_h = {"t": (0, _moment(rng, 12, 10.0))}
    cache: dict = {}
    first = round_rotated("t", x @ r1, [(1, r1)], "float16", base_h, cache)
    second = round_rotated("t", x, [], "float16", base_h, cache)
    assert np.array_equal(second.bits, round_feedback(x, 0, base_h["t"][1], "float16"))
    assert not np.array_equal(first.bits, second.bits)

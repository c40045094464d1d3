"""pack/unpack round trips over generated OPT and Llama models, both schemes."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import bbformat
from bbformat.checkpoint import read_checkpoint, write_checkpoint
from bbformat.testing import make_tiny_checkpoint, reference_logits

SLOW = settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _ids(vocab: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, size=(2, 12))


def _logit_tol(ref: np.ndarray) -> float:
    # fp16 storage of rotated weights: errors of a few fp16 ulps of the largest logits
    return 2e-2 * max(1.0, float(np.abs(ref).max()))


def _roundtrip(tmp: Path, ckpt, scheme: str, tol: float | None):  # type: ignore[no-untyped-def]
    src, out, back = tmp / "src", tmp / "m.bb", tmp / "back"
    write_checkpoint(ckpt, src)
    rep = bbformat.pack(src, out, scheme=scheme, tolerance=tol, verify=True)
    bbformat.unpack(out, back)
    return rep, read_checkpoint(back), out


@SLOW
@given(seed=st.integers(0, 2**31 - 1), arch=st.sampled_from(["llama", "opt"]), scheme=st.sampled_from(["symmetric", "paper"]),
       layers=st.integers(1, 3))
def test_unpack_pack_preserves_logits(tmp_path_factory: pytest.TempPathFactory, seed: int, arch: str, scheme: str, layers: int) -> None:
    tmp = tmp_path_factory.mktemp("rt")
    ckpt = make_tiny_checkpoint(arch, seed=seed, layers=layers)
    rep, back, _ = _roundtrip(tmp, ckpt, scheme, None)
    ids = _ids(int(ckpt.hf_config["vocab_size"]), seed)
    ref = reference_logits(ckpt, ids)
    got = reference_logits(back, ids)
    assert np.abs(got - ref).max() <= _logit_tol(ref)
    # same keys, order, dtypes and shapes as the input
    assert list(back.state_dict) == list(ckpt.state_dict)
    for k, v in ckpt.state_dict.items():
        assert back.state_dict[k].dtype == v.dtype and back.state_dict[k].shape == v.shape


@pytest.mark.parametrize("arch", ["llama", "opt"])
def test_exact_mode_decodes_bit_for_bit_and_saves(tmp_path: Path, arch: str) -> None:
    ckpt = make_tiny_checkpoint(arch, seed=5, layers=3, hidden=128)
    rep, back, out = _roundtrip(tmp_path, ckpt, "symmetric", 0.0)
    # pack(verify=True) already compared every decoded tensor with the encoder's intent;
    # here, independently: untouched tensors come back identical to the input
    info = bbformat.inspect(out)["totals"]
    assert info["saved_pct_of_bound"] >= 60.0, info
    assert info["saved_bits"] > 0
    assert rep.saved_bits == info["saved_bits"]


@pytest.mark.parametrize("arch", ["llama", "opt"])
def test_tolerance_mode_keeps_95_percent_of_the_bound(tmp_path: Path, arch: str) -> None:
    ckpt = make_tiny_checkpoint(arch, seed=6, layers=3, hidden=256)
    _, back, out = _roundtrip(tmp_path, ckpt, "symmetric", 1e-3)
    info = bbformat.inspect(out)["totals"]
    assert info["saved_pct_of_bound"] >= 95.0, info


def test_paper_scheme_uses_the_embedding_site(tmp_path: Path) -> None:
    ckpt = make_tiny_checkpoint("llama", seed=7, layers=2, hidden=128)
    _, _, out = _roundtrip(tmp_path, ckpt, "paper", None)
    info = bbformat.inspect(out)
    assert info["tolerance"] == 0.005
    names = [r["name"] for b in info["blocks"] for r in b["rotations"] if not r["stored_plainly"]]
    assert "embed" in names
    assert info["totals"]["sign_bits"] > 0


def test_packing_is_deterministic(tmp_path: Path) -> None:
    ckpt = make_tiny_checkpoint("llama", seed=8, layers=2)
    write_checkpoint(ckpt, tmp_path / "src")
    bbformat.pack(tmp_path / "src", tmp_path / "a.bb")
    bbformat.pack(tmp_path / "src", tmp_path / "b.bb")
    assert (tmp_path / "a.bb").read_bytes() == (tmp_path / "b.bb").read_bytes()


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_other_element_types(tmp_path: Path, dtype: str) -> None:
    ckpt = make_tiny_checkpoint("llama", seed=9, layers=2, hidden=96, dtype=dtype)
    rep, back, _ = _roundtrip(tmp_path, ckpt, "symmetric", 0.0)
    assert all(v.dtype == getattr(torch, dtype) for v in back.state_dict.values())
    ids = _ids(int(ckpt.hf_config["vocab_size"]), 0)
    ref = reference_logits(ckpt, ids)
    assert np.abs(reference_logits(back, ids) - ref).max() <= _logit_tol(ref)


def test_safetensors_output_and_input(tmp_path: Path) -> None:
    ckpt = make_tiny_checkpoint("opt", seed=10, layers=2)
    write_checkpoint(ckpt, tmp_path / "src")
    bbformat.pack(tmp_path / "src", tmp_path / "m.bb")
    bbformat.unpack(tmp_path / "m.bb", tmp_path / "st", fmt="safetensors")
    assert list((tmp_path / "st").glob("*.safetensors"))
    bbformat.pack(tmp_path / "st", tmp_path / "m2.bb")  # safetensors in place of .pt
    a = bbformat.read_tensors(tmp_path / "m.bb")
    b = bbformat.read_tensors(tmp_path / "m2.bb")
    assert a.keys() == b.keys()


def test_streaming_blocks_hold_one_block(tmp_path: Path) -> None:
    ckpt = make_tiny_checkpoint("llama", seed=11, layers=3)
    write_checkpoint(ckpt, tmp_path / "src")
    bbformat.pack(tmp_path / "src", tmp_path / "m.bb")
    with bbformat.open_container(tmp_path / "m.bb") as r:
        names = [b.name for b in r.iter_blocks()]
        sizes = [sum(t.bits.nbytes for t in b.tensors.values()) for b in r.iter_blocks()]
    assert len(names) == len(r.entries) and max(sizes) < sum(sizes)


def test_unknown_scheme_and_bad_tolerance(tmp_path: Path) -> None:
    ckpt = make_tiny_checkpoint("llama", seed=12, layers=1)
    write_checkpoint(ckpt, tmp_path / "src")
    with pytest.raises(bbformat.InputError):
        bbformat.pack(tmp_path / "src", tmp_path / "m.bb", scheme="nope")
    with pytest.raises(bbformat.InputError):
        bbformat.pack(tmp_path / "src", tmp_path / "m.bb", tolerance=-1)
    assert not (tmp_path / "m.bb").exists()


def test_verify_failure_keeps_the_previous_container(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pack --verify checks the finished temp file; a failure leaves dst as it was and no temp."""
    import bbformat.api as api
    from bbformat.errors import VerifyError

    src = tmp_path / "src"
    write_checkpoint(make_tiny_checkpoint("llama", seed=2, layers=2), src)
    dst = tmp_path / "m.bb"
    api.pack(src, dst, scheme="paper", tolerance=0.005)
    before = dst.read_bytes()

    def fail(path: object, digests: object, device: object = None, threads: object = None) -> None:
        assert Path(str(path)) != dst  # the temp file is checked, not the destination
        raise VerifyError("simulated mismatch")

    monkeypatch.setattr(api, "verify_container", fail)
    with pytest.raises(VerifyError):
        api.pack(src, dst, scheme="symmetric", tolerance=0.0, verify=True, overwrite=True)
    assert dst.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.bb", "src"]


def test_scheme_none_gives_back_the_input_bits(tmp_path: Path) -> None:
    """--scheme none: no rotation, the entropy stage alone; unpack returns every tensor's bytes."""
    from safetensors.torch import load_file

    from bbformat.checkpoint import write_checkpoint
    from bbformat.api import pack, unpack
    from bbformat.constants import SCHEME_CODES
    from bbformat.errors import InputError
    from bbformat.reader import Reader
    from bbformat.testing import make_tiny_checkpoint

    for dtype in ("float16", "bfloat16", "float32"):
        src = tmp_path / dtype
        write_checkpoint(make_tiny_checkpoint("llama", seed=6, layers=2, dtype=dtype), src)
        unpack(pack(src, tmp_path / f"{dtype}.bb", scheme="none", verify=True).path, tmp_path / f"{dtype}_in", fmt="safetensors")
        with Reader(tmp_path / f"{dtype}.bb") as r:
            assert r.header.scheme == "none" and SCHEME_CODES["none"] == 3
            assert all(not r.read_program(i).sites for i in range(len(r)))
            assert {r.read_chunk(i).sections[0]["codec"] for i in range(len(r))} & {1, 2, 3}  # auto: an entropy codec somewhere
        sd = torch.load(next(src.glob("*.pt")), weights_only=True)
        back = load_file(str(next((tmp_path / f"{dtype}_in").glob("*.safetensors"))))
        assert set(back) == set(sd)
        assert all(back[k].dtype == sd[k].dtype and torch.equal(back[k].contiguous().view(torch.uint8), sd[k].contiguous().view(torch.uint8))
                   for k in sd)
    with pytest.raises(InputError, match="needs format 1.2 or later"):
        pack(src, tmp_path / "x.bb", scheme="none", format_version="1.1")


@pytest.mark.parametrize("scheme", ["symmetric", "paper", "none"])
def test_entropy_auto_is_the_default_for_every_scheme(tmp_path: Path, scheme: str) -> None:
    """pack without --entropy writes the entropy stage (issue 39): the same bytes as
    entropy="auto", smaller than entropy="none", and decodes exactly."""
    from bbformat.api import pack
    from bbformat.cli import main
    from bbformat.reader import Reader

    src = tmp_path / "src"
    write_checkpoint(make_tiny_checkpoint("llama", seed=3, layers=2, dtype="bfloat16"), src)
    default = pack(src, tmp_path / "d.bb", scheme=scheme).path
    auto = pack(src, tmp_path / "a.bb", scheme=scheme, entropy="auto").path
    raw = pack(src, tmp_path / "r.bb", scheme=scheme, entropy="none").path
    assert main(["pack", str(src), str(tmp_path / "c.bb"), "--scheme", scheme, "--quiet"]) == 0
    assert Path(default).read_bytes() == Path(auto).read_bytes() == (tmp_path / "c.bb").read_bytes()
    assert Path(default).stat().st_size < Path(raw).stat().st_size
    with Reader(default) as r:
        assert {r.read_chunk(i).sections[0]["codec"] for i in range(len(r))} - {0}  # an entropy codec somewhere
        assert all(b.exact for b in r.iter_blocks())


def test_writer_refuses_scheme_none_without_digests() -> None:
    """SPEC.md 4: scheme 3 needs DIGESTS; a reader rejects it without (E_SCHEME, 1.5), so the
    Writer refuses to start one, before anything is written."""
    import io

    from bbformat.errors import InputError
    from bbformat.writer import Writer

    buf = io.BytesIO()
    with pytest.raises(InputError, match="needs DIGESTS"):
        Writer(buf, "none", 1, {"format": "bbformat", "scheme": "none"}, format_version="1.1")
    assert buf.getvalue() == b""

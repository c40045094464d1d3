"""Checkpoint I/O in TransformerCompression's layout, plan() for Llama and OPT, and the
proof that every rotation site is a true symmetry of the sliced model's function."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bbformat.adapters import detect, plan
from bbformat.checkpoint import Checkpoint, read_checkpoint, write_checkpoint
from bbformat.codec.layout import ModelLayout
from bbformat.errors import InputError, UnsupportedModelError
from bbformat.testing import make_tiny_checkpoint, reference_logits

ARCHS = ["llama", "opt"]
SCHEMES = ["symmetric", "paper"]


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def _copy(ckpt: Checkpoint, **changes: object) -> Checkpoint:
    base = {"state_dict": dict(ckpt.state_dict), "slicing_config": json.loads(json.dumps(ckpt.slicing_config)),
            "hf_config": json.loads(json.dumps(ckpt.hf_config)), "extra_files": dict(ckpt.extra_files)}
    base.update(changes)
    return Checkpoint(ckpt.stem, **base)  # type: ignore[arg-type]


# ---------------------------------------------------------------- checkpoint I/O


@pytest.mark.parametrize("fmt", ["pt", "safetensors"])
@pytest.mark.parametrize("arch", ARCHS)
def test_write_read_write_is_byte_exact(tmp_path: Path, arch: str, fmt: str) -> None:
    ckpt = make_tiny_checkpoint(arch, seed=1, layers=2, dtype="bfloat16" if fmt == "pt" else "float16")
    write_checkpoint(ckpt, tmp_path / "a", fmt=fmt)
    back = read_checkpoint(tmp_path / "a")
    write_checkpoint(back, tmp_path / "b", fmt=fmt)
    assert _files(tmp_path / "a") == _files(tmp_path / "b")
    assert back.stem == ckpt.stem and back.hf_config == ckpt.hf_config and back.slicing_config == ckpt.slicing_config
    assert set(back.extra_files) == set(ckpt.extra_files) and all(back.extra_files[k] == v for k, v in ckpt.extra_files.items())
    assert set(back.state_dict) == set(ckpt.state_dict)
    if fmt == "pt":
        assert list(back.state_dict) == list(ckpt.state_dict)
    for k, v in ckpt.state_dict.items():
        assert back.state_dict[k].dtype == v.dtype and torch.equal(back.state_dict[k], v)
    # no temp files left behind; the weights file itself is accepted as SRC too
    assert not [p for p in (tmp_path / "a").iterdir() if "bbtmp" in p.name]
    again = read_checkpoint(tmp_path / "a" / f"{ckpt.stem}.{fmt}")
    assert list(again.state_dict) == list(back.state_dict)


def test_side_files_travel_byte_exact(tmp_path: Path) -> None:
    ckpt = make_tiny_checkpoint("llama", seed=2, layers=1)
    d = tmp_path / "m"
    write_checkpoint(ckpt, d)
    (d / "tokenizer.json").write_bytes(b'{"x": 1}\n')
    (d / "tokenizer.model").write_bytes(b"\x00\x01binary")
    (d / "merges.txt").write_bytes(b"a b\n")
    (d / "config.json").write_bytes(b'{"model_type": "llama",  "weird":   "spacing"}')  # kept byte for byte
    back = read_checkpoint(d)
    write_checkpoint(back, tmp_path / "out")
    assert _files(d) == _files(tmp_path / "out")
    assert back.hf_config["weird"] == "spacing"


def test_read_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        read_checkpoint(tmp_path / "nope")
    ckpt = make_tiny_checkpoint("opt", seed=3, layers=1)
    d = tmp_path / "m"
    write_checkpoint(ckpt, d)
    (d / "config.json").unlink()
    with pytest.raises(InputError, match="config.json"):
        read_checkpoint(d)
    write_checkpoint(ckpt, d, overwrite=True)
    (d / f"{ckpt.stem}.json").unlink()
    with pytest.raises(InputError, match="SlicingConfig"):
        read_checkpoint(d)
    write_checkpoint(ckpt, d, overwrite=True)
    torch.save(dict(ckpt.state_dict), d / "other.pt")
    (d / "other.json").write_text("{}")
    with pytest.raises(InputError, match="ambiguous"):
        read_checkpoint(d)
    assert read_checkpoint(d / f"{ckpt.stem}.pt").stem == ckpt.stem  # naming the file resolves it
    (d / "other.pt").unlink()
    (d / "other.json").unlink()
    torch.save({"a": torch.zeros(2), "step": 3}, d / f"{ckpt.stem}.pt")
    with pytest.raises(InputError, match="not a tensor"):
        read_checkpoint(d)
    (d / f"{ckpt.stem}.pt").write_bytes(b"garbage" * 10)
    with pytest.raises(InputError, match="weights_only"):
        read_checkpoint(d)
    (d / f"{ckpt.stem}.pt").unlink()
    (d / f"{ckpt.stem}.safetensors").write_bytes(b"\xff" * 20)
    with pytest.raises(InputError, match="safetensors"):
        read_checkpoint(d)


def test_from_parts_needs_both_configs() -> None:
    ckpt = make_tiny_checkpoint("llama", seed=4, layers=1)
    again = Checkpoint.from_parts(ckpt.stem, ckpt.state_dict, ckpt.extra_files)
    assert again.hf_config == ckpt.hf_config and again.slicing_config == ckpt.slicing_config
    with pytest.raises(InputError):
        Checkpoint.from_parts(ckpt.stem, ckpt.state_dict, {"config.json": ckpt.extra_files["config.json"]})


def test_tiny_checkpoint_is_deterministic_and_sliced() -> None:
    a = make_tiny_checkpoint("llama", seed=9, layers=3, hidden=64)
    b = make_tiny_checkpoint("llama", seed=9, layers=3, hidden=64)
    assert list(a.state_dict) == list(b.state_dict) and all(torch.equal(a.state_dict[k], b.state_dict[k]) for k in a.state_dict)
    sc = a.slicing_config
    assert sc["mlp_output_dimensions"]["2"] == 64 == sc["head_dimension"]
    assert all(v < 64 for v in sc["attention_output_dimensions"].values())
    q = a.state_dict["model.layers.1.attn_shortcut_Q"].double()
    assert torch.linalg.matrix_norm(q, 2) <= 1 + 1e-2  # a slice of an orthogonal matrix
    c = make_tiny_checkpoint("opt", seed=9, layers=2, hidden=32, dims=[24, 16, 24, 20, 32])
    assert c.slicing_config["attention_output_dimensions"] == {"0": 16, "1": 20}


# ---------------------------------------------------------------- plan()


def _check_layout(ckpt: Checkpoint, layout: ModelLayout, arch: str, scheme: str) -> None:
    names = [t for c in layout.chunks for t in c.tensors]
    assert sorted(names) == sorted(ckpt.state_dict) and len(names) == len(set(names))
    assert layout.architecture == arch and layout.scheme == scheme
    n = ckpt.hf_config["num_hidden_layers"]
    want = ["embed"] + [f"layers.{i}" for i in range(n)] + (["head"] if scheme == "symmetric" else [])
    assert [c.name for c in layout.chunks] == want
    sites = layout.all_sites()
    assert [s.name for s in sites] == ["embed"] + [f"layers.{i}.{w}" for i in range(n) for w in ("attn", "mlp")]
    for s in sites:
        for ref in s.touched():
            assert ckpt.state_dict[ref.tensor].shape[ref.axis] == s.dim, (s.name, ref)
    if scheme == "paper":
        assert layout.chunks[0].tensors[0] == "lm_head.weight"
        assert layout.chunks[1].tensors[0].endswith("attn_shortcut_Q")
    else:
        assert layout.chunks[1].tensors[-1].endswith("mlp_shortcut_Q")


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("arch", ARCHS)
def test_plan_covers_every_key_once(arch: str, scheme: str) -> None:
    for layers in (1, 3):
        ckpt = make_tiny_checkpoint(arch, seed=layers, layers=layers)
        assert detect(ckpt.hf_config) == arch
        _check_layout(ckpt, plan(ckpt, scheme), arch, scheme)
    ckpt = make_tiny_checkpoint(arch, seed=5, layers=2, hidden=48, do_slice_head=True, dtype="float32")
    _check_layout(ckpt, plan(ckpt, scheme), arch, scheme)


def test_const_dimension_config_is_understood() -> None:
    ckpt = make_tiny_checkpoint("llama", seed=6, layers=2, hidden=32, dims=24)
    sc = {"hidden_size": 32, "layers_num": 2, "do_slice_head": False, "parallel_blocks": False, "embedding_dimensions": {},
          "attention_input_dimensions": {}, "attention_output_dimensions": {}, "mlp_input_dimensions": {},
          "mlp_output_dimensions": {}, "head_dimension": None, "const_dimension": 24}
    _check_layout(ckpt, plan(_copy(ckpt, slicing_config=sc), "symmetric"), "llama", "symmetric")


def test_identity_norm_leftovers_are_tolerated_and_placed() -> None:
    ckpt = make_tiny_checkpoint("llama", seed=7, layers=2, hidden=32)
    sd = dict(ckpt.state_dict)
    sd["model.layers.1.input_layernorm.weight"] = torch.ones(24, dtype=torch.float16)
    sd["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(4)
    sd["model.norm.weight"] = torch.ones(32, dtype=torch.float16)
    c = Checkpoint(ckpt.stem, sd, ckpt.slicing_config, ckpt.hf_config, ckpt.extra_files)
    for scheme in SCHEMES:
        lay = plan(c, scheme)
        by = {ch.name: ch.tensors for ch in lay.chunks}
        assert by["layers.1"][0] == "model.layers.1.input_layernorm.weight"
        assert by["layers.0"][0] == "model.layers.0.self_attn.rotary_emb.inv_freq"
        assert "model.norm.weight" in by["head" if scheme == "symmetric" else "embed"]
    sd["model.layers.1.input_layernorm.weight"] = torch.full((24,), 1.5, dtype=torch.float16)
    with pytest.raises(UnsupportedModelError, match="input_layernorm"):
        plan(c, "symmetric")


# ---------------------------------------------------------------- refusals


def _refused(ckpt: Checkpoint, match: str, cls: type[Exception] = UnsupportedModelError) -> None:
    with pytest.raises(cls, match=match):
        plan(ckpt, "symmetric")


@pytest.mark.parametrize("arch", ARCHS)
def test_refusals(arch: str) -> None:
    ckpt = make_tiny_checkpoint(arch, seed=8, layers=2, hidden=32)
    key = next(k for k in ckpt.state_dict if k.endswith("layers.1.fc1.weight") or k.endswith("layers.1.mlp.up_proj.weight"))
    sd = dict(ckpt.state_dict)
    sd[key] = sd[key][:, :-1].clone()
    _refused(_copy(ckpt, state_dict=sd), key.replace(".", r"\."))
    sd = dict(ckpt.state_dict)
    del sd[key]
    _refused(_copy(ckpt, state_dict=sd), "lacks " + key.replace(".", r"\."))
    sd = dict(ckpt.state_dict)
    sd["model.layers.9.extra"] = torch.zeros(3, dtype=torch.float16)
    _refused(_copy(ckpt, state_dict=sd), "unexpected tensor")
    sd = dict(ckpt.state_dict)
    sd[key] = sd[key].to(torch.float64)
    _refused(_copy(ckpt, state_dict=sd), "dtype")
    sd = dict(ckpt.state_dict)
    del sd["lm_head.weight"]
    _refused(_copy(ckpt, state_dict=sd), "tied")
    hf = dict(ckpt.hf_config, model_type="gpt_neox")
    _refused(_copy(ckpt, hf_config=hf), "unsupported architecture")
    _refused(_copy(ckpt, slicing_config=dict(ckpt.slicing_config, parallel_blocks=True)), "parallel")
    _refused(_copy(ckpt, slicing_config=dict(ckpt.slicing_config, hidden_size=64)), "hidden_size")
    sc = json.loads(json.dumps(ckpt.slicing_config))
    sc["attention_input_dimensions"]["1"] += 1
    _refused(_copy(ckpt, slicing_config=sc), "chain")
    with pytest.raises(InputError, match="scheme"):
        plan(ckpt, "nope")


def test_opt_variants_refused() -> None:
    ckpt = make_tiny_checkpoint("opt", seed=9, layers=1, hidden=32)
    _refused(_copy(ckpt, hf_config=dict(ckpt.hf_config, word_embed_proj_dim=16)), "project_in")
    _refused(_copy(ckpt, hf_config=dict(ckpt.hf_config, do_layer_norm_before=False)), "post-norm")


# ---------------------------------------------------------------- the sites are symmetries


def _rotate_axis(t: np.ndarray, axis: int, r: np.ndarray) -> np.ndarray:
    """layout.py's convention: M = moveaxis(T, axis, -1).reshape(-1, D); M @ R, back."""
    moved = np.moveaxis(t, axis, -1)
    m = moved.reshape(-1, r.shape[0]) @ r
    return np.moveaxis(m.reshape(moved.shape), -1, axis)


def _random_orthogonal(rng: np.random.Generator, d: int) -> np.ndarray:
    q, rr = np.linalg.qr(rng.normal(size=(d, d)))
    return q * np.sign(np.diag(rr))


@pytest.mark.parametrize("arch", ARCHS)
def test_every_site_is_a_symmetry_of_the_function(arch: str) -> None:
    ckpt = make_tiny_checkpoint(arch, seed=11, layers=3, hidden=32, heads=4, kv_heads=2, vocab=64, dtype="float32")
    sd64 = {k: v.to(torch.float64) for k, v in ckpt.state_dict.items()}
    base = Checkpoint(ckpt.stem, sd64, ckpt.slicing_config, ckpt.hf_config, ckpt.extra_files)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 64, size=(2, 10))
    ref = reference_logits(base, ids)
    sites = plan(ckpt, "symmetric").all_sites()
    assert sites == plan(ckpt, "paper").all_sites()
    everything = {k: v.numpy().copy() for k, v in sd64.items()}
    for site in sites:
        r = _random_orthogonal(rng, site.dim)
        arrs = {k: v.numpy().copy() for k, v in sd64.items()}
        for ref_ax in site.touched():
            arrs[ref_ax.tensor] = _rotate_axis(arrs[ref_ax.tensor], ref_ax.axis, r)
            everything[ref_ax.tensor] = _rotate_axis(everything[ref_ax.tensor], ref_ax.axis, r)
        rotated = Checkpoint(ckpt.stem, {k: torch.from_numpy(v) for k, v in arrs.items()}, ckpt.slicing_config, ckpt.hf_config, {})
        got = reference_logits(rotated, ids)
        assert np.abs(got - ref).max() < 1e-10, site.name
        # a site that forgot a follower would break the function: drop the last one and see it fail
        broken = {k: v.numpy().copy() for k, v in sd64.items()}
        for ref_ax in site.touched()[:-1]:
            broken[ref_ax.tensor] = _rotate_axis(broken[ref_ax.tensor], ref_ax.axis, r)
        bad = Checkpoint(ckpt.stem, {k: torch.from_numpy(v) for k, v in broken.items()}, ckpt.slicing_config, ckpt.hf_config, {})
        assert np.abs(reference_logits(bad, ids) - ref).max() > 1e-6, site.name
    # all sites at once, too
    allrot = Checkpoint(ckpt.stem, {k: torch.from_numpy(v) for k, v in everything.items()}, ckpt.slicing_config, ckpt.hf_config, {})
    assert np.abs(reference_logits(allrot, ids) - ref).max() < 1e-10

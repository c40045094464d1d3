"""Phi-2 (model_type "phi", parallel blocks, one shortcut per layer) and Phi-3 ("phi3", fused
qkv_proj / gate_up_proj) in TransformerCompression's layout: the plan, its sites as true
symmetries, pack --verify / unpack, the float64 reference against transformers' own models,
and load_model (from the directory and from a container) with generate()."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import bbformat
from bbformat.adapters import detect, plan
from bbformat.checkpoint import Checkpoint, read_checkpoint, write_checkpoint
from bbformat.errors import UnsupportedModelError
from bbformat.testing import make_tiny_checkpoint, reference_logits

ARCHS = ["phi2", "phi3"]
MODEL_TYPE = {"phi2": "phi", "phi3": "phi3"}
EPS = {"float16": 2.0**-10, "float32": 2.0**-23}
ROPE_FP32 = 1e-6  # transformers computes RoPE's cos/sin in float32 even in a float64 model


def _copy(ckpt: Checkpoint, **changes: object) -> Checkpoint:
    base = {"state_dict": dict(ckpt.state_dict), "slicing_config": json.loads(json.dumps(ckpt.slicing_config)),
            "hf_config": json.loads(json.dumps(ckpt.hf_config)), "extra_files": dict(ckpt.extra_files)}
    base.update(changes)
    return Checkpoint(ckpt.stem, **base)  # type: ignore[arg-type]


def _ids(vocab: int, t: int = 48) -> np.ndarray:
    return np.random.default_rng(1).integers(0, vocab, size=(2, t))


def _close(got: np.ndarray, want: np.ndarray, rel: float) -> bool:
    return float(np.abs(got - want).max()) <= rel * max(1.0, float(np.abs(want).max()))


# ---------------------------------------------------------------- the plan


@pytest.mark.parametrize("scheme", ["symmetric", "paper"])
@pytest.mark.parametrize("arch", ARCHS)
def test_plan_covers_every_key_once(arch: str, scheme: str) -> None:
    for kw in ({"layers": 1}, {"layers": 3}, {"layers": 2, "do_slice_head": True, "dtype": "float32"}):
        ckpt = make_tiny_checkpoint(arch, seed=2, **kw)  # type: ignore[arg-type]
        assert detect(ckpt.hf_config) == MODEL_TYPE[arch]
        lay = plan(ckpt, scheme)
        names = [t for c in lay.chunks for t in c.tensors]
        assert sorted(names) == sorted(ckpt.state_dict) and len(names) == len(set(names))
        per_layer = [len(c.sites) for c in lay.chunks if c.name.startswith("layers.")]
        assert per_layer == [1 if arch == "phi2" else 2] * kw["layers"]


def test_phi2_site_layout() -> None:
    ckpt = make_tiny_checkpoint("phi2", seed=3, layers=2, dims=[40, 48, 64])
    sites = {s.name: s for s in plan(ckpt, "symmetric").all_sites()}
    assert list(sites) == ["embed", "layers.0.out", "layers.1.out"]
    s = sites["layers.0.out"]
    p, q = "model.layers.0.", "model.layers.1."
    assert (s.anchor.tensor, s.anchor.axis, s.dim) == (p + "self_attn.dense.weight", 0, 48)
    assert {(f.tensor, f.axis) for f in s.followers} == {
        (p + "self_attn.dense.bias", 0), (p + "mlp.fc2.weight", 0), (p + "mlp.fc2.bias", 0), (p + "attn_shortcut_Q", 1),
        (q + "attn_shortcut_Q", 0), (q + "self_attn.q_proj.weight", 1), (q + "self_attn.k_proj.weight", 1),
        (q + "self_attn.v_proj.weight", 1), (q + "mlp.fc1.weight", 1)}
    assert (sites["layers.1.out"].dim, sites["layers.1.out"].followers[-1]) == (64, type(s.anchor)("lm_head.weight", 1))
    paper = plan(ckpt, "paper").chunks[1].tensors
    assert paper[0] == p + "attn_shortcut_Q" and paper[-2:] == (p + "self_attn.dense.weight", p + "self_attn.dense.bias")


def test_phi3_site_layout() -> None:
    ckpt = make_tiny_checkpoint("phi3", seed=3, layers=2)
    sites = {s.name: s for s in plan(ckpt, "symmetric").all_sites()}
    p, q = "model.layers.0.", "model.layers.1."
    attn, mlp = sites["layers.0.attn"], sites["layers.0.mlp"]
    assert attn.anchor.tensor == p + "self_attn.o_proj.weight" and mlp.anchor.tensor == p + "mlp.down_proj.weight"
    assert (p + "mlp.gate_up_proj.weight", 1) in {(f.tensor, f.axis) for f in attn.followers}
    assert (q + "self_attn.qkv_proj.weight", 1) in {(f.tensor, f.axis) for f in mlp.followers}


def _rotate_axis(t: np.ndarray, axis: int, r: np.ndarray) -> np.ndarray:
    moved = np.moveaxis(t, axis, -1)
    return np.moveaxis((moved.reshape(-1, r.shape[0]) @ r).reshape(moved.shape), -1, axis)


@pytest.mark.parametrize("arch", ARCHS)
def test_every_site_is_a_symmetry_of_the_function(arch: str) -> None:
    """Rotating a site's anchor and followers keeps the logits; leaving out a follower does not."""
    heads = 2 if arch == "phi2" else 4  # Phi-2: head_dim 16, 6 rotary dims
    ckpt = make_tiny_checkpoint(arch, seed=11, layers=3, hidden=32, heads=heads, kv_heads=2, vocab=64, dtype="float32")
    sd = {k: v.double().numpy() for k, v in ckpt.state_dict.items()}

    def logits(arrs: dict[str, np.ndarray]) -> np.ndarray:
        c = Checkpoint(ckpt.stem, {k: torch.from_numpy(v) for k, v in arrs.items()}, ckpt.slicing_config, ckpt.hf_config)
        return reference_logits(c, ids)

    rng = np.random.default_rng(0)
    ids = rng.integers(0, 64, size=(2, 10))
    ref = logits(sd)
    for site in plan(ckpt, "symmetric").all_sites():
        q, rr = np.linalg.qr(rng.normal(size=(site.dim, site.dim)))
        r = q * np.sign(np.diag(rr))
        good, bad = dict(sd), dict(sd)
        for i, ax in enumerate(site.touched()):
            good[ax.tensor] = _rotate_axis(good[ax.tensor], ax.axis, r)
            if i < len(site.touched()) - 1:
                bad[ax.tensor] = _rotate_axis(bad[ax.tensor], ax.axis, r)
        assert np.abs(logits(good) - ref).max() < 1e-10, site.name
        assert np.abs(logits(bad) - ref).max() > 1e-6, site.name


# ---------------------------------------------------------------- refusals


def _refused(ckpt: Checkpoint, match: str) -> None:
    with pytest.raises(UnsupportedModelError, match=match):
        plan(ckpt, "symmetric")


def test_phi2_refusals_and_slicing_configs() -> None:
    ckpt = make_tiny_checkpoint("phi2", seed=8, layers=2, hidden=32)
    _refused(_copy(ckpt, slicing_config=dict(ckpt.slicing_config, parallel_blocks=False)), "parallel_blocks=false")
    _refused(_copy(ckpt, hf_config=dict(ckpt.hf_config, qk_layernorm=True)), "qk_layernorm")
    sd = dict(ckpt.state_dict)
    del sd["model.layers.1.mlp.fc2.bias"]
    _refused(_copy(ckpt, state_dict=sd), r"lacks model\.layers\.1\.mlp\.fc2\.bias")
    sd = dict(ckpt.state_dict)
    sd["model.layers.0.mlp_shortcut_Q"] = sd["model.layers.0.attn_shortcut_Q"].clone()
    _refused(_copy(ckpt, state_dict=sd), "unexpected tensor")
    sc = json.loads(json.dumps(ckpt.slicing_config))  # the dimensions TC leaves empty, filled in consistently
    sc["attention_output_dimensions"] = sc["mlp_output_dimensions"]
    sc["mlp_input_dimensions"] = sc["attention_input_dimensions"]
    plan(_copy(ckpt, slicing_config=sc), "symmetric")
    sc["mlp_input_dimensions"] = {"0": 8, "1": 8}
    _refused(_copy(ckpt, slicing_config=sc), "mlp_input_dimensions")
    sc = json.loads(json.dumps(ckpt.slicing_config))
    sc["attention_input_dimensions"]["1"] += 8
    _refused(_copy(ckpt, slicing_config=sc), "chain")
    # a config with const_dimension only (TC's fallback when there is no <stem>.json)
    c24 = make_tiny_checkpoint("phi2", seed=8, layers=2, hidden=32, dims=24)
    sc = {k: ({} if isinstance(v, dict) else v) for k, v in c24.slicing_config.items()}
    plan(_copy(c24, slicing_config=dict(sc, head_dimension=None, const_dimension=24)), "paper")


def test_phi3_refusals() -> None:
    ckpt = make_tiny_checkpoint("phi3", seed=8, layers=2, hidden=32)
    _refused(_copy(ckpt, slicing_config=dict(ckpt.slicing_config, parallel_blocks=True)), "parallel_blocks=true")
    sd = dict(ckpt.state_dict)
    sd["model.layers.0.self_attn.qkv_proj.bias"] = torch.zeros(96, dtype=torch.float16)
    _refused(_copy(ckpt, state_dict=sd), "unexpected tensor")
    sd = dict(ckpt.state_dict)
    key = "model.layers.1.mlp.gate_up_proj.weight"
    sd[key] = sd[key][:-2].clone()
    _refused(_copy(ckpt, state_dict=sd), key.replace(".", r"\."))


def test_identity_norms_are_tolerated() -> None:
    ckpt = make_tiny_checkpoint("phi2", seed=7, layers=2, hidden=32)
    sd = dict(ckpt.state_dict)
    sd["model.layers.1.input_layernorm.bias"] = torch.zeros(32, dtype=torch.float16)
    sd["model.final_layernorm.weight"] = torch.ones(32, dtype=torch.float16)
    plan(_copy(ckpt, state_dict=sd), "symmetric")
    sd["model.layers.1.input_layernorm.bias"] = torch.full((32,), 0.5, dtype=torch.float16)
    _refused(_copy(ckpt, state_dict=sd), "input_layernorm")


# ---------------------------------------------------------------- the reference against transformers


def _hf_phi2(dtype: torch.dtype = torch.float64) -> tuple[object, Checkpoint]:
    """A random transformers PhiForCausalLM (LayerNorm scales and biases != identity) and the
    same model as TC leaves it at sparsity 0: norms fused, mean baked in, identity shortcuts."""
    from transformers import PhiConfig, PhiForCausalLM

    base = make_tiny_checkpoint("phi2", seed=0, layers=2)
    cfg = PhiConfig(**{k: v for k, v in base.hf_config.items() if k != "torch_dtype"})
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = PhiForCausalLM(cfg).to(dtype).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(1 + 0.2 * torch.randn_like(p) if n.endswith("layernorm.weight") else 0.1 * torch.randn_like(p))
    w = {k: v.detach().double().clone() for k, v in model.state_dict().items()}
    sd: dict[str, torch.Tensor] = {"model.embed_tokens.weight": w["model.embed_tokens.weight"] - w["model.embed_tokens.weight"].mean(-1, keepdim=True)}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        g, b = w[p + "input_layernorm.weight"], w[p + "input_layernorm.bias"]
        sd[p + "attn_shortcut_Q"] = torch.eye(cfg.hidden_size, dtype=torch.float64)
        for lin in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.fc1"):
            sd[p + lin + ".weight"] = w[p + lin + ".weight"] * g
            sd[p + lin + ".bias"] = w[p + lin + ".bias"] + w[p + lin + ".weight"] @ b
        for lin in ("self_attn.dense", "mlp.fc2"):  # the writers keep the stream centred
            sd[p + lin + ".weight"] = w[p + lin + ".weight"] - w[p + lin + ".weight"].mean(0, keepdim=True)
            sd[p + lin + ".bias"] = w[p + lin + ".bias"] - w[p + lin + ".bias"].mean()
    g, b = w["model.final_layernorm.weight"], w["model.final_layernorm.bias"]
    sd["lm_head.weight"], sd["lm_head.bias"] = w["lm_head.weight"] * g, w["lm_head.bias"] + w["lm_head.weight"] @ b
    return model, _copy(base, state_dict=sd)


def _hf_phi3(sliding_window: int | None, dtype: torch.dtype = torch.float64) -> tuple[object, Checkpoint]:
    """A random transformers Phi3ForCausalLM (GQA, RMSNorm scales != 1) and the same model with
    the scales folded into qkv_proj / gate_up_proj / lm_head and identity shortcuts."""
    from transformers import Phi3Config, Phi3ForCausalLM

    base = make_tiny_checkpoint("phi3", seed=0, layers=2, dims=64)
    hf = {k: v for k, v in base.hf_config.items() if k != "torch_dtype"}
    cfg = Phi3Config(**dict(hf, sliding_window=sliding_window))
    cfg._attn_implementation = "eager"
    torch.manual_seed(1)
    model = Phi3ForCausalLM(cfg).to(dtype).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(1 + 0.2 * torch.randn_like(p) if "norm" in n else 0.1 * torch.randn_like(p))
    w = {k: v.detach().double().clone() for k, v in model.state_dict().items()}
    sd: dict[str, torch.Tensor] = {"model.embed_tokens.weight": w["model.embed_tokens.weight"]}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        for q in ("attn_shortcut_Q", "mlp_shortcut_Q"):
            sd[p + q] = torch.eye(cfg.hidden_size, dtype=torch.float64)
        sd[p + "self_attn.o_proj.weight"], sd[p + "mlp.down_proj.weight"] = w[p + "self_attn.o_proj.weight"], w[p + "mlp.down_proj.weight"]
        sd[p + "self_attn.qkv_proj.weight"] = w[p + "self_attn.qkv_proj.weight"] * w[p + "input_layernorm.weight"]
        sd[p + "mlp.gate_up_proj.weight"] = w[p + "mlp.gate_up_proj.weight"] * w[p + "post_attention_layernorm.weight"]
    sd["lm_head.weight"] = w["lm_head.weight"] * w["model.norm.weight"]
    return model, _copy(base, state_dict=sd)


def test_reference_matches_transformers_phi() -> None:
    pytest.importorskip("transformers")
    model, ckpt = _hf_phi2()
    ids = _ids(128)
    with torch.no_grad():
        want = model(torch.from_numpy(ids)).logits.numpy()  # type: ignore[operator]
    assert np.abs(reference_logits(ckpt, ids) - want).max() < ROPE_FP32


def test_reference_matches_transformers_phi3() -> None:
    """Also the sliding window: the reference keeps transformers 4.41's mask (query i sees keys
    i - w .. i), which newer transformers spell sliding_window = w + 1."""
    pytest.importorskip("transformers")
    ids = _ids(128)
    for window in (None, 12):
        model, ckpt = _hf_phi3(None if window is None else window + 1)
        ckpt.hf_config["sliding_window"] = window
        with torch.no_grad():
            want = model(torch.from_numpy(ids)).logits.numpy()  # type: ignore[operator]
        assert np.abs(reference_logits(ckpt, ids) - want).max() < ROPE_FP32, window


# ---------------------------------------------------------------- pack, unpack, load_model


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("scheme", ["symmetric", "paper"])
@pytest.mark.parametrize("arch", ARCHS)
def test_pack_unpack_round_trip(tmp_path: Path, arch: str, scheme: str, dtype: str) -> None:
    ckpt = make_tiny_checkpoint(arch, seed=4, layers=3, dtype=dtype)
    write_checkpoint(ckpt, tmp_path / "m")
    report = bbformat.pack(tmp_path / "m", tmp_path / "m.bb", scheme=scheme, tolerance=0.0, verify=True)
    assert report.architecture == MODEL_TYPE[arch]
    bbformat.unpack(tmp_path / "m.bb", tmp_path / "u")
    ids = _ids(128)
    with read_checkpoint(tmp_path / "m") as a, read_checkpoint(tmp_path / "u") as b:
        assert [(k, v.dtype, tuple(v.shape)) for k, v in a.state_dict.items()] == \
               [(k, v.dtype, tuple(v.shape)) for k, v in b.state_dict.items()]
        assert a.extra_files == b.extra_files
        before, after = reference_logits(a, ids), reference_logits(b, ids)
    # the stored model is a rotation of the input, each touched weight rounded once more
    assert _close(after, before, 4 * EPS[dtype])


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("arch", ARCHS)
def test_load_model(tmp_path: Path, arch: str, dtype: str) -> None:
    """load_model from the directory and from a container: logits equal the float64 reference
    (the Phi-3 window is active: 48 tokens, sliding_window 31), and generate() runs with its
    cache and agrees with a full forward."""
    pytest.importorskip("transformers")
    from bbformat.loader import load_model

    ckpt = make_tiny_checkpoint(arch, seed=5, layers=2, dtype=dtype)
    write_checkpoint(ckpt, tmp_path / "m")
    bbformat.pack(tmp_path / "m", tmp_path / "m.bb", verify=True)
    bbformat.unpack(tmp_path / "m.bb", tmp_path / "u")
    ids = _ids(128)
    want = reference_logits(ckpt, ids)
    with read_checkpoint(tmp_path / "u") as u:
        stored = reference_logits(u, ids)
    native = load_model(tmp_path / "m.bb")
    assert native.dtype == getattr(torch, dtype)
    assert type(native).__name__ == "SlicedForCausalLM" and native.config.sliced_arch == ("phi" if arch == "phi2" else "phi3")
    with torch.no_grad():
        got = load_model(tmp_path / "m", torch.float32)(torch.from_numpy(ids)).logits.double().numpy()
        assert _close(got, want, 1e-5)
        model = load_model(tmp_path / "m.bb", torch.float32)
        assert _close(model(torch.from_numpy(ids)).logits.double().numpy(), stored, 1e-5)
        assert _close(native(torch.from_numpy(ids)).logits.double().numpy(), stored, 2e-2)
        x = torch.from_numpy(ids[:1, :8])
        out = model.generate(x, max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=0)
        full = model(out).logits
        native.generate(x, max_new_tokens=3, do_sample=False)
    assert out.shape == (1, 14)
    assert torch.equal(full[0, 7:-1].argmax(-1), out[0, 8:])

"""Tiny SliceGPT-shaped models and an independent float64 forward pass, for tests and the demo."""
from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import torch

from .adapters.tc_layout import Checkpoint
from .errors import UnsupportedModelError

_TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def _orth(rng: np.random.Generator, n: int) -> np.ndarray:
    q, r = np.linalg.qr(rng.normal(size=(n, n)))
    return q * np.sign(np.diag(r))


def make_tiny_checkpoint(
    arch: str,
    *,
    seed: int,
    layers: int,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int | None = None,
    vocab: int = 128,
    dtype: str = "float16",
    do_slice_head: bool = False,
    max_positions: int = 64,
    dims: int | Sequence[int] | None = None,
) -> Checkpoint:
    """A random model with the exact shapes and structure SliceGPT leaves: sliced, varying
    per-layer widths (multiples of 8), shortcut matrices that are slices of orthogonal
    changes of basis, the last MLP output and head at full width unless do_slice_head.

    dims: None (random widths), an int (TC's ConstSlicingScheduler: every width = dims), or
    the 2 * layers + 1 residual widths [emb, attn_0, mlp_0, ..., attn_{L-1}, mlp_{L-1}]."""
    rng = np.random.default_rng(seed)
    ffn = intermediate or 2 * hidden
    hd = hidden // heads
    if arch == "opt":
        kv_heads = heads
    widths = lambda: int(hidden - 8 * rng.integers(1, max(2, hidden // 32) + 1))  # noqa: E731
    if dims is None:
        d_emb = widths()
        d_attn = [widths() for _ in range(layers)]
        d_mlp = [widths() for _ in range(layers)]
    else:
        seq = [int(dims)] * (2 * layers + 1) if isinstance(dims, int) else [int(x) for x in dims]
        if len(seq) != 2 * layers + 1 or not all(0 < x <= hidden for x in seq):
            raise ValueError(f"dims must be 2 * layers + 1 widths in 1..{hidden}, got {seq}")
        d_emb, d_attn, d_mlp = seq[0], seq[1::2], seq[2::2]
    if layers and not do_slice_head:
        d_mlp[-1] = hidden
    d_in = [d_emb] + d_mlp[:-1]
    bases = [_orth(rng, hidden) for _ in range(2 * layers + 1)]
    g = lambda *s, scale=0.08: rng.normal(0, scale, s)  # noqa: E731
    sd: dict[str, np.ndarray] = {}
    if arch == "llama":
        pre, lay = "model.", "model.layers.{i}."
        sd["model.embed_tokens.weight"] = g(vocab, d_emb, scale=0.5)
        for i in range(layers):
            p = lay.format(i=i)
            sd[p + "self_attn.q_proj.weight"] = g(heads * hd, d_in[i])
            sd[p + "self_attn.k_proj.weight"] = g(kv_heads * hd, d_in[i])
            sd[p + "self_attn.v_proj.weight"] = g(kv_heads * hd, d_in[i])
            sd[p + "self_attn.o_proj.weight"] = g(d_attn[i], heads * hd)
            sd[p + "mlp.gate_proj.weight"] = g(ffn, d_attn[i])
            sd[p + "mlp.up_proj.weight"] = g(ffn, d_attn[i])
            sd[p + "mlp.down_proj.weight"] = g(d_mlp[i], ffn)
            sd[p + "attn_shortcut_Q"] = bases[2 * i][:, : d_in[i]].T @ bases[2 * i + 1][:, : d_attn[i]]
            sd[p + "mlp_shortcut_Q"] = bases[2 * i + 1][:, : d_attn[i]].T @ bases[2 * i + 2][:, : d_mlp[i]]
        cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": hidden, "num_hidden_layers": layers,
               "num_attention_heads": heads, "num_key_value_heads": kv_heads, "intermediate_size": ffn, "vocab_size": vocab,
               "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": max_positions, "hidden_act": "silu",
               "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False}
    elif arch == "opt":
        lay = "model.decoder.layers.{i}."
        sd["model.decoder.embed_tokens.weight"] = g(vocab, d_emb, scale=0.5)
        sd["model.decoder.embed_positions.weight"] = g(max_positions + 2, d_emb, scale=0.2)
        for i in range(layers):
            p = lay.format(i=i)
            for w in ("q", "k", "v"):
                sd[p + f"self_attn.{w}_proj.weight"] = g(hidden, d_in[i])
                sd[p + f"self_attn.{w}_proj.bias"] = g(hidden, scale=0.02)
            sd[p + "self_attn.out_proj.weight"] = g(d_attn[i], hidden)
            sd[p + "self_attn.out_proj.bias"] = g(d_attn[i], scale=0.02)
            sd[p + "fc1.weight"] = g(ffn, d_attn[i])
            sd[p + "fc1.bias"] = g(ffn, scale=0.02)
            sd[p + "fc2.weight"] = g(d_mlp[i], ffn)
            sd[p + "fc2.bias"] = g(d_mlp[i], scale=0.02)
            sd[p + "attn_shortcut_Q"] = bases[2 * i][:, : d_in[i]].T @ bases[2 * i + 1][:, : d_attn[i]]
            sd[p + "mlp_shortcut_Q"] = bases[2 * i + 1][:, : d_attn[i]].T @ bases[2 * i + 2][:, : d_mlp[i]]
        cfg = {"model_type": "opt", "architectures": ["OPTForCausalLM"], "hidden_size": hidden, "num_hidden_layers": layers,
               "num_attention_heads": heads, "ffn_dim": ffn, "vocab_size": vocab, "max_position_embeddings": max_positions,
               "word_embed_proj_dim": hidden, "do_layer_norm_before": True, "activation_function": "relu"}
    else:
        raise UnsupportedModelError(f"unknown arch {arch!r}")
    head_dim = d_mlp[-1] if layers else d_emb
    sd["lm_head.weight"] = g(vocab, head_dim, scale=0.3)
    if arch == "opt":  # TC fuses the final LayerNorm's bias into a new head bias
        sd["lm_head.bias"] = g(vocab, scale=0.02)
    slicing = {"hidden_size": hidden, "layers_num": layers, "do_slice_head": do_slice_head, "parallel_blocks": False,
               "embedding_dimensions": {"0": d_emb, "1": d_emb} if arch == "opt" else {"0": d_emb},
               "attention_input_dimensions": {str(i): d_in[i] for i in range(layers)},
               "attention_output_dimensions": {str(i): d_attn[i] for i in range(layers)},
               "mlp_input_dimensions": {str(i): d_attn[i] for i in range(layers)},
               "mlp_output_dimensions": {str(i): d_mlp[i] for i in range(layers)},
               "head_dimension": head_dim, "const_dimension": None}
    cfg["torch_dtype"] = dtype
    stem = f"tiny-{arch}_0.25"
    # config.json as transformers writes it; <stem>.json as TC's SlicingConfig.to_json_string (one line)
    files = {"config.json": (json.dumps(cfg, indent=2, sort_keys=True) + "\n").encode(), f"{stem}.json": json.dumps(slicing).encode(),
             "generation_config.json": b'{"max_new_tokens": 8}\n'}
    state = {k: torch.from_numpy(np.ascontiguousarray(v)).to(_TORCH[dtype]) for k, v in sd.items()}
    return Checkpoint(stem, state, slicing, cfg, files)


def _rmsn(x: np.ndarray, mean_dim: int, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).sum(-1, keepdims=True) / mean_dim + eps)


def _attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """q: (B,H,T,hd), k/v: (B,H,T,hd); causal."""
    t = q.shape[2]
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    s = np.where(np.tril(np.ones((t, t), bool)), s, -np.inf)
    s = np.exp(s - s.max(-1, keepdims=True))
    return (s / s.sum(-1, keepdims=True)) @ v


def _rope(x: np.ndarray, theta: float) -> np.ndarray:
    """Rotate-half RoPE as in Hugging Face Llama. x: (B,H,T,hd)."""
    hd, t = x.shape[-1], x.shape[2]
    inv = 1.0 / theta ** (np.arange(0, hd, 2) / hd)
    ang = np.arange(t)[:, None] * inv[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))
    half = hd // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], -1)
    return x * cos + rot * sin


def reference_logits(ckpt: Checkpoint, input_ids: np.ndarray) -> np.ndarray:
    """An independent float64 forward pass of the sliced model (no transformers): TC's
    parameter-free RMSN (sum of squares over the sliced width / full hidden size, eps 1e-5),
    x @ attn_shortcut_Q + attn(norm(x)), then h @ mlp_shortcut_Q + mlp(norm(h)); optional biases."""
    sd = {k: v.to(torch.float64).numpy() for k, v in ckpt.state_dict.items()}
    c = ckpt.hf_config
    hidden, heads, n = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
    ids = np.asarray(input_ids)
    b, t = ids.shape
    eps = 1e-5  # TC's RMSN ignores rms_norm_eps

    def lin(x: np.ndarray, w: str) -> np.ndarray:
        y = x @ sd[w + ".weight"].T
        return y + sd[w + ".bias"] if w + ".bias" in sd else y

    def heads_of(x: np.ndarray, nh: int, hd: int) -> np.ndarray:
        return x.reshape(b, t, nh, hd).transpose(0, 2, 1, 3)

    if c["model_type"] == "llama":
        if c.get("rope_scaling"):
            raise UnsupportedModelError("reference_logits does not implement rope_scaling")
        kv = c.get("num_key_value_heads") or heads
        theta = c.get("rope_theta") or (c.get("rope_parameters") or {}).get("rope_theta", 10000.0)
        hd = c.get("head_dim") or hidden // heads
        h = sd["model.embed_tokens.weight"][ids]
        for i in range(n):
            p = f"model.layers.{i}."
            x = _rmsn(h, hidden, eps)
            q = _rope(heads_of(lin(x, p + "self_attn.q_proj"), heads, hd), theta)
            k = _rope(heads_of(lin(x, p + "self_attn.k_proj"), kv, hd), theta)
            v = heads_of(lin(x, p + "self_attn.v_proj"), kv, hd)
            rep = heads // kv  # GQA: kv head j serves query heads j*rep .. j*rep+rep-1
            a = _attention(q, np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1))
            a = a.transpose(0, 2, 1, 3).reshape(b, t, heads * hd)
            h = h @ sd[p + "attn_shortcut_Q"] + lin(a, p + "self_attn.o_proj")
            x = _rmsn(h, hidden, eps)
            gate, up = lin(x, p + "mlp.gate_proj"), lin(x, p + "mlp.up_proj")
            h = h @ sd[p + "mlp_shortcut_Q"] + lin(gate / (1 + np.exp(-gate)) * up, p + "mlp.down_proj")
        return lin(_rmsn(h, hidden, eps), "lm_head")
    if c["model_type"] == "opt":
        hd = hidden // heads
        h = sd["model.decoder.embed_tokens.weight"][ids] + sd["model.decoder.embed_positions.weight"][np.arange(t) + 2][None]
        for i in range(n):
            p = f"model.decoder.layers.{i}."
            x = _rmsn(h, hidden, eps)
            q, k, v = (heads_of(lin(x, p + f"self_attn.{w}_proj"), heads, hd) for w in ("q", "k", "v"))
            a = _attention(q, k, v).transpose(0, 2, 1, 3).reshape(b, t, hidden)
            h = h @ sd[p + "attn_shortcut_Q"] + lin(a, p + "self_attn.out_proj")
            x = _rmsn(h, hidden, eps)
            h = h @ sd[p + "mlp_shortcut_Q"] + lin(np.maximum(lin(x, p + "fc1"), 0), p + "fc2")
        return lin(_rmsn(h, hidden, eps), "lm_head")
    raise UnsupportedModelError(f"unknown model_type {c['model_type']!r}")

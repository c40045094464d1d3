"""Tiny SliceGPT-shaped models and an independent float64 forward pass, for tests and the demo."""
from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from .adapters import llama, opt, phi2, phi3
from .checkpoint import Checkpoint
from .errors import UnsupportedModelError

_TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
RMSN_EPS = 1e-5  # TC's RMSN: eps 1e-5 whatever config.json says


def _orth(rng: np.random.Generator, n: int) -> np.ndarray:
    q, r = np.linalg.qr(rng.normal(size=(n, n)))
    return q * np.sign(np.diag(r))


def _gauss(rng: np.random.Generator) -> Callable[..., np.ndarray]:
    """g(*shape, scale=0.08): normal(0, scale) draws of that shape."""

    def g(*shape: int, scale: float = 0.08) -> np.ndarray:
        return np.asarray(rng.normal(0, scale, shape))

    return g


def _phi2_config(hidden: int, layers: int, heads: int, ffn: int, vocab: int, max_positions: int) -> dict[str, Any]:
    """config.json as transformers 4.41 writes microsoft/phi-2's (tiny sizes)."""
    return {"model_type": "phi", "architectures": ["PhiForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
            "eos_token_id": 2, "embd_pdrop": 0.0, "hidden_act": "gelu_new", "hidden_size": hidden, "initializer_range": 0.02,
            "intermediate_size": ffn, "layer_norm_eps": 1e-5, "max_position_embeddings": max_positions,
            "num_attention_heads": heads, "num_hidden_layers": layers, "num_key_value_heads": heads,
            "partial_rotary_factor": 0.4, "qk_layernorm": False, "resid_pdrop": 0.1, "rope_scaling": None,
            "rope_theta": 10000.0, "tie_word_embeddings": False, "transformers_version": "4.41.0", "use_cache": True,
            "vocab_size": vocab}


def _phi3_config(hidden: int, layers: int, heads: int, kv_heads: int, ffn: int, vocab: int, max_positions: int) -> dict[str, Any]:
    """config.json as transformers 4.41 writes microsoft/Phi-3-mini-4k-instruct's (tiny sizes; its
    sliding window, 2047 of 4096 positions, scaled to max_positions // 2 - 1)."""
    return {"model_type": "phi3", "architectures": ["Phi3ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
            "eos_token_id": 2, "embd_pdrop": 0.0, "hidden_act": "silu", "hidden_size": hidden, "initializer_range": 0.02,
            "intermediate_size": ffn, "max_position_embeddings": max_positions, "num_attention_heads": heads,
            "num_hidden_layers": layers, "num_key_value_heads": kv_heads, "original_max_position_embeddings": max_positions,
            "pad_token_id": 0, "resid_pdrop": 0.0, "rms_norm_eps": 1e-5, "rope_scaling": None, "rope_theta": 10000.0,
            "sliding_window": max(1, max_positions // 2 - 1), "tie_word_embeddings": False,
            "transformers_version": "4.41.0", "use_cache": True, "vocab_size": vocab}


def _phi3_layers(sd: dict[str, np.ndarray], g: Callable[..., np.ndarray], q_attn: list[np.ndarray], q_mlp: list[np.ndarray],
                 qkv_rows: int, heads_hd: int, ffn: int, d_in: list[int], d_attn: list[int], d_mlp: list[int]) -> None:
    """Phi-3 layers in TC's state-dict order (the shortcuts first: the compressed layer registers them)."""
    n = phi3.NAMES
    (qkv,), (gate_up,) = n.attn_in, n.up
    for i in range(len(d_in)):
        p = n.prefix(i)
        sd[p + n.mlp_q] = q_mlp[i]
        sd[p + n.attn_q] = q_attn[i]
        sd[p + n.o] = g(d_attn[i], heads_hd)
        sd[p + qkv] = g(qkv_rows, d_in[i])
        sd[p + gate_up] = g(2 * ffn, d_attn[i])
        sd[p + n.down] = g(d_mlp[i], ffn)


def _random_width(rng: np.random.Generator, hidden: int) -> int:
    """A sliced width: hidden less a random multiple of 8."""
    return int(hidden - 8 * rng.integers(1, max(2, hidden // 32) + 1))


def _tiny_phi2(rng: np.random.Generator, layers: int, hidden: int, heads: int, ffn: int, vocab: int, max_positions: int,
               dtype: str, do_slice_head: bool, dims: int | Sequence[int] | None) -> Checkpoint:
    """Phi-2 as TC leaves it: one shortcut per layer, biases on every linear and the head,
    parallel_blocks=true with attention_output / mlp_input dimensions left empty."""
    if dims is None:
        seq = [_random_width(rng, hidden) for _ in range(layers + 1)]
    else:
        seq = [int(dims)] * (layers + 1) if isinstance(dims, int) else [int(x) for x in dims]
        if len(seq) != layers + 1 or not all(0 < x <= hidden for x in seq):
            raise ValueError(f"phi2 dims must be layers + 1 widths in 1..{hidden}, got {seq}")
    if layers and not do_slice_head:
        seq[-1] = hidden
    d_emb, d_out = seq[0], seq[1:]
    d_in = seq[:-1]
    bases = [_orth(rng, hidden) for _ in range(layers + 1)]
    g = _gauss(rng)
    n, b = phi2.NAMES, phi2.NAMES.biases
    sd: dict[str, np.ndarray] = {n.embed: g(vocab, d_emb, scale=0.5)}
    for i in range(layers):
        p = n.prefix(i)
        sd[p + n.attn_q] = bases[i][:, : d_in[i]].T @ bases[i + 1][:, : d_out[i]]
        for w, role in zip(n.attn_in, ("q", "k", "v")):
            sd[p + w] = g(hidden, d_in[i])
            sd[p + b[role]] = g(hidden, scale=0.02)
        sd[p + n.o], sd[p + b["o"]] = g(d_out[i], hidden), g(d_out[i], scale=0.02)
        sd[p + n.up[0]], sd[p + b["up"]] = g(ffn, d_in[i]), g(ffn, scale=0.02)
        sd[p + n.down], sd[p + b["down"]] = g(d_out[i], ffn), g(d_out[i], scale=0.02)
    head_dim = d_out[-1] if layers else d_emb
    sd[n.head], sd[phi2.HEAD_BIAS] = g(vocab, head_dim, scale=0.3), g(vocab, scale=0.02)
    slicing = {"hidden_size": hidden, "layers_num": layers, "do_slice_head": do_slice_head, "parallel_blocks": True,
               "embedding_dimensions": {"0": d_emb}, "attention_input_dimensions": {str(i): d_in[i] for i in range(layers)},
               "attention_output_dimensions": {}, "mlp_input_dimensions": {},
               "mlp_output_dimensions": {str(i): d_out[i] for i in range(layers)}, "head_dimension": head_dim,
               "const_dimension": None}
    return _tiny_checkpoint("phi2", sd, slicing, _phi2_config(hidden, layers, heads, ffn, vocab, max_positions), dtype)


def _tiny_checkpoint(arch: str, sd: dict[str, np.ndarray], slicing: dict[str, Any], cfg: dict[str, Any], dtype: str) -> Checkpoint:
    cfg["torch_dtype"] = dtype
    stem = f"tiny-{arch}_0.25"
    # config.json as transformers writes it; <stem>.json as TC's SlicingConfig.to_json_string (one line)
    files = {"config.json": (json.dumps(cfg, indent=2, sort_keys=True) + "\n").encode(), f"{stem}.json": json.dumps(slicing).encode(),
             "generation_config.json": b'{"max_new_tokens": 8}\n'}
    state = {k: torch.from_numpy(np.ascontiguousarray(v)).to(_TORCH[dtype]) for k, v in sd.items()}
    return Checkpoint(stem, state, slicing, cfg, files)


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
    arch: "llama", "opt", "phi2" or "phi3" (TransformerCompression's tensor names, shapes,
    SlicingConfig and config.json fields for each; Phi-2 and OPT use kv_heads = heads).

    dims: None (random widths), an int (TC's ConstSlicingScheduler: every width = dims), or
    the 2 * layers + 1 residual widths [emb, attn_0, mlp_0, ..., attn_{L-1}, mlp_{L-1}]
    (phi2, one width per layer: the layers + 1 widths [emb, out_0, ..., out_{L-1}])."""
    rng = np.random.default_rng(seed)
    ffn = intermediate or 2 * hidden
    hd = hidden // heads
    if arch == "phi2":
        return _tiny_phi2(rng, layers, hidden, heads, ffn, vocab, max_positions, dtype, do_slice_head, dims)
    if arch == "opt":
        kv_heads = heads
    if dims is None:
        d_emb = _random_width(rng, hidden)
        d_attn = [_random_width(rng, hidden) for _ in range(layers)]
        d_mlp = [_random_width(rng, hidden) for _ in range(layers)]
    else:
        seq = [int(dims)] * (2 * layers + 1) if isinstance(dims, int) else [int(x) for x in dims]
        if len(seq) != 2 * layers + 1 or not all(0 < x <= hidden for x in seq):
            raise ValueError(f"dims must be 2 * layers + 1 widths in 1..{hidden}, got {seq}")
        d_emb, d_attn, d_mlp = seq[0], seq[1::2], seq[2::2]
    if layers and not do_slice_head:
        d_mlp[-1] = hidden
    d_in = [d_emb] + d_mlp[:-1]
    bases = [_orth(rng, hidden) for _ in range(2 * layers + 1)]
    g = _gauss(rng)
    q_attn = [bases[2 * i][:, : d_in[i]].T @ bases[2 * i + 1][:, : d_attn[i]] for i in range(layers)]
    q_mlp = [bases[2 * i + 1][:, : d_attn[i]].T @ bases[2 * i + 2][:, : d_mlp[i]] for i in range(layers)]
    sd: dict[str, np.ndarray] = {}
    if arch == "llama":
        n = llama.NAMES
        (q, k, v), (up, gate) = n.attn_in, n.up
        sd[n.embed] = g(vocab, d_emb, scale=0.5)
        for i in range(layers):
            p = n.prefix(i)
            sd[p + q] = g(heads * hd, d_in[i])
            sd[p + k] = g(kv_heads * hd, d_in[i])
            sd[p + v] = g(kv_heads * hd, d_in[i])
            sd[p + n.o] = g(d_attn[i], heads * hd)
            sd[p + gate] = g(ffn, d_attn[i])
            sd[p + up] = g(ffn, d_attn[i])
            sd[p + n.down] = g(d_mlp[i], ffn)
            sd[p + n.attn_q] = q_attn[i]
            sd[p + n.mlp_q] = q_mlp[i]
        cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": hidden, "num_hidden_layers": layers,
               "num_attention_heads": heads, "num_key_value_heads": kv_heads, "intermediate_size": ffn, "vocab_size": vocab,
               "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": max_positions, "hidden_act": "silu",
               "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False}
    elif arch == "opt":
        n, b = opt.NAMES, opt.NAMES.biases
        sd[n.embed] = g(vocab, d_emb, scale=0.5)
        sd[opt.POSITIONS] = g(max_positions + opt.POSITION_OFFSET, d_emb, scale=0.2)
        for i in range(layers):
            p = n.prefix(i)
            for w, role in zip(n.attn_in, ("q", "k", "v")):
                sd[p + w] = g(hidden, d_in[i])
                sd[p + b[role]] = g(hidden, scale=0.02)
            sd[p + n.o] = g(d_attn[i], hidden)
            sd[p + b["o"]] = g(d_attn[i], scale=0.02)
            sd[p + n.up[0]] = g(ffn, d_attn[i])
            sd[p + b["up"]] = g(ffn, scale=0.02)
            sd[p + n.down] = g(d_mlp[i], ffn)
            sd[p + b["down"]] = g(d_mlp[i], scale=0.02)
            sd[p + n.attn_q] = q_attn[i]
            sd[p + n.mlp_q] = q_mlp[i]
        cfg = {"model_type": "opt", "architectures": ["OPTForCausalLM"], "hidden_size": hidden, "num_hidden_layers": layers,
               "num_attention_heads": heads, "ffn_dim": ffn, "vocab_size": vocab, "max_position_embeddings": max_positions,
               "word_embed_proj_dim": hidden, "do_layer_norm_before": True, "activation_function": "relu"}
    elif arch == "phi3":
        n = phi3.NAMES
        sd[n.embed] = g(vocab, d_emb, scale=0.5)
        _phi3_layers(sd, g, q_attn, q_mlp, (heads + 2 * kv_heads) * hd, heads * hd, ffn, d_in, d_attn, d_mlp)
        cfg = _phi3_config(hidden, layers, heads, kv_heads, ffn, vocab, max_positions)
    else:
        raise UnsupportedModelError(f"unknown arch {arch!r}")
    head_dim = d_mlp[-1] if layers else d_emb
    sd[n.head] = g(vocab, head_dim, scale=0.3)
    if arch == "opt":  # TC fuses the final LayerNorm's bias into a new head bias
        sd[opt.HEAD_BIAS] = g(vocab, scale=0.02)
    slicing = {"hidden_size": hidden, "layers_num": layers, "do_slice_head": do_slice_head, "parallel_blocks": False,
               "embedding_dimensions": {"0": d_emb, "1": d_emb} if arch == "opt" else {"0": d_emb},
               "attention_input_dimensions": {str(i): d_in[i] for i in range(layers)},
               "attention_output_dimensions": {str(i): d_attn[i] for i in range(layers)},
               "mlp_input_dimensions": {str(i): d_attn[i] for i in range(layers)},
               "mlp_output_dimensions": {str(i): d_mlp[i] for i in range(layers)},
               "head_dimension": head_dim, "const_dimension": None}
    return _tiny_checkpoint(arch, sd, slicing, cfg, dtype)


def _rmsn(x: np.ndarray, mean_dim: int, eps: float) -> np.ndarray:
    out: np.ndarray = x / np.sqrt((x * x).sum(-1, keepdims=True) / mean_dim + eps)
    return out


def _attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, window: int | None = None) -> np.ndarray:
    """q: (B,H,T,hd), k/v: (B,H,T,hd); causal. window: query i sees keys i - window .. i only
    (transformers 4.41's sliding-window mask, the version TransformerCompression pins)."""
    t = q.shape[2]
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    seen = np.tril(np.ones((t, t), bool))
    if window is not None:
        seen &= np.triu(np.ones((t, t), bool), -window)
    s = np.where(seen, s, -np.inf)
    s = np.exp(s - s.max(-1, keepdims=True))
    out: np.ndarray = (s / s.sum(-1, keepdims=True)) @ v
    return out


def _rope(x: np.ndarray, theta: float, dims: int | None = None) -> np.ndarray:
    """Rotate-half RoPE as in Hugging Face Llama on the first `dims` (default all) of each
    head's features, the rest passed through (Phi's partial rotary). x: (B,H,T,hd)."""
    hd, t = (dims or x.shape[-1]), x.shape[2]
    if hd < x.shape[-1]:
        return np.concatenate([_rope(x[..., :hd], theta), x[..., hd:]], -1)
    inv = 1.0 / theta ** (np.arange(0, hd, 2) / hd)
    ang = np.arange(t)[:, None] * inv[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))
    half = hd // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], -1)
    out: np.ndarray = x * cos + rot * sin
    return out


def _gelu_new(x: np.ndarray) -> np.ndarray:
    """The tanh approximation of GELU (transformers' "gelu_new", Phi-2's activation)."""
    out: np.ndarray = 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))
    return out


def _silu(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = x / (1 + np.exp(-x))
    return out


def _lin(sd: dict[str, np.ndarray], x: np.ndarray, w: str) -> np.ndarray:
    """x Wᵀ (+ b): W = sd[w], b its bias (the same name ending in .bias) if the state dict has one."""
    y = x @ sd[w].T
    b = w.removesuffix(".weight") + ".bias"
    out: np.ndarray = y + sd[b] if b in sd else y
    return out


def _heads(x: np.ndarray, nh: int, hd: int) -> np.ndarray:
    """(B, T, nh * hd) -> (B, nh, T, hd)."""
    return x.reshape(x.shape[0], x.shape[1], nh, hd).transpose(0, 2, 1, 3)


def _merge(a: np.ndarray) -> np.ndarray:
    """(B, H, T, hd) -> (B, T, H * hd)."""
    return a.transpose(0, 2, 1, 3).reshape(a.shape[0], a.shape[2], -1)


def _gqa(q: np.ndarray, k: np.ndarray, v: np.ndarray, window: int | None = None) -> np.ndarray:
    """Grouped-query attention: kv head j serves query heads j*rep .. j*rep+rep-1."""
    rep = q.shape[1] // k.shape[1]
    return _merge(_attention(q, np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1), window))


def _rope_config(c: dict[str, Any], partial_default: float) -> tuple[float, float]:
    """(rope_theta, partial_rotary_factor) from config.json (transformers 4.x or 5.x spelling);
    RoPE scaling is refused."""
    rp = c.get("rope_parameters") or {}
    if c.get("rope_scaling") or rp.get("rope_type", "default") != "default":
        raise UnsupportedModelError("reference_logits does not implement rope_scaling")
    theta = c.get("rope_theta") or rp.get("rope_theta", 10000.0)
    partial = c.get("partial_rotary_factor") or rp.get("partial_rotary_factor", partial_default)
    return float(theta), float(partial)


def _phi2_logits(sd: dict[str, np.ndarray], c: dict[str, Any], ids: np.ndarray) -> np.ndarray:
    """Phi-2 as TC leaves it: y = x Q + dense(attn(n)) + fc2(gelu_new(fc1(n))), n = RMSN(x);
    partial rotary on the first int(head_dim * partial_rotary_factor) features of q and k."""
    hidden, heads, n = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
    if c.get("hidden_act", "gelu_new") != "gelu_new" or c.get("qk_layernorm"):
        raise UnsupportedModelError("reference_logits implements Phi with gelu_new and without qk_layernorm")
    kv, hd = c.get("num_key_value_heads") or heads, hidden // heads
    theta, partial = _rope_config(c, 0.5)
    rot = int(hd * partial)
    if rot % 2:
        raise UnsupportedModelError(f"rotary dims int({hd} * {partial}) = {rot} are odd (transformers cannot run that either)")
    names = phi2.NAMES
    (qn, kn, vn), (fc1,) = names.attn_in, names.up
    h = sd[names.embed][ids]
    for i in range(n):
        p = names.prefix(i)
        x = _rmsn(h, hidden, RMSN_EPS)
        q = _rope(_heads(_lin(sd, x, p + qn), heads, hd), theta, rot)
        k = _rope(_heads(_lin(sd, x, p + kn), kv, hd), theta, rot)
        v = _heads(_lin(sd, x, p + vn), kv, hd)
        mlp = _lin(sd, _gelu_new(_lin(sd, x, p + fc1)), p + names.down)
        h = h @ sd[p + names.attn_q] + _lin(sd, _gqa(q, k, v), p + names.o) + mlp
    return _lin(sd, _rmsn(h, hidden, RMSN_EPS), names.head)


def _phi3_logits(sd: dict[str, np.ndarray], c: dict[str, Any], ids: np.ndarray) -> np.ndarray:
    """Phi-3 as TC leaves it (Llama's sequential layer with fused projections): qkv_proj rows
    q | k | v, gate_up_proj rows gate | up, mlp = down(up * silu(gate)); 4.41's sliding window."""
    hidden, heads, n = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
    if c.get("hidden_act", "silu") != "silu":
        raise UnsupportedModelError("reference_logits implements Phi-3 with silu")
    kv, hd, ffn = c.get("num_key_value_heads") or heads, c.get("head_dim") or hidden // heads, c["intermediate_size"]
    theta, partial = _rope_config(c, 1.0)
    rot, window = int(hd * partial), c.get("sliding_window")
    names = phi3.NAMES
    (qkv_w,), (gate_up,) = names.attn_in, names.up
    h = sd[names.embed][ids]
    for i in range(n):
        p = names.prefix(i)
        qkv = _lin(sd, _rmsn(h, hidden, RMSN_EPS), p + qkv_w)
        q = _rope(_heads(qkv[..., : heads * hd], heads, hd), theta, rot)
        k = _rope(_heads(qkv[..., heads * hd : (heads + kv) * hd], kv, hd), theta, rot)
        v = _heads(qkv[..., (heads + kv) * hd :], kv, hd)
        h = h @ sd[p + names.attn_q] + _lin(sd, _gqa(q, k, v, window), p + names.o)
        gu = _lin(sd, _rmsn(h, hidden, RMSN_EPS), p + gate_up)
        h = h @ sd[p + names.mlp_q] + _lin(sd, gu[..., ffn:] * _silu(gu[..., :ffn]), p + names.down)
    return _lin(sd, _rmsn(h, hidden, RMSN_EPS), names.head)


def _llama_logits(sd: dict[str, np.ndarray], c: dict[str, Any], ids: np.ndarray) -> np.ndarray:
    hidden, heads, n = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
    if c.get("rope_scaling"):
        raise UnsupportedModelError("reference_logits does not implement rope_scaling")
    kv = c.get("num_key_value_heads") or heads
    theta = c.get("rope_theta") or (c.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    hd = c.get("head_dim") or hidden // heads
    names = llama.NAMES
    (qn, kn, vn), (up_w, gate_w) = names.attn_in, names.up
    h = sd[names.embed][ids]
    for i in range(n):
        p = names.prefix(i)
        x = _rmsn(h, hidden, RMSN_EPS)
        q = _rope(_heads(_lin(sd, x, p + qn), heads, hd), theta)
        k = _rope(_heads(_lin(sd, x, p + kn), kv, hd), theta)
        v = _heads(_lin(sd, x, p + vn), kv, hd)
        h = h @ sd[p + names.attn_q] + _lin(sd, _gqa(q, k, v), p + names.o)
        x = _rmsn(h, hidden, RMSN_EPS)
        gate, up = _lin(sd, x, p + gate_w), _lin(sd, x, p + up_w)
        h = h @ sd[p + names.mlp_q] + _lin(sd, _silu(gate) * up, p + names.down)
    return _lin(sd, _rmsn(h, hidden, RMSN_EPS), names.head)


def _opt_logits(sd: dict[str, np.ndarray], c: dict[str, Any], ids: np.ndarray) -> np.ndarray:
    hidden, heads, n = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
    hd, t = hidden // heads, ids.shape[1]
    names = opt.NAMES
    (fc1,) = names.up
    h = sd[names.embed][ids] + sd[opt.POSITIONS][np.arange(t) + opt.POSITION_OFFSET][None]
    for i in range(n):
        p = names.prefix(i)
        x = _rmsn(h, hidden, RMSN_EPS)
        q, k, v = (_heads(_lin(sd, x, p + w), heads, hd) for w in names.attn_in)
        h = h @ sd[p + names.attn_q] + _lin(sd, _merge(_attention(q, k, v)), p + names.o)
        x = _rmsn(h, hidden, RMSN_EPS)
        h = h @ sd[p + names.mlp_q] + _lin(sd, np.maximum(_lin(sd, x, p + fc1), 0), p + names.down)
    return _lin(sd, _rmsn(h, hidden, RMSN_EPS), names.head)


_FORWARDS = {"llama": _llama_logits, "opt": _opt_logits, "phi": _phi2_logits, "phi3": _phi3_logits}


def reference_logits(ckpt: Checkpoint, input_ids: np.ndarray) -> np.ndarray:
    """An independent float64 forward pass of the sliced model (no transformers): TC's
    parameter-free RMSN (sum of squares over the sliced width / full hidden size, eps 1e-5),
    x @ attn_shortcut_Q + attn(norm(x)), then h @ mlp_shortcut_Q + mlp(norm(h)); optional biases.
    Phi-2 (model_type "phi") has parallel blocks with one shortcut (see _phi2_logits)."""
    c = ckpt.hf_config
    forward = _FORWARDS.get(c["model_type"])
    if forward is None:
        raise UnsupportedModelError(f"unknown model_type {c['model_type']!r}")
    sd = {k: v.to(torch.float64).numpy() for k, v in ckpt.state_dict.items()}
    return forward(sd, c, np.asarray(input_ids))

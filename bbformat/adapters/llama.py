"""Llama (RoPE, grouped-query attention, untied head, optional biases) after SliceGPT."""
from __future__ import annotations

from typing import Any

from ..checkpoint import Checkpoint
from ..codec.layout import ModelLayout
from ..errors import UnsupportedModelError
from .base import Names, add_optional_biases, build_layout, check_layer_count, check_state_dict, config_bool, config_int, slicing_dims

NAMES = Names(
    embed="model.embed_tokens.weight", positions=None, head="lm_head.weight", head_bias=None, layer="model.layers.{i}.",
    attn_in=("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"), o="self_attn.o_proj.weight",
    up=("mlp.up_proj.weight", "mlp.gate_proj.weight"), down="mlp.down_proj.weight",
    layer_norms=("input_layernorm.weight", "post_attention_layernorm.weight"), final_norms=("model.norm.weight",),
    biases={"q": "self_attn.q_proj.bias", "k": "self_attn.k_proj.bias", "v": "self_attn.v_proj.bias",
            "o": "self_attn.o_proj.bias", "up": "mlp.up_proj.bias", "gate": "mlp.gate_proj.bias", "down": "mlp.down_proj.bias"},
)


def shapes(hf: dict[str, Any], arch: str = "Llama") -> tuple[int, int, int, int, int, int, int]:
    """(hidden, layers, heads, kv_heads, head_dim, intermediate, vocab) from config.json (Llama's
    fields, which Phi-3 shares)."""
    hidden, n, heads = config_int(hf, "hidden_size"), config_int(hf, "num_hidden_layers"), config_int(hf, "num_attention_heads")
    kv = config_int(hf, "num_key_value_heads", heads)
    hd = config_int(hf, "head_dim", max(1, hidden // heads))
    ffn, vocab = config_int(hf, "intermediate_size"), config_int(hf, "vocab_size")
    if heads % kv:
        raise UnsupportedModelError(f"config.json has inconsistent {arch} sizes (heads {heads}, kv heads {kv})")
    return hidden, n, heads, kv, hd, ffn, vocab


def plan(ckpt: Checkpoint, scheme: str) -> ModelLayout:
    hidden, n, heads, kv, hd, ffn, vocab = shapes(ckpt.hf_config)
    sd = ckpt.state_dict
    tied = config_bool(ckpt.hf_config, "tie_word_embeddings", "config.json")
    check_layer_count(sd, NAMES, n)
    d = slicing_dims(ckpt, n, hidden)
    exp: dict[str, tuple[int, ...]] = {NAMES.embed: (vocab, d.emb), NAMES.head: (vocab, d.head)}
    for i in range(n):
        p = NAMES.prefix(i)
        for w, rows in zip(NAMES.attn_in, (heads * hd, kv * hd, kv * hd)):
            exp[p + w] = (rows, d.d_in[i])
        exp[p + NAMES.o] = (d.d_attn[i], heads * hd)
        for u in NAMES.up:
            exp[p + u] = (ffn, d.d_attn[i])
        exp[p + NAMES.down] = (d.d_mlp[i], ffn)
        exp[p + NAMES.attn_q] = (d.d_in[i], d.d_attn[i])
        exp[p + NAMES.mlp_q] = (d.d_attn[i], d.d_mlp[i])
        add_optional_biases(exp, sd, NAMES, i, {"q": (heads * hd,), "k": (kv * hd,), "v": (kv * hd,), "o": (d.d_attn[i],),
                                                "up": (ffn,), "gate": (ffn,), "down": (d.d_mlp[i],)})
    extras = check_state_dict(sd, exp, NAMES, n, tied)
    return build_layout("llama", scheme, NAMES, n, d, set(sd), extras)

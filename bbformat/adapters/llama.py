"""Llama (RoPE, grouped-query attention, untied head, optional biases) after SliceGPT."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..checkpoint import Checkpoint
from ..codec.layout import ModelLayout
from ..errors import UnsupportedModelError
from .base import (Dims, Names, add_optional_biases, build_layout, check_layer_count, check_state_dict, config_bool, config_int,
                   slicing_dims)

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


Shapes = dict[str, tuple[int, ...]]
Sizes = tuple[int, int, int, int, int, int, int]
# what differs per architecture: layer i's input projections (the attention's, the MLP's) ...
Projections = Callable[[int, Dims, Sizes], tuple[Shapes, Shapes]]
# ... and its optional tensors (biases), added to the expected shapes if the state dict has them
OptionalShapes = Callable[[Shapes, Mapping[str, Any], int, Dims, Sizes], None]


def plan_sequential(ckpt: Checkpoint, scheme: str, arch: str, names: Names, label: str, projections: Projections,
                    optional: OptionalShapes | None = None) -> ModelLayout:
    """The plan of a sequential decoder with Llama's config fields (Llama, Phi-3): every tensor's
    expected shape checked (in the order a mismatch is reported), the chunks laid out the same way."""
    sizes = shapes(ckpt.hf_config, label)
    hidden, n, heads, _, hd, ffn, vocab = sizes
    sd = ckpt.state_dict
    tied = config_bool(ckpt.hf_config, "tie_word_embeddings", "config.json")
    check_layer_count(sd, names, n)
    d = slicing_dims(ckpt, n, hidden)
    exp: Shapes = {names.embed: (vocab, d.emb), names.head: (vocab, d.head)}
    for i in range(n):
        p = names.prefix(i)
        attn_in, mlp_in = projections(i, d, sizes)
        exp.update(attn_in)
        exp[p + names.o] = (d.d_attn[i], heads * hd)
        exp.update(mlp_in)
        exp[p + names.down] = (d.d_mlp[i], ffn)
        exp[p + names.attn_q] = (d.d_in[i], d.d_attn[i])
        exp[p + names.mlp_q] = (d.d_attn[i], d.d_mlp[i])
        if optional is not None:
            optional(exp, sd, i, d, sizes)
    extras = check_state_dict(sd, exp, names, n, tied)
    return build_layout(arch, scheme, names, n, d, set(sd), extras)


def _projections(i: int, d: Dims, sizes: Sizes) -> tuple[Shapes, Shapes]:
    """q, k and v; up and gate."""
    _, _, heads, kv, hd, ffn, _ = sizes
    p = NAMES.prefix(i)
    attn: Shapes = {p + w: (rows, d.d_in[i]) for w, rows in zip(NAMES.attn_in, (heads * hd, kv * hd, kv * hd))}
    return attn, {p + u: (ffn, d.d_attn[i]) for u in NAMES.up}


def _biases(exp: Shapes, sd: Mapping[str, Any], i: int, d: Dims, sizes: Sizes) -> None:
    _, _, heads, kv, hd, ffn, _ = sizes
    add_optional_biases(exp, sd, NAMES, i, {"q": (heads * hd,), "k": (kv * hd,), "v": (kv * hd,), "o": (d.d_attn[i],),
                                            "up": (ffn,), "gate": (ffn,), "down": (d.d_mlp[i],)})


def plan(ckpt: Checkpoint, scheme: str) -> ModelLayout:
    return plan_sequential(ckpt, scheme, "llama", NAMES, "Llama", _projections, _biases)

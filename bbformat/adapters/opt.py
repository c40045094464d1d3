"""OPT (biases, learned positions, ReLU MLP, pre-norm) after SliceGPT."""
from __future__ import annotations

from typing import Any

from ..checkpoint import Checkpoint
from ..codec.layout import ModelLayout
from ..errors import UnsupportedModelError
from .base import Names, add_optional_biases, build_layout, check_layer_count, check_state_dict, config_bool, config_int, slicing_dims

POSITIONS = "model.decoder.embed_positions.weight"
HEAD_BIAS = "lm_head.bias"  # TC adds it when fusing the final LayerNorm's bias
NAMES = Names(
    embed="model.decoder.embed_tokens.weight", positions=POSITIONS, head="lm_head.weight",
    head_bias=HEAD_BIAS, layer="model.decoder.layers.{i}.",
    attn_in=("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"), o="self_attn.out_proj.weight",
    up=("fc1.weight",), down="fc2.weight",
    layer_norms=("self_attn_layer_norm.weight", "self_attn_layer_norm.bias", "final_layer_norm.weight", "final_layer_norm.bias"),
    final_norms=("model.decoder.final_layer_norm.weight", "model.decoder.final_layer_norm.bias"),
    biases={"q": "self_attn.q_proj.bias", "k": "self_attn.k_proj.bias", "v": "self_attn.v_proj.bias",
            "o": "self_attn.out_proj.bias", "up": "fc1.bias", "down": "fc2.bias"},
)
POSITION_OFFSET = 2  # OPTLearnedPositionalEmbedding: position ids start at 2


def shapes(hf: dict[str, Any]) -> tuple[int, int, int, int, int, int]:
    """(hidden, layers, heads, ffn_dim, vocab, max_positions) from config.json; refuses variants."""
    hidden, n, heads = config_int(hf, "hidden_size"), config_int(hf, "num_hidden_layers"), config_int(hf, "num_attention_heads")
    ffn, vocab, maxpos = config_int(hf, "ffn_dim"), config_int(hf, "vocab_size"), config_int(hf, "max_position_embeddings")
    if config_int(hf, "word_embed_proj_dim", hidden) != hidden:
        raise UnsupportedModelError("OPT models with project_in/project_out (word_embed_proj_dim != hidden_size, e.g. OPT-350m) are not supported")
    if config_bool(hf, "do_layer_norm_before", "config.json") is False:
        raise UnsupportedModelError("post-norm OPT models (do_layer_norm_before=false, e.g. OPT-350m) are not supported")
    if hidden % heads:
        raise UnsupportedModelError(f"config.json has inconsistent OPT sizes (hidden {hidden}, heads {heads})")
    return hidden, n, heads, ffn, vocab, maxpos


def plan(ckpt: Checkpoint, scheme: str) -> ModelLayout:
    hidden, n, heads, ffn, vocab, maxpos = shapes(ckpt.hf_config)
    sd = ckpt.state_dict
    tied = config_bool(ckpt.hf_config, "tie_word_embeddings", "config.json")
    check_layer_count(sd, NAMES, n)
    d = slicing_dims(ckpt, n, hidden, n_embeddings=2)
    exp: dict[str, tuple[int, ...]] = {NAMES.embed: (vocab, d.emb), NAMES.head: (vocab, d.head)}
    exp[POSITIONS] = (maxpos + POSITION_OFFSET, d.emb)
    if HEAD_BIAS in sd:
        exp[HEAD_BIAS] = (vocab,)
    for i in range(n):
        p = NAMES.prefix(i)
        for w in NAMES.attn_in:
            exp[p + w] = (hidden, d.d_in[i])
        exp[p + NAMES.o] = (d.d_attn[i], hidden)
        exp[p + NAMES.up[0]] = (ffn, d.d_attn[i])
        exp[p + NAMES.down] = (d.d_mlp[i], ffn)
        exp[p + NAMES.attn_q] = (d.d_in[i], d.d_attn[i])
        exp[p + NAMES.mlp_q] = (d.d_attn[i], d.d_mlp[i])
        add_optional_biases(exp, sd, NAMES, i, {"q": (hidden,), "k": (hidden,), "v": (hidden,), "o": (d.d_attn[i],),
                                                "up": (ffn,), "down": (d.d_mlp[i],)})
    extras = check_state_dict(sd, exp, NAMES, n, tied)
    return build_layout("opt", scheme, NAMES, n, d, set(sd), extras)

"""Phi-2 (config.json model_type "phi": parallel attention and MLP blocks, partial rotary,
biases everywhere, LayerNorm, head bias) after SliceGPT.

What TransformerCompression leaves (its phi2 adapter declares parallel_blocks): every
LayerNorm is folded into the linears that read it (q/k/v and fc1 gain the norm's scale and
bias), the mean subtraction is baked into the embedding and into dense and fc2 (so the
stream stays centred), and the norms become the parameter-free RMSN. A layer is then

    y = x @ attn_shortcut_Q + dense(attn(n)) + fc2(gelu_new(fc1(n))),   n = RMSN(x)

with ONE shortcut, attn_shortcut_Q (d_in, d_out); there is no mlp_shortcut_Q. The
SlicingConfig has parallel_blocks=true, attention_input_dimensions (d_in) and
mlp_output_dimensions (d_out); attention_output_dimensions and mlp_input_dimensions are
empty (TC never records them: they are d_out and d_in).

Rotation sites. Attention and MLP read the same normed input and their outputs are summed
into the stream before anything reads it, so no orthogonal change of basis can act between
them: each layer has a single residual-stream site, the layer's output (dim d_out, TC's
mlp_output_dimensions). A rotation R of that stream keeps the function when every writer's
output rows (dense and fc2, weights and biases) and the shortcut's columns turn with it, and
every reader of the next layer turns too (q/k/v and fc1 columns, the next shortcut's rows;
the head's columns after the last layer):

    layers.{i}.out  anchor self_attn.dense.weight (axis 0)
                    followers self_attn.dense.bias, mlp.fc2.weight (axis 0), mlp.fc2.bias,
                    attn_shortcut_Q (axis 1), then layer i+1's attn_shortcut_Q (axis 0),
                    q/k/v_proj.weight and mlp.fc1.weight (axis 1) (or lm_head.weight, axis 1)
    embed           anchor model.embed_tokens.weight (axis 1); followers layer 0's readers

Only dense and fc2 can anchor (the anchor's Gram matrix must have full rank d_out: biases
have rank 1, the shortcut only d_in rows). dense anchors, as o_proj / out_proj anchor
Llama's and OPT's attention site: its Gram matrix has hidden_size rows where fc2's has
intermediate_size (4x for Phi-2), so the decoder's Gram and, in `paper`, the un-rotation
M·E cost a quarter, and fewer weights carry paper's tolerance-bounded un-rotation error. On
random tiny models the two anchors give `symmetric` files within 0.03% of each other and
`paper` (tolerance 0.005) files 0.2-1% smaller with dense. Push order: `paper` stores the
shortcut, q/k/v, fc1, fc2 and then dense (everything else of the layer lies below the
anchor); `symmetric` the readers q/k/v and fc1 first, the shortcut last.
"""
from __future__ import annotations

from typing import Any

from ..checkpoint import Checkpoint
from ..codec.layout import ModelLayout
from ..errors import UnsupportedModelError
from .base import Dims, Names, build_layout, check_layer_count, check_state_dict, config_bool, config_int, slicing_dims

HEAD_BIAS = "lm_head.bias"  # TC fuses the final LayerNorm's bias into the head: always there
NAMES = Names(
    embed="model.embed_tokens.weight", positions=None, head="lm_head.weight", head_bias=HEAD_BIAS, layer="model.layers.{i}.",
    attn_in=("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"), o="self_attn.dense.weight",
    up=("mlp.fc1.weight",), down="mlp.fc2.weight", parallel=True,
    layer_norms=("input_layernorm.weight", "input_layernorm.bias"),
    final_norms=("model.final_layernorm.weight", "model.final_layernorm.bias"),
    biases={"q": "self_attn.q_proj.bias", "k": "self_attn.k_proj.bias", "v": "self_attn.v_proj.bias",
            "o": "self_attn.dense.bias", "up": "mlp.fc1.bias", "down": "mlp.fc2.bias"},
)


def shapes(hf: dict[str, Any]) -> tuple[int, int, int, int, int, int, int]:
    """(hidden, layers, heads, kv_heads, head_dim, intermediate, vocab) from config.json; refuses variants."""
    hidden, n, heads = config_int(hf, "hidden_size"), config_int(hf, "num_hidden_layers"), config_int(hf, "num_attention_heads")
    kv = config_int(hf, "num_key_value_heads", heads)
    ffn, vocab = config_int(hf, "intermediate_size"), config_int(hf, "vocab_size")
    if hidden % heads or heads % kv:
        raise UnsupportedModelError(f"config.json has inconsistent Phi sizes (hidden {hidden}, heads {heads}, kv heads {kv})")
    if config_bool(hf, "qk_layernorm", "config.json"):
        raise UnsupportedModelError("Phi models with qk_layernorm=true are not supported (TransformerCompression would "
                                    "replace their per-head LayerNorms too)")
    return hidden, n, heads, kv, hidden // heads, ffn, vocab


def expected_shapes(hf: dict[str, Any], d: Dims) -> dict[str, tuple[int, ...]]:
    """Every tensor TC's Phi-2 state dict holds (biases included: Phi's linears always have them)."""
    hidden, n, heads, kv, hd, ffn, vocab = shapes(hf)
    d_in, d_out = d.d_in, d.d_mlp
    exp: dict[str, tuple[int, ...]] = {NAMES.embed: (vocab, d.emb), NAMES.head: (vocab, d.head), HEAD_BIAS: (vocab,)}
    for i in range(n):
        p = NAMES.prefix(i)
        exp[p + NAMES.attn_q] = (d_in[i], d_out[i])
        for w, role, rows in zip(NAMES.attn_in, ("q", "k", "v"), (heads * hd, kv * hd, kv * hd)):
            exp[p + w] = (rows, d_in[i])
            exp[p + NAMES.biases[role]] = (rows,)
        exp[p + NAMES.o], exp[p + NAMES.biases["o"]] = (d_out[i], heads * hd), (d_out[i],)
        exp[p + NAMES.up[0]], exp[p + NAMES.biases["up"]] = (ffn, d_in[i]), (ffn,)
        exp[p + NAMES.down], exp[p + NAMES.biases["down"]] = (d_out[i], ffn), (d_out[i],)
    return exp


def plan(ckpt: Checkpoint, scheme: str) -> ModelLayout:
    hidden, n = shapes(ckpt.hf_config)[:2]
    sd = ckpt.state_dict
    tied = config_bool(ckpt.hf_config, "tie_word_embeddings", "config.json")
    check_layer_count(sd, NAMES, n)
    d = slicing_dims(ckpt, n, hidden, parallel=True)
    exp = expected_shapes(ckpt.hf_config, d)
    extras = check_state_dict(sd, exp, NAMES, n, tied)
    return build_layout("phi", scheme, NAMES, n, d, set(sd), extras)

"""Phi-3 (config.json model_type "phi3": fused qkv_proj and gate_up_proj, RMSNorm, SiLU
gating, no biases, untied head) after SliceGPT.

TransformerCompression's phi3 adapter treats the layer as sequential, exactly like Llama:
both RMSNorm scales are folded into qkv_proj / gate_up_proj (and the final one into
lm_head), the norms become the parameter-free RMSN, and each layer gets both shortcuts:

    h = x @ attn_shortcut_Q + o_proj(attn(RMSN(x)));  y = h @ mlp_shortcut_Q + down_proj(mlp(RMSN(h)))
    mlp(z) = up * silu(gate),  (gate, up) = the two halves of gate_up_proj(z)

The fused projections change nothing about the symmetries: a residual-stream rotation acts
on the input columns of a linear, and qkv_proj (rows q | k | v) and gate_up_proj (rows
gate | up) are single linears reading the stream, so each is one follower (axis 1) where
Llama has three (q, k, v) or two (up, gate). Per layer, as for Llama:

    layers.{i}.attn  anchor self_attn.o_proj.weight (axis 0); followers attn_shortcut_Q (axis 1),
                     mlp_shortcut_Q (axis 0), mlp.gate_up_proj.weight (axis 1)
    layers.{i}.mlp   anchor mlp.down_proj.weight (axis 0); followers mlp_shortcut_Q (axis 1), then
                     layer i+1's attn_shortcut_Q (axis 0) and self_attn.qkv_proj.weight (axis 1)
                     (or lm_head.weight, axis 1)
    embed            anchor model.embed_tokens.weight (axis 1); followers layer 0's readers
"""
from __future__ import annotations

from ..checkpoint import Checkpoint
from ..codec.layout import ModelLayout
from . import llama
from .base import Dims, Names

NAMES = Names(
    embed="model.embed_tokens.weight", positions=None, head="lm_head.weight", head_bias=None, layer="model.layers.{i}.",
    attn_in=("self_attn.qkv_proj.weight",), o="self_attn.o_proj.weight",
    up=("mlp.gate_up_proj.weight",), down="mlp.down_proj.weight",
    layer_norms=("input_layernorm.weight", "post_attention_layernorm.weight"), final_norms=("model.norm.weight",),
)


def _projections(i: int, d: Dims, sizes: llama.Sizes) -> tuple[llama.Shapes, llama.Shapes]:
    """The fused qkv_proj; the fused gate_up_proj (no biases)."""
    _, _, heads, kv, hd, ffn, _ = sizes
    p = NAMES.prefix(i)
    return {p + NAMES.attn_in[0]: ((heads + 2 * kv) * hd, d.d_in[i])}, {p + NAMES.up[0]: (2 * ffn, d.d_attn[i])}


def plan(ckpt: Checkpoint, scheme: str) -> ModelLayout:
    return llama.plan_sequential(ckpt, scheme, "phi3", NAMES, "Phi-3", _projections)

"""The torch model of a sliced Phi-3 (transformers' Phi3ForCausalLM with compressed layers),
for load_model. Imports torch; adapters/phi3.py names its tensors."""
from __future__ import annotations

from typing import Any, Iterable

import torch
from torch import nn

from .llama_torch import SlicedLlamaDecoderLayer
from .torch_base import RMSN, finish, hf_config, linear, shortcut, slice_decoder


class SlicedPhi3DecoderLayer(nn.Module):
    """Phi-3's layer after slicing (Llama's, with fused qkv_proj and gate_up_proj):
    x -> x Q_att + o_proj(attn(norm(x))) -> h Q_mlp + down_proj(mlp(norm(h)))."""

    def __init__(self, config: Any, layer_idx: int, d_in: int, d_attn: int, d_mlp: int) -> None:
        super().__init__()
        from transformers.models.phi3.modeling_phi3 import Phi3Attention, Phi3MLP

        self.self_attn = Phi3Attention(config, layer_idx)
        a = self.self_attn
        hd, heads, kv = a.head_dim, config.num_attention_heads, config.num_key_value_heads
        a.qkv_proj = linear(d_in, (heads + 2 * kv) * hd, False)
        a.o_proj = linear(heads * hd, d_attn, False)
        self.mlp = Phi3MLP(config)
        self.mlp.gate_up_proj = linear(d_attn, 2 * config.intermediate_size, False)
        self.mlp.down_proj = linear(config.intermediate_size, d_mlp, False)
        self.input_layernorm = RMSN(config.hidden_size)
        self.post_attention_layernorm = RMSN(config.hidden_size)
        self.attn_shortcut_Q = shortcut(d_in, d_attn)
        self.mlp_shortcut_Q = shortcut(d_attn, d_mlp)

    forward = SlicedLlamaDecoderLayer.forward  # the same attributes, the same computation


def build_model(config_json: dict[str, Any], slicing_config: dict[str, Any], dtype: torch.dtype = torch.float32,
                names: Iterable[str] | None = None, device: torch.device | str = "cpu") -> nn.Module:
    """An empty sliced Phi-3 (Phi3ForCausalLM) with the widths of `slicing_config`.

    The sliding window is widened by one: transformers 4.41 (which TransformerCompression
    pins) and flash-attn's window_size let query i see keys i - sliding_window .. i, newer
    transformers only i - sliding_window + 1 .. i; this keeps 4.41's (and the model's) mask."""
    from transformers import Phi3Config, Phi3ForCausalLM
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

    window = config_json.get("sliding_window")
    config = hf_config(Phi3Config, dict(config_json, sliding_window=None if window is None else int(window) + 1))
    with torch.device("meta"):
        model = Phi3ForCausalLM(config)
        slice_decoder(model, config, slicing_config,
                      lambda i, d_in, d_attn, d_mlp: SlicedPhi3DecoderLayer(config, i, d_in, d_attn, d_mlp),
                      "norm", head_bias=False)
    return finish(model, dtype, lambda: Phi3RotaryEmbedding(config=config), device)

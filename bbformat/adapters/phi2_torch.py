"""The torch model of a sliced Phi-2 (transformers' PhiForCausalLM with compressed parallel
blocks), for load_model. Imports torch; adapters/phi2.py names its tensors."""
from __future__ import annotations

from typing import Any, Iterable

import torch
from torch import nn

from ..errors import UnsupportedModelError
from .torch_base import RMSN, finish, hf_config, linear, shortcut, slice_decoder


class SlicedPhiDecoderLayer(nn.Module):
    """Phi-2's parallel block after slicing: y = x Q + dense(attn(n)) + fc2(gelu_new(fc1(n))),
    n = RMSN(x), with the one shortcut attn_shortcut_Q (d_in, d_out); biases everywhere."""

    def __init__(self, config: Any, layer_idx: int, d_in: int, d_out: int) -> None:
        super().__init__()
        from transformers.models.phi.modeling_phi import PhiAttention, PhiMLP

        self.self_attn = PhiAttention(config, layer_idx)
        a = self.self_attn
        hd, heads, kv = a.head_dim, config.num_attention_heads, config.num_key_value_heads
        a.q_proj, a.k_proj, a.v_proj = (linear(d_in, n * hd, True) for n in (heads, kv, kv))
        a.dense = linear(heads * hd, d_out, True)
        self.mlp = PhiMLP(config)
        self.mlp.fc1 = linear(d_in, config.intermediate_size, True)
        self.mlp.fc2 = linear(config.intermediate_size, d_out, True)
        self.input_layernorm = RMSN(config.hidden_size)
        self.attn_shortcut_Q = shortcut(d_in, d_out)

    def forward(self, hidden_states: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        # the cache, mask, positions and rotary embeddings go to the attention as the model passed
        # them, under this transformers' names (llama_torch.SlicedLlamaDecoderLayer.forward)
        n = self.input_layernorm(hidden_states)
        a, _ = self.self_attn(hidden_states=n, **kwargs)
        out: torch.Tensor = a + self.mlp(n) + torch.matmul(hidden_states, self.attn_shortcut_Q.to(hidden_states.dtype))
        return out


def build_model(config_json: dict[str, Any], slicing_config: dict[str, Any], dtype: torch.dtype = torch.float32,
                names: Iterable[str] | None = None, device: torch.device | str = "cpu") -> nn.Module:
    """An empty sliced Phi-2 (PhiForCausalLM) with the widths of `slicing_config`: one output
    width per layer (mlp_output_dimensions), parameter-free norms, the head with its bias."""
    from transformers import PhiConfig, PhiForCausalLM
    from transformers.models.phi.modeling_phi import PhiRotaryEmbedding

    if config_json.get("qk_layernorm"):
        raise UnsupportedModelError("Phi models with qk_layernorm=true are not supported")
    config = hf_config(PhiConfig, config_json)
    with torch.device("meta"):
        model = PhiForCausalLM(config)
        slice_decoder(model, config, slicing_config,
                      lambda i, d_in, d_attn, d_mlp: SlicedPhiDecoderLayer(config, i, d_in, d_mlp),
                      "final_layernorm", head_bias=True)
    return finish(model, dtype, lambda: PhiRotaryEmbedding(config=config), device)

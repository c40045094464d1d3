"""The torch model of a sliced Llama (transformers' LlamaForCausalLM with compressed layers):
what load_model fills and calibration runs. Imports torch; adapters/llama.py names its tensors."""
from __future__ import annotations

from typing import Any, Iterable

import torch
from torch import nn

from ..errors import UnsupportedModelError
from .torch_base import RMSN, finish, hf_config, linear, shortcut, slice_decoder


class SlicedLlamaDecoderLayer(nn.Module):
    """x -> x Q_att + attn(norm(x)) -> h Q_mlp + mlp(norm(h))."""

    def __init__(self, config: Any, layer_idx: int, d_in: int, d_attn: int, d_mlp: int) -> None:
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP

        self.self_attn = LlamaAttention(config, layer_idx)
        a = self.self_attn
        hd = a.head_dim
        bias = bool(getattr(config, "attention_bias", False))
        a.q_proj = linear(d_in, config.num_attention_heads * hd, bias)
        a.k_proj = linear(d_in, config.num_key_value_heads * hd, bias)
        a.v_proj = linear(d_in, config.num_key_value_heads * hd, bias)
        a.o_proj = linear(config.num_attention_heads * hd, d_attn, bias)
        self.mlp = LlamaMLP(config)
        mb = bool(getattr(config, "mlp_bias", False))
        self.mlp.gate_proj = linear(d_attn, config.intermediate_size, mb)
        self.mlp.up_proj = linear(d_attn, config.intermediate_size, mb)
        self.mlp.down_proj = linear(config.intermediate_size, d_mlp, mb)
        self.input_layernorm = RMSN(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSN(config.hidden_size, config.rms_norm_eps)
        self.attn_shortcut_Q = shortcut(d_in, d_attn)
        self.mlp_shortcut_Q = shortcut(d_attn, d_mlp)

    def forward(self, hidden_states: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        # Everything but the hidden states goes to the attention exactly as the model passed it
        # (mask, positions, rotary embeddings and the cache, under whatever name this
        # transformers calls it: `past_key_values` before 5.x's rename to `cache`). Naming it
        # here would pass the old name as None beside the new one, which transformers answers
        # with a FutureWarning on every call.
        residual = hidden_states
        h, _ = self.self_attn(hidden_states=self.input_layernorm(hidden_states), **kwargs)
        h = torch.matmul(residual, self.attn_shortcut_Q.to(residual.dtype)) + h
        residual = h
        h = self.mlp(self.post_attention_layernorm(h))
        out: torch.Tensor = torch.matmul(residual, self.mlp_shortcut_Q.to(residual.dtype)) + h
        return out


def build_model(config_json: dict[str, Any], slicing_config: dict[str, Any], dtype: torch.dtype = torch.float32,
                names: Iterable[str] | None = None, device: torch.device | str = "cpu") -> nn.Module:
    """An empty (uninitialised) sliced Llama with the shapes of `slicing_config` (`names`,
    the checkpoint's tensor names, is not needed: Llama's biases follow config.json)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    if config_json.get("model_type") != "llama":
        raise UnsupportedModelError(f"load_model supports Llama models; this is {config_json.get('model_type')!r}")
    config = hf_config(LlamaConfig, config_json)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
        slice_decoder(model, config, slicing_config,
                      lambda i, d_in, d_attn, d_mlp: SlicedLlamaDecoderLayer(config, i, d_in, d_attn, d_mlp),
                      "norm", head_bias=False, norm_eps=config.rms_norm_eps)
    return finish(model, dtype, lambda: LlamaRotaryEmbedding(config=config), device)

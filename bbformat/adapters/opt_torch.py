"""The torch model of a sliced OPT (transformers' OPTForCausalLM with compressed layers), for
load_model. Imports torch; adapters/opt.py names its tensors."""
from __future__ import annotations

from typing import Any, Iterable

import torch
from torch import nn

from .opt import HEAD_BIAS, NAMES
from .torch_base import RMSN, finish, head_width, hf_config, linear, shortcut, width


class SlicedOPTDecoderLayer(nn.Module):
    """x -> x Q_att + attn(norm(x)) -> h Q_mlp + fc2(act(fc1(norm(h)))); OPT's LayerNorms are
    parameter-free RMS norms after slicing (their affine parts are fused into the linears)."""

    def __init__(self, config: Any, layer_idx: int, d_in: int, d_attn: int, d_mlp: int, bias: dict[str, bool]) -> None:
        super().__init__()
        from transformers.activations import ACT2FN
        from transformers.models.opt.modeling_opt import OPTAttention

        hidden = config.hidden_size
        self.self_attn = OPTAttention(config, layer_idx)
        a = self.self_attn
        a.q_proj, a.k_proj, a.v_proj = (linear(d_in, hidden, bias[w]) for w in ("q", "k", "v"))
        a.out_proj = linear(hidden, d_attn, bias["o"])
        self.fc1 = linear(d_attn, config.ffn_dim, bias["up"])
        self.fc2 = linear(config.ffn_dim, d_mlp, bias["down"])
        self.activation_fn = ACT2FN[config.activation_function]
        self.self_attn_layer_norm = RMSN(hidden)
        self.final_layer_norm = RMSN(hidden)
        self.attn_shortcut_Q = shortcut(d_in, d_attn)
        self.mlp_shortcut_Q = shortcut(d_attn, d_mlp)

    def forward(self, hidden_states: torch.Tensor, use_cache: Any = False, **kwargs: Any) -> torch.Tensor:
        # The cache, mask and positions go to the attention as the model passed them, under this
        # transformers' names (llama_torch.SlicedLlamaDecoderLayer.forward); use_cache is not
        # passed on, as transformers' own OPT layer does not.
        residual = hidden_states
        h, _ = self.self_attn(hidden_states=self.self_attn_layer_norm(hidden_states), **kwargs)
        h = torch.matmul(residual, self.attn_shortcut_Q.to(residual.dtype)) + h
        m = self.fc2(self.activation_fn(self.fc1(self.final_layer_norm(h))))
        out: torch.Tensor = torch.matmul(h, self.mlp_shortcut_Q.to(h.dtype)) + m
        return out


def build_model(config_json: dict[str, Any], slicing_config: dict[str, Any], dtype: torch.dtype = torch.float32,
                names: Iterable[str] | None = None, device: torch.device | str = "cpu") -> nn.Module:
    """An empty sliced OPT with the shapes of `slicing_config`; a bias exists where `names`
    (the checkpoint's tensor names) has one (all of them when names is None)."""
    from transformers import OPTConfig, OPTForCausalLM
    from transformers.models.opt.modeling_opt import OPTLearnedPositionalEmbedding

    have = None if names is None else set(names)
    config = hf_config(OPTConfig, config_json)
    hidden, n = config.hidden_size, config.num_hidden_layers
    with torch.device("meta"):
        model = OPTForCausalLM(config)
        dec = model.model.decoder
        d_emb = width(slicing_config, "embedding_dimensions", 0, hidden)
        dec.embed_tokens = nn.Embedding(config.vocab_size, d_emb)
        dec.embed_positions = OPTLearnedPositionalEmbedding(config.max_position_embeddings, d_emb)
        layers = []
        for i in range(n):
            bias = {role: have is None or NAMES.at(i, rel) in have for role, rel in NAMES.biases.items()}
            layers.append(SlicedOPTDecoderLayer(config, i, width(slicing_config, "attention_input_dimensions", i, hidden),
                                                width(slicing_config, "attention_output_dimensions", i, hidden),
                                                width(slicing_config, "mlp_output_dimensions", i, hidden), bias))
        dec.layers = nn.ModuleList(layers)
        dec.final_layer_norm = RMSN(hidden)
        head_bias = have is not None and HEAD_BIAS in have
        model.lm_head = nn.Linear(head_width(slicing_config, hidden), config.vocab_size, bias=head_bias)
    return finish(model, dtype, None, device)

"""Sliced causal language models (SliceGPT: OPT, Llama-2/3, Phi-2, Phi-3) for transformers'
`AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)`.

bbformat writes this file, unchanged, into every directory of `bbformat unpack --format hf`
as `modeling_bbformat_sliced.py` (save_pretrained of bbformat.load_model's model copies it as
`hf_modeling.py`), and load_model builds its models from it. It stands alone: it imports torch
and transformers only (transformers 4.41, the version TransformerCompression pins, through
5.x), never bbformat.

What a sliced model is (TransformerCompression's compressed layers): the residual stream of
layer i has its own width; each block reads a parameter-free RMS norm of the stream (the sum
of squares over the sliced width divided by the model's full hidden size) and adds its output
to the stream carried through a shortcut matrix Q:

    sequential (Llama, Phi-3, OPT):  h = x Q_attn + attn(norm(x));  y = h Q_mlp + mlp(norm(h))
    parallel (Phi-2):                y = x Q + attn(norm(x)) + mlp(norm(x))

Parameter names are TransformerCompression's, so its state dicts load unchanged. config.json
carries the original model's config (`sliced_base`), TransformerCompression's SlicingConfig
(`sliced_slicing`) and what the layers need beyond them (`sliced_*`).
"""
from __future__ import annotations

import math
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn
import transformers
from transformers import PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

# the base config class: PreTrainedConfig from 5.x (PretrainedConfig is its old alias there)
PretrainedConfig = getattr(transformers, "PreTrainedConfig", None) or transformers.PretrainedConfig

try:  # transformers >= 4.45 exports it; 5.x models must inherit it themselves
    from transformers import GenerationMixin
except ImportError:  # pragma: no cover - 4.41 has it here (and PreTrainedModel inherits it)
    from transformers.generation import GenerationMixin

ARCHS = ("llama", "opt", "phi", "phi3")
# what this transformers calls the cache in model outputs and generate's inputs: `cache` from
# 5.x (`past_key_values` is kept there as a deprecated alias, with a warning), before that
# `past_key_values`
CACHE = "cache" if "cache" in getattr(CausalLMOutputWithPast, "__dataclass_fields__", {}) else "past_key_values"
MODEL_TYPE = "bbformat_sliced"


class SlicedConfig(PretrainedConfig):  # type: ignore[misc,valid-type]
    """The original config.json (`sliced_base`), the SlicingConfig (`sliced_slicing`), and:
    sliced_arch ('llama', 'opt', 'phi' for Phi-2, 'phi3'), sliced_norm_eps, sliced_biases
    (roles with a bias: q k v o up gate down head), sliced_rope (theta, rotary fraction,
    scaling) and sliced_window (Phi-3's sliding window as TransformerCompression's
    transformers 4.41 applies it: query i sees keys i - window .. i; None for none)."""

    model_type = MODEL_TYPE

    def __init__(self, sliced_arch: Optional[str] = None, sliced_base: Optional[dict[str, Any]] = None,
                 sliced_slicing: Optional[dict[str, Any]] = None, sliced_norm_eps: float = 1e-5,
                 sliced_biases: Optional[list[str]] = None, sliced_rope: Optional[dict[str, Any]] = None,
                 sliced_window: Optional[int] = None, **kwargs: Any) -> None:
        base = dict(sliced_base or {})
        self.sliced_arch = sliced_arch
        self.sliced_base = base
        self.sliced_slicing = dict(sliced_slicing or {})
        self.sliced_norm_eps = float(sliced_norm_eps)
        self.sliced_biases = list(sliced_biases or [])
        self.sliced_rope = dict(sliced_rope or {})
        self.sliced_window = sliced_window
        # what transformers (generate, its caches) reads from any causal LM's config
        for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "max_position_embeddings"):
            if key in base:
                kwargs.setdefault(key, base[key])
        kwargs.setdefault("num_key_value_heads", base.get("num_key_value_heads") or base.get("num_attention_heads"))
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            if base.get(key) is not None:
                kwargs.setdefault(key, base[key])
        kwargs["tie_word_embeddings"] = False  # TransformerCompression unties the head
        super().__init__(**kwargs)


def _width(slicing: dict[str, Any], key: str, i: int, default: int) -> int:
    """Entry i of a SlicingConfig dimension map (keys "0", "1", ... in JSON), else `default`."""
    d = slicing.get(key) or {}
    return int(d.get(str(i), d.get(i, default)))


class Widths:
    """The residual stream's width at every point of the model, from the SlicingConfig."""

    def __init__(self, config: SlicedConfig) -> None:
        s, hidden, n = config.sliced_slicing, int(config.sliced_base["hidden_size"]), int(config.sliced_base["num_hidden_layers"])
        self.emb = _width(s, "embedding_dimensions", 0, hidden)
        self.d_in = [_width(s, "attention_input_dimensions", i, hidden) for i in range(n)]
        self.d_attn = [_width(s, "attention_output_dimensions", i, hidden) for i in range(n)]
        self.d_mlp = [_width(s, "mlp_output_dimensions", i, hidden) for i in range(n)]
        self.head = int(s.get("head_dimension") or hidden)


class RMSN(nn.Module):
    """Parameter-free RMS norm over the sliced width, the mean taken over the full hidden size.
    Half precision is computed in float32 and cast back: TC's RMSN does so for float16 (its
    only half dtype: run_slicegpt.py offers fp16 and fp32), and bfloat16 follows the same rule,
    as transformers' LlamaRMSNorm does for every dtype."""

    def __init__(self, mean_dim: int, eps: float) -> None:
        super().__init__()
        self.mean_dim, self.eps = mean_dim, eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        if dtype in (torch.float16, torch.bfloat16):
            x = x.float()
        var = x.pow(2).sum(-1, keepdim=True) / self.mean_dim
        return (x * torch.rsqrt(var + self.eps)).to(dtype)


def _gelu_new(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


ACTIVATIONS = {"silu": F.silu, "swish": F.silu, "relu": F.relu, "gelu": F.gelu, "gelu_new": _gelu_new,
               "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh")}


def activation(name: str) -> Any:
    if name not in ACTIVATIONS:
        raise ValueError(f"activation {name!r} is not implemented (have {', '.join(sorted(ACTIVATIONS))})")
    return ACTIVATIONS[name]


class Rotary(nn.Module):
    """Rotate-half RoPE on the first `dims` features of each head (Phi's partial rotary), with
    the default, linear or llama3 frequencies (sliced_rope: theta, dims, scaling)."""

    def __init__(self, rope: dict[str, Any], head_dim: int) -> None:
        super().__init__()
        self.dims = int(rope.get("dims") or head_dim)
        self.theta = float(rope.get("theta", 10000.0))
        self.scaling = dict(rope.get("scaling") or {})
        kind = self.scaling.get("rope_type", self.scaling.get("type", "default"))
        if kind not in ("default", "linear", "llama3"):
            raise ValueError(f"rope scaling {kind!r} is not implemented")
        # computed where it is used, not a buffer: from_pretrained allocates buffers it does
        # not load without filling them
        self._inv: dict[torch.device, torch.Tensor] = {}

    def inv_freq(self, device: torch.device) -> torch.Tensor:
        if device not in self._inv:
            inv = 1.0 / self.theta ** (torch.arange(0, self.dims, 2, dtype=torch.int64, device=device).float() / self.dims)
            kind = self.scaling.get("rope_type", self.scaling.get("type", "default"))
            if kind == "linear":
                inv = inv / float(self.scaling["factor"])
            elif kind == "llama3":
                inv = _llama3_frequencies(inv, self.scaling)
            self._inv[device] = inv
        return self._inv[device]

    def forward(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q, k: (B, heads, T, head_dim); positions: (B, T)."""
        freqs = positions[:, :, None].float() * self.inv_freq(q.device)[None, None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[:, None].to(q.dtype), emb.sin()[:, None].to(q.dtype)
        return self._turn(q, cos, sin), self._turn(k, cos, sin)

    def _turn(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        r, rest = x[..., : self.dims], x[..., self.dims :]
        half = self.dims // 2
        turned = torch.cat((-r[..., half:], r[..., :half]), dim=-1)
        return torch.cat((r * cos + turned * sin, rest), dim=-1)


def _llama3_frequencies(inv: torch.Tensor, s: dict[str, Any]) -> torch.Tensor:
    factor, low, high = float(s["factor"]), float(s["low_freq_factor"]), float(s["high_freq_factor"])
    old = float(s["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old / low, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / high) & ~(wavelen > old / low)
    return torch.where(medium, smoothed, scaled)


def _linear(n_in: int, n_out: int, bias: bool) -> nn.Linear:
    return nn.Linear(n_in, n_out, bias=bias)


class Attention(nn.Module):
    """Causal multi-head attention with grouped-query heads; projections named per
    architecture: q/k/v_proj or the fused qkv_proj (Phi-3), then o_proj, out_proj (OPT) or
    dense (Phi-2)."""

    def __init__(self, config: SlicedConfig, layer: int, d_in: int, d_out: int) -> None:
        super().__init__()
        base, arch, has = config.sliced_base, config.sliced_arch, set(config.sliced_biases)
        self.layer, self.heads = layer, int(base["num_attention_heads"])
        self.kv_heads = int(base.get("num_key_value_heads") or self.heads) if arch != "opt" else self.heads
        self.head_dim = int(base.get("head_dim") or int(base["hidden_size"]) // self.heads)
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        self.fused = arch == "phi3"
        if self.fused:
            self.qkv_proj = _linear(d_in, q + 2 * kv, False)
        else:
            self.q_proj, self.k_proj, self.v_proj = (_linear(d_in, n, r in has) for n, r in ((q, "q"), (kv, "k"), (kv, "v")))
        self.out_name = {"opt": "out_proj", "phi": "dense"}.get(str(arch), "o_proj")
        setattr(self, self.out_name, _linear(q, d_out, "o" in has))
        self.rotary = None if arch == "opt" else Rotary(config.sliced_rope, self.head_dim)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, mask: Optional[torch.Tensor], cache: Any) -> torch.Tensor:
        b, t, _ = x.shape
        if self.fused:
            q, k, v = self.qkv_proj(x).split([self.heads * self.head_dim] + [self.kv_heads * self.head_dim] * 2, dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.rotary is not None:
            q, k = self.rotary(q, k, positions)
        if cache is not None:
            k, v = cache.update(k, v, self.layer)
        if self.kv_heads != self.heads:
            k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
            v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        # no mask: plain causal attention (past == 0) or one new token that sees everything
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None and t > 1)
        out: torch.Tensor = getattr(self, self.out_name)(a.transpose(1, 2).reshape(b, t, -1))
        return out


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)): Llama's gate_proj/up_proj, or Phi-3's fused gate_up_proj."""

    def __init__(self, config: SlicedConfig, d_in: int, d_out: int) -> None:
        super().__init__()
        base, has = config.sliced_base, set(config.sliced_biases)
        ffn = int(base["intermediate_size"])
        self.fused = config.sliced_arch == "phi3"
        if self.fused:
            self.gate_up_proj = _linear(d_in, 2 * ffn, False)
        else:
            self.gate_proj, self.up_proj = _linear(d_in, ffn, "gate" in has), _linear(d_in, ffn, "up" in has)
        self.down_proj = _linear(ffn, d_out, "down" in has)
        self.act = activation(base.get("hidden_act", "silu"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        out: torch.Tensor = self.down_proj(self.act(gate) * up)
        return out


class FC(nn.Module):
    """fc2(act(fc1(x))): Phi-2's mlp (and OPT's fc1/fc2, which sit on the layer itself)."""

    def __init__(self, config: SlicedConfig, d_in: int, d_out: int) -> None:
        super().__init__()
        base, has = config.sliced_base, set(config.sliced_biases)
        ffn = int(base.get("ffn_dim") or base["intermediate_size"])
        self.fc1, self.fc2 = _linear(d_in, ffn, "up" in has), _linear(ffn, d_out, "down" in has)
        self.act = activation(base.get("activation_function") or base.get("hidden_act", "gelu_new"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc2(self.act(self.fc1(x)))
        return out


def _shortcut(d_in: int, d_out: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(d_in, d_out), requires_grad=False)


class SlicedLayer(nn.Module):
    """One compressed decoder layer (see the module's docstring for the two kinds)."""

    def __init__(self, config: SlicedConfig, i: int, w: Widths) -> None:
        super().__init__()
        arch, hidden, eps = config.sliced_arch, int(config.sliced_base["hidden_size"]), config.sliced_norm_eps
        self.parallel = arch == "phi"
        self.mlp: nn.Module
        d_in, d_attn, d_mlp = w.d_in[i], (w.d_mlp[i] if self.parallel else w.d_attn[i]), w.d_mlp[i]
        self.self_attn = Attention(config, i, d_in, d_attn)
        self.attn_shortcut_Q = _shortcut(d_in, d_attn)
        if self.parallel:
            self.input_layernorm, self.mlp = RMSN(hidden, eps), FC(config, d_in, d_mlp)
            return
        self.mlp_shortcut_Q = _shortcut(d_attn, d_mlp)
        if arch == "opt":
            self.self_attn_layer_norm, self.final_layer_norm = RMSN(hidden, eps), RMSN(hidden, eps)
            fc = FC(config, d_attn, d_mlp)
            self.fc1, self.fc2, self.act = fc.fc1, fc.fc2, fc.act
        else:
            self.input_layernorm, self.post_attention_layernorm = RMSN(hidden, eps), RMSN(hidden, eps)
            self.mlp = GatedMLP(config, d_attn, d_mlp)

    def _norms(self) -> tuple[nn.Module, nn.Module]:
        if hasattr(self, "self_attn_layer_norm"):
            return self.self_attn_layer_norm, self.final_layer_norm
        return self.input_layernorm, getattr(self, "post_attention_layernorm", self.input_layernorm)

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(self, "fc1"):
            out: torch.Tensor = self.fc2(self.act(self.fc1(x)))
            return out
        result: torch.Tensor = self.mlp(x)
        return result

    def forward(self, x: torch.Tensor, positions: torch.Tensor, mask: Optional[torch.Tensor], cache: Any) -> torch.Tensor:
        norm1, norm2 = self._norms()
        if self.parallel:
            n = norm1(x)
            y: torch.Tensor = x @ self.attn_shortcut_Q.to(x.dtype) + self.self_attn(n, positions, mask, cache) + self._mlp(n)
            return y
        h = x @ self.attn_shortcut_Q.to(x.dtype) + self.self_attn(norm1(x), positions, mask, cache)
        out: torch.Tensor = h @ self.mlp_shortcut_Q.to(h.dtype) + self._mlp(norm2(h))
        return out


class SlicedDecoder(nn.Module):
    """Embedding (OPT: and learned positions), the layers and the final norm."""

    def __init__(self, config: SlicedConfig) -> None:
        super().__init__()
        base, w = config.sliced_base, Widths(config)
        self.embed_tokens = nn.Embedding(int(base["vocab_size"]), w.emb)
        if config.sliced_arch == "opt":  # OPT's learned positions start at 2
            self.embed_positions = nn.Embedding(int(base["max_position_embeddings"]) + 2, w.emb)
        self.layers = nn.ModuleList(SlicedLayer(config, i, w) for i in range(int(base["num_hidden_layers"])))
        norm = RMSN(int(base["hidden_size"]), config.sliced_norm_eps)
        self.final_norm_name = {"opt": "final_layer_norm", "phi": "final_layernorm"}.get(str(config.sliced_arch), "norm")
        setattr(self, self.final_norm_name, norm)


class SlicedPreTrainedModel(PreTrainedModel):  # type: ignore[misc]
    config_class = SlicedConfig
    base_model_prefix = "model"
    _no_split_modules = ["SlicedLayer"]
    _supports_cache_class = True
    _supports_sdpa = True
    supports_gradient_checkpointing = False

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.data.normal_(mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                module.bias.data.zero_()


class SlicedForCausalLM(SlicedPreTrainedModel, GenerationMixin):  # type: ignore[misc]
    """A sliced model with its head: runs forward, generate() (with transformers' cache) and
    save_pretrained like any causal LM."""

    def __init__(self, config: SlicedConfig) -> None:
        super().__init__(config)
        if config.sliced_arch not in ARCHS:
            raise ValueError(f"config.json's sliced_arch {config.sliced_arch!r} is not one of {ARCHS}")
        decoder = SlicedDecoder(config)
        if config.sliced_arch == "opt":  # model.decoder.*, as OPT names its tensors
            self.model = nn.Module()
            self.model.decoder = decoder
        else:
            self.model = decoder
        vocab, head = int(config.sliced_base["vocab_size"]), Widths(config).head
        self.lm_head = nn.Linear(head, vocab, bias="head" in config.sliced_biases)
        self.post_init()

    @property
    def decoder(self) -> SlicedDecoder:
        d = self.model.decoder if self.config.sliced_arch == "opt" else self.model
        assert isinstance(d, SlicedDecoder)
        return d

    def get_input_embeddings(self) -> nn.Module:
        return self.decoder.embed_tokens

    def set_input_embeddings(self, value: nn.Module) -> None:
        assert isinstance(value, nn.Embedding)
        self.decoder.embed_tokens = value

    def get_output_embeddings(self) -> nn.Module:
        head: nn.Module = self.lm_head
        return head

    def forward(self, input_ids: Optional[torch.Tensor] = None, attention_mask: Optional[torch.Tensor] = None,
                position_ids: Optional[torch.Tensor] = None, past_key_values: Any = None, inputs_embeds: Optional[torch.Tensor] = None,
                labels: Optional[torch.Tensor] = None, use_cache: Optional[bool] = None, return_dict: Optional[bool] = None,
                output_hidden_states: Optional[bool] = None, output_attentions: Optional[bool] = None, **kwargs: Any) -> Any:
        """transformers' causal-LM forward. hidden_states (output_hidden_states) are each layer's
        input and then the final norm's output, as transformers' Llama gives them, but in the
        sliced, rotated residual basis (width d, not the original hidden size). Attention
        weights are not available (the attention runs fused): output_attentions=True is refused."""
        if output_attentions if output_attentions is not None else getattr(self.config, "output_attentions", False):
            raise ValueError("output_attentions is not supported by bbformat's sliced models (the attention runs fused)")
        if output_hidden_states is None:
            output_hidden_states = bool(getattr(self.config, "output_hidden_states", False))
        dec = self.decoder
        cache = past_key_values if past_key_values is not None else kwargs.get("cache")
        if use_cache is None:
            use_cache = bool(getattr(self.config, "use_cache", True))
        if cache is None and use_cache:
            from transformers import DynamicCache

            cache = DynamicCache()
        x = dec.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        b, t = x.shape[:2]
        past = cache.get_seq_length() if cache is not None else 0
        if position_ids is None:
            position_ids = _positions(attention_mask, past, t, b, x.device, self.config.sliced_arch == "opt")
        if self.config.sliced_arch == "opt":
            x = x + dec.embed_positions(position_ids + 2).to(x.dtype)
        mask = _mask(attention_mask, past, t, b, x.device, self.config.sliced_window)
        hidden: list[torch.Tensor] = []
        for layer in dec.layers:
            if output_hidden_states:
                hidden.append(x)
            x = layer(x, position_ids, mask, cache)
        x = getattr(dec, dec.final_norm_name)(x)
        logits = self.lm_head(x)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100)
        out = CausalLMOutputWithPast(loss=loss, logits=logits, hidden_states=(*hidden, x) if output_hidden_states else None,
                                     **{CACHE: cache if use_cache else None})
        return out if return_dict is not False else out.to_tuple()

    def prepare_inputs_for_generation(self, input_ids: torch.Tensor, past_key_values: Any = None,
                                      attention_mask: Optional[torch.Tensor] = None, inputs_embeds: Optional[torch.Tensor] = None,
                                      **kwargs: Any) -> dict[str, Any]:
        """The new tokens only (the cache holds the rest), positions counted from the mask."""
        cache = past_key_values if past_key_values is not None else kwargs.get("cache")
        past = cache.get_seq_length() if cache is not None else 0
        inputs: dict[str, Any] = {}
        if inputs_embeds is not None and past == 0:
            inputs["inputs_embeds"] = inputs_embeds
            t = int(inputs_embeds.shape[1])
        else:
            # the tokens the cache lacks: 5.x says how many; else the mask's length less the cache's
            # (input_ids may hold only the generated tokens, after a prompt given as embeddings)
            t = kwargs.get("next_sequence_length") or 0
            if not t:
                t = (attention_mask.shape[1] if attention_mask is not None else input_ids.shape[1]) - past
            t = max(1, min(int(t), int(input_ids.shape[1])))
            inputs["input_ids"] = input_ids[:, -t:]
        position_ids = None if attention_mask is None else _mask_positions(attention_mask, t)
        inputs.update({CACHE: cache, "attention_mask": attention_mask, "position_ids": position_ids,
                       "use_cache": kwargs.get("use_cache", True)})
        return inputs


def _positions(attention_mask: Optional[torch.Tensor], past: int, t: int, b: int, device: torch.device, from_mask: bool) -> torch.Tensor:
    """Positions of the new tokens: from the padding mask where given (OPT's rule), else past .. past + t - 1."""
    if from_mask and attention_mask is not None:
        return _mask_positions(attention_mask, t)
    return torch.arange(past, past + t, device=device)[None].expand(b, t)


def _mask_positions(attention_mask: torch.Tensor, t: int) -> torch.Tensor:
    """The last t tokens' positions counted over the unpadded ones (left padding starts at 0)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, -t:]


def _mask(attention_mask: Optional[torch.Tensor], past: int, t: int, b: int, device: torch.device,
          window: Optional[int]) -> Optional[torch.Tensor]:
    """(B, 1, T, past + T) booleans: causal, padding keys hidden, and (window) query i sees keys
    i - window .. i only. A row with nothing to see (a padding query) sees itself. None where
    plain causal attention is the same: no padding, no window in reach, and no cache (or one
    new token)."""
    padded = attention_mask is not None and not bool(attention_mask[:, -(past + t):].all())
    if not padded and (window is None or past + t <= int(window) + 1) and (past == 0 or t == 1):
        return None
    q = torch.arange(past, past + t, device=device)[:, None]
    k = torch.arange(past + t, device=device)[None, :]
    seen = k <= q
    if window is not None:
        seen = seen & (q - k <= int(window))
    seen = seen[None, None].expand(b, 1, t, past + t)
    if attention_mask is not None:
        seen = seen & attention_mask[:, None, None, -(past + t):].bool()
    return seen | (~seen.any(-1, keepdim=True) & (k == q)[None, None])

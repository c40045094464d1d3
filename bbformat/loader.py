"""Build a torch model that runs a SliceGPT-sliced Llama, OPT, Phi-2 or Phi-3, and fill it from
a container block by block (never holding the decoded model twice).

The model is a transformers LlamaForCausalLM / OPTForCausalLM / PhiForCausalLM /
Phi3ForCausalLM whose decoder layers carry the shortcut matrices and parameter-free RMS
norms, as TransformerCompression's compressed layers do, so it runs `generate()`. Written
from the architecture, with no dependency on TransformerCompression.
"""
from __future__ import annotations

import base64
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator

import torch
from torch import nn

from .codec.dtypes import bits_of
from .errors import InputError, UnsupportedModelError

if TYPE_CHECKING:
    from .adapters.tc_layout import Checkpoint

RMSN_EPS = 1e-5


class RMSN(nn.Module):
    """Parameter-free RMS norm over the (possibly sliced) last dim, with the mean taken
    over the model's full hidden size (TransformerCompression's RMSN)."""

    def __init__(self, mean_dim: int, eps: float = RMSN_EPS) -> None:
        super().__init__()
        self.mean_dim = mean_dim
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        if dtype in (torch.float16, torch.bfloat16):
            x = x.float()
        var = x.pow(2).sum(-1, keepdim=True) / self.mean_dim
        return (x * torch.rsqrt(var + self.eps)).to(dtype)


def _linear(n_in: int, n_out: int, bias: bool) -> nn.Linear:
    return nn.Linear(n_in, n_out, bias=bias)


class SlicedLlamaDecoderLayer(nn.Module):
    """x -> x Q_att + attn(norm(x)) -> h Q_mlp + mlp(norm(h))."""

    def __init__(self, config: Any, layer_idx: int, d_in: int, d_attn: int, d_mlp: int) -> None:
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP

        self.self_attn = LlamaAttention(config, layer_idx)
        a = self.self_attn
        hd = a.head_dim
        bias = bool(getattr(config, "attention_bias", False))
        a.q_proj = _linear(d_in, config.num_attention_heads * hd, bias)
        a.k_proj = _linear(d_in, config.num_key_value_heads * hd, bias)
        a.v_proj = _linear(d_in, config.num_key_value_heads * hd, bias)
        a.o_proj = _linear(config.num_attention_heads * hd, d_attn, bias)
        self.mlp = LlamaMLP(config)
        mb = bool(getattr(config, "mlp_bias", False))
        self.mlp.gate_proj = _linear(d_attn, config.intermediate_size, mb)
        self.mlp.up_proj = _linear(d_attn, config.intermediate_size, mb)
        self.mlp.down_proj = _linear(config.intermediate_size, d_mlp, mb)
        self.input_layernorm = RMSN(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSN(config.hidden_size, config.rms_norm_eps)
        self.attn_shortcut_Q = nn.Parameter(torch.empty(d_in, d_attn), requires_grad=False)
        self.mlp_shortcut_Q = nn.Parameter(torch.empty(d_attn, d_mlp), requires_grad=False)

    def forward(self, hidden_states: torch.Tensor, attention_mask: Any = None, position_ids: Any = None,
                past_key_values: Any = None, use_cache: Any = False, position_embeddings: Any = None, **kwargs: Any) -> torch.Tensor:
        residual = hidden_states
        h, _ = self.self_attn(
            hidden_states=self.input_layernorm(hidden_states),
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            use_cache=use_cache,
            position_embeddings=position_embeddings,
            **kwargs,
        )
        h = torch.matmul(residual, self.attn_shortcut_Q.to(residual.dtype)) + h
        residual = h
        h = self.mlp(self.post_attention_layernorm(h))
        return torch.matmul(residual, self.mlp_shortcut_Q.to(residual.dtype)) + h


def _dims(sc: dict, key: str, i: int, default: int) -> int:
    d = sc.get(key) or {}
    return int(d.get(str(i), d.get(i, default)))  # type: ignore[call-overload]


def build_sliced_llama(hf_config: dict, slicing_config: dict, dtype: torch.dtype = torch.float32) -> nn.Module:
    """An empty (uninitialised) sliced Llama with the shapes of `slicing_config`."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    if hf_config.get("model_type") != "llama":
        raise UnsupportedModelError(f"load_model supports Llama models; this is {hf_config.get('model_type')!r}")
    cfg = {k: v for k, v in hf_config.items() if k != "quantization_config"}
    cfg["tie_word_embeddings"] = False
    config = LlamaConfig(**cfg)
    config._attn_implementation = "sdpa"
    hidden = config.hidden_size
    n = config.num_hidden_layers
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
        d_emb = _dims(slicing_config, "embedding_dimensions", 0, hidden)
        model.model.embed_tokens = nn.Embedding(config.vocab_size, d_emb)
        layers = []
        for i in range(n):
            d_in = _dims(slicing_config, "attention_input_dimensions", i, hidden)
            d_attn = _dims(slicing_config, "attention_output_dimensions", i, hidden)
            d_mlp = _dims(slicing_config, "mlp_output_dimensions", i, hidden)
            layers.append(SlicedLlamaDecoderLayer(config, i, d_in, d_attn, d_mlp))
        model.model.layers = nn.ModuleList(layers)
        model.model.norm = RMSN(hidden, config.rms_norm_eps)
        d_head = slicing_config.get("head_dimension") or hidden
        model.lm_head = nn.Linear(int(d_head), config.vocab_size, bias=False)
    model = nn.Module.to(model, dtype).to_empty(device="cpu")  # cast on meta: nothing is allocated twice
    model.model.rotary_emb = LlamaRotaryEmbedding(config=config)  # real buffers, not meta
    model.eval()
    model.requires_grad_(False)
    return model


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
        a.q_proj, a.k_proj, a.v_proj = (_linear(d_in, hidden, bias[w]) for w in ("q", "k", "v"))
        a.out_proj = _linear(hidden, d_attn, bias["o"])
        self.fc1 = _linear(d_attn, config.ffn_dim, bias["up"])
        self.fc2 = _linear(config.ffn_dim, d_mlp, bias["down"])
        self.activation_fn = ACT2FN[config.activation_function]
        self.self_attn_layer_norm = RMSN(hidden)
        self.final_layer_norm = RMSN(hidden)
        self.attn_shortcut_Q = nn.Parameter(torch.empty(d_in, d_attn), requires_grad=False)
        self.mlp_shortcut_Q = nn.Parameter(torch.empty(d_attn, d_mlp), requires_grad=False)

    def forward(self, hidden_states: torch.Tensor, attention_mask: Any = None, past_key_values: Any = None, use_cache: Any = False,
                position_ids: Any = None, **kwargs: Any) -> torch.Tensor:
        residual = hidden_states
        h, _ = self.self_attn(hidden_states=self.self_attn_layer_norm(hidden_states), past_key_values=past_key_values,
                              position_ids=position_ids, attention_mask=attention_mask, **kwargs)
        h = torch.matmul(residual, self.attn_shortcut_Q.to(residual.dtype)) + h
        m = self.fc2(self.activation_fn(self.fc1(self.final_layer_norm(h))))
        return torch.matmul(h, self.mlp_shortcut_Q.to(h.dtype)) + m


OPT_BIASES = {"q": "self_attn.q_proj.bias", "k": "self_attn.k_proj.bias", "v": "self_attn.v_proj.bias",
              "o": "self_attn.out_proj.bias", "up": "fc1.bias", "down": "fc2.bias"}


def build_sliced_opt(hf_config: dict, slicing_config: dict, dtype: torch.dtype = torch.float32,
                     names: Iterable[str] | None = None) -> nn.Module:
    """An empty sliced OPT with the shapes of `slicing_config`; a bias exists where `names`
    (the checkpoint's tensor names) has one (all of them when names is None)."""
    from transformers import OPTConfig, OPTForCausalLM
    from transformers.models.opt.modeling_opt import OPTLearnedPositionalEmbedding

    have = None if names is None else set(names)
    cfg = {k: v for k, v in hf_config.items() if k != "quantization_config"}
    cfg["tie_word_embeddings"] = False
    config = OPTConfig(**cfg)
    config._attn_implementation = "sdpa"
    hidden, n = config.hidden_size, config.num_hidden_layers
    with torch.device("meta"):
        model = OPTForCausalLM(config)
        dec = model.model.decoder
        d_emb = _dims(slicing_config, "embedding_dimensions", 0, hidden)
        dec.embed_tokens = nn.Embedding(config.vocab_size, d_emb)
        dec.embed_positions = OPTLearnedPositionalEmbedding(config.max_position_embeddings, d_emb)
        layers = []
        for i in range(n):
            p = f"model.decoder.layers.{i}."
            bias = {k: have is None or p + v in have for k, v in OPT_BIASES.items()}
            layers.append(SlicedOPTDecoderLayer(config, i, _dims(slicing_config, "attention_input_dimensions", i, hidden),
                                                _dims(slicing_config, "attention_output_dimensions", i, hidden),
                                                _dims(slicing_config, "mlp_output_dimensions", i, hidden), bias))
        dec.layers = nn.ModuleList(layers)
        dec.final_layer_norm = RMSN(hidden)
        d_head = slicing_config.get("head_dimension") or hidden
        model.lm_head = nn.Linear(int(d_head), config.vocab_size, bias=have is not None and "lm_head.bias" in have)
    model = nn.Module.to(model, dtype).to_empty(device="cpu")
    model.eval()
    model.requires_grad_(False)
    return model


class SlicedPhiDecoderLayer(nn.Module):
    """Phi-2's parallel block after slicing: y = x Q + dense(attn(n)) + fc2(gelu_new(fc1(n))),
    n = RMSN(x), with the one shortcut attn_shortcut_Q (d_in, d_out); biases everywhere."""

    def __init__(self, config: Any, layer_idx: int, d_in: int, d_out: int) -> None:
        super().__init__()
        from transformers.models.phi.modeling_phi import PhiAttention, PhiMLP

        self.self_attn = PhiAttention(config, layer_idx)
        a = self.self_attn
        hd, heads, kv = a.head_dim, config.num_attention_heads, config.num_key_value_heads
        a.q_proj, a.k_proj, a.v_proj = (_linear(d_in, n * hd, True) for n in (heads, kv, kv))
        a.dense = _linear(heads * hd, d_out, True)
        self.mlp = PhiMLP(config)
        self.mlp.fc1 = _linear(d_in, config.intermediate_size, True)
        self.mlp.fc2 = _linear(config.intermediate_size, d_out, True)
        self.input_layernorm = RMSN(config.hidden_size)
        self.attn_shortcut_Q = nn.Parameter(torch.empty(d_in, d_out), requires_grad=False)

    def forward(self, hidden_states: torch.Tensor, attention_mask: Any = None, position_ids: Any = None,
                past_key_values: Any = None, use_cache: Any = False, position_embeddings: Any = None, **kwargs: Any) -> torch.Tensor:
        n = self.input_layernorm(hidden_states)
        a, _ = self.self_attn(hidden_states=n, attention_mask=attention_mask, position_ids=position_ids,
                              past_key_values=past_key_values, use_cache=use_cache, position_embeddings=position_embeddings, **kwargs)
        return a + self.mlp(n) + torch.matmul(hidden_states, self.attn_shortcut_Q.to(hidden_states.dtype))


def _config(cls: Any, hf_config: dict) -> Any:
    """A transformers config from config.json, untied (TC unties the head), sdpa attention."""
    cfg = {k: v for k, v in hf_config.items() if k != "quantization_config"}
    cfg["tie_word_embeddings"] = False
    config = cls(**cfg)
    config._attn_implementation = "sdpa"
    return config


def _finish(model: nn.Module, dtype: torch.dtype, rotary: Any) -> nn.Module:
    """Allocate a model built on the meta device (cast first: nothing is allocated twice);
    `rotary()` makes the rotary embedding with real buffers."""
    model = nn.Module.to(model, dtype).to_empty(device="cpu")
    model.get_submodule("model").rotary_emb = rotary()
    model.eval()
    model.requires_grad_(False)
    return model


def build_sliced_phi(hf_config: dict, slicing_config: dict, dtype: torch.dtype = torch.float32) -> nn.Module:
    """An empty sliced Phi-2 (PhiForCausalLM) with the widths of `slicing_config`: one output
    width per layer (mlp_output_dimensions), parameter-free norms, the head with its bias."""
    from transformers import PhiConfig, PhiForCausalLM
    from transformers.models.phi.modeling_phi import PhiRotaryEmbedding

    if hf_config.get("qk_layernorm"):
        raise UnsupportedModelError("Phi models with qk_layernorm=true are not supported")
    config = _config(PhiConfig, hf_config)
    hidden = config.hidden_size
    with torch.device("meta"):
        model = PhiForCausalLM(config)
        model.model.embed_tokens = nn.Embedding(config.vocab_size, _dims(slicing_config, "embedding_dimensions", 0, hidden))
        model.model.layers = nn.ModuleList(
            SlicedPhiDecoderLayer(config, i, _dims(slicing_config, "attention_input_dimensions", i, hidden),
                                  _dims(slicing_config, "mlp_output_dimensions", i, hidden))
            for i in range(config.num_hidden_layers))
        model.model.final_layernorm = RMSN(hidden)
        model.lm_head = nn.Linear(int(slicing_config.get("head_dimension") or hidden), config.vocab_size, bias=True)
    return _finish(model, dtype, lambda: PhiRotaryEmbedding(config=config))


class SlicedPhi3DecoderLayer(nn.Module):
    """Phi-3's layer after slicing (Llama's, with fused qkv_proj and gate_up_proj):
    x -> x Q_att + o_proj(attn(norm(x))) -> h Q_mlp + down_proj(mlp(norm(h)))."""

    def __init__(self, config: Any, layer_idx: int, d_in: int, d_attn: int, d_mlp: int) -> None:
        super().__init__()
        from transformers.models.phi3.modeling_phi3 import Phi3Attention, Phi3MLP

        self.self_attn = Phi3Attention(config, layer_idx)
        a = self.self_attn
        hd, heads, kv = a.head_dim, config.num_attention_heads, config.num_key_value_heads
        a.qkv_proj = _linear(d_in, (heads + 2 * kv) * hd, False)
        a.o_proj = _linear(heads * hd, d_attn, False)
        self.mlp = Phi3MLP(config)
        self.mlp.gate_up_proj = _linear(d_attn, 2 * config.intermediate_size, False)
        self.mlp.down_proj = _linear(config.intermediate_size, d_mlp, False)
        self.input_layernorm = RMSN(config.hidden_size)
        self.post_attention_layernorm = RMSN(config.hidden_size)
        self.attn_shortcut_Q = nn.Parameter(torch.empty(d_in, d_attn), requires_grad=False)
        self.mlp_shortcut_Q = nn.Parameter(torch.empty(d_attn, d_mlp), requires_grad=False)

    forward = SlicedLlamaDecoderLayer.forward  # the same attributes, the same computation


def build_sliced_phi3(hf_config: dict, slicing_config: dict, dtype: torch.dtype = torch.float32) -> nn.Module:
    """An empty sliced Phi-3 (Phi3ForCausalLM) with the widths of `slicing_config`.

    The sliding window is widened by one: transformers 4.41 (which TransformerCompression
    pins) and flash-attn's window_size let query i see keys i - sliding_window .. i, newer
    transformers only i - sliding_window + 1 .. i; this keeps 4.41's (and the model's) mask."""
    from transformers import Phi3Config, Phi3ForCausalLM
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

    window = hf_config.get("sliding_window")
    config = _config(Phi3Config, dict(hf_config, sliding_window=None if window is None else int(window) + 1))
    hidden = config.hidden_size
    with torch.device("meta"):
        model = Phi3ForCausalLM(config)
        model.model.embed_tokens = nn.Embedding(config.vocab_size, _dims(slicing_config, "embedding_dimensions", 0, hidden))
        model.model.layers = nn.ModuleList(
            SlicedPhi3DecoderLayer(config, i, _dims(slicing_config, "attention_input_dimensions", i, hidden),
                                   _dims(slicing_config, "attention_output_dimensions", i, hidden),
                                   _dims(slicing_config, "mlp_output_dimensions", i, hidden))
            for i in range(config.num_hidden_layers))
        model.model.norm = RMSN(hidden)
        model.lm_head = nn.Linear(int(slicing_config.get("head_dimension") or hidden), config.vocab_size, bias=False)
    return _finish(model, dtype, lambda: Phi3RotaryEmbedding(config=config))


def build_sliced(hf_config: dict, slicing_config: dict, dtype: torch.dtype, names: Iterable[str] | None = None) -> nn.Module:
    """The sliced model for config.json's model_type: every architecture pack accepts."""
    kind = hf_config.get("model_type")
    if kind == "llama":
        return build_sliced_llama(hf_config, slicing_config, dtype)
    if kind == "opt":
        return build_sliced_opt(hf_config, slicing_config, dtype, names)
    if kind == "phi":
        return build_sliced_phi(hf_config, slicing_config, dtype)
    if kind == "phi3":
        return build_sliced_phi3(hf_config, slicing_config, dtype)
    raise UnsupportedModelError(f"load_model supports llama, opt, phi (Phi-2) and phi3 models; this is {kind!r}")


def _fill(model: nn.Module, tensors: Iterable[tuple[str, torch.Tensor]], expected: set[str]) -> None:
    params = dict(model.named_parameters())
    for name, t in tensors:
        if name not in params and ("norm" in name or name.endswith("inv_freq")):
            continue  # identity norm weights / derived buffers the adapters tolerate
        if name not in params:
            raise InputError(f"checkpoint tensor {name!r} has no place in the model")
        p = params[name]
        if tuple(p.shape) != tuple(t.shape):
            raise InputError(f"{name}: shape {tuple(t.shape)} does not match the model's {tuple(p.shape)}")
        with torch.no_grad():
            p.copy_(t)  # converts to the model's dtype in the same pass
        expected.discard(name)


def load_model(path: str | os.PathLike[str], dtype: torch.dtype | None = None, *, max_block_bytes: int | str | None = "auto",
               max_site_dim: int | None = None, workers: int | None = None, allow_inexact: bool = False) -> nn.Module:
    """A runnable torch model from a .bb container or a sliced checkpoint directory.

    dtype: the model's parameter dtype; None (the default) takes the checkpoint's own (the
    dtype most of its bytes are in), so a float16 7B model is not doubled to float32.
    Containers are decoded one block at a time straight into the model's parameters (peak
    memory: the model and about `workers` + 1 blocks); max_block_bytes and max_site_dim bound
    each block's memory and decode time (Reader, SPEC.md 11.5). A block whose decoded values
    miss its digest (format 1.2) raises DigestError, unless allow_inexact (then an
    InexactWarning names the blocks).
    """
    from .api import InexactBlocks
    from .adapters.tc_layout import read_checkpoint
    from .reader import DecodedBlock, Reader, decode_workers
    from .tensors import raw_to_torch, torch_dtype

    p = Path(path)
    if p.is_file() and p.suffix == ".bb":
        inexact = InexactBlocks(p)
        with Reader(p, max_block_bytes=max_block_bytes, max_site_dim=max_site_dim, allow_inexact=allow_inexact) as r:
            files = {k: base64.b64decode(v) for k, v in r.metadata.get("files", {}).items()}
            stem = r.metadata.get("stem", "model")
            hf = json.loads(files["config.json"])
            sc = json.loads(files[f"{stem}.json"])
            entries = r.tensor_entries()
            if dtype is None:
                dtype = torch_dtype(_dominant((e.dtype, e.numel * bits_of(e.dtype)) for e in entries.values()))
            # The model is built on a thread of its own while the first blocks decode.
            with ThreadPoolExecutor(1, thread_name_prefix="bbformat-build") as ex:
                built = ex.submit(build_sliced, hf, sc, dtype, list(entries))
                blocks = r.iter_blocks("reverse", workers=decode_workers(workers))
                first = next(blocks, None)
                model = built.result()
                expected = {n for n, _ in model.named_parameters()}

                def fill(block: DecodedBlock) -> None:
                    inexact.see(block)
                    _fill(model, ((n, raw_to_torch(t, copy=False)) for n, t in block.tensors.items()), expected)

                if first is not None:
                    fill(first)
                    del first
                for block in blocks:
                    fill(block)
                    del block
        inexact.warn()
    else:
        with read_checkpoint(p) as ckpt:
            sd = ckpt.state_dict
            if dtype is None:
                dtype = _dominant((t.dtype, t.numel() * t.element_size()) for t in sd.values())
            model = build_sliced(ckpt.hf_config, ckpt.slicing_config, dtype, list(sd))
            expected = {n for n, _ in model.named_parameters()}
            _fill(model, _released(ckpt), expected)
    if expected:
        raise InputError(f"checkpoint lacks {len(expected)} model tensors, e.g. {sorted(expected)[:3]}")
    return model


def _released(ckpt: Checkpoint) -> Iterator[tuple[str, torch.Tensor]]:
    """A checkpoint's tensors one at a time, each one's mapped pages released once it is used."""
    for name, t in ckpt.state_dict.items():
        yield name, t
        ckpt.release(name)


def _dominant(sizes: Iterable[tuple[Any, int]]) -> Any:
    """The dtype most bytes are in (ties: the first met); float32 for an empty model."""
    total: dict[Any, int] = {}
    for dt, n in sizes:
        total[dt] = total.get(dt, 0) + n
    return max(total, key=lambda k: total[k]) if total else torch.float32

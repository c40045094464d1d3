"""What the torch models of every architecture share (load_model's, and calibration's Llama):
TransformerCompression's parameter-free RMSN, the sliced widths, a transformers config from
config.json, and allocating a model built on the meta device. Imports torch; transformers
is imported by the per-architecture builders when they run."""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from ..errors import InputError

RMSN_EPS = 1e-5
HF_EXTRA = "pip install 'bbformat[hf]'"
"""How to get what load_model's models (and calibrated rounding) need: pyproject's `hf` extra."""


def require_transformers(what: str) -> None:
    """InputError, one line naming the `hf` extra, if transformers cannot be imported."""
    try:
        import transformers  # noqa: F401
    except ImportError as exc:
        missing = getattr(exc, "name", None)
        why = "is not installed" if missing and missing.split(".")[0] == "transformers" else \
            f"cannot be imported ({str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__})"
        raise InputError(f"{what} needs the 'transformers' package, which {why}: {HF_EXTRA}") from None


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


def linear(n_in: int, n_out: int, bias: bool) -> nn.Linear:
    return nn.Linear(n_in, n_out, bias=bias)


def shortcut(d_in: int, d_out: int) -> nn.Parameter:
    """An (uninitialised) shortcut matrix Q of a compressed layer: x -> x Q."""
    return nn.Parameter(torch.empty(d_in, d_out), requires_grad=False)


def width(slicing_config: dict[str, Any], key: str, i: int, default: int) -> int:
    """Entry i of a SlicingConfig dimension map (JSON's "0" keys or int keys), else `default`."""
    d = slicing_config.get(key) or {}
    return int(d.get(str(i), d.get(i, default)))


def head_width(slicing_config: dict[str, Any], hidden: int) -> int:
    return int(slicing_config.get("head_dimension") or hidden)


# (layer index, attention input width, attention output width, mlp output width) -> the layer
LayerFactory = Callable[[int, int, int, int], nn.Module]


def slice_decoder(model: nn.Module, config: Any, slicing_config: dict[str, Any], layer: LayerFactory,
                  final_norm: str, head_bias: bool, norm_eps: float = RMSN_EPS) -> None:
    """Give a decoder-only model built on the meta device (transformers' `model.model.*` and
    `lm_head`) the sliced embedding, layers and head of `slicing_config`, and TC's RMSN as the
    final norm (attribute `final_norm`)."""
    hidden = config.hidden_size
    inner = model.get_submodule("model")
    inner.embed_tokens = nn.Embedding(config.vocab_size, width(slicing_config, "embedding_dimensions", 0, hidden))
    inner.layers = nn.ModuleList(
        layer(i, width(slicing_config, "attention_input_dimensions", i, hidden),
              width(slicing_config, "attention_output_dimensions", i, hidden),
              width(slicing_config, "mlp_output_dimensions", i, hidden))
        for i in range(config.num_hidden_layers))
    setattr(inner, final_norm, RMSN(hidden, norm_eps))
    model.lm_head = nn.Linear(head_width(slicing_config, hidden), config.vocab_size, bias=head_bias)


def hf_config(cls: Any, config_json: dict[str, Any]) -> Any:
    """A transformers config from config.json, untied (TC unties the head), sdpa attention."""
    cfg = {k: v for k, v in config_json.items() if k != "quantization_config"}
    cfg["tie_word_embeddings"] = False
    config = cls(**cfg)
    config._attn_implementation = "sdpa"
    return config


def finish(model: nn.Module, dtype: torch.dtype, rotary: Callable[[], nn.Module] | None = None,
           device: torch.device | str = "cpu") -> nn.Module:
    """Allocate a model built on the meta device on `device` (cast first: nothing is allocated
    twice, nor on the host for another device); `rotary()`, if given, makes the rotary
    embedding with real buffers there. Evaluation mode, no grads."""
    model = nn.Module.to(model, dtype).to_empty(device=device)
    if rotary is not None:
        with torch.device(device):
            model.get_submodule("model").rotary_emb = rotary()
    model.eval()
    model.requires_grad_(False)
    return model

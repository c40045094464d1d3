"""What the torch models of every architecture share (load_model's, and calibration's Llama):
TransformerCompression's parameter-free RMSN, the sliced widths, a transformers config from
config.json, and allocating a model built on the meta device. Imports torch; transformers
is imported by the per-architecture builders when they run."""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

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


def hf_config(cls: Any, config_json: dict[str, Any]) -> Any:
    """A transformers config from config.json, untied (TC unties the head), sdpa attention."""
    cfg = {k: v for k, v in config_json.items() if k != "quantization_config"}
    cfg["tie_word_embeddings"] = False
    config = cls(**cfg)
    config._attn_implementation = "sdpa"
    return config


def finish(model: nn.Module, dtype: torch.dtype, rotary: Callable[[], nn.Module] | None = None) -> nn.Module:
    """Allocate a model built on the meta device (cast first: nothing is allocated twice);
    `rotary()`, if given, makes the rotary embedding with real buffers. Evaluation mode, no grads."""
    model = nn.Module.to(model, dtype).to_empty(device="cpu")
    if rotary is not None:
        model.get_submodule("model").rotary_emb = rotary()
    model.eval()
    model.requires_grad_(False)
    return model

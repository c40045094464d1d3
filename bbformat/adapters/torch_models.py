"""The torch model of every architecture (load_model's, and calibration's): hf_modeling's
SlicedForCausalLM, the same code `unpack --format hf` writes into its directories, so a
model from load_model and one from from_pretrained are the same model. Imports torch and
(through hf_modeling) transformers; the adapters `<arch>.py` name the tensors and plan the
chunks but never build a model (so pack, unpack and the planners never import transformers)."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from ..errors import InputError, UnsupportedModelError
from . import PLANNERS
from .sliced_config import sliced_fields

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


def build_model(config_json: dict[str, Any], slicing_config: dict[str, Any], dtype: torch.dtype = torch.float32,
                names: Iterable[str] | None = None, device: torch.device | str = "cpu", stem: str = "model") -> nn.Module:
    """The empty (uninitialised) sliced model for config.json's model_type, with the widths of
    `slicing_config`, its parameters allocated on `device` in `dtype` (built on the meta
    device first: nothing is allocated twice); `names` (the checkpoint's tensor names)
    decides which optional biases exist. Evaluation mode, no grads. Its save_pretrained
    writes a directory like `unpack --format hf`'s (the modeling file, as hf_modeling.py, an
    auto_map, `stem` as sliced_stem), which from_pretrained and pack read."""
    kind = config_json.get("model_type")
    if not isinstance(kind, str) or kind not in PLANNERS:
        raise UnsupportedModelError(f"load_model supports llama, opt, phi (Phi-2) and phi3 models; this is {kind!r}")
    from .hf_modeling import SlicedConfig, SlicedForCausalLM

    config = SlicedConfig(**sliced_fields(config_json, slicing_config, names), sliced_stem=stem)
    SlicedConfig.register_for_auto_class()  # save_pretrained: auto_map and the modeling file
    SlicedForCausalLM.register_for_auto_class("AutoModelForCausalLM")
    with torch.device("meta"):
        model = SlicedForCausalLM(config)
    built: nn.Module = nn.Module.to(model, dtype).to_empty(device=device)
    nn.Module.eval(built)
    built.requires_grad_(False)
    return built

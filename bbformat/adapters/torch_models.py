"""The torch model of each architecture, by config.json's model_type (load_model's): an empty
sliced model for loader.fill_model to fill. Each lives in `<arch>_torch.py`, beside the
adapter `<arch>.py` that names its tensors and plans its chunks but never builds a model
(so pack, unpack and the planners never import transformers)."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from ..errors import UnsupportedModelError
from . import llama_torch, opt_torch, phi2_torch, phi3_torch

Builder = Callable[[dict[str, Any], dict[str, Any], torch.dtype, Iterable[str] | None, torch.device | str], nn.Module]
# the same keys as adapters.PLANNERS: every architecture pack accepts
BUILDERS: dict[str, Builder] = {
    "llama": llama_torch.build_model, "opt": opt_torch.build_model, "phi": phi2_torch.build_model, "phi3": phi3_torch.build_model,
}


def build_model(config_json: dict[str, Any], slicing_config: dict[str, Any], dtype: torch.dtype,
                names: Iterable[str] | None = None, device: torch.device | str = "cpu") -> nn.Module:
    """The empty sliced model for config.json's model_type, with the widths of `slicing_config`,
    its parameters allocated on `device`; `names` (the checkpoint's tensor names) decides which
    optional biases exist."""
    kind = config_json.get("model_type")
    build = BUILDERS.get(kind) if isinstance(kind, str) else None
    if build is None:
        raise UnsupportedModelError(f"load_model supports llama, opt, phi (Phi-2) and phi3 models; this is {kind!r}")
    return build(config_json, slicing_config, dtype, names, device)

"""Architectures: turn a checkpoint into a ModelLayout (chunks, tensors, rotation sites)."""
from __future__ import annotations

from typing import Any, Callable

from ..checkpoint import Checkpoint
from ..codec.layout import ModelLayout
from ..constants import ROTATION_SCHEMES
from ..errors import UnsupportedModelError, check_choice
from . import llama, opt, phi2, phi3

PLANNERS: dict[str, Callable[[Checkpoint, str], ModelLayout]] = {
    "llama": llama.plan, "opt": opt.plan, "phi": phi2.plan, "phi3": phi3.plan,
}


def detect(hf_config: dict[str, Any]) -> str:
    """config.json's model_type ('llama', 'opt', 'phi' for Phi-2, 'phi3'); anything else is refused."""
    mt = hf_config.get("model_type") if isinstance(hf_config, dict) else None
    if isinstance(mt, str) and mt in PLANNERS:
        return mt
    raise UnsupportedModelError(f"unsupported architecture {mt!r} (supported: {', '.join(sorted(PLANNERS))})")


def plan(ckpt: Checkpoint, scheme: str) -> ModelLayout:
    """Validate the checkpoint against its configs and lay it out for `scheme`."""
    check_choice("scheme", scheme, ROTATION_SCHEMES)
    return PLANNERS[detect(ckpt.hf_config)](ckpt, scheme)


__all__ = ["Checkpoint", "detect", "plan"]

"""Stock transformers models for plain containers (load_model): the class config.json names,
built as transformers 5's from_pretrained builds it (parameters on the meta device), then
filled tensor by tensor as blocks decode, tied, its buffers made as from_pretrained makes
them. Never runs a model's own code (an `auto_map` is refused). Imports torch; transformers
when a model is built."""
from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn

from ..errors import InputError, UnsupportedModelError

PLAIN_KEY = "directory"
"""The metadata key that marks a plain container (a Hugging Face directory, packed as is)."""

_CONFIG_DTYPE_KEYS = ("dtype", "torch_dtype")  # transformers 5 writes the first, 4.x the second


def is_plain(metadata: dict[str, Any]) -> bool:
    """Whether a container's metadata describes a plain directory (else: a sliced checkpoint)."""
    return PLAIN_KEY in metadata


def stock_class(config_json: dict[str, Any]) -> tuple[type[Any], Any]:
    """The transformers model class config.json's architectures[0] names, and its config.
    UnsupportedModelError for custom code (auto_map), no architecture, or one transformers
    lacks; InputError for a config the class's config cannot be made from."""
    import transformers

    if "auto_map" in config_json:
        raise UnsupportedModelError("config.json has an auto_map (the model's own code); load_model builds only "
                                    "transformers' classes and never runs code from a container")
    archs = config_json.get("architectures")
    name = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    if name is None:
        raise UnsupportedModelError("config.json names no model class (architectures[0])")
    cls = _transformers_class(transformers, name)
    if cls is None:
        raise UnsupportedModelError(f"config.json names the model class {name!r}, which transformers "
                                    f"{transformers.__version__} does not have")
    try:
        config = cls.config_class.from_dict(config_json)
    except Exception as exc:  # a config class's own checks: ValueError, TypeError, KeyError ...
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"config.json does not make a {cls.config_class.__name__}: {why}") from None
    return cls, config


def _transformers_class(transformers: Any, name: str) -> type[Any] | None:
    """transformers.<name> if it is a PreTrainedModel class, else None (a lazy attribute that
    fails to import counts as missing)."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        return None
    try:
        cls = getattr(transformers, name, None)
    except (ImportError, RuntimeError):
        return None
    return cls if isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel) else None


def config_dtype(config_json: dict[str, Any]) -> torch.dtype | None:
    """The floating dtype config.json records (what from_pretrained's dtype="auto" takes), or None."""
    for key in _CONFIG_DTYPE_KEYS:
        value = config_json.get(key)
        dtype = getattr(torch, value, None) if isinstance(value, str) and value.isidentifier() else None
        if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
            return dtype
    return None


def build_empty(cls: type[Any], config: Any, dtype: torch.dtype) -> nn.Module:
    """The model with every parameter and buffer on the meta device, in `dtype`, built in the
    contexts from_pretrained builds it in (default dtype, no tying, meta device)."""
    from transformers.utils import ContextManagers

    config.dtype = dtype  # as from_pretrained records it
    with ContextManagers(cls.get_init_context(dtype, False, False, None)):
        model: nn.Module = cls(config)
    return model


def tied_names(model: nn.Module, slots: dict[str, tuple[nn.Module, str, bool]]) -> set[str]:
    """The names, both sides, of what the model ties (finish's tie_weights): transformers'
    all_tied_weights_keys (built untied, the two are separate objects until then), and any
    object already under two names."""
    keys = getattr(model, "all_tied_weights_keys", None)
    out = {str(n) for pair in keys.items() for n in pair} if isinstance(keys, dict) else set()
    names: dict[int, list[str]] = {}
    for slot, (module, attr, _) in slots.items():
        names.setdefault(id(getattr(module, attr)), []).append(slot)
    return out | {n for group in names.values() if len(group) > 1 for n in group}


class StockFiller:
    """Puts decoded tensors into an empty stock model (build_empty) on `device`, one at a
    time, each a copy of its own in the model's dtype (or the caller's tensor itself: put's
    adopt); finish() ties, checks and makes the buffers. A name with a "/" is a tensor of
    another file of the directory (a subfolder's weights), not the model's, and is passed over."""

    def __init__(self, model: nn.Module, device: torch.device) -> None:
        self.model, self.device = model, device
        self.slots: dict[str, tuple[nn.Module, str, bool]] = {}
        self.derived: set[str] = set()  # non-persistent buffers: made by finish(), never loaded
        persistent = set(model.state_dict())
        for mod_name, module in model.named_modules():
            prefix = f"{mod_name}." if mod_name else ""
            for attr, _ in module.named_parameters(recurse=False):
                self.slots[prefix + attr] = (module, attr, True)
            for attr, _ in module.named_buffers(recurse=False):
                if prefix + attr in persistent:
                    self.slots[prefix + attr] = (module, attr, False)
                else:
                    self.derived.add(prefix + attr)
        self.base = getattr(model, "base_model_prefix", "") or ""
        self.tied = tied_names(model, self.slots)

    def _slot_name(self, name: str) -> str | None:
        """The model's name for a checkpoint name: itself, or with the base model's prefix
        added or removed (a head's checkpoint saved from the base model, or the reverse), as
        from_pretrained matches them."""
        candidates = [name]
        if self.base:
            candidates += [f"{self.base}.{name}", name.removeprefix(f"{self.base}.")]
        return next((c for c in candidates if c in self.slots), None)

    def keeps_as_is(self, name: str, dtype: torch.dtype) -> bool:
        """Whether put(name, t, adopt=True) would make a tensor of `dtype` the model's own
        without a copy: a CPU model whose one parameter or buffer of that name (not one the
        model ties to another name) is of that dtype."""
        slot = None if "/" in name else self._slot_name(name)
        if slot is None or self.device.type != "cpu":
            return False
        module, attr, _ = self.slots[slot]
        return getattr(module, attr).dtype == dtype and slot not in self.tied

    def put(self, name: str, t: torch.Tensor, adopt: bool = False) -> None:
        """Place tensor `name`, a copy of `t`, or `t` itself where adopt and keeps_as_is (the
        caller then gives `t` up); InputError for a name the model lacks or a shape it does not
        have."""
        if "/" in name:
            return
        slot = self._slot_name(name)
        if slot is None:
            if name in self.derived:
                return  # an old checkpoint's copy of a derived buffer (inv_freq, position_ids): made, not loaded
            raise InputError(f"checkpoint tensor {name!r} has no place in the {type(self.model).__name__} model")
        module, attr, is_param = self.slots[slot]
        old = getattr(module, attr)
        if tuple(old.shape) != tuple(t.shape):
            raise InputError(f"{name}: shape {tuple(t.shape)} does not match the model's {tuple(old.shape)}")
        cast = old.dtype if t.is_floating_point() and old.is_floating_point() else None
        keep = adopt and self.keeps_as_is(name, t.dtype)
        value = t if keep else t.to(device=self.device, dtype=cast, copy=True)
        if is_param:
            value = nn.Parameter(value, requires_grad=old.requires_grad)
        value._is_hf_initialized = True  # type: ignore[attr-defined]  # transformers' mark: loaded, not to be initialised
        setattr(module, attr, value)

    def finish(self) -> nn.Module:
        """Tie the weights the config ties, refuse a parameter nothing filled, make the buffers
        (on the device, computed by the model's own initialisation as from_pretrained does),
        and return the model in evaluation mode."""
        model = self.model
        model.tie_weights()  # type: ignore[operator]
        missing = sorted(n for n, p in model.named_parameters() if p.is_meta)
        if missing:
            raise InputError(f"checkpoint lacks {len(missing)} model tensors, e.g. {missing[:3]}")
        for name, buf in list(model.named_buffers()):
            if buf.is_meta:
                module_name, _, attr = name.rpartition(".")
                setattr(model.get_submodule(module_name), attr, torch.empty_like(buf, device=self.device))
        model.initialize_weights()  # type: ignore[operator]  # only what put() did not mark: the buffers
        model.eval()
        return model

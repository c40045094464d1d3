"""What hf_modeling.SlicedConfig needs beyond TransformerCompression's two configs (the
`sliced_*` fields), from config.json, the SlicingConfig and the checkpoint's tensor names.
load_model's models and the HF directories of `unpack --format hf` both take them from here."""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import UnsupportedModelError
from . import detect, llama, opt, phi2, phi3
from .base import Names, config_int

NAMES: dict[str, Names] = {"llama": llama.NAMES, "opt": opt.NAMES, "phi": phi2.NAMES, "phi3": phi3.NAMES}
HEAD_BIAS = {"opt": opt.HEAD_BIAS, "phi": phi2.HEAD_BIAS}
ROPE_KINDS = ("default", "linear", "llama3")  # what hf_modeling.Rotary implements
RMSN_EPS = 1e-5  # TC's RMSN (slicegpt/modules.py) uses 1e-5 whatever config.json's rms_norm_eps says


def _layers(base: Mapping[str, Any], names: list[str] | None) -> int:
    """config.json's layer count, checked: a positive integer, and (names given) no more
    layers than the checkpoint has tensors (a crafted count must not drive a long loop)."""
    layers = config_int(dict(base), "num_hidden_layers")
    if names is not None and layers > len(names):
        raise UnsupportedModelError(f"config.json says {layers} layers for a checkpoint of {len(names)} tensors")
    return layers


def identity_norms(base: Mapping[str, Any], names: Iterable[str]) -> list[str]:
    """The identity norm weights among `names` that the adapters tolerate (a sliced model's
    norms have no parameters, so its models have no place for them)."""
    names = list(names)
    n = NAMES[detect(dict(base))]
    layer_norms = {n.prefix(i) + rel for i in range(_layers(base, names)) for rel in n.layer_norms}
    return [k for k in names if k in layer_norms or k in n.final_norms]


def _default_names(arch: str, base: Mapping[str, Any]) -> set[str]:
    """The bias names a model has when its tensor names are not given: Llama's from its config
    flags, every bias for OPT and Phi-2 (Phi-2's head bias too, which TC always writes)."""
    n, layers = NAMES[arch], config_int(dict(base), "num_hidden_layers")
    if arch == "llama":
        roles = [r for r in ("q", "k", "v", "o") if base.get("attention_bias")]
        roles += [r for r in ("up", "gate", "down") if base.get("mlp_bias")]
    else:
        roles = list(n.biases)
    names = {n.at(i, n.biases[r]) for i in range(layers) for r in roles}
    return names | ({HEAD_BIAS[arch]} if arch == "phi" else set())


def biases(arch: str, names: set[str], layers: int) -> list[str]:
    """The bias roles present (q k v o up gate down), which must be the same in every layer;
    and 'head' for a head bias."""
    n = NAMES[arch]
    roles = []
    for role, rel in n.biases.items():
        have = [n.at(i, rel) in names for i in range(layers)]
        if any(have) and not all(have):
            raise UnsupportedModelError(f"{rel} is in some layers and not in others; a sliced model needs the same biases "
                                        f"in every layer")
        if layers and have[0]:
            roles.append(role)
    if arch in HEAD_BIAS and HEAD_BIAS[arch] in names:
        roles.append("head")
    return roles


def _number(where: Mapping[str, Any], key: str, default: float | None = None, low: float = 0.0, high: float = math.inf) -> float:
    """A finite number in (low, high] from a config mapping (absent or null: `default`)."""
    v = where.get(key)
    if v is None and default is not None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not low < v <= high or not math.isfinite(v):
        raise UnsupportedModelError(f"config.json's {key} must be a number in ({low:g}, {high:g}], not {v!r}")
    return float(v)


def rope(base: Mapping[str, Any], arch: str) -> dict[str, Any]:
    """theta, rotary dims and scaling from config.json (transformers 4.x's or 5.x's spelling),
    every field checked (UnsupportedModelError) before a model runs with it."""
    if arch == "opt":  # learned positions
        return {}
    rp = base.get("rope_parameters") or {}
    if not isinstance(rp, dict):
        raise UnsupportedModelError(f"config.json's rope_parameters must be an object, not {rp!r}")
    theta = _number(base, "rope_theta", None) if base.get("rope_theta") is not None else _number(rp, "rope_theta", 10000.0)
    heads = config_int(dict(base), "num_attention_heads")
    head_dim = config_int(dict(base), "head_dim", max(1, config_int(dict(base), "hidden_size") // heads))
    where = base if base.get("partial_rotary_factor") is not None else rp
    partial = _number(where, "partial_rotary_factor", 0.5 if arch == "phi" else 1.0, high=1.0)
    dims = int(head_dim * partial)
    if dims < 2 or dims % 2:
        raise UnsupportedModelError(f"rotary dims int({head_dim} * {partial}) = {dims}: not an even number >= 2")
    scaling = base.get("rope_scaling") or (rp if rp.get("rope_type", "default") != "default" else None)
    if scaling is not None and not isinstance(scaling, dict):
        raise UnsupportedModelError(f"config.json's rope_scaling must be an object, not {scaling!r}")
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind not in ROPE_KINDS:
        raise UnsupportedModelError(f"rope scaling {kind!r} is not supported ({', '.join(ROPE_KINDS)})")
    if kind in ("linear", "llama3"):
        assert scaling is not None
        _number(scaling, "factor")
    if kind == "llama3":
        assert scaling is not None
        low = _number(scaling, "low_freq_factor")
        _number(scaling, "high_freq_factor", low=low)
        config_int(scaling, "original_max_position_embeddings")
    return {"theta": theta, "dims": dims, "scaling": scaling}


def sliced_fields(base: Mapping[str, Any], slicing: Mapping[str, Any], names: Iterable[str] | None = None) -> dict[str, Any]:
    """SlicedConfig's arguments for a checkpoint with these configs; `names` (its tensor
    names) decides which biases exist (None: the defaults above)."""
    arch = detect(dict(base))
    if arch == "phi" and base.get("qk_layernorm"):
        raise UnsupportedModelError("Phi models with qk_layernorm=true are not supported")
    window = config_int(dict(base), "sliding_window") if arch == "phi3" and base.get("sliding_window") is not None else None
    config_int(dict(base), "hidden_size")
    layers = _layers(base, None if names is None else list(names))
    have = _default_names(arch, base) if names is None else set(names)
    return {
        "sliced_arch": arch,
        "sliced_norm_eps": RMSN_EPS,
        "sliced_biases": biases(arch, have, layers),
        "sliced_rope": rope(base, arch),
        "sliced_window": window,
        "sliced_base": dict(base),
        "sliced_slicing": dict(slicing),
    }

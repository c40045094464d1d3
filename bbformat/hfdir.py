"""Hugging Face directories of sliced models (`unpack --format hf`): what they hold and how
their weights are sharded. The model code in them is adapters/hf_modeling.py, copied as is.

A directory holds:
* `config.json`: model_type "bbformat_sliced", an `auto_map` to the modeling file, the
  original config.json (`sliced_base`), TransformerCompression's SlicingConfig
  (`sliced_slicing`), the checkpoint's stem (`sliced_stem`) and what the layers need
  beyond them (adapters/sliced_config.py, as load_model's models);
* `modeling_bbformat_sliced.py`;
* `model.safetensors`, or shards `model-0000K-of-0000N.safetensors` with
  `model.safetensors.index.json` above `max_shard_size` bytes (save_pretrained's layout);
* the checkpoint's other side files (tokenizer, generation config) as they are.
"""
from __future__ import annotations

import json
import re
from importlib import resources
from typing import Any, Mapping

from .adapters.sliced_config import sliced_fields
from .checkpoint.files import HF_INDEX, HF_MODEL_TYPE, HF_WEIGHTS
from .errors import InputError

MODELING_FILE = "modeling_bbformat_sliced.py"
MODEL_TYPE, WEIGHTS, INDEX = HF_MODEL_TYPE, HF_WEIGHTS, HF_INDEX  # hf_modeling.MODEL_TYPE too (tests/test_hf_export.py)
SHARD = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")
DEFAULT_SHARD_BYTES = 5 * 10**9  # transformers 4.x's save_pretrained default, "5GB"


def modeling_source() -> bytes:
    """The modeling file every directory gets (adapters/hf_modeling.py, byte for byte)."""
    return resources.files("bbformat.adapters").joinpath("hf_modeling.py").read_bytes()


def hf_config(base: Mapping[str, Any], slicing: Mapping[str, Any], stem: str, names: list[str], dtype: str) -> dict[str, Any]:
    """config.json of the HF directory for a checkpoint with these configs and tensor names."""
    return {
        "model_type": MODEL_TYPE,
        "architectures": ["SlicedForCausalLM"],
        "auto_map": {"AutoConfig": f"{MODELING_FILE[:-3]}.SlicedConfig",
                     "AutoModelForCausalLM": f"{MODELING_FILE[:-3]}.SlicedForCausalLM"},
        "torch_dtype": dtype,
        "sliced_stem": stem,
        **sliced_fields(base, slicing, names),
    }


def shards(sizes: list[tuple[str, int]], max_shard_size: int) -> list[list[str]]:
    """Tensor names split into shards in order, a new shard where the next tensor would take
    the current one past max_shard_size (a tensor larger than that gets a shard of its own),
    as save_pretrained splits."""
    if max_shard_size < 1:
        raise InputError(f"max_shard_size must be positive, got {max_shard_size}")
    out: list[list[str]] = [[]]
    used = 0
    for name, n in sizes:
        if out[-1] and used + n > max_shard_size:
            out.append([])
            used = 0
        out[-1].append(name)
        used += n
    return out


def is_weights_file(name: str) -> bool:
    """A name from_pretrained (or pack) would take for this directory's weights."""
    return name in (WEIGHTS, INDEX) or SHARD.fullmatch(name) is not None


def shard_names(count: int) -> list[str]:
    return [WEIGHTS] if count == 1 else [f"model-{k + 1:05d}-of-{count:05d}.safetensors" for k in range(count)]


def index_json(groups: list[list[str]], files: list[str], total_size: int) -> bytes:
    """model.safetensors.index.json for shards `files` holding `groups` of tensors."""
    weight_map = {name: f for f, g in zip(files, groups) for name in g}
    return (json.dumps({"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))},
                       indent=2) + "\n").encode()


def side_files(files: Mapping[str, bytes], stem: str, config: dict[str, Any]) -> dict[str, bytes]:
    """The directory's small files: its config.json and modeling file, and the checkpoint's
    side files other than config.json and <stem>.json (both inside the new config.json)."""
    out = {k: v for k, v in files.items() if k not in ("config.json", f"{stem}.json", INDEX)}
    out["config.json"] = (json.dumps(config, indent=2) + "\n").encode()
    out[MODELING_FILE] = modeling_source()
    return out

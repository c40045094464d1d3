"""Read and write a SliceGPT checkpoint in TransformerCompression's on-disk layout.

What microsoft/TransformerCompression (TC) writes, from its sources (experiments/run_slicegpt.py,
src/slicegpt/{rotate,layernorm_fusion,model_adapter,slicing_scheduler,hf_utils,modules}.py and
adapters/{llama,opt}_adapter.py); we copy no code, only the layout:

* Files. `run_slicegpt.py --save-dir DIR` writes `DIR/<stem>.pt` with
  `torch.save(model.state_dict(), ...)`, where stem = f"{Path(args.model).name}_{args.sparsity}"
  (e.g. `opt-125m_0.25`, `Llama-2-7b-hf_0.3`), and `DIR/<stem>.json` (same stem, `.with_suffix('.json')`)
  with `SlicingConfig.to_json_string()`. Only with `--model-path` does it also copy the source
  model's `*.json` (config.json, generation_config.json, tokenizer*.json, special_tokens_map.json,
  vocab.json ...; names containing 'safetensors' skipped), `*token*.model` and `merges.txt`.
  `load_sliced_model(name, DIR/<stem>.pt)` rebuilds an uninitialised HF model from config.json,
  replaces layers / fuses norms, reads `<stem>.json` next to the .pt (else assumes
  `const_dimension = int((1 - sparsity) * hidden)` rounded down to round_interval), slices the
  skeleton to those dims and calls `load_state_dict(torch.load(path))` (strict).
* <stem>.json = `json.dumps(dataclasses.asdict(SlicingConfig))`, one line, fields in this order:
  hidden_size, layers_num, do_slice_head, parallel_blocks, embedding_dimensions,
  attention_input_dimensions, attention_output_dimensions, mlp_input_dimensions,
  mlp_output_dimensions, head_dimension, const_dimension. The per-layer dicts are int-keyed in
  Python, so JSON keys are "0", "1", ... (from_dict converts numeric string keys back to int).
  embedding_dimensions has one entry per embedding module (Llama {"0": d}; OPT {"0": d, "1": d}:
  tokens and positions). Sequential models: attention_input[i] = embedding[0] (i = 0) or
  mlp_output[i-1]; mlp_input[i] = attention_output[i]; mlp_output[L-1] = head_dimension = hidden
  unless do_slice_head. parallel_blocks=True (phi-2) has one shortcut per layer; we refuse it.
* State dict. Norms: fuse_modules folds every norm's weight (and LayerNorm bias) into the next
  linears, bakes OPT's mean subtraction into embeddings / out_proj / fc2, then replaces every
  LlamaRMSNorm / nn.LayerNorm by the parameter-free RMSN(mean_dim = hidden_size, eps 1e-5; it
  divides the sum of squares of the sliced vector by the FULL hidden size). So no norm weights
  remain. The head is cloned (untied) before fusion; OPT's lm_head gains a bias (vocab,) from the
  final LayerNorm's bias. Each compressed decoder layer registers `mlp_shortcut_Q` then
  `attn_shortcut_Q` as its own parameters, so they come before the layer's submodule keys.
  Llama keys: model.embed_tokens.weight (V, d_emb);
    model.layers.i.{mlp_shortcut_Q (d_attn, d_mlp), attn_shortcut_Q (d_in, d_attn)},
    model.layers.i.self_attn.{q,k,v}_proj.weight (H*hd | KV*hd, d_in), o_proj.weight (d_attn, H*hd),
    model.layers.i.mlp.{gate,up}_proj.weight (I, d_attn), down_proj.weight (d_mlp, I);
    lm_head.weight (V, d_head). (Old transformers may add self_attn.rotary_emb.inv_freq.)
  OPT keys: model.decoder.embed_tokens.weight (V, d_emb), model.decoder.embed_positions.weight
    (max_pos + 2, d_emb); model.decoder.layers.i.{mlp_shortcut_Q, attn_shortcut_Q},
    .self_attn.{k,v,q}_proj.{weight (D, d_in), bias (D,)}, .self_attn.out_proj.{weight (d_attn, D),
    bias (d_attn,)}, .fc1.{weight (F, d_attn), bias (F,)}, .fc2.{weight (d_mlp, F), bias (d_mlp,)};
    lm_head.weight (V, d_head), lm_head.bias (V,).
  Sliced weights are views (`W.data = W.data[:, :d]`), so TC's .pt keeps unsliced storages.
* Forward of a compressed layer (row vectors x of width d_in):
    h = x @ attn_shortcut_Q + o_proj(attn(RMSN(x)));  y = h @ mlp_shortcut_Q + mlp(RMSN(h)).
  Rotating a residual stream h -> h R (R orthogonal, dims d) keeps the function if the writer's
  output rows (o/down weight axis 0, their bias) and the shortcut's column axis are rotated by R,
  and the reader's input columns (q/k/v or up/gate/fc1 or lm_head axis 1) and the next shortcut's
  row axis rotated by R too; with M = moveaxis(T, a, -1).reshape(-1, d) -> M @ R this is exactly
  the layout.py convention on every touched axis (paper, Remark 3.1).
"""
from __future__ import annotations

import json
import os
import secrets
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import InputError
from ..fsutil import fsync_dir

WEIGHT_SUFFIXES = (".pt", ".safetensors")
# Non-JSON side files that travel with the checkpoint (tokenizers and the like).
_SIDE_NAMES = {"merges.txt", "vocab.txt", "chat_template.jinja"}
_SIDE_SUFFIXES = (".json", ".model", ".tiktoken")


@dataclass
class Checkpoint:
    """One sliced model: tensors in file order, the two configs, and side files by name.

    `extra_files` holds the original bytes of every side file, including config.json and
    <stem>.json, so they are written back byte for byte.
    """

    stem: str
    state_dict: dict[str, torch.Tensor]
    slicing_config: dict[str, Any]
    hf_config: dict[str, Any]
    extra_files: dict[str, bytes] = field(default_factory=dict)

    @classmethod
    def from_parts(cls, stem: str, state_dict: Mapping[str, torch.Tensor], files: Mapping[str, bytes]) -> "Checkpoint":
        """Rebuild from tensors and side files (config.json and <stem>.json must be among them)."""
        _check_stem(stem)
        files = dict(files)
        hf = _parse_json(files, "config.json")
        sc = _parse_json(files, f"{stem}.json")
        return cls(stem, dict(state_dict), sc, hf, files)


def _check_stem(stem: str) -> None:
    if not stem or "/" in stem or "\\" in stem or stem in (".", "..") or "\x00" in stem:
        raise InputError(f"invalid checkpoint stem {stem!r}")


def _parse_json(files: Mapping[str, bytes], name: str) -> dict[str, Any]:
    if name not in files:
        raise InputError(f"{name} is missing (TransformerCompression layout needs config.json and <stem>.json)")
    try:
        obj = json.loads(files[name].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{name} is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise InputError(f"{name} must hold a JSON object, not {type(obj).__name__}")
    return obj


def _is_side_file(name: str) -> bool:
    return name in _SIDE_NAMES or name.endswith(_SIDE_SUFFIXES)


def _find_weights(src: Path) -> tuple[Path, Path]:
    """(directory, weights file) for SRC being a directory or the weights file itself."""
    if not src.exists():
        raise InputError(f"{src} does not exist")
    if src.is_file():
        if src.suffix not in WEIGHT_SUFFIXES:
            raise InputError(f"{src} is not a .pt or .safetensors file")
        return src.parent, src
    if not src.is_dir():
        raise InputError(f"{src} is neither a file nor a directory")
    found = sorted(p for p in src.iterdir() if p.is_file() and p.suffix in WEIGHT_SUFFIXES and not p.name.startswith("."))
    if not found:
        raise InputError(f"{src} holds no <stem>.pt or <stem>.safetensors")
    if len(found) > 1:
        # several weight files: only those with a matching <stem>.json are candidates
        paired = [p for p in found if (src / f"{p.stem}.json").is_file()]
        if len(paired) != 1:
            names = ", ".join(p.name for p in (paired or found))
            raise InputError(f"{src} is ambiguous: several weight files ({names}); pass the one to use")
        found = paired
    return src, found[0]


def _load_pt(path: Path) -> dict[str, torch.Tensor]:
    try:
        obj = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:  # pickle / zip / weights_only refusals all mean: unusable input
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"cannot read {path.name} with torch.load(weights_only=True): {msg}") from None
    if not isinstance(obj, Mapping):
        raise InputError(f"{path.name} holds a {type(obj).__name__}, not a state dict")
    out: dict[str, torch.Tensor] = {}
    for k, v in obj.items():
        if not isinstance(k, str):
            raise InputError(f"{path.name}: state-dict key {k!r} is not a string")
        if not isinstance(v, torch.Tensor):
            raise InputError(f"{path.name}: value of {k!r} is a {type(v).__name__}, not a tensor")
        out[k] = v
    return out


def _load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    import safetensors.torch

    try:
        data = path.read_bytes()
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8 : 8 + n].decode("utf-8"))
        tensors = safetensors.torch.load(data)
    except Exception as exc:
        raise InputError(f"cannot read {path.name} as safetensors: {exc}") from None
    # file order: by position of the data
    order = sorted((k for k in header if k != "__metadata__"), key=lambda k: (header[k]["data_offsets"][0], k))
    return {k: tensors[k] for k in order}


def read_checkpoint(src: Path | str) -> Checkpoint:
    """Read a TC-layout directory (or its .pt / .safetensors file, siblings from its directory)."""
    src = Path(src)
    d, weights = _find_weights(src)
    stem = weights.stem
    if not (d / f"{stem}.json").is_file():
        raise InputError(f"{stem}.json (the SlicingConfig) is missing next to {weights.name}")
    if not (d / "config.json").is_file():
        raise InputError(f"config.json is missing in {d} (copy the source model's config.json next to {weights.name})")
    sd = _load_pt(weights) if weights.suffix == ".pt" else _load_safetensors(weights)
    files: dict[str, bytes] = {}
    for p in sorted(d.iterdir()):
        if p.is_file() and not p.name.startswith(".") and p != weights and _is_side_file(p.name):
            try:
                files[p.name] = p.read_bytes()
            except OSError as exc:
                raise InputError(f"cannot read {p}: {exc.strerror or exc}") from None
    return Checkpoint.from_parts(stem, sd, files)


def _tmp_name(dst: Path, name: str) -> Path:
    # "<name-without-last-suffix>.bbtmp-xxxx": torch.save names its zip root after the part before
    # the last dot, so a temp file for <stem>.pt still gets the root "<stem>" like TC's files
    base = name.rsplit(".", 1)[0] if "." in name else name
    return dst / f"{base}.bbtmp-{secrets.token_hex(6)}"


def _atomic_write_bytes(dst: Path, name: str, data: bytes) -> None:
    tmp = _tmp_name(dst, name)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, dst / name)
    finally:
        tmp.unlink(missing_ok=True)


def _atomic_torch_save(dst: Path, name: str, sd: dict[str, torch.Tensor]) -> None:
    tmp = _tmp_name(dst, name)
    try:
        torch.save(sd, tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, dst / name)
    finally:
        tmp.unlink(missing_ok=True)


def _json_bytes(obj: dict[str, Any], one_line: bool) -> bytes:
    # TC writes SlicingConfig with json.dumps(asdict(...)); HF writes config.json indented, sorted
    text = json.dumps(obj) if one_line else json.dumps(obj, indent=2, sort_keys=True) + "\n"
    return text.encode("utf-8")


def write_checkpoint(ckpt: Checkpoint, dst: Path | str, fmt: str = "pt") -> Path:
    """Write <stem>.pt (or .safetensors), <stem>.json, config.json and the side files into DST.

    Every file is written atomically (temp file in DST, fsync, os.replace). Returns DST.
    """
    if fmt not in ("pt", "safetensors"):
        raise InputError(f"unknown checkpoint format {fmt!r} (choose 'pt' or 'safetensors')")
    _check_stem(ckpt.stem)
    dst = Path(dst)
    try:
        dst.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot create {dst}: {exc.strerror or exc}") from None
    for k, v in ckpt.state_dict.items():
        if not isinstance(v, torch.Tensor):
            raise InputError(f"value of {k!r} is a {type(v).__name__}, not a tensor")
    files = dict(ckpt.extra_files)
    files.setdefault("config.json", _json_bytes(ckpt.hf_config, one_line=False))
    files.setdefault(f"{ckpt.stem}.json", _json_bytes(ckpt.slicing_config, one_line=True))
    for name in files:
        if not name or "/" in name or "\\" in name or name.startswith(".") or name.endswith(WEIGHT_SUFFIXES):
            raise InputError(f"refusing to write side file {name!r}")
    try:
        for name, data in sorted(files.items()):
            _atomic_write_bytes(dst, name, data)
        if fmt == "pt":
            _atomic_torch_save(dst, f"{ckpt.stem}.pt", dict(ckpt.state_dict))
        else:
            import safetensors.torch

            sd = {k: v.detach().contiguous() for k, v in ckpt.state_dict.items()}
            _atomic_write_bytes(dst, f"{ckpt.stem}.safetensors", safetensors.torch.save(sd, metadata={"format": "pt"}))
    except OSError as exc:
        raise InputError(f"cannot write into {dst}: {exc.strerror or exc}") from None
    fsync_dir(dst)
    return dst

"""A checkpoint in TransformerCompression's layout as files: the `Checkpoint` held in memory,
which files of a directory belong to it, and its two JSON configs."""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..constants import SIDE_FILES_MAX_BYTES as SIDE_FILES_MAX_BYTES  # re-exported: the side files' budget
from ..errors import InputError
from .mapped import MappedWeights

WEIGHT_SUFFIXES = (".pt", ".safetensors")
FORMATS = ("pt", "safetensors")  # what a weights file is written as (its suffix without the dot)
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
    state_dict: Mapping[str, torch.Tensor]  # MappedWeights when read from a file
    slicing_config: dict[str, Any]
    hf_config: dict[str, Any]
    extra_files: dict[str, bytes] = field(default_factory=dict)

    @classmethod
    def from_parts(cls, stem: str, state_dict: Mapping[str, torch.Tensor], files: Mapping[str, bytes]) -> "Checkpoint":
        """Rebuild from tensors and side files (config.json and <stem>.json must be among them)."""
        check_stem(stem)
        files = dict(files)
        hf = parse_json(files, "config.json")
        sc = parse_json(files, f"{stem}.json")
        return cls(stem, dict(state_dict), sc, hf, files)

    def release(self, name: str) -> None:
        """Done with `name` for now: a mapped tensor's pages leave the resident set."""
        if isinstance(self.state_dict, MappedWeights):
            self.state_dict.release(name)

    def close(self) -> None:
        """Unmap a weights file read by read_checkpoint (its tensors must not be used after)."""
        if isinstance(self.state_dict, MappedWeights):
            self.state_dict.close()

    def __enter__(self) -> "Checkpoint":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise InputError(f"unknown checkpoint format {fmt!r} (choose 'pt' or 'safetensors')")


def check_stem(stem: str) -> None:
    if not stem or "/" in stem or "\\" in stem or stem in (".", "..") or "\x00" in stem:
        raise InputError(f"invalid checkpoint stem {stem!r}")


def parse_json(files: Mapping[str, bytes], name: str) -> dict[str, Any]:
    """files[name] as a JSON object (InputError if it is missing or anything else)."""
    if name not in files:
        raise InputError(f"{name} is missing (TransformerCompression layout needs config.json and <stem>.json)")
    try:  # json.loads only: no eval, no object hooks; ValueError covers JSONDecodeError and
        # over-long integer literals, RecursionError absurdly deep nesting
        obj = json.loads(files[name].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"{name} is not valid JSON: {exc}") from None
    except RecursionError:
        raise InputError(f"{name} is not usable JSON: nested too deeply") from None
    if not isinstance(obj, dict):
        raise InputError(f"{name} must hold a JSON object, not {type(obj).__name__}")
    return obj


def is_side_file(name: str) -> bool:
    return name in _SIDE_NAMES or name.endswith(_SIDE_SUFFIXES)


def find_weights(src: Path) -> tuple[Path, Path]:
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
    found = _prefer_safetensors(found)
    if len(found) > 1:
        # several weight files: only those with a matching <stem>.json are candidates
        paired = _prefer_safetensors([p for p in found if (src / f"{p.stem}.json").is_file()])
        if len(paired) != 1:
            names = ", ".join(p.name for p in (paired or found))
            raise InputError(f"{src} is ambiguous: several weight files ({names}); pass the one to use")
        found = paired
    return src, found[0]


HF_MODEL_TYPE = "bbformat_sliced"  # config.json of a directory unpack --format hf wrote (bbformat.hfdir)
HF_WEIGHTS, HF_INDEX = "model.safetensors", "model.safetensors.index.json"


def hf_shards(src: Path) -> list[Path] | None:
    """The weights files of a directory `unpack --format hf` wrote (config.json's model_type
    says so): model.safetensors, or the shards its index names; None for any other path."""
    cfg = src / "config.json"
    if not src.is_dir() or not cfg.is_file():
        return None
    try:  # too big for a side file: not ours to judge here (read_checkpoint's side files say so)
        if cfg.stat().st_size > SIDE_FILES_MAX_BYTES:
            return None
    except OSError:
        return None
    if read_json_file(cfg).get("model_type") != HF_MODEL_TYPE:
        return None
    if (src / HF_INDEX).is_file() == (src / HF_WEIGHTS).is_file():  # transformers would take model.safetensors
        raise InputError(f"{src} has {'both' if (src / HF_INDEX).is_file() else 'neither'} {HF_WEIGHTS} and {HF_INDEX}: "
                         f"{'ambiguous, remove the one that is stale' if (src / HF_INDEX).is_file() else 'no weights'}")
    if not (src / HF_INDEX).is_file():
        return [src / HF_WEIGHTS]
    wm = read_json_file(src / HF_INDEX).get("weight_map")
    if not isinstance(wm, dict) or not wm or not all(isinstance(k, str) and isinstance(v, str) for k, v in wm.items()):
        raise InputError(f"{src / HF_INDEX} has no weight_map of tensor names to files")
    names = list(dict.fromkeys(wm.values()))
    for n in names:
        if "/" in n or "\\" in n or n.startswith(".") or not n.endswith(".safetensors") or not (src / n).is_file():
            raise InputError(f"{src / HF_INDEX} names {n!r}, which is not a .safetensors file in {src}")
    return [src / n for n in names]


def read_json_file(path: Path) -> dict[str, Any]:
    """A side file's JSON object (parse_json's checks and errors), its size checked first and a
    failed read an InputError."""
    try:
        if path.stat().st_size > SIDE_FILES_MAX_BYTES:
            raise InputError(f"{path} is over {SIDE_FILES_MAX_BYTES:,} bytes")
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
    return parse_json({path.name: data}, path.name)


def input_files(src: Path | str) -> list[Path]:
    """The files of the checkpoint directory that SRC names which pack reads or could read
    (weights files and side files): an output path must not be one of them."""
    shards = hf_shards(Path(src))
    if shards is not None:
        return [p for p in sorted(Path(src).iterdir()) if p.is_file() and (p in shards or is_side_file(p.name))]
    d, _ = find_weights(Path(src))
    return [p for p in sorted(d.iterdir()) if p.is_file() and (p.suffix in WEIGHT_SUFFIXES or is_side_file(p.name))]


def _prefer_safetensors(found: list[Path]) -> list[Path]:
    """<stem>.pt and <stem>.safetensors side by side: take the safetensors (no pickle at all)."""
    if len(found) > 1 and len({p.stem for p in found}) == 1:
        st = [p for p in found if p.suffix == ".safetensors"]
        if st:
            return st[:1]
    return found


def _json_bytes(obj: dict[str, Any], one_line: bool) -> bytes:
    # TC writes SlicingConfig with json.dumps(asdict(...)); HF writes config.json indented, sorted
    text = json.dumps(obj) if one_line else json.dumps(obj, indent=2, sort_keys=True) + "\n"
    return text.encode("utf-8")


def side_files(stem: str, files: Mapping[str, bytes], hf_config: dict[str, Any] | None = None,
               slicing_config: dict[str, Any] | None = None) -> dict[str, bytes]:
    """The side files a checkpoint is written with: config.json and <stem>.json made from the
    configs when `files` lacks them, and the rest as they are."""
    out = dict(files)
    if hf_config is not None:
        out.setdefault("config.json", _json_bytes(hf_config, one_line=False))
    if slicing_config is not None:
        out.setdefault(f"{stem}.json", _json_bytes(slicing_config, one_line=True))
    return out


def check_side_files(stem: str, files: Mapping[str, bytes]) -> None:
    """config.json and <stem>.json must be there and hold JSON objects (InputError if not)."""
    check_stem(stem)
    parse_json(files, "config.json")
    parse_json(files, f"{stem}.json")

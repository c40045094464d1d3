"""read_checkpoint: a TC-layout directory into a `Checkpoint` whose tensors are mapped from the
weights file. A .pt is only ever read with torch.load(weights_only=True), after its zip
archive is checked; a .safetensors with safetensors' own lazy reader."""
from __future__ import annotations

import json
import os
import pickle
import re
import struct
import warnings
import zipfile
from collections.abc import Mapping
from pathlib import Path

import torch

from ..errors import InputError
from .files import (HF_INDEX, SIDE_FILES_MAX_BYTES, Checkpoint, check_stem, find_weights, hf_shards, is_side_file,
                    parse_json, read_json_file)
from .mapped import MappedWeights

_ZIP_MAGIC = b"PK\x03\x04"
_TORCH_BOILERPLATE = ("Weights only load failed", "Please file an issue", "Check the documentation", "In PyTorch 2.6")


def _check_torch_zip(path: Path) -> None:
    """A .pt must be what torch.save writes: a zip archive of uncompressed records. Legacy
    (pre-1.6) torch files and bare pickles are refused unread, and so are compressed members,
    which torch.save never writes (a decompression bomb would need them)."""
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
        if magic != _ZIP_MAGIC:
            raise InputError(f"{path.name} is not a torch zip archive (what torch.save writes since PyTorch 1.6): refusing it "
                             "unread (.pt files are read only as torch zip archives, with torch.load(weights_only=True))")
        size = path.stat().st_size
        with zipfile.ZipFile(path) as z:
            infos = z.infolist()
    except InputError:
        raise
    except (OSError, zipfile.BadZipFile, ValueError, EOFError, NotImplementedError) as exc:
        raise InputError(f"cannot read {path.name} as a torch zip archive for torch.load(weights_only=True): {exc}") from None
    if any(i.filename.endswith("/constants.pkl") or "/code/" in i.filename for i in infos):
        raise InputError(f"{path.name} is a TorchScript archive, not a state dict saved with torch.save; refusing it")
    for info in infos:
        if info.compress_type != zipfile.ZIP_STORED:
            raise InputError(f"{path.name}: archive member {info.filename!r} is compressed, which torch.save never writes; refusing it")
    if sum(i.file_size for i in infos) > size:
        raise InputError(f"{path.name}: archive members claim more bytes than the file holds; refusing it")


def _weights_only_refusal(path: Path, exc: BaseException) -> InputError:
    """One line for torch's multi-paragraph weights_only error (minus its advice to retry
    with weights_only=False, which is exactly what must not be done with an untrusted file)."""
    text = str(exc)
    glob = re.search(r"GLOBAL\s+([\w.]+)", text)
    if glob:
        return InputError(f"refusing {path.name}: its pickle asks for {glob.group(1)}, which a state dict of tensors never needs "
                          "(unpickling it could run code); nothing was executed")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith(_TORCH_BOILERPLATE)]
    detail = "; ".join(ln.replace("WeightsUnpickler error:", "").strip() for ln in lines).strip("; ") or type(exc).__name__
    return InputError(f"refusing {path.name}: torch.load(weights_only=True) rejected its pickle ({detail[:300]}); nothing was executed")


def _load_pt(path: Path) -> MappedWeights:
    """Only ever torch.load(weights_only=True) (explicit, so TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD cannot
    turn it off): its unpickler refuses every global but tensors, storages and plain containers.
    mmap=True: the records are mapped, not read."""
    _check_torch_zip(path)
    try:
        with warnings.catch_warnings():  # torch warns on odd pickle protocols etc.: errors stay one line
            warnings.simplefilter("ignore")
            try:
                obj = torch.load(path, weights_only=True, map_location="cpu", mmap=True)
            except (pickle.UnpicklingError, RecursionError):
                raise
            except Exception:  # e.g. an archive whose records torch cannot map: read it instead
                obj = torch.load(path, weights_only=True, map_location="cpu", mmap=False)
    except pickle.UnpicklingError as exc:
        raise _weights_only_refusal(path, exc) from None
    except RecursionError:
        raise InputError(f"cannot read {path.name} with torch.load(weights_only=True): nested too deeply") from None
    except Exception as exc:  # zip / record errors all mean: unusable input
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
    return MappedWeights(path, out)


SAFETENSORS_MAX_HEADER = 100 << 20  # the safetensors library's own limit


def _safetensors_order(path: Path) -> list[str]:
    """Tensor names in file order (by position of their data), from the header, whose length is
    checked against the file before it is read."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError("file is shorter than a safetensors header")
        (n,) = struct.unpack("<Q", head)
        if n > min(SAFETENSORS_MAX_HEADER, os.fstat(f.fileno()).st_size - 8):
            raise ValueError(f"header length {n:,} runs past the file or the 100 MiB limit")
        header = json.loads(f.read(n).decode("utf-8"))
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    names = [k for k in header if k != "__metadata__"]
    return sorted(names, key=lambda k: (header[k]["data_offsets"][0], k))


def _load_safetensors(path: Path) -> MappedWeights:
    """safetensors' own lazy reader (safe_open maps the file and validates its header);
    get_tensor returns tensors backed by that mapping."""
    from safetensors import safe_open

    try:
        order = _safetensors_order(path)
        handle = safe_open(str(path), framework="pt")
        tensors = {k: handle.get_tensor(k) for k in order}
    except Exception as exc:
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"cannot read {path.name} as safetensors: {msg}") from None
    return MappedWeights(path, tensors, keep_alive=handle)


def read_checkpoint(src: Path | str) -> Checkpoint:
    """Read a TC-layout directory (or its .pt / .safetensors file, siblings from its directory),
    or a Hugging Face directory that `unpack --format hf` (or save_pretrained of its model) wrote."""
    shards = hf_shards(Path(src))
    if shards is not None:
        return _read_hf(Path(src), shards)
    d, weights = find_weights(Path(src))
    stem = weights.stem
    if not (d / f"{stem}.json").is_file():
        raise InputError(f"{stem}.json (the SlicingConfig) is missing next to {weights.name}")
    if not (d / "config.json").is_file():
        raise InputError(f"config.json is missing in {d} (copy the source model's config.json next to {weights.name})")
    check_stem(stem)
    files = _read_side_files(d, weights)
    # the cheap checks (JSON configs) before the weights are loaded
    hf = parse_json(files, "config.json")
    sc = parse_json(files, f"{stem}.json")
    sd = _load_pt(weights) if weights.suffix == ".pt" else _load_safetensors(weights)
    return Checkpoint(stem, sd, sc, hf, files)


def _read_hf(d: Path, shards: list[Path]) -> Checkpoint:
    """The checkpoint inside an HF directory: config.json's sliced_base, sliced_slicing and
    sliced_stem give back TC's config.json, SlicingConfig and stem; the tokenizer files stay."""
    files = _read_side_files(d, *shards)
    files.pop(HF_INDEX, None)
    cfg = parse_json(files, "config.json")
    base, sc, stem = cfg.get("sliced_base"), cfg.get("sliced_slicing"), cfg.get("sliced_stem")
    if not isinstance(base, dict) or not isinstance(sc, dict) or not isinstance(stem, str):
        raise InputError(f"{d / 'config.json'} lacks sliced_base, sliced_slicing or sliced_stem")
    check_stem(stem)
    if f"{stem}.json" in files:
        raise InputError(f"{d / 'config.json'}'s sliced_stem {stem!r} would replace the side file {stem}.json")
    files["config.json"] = (json.dumps(base, indent=2) + "\n").encode()
    files[f"{stem}.json"] = json.dumps(sc).encode()
    parts: list[MappedWeights] = []
    try:
        for p in shards:
            parts.append(_load_safetensors(p))
        tensors = {k: v for part in parts for k, v in part.items()}
        if len(tensors) != sum(len(part) for part in parts):
            raise InputError(f"a tensor name is in more than one shard of {d}")
        if len(shards) > 1:  # the index must say where each tensor is, as from_pretrained reads it
            wm = read_json_file(d / HF_INDEX)["weight_map"]  # hf_shards checked it
            wrong = [k for k in set(wm) | set(tensors) if k not in tensors or k not in wm or
                     wm[k] != next(p.name for p, part in zip(shards, parts) if k in part)]
            if wrong:
                raise InputError(f"{d / HF_INDEX} does not match its shards (e.g. {sorted(wrong)[0]!r})")
    except BaseException:
        for part in parts:
            part.close()
        raise
    return Checkpoint(stem, MappedWeights(shards, tensors, keep_alive=parts), sc, base, files)


def _read_side_files(d: Path, *weights: Path) -> dict[str, bytes]:
    """The side files next to the weights file, by name; their total size is checked before
    each is read (a huge JSON is refused unread)."""
    files: dict[str, bytes] = {}
    total = 0
    for p in sorted(d.iterdir()):
        if p.is_file() and not p.name.startswith(".") and p not in weights and is_side_file(p.name):
            try:
                total += p.stat().st_size
                if total > SIDE_FILES_MAX_BYTES:
                    raise InputError(f"side files up to {p.name} total {total:,} bytes; a container carries at most "
                                     f"{SIDE_FILES_MAX_BYTES:,} (its metadata is limited to 64 MiB)")
                files[p.name] = p.read_bytes()
            except OSError as exc:
                raise InputError(f"cannot read {p}: {exc.strerror or exc}") from None
    return files

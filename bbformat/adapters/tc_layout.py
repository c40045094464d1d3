"""Read and write a SliceGPT checkpoint in TransformerCompression's on-disk layout.

What microsoft/TransformerCompression (TC) writes, from its sources (experiments/run_slicegpt.py,
src/slicegpt/{rotate,layernorm_fusion,model_adapter,slicing_scheduler,hf_utils,modules}.py and
adapters/{llama,opt,phi2,phi3}_adapter.py); we copy no code, only the layout:

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
  unless do_slice_head. parallel_blocks=true (Phi-2) has one shortcut per layer and records
  only embedding, attention_input, mlp_output and head dimensions (attention_output and
  mlp_input stay {}: they are the layer's output and input widths).
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
  Phi-2 keys (model_type "phi"; LayerNorms fused as OPT's, mean baked into dense and fc2):
    model.embed_tokens.weight; model.layers.i.attn_shortcut_Q (d_in, d_out) (no mlp_shortcut_Q),
    .self_attn.{q,k,v}_proj.{weight (H*hd | KV*hd, d_in), bias}, .self_attn.dense.{weight (d_out, H*hd),
    bias (d_out,)}, .mlp.fc1.{weight (I, d_in), bias}, .mlp.fc2.{weight (d_out, I), bias (d_out,)};
    lm_head.weight (V, d_head), lm_head.bias (V,). Layer: y = x Q + dense(attn(n)) + fc2(gelu_new(fc1(n))), n = RMSN(x).
  Phi-3 keys (model_type "phi3"; sequential, as Llama): model.embed_tokens.weight;
    model.layers.i.{mlp_shortcut_Q, attn_shortcut_Q}, .self_attn.o_proj.weight (d_attn, H*hd),
    .self_attn.qkv_proj.weight ((H + 2 KV) hd, d_in; rows q | k | v), .mlp.gate_up_proj.weight
    (2 I, d_attn; rows gate | up), .mlp.down_proj.weight (d_mlp, I); lm_head.weight (V, d_head).
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

import ctypes
import functools
import json
import mmap
import os
import pickle
import re
import shutil
import struct
import sys
import warnings
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from .. import fsutil
from ..errors import InputError, output_error
from ..fsutil import fsync_dir
from ..stream_writers import torch_zip_is_whole

WEIGHT_SUFFIXES = (".pt", ".safetensors")
# Side files travel base64-encoded in the container's metadata, which a reader refuses past
# 64 MiB (SPEC.md, reader limits): 3/4 of that, less room for the tensor keys, is their budget.
SIDE_FILES_MAX_BYTES = 46 << 20
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
        _check_stem(stem)
        files = dict(files)
        hf = _parse_json(files, "config.json")
        sc = _parse_json(files, f"{stem}.json")
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


def _check_stem(stem: str) -> None:
    if not stem or "/" in stem or "\\" in stem or stem in (".", "..") or "\x00" in stem:
        raise InputError(f"invalid checkpoint stem {stem!r}")


def _parse_json(files: Mapping[str, bytes], name: str) -> dict[str, Any]:
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
    found = _prefer_safetensors(found)
    if len(found) > 1:
        # several weight files: only those with a matching <stem>.json are candidates
        paired = _prefer_safetensors([p for p in found if (src / f"{p.stem}.json").is_file()])
        if len(paired) != 1:
            names = ", ".join(p.name for p in (paired or found))
            raise InputError(f"{src} is ambiguous: several weight files ({names}); pass the one to use")
        found = paired
    return src, found[0]


def input_files(src: Path | str) -> list[Path]:
    """The files of the checkpoint directory that SRC names which pack reads or could read
    (weights files and side files): an output path must not be one of them."""
    d, _ = _find_weights(Path(src))
    return [p for p in sorted(d.iterdir()) if p.is_file() and (p.suffix in WEIGHT_SUFFIXES or _is_side_file(p.name))]


def _prefer_safetensors(found: list[Path]) -> list[Path]:
    """<stem>.pt and <stem>.safetensors side by side: take the safetensors (no pickle at all)."""
    if len(found) > 1 and len({p.stem for p in found}) == 1:
        st = [p for p in found if p.suffix == ".safetensors"]
        if st:
            return st[:1]
    return found


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


class MappedWeights(Mapping[str, torch.Tensor]):
    """The tensors of a weights file, mapped from the file instead of read: a tensor's pages are
    read when it is first used, and release(name) drops them from this process's resident set
    again (they stay in the OS page cache). pack holds about one block of the model this way,
    whatever the file's size. close() unmaps the file (the tensors must not be used after)."""

    def __init__(self, path: Path, tensors: dict[str, torch.Tensor], keep_alive: object = None) -> None:
        self._path = path
        self._tensors = tensors
        self._keep_alive = keep_alive  # e.g. the safetensors handle that owns the mapping
        self._ranges = _file_mappings(path)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._tensors[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    @property
    def mapped_ranges(self) -> list[tuple[int, int]]:
        """[start, end) of this process's mappings of the file: the only memory release() touches."""
        return list(self._ranges)

    def release(self, name: str) -> None:
        """Drop `name`'s pages from the resident set (only ever within this file's own mappings)."""
        t = self._tensors.get(name)
        if t is not None and t.numel():
            start = t.data_ptr()  # a view's extent: its last element is at sum((size - 1) * stride)
            last = sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
            release_mapped(self._ranges, start, start + (last + 1) * t.element_size())

    def close(self) -> None:
        self._tensors = {}
        self._keep_alive = None


_PAGE = mmap.PAGESIZE
_MADV_DONTNEED = 4


def _file_mappings(path: Path) -> list[tuple[int, int]]:
    """[start, end) of this process's mappings of `path` (matched by device and inode), from
    /proc/self/maps; empty where there is no such file (then nothing is ever released)."""
    try:
        st = os.stat(path)
        with open("/proc/self/maps") as f:
            lines = f.readlines()
    except OSError:
        return []
    out = []
    for line in lines:
        parts = line.split()
        if len(parts) < 6 or parts[4] != str(st.st_ino):
            continue
        major, minor = (int(x, 16) for x in parts[3].split(":"))
        if os.makedev(major, minor) != st.st_dev:
            continue
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        out.append((lo, hi))
    return out


def release_mapped(ranges: list[tuple[int, int]], start: int, end: int) -> None:
    """madvise(MADV_DONTNEED) on the whole pages of [start, end) that lie inside one of `ranges`,
    which must be read-only or unmodified private file mappings: their pages are read again
    from the file if touched. Never applied to anything else (that would discard data)."""
    lo = (start + _PAGE - 1) // _PAGE * _PAGE  # whole pages only: a neighbour's page stays
    hi = end // _PAGE * _PAGE
    libc = _libc()
    if hi <= lo or libc is None or not any(a <= lo and hi <= b for a, b in ranges):
        return
    libc.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), _MADV_DONTNEED)


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        return libc
    except (OSError, AttributeError):
        return None


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
    """Read a TC-layout directory (or its .pt / .safetensors file, siblings from its directory)."""
    src = Path(src)
    d, weights = _find_weights(src)
    stem = weights.stem
    if not (d / f"{stem}.json").is_file():
        raise InputError(f"{stem}.json (the SlicingConfig) is missing next to {weights.name}")
    if not (d / "config.json").is_file():
        raise InputError(f"config.json is missing in {d} (copy the source model's config.json next to {weights.name})")
    _check_stem(stem)
    files: dict[str, bytes] = {}
    total = 0
    for p in sorted(d.iterdir()):
        if p.is_file() and not p.name.startswith(".") and p != weights and _is_side_file(p.name):
            try:
                total += p.stat().st_size
                if total > SIDE_FILES_MAX_BYTES:  # before reading: a huge JSON is refused unread
                    raise InputError(f"side files up to {p.name} total {total:,} bytes; a container carries at most "
                                     f"{SIDE_FILES_MAX_BYTES:,} (its metadata is limited to 64 MiB)")
                files[p.name] = p.read_bytes()
            except OSError as exc:
                raise InputError(f"cannot read {p}: {exc.strerror or exc}") from None
    # the cheap checks (JSON configs) before the weights are loaded
    hf = _parse_json(files, "config.json")
    sc = _parse_json(files, f"{stem}.json")
    sd = _load_pt(weights) if weights.suffix == ".pt" else _load_safetensors(weights)
    return Checkpoint(stem, sd, sc, hf, files)


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _torch_save_synced(path: Path, sd: dict[str, torch.Tensor]) -> None:
    """torch.save to a path (so the zip's root folder is named after the file, as in TC's files),
    fsync, and check the result. torch's C++ writer reports a failed write as a RuntimeError
    ("unexpected pos", "iostream error"), not an OSError, so the real OSError is recovered by
    probing. The zip's end is checked too, in case a write is lost without an exception (an
    unchecked final flush): a cheap guard, the central directory is a few KB."""
    try:
        torch.save(sd, str(path))
    except RuntimeError as exc:
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise fsutil.probe_write(path) or OSError(None, f"torch.save failed: {why}") from None
    with open(path, "rb+") as f:
        os.fsync(f.fileno())
    if not torch_zip_is_whole(path):
        raise fsutil.probe_write(path) or OSError(None, "torch.save wrote an incomplete file")


def _json_bytes(obj: dict[str, Any], one_line: bool) -> bytes:
    # TC writes SlicingConfig with json.dumps(asdict(...)); HF writes config.json indented, sorted
    text = json.dumps(obj) if one_line else json.dumps(obj, indent=2, sort_keys=True) + "\n"
    return text.encode("utf-8")


def _can_swap(dst: Path) -> bool:
    """Can a staged sibling directory be renamed onto DST? Yes if DST does not exist, or is an
    empty real directory that is not a mount point, not on another device than its parent and
    not the current directory (renaming over it would leave the shell in a deleted directory)."""
    if not os.path.lexists(dst):
        return True
    try:
        if dst.is_symlink() or not dst.is_dir() or os.path.ismount(dst):
            return False
        with os.scandir(dst) as it:
            if any(True for _ in it):
                return False
        if os.stat(dst).st_dev != os.stat(dst.parent).st_dev:
            return False
        return not os.path.samefile(dst, os.getcwd())
    except OSError:
        return False


def publish_checkpoint(dst: Path | str, stem: str, files: Mapping[str, bytes], fmt: str,
                       write_weights: Callable[[Path], None]) -> Path:
    """Write <stem>.pt (or .safetensors), <stem>.json, config.json and the side files into DST;
    `write_weights(path)` creates, writes and fsyncs the weights file (it may stream it).

    As atomic as POSIX allows (plain renames, nothing OS-specific). Every file is first
    written and fsynced in a staging directory named `.<DST name>.bbtmp-<12 hex>`; then:

    * DST absent (or an empty directory): the staging directory is created next to DST and
      renamed to DST in one step, so DST is at every moment absent (or empty) or complete.
      An empty DST is replaced by the new directory, except when it is a symlink, a mount
      point, on another device than its parent or the current directory: then as below.
    * DST holds files: the staging directory is inside DST, and once everything is written
      and fsynced its files are moved over their final names (os.replace) in one quick
      burst, the weights file last. Each file is at every moment its old or its new version,
      complete, and whenever the new weights file is in place every other file is new too.
      The remaining window: a crash during the burst (a few renames) can leave new side files
      (config.json, <stem>.json, tokenizer files) next to the old weights file, which may not
      load together if those files differ between the two versions. POSIX has no call that
      swaps two directories atomically.

    Files in DST that the checkpoint does not have are left alone. A killed process can leave
    its staging directory behind, never anything under a name a reader uses; a later
    successful write into the same DST removes such leftovers once they are an hour old
    (fsutil.remove_stale_temps). An OSError while writing becomes an OutputError (NoSpaceError
    for a full disk or a file-size limit) and the staging directory is removed. Returns DST.
    """
    if fmt not in ("pt", "safetensors"):
        raise InputError(f"unknown checkpoint format {fmt!r} (choose 'pt' or 'safetensors')")
    _check_stem(stem)
    dst = Path(dst)
    files = dict(files)
    for name in files:
        if not name or "/" in name or "\\" in name or name.startswith(".") or name.endswith(WEIGHT_SUFFIXES):
            raise InputError(f"refusing to write side file {name!r}")
    weights = f"{stem}.{fmt}"
    order = sorted(files) + [weights]  # the weights file last: see the docstring
    if os.path.lexists(dst) and not dst.is_dir():
        raise InputError(f"{dst} exists and is not a directory")
    for name in order:
        if (dst / name).is_dir():
            raise InputError(f"{dst / name} is a directory; refusing to write there")
    label = os.path.basename(os.path.abspath(dst)) or "checkpoint"
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise output_error(exc, dst.parent) from None
    existed = os.path.lexists(dst)
    swap = _can_swap(dst)
    staging = (dst.parent if swap else dst) / fsutil.temp_name(label)
    replaced = 0
    try:
        try:
            os.mkdir(staging)
        except PermissionError:
            if not (swap and existed):
                raise
            swap = False  # an empty DST we may write into, in a parent we may not: stage inside DST
            staging = dst / fsutil.temp_name(label)
            os.mkdir(staging)
        try:
            for name, data in sorted(files.items()):
                _write_synced(staging / name, data)
            write_weights(staging / weights)
            fsync_dir(staging)
            if swap:
                try:
                    os.replace(staging, dst)
                except OSError:  # DST appeared and holds files, or the OS cannot replace a directory
                    swap = False
            if not swap:
                dst.mkdir(exist_ok=True)
                for name in order:  # the burst
                    os.replace(staging / name, dst / name)
                    replaced += 1
                os.rmdir(staging)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    except OSError as exc:
        if replaced:
            note = f"; {dst} now holds {replaced} of the {len(order)} new files"
        else:
            note = f"; the existing {dst} is unchanged" if existed else f"; {dst} was not created"
        raise output_error(exc, dst, note) from None
    fsync_dir(dst)
    fsync_dir(dst.parent)
    fsutil.remove_stale_temps(dst.parent, label)
    fsutil.remove_stale_temps(dst, label)
    return dst


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
    _check_stem(stem)
    _parse_json(files, "config.json")
    _parse_json(files, f"{stem}.json")


def write_checkpoint(ckpt: Checkpoint, dst: Path | str, fmt: str = "pt") -> Path:
    """Write a checkpoint held in memory (see publish_checkpoint for how, atomically)."""
    if fmt not in ("pt", "safetensors"):
        raise InputError(f"unknown checkpoint format {fmt!r} (choose 'pt' or 'safetensors')")
    for k, v in ckpt.state_dict.items():
        if not isinstance(v, torch.Tensor):
            raise InputError(f"value of {k!r} is a {type(v).__name__}, not a tensor")
    files = side_files(ckpt.stem, ckpt.extra_files, ckpt.hf_config, ckpt.slicing_config)

    def weights(path: Path) -> None:
        if fmt == "pt":
            _torch_save_synced(path, dict(ckpt.state_dict))
        else:
            import safetensors.torch

            sd = {k: v.detach().contiguous() for k, v in ckpt.state_dict.items()}
            _write_synced(path, safetensors.torch.save(sd, metadata={"format": "pt"}))

    return publish_checkpoint(dst, ckpt.stem, files, fmt, weights)

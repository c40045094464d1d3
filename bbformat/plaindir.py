"""Plain Hugging Face model directories (any architecture, not sliced), kept byte for byte.

pack stores the tensors of every `.safetensors` file in the tree, and each file's header bytes
[0, 8 + N) verbatim; every other file travels as bytes in the metadata (`files`). unpack writes
the header back and each tensor's bytes at its offset, so every file comes back identical
(SPEC.md 4.1, `directory`). Tensor names: the model's own files (`model.safetensors`, or the
shards its index names) keep their tensors' names; any other safetensors file's tensors are
named `<relative path>/<name>` (e.g. `2_Dense/model.safetensors/linear.weight`).

No torch here: the tensors are mapped from the files with mmap and handed out as RawTensors.
"""
from __future__ import annotations

import base64
import binascii
import json
import mmap
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from collections.abc import Iterator
from typing import Any, BinaryIO

import numpy as np

from .codec.dtypes import RawTensor, uint_dtype
from .codec.layout import ChunkLayout, ModelLayout
from .constants import DTYPE_BITS, EXTENDED_DTYPES, PLAIN_CHUNK_BYTES, SAFETENSORS_DTYPES
from .errors import FormatError, InputError
from .fsutil import check_relative_path

WEIGHTS, INDEX = "model.safetensors", "model.safetensors.index.json"
SAFETENSORS_MAX_HEADER = 100 << 20  # the safetensors library's own limit
SKIPPED_DIRS = (".git",)  # version control, not the model: never packed
# Weight files of other formats, at the top level (transformers' names): never read
OTHER_WEIGHTS = re.compile(r"(pytorch_model|tf_model|flax_model)(-\d+-of-\d+)?\.(bin|h5|msgpack)|model\.ckpt\.index")
_LAYER = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks|block)\.(\d+)\.")
_SLICING_KEYS = {"layers_num", "embedding_dimensions"}  # a TransformerCompression SlicingConfig


@dataclass(frozen=True)
class StTensor:
    """One tensor of a safetensors header: its name there, container dtype, shape, data offsets."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass
class StFile:
    """A safetensors file of the directory: relative path, header bytes [0, 8 + N), tensors in
    data order, and their container names (`keys`, the same order)."""

    path: str
    header: bytes
    tensors: list[StTensor]
    keys: list[str] = field(default_factory=list)

    def name_tensors(self, prefix: str) -> None:
        self.keys = [prefix + t.name for t in self.tensors]


@dataclass
class PlainDir:
    """A plain directory read for pack: its other files' bytes, its safetensors files mapped."""

    root: Path
    architecture: str
    files: dict[str, bytes]
    weights: list[StFile]
    _maps: dict[str, mmap.mmap] = field(default_factory=dict)
    _where: dict[str, tuple[StFile, StTensor]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._where = {k: (f, t) for f in self.weights for k, t in zip(f.keys, f.tensors)}

    @property
    def keys(self) -> list[str]:
        return list(self._where)

    def describe(self, key: str) -> tuple[str, tuple[int, ...]]:
        """The tensor's dtype and shape, from its header (nothing read)."""
        t = self._where[key][1]
        return t.dtype, t.shape

    def extended_dtypes(self) -> set[str]:
        """The dtypes of its tensors that only format 1.6 stores (EXTENDED_DTYPES)."""
        return {t.dtype for f in self.weights for t in f.tensors} & EXTENDED_DTYPES

    def tensor(self, key: str) -> RawTensor:
        """The tensor's bits, copied out of the mapping, whose pages are then dropped again."""
        f, t = self._where[key]
        mm = self._map(f)
        start = len(f.header) + t.begin
        kind = uint_dtype(DTYPE_BITS[t.dtype]).newbyteorder("<")
        bits = np.frombuffer(mm, dtype=kind, count=int(np.prod(t.shape, dtype=np.int64)), offset=start)
        out = RawTensor(t.dtype, bits.reshape(t.shape).copy())
        del bits
        _release(mm, start, len(f.header) + t.end)
        return out

    def _map(self, f: StFile) -> mmap.mmap:
        if f.path not in self._maps:
            try:
                with open(self.root / f.path, "rb") as fh:
                    mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError) as exc:
                raise InputError(f"cannot map {self.root / f.path}: {exc}") from None
            if len(mm) != len(f.header) + (f.tensors[-1].end if f.tensors else 0):
                mm.close()
                raise InputError(f"{self.root / f.path} changed size while it was packed")
            self._maps[f.path] = mm
        return self._maps[f.path]

    def close(self) -> None:
        for mm in self._maps.values():
            try:
                mm.close()
            except BufferError:  # a tensor view still alive: the mapping goes with it
                pass
        self._maps = {}

    def __enter__(self) -> PlainDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _release(mm: mmap.mmap, start: int, end: int) -> None:
    """Drop the whole pages of [start, end) from the resident set (a read-only file mapping:
    they are read again from the file if touched)."""
    page = mmap.PAGESIZE
    lo, hi = (start + page - 1) // page * page, end // page * page
    if hi > lo and hasattr(mmap, "MADV_DONTNEED"):
        mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)


# ----------------------------------------------------------------------------- paths


def check_tree(paths: list[str]) -> None:
    """No path may also be a folder of another (`a` and `a/b`)."""
    names = set(paths)
    for p in paths:
        for parent in PurePosixPath(p).parents:
            if str(parent) != "." and str(parent) in names:
                raise InputError(f"{parent!r} is both a file and a folder of {p!r}")


# ----------------------------------------------------------------------------- safetensors headers


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate name {k!r}")
        out[k] = v
    return out


def parse_header(header: bytes, data_bytes: int | None, label: str) -> list[StTensor]:
    """The tensors of a safetensors header (its bytes [0, 8 + N)) in data order, every entry
    checked: known dtype, shape, size = shape x dtype, offsets that tile [0, data_bytes)
    without gap or overlap (data_bytes None: up to the last offset). InputError if not."""
    if len(header) < 8 or int.from_bytes(header[:8], "little") != len(header) - 8:
        raise InputError(f"{label}: safetensors header length does not match its bytes")
    try:
        obj = json.loads(header[8:].decode("utf-8"), object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise InputError(f"{label}: safetensors header is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise InputError(f"{label}: safetensors header is not a JSON object")
    tensors = sorted((_entry(label, k, v) for k, v in obj.items() if k != "__metadata__"), key=lambda t: (t.begin, t.end))
    at = 0
    for t in tensors:
        if t.begin != at:
            raise InputError(f"{label}: tensor {t.name!r} starts at {t.begin:,}, not at {at:,} "
                             f"({'overlapping' if t.begin < at else 'a gap before it'})")
        at = t.end
    if data_bytes is not None and at != data_bytes:
        raise InputError(f"{label}: the tensors end at byte {at:,} of the data, which has {data_bytes:,}")
    return tensors


def _entry(label: str, name: str, v: Any) -> StTensor:
    if not isinstance(v, dict) or set(v) - {"dtype", "shape", "data_offsets"} or len(v) != 3:
        raise InputError(f"{label}: header entry {name!r} is not {{dtype, shape, data_offsets}}")
    dt, shape, offs = v["dtype"], v["shape"], v["data_offsets"]
    if not isinstance(dt, str) or dt not in SAFETENSORS_DTYPES:
        raise InputError(f"{label}: tensor {name!r} has dtype {dt!r}, which bbformat cannot store "
                         f"(it stores {', '.join(SAFETENSORS_DTYPES)})")
    if not (isinstance(shape, list) and all(type(n) is int and n >= 0 for n in shape)):
        raise InputError(f"{label}: tensor {name!r} has shape {shape!r}, not a list of sizes")
    if not (isinstance(offs, list) and len(offs) == 2 and all(type(n) is int for n in offs) and 0 <= offs[0] <= offs[1]):
        raise InputError(f"{label}: tensor {name!r} has data_offsets {offs!r}, not [begin, end]")
    dtype = SAFETENSORS_DTYPES[dt]
    numel = 1
    for n in shape:
        numel *= n
    if numel * DTYPE_BITS[dtype] // 8 != offs[1] - offs[0]:
        raise InputError(f"{label}: tensor {name!r} takes {offs[1] - offs[0]:,} bytes, but {dt} {shape} needs "
                         f"{numel * DTYPE_BITS[dtype] // 8:,}")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(f"{label}: tensor name {name!r} is not valid UTF-8") from None
    return StTensor(name, dtype, tuple(shape), offs[0], offs[1])


def read_header(path: Path, label: str) -> StFile:
    """A safetensors file's header, its length checked against the file before it is read."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) != 8:
                raise InputError(f"{label}: shorter than a safetensors header")
            n = int.from_bytes(head, "little")
            if n > min(SAFETENSORS_MAX_HEADER, size - 8):
                raise InputError(f"{label}: header length {n:,} runs past the file ({size:,} bytes) or the 100 MiB limit")
            header = head + f.read(n)
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
    return StFile(label, header, parse_header(header, size - 8 - n, label))


# ----------------------------------------------------------------------------- the directory


def is_plain_dir(src: Path) -> bool:
    """A directory with a config.json that is not sliced: no top-level .pt, no SlicingConfig
    (<stem>.json beside <stem>.safetensors, or any top-level JSON with its keys), and not a
    directory that `unpack --format hf` wrote of a sliced model."""
    if not src.is_dir() or not (src / "config.json").is_file():
        return False
    top = {p.name: p for p in src.iterdir() if p.is_file()}
    if any(n.endswith(".pt") for n in top):
        return False
    if any(n.endswith(".safetensors") and f"{n[:-len('.safetensors')]}.json" in top for n in top):
        return False
    return not any(_is_sliced_json(p) for n, p in top.items() if n.endswith(".json"))


def _is_sliced_json(path: Path) -> bool:
    """A SlicingConfig, or the config.json of a sliced model's HF directory (`sliced_base`)."""
    keys = _json_keys(path)
    return _SLICING_KEYS <= keys or "sliced_base" in keys


def _json_keys(path: Path) -> set[str]:
    try:
        if path.stat().st_size > 1 << 20:
            return set()
        obj = json.loads(path.read_bytes())
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return set()
    return set(obj) if isinstance(obj, dict) else set()


def walk(root: Path) -> list[str]:
    """Every file under root as a relative POSIX path, sorted (symlinks to files followed;
    .git skipped). Anything else (a FIFO, a socket, a broken or folder symlink) is refused."""
    out: list[str] = []
    for dirpath, dirs, names in os.walk(root, followlinks=False, onerror=_walk_error):
        here = Path(dirpath)
        for d in list(dirs):
            if (here / d).is_symlink():
                raise InputError(f"{here / d} is a symbolic link to a folder; give a directory without one")
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        for n in names:
            p = here / n
            try:
                mode = os.stat(p).st_mode
            except OSError as exc:
                raise InputError(f"cannot read {p}: {exc.strerror or exc}") from None
            if not stat.S_ISREG(mode):
                raise InputError(f"{p} is not a regular file")
            out.append(p.relative_to(root).as_posix())
    return sorted(out)


def _walk_error(exc: OSError) -> None:
    raise InputError(f"cannot list {exc.filename}: {exc.strerror or exc}")


def read_plain_dir(root: Path, budget: int) -> PlainDir:
    """Check and read a plain directory: weight formats, the index against its shards, every
    safetensors header; then the other files (at most `budget` bytes with the headers)."""
    paths = walk(root)
    st_paths = [p for p in paths if p.endswith(".safetensors")]
    is_weights = set(st_paths)
    _refuse_other_formats(root, paths, st_paths)
    shards = _model_shards(root, paths)
    model = set(shards)
    ordered = shards + [p for p in st_paths if p not in model]  # st_paths: sorted
    weights = [read_header(root / p, p) for p in ordered]
    for f in weights:
        f.name_tensors("" if f.path in model else f"{f.path}/")
    _check_names(weights)
    if INDEX in paths:
        _check_index(root, weights[: len(shards)])
    others = [p for p in paths if p not in is_weights]
    _check_budget(root, others, sum(len(f.header) for f in weights), budget)
    files = {p: _read(root / p) for p in others}
    return PlainDir(root, _architecture(files), files, weights)


def _refuse_other_formats(root: Path, paths: list[str], st_paths: list[str]) -> None:
    other = [p for p in paths if "/" not in p and OTHER_WEIGHTS.fullmatch(p)]
    if other and st_paths:
        raise InputError(f"{root} holds weights in two formats ({st_paths[0]} and {other[0]}); remove the one not to pack")
    if other:
        hint = ".bin is a pickle, which bbformat never unpickles and cannot give back byte for byte" if other[0].endswith(
            ".bin") else "bbformat reads safetensors only"
        raise InputError(f"{root} holds {other[0]} and no .safetensors: {hint}; convert the model to safetensors "
                         "(save_pretrained(..., safe_serialization=True)) and pack that")
    if not st_paths:
        raise InputError(f"{root} holds no .safetensors weights")


def _model_shards(root: Path, paths: list[str]) -> list[str]:
    """The model's own weights files: model.safetensors, or the shards its index names."""
    if INDEX not in paths:
        return [WEIGHTS] if WEIGHTS in paths else []
    if WEIGHTS in paths:
        raise InputError(f"{root} has both {WEIGHTS} and {INDEX}: ambiguous, remove the one that is stale")
    names = list(dict.fromkeys(_weight_map(root).values()))
    for n in names:
        if "/" in n or "\\" in n or n in (".", "..") or not n.endswith(".safetensors"):
            raise InputError(f"{root / INDEX} names {n!r}, which is not a .safetensors file in {root}")
        if n not in paths:
            raise InputError(f"{root / INDEX} names the shard {n!r}, which is missing")
    return sorted(names)


def _weight_map(root: Path) -> dict[str, str]:
    try:
        if (root / INDEX).stat().st_size > SAFETENSORS_MAX_HEADER:
            raise InputError(f"{root / INDEX} is over {SAFETENSORS_MAX_HEADER:,} bytes")
        obj = json.loads((root / INDEX).read_bytes().decode("utf-8"))
    except OSError as exc:
        raise InputError(f"cannot read {root / INDEX}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise InputError(f"{root / INDEX} is not valid JSON: {exc}") from None
    wm = obj.get("weight_map") if isinstance(obj, dict) else None
    if not isinstance(wm, dict) or not wm or not all(isinstance(v, str) for v in wm.values()):
        raise InputError(f"{root / INDEX} has no weight_map of tensor names to files")
    return wm


def _check_index(root: Path, shards: list[StFile]) -> None:
    wm = _weight_map(root)
    where = {t.name: f.path for f in shards for t in f.tensors}
    wrong = sorted(k for k in set(wm) | set(where) if wm.get(k) != where.get(k))
    if wrong:
        raise InputError(f"{root / INDEX} does not match its shards (e.g. {wrong[0]!r}: index says "
                         f"{wm.get(wrong[0])}, shards say {where.get(wrong[0])})")


def _check_names(weights: list[StFile]) -> None:
    seen: dict[str, str] = {}
    for f in weights:
        for key in f.keys:
            if key in seen:
                raise InputError(f"tensor {key!r} is in both {seen[key]} and {f.path}")
            if len(key.encode("utf-8")) > 0xFFFF:
                raise InputError(f"{f.path}: tensor name {key[:40]!r}... is over 65,535 bytes")
            seen[key] = f.path


def _check_budget(root: Path, others: list[str], used: int, budget: int) -> None:
    sizes = {p: (root / p).stat().st_size for p in others}
    if used + sum(sizes.values()) > budget:
        big = max(sizes, key=lambda p: sizes[p], default=None)
        what = f"the biggest is {big} ({sizes[big]:,} bytes)" if big else "its safetensors headers alone"
        raise InputError(f"{root}'s files other than weights total {used + sum(sizes.values()):,} bytes, over the "
                         f"{budget:,} bytes a container's metadata carries; {what}")


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None


def _architecture(files: dict[str, bytes]) -> str:
    """config.json's model_type (informative), which must be a JSON object."""
    try:
        cfg = json.loads(files["config.json"].decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise InputError(f"config.json is not valid JSON: {exc}") from None
    if not isinstance(cfg, dict):
        raise InputError("config.json must hold a JSON object")
    kind = cfg.get("model_type")
    return kind if isinstance(kind, str) and kind else "unknown"


# ----------------------------------------------------------------------------- chunks


def plain_layout(d: PlainDir, chunk_bytes: int = PLAIN_CHUNK_BYTES) -> ModelLayout:
    """Chunks of consecutive tensors in data order: a new one at each file, layer index
    (`layers.N.`, `h.N.`, ...) or symbol width class (8-bit or wider), or past chunk_bytes."""
    chunks: list[ChunkLayout] = []
    group: list[str] = []
    mark: tuple[str, str | None, bool] | None = None
    used = 0
    for f in d.weights:
        for key, t in zip(f.keys, f.tensors):
            m = _LAYER.search(t.name)
            here = (f.path, t.name[: m.end() - 1] if m else None, DTYPE_BITS[t.dtype] == 8)
            size = t.end - t.begin
            if group and (here != mark or used + size > chunk_bytes):
                chunks.append(_chunk(group, mark))
                group, used = [], 0
            group.append(key)
            mark, used = here, used + size
    if group:
        chunks.append(_chunk(group, mark))
    return ModelLayout(d.architecture, "none", chunks)


def _chunk(names: list[str], mark: tuple[str, str | None, bool] | None) -> ChunkLayout:
    label = mark[1] if mark and mark[1] else names[0]
    return ChunkLayout(label[:200], tuple(names), ())


# ----------------------------------------------------------------------------- unpack


def directory_metadata(d: PlainDir) -> dict[str, Any]:
    """The container's `directory` metadata (SPEC.md 4.1)."""
    return {"safetensors": [{"path": f.path, "header": base64.b64encode(f.header).decode("ascii"), "tensors": f.keys}
                            for f in d.weights]}


def decode_files(files: Any) -> dict[str, bytes]:
    """The metadata's `files` (relative path -> base64), decoded (FormatError E_METADATA if not that)."""
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise FormatError("metadata 'files' is not an object of base64 strings", "E_METADATA")
    try:
        return {k: base64.b64decode(v, validate=True) for k, v in files.items()}
    except (binascii.Error, ValueError):
        raise FormatError("metadata 'files' holds a value that is not base64", "E_METADATA") from None


def unpack_plan(directory: Any, files: dict[str, bytes], entries: dict[str, tuple[str, tuple[int, ...]]]) -> list[StFile]:
    """The safetensors files to write back, from a container's `directory` metadata, checked
    against its tensors (name -> (dtype, shape)) and its other files (FormatError E_METADATA)."""
    try:
        return _plan(directory, files, entries)
    except InputError as exc:
        raise FormatError(f"metadata 'directory': {exc}", "E_METADATA") from None


def _plan(directory: Any, files: dict[str, bytes], entries: dict[str, tuple[str, tuple[int, ...]]]) -> list[StFile]:
    items = directory.get("safetensors") if isinstance(directory, dict) else None
    if not isinstance(items, list):
        raise InputError("no list of safetensors files")
    out: list[StFile] = []
    for item in items:
        if not (isinstance(item, dict) and isinstance(item.get("path"), str) and isinstance(item.get("header"), str)
                and isinstance(item.get("tensors"), list) and all(isinstance(k, str) for k in item["tensors"])):
            raise InputError("an entry is not {path, header, tensors}")
        path = check_relative_path(item["path"])
        try:
            header = base64.b64decode(item["header"], validate=True)
        except (binascii.Error, ValueError):
            raise InputError(f"{path}: header is not base64") from None
        f = StFile(path, header, parse_header(header, None, path), list(item["tensors"]))
        if len(f.keys) != len(f.tensors):
            raise InputError(f"{path}: {len(f.keys)} tensor names for {len(f.tensors)} header entries")
        for k, t in zip(f.keys, f.tensors):
            if entries.get(k) != (t.dtype, t.shape):
                raise InputError(f"{path}: tensor {k!r} is {entries.get(k, 'missing')} in the container, "
                                 f"{(t.dtype, t.shape)} in the header")
        out.append(f)
    keys = [k for f in out for k in f.keys]
    if len(set(keys)) != len(keys):
        raise InputError("a tensor is named in two files")
    paths = [f.path for f in out] + [check_relative_path(p) for p in files]
    if len(set(paths)) != len(paths):
        raise InputError("a file is named twice")
    check_tree(paths)
    return out


def write_safetensors(where: Path, plan: list[StFile], tensors: Iterator[tuple[str, RawTensor]]) -> None:
    """Write the plan's files under `where`: each header verbatim, each tensor's bytes at its
    offset as it comes (any order); then check that every tensor came, and fsync."""
    route = {k: (f, t) for f in plan for k, t in zip(f.keys, f.tensors)}
    handles: dict[str, BinaryIO] = {}
    try:
        for f in plan:
            (where / f.path).parent.mkdir(parents=True, exist_ok=True)
            handles[f.path] = open(where / f.path, "xb")
            handles[f.path].write(f.header)
        for name, raw in tensors:
            if name not in route:
                continue
            f, t = route.pop(name)
            if (raw.dtype, raw.shape) != (t.dtype, t.shape):
                raise FormatError(f"tensor {name!r} decodes as {raw.dtype} {raw.shape}, its header said {t.dtype} {t.shape}",
                                  "E_DESCRIPTOR")
            h = handles[f.path]
            h.seek(len(f.header) + t.begin)
            h.write(raw.little_endian().reshape(-1).view(np.uint8).data)
        if route:
            raise FormatError(f"the container lacks tensors its directory metadata names: {sorted(route)[:3]}", "E_METADATA")
        for h in handles.values():
            h.flush()
            os.fsync(h.fileno())
    finally:
        for h in handles.values():
            h.close()

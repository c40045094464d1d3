"""Write checkpoint files tensor by tensor, in any order, in bounded memory.

* `SafetensorsWriter`: a `.safetensors` file whose tensors (name, dtype, shape) are all known
  up front. The finished file is byte for byte what `safetensors.torch.save(tensors,
  metadata=metadata)` returns (safetensors 0.8; see `_st_header` for the rules), except
  that a multi-key `metadata` keeps the caller's key order where safetensors uses a random
  one (a Rust HashMap), and that no tensors with `metadata={}` gives a readable header.
* `TorchZipWriter`: the zip archive `torch.save(dict_of_tensors, path)` writes, one storage
  record at a time as tensors arrive; `data.pkl` is written last. Its `data.pkl` and `data/N`
  records are byte for byte torch.save's for the same dict (each tensor with its own
  contiguous storage); only the records' order in the archive (data/N first, in write order)
  and so `.data/serialization_id` differ, which torch.load does not look at.

torch internals relied on (checked for torch 2.13.x at use; `_check_torch` refuses others):
`torch._C.PyTorchFileWriter` (the C++ zip writer torch.save uses: 64-byte alignment, zip64,
CRC32, `version`/`.data/serialization_id` written by `write_end_of_file`), its
`write_record(name, storage, nbytes)`, `torch.serialization.get_crc32_options` and
`_get_storage_alignment`, and what `torch.serialization._save` writes: `data.pkl` (protocol 2;
each tensor reduced to `torch._utils._rebuild_tensor_v2(storage, offset, size, stride,
requires_grad, OrderedDict())`, each storage a persistent id `('storage', torch.<T>Storage,
key, 'cpu', numel)`, keys "0", "1", ... in pickling order), `.format_version` = "1",
`.storage_alignment`, `byteorder` and `data/<key>`. A torch.load option that computes record
offsets instead of reading them (`torch.utils.serialization.config.load.
calculate_storage_offsets`, off by default) assumes torch.save's record order and does not
apply to these files.
"""
from __future__ import annotations

import collections
import errno
import io
import json
import math
import os
import pickle
import struct
import sys
import zipfile
from collections.abc import Sequence
from typing import Any, BinaryIO, SupportsIndex

import numpy as np
import torch

from .errors import BBFormatError, InputError
from .fsutil import fsync_path, probe_write

__all__ = ["SafetensorsWriter", "TorchZipWriter", "torch_zip_is_whole"]

TORCH_PIN = "2.13."
_CHUNK = 1 << 30  # bytes per write() call

# ---------------------------------------------------------------------------- shared helpers


def _dense(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """The tensor as a C-contiguous CPU tensor (a copy only if it is not contiguous)."""
    if not isinstance(tensor, torch.Tensor):
        raise InputError(f"{name!r}: expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.layout != torch.strided or tensor.device.type != "cpu":
        raise InputError(f"{name!r}: only dense CPU tensors can be written (got {tensor.layout} on {tensor.device})")
    t = tensor.detach().resolve_conj().resolve_neg()  # no-ops unless a lazy conj/neg view
    return t if t.is_contiguous() else t.contiguous()


def _writable(name: str, tensor: torch.Tensor, writer: str, ended: str | None, known: bool, written: bool) -> torch.Tensor:
    """The tensor, dense, if `name` may be written now: the writer has not ended ("finished",
    "closed"), `name` is one of its tensors and has not been written yet."""
    if ended:
        raise InputError(f"{name!r}: the {writer} is already {ended}")
    if not known:
        raise InputError(f"{name!r} is not one of the {writer}'s tensors")
    if written:
        raise InputError(f"{name!r} was already written")
    return _dense(name, tensor)


def _flat(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor as 1-D with stride 1 (a size-1 dim may carry any stride), no copy."""
    return t.as_strided((t.numel(),), (1,))


def _byte_view(t: torch.Tensor) -> np.ndarray:
    """The bytes of a contiguous tensor without a copy (little-endian: swapped copy on big-endian hosts)."""
    flat = _flat(t)
    if sys.byteorder == "big" and t.element_size() > 1:
        ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
        return flat.view(ints).numpy().byteswap().view(np.uint8)
    return flat.view(torch.uint8).numpy()


def _check_names(names: Sequence[str], what: str) -> None:
    seen: set[str] = set()
    for n in names:
        if not isinstance(n, str):
            raise InputError(f"{what}: tensor name {n!r} is not a string")
        if n in seen:
            raise InputError(f"{what}: tensor name {n!r} appears twice")
        seen.add(n)


def _missing(names: Sequence[str], written: set[str]) -> None:
    left = [n for n in names if n not in written]
    if left:
        more = f" and {len(left) - 3} more" if len(left) > 3 else ""
        raise InputError(f"finish() with {len(left)} tensor(s) never written: {', '.join(map(repr, left[:3]))}{more}")


# ---------------------------------------------------------------------------- safetensors

# torch dtype -> safetensors code, for the dtypes whose place in safetensors' order is checked
_ST_CODE = {torch.bool: "BOOL", torch.uint8: "U8", torch.int8: "I8", torch.int16: "I16", torch.float16: "F16",
            torch.bfloat16: "BF16", torch.int32: "I32", torch.float32: "F32", torch.float64: "F64", torch.int64: "I64"}
# the relative order of these codes in safetensors' Rust `Dtype` enum (ascending)
_ST_RANK = {c: i for i, c in enumerate(("BOOL", "U8", "I8", "I16", "F16", "BF16", "I32", "F32", "F64", "I64"))}


class _Slot:
    __slots__ = ("name", "dtype", "shape", "start", "nbytes")

    def __init__(self, name: str, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
        self.name, self.dtype, self.shape = name, dtype, shape
        self.nbytes = math.prod(shape) * dtype.itemsize
        self.start = 0


def _st_slots(specs: Sequence[tuple[str, torch.dtype, tuple[int, ...]]]) -> list[_Slot]:
    """Validated specs in safetensors' data order: dtype descending (enum order), then name."""
    slots = []
    for spec in specs:
        name, dtype, shape = spec
        if dtype not in _ST_CODE:
            raise InputError(f"{name!r}: dtype {dtype} is not supported (one of {', '.join(map(str, _ST_CODE))})")
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise InputError(f"{name!r}: shape {shape!r} must be non-negative integers")
        slots.append(_Slot(name, dtype, tuple(shape)))
    _check_names([s.name for s in slots], "safetensors specs")
    for s in slots:
        if s.name == "__metadata__":
            raise InputError("a tensor cannot be named '__metadata__' in a safetensors file")
        try:
            s.name.encode("utf-8")
        except UnicodeEncodeError:
            raise InputError(f"tensor name {s.name!r} is not valid UTF-8 text") from None
    slots.sort(key=lambda s: (-_ST_RANK[_ST_CODE[s.dtype]], s.name))
    offset = 0
    for s in slots:
        s.start, offset = offset, offset + s.nbytes
    return slots


def _js(text: str) -> str:
    # serde_json's escaping: ", \, and U+0000..U+001F (\b \f \n \r \t short, others \u00xx)
    return json.dumps(text, ensure_ascii=False)


def _st_header(slots: list[_Slot], metadata: dict[str, str] | None) -> bytes:
    """safetensors' header: compact JSON, `__metadata__` first when given, then the tensors in
    data order as {"dtype","shape","data_offsets"}; padded with spaces to a multiple of 8."""
    parts = []
    if metadata is not None:
        parts.append('"__metadata__":{' + ",".join(f"{_js(k)}:{_js(v)}" for k, v in metadata.items()) + "}")
    for s in slots:
        shape = ",".join(map(str, s.shape))
        parts.append(f'{_js(s.name)}:{{"dtype":"{_ST_CODE[s.dtype]}","shape":[{shape}],'
                     f'"data_offsets":[{s.start},{s.start + s.nbytes}]}}')
    raw = ("{" + ",".join(parts) + "}").encode("utf-8")
    return raw + b" " * (-len(raw) % 8)


def _write_at(f: BinaryIO, offset: int, data: np.ndarray) -> None:
    f.seek(offset)
    view = data.data.cast("B")
    for i in range(0, len(view), _CHUNK):
        part = view[i : i + _CHUNK]
        while part:
            n = f.write(part)
            if n is None:  # a non-blocking raw file that wrote nothing
                raise OSError(errno.EAGAIN, "write() wrote nothing")
            part = part[n:]


class SafetensorsWriter:
    """A `.safetensors` file, header first, tensors written at their offsets in any order.

    `f` is a seekable binary file open for writing, owned by the caller (who closes it and
    fsyncs if needed). The header is written and the file sized at construction."""

    def __init__(self, f: BinaryIO, specs: Sequence[tuple[str, torch.dtype, tuple[int, ...]]],
                 metadata: dict[str, str] | None = None) -> None:
        if metadata is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise InputError("safetensors metadata must map strings to strings")
        if not f.seekable():
            raise InputError("SafetensorsWriter needs a seekable file")
        slots = _st_slots(specs)
        header = _st_header(slots, metadata)
        self._f = f
        self._slots = {s.name: s for s in slots}
        self._order = [s.name for s in slots]
        self._base = 8 + len(header)
        self._written: set[str] = set()
        self._closed = False
        f.seek(0)
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(self._base + sum(s.nbytes for s in slots))

    def write(self, name: str, tensor: torch.Tensor) -> None:
        """Write one tensor's bytes at its offset; it must match its spec exactly."""
        slot = self._slots.get(name)
        t = _writable(name, tensor, "safetensors writer", "finished" if self._closed else None, slot is not None,
                      name in self._written)
        assert slot is not None
        if t.dtype != slot.dtype or tuple(t.shape) != slot.shape:
            raise InputError(f"{name!r}: expected {slot.dtype} {list(slot.shape)}, got {t.dtype} {list(t.shape)}")
        if slot.nbytes:
            _write_at(self._f, self._base + slot.start, _byte_view(t))
        self._written.add(name)

    def finish(self) -> None:
        """Check that every tensor was written and flush the file."""
        _missing(self._order, self._written)
        self._f.flush()
        self._closed = True


# ---------------------------------------------------------------------------- torch zip

# dtype -> legacy storage class name, as torch.storage._dtype_to_storage_type_map() (checked in tests)
_STORAGE = {torch.float16: "HalfStorage", torch.bfloat16: "BFloat16Storage", torch.float32: "FloatStorage",
            torch.float64: "DoubleStorage", torch.uint8: "ByteStorage", torch.int8: "CharStorage",
            torch.int16: "ShortStorage", torch.int32: "IntStorage", torch.int64: "LongStorage", torch.bool: "BoolStorage"}


def _check_torch() -> None:
    """TorchZipWriter reproduces torch.save's internals: only for the torch it was checked on."""
    if not torch.__version__.startswith(TORCH_PIN):
        raise BBFormatError(f"TorchZipWriter is written against torch {TORCH_PIN}x internals "
                            f"(torch._C.PyTorchFileWriter, torch.save's pickle); found torch {torch.__version__}")


class _Storage:
    """Stands for a tensor's storage in the pickle: becomes torch.save's persistent id."""

    __slots__ = ("dtype", "numel")

    def __init__(self, dtype: torch.dtype, numel: int) -> None:
        self.dtype, self.numel = dtype, numel


class _Tensor:
    """Stands for a tensor in the pickle: reduces exactly as torch.Tensor does (no data)."""

    __slots__ = ("storage", "size", "stride")

    def __init__(self, storage: _Storage, size: tuple[int, ...], stride: tuple[int, ...]) -> None:
        self.storage, self.size, self.stride = storage, size, stride

    def __reduce_ex__(self, protocol: SupportsIndex) -> tuple[Any, ...]:
        # Tensor._reduce_ex_internal: (storage, storage_offset, size, stride, requires_grad, hooks)
        hooks: collections.OrderedDict[Any, Any] = collections.OrderedDict()
        args = (self.storage, 0, self.size, self.stride, False, hooks)
        return (torch._utils._rebuild_tensor_v2, args)


class _Pickler(pickle.Pickler):
    """torch.serialization._save's persistent_id: storage keys "0", "1", ... in pickling order."""

    def __init__(self, file: Any) -> None:
        super().__init__(file, protocol=2)  # torch.serialization.DEFAULT_PROTOCOL
        self._keys: dict[int, str] = {}

    def persistent_id(self, obj: Any) -> Any:
        if not isinstance(obj, _Storage):
            return None
        key = self._keys.setdefault(id(obj), str(len(self._keys)))
        return ("storage", getattr(torch, _STORAGE[obj.dtype]), key, "cpu", obj.numel)


def _pickle_state(order: Sequence[str], stubs: dict[str, _Tensor]) -> bytes:
    buf = io.BytesIO()
    _Pickler(buf).dump({name: stubs[name] for name in order})
    return buf.getvalue()


def _probe_error(path: str, exc: BaseException) -> OSError:
    """torch's C++ file writer reports a failed write as a RuntimeError without errno: the
    OSError behind it (fsutil.probe_write), else an EIO naming torch's message."""
    found = probe_write(path)
    if found is not None:
        return found
    why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return OSError(errno.EIO, f"torch's zip writer failed: {why}", path)


def torch_zip_is_whole(path: str | os.PathLike[str]) -> bool:
    """torch's zip ends with an end-of-central-directory record (no comment) and every
    member starts before the central directory."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            if f.tell() < 22:
                return False
            f.seek(-22, os.SEEK_END)
            tail = f.read(22)
        if tail[:4] != b"PK\x05\x06" or tail[20:22] != b"\x00\x00":
            return False
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
            return bool(infos) and all(i.header_offset < zf.start_dir for i in infos)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):
        return False


class TorchZipWriter:
    """What `torch.save({name: tensor for name in order}, path)` writes, record by record.

    Each `write` puts one tensor's bytes in the archive as `data/<key>` at once (key = its
    position in `order`, as torch.save assigns it), in any order; `finish` writes `data.pkl`
    and the version records, closes the archive and fsyncs it. A view of a larger storage
    is written as its own contiguous storage, as `torch.save({k: v.contiguous().clone()})`
    would. `abort` closes an unfinished archive (the caller deletes the file). OS errors
    propagate as OSError; a failed writer is closed and accepts nothing more."""

    def __init__(self, path: str | os.PathLike[str], order: Sequence[str]) -> None:
        _check_torch()
        names = list(order)
        _check_names(names, "TorchZipWriter order")
        self._path = os.fspath(path)
        self._order = names
        self._index = {n: i for i, n in enumerate(names)}
        self._stubs: dict[str, _Tensor] = {}
        self._closed = False
        self._stream: BinaryIO | None = None
        open(self._path, "wb").close()  # a missing directory or a permission error as a real OSError
        crc, align = torch.serialization.get_crc32_options(), torch.serialization._get_storage_alignment()
        try:
            self._path.encode("ascii")
        except UnicodeEncodeError:  # as torch.save: the C++ writer takes ASCII paths only
            self._stream = open(self._path, "wb")
            self._zip = torch._C.PyTorchFileWriter(self._stream, crc, align)
        else:  # the archive's root folder is then named after the file, as torch.save's
            self._zip = torch._C.PyTorchFileWriter(self._path, crc, align)

    def write(self, name: str, tensor: torch.Tensor) -> None:
        """Write one tensor's storage record now; it is pickled in finish()."""
        index = self._index.get(name)
        t = _writable(name, tensor, "torch zip writer", "closed" if self._closed else None, index is not None, name in self._stubs)
        assert index is not None
        if t.dtype not in _STORAGE:
            raise InputError(f"{name!r}: dtype {t.dtype} is not supported (one of {', '.join(map(str, _STORAGE))})")
        self._record(f"data/{index}", t)
        self._stubs[name] = _Tensor(_Storage(t.dtype, t.numel()), tuple(t.shape), tuple(t.stride()))

    def _record(self, record: str, t: torch.Tensor) -> None:
        """One storage record straight from the tensor's memory (no copy, even at an offset)."""
        if t.numel() == 0:
            self._call(self._zip.write_record, record, b"", 0)
            return
        exact = torch.frombuffer(_flat(t).view(torch.uint8).numpy().data, dtype=torch.uint8)
        self._call(self._zip.write_record, record, exact.untyped_storage(), t.nbytes)

    def _call(self, fn: Any, *args: Any) -> None:
        """Run a C++ writer call; on failure close the writer and raise the OSError."""
        try:
            fn(*args)
        except OSError:  # a Python stream's error, passed through the C++ writer
            self._finalize_quietly()
            raise
        except RuntimeError as exc:
            self._finalize_quietly()
            raise _probe_error(self._path, exc) from None

    def _finalize_quietly(self) -> None:
        # the C++ destructor finalizes an unfinished archive and aborts the process if that throws
        self._closed = True
        try:
            self._zip.write_end_of_file()
        except (RuntimeError, OSError):
            pass
        if self._stream is not None:
            try:
                self._stream.close()
            except OSError:
                pass

    def finish(self) -> None:
        """Write data.pkl and the version records, close and fsync the archive."""
        if self._closed:
            raise InputError("the torch zip writer is already closed")
        _missing(self._order, set(self._stubs))
        pkl = _pickle_state(self._order, self._stubs)
        alignment = str(torch.serialization._get_storage_alignment()).encode()
        for record, data in (("data.pkl", pkl), (".format_version", b"1"), (".storage_alignment", alignment),
                             ("byteorder", sys.byteorder.encode())):
            self._call(self._zip.write_record, record, data, len(data))
        self._call(self._zip.write_end_of_file)
        self._closed = True
        if self._stream is not None:
            self._stream.close()
        fsync_path(self._path)
        if not torch_zip_is_whole(self._path):  # a final flush that failed without an exception
            raise _probe_error(self._path, RuntimeError("the archive is incomplete"))

    def abort(self) -> None:
        """Close an unfinished archive without its pickle (idempotent)."""
        if not self._closed:
            self._finalize_quietly()

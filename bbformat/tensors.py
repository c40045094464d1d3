"""torch <-> RawTensor, bit for bit, for every dtype of SPEC.md 6.1 (torch has them all).

A bool element is a byte and travels as it is; torch's own operations on a bool tensor (a
copy, a comparison) may turn bytes other than 0 and 1 into 1, so conversions here view it as
int8 before anything copies it."""
from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import TypeVar

import numpy as np
import torch

from .codec.dtypes import RawTensor
from .container.program import bits_of
from .errors import UnsupportedModelError

_TO_NAME = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32", torch.float64: "float64",
            torch.int8: "int8", torch.uint8: "uint8", torch.int16: "int16", torch.uint16: "uint16", torch.int32: "int32",
            torch.uint32: "uint32", torch.int64: "int64", torch.uint64: "uint64", torch.bool: "bool",
            torch.float8_e4m3fn: "float8_e4m3fn", torch.float8_e5m2: "float8_e5m2"}
_TO_TORCH = {v: k for k, v in _TO_NAME.items()}
# bits -> (the signed torch type a tensor of that width is viewed as, the unsigned numpy type of RawTensor.bits)
_INT_VIEW = {8: (torch.int8, np.uint8), 16: (torch.int16, np.uint16), 32: (torch.int32, np.uint32), 64: (torch.int64, np.uint64)}


def raw_dtype(t: torch.Tensor, name: str = "") -> str:
    """The SPEC dtype name of a tensor torch_to_raw would convert (its data is not read)."""
    dtype = _TO_NAME.get(t.dtype)
    if dtype is None:
        raise UnsupportedModelError(f"tensor {name!r} has dtype {t.dtype}, which the format cannot store "
                                    f"(one of {', '.join(_TO_TORCH)})")
    return dtype


def torch_to_raw(t: torch.Tensor, name: str = "") -> RawTensor:
    dtype = raw_dtype(t, name)
    tv, nv = _INT_VIEW[bits_of(dtype)]
    src = t.detach().cpu()
    if src.is_contiguous():
        bits = src.view(tv).numpy().view(nv).copy()
    else:  # contiguous() made the one copy (a sliced view of a wider storage, as TC saves them), of the
        # integer view: a bool tensor's copy would turn bytes other than 0 and 1 into 1
        bits = src.view(tv).contiguous().numpy().view(nv)
    return RawTensor(dtype, bits)


def torch_view_raw(t: torch.Tensor, name: str, release: Callable[[], None]) -> RawTensor:
    """torch_to_raw without the copy where t is a contiguous CPU tensor: a read-only view of its
    memory (a mapped file's pages come in when the view is read), and `release()` runs when
    the last array viewing it is gone (a mapped checkpoint drops those pages again; each call
    makes a view and a release of its own). Other tensors are copied as torch_to_raw does,
    and released at once."""
    if t.device.type != "cpu" or not t.is_contiguous():
        raw = torch_to_raw(t, name)
        release()
        return raw
    dtype = raw_dtype(t, name)
    tv, nv = _INT_VIEW[bits_of(dtype)]
    owner = t.detach().view(tv).numpy()  # every view below refers to this array (numpy's base)
    weakref.finalize(owner, release)
    bits = owner.view(nv)
    bits.flags.writeable = False
    return RawTensor(dtype, bits)


def raw_to_torch(r: RawTensor, *, copy: bool = True) -> torch.Tensor:
    """The torch tensor with r's bits. copy=False shares r's memory where it can (a contiguous,
    writeable, native-order array), for callers that drop r afterwards; else one copy is made."""
    nv = _INT_VIEW[bits_of(r.dtype)][1]
    bits = r.bits
    if copy or bits.dtype != np.dtype(nv) or not bits.flags.c_contiguous or not bits.flags.writeable:
        bits = np.array(bits, dtype=nv, order="C", copy=True)
    return torch.from_numpy(bits).view(_TO_TORCH[r.dtype])


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a SPEC dtype name (float16, ..., float8_e5m2; SPEC.md 6.1)."""
    return _TO_TORCH[name]


D = TypeVar("D")


def dominant(sizes: Iterable[tuple[D, int]], default: D) -> D:
    """The dtype most bytes are in, from (dtype, bytes) pairs (ties: the first met); `default`
    when there are none. A model's dtype when none is asked for (load_model, unpack --format hf)."""
    total: dict[D, int] = {}
    for dt, n in sizes:
        total[dt] = total.get(dt, 0) + n
    return max(total, key=lambda k: total[k]) if total else default

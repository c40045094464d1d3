"""torch <-> RawTensor, bit for bit."""
from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

import numpy as np
import torch

from .codec.dtypes import RawTensor
from .errors import UnsupportedModelError

_TO_NAME = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}
_TO_TORCH = {v: k for k, v in _TO_NAME.items()}
_INT_VIEW = {16: (torch.int16, np.uint16), 32: (torch.int32, np.uint32)}


def raw_dtype(t: torch.Tensor, name: str = "") -> str:
    """The SPEC dtype name of a tensor torch_to_raw would convert (its data is not read)."""
    dtype = _TO_NAME.get(t.dtype)
    if dtype is None:
        raise UnsupportedModelError(f"tensor {name!r} has dtype {t.dtype}; only float16, bfloat16 and float32 are stored")
    return dtype


def torch_to_raw(t: torch.Tensor, name: str = "") -> RawTensor:
    dtype = raw_dtype(t, name)
    width = 16 if dtype != "float32" else 32
    tv, nv = _INT_VIEW[width]
    src = t.detach().cpu()
    if src.is_contiguous():
        bits = src.view(tv).numpy().view(nv).copy()
    else:  # contiguous() made the one copy (a sliced view of a wider storage, as TC saves them)
        bits = src.contiguous().view(tv).numpy().view(nv)
    return RawTensor(dtype, bits)


def raw_to_torch(r: RawTensor, *, copy: bool = True) -> torch.Tensor:
    """The torch tensor with r's bits. copy=False shares r's memory where it can (a contiguous,
    writeable, native-order array), for callers that drop r afterwards; else one copy is made."""
    width = 16 if r.dtype != "float32" else 32
    tv, nv = _INT_VIEW[width]
    bits = r.bits
    if copy or bits.dtype != np.dtype(nv) or not bits.flags.c_contiguous or not bits.flags.writeable:
        bits = np.array(bits, dtype=nv, order="C", copy=True)
    return torch.from_numpy(bits.view(np.int16 if width == 16 else np.int32)).view(_TO_TORCH[r.dtype])


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a SPEC dtype name (float16, bfloat16, float32)."""
    return _TO_TORCH[name]


D = TypeVar("D")


def dominant(sizes: Iterable[tuple[D, int]], default: D) -> D:
    """The dtype most bytes are in, from (dtype, bytes) pairs (ties: the first met); `default`
    when there are none. A model's dtype when none is asked for (load_model, unpack --format hf)."""
    total: dict[D, int] = {}
    for dt, n in sizes:
        total[dt] = total.get(dt, 0) + n
    return max(total, key=lambda k: total[k]) if total else default

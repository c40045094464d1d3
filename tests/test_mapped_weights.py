"""pack's input is mapped, not read (bbformat/checkpoint/mapped.py, MappedWeights): tensors keep their
values after their pages are released, released pages leave the resident set, and nothing but
the file's own mappings is ever released."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bbformat.checkpoint import MappedWeights, read_checkpoint, release_mapped, write_checkpoint
from bbformat.testing import make_tiny_checkpoint

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="page release is Linux-only (madvise)")


def _rss_file() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("RssFile:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssFile in /proc/self/status")


@pytest.fixture(params=["pt", "safetensors"])
def big(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    ckpt = make_tiny_checkpoint("llama", seed=1, layers=1, hidden=256, heads=4, kv_heads=4, vocab=65536, dims=256)
    write_checkpoint(ckpt, tmp_path / "m", fmt=request.param)  # a 32 MiB embedding and head
    return tmp_path / "m"


def test_tensors_are_mapped_and_survive_release(big: Path) -> None:
    with read_checkpoint(big) as ckpt:
        sd = ckpt.state_dict
        assert isinstance(sd, MappedWeights)
        before = {k: sd[k].clone() for k in sd}
        for k in sd:
            ckpt.release(k)
        for k in sd:  # released pages are read again from the file
            assert torch.equal(sd[k].view(torch.int16), before[k].view(torch.int16)), k


@linux
def test_released_pages_leave_the_resident_set(big: Path) -> None:
    with read_checkpoint(big) as ckpt:
        sd = ckpt.state_dict
        name = "model.embed_tokens.weight"
        size = sd[name].numel() * sd[name].element_size()
        base = _rss_file()
        float(sd[name].float().sum())  # touches every page
        touched = _rss_file()
        ckpt.release(name)
        after = _rss_file()
    assert touched - base > size // 2
    assert touched - after > size // 2


@linux
def test_release_never_touches_memory_outside_the_mapping(big: Path) -> None:
    anon = np.full(1 << 20, 7, np.uint8)
    with read_checkpoint(big) as ckpt:
        sd = ckpt.state_dict
        assert isinstance(sd, MappedWeights)
        ranges = sd.mapped_ranges
        assert ranges, "the weights file is mapped"
        release_mapped(ranges, anon.ctypes.data, anon.ctypes.data + anon.nbytes)
    assert np.all(anon == 7)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.bool])
def test_pack_reads_a_tensor_as_a_read_only_view_released_when_the_last_view_goes(dtype: torch.dtype) -> None:
    """tensors.torch_view_raw (pack's `get`): a contiguous tensor's bits are a read-only view of
    its memory, equal to torch_to_raw's copy; `release` runs once, only after the view and
    every array derived from it are gone. A non-contiguous tensor is copied and released at once."""
    import gc

    from bbformat.tensors import torch_to_raw, torch_view_raw

    t = (torch.arange(600, dtype=torch.float32).reshape(20, 30) % 7 - 3).to(dtype)
    calls: list[str] = []
    raw = torch_view_raw(t, "w", lambda: calls.append("w"))
    assert not raw.bits.flags.writeable and raw.bits.__array_interface__["data"][0] == t.data_ptr()
    assert raw.equal(torch_to_raw(t, "w"))
    with pytest.raises(ValueError):
        raw.bits[0, 0] = 1
    derived = raw.bits.reshape(-1)[5:]
    del raw
    gc.collect()
    assert calls == []  # `derived` still reads the tensor's memory
    del derived
    gc.collect()
    assert calls == ["w"]
    sliced = torch_view_raw(t[:, ::2], "s", lambda: calls.append("s"))
    assert calls == ["w", "s"] and sliced.bits.flags.writeable and sliced.equal(torch_to_raw(t[:, ::2], "s"))

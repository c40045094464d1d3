"""Bounded memory at scale (slow): pack, unpack (both formats), verify and load_model of a
model much larger than any of its blocks, each in a fresh process, must stay far below what
holding the model would cost.

The model: 32 layers at hidden 1024 -> 768 (fp16, ~720 MB of weights, ~22 MB per layer). The
bound on each process's growth (VmHWM minus the RSS after imports) is BOUND x the weights: a
process that held the whole model, or read the whole file into memory, grows by at least the
weights and cannot meet it. Measured on the development machine: pack grew by 0.35x the weights
on a file written an hour earlier and by 0.73x on a freshly written one (the cause of that
difference, in the kernel's handling of the just-written file's pages, was not traced).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import bbformat
from bbformat.adapters.tc_layout import write_checkpoint
from bbformat.testing import make_tiny_checkpoint

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
BOUND = 0.85

# Runs one bbformat call in a fresh interpreter and prints its RSS growth: VmHWM at the end
# minus VmRSS once torch, numpy and bbformat are imported (the libraries are not the model).
CHILD = r"""
import json, sys
def status(key):
    for line in open('/proc/self/status'):
        if line.startswith(key + ':'):
            return int(line.split()[1]) * 1024
import numpy, torch, bbformat, bbformat.cli, safetensors.torch, transformers  # noqa: F401
from bbformat.codec import rotation as rot
with rot.one_blas_thread():  # LAPACK's workspace is not the model either
    numpy.linalg.eigh(numpy.eye(64) + 1e-3 * numpy.arange(64.0)[:, None] * numpy.arange(64.0)[None, :])
base = status('VmRSS')
op, args = sys.argv[1], sys.argv[2:]
if op == 'cli':
    code = bbformat.cli.main(args)
    assert code == 0, code
else:
    m = bbformat.load_model(args[0])
    assert next(m.parameters()).dtype == torch.float16
print(json.dumps({'growth': status('VmHWM') - base}))
"""


def _growth(*args: str) -> int:
    out = subprocess.run([sys.executable, "-c", CHILD, *args], check=True, capture_output=True, text=True, cwd=ROOT,
                         env={"MALLOC_MMAP_THRESHOLD_": str(1 << 20), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})
    return int(json.loads(out.stdout.strip().splitlines()[-1])["growth"])


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    root = tmp_path_factory.mktemp("scale")
    ckpt = make_tiny_checkpoint("llama", seed=3, layers=32, hidden=1024, heads=16, kv_heads=16, intermediate=2816,
                                vocab=8000, dims=768, dtype="float16")
    weights = sum(t.numel() * t.element_size() for t in ckpt.state_dict.values())
    for fmt in ("pt", "safetensors"):
        write_checkpoint(ckpt, root / fmt, fmt=fmt)
    return root, weights


@pytest.mark.parametrize("fmt", ["safetensors", "pt"])
def test_pack_streams_its_input(big: tuple[Path, int], fmt: str) -> None:
    root, weights = big
    growth = _growth("cli", "pack", str(root / fmt), str(root / f"{fmt}.bb"), "--quiet")
    assert growth < BOUND * weights, f"pack grew by {growth:,} B for {weights:,} B of weights"


@pytest.mark.parametrize("fmt", ["safetensors", "pt"])
def test_unpack_streams_its_output(big: tuple[Path, int], fmt: str) -> None:
    root, weights = big
    src = root / "safetensors.bb"
    if not src.exists():
        _growth("cli", "pack", str(root / "safetensors"), str(src), "--quiet")
    growth = _growth("cli", "unpack", str(src), str(root / f"out_{fmt}"), "--format", fmt, "--quiet")
    assert growth < BOUND * weights, f"unpack --format {fmt} grew by {growth:,} B for {weights:,} B of weights"
    import torch

    ref = torch.load(root / "pt" / "tiny-llama_0.25.pt", weights_only=True)
    if fmt == "pt":
        got = torch.load(root / f"out_{fmt}" / "tiny-llama_0.25.pt", weights_only=True, mmap=True)
    else:
        import safetensors.torch

        got = safetensors.torch.load_file(root / f"out_{fmt}" / "tiny-llama_0.25.safetensors")
    # the container was packed from the safetensors file, whose key order is its own (by dtype, then name)
    want = list(bbformat.read_tensors(src))
    assert (list(got) if fmt == "pt" else sorted(got)) == (want if fmt == "pt" else sorted(want))
    for k in ref:  # symmetric exact: same shapes and dtypes; the values are those of the rotated model
        assert got[k].shape == ref[k].shape and got[k].dtype == ref[k].dtype, k


def test_verify_and_load_model_are_bounded(big: tuple[Path, int]) -> None:
    root, weights = big
    src = root / "safetensors.bb"
    if not src.exists():
        _growth("cli", "pack", str(root / "safetensors"), str(src), "--quiet")
    for workers in ("1", "2"):
        growth = _growth("cli", "verify", str(src), "--workers", workers)
        assert growth < BOUND * weights, f"verify --workers {workers} grew by {growth:,} B for {weights:,} B of weights"
    # load_model holds the model (float16, as stored) and a few blocks, not a float32 copy
    growth = _growth("load", str(src))
    assert growth < weights * 3 // 2, f"load_model grew by {growth:,} B for {weights:,} B of weights"

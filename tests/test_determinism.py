"""Determinism (issue #5): the same input and options give byte-identical containers across
runs and across thread counts (BLAS, OpenMP and torch threads), for every scheme and mode.
Wide enough layers (D up to 256) that OpenBLAS really splits its work over threads."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bbformat.checkpoint import write_checkpoint
from bbformat.api import pack
from bbformat.testing import make_tiny_checkpoint

MODES = [("symmetric", 0.0), ("symmetric", 1e-3), ("paper", 0.005)]
SCRIPT = """
import hashlib, json, sys, torch
from bbformat.api import pack
src, out = sys.argv[1], sys.argv[2]
res = {"torch_threads": torch.get_num_threads()}
for scheme, tol in json.loads(sys.argv[3]):
    pack(src, out, scheme=scheme, tolerance=tol, overwrite=True)
    res[f"{scheme} {tol}"] = hashlib.sha256(open(out, "rb").read()).hexdigest()
print(json.dumps(res))
"""


def _digests_in_subprocess(src: Path, out: Path, threads: int) -> dict[str, str]:
    env = dict(os.environ)
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[k] = str(threads)
    p = subprocess.run([sys.executable, "-c", SCRIPT, str(src), str(out), json.dumps(MODES)], capture_output=True, text=True, env=env,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    assert res.pop("torch_threads") == threads
    return res


def test_byte_identical_across_runs_and_thread_counts(tmp_path: Path) -> None:
    ckpt = make_tiny_checkpoint("llama", seed=5, layers=2, hidden=256, heads=4, kv_heads=2, intermediate=384, vocab=96, dims=[256, 200, 160, 232, 248])
    src = tmp_path / "src"
    write_checkpoint(ckpt, src)
    one = _digests_in_subprocess(src, tmp_path / "a.bb", 1)
    two = _digests_in_subprocess(src, tmp_path / "b.bb", 2)
    here = {}
    for scheme, tol in MODES:
        pack(src, tmp_path / "d.bb", scheme=scheme, tolerance=tol, overwrite=True)
        here[f"{scheme} {tol}"] = hashlib.sha256((tmp_path / "d.bb").read_bytes()).hexdigest()
    assert one == two == here
    assert len(set(one.values())) == len(MODES)  # the modes really differ


def test_pipelined_pack_writes_the_sequential_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pack computes canonical directions ahead on a thread, compresses on a worker and the
    header on a third: the bytes are those of the plain chain (every canonical direction
    computed in turn, each chunk written before the next is encoded)."""
    import bbformat.packing as packing

    ckpt = make_tiny_checkpoint("llama", seed=6, layers=3, hidden=96)
    src = tmp_path / "src"
    write_checkpoint(ckpt, src)
    got = {}
    for scheme, tol in MODES:
        pack(src, tmp_path / "p.bb", scheme=scheme, tolerance=tol, overwrite=True)
        got[(scheme, tol)] = (tmp_path / "p.bb").read_bytes()
    from bbformat.adapters import plan
    from bbformat.checkpoint import read_checkpoint

    assert packing.independent_anchors(plan(read_checkpoint(src), "symmetric"))  # there is something to compute ahead
    monkeypatch.setattr(packing, "CANONICAL_AHEAD", 0)
    monkeypatch.setattr(packing, "PACK_QUEUE", 0)
    for scheme, tol in MODES:
        pack(src, tmp_path / "s.bb", scheme=scheme, tolerance=tol, overwrite=True)
        assert (tmp_path / "s.bb").read_bytes() == got[(scheme, tol)], (scheme, tol)

#!/usr/bin/env python3
"""Containers packed on a GPU, kept as test fixtures (tests/fixtures/gpu/) that every reader must
decode exactly: the numpy reference, the torch backend on the CPU and the C reader
(tests/test_gpu_fixtures.py).

    python tools/gpu_fixtures.py OUT --device cuda      # on a GPU machine (tools/bench_gpu.sh runs it)

Each case is a tiny synthetic Llama (tools/make_large.py --preset tiny-llama) packed by
`bbformat.pack(..., device=DEVICE)`, so the encoder's linear algebra (canonical directions,
eigensolves, rotations, the band's two solvers) ran on the device. OUT/gpu_fixtures.json records,
per file, what the same device's reader made of it (every digest checked, no fallback; its margin;
the sha256 of every decoded tensor), and the machine: a CPU reader must give the same tensors.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# (file name, source dtype, pack keyword arguments)
CASES: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("tiny_f16_symmetric.bb", "float16", {"scheme": "symmetric"}),
    ("tiny_bf16_symmetric_auto.bb", "bfloat16", {"scheme": "symmetric", "entropy": "auto"}),
    ("tiny_f32_symmetric.bb", "float32", {"scheme": "symmetric"}),
    ("tiny_f16_paper_tau.bb", "float16", {"scheme": "paper", "tolerance": 0.005}),
)


def decoded_on(path: Path, device: str) -> dict[str, Any]:
    """Decode `path` on `device` with no fallback to the reference: every block's digest check,
    the margin, and the sha256 of every decoded tensor's bytes."""
    from bbformat.reader import Reader

    tensors: dict[str, str] = {}
    exact, margins = True, []
    with Reader(path, device=device, fallback=False, margins=True) as r:
        for b in r.iter_blocks():
            exact = exact and b.exact
            if b.margin is not None:
                margins.append(b.margin)
            tensors.update({n: hashlib.sha256(t.tobytes()).hexdigest() for n, t in b.tensors.items()})
    return {"exact": exact, "margin": min(margins) if margins else None, "tensors": tensors}


def machine(device: str) -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {"device": device, "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version()}
    if torch.cuda.is_available() and "cuda" in device:
        out["gpu"] = torch.cuda.get_device_name(0)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--layers", type=int, default=2)
    a = ap.parse_args(argv)
    import bbformat

    a.out.mkdir(parents=True, exist_ok=True)
    files: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        sources: dict[str, Path] = {}
        for name, dtype, kw in CASES:
            if dtype not in sources:
                st = Path(tmp) / dtype
                subprocess.run([sys.executable, str(ROOT / "tools" / "make_large.py"), str(st), "--preset", "tiny-llama", "--layers",
                                str(a.layers), "--dtype", dtype, "--format", "safetensors", "--seed", "3"], check=True,
                               stdout=subprocess.DEVNULL)
                sources[dtype] = st
            dst = a.out / name
            bbformat.pack(sources[dtype], dst, device=a.device, overwrite=True, **kw)
            files[name] = {"pack": kw, "source_dtype": dtype, "source": f"tools/make_large.py --preset tiny-llama --layers {a.layers} "
                           f"--dtype {dtype} --seed 3", "sha256": hashlib.sha256(dst.read_bytes()).hexdigest(),
                           "decoded_on_device": decoded_on(dst, a.device)}
            print(f"{name}: {dst.stat().st_size:,} B")
    doc = {"machine": machine(a.device), "bbformat": bbformat.__version__, "files": files}
    (a.out / "gpu_fixtures.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

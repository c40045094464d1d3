#!/usr/bin/env python3
"""Sizes of `pack --scheme none` (no rotation, the entropy stage alone: the input's bits back)
next to ZipNN, byte-grouped zstd and the bits-back schemes, on one sliced checkpoint, in one run.

    python tools/bench_scheme_none.py SLICE_DIR [--work DIR] [--report BENCHMARKS.md]

SLICE_DIR is a TransformerCompression-layout directory (e.g. `python tools/slice.py smollm2
--sparsity 0.25 --out smol25`). Sizes only (no timings): the section "## 10. The entropy stage
alone (--scheme none)" replaces the section of that heading in --report, or is appended.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import zstandard

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))
import bbformat  # noqa: E402
from mdsection import publish  # noqa: E402
from machine import cpu_and_memory, python_and_numpy  # noqa: E402

SECTION = "## 10. The entropy stage alone (--scheme none)"
PACKS = (("--scheme none (entropy auto): the input's bits back", "none", "auto"),
         ("--scheme symmetric, entropy none (bits-back only)", "symmetric", "none"),
         ("--scheme symmetric, entropy auto (bits-back + entropy stage)", "symmetric", "auto"))


def weights_bytes(src: Path) -> tuple[bytes, str]:
    """The state dict's tensors, concatenated in key order, and their one dtype."""
    sd = torch.load(next(src.glob("*.pt")), weights_only=True, mmap=True)
    dtypes = {str(t.dtype).replace("torch.", "") for t in sd.values()}
    if len(dtypes) != 1:
        raise SystemExit(f"bench_scheme_none: one dtype expected, found {sorted(dtypes)}")
    return b"".join(t.contiguous().view(torch.uint8).numpy().tobytes() for t in sd.values()), dtypes.pop()


def alternatives(raw: bytes, dtype: str) -> list[tuple[str, int]]:
    width = {"float16": 2, "bfloat16": 2, "float32": 4}[dtype]
    grouped = np.ascontiguousarray(np.frombuffer(raw, np.uint8).reshape(-1, width).T).tobytes()
    rows = [(f"zstd-3 on byte-grouped {dtype}", len(zstandard.ZstdCompressor(level=3).compress(grouped)))]
    try:
        import zipnn

        z = zipnn.ZipNN(input_format="byte", bytearray_dtype=dtype, threads=1)
        comp = z.compress(raw)
        assert bytes(z.decompress(comp)) == raw
        rows.append(("ZipNN (weights only, no side files)", len(comp)))
    except ImportError:
        rows.append(("ZipNN (not installed)", 0))
    return rows


def measure(src: Path, work: Path) -> dict:
    raw, dtype = weights_bytes(src)
    res = {"src": str(src), "dtype": dtype, "plain_bytes": len(raw), "alternatives": alternatives(raw, dtype), "packs": []}
    for name, scheme, entropy in PACKS:
        out = work / f"{scheme}_{entropy}.bb"
        bbformat.pack(src, out, scheme=scheme, entropy=entropy, verify=True, overwrite=True)
        t = bbformat.inspect(out)["totals"]
        res["packs"].append((name, t["container_bytes"], t["metadata_bytes"]))
    return res


def section(res: dict, argv: list[str]) -> str:
    plain = res["plain_bytes"]
    lines = [SECTION, "",
             f"Machine: {cpu_and_memory()}; {python_and_numpy()}. Command: `python tools/bench_scheme_none.py {' '.join(argv)}` "
             f"({time.strftime('%Y-%m-%d')}). Input: `{res['src']}` ({res['dtype']}, plain weights {plain:,} B). Sizes only. "
             "Containers are whole files (header with the config and tokenizer files included); ZipNN and zstd compress "
             "the weights alone. Every container was packed with `--verify`; `--scheme none` unpacks to the input's "
             "bits (tests/test_api.py checks it), the bits-back schemes to an equivalent rotated model.", "",
             "| what | bytes | vs plain weights |", "|---|---|---|"]
    for name, size in res["alternatives"]:
        lines.append(f"| {name} | {size:,} | {100 * (size / plain - 1):+.2f}% |" if size else f"| {name} | - | - |")
    for name, size, meta in res["packs"]:
        lines.append(f"| {name} | {size:,} (header {meta:,}) | {100 * (size / plain - 1):+.2f}% |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", type=Path)
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--report", type=Path, default=None)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        text = section(measure(a.src, a.work or Path(tmp)), [str(a.src)])
    publish(text, SECTION, a.report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

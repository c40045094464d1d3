#!/usr/bin/env python3
"""Write a tiny random SliceGPT-sliced model in TransformerCompression's layout.

    python tools/make_tiny.py OUT_DIR [--arch llama|opt|phi2|phi3] [--seed N] [--layers N] [--hidden N]
                              [--heads N] [--kv-heads N] [--intermediate N] [--vocab N]
                              [--dims D | --dims D0,D1,...] [--dtype float16|bfloat16|float32]
                              [--slice-head] [--format pt|safetensors]

OUT_DIR gets <stem>.pt (or .safetensors), <stem>.json (the SlicingConfig), config.json and
generation_config.json: the input `bbformat pack` expects.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bbformat.checkpoint import write_checkpoint  # noqa: E402
from bbformat.errors import BBFormatError  # noqa: E402
from bbformat.testing import make_tiny_checkpoint  # noqa: E402


def _dims(text: str | None) -> int | list[int] | None:
    if text is None:
        return None
    parts = [int(x) for x in text.split(",") if x.strip()]
    return parts[0] if len(parts) == 1 else parts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="output directory")
    p.add_argument("--arch", choices=("llama", "opt", "phi2", "phi3"), default="llama")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2, help="Llama / Phi-3 key/value heads (GQA)")
    p.add_argument("--intermediate", type=int, default=None, help="MLP width (default 2 * hidden)")
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--dims", default=None, help="one width for all (const), or 2*layers+1 comma-separated residual widths (phi2: layers+1)")
    p.add_argument("--dtype", choices=("float16", "bfloat16", "float32"), default="float16")
    p.add_argument("--slice-head", action="store_true", help="slice the head too (do_slice_head)")
    p.add_argument("--format", choices=("pt", "safetensors"), default="pt")
    p.add_argument("-f", "--force", action="store_true", help="write into OUT even if it holds files (replacing those of the same names)")
    a = p.parse_args(argv)
    try:
        ckpt = make_tiny_checkpoint(a.arch, seed=a.seed, layers=a.layers, hidden=a.hidden, heads=a.heads, kv_heads=a.kv_heads,
                                    intermediate=a.intermediate, vocab=a.vocab, dtype=a.dtype, do_slice_head=a.slice_head,
                                    dims=_dims(a.dims))
        write_checkpoint(ckpt, a.out, fmt=a.format, overwrite=a.force)
    except (BBFormatError, ValueError) as exc:
        print(f"make_tiny: error: {exc}", file=sys.stderr)
        return 2
    n = sum(t.numel() for t in ckpt.state_dict.values())
    print(f"wrote {a.out}/{ckpt.stem}.{a.format}: {a.arch}, {a.layers} layers, {len(ckpt.state_dict)} tensors, {n} values")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

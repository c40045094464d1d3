"""How many bits a site's popped block could carry if it were fixed-point numbers (issue 24's
"savings add up" goal): measured on a symmetric container by decoding it.

    python tools/pop_precision_study.py FILE.bb [FILE.bb ...] [--json OUT]

Bits-back pops n(D) symbols per site and the decoder regenerates them from the rotation it reads
off the stored anchor. Today the popped symbols are floats of the symbol dtype, worth what the
entropy stage would have stored for them (bf16: about 10.6 of 16 bits). A format that popped P-bit
fixed-point values from raw bits instead would save n(D)·P bits per site, less the corrections of
the values the reader regenerates wrongly. How large P can be is set by how exactly the reader
recovers the block: this tool decodes FILE and records, at every site, the reader's float64
regenerated block X~ against the block's true values X, and the error e = X~ − X in units of the
block's standard deviation σ.

Estimate (stated as such): a block of P-bit fixed-point values uniform over [−s, s) has
σ = s/√3 and grid step 2s/2^P, so a value is regenerated right when |e| < √3·2^−P·σ, assuming the
reader's error scales with σ as it does for the blocks measured here. For each P the tool gives
the share f(P) of values outside that and the net bits per popped value,
P − f(P)·(P + log2(1/f(P)) + 1.44) (each wrong value stored with its position and value).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

import bbformat
from bbformat.codec import sections
from bbformat.codec.dtypes import bits_to_f64

PRECISIONS = (8, 10, 12, 14, 16, 20, 24)


def record_blocks(path: Path) -> list[dict[str, Any]]:
    """Decode `path`; per site the relative errors |X~ − X| / σ(X) of its block."""
    seen: list[dict[str, Any]] = []
    original = sections.StoredCorrector.correct_x

    def correct_x(self: sections.StoredCorrector, site: int, approx: np.ndarray, regenerated: np.ndarray | None = None) -> np.ndarray:
        out = original(self, site, approx, regenerated)
        if regenerated is not None:
            true = bits_to_f64(np.asarray(out), self.program.symbol_dtype)
            sigma = float(np.std(true))
            seen.append({"dim": self.program.sites[site].dim, "sigma": sigma,
                         "rel": np.abs(np.asarray(regenerated) - true) / sigma if sigma > 0 else None})
        return out

    sections.StoredCorrector.correct_x = correct_x  # type: ignore[method-assign]
    try:
        with bbformat.Reader(path, threads=1) as r:
            for i in range(len(r)):
                r.decode_block(i)
    finally:
        sections.StoredCorrector.correct_x = original  # type: ignore[method-assign]
    return [s for s in seen if s["rel"] is not None]


def net_bits(f: float, p: int) -> float:
    """Bits saved per popped P-bit value when a share f of them is stored explicitly."""
    return p - (f * (p + math.log2(1 / f) + 1.44) if f > 0 else 0.0)


def summary(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    rel = np.concatenate([b["rel"] for b in blocks])
    out: dict[str, Any] = {"sites": len(blocks), "values": int(rel.size), "dims": sorted({b["dim"] for b in blocks}),
                           "rel_error_quantiles": {q: float(np.quantile(rel, q)) for q in (0.5, 0.9, 0.99, 0.999)},
                           "precisions": {}}
    for p in PRECISIONS:
        f = float(np.mean(rel >= math.sqrt(3) * 2.0 ** -p))
        out["precisions"][p] = {"wrong_share": f, "net_bits": net_bits(f, p)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--json", type=Path, help="the measurements, by file")
    a = ap.parse_args(argv)
    out: dict[str, Any] = {}
    for path in a.files:
        if not path.is_file():
            print(f"pop_precision_study: no such file: {path}", file=sys.stderr)
            return 2
        blocks = record_blocks(path)
        if not blocks:
            print(f"pop_precision_study: {path} has no rotation site to measure", file=sys.stderr)
            return 2
        res = out[str(path)] = summary(blocks)
        q = res["rel_error_quantiles"]
        print(f"{path}: {res['sites']} sites (D {res['dims']}), {res['values']:,} regenerated values; |X~ - X| / sigma "
              "quantiles: " + ", ".join(f"{k}: {v:.3g}" for k, v in q.items()))
        print("| P (fixed-point bits) | share regenerated wrongly | net bits per popped value |")
        print("|---|---|---|")
        for p, r in res["precisions"].items():
            print(f"| {p} | {r['wrong_share']:.4f} | {r['net_bits']:.2f} |")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

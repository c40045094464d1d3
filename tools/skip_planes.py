#!/usr/bin/env python3
"""How well the part estimate predicts codec 2 against codec 3, part by part (issue 39: pack's
host work; codec.payload.PLANES_SKIP_MARGIN).

    python tools/skip_planes.py SRC [SRC ...] [--margins 0,0.02,0.03,0.05,0.125] [--json OUT.json]

Packs each SRC (`pack`'s defaults, into a temporary file) and, for every payload whose parts
may take codec 2 or 3, codes each part in both codecs whole (no pruning) beside the estimate
the writer cut it by (codec.parts.population_plan). Per margin M: the parts whose estimated
codec-2 bits pass their estimated codec-3 bits by more than M, that overlap no block
labelled codec 2 and that codec 3 can code (which auto no longer codes in codec 2), how many of them codec 2 would have stored smaller, and by how many bytes in all.
The estimate's own bias is reported too: estimated / actual bits, per codec, over all parts,
and the highest estimated codec 2:3 ratio of a part codec 2 stores smaller (such a part is lost
at margin M only where that ratio passes 1 + M).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from unittest import mock
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def parts_of(src: str) -> list[dict[str, float]]:
    """Per part of one pack of `src`: symbols, estimated and actual bits of codecs 2 and 3."""
    from bbformat import api
    from bbformat.codec import payload
    from bbformat.codec.entropy import encode_planes
    from bbformat.codec.exponent import encode_exponent
    from bbformat.codec.parts import cut_runs, population_plan

    rows: list[dict[str, float]] = []
    real = population_plan  # what payload calls, patched there below

    def recording(sym: Any, dtype: str, runs: list[tuple[int, int]], part_symbols: int, *args: Any, **kw: Any) -> Any:
        cuts, estimates = real(sym, dtype, runs, part_symbols, *args, **kw)
        for (lo, hi), e in zip(zip(cuts[:-1], cuts[1:]), estimates or []):
            part_runs = cut_runs(runs, lo, hi)
            two = encode_planes(sym[lo:hi], 8 * sym.itemsize, part_runs)
            three = encode_exponent(sym[lo:hi], dtype, part_runs)
            rows.append({"symbols": hi - lo, "est_planes": e.planes, "est_exponent": e.exponent, "planes_block": e.planes_block,
                         "planes": 8.0 * len(two) if two is not None else float("inf"),
                         "exponent": 8.0 * len(three) if three is not None else float("inf")})
        return cuts, estimates

    with mock.patch.object(payload, "population_plan", recording), tempfile.TemporaryDirectory() as tmp:
        api.pack(src, Path(tmp) / "out.bb")
    return rows


def summary(rows: list[dict[str, float]], margins: list[float]) -> dict[str, Any]:
    """Per margin: the parts skipped, those codec 2 would have won, the bytes lost."""
    finite = [r for r in rows if r["planes"] < float("inf") and r["exponent"] < float("inf")]
    out: dict[str, Any] = {
        "parts": len(rows),
        "codec 2 smaller": sum(r["planes"] <= r["exponent"] for r in finite),
        "estimate/actual, codec 2": sum(r["est_planes"] for r in finite) / max(1.0, sum(r["planes"] for r in finite)),
        "estimate/actual, codec 3": sum(r["est_exponent"] for r in finite) / max(1.0, sum(r["exponent"] for r in finite)),
        # a part codec 2 stores smaller is lost at margin M only where this passes 1 + M
        "highest estimated ratio where codec 2 wins": max((r["est_planes"] / r["est_exponent"] for r in finite
                                                           if r["planes"] <= r["exponent"]), default=None),
        "margins": {},
    }
    for m in margins:
        skipped = [r for r in rows if not r["planes_block"] and r["exponent"] < float("inf")  # the writer's rule
                   and r["est_planes"] > r["est_exponent"] * (1 + m)]
        lost = [r for r in skipped if r["planes"] <= r["exponent"] < float("inf")]
        out["margins"][str(m)] = {"skipped": len(skipped), "skipped_symbols": sum(r["symbols"] for r in skipped),
                                  "lost_parts": len(lost), "lost_bytes": sum(r["exponent"] - r["planes"] for r in lost) / 8}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="skip_planes.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("src", nargs="+")
    ap.add_argument("--margins", default="0,0.02,0.03,0.05,0.125")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    try:
        margins = [float(x) for x in args.margins.split(",")]
    except ValueError:
        ap.error("argument --margins: numbers separated by commas")
    result = {}
    for src in args.src:
        s = summary(parts_of(src), margins)
        result[src] = s
        print(f"{src}: {s['parts']} parts, codec 2 smaller in {s['codec 2 smaller']}; estimate/actual bits: "
              f"codec 2 {s['estimate/actual, codec 2']:.3f}, codec 3 {s['estimate/actual, codec 3']:.3f}")
        if s["highest estimated ratio where codec 2 wins"] is not None:
            print(f"  the highest estimated codec 2:3 bits of a part codec 2 stores smaller: "
                  f"{s['highest estimated ratio where codec 2 wins']:.4f}")
        for m, r in s["margins"].items():
            print(f"  margin {m}: skips codec 2 on {r['skipped']} parts ({r['skipped_symbols']:,} symbols); "
                  f"codec 2 would have won {r['lost_parts']} of them, by {r['lost_bytes']:,.0f} bytes")
    if args.json:
        Path(args.json).write_text(json.dumps({"argv": sys.argv[1:] if argv is None else argv, "results": result}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

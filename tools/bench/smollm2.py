"""Section 1: SmolLM2-135M-Instruct sliced at 0.2/0.25/0.3 by tools/slice.py: sizes, corrections,
perplexity before/after, pack/unpack/load_model times and peak RSS, next to safetensors, zstd-3
on byte-grouped fp16 and ZipNN on the same sliced model."""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from .common import Json, Run, alternatives, log, plain_bytes, run_child, slice_dir, timed

# (scheme, tolerance, label, calibrated rounding)
MODES = [("paper", 0.005, "paper τ=0.005", False), ("symmetric", 0.0, "symmetric exact", False),
         ("symmetric", 1e-3, "symmetric τ=1e-3", False), ("symmetric", 0.0, "symmetric exact, calibrated", True)]
SPARSITIES = (0.2, 0.25, 0.3)


def load_in_child(path: Path) -> tuple[float, float]:
    """Wall time and peak RSS (MiB) of load_model in a fresh process (child.py load-model)."""
    out = run_child("load-model", str(path.resolve())).split()
    return float(out[0]), float(out[1])


def pack_mode(run: Run, d: Path, s: float, mode: tuple[str, float, str, bool]) -> tuple[Json, Path]:
    """Pack d in one mode: the container's figures and pack/unpack/load_model times."""
    import bbformat

    scheme, tol, label, cal = mode
    stem = f"{s}_{scheme}_{tol}{'_cal' if cal else ''}"
    out = run.work / f"smol_{stem}.bb"
    log(f"sparsity {s}: pack {label}")
    _, t_pack = timed(lambda: bbformat.pack(d, out, scheme=scheme, tolerance=tol, calibration=run.calib if cal else None,
                                            overwrite=True), run.repeats)
    info = bbformat.inspect(out)["totals"]
    _, t_unpack = timed(lambda: bbformat.unpack(out, run.work / f"unpacked_{stem}", overwrite=True), run.repeats)
    loads = [load_in_child(out) for _ in range(run.repeats)]
    return {"mode": label, "container_bytes": info["container_bytes"], "saved_pct_plain": info["saved_pct_of_plain"],
            "saved_pct_bound": info["saved_pct_of_bound"], "corrections": info["corrections"], "correction_bytes": info["correction_bytes"],
            "sign_bits": info["sign_bits"], "plain_rotations": info["rotations_stored_plainly"], "rotations": info["rotations"],
            "pack_s": t_pack, "unpack_s": t_unpack, "load_s": statistics.median(x[0] for x in loads),
            "load_rss_mib": statistics.median(x[1] for x in loads)}, out


def measure_sparsity(run: Run, s: float, ntok: int, wins: Any) -> Json:
    from evaluate import WINDOW, load_any
    from evaluate import run as evaluate

    d = slice_dir(run, s)
    row: Json = {"sparsity": s, "plain_bytes": plain_bytes(d), "tokens": ntok, "modes": [], "alternatives": alternatives(d, run.repeats)}
    sliced = load_any(str(d))[0]
    models = []
    for mode in MODES:
        m, out = pack_mode(run, d, s, mode)
        row["modes"].append(m)
        models.append(load_any(str(out))[0])
    log(f"sparsity {s}: perplexity on {ntok} tokens (sliced and {len(MODES)} unpacked models)")
    w = wins[: ntok // WINDOW]
    row["ppl_sliced"] = evaluate(sliced, w)["perplexity"]
    for m, model in zip(row["modes"], models):
        r = evaluate(model, w, other=sliced)
        m["ppl"] = r["perplexity"]
        m["top1_vs_sliced"] = r["top1_agreement"]
        m["max_logit_diff"] = r["max_abs_logit_diff"]
    return row


def measure(run: Run) -> Json:
    from evaluate import load_any, windows
    from evaluate import run as evaluate

    tokens_main, tokens_other = (8192, 2048) if run.quick else (65536, 16384)
    orig, tok = load_any("smollm2")
    wins = windows(tok, tokens_main)
    log("perplexity of the original SmolLM2")
    res: Json = {"rows": [], "original": evaluate(orig, wins)}
    del orig
    for s in SPARSITIES:
        res["rows"].append(measure_sparsity(run, s, tokens_main if s == 0.25 else tokens_other, wins))
    return res


# ---------------------------------------------------------------- report


def fmt_b(n: int | None) -> str:
    return "n/a" if n is None else f"{n:,}"


def _mode_line(m: Json, row: Json) -> str:
    return (f"| {m['mode']} | {m['container_bytes']:,} | {m['saved_pct_plain']:.3f} | {m['saved_pct_bound']:.1f} | "
            f"{m['corrections']:,} ({m['correction_bytes']:,}) | {m['sign_bits']:,} | {m['plain_rotations']}/{m['rotations']} | "
            f"{m['ppl']:.4f} | {m['ppl'] - row['ppl_sliced']:+.4f} | {m['top1_vs_sliced']:.4%} | {m['max_logit_diff']:.3g} | "
            f"{m['pack_s']:.1f} | {m['unpack_s']:.1f} | {m['load_s']:.1f} | {m['load_rss_mib']:.0f} |")


def _alternative_line(a: Json, plain: int) -> str:
    pct = "n/a" if a["bytes"] is None else f"{100 * a['bytes'] / plain:.2f}"
    enc_s = "n/a" if a["enc_s"] is None else f"{a['enc_s']:.2f}"
    dec_s = "n/a" if a["dec_s"] is None else f"{a['dec_s']:.2f}"
    return f"| {a['name']} | {fmt_b(a['bytes'])} | {pct} | {enc_s} | {dec_s} |"


def report(res: Json) -> list[str]:
    s = res["smollm2"]
    L = ["## 1. SmolLM2-135M-Instruct, sliced by `tools/slice.py`", "",
         f"Original (Q4_1 GGUF dequantised, fp32 compute): perplexity {s['original']['perplexity']:.3f} on {s['original']['tokens']:,} tokens of eval.txt.", ""]
    for row in s["rows"]:
        L += [f"### Sparsity {row['sparsity']}: plain fp16 layout {row['plain_bytes']:,} B; sliced model perplexity {row['ppl_sliced']:.4f} on {row['tokens']:,} tokens", "",
              "| mode | container B | saved % of plain | % of gross bound | corrections (B) | sign bits | plain rotations | ppl after | Δppl | top-1 vs sliced | max Δlogit | pack s | unpack s | load_model s | load peak RSS MiB |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        L += [_mode_line(m, row) for m in row["modes"]]
        L += ["", "| alternative (same sliced model) | bytes | % of plain | encode s | decode s |", "|---|---|---|---|---|"]
        L += [_alternative_line(a, row["plain_bytes"]) for a in row["alternatives"]]
        L.append("")
    return L


def goals(res: Json) -> list[str]:
    out = []
    for row in res.get("smollm2", {}).get("rows", []):
        for m in row["modes"]:
            d = m["ppl"] - row["ppl_sliced"]
            if m["mode"].startswith("symmetric exact"):
                out.append(f"| s={row['sparsity']}: {m['mode']}: Δppl ≤ 0.01 | {d:+.4f} | {'yes' if abs(d) <= 0.01 else 'NO'} |")
                out.append(f"| s={row['sparsity']}: {m['mode']}: keeps ≥ 70% of the bound | {m['saved_pct_bound']:.1f}% | {'yes' if m['saved_pct_bound'] >= 70 else 'NO'} |")
            if m["mode"] == "symmetric τ=1e-3":
                out.append(f"| s={row['sparsity']}: τ=1e-3 Δppl ≤ 0.1 | {d:+.4f} | {'yes' if abs(d) <= 0.1 else 'NO'} |")
                out.append(f"| s={row['sparsity']}: τ=1e-3 keeps ≥ 95% of the bound | {m['saved_pct_bound']:.1f}% | {'yes' if m['saved_pct_bound'] >= 95 else 'NO'} |")
    return out

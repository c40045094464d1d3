#!/usr/bin/env python3
"""Format 1.5's parts (SPEC.md 8.9) at a paper model's shapes: the same weights packed as 1.4
(one rANS sequence per block) and as 1.5 (each large payload cut into parts), their sizes,
pack times and entropy-decoding times on 1 thread and on every core, next to ZipNN.

    python tools/bench_parts.py [--layers 1] [--work DIR] [--report BENCHMARKS.md] [--json F]

The input is tools/make_large.py's Llama-2-7B at sparsity 0.25 in bfloat16 (random weights
at the real shapes: random weights are not trained weights, so the sizes say little about
compression; the times are what this measures). Both files are `--scheme none --entropy
auto`, verified bit for bit. The section "## 17. ..." replaces the section of that heading in
--report.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))
import bbformat  # noqa: E402
from bench_entropy import DECODE_MODES, THREADS, best_s, codecs, codecs_text, entropy_decode_s, reference_coders, weights  # noqa: E402
from machine import cpu_and_memory, python_and_numpy  # noqa: E402
from mdsection import write_section  # noqa: E402

SECTION = "## 17. Parts (format 1.5): one block on several cores (tools/bench_parts.py)"
FORMATS = (("1.4", "format 1.4: one rANS sequence per payload"), ("1.5", "format 1.5: payloads over 2^21 symbols cut into parts"))


def make_input(work: Path, layers: int, preset: str) -> Path:
    src = work / "src"
    if not (src / "config.json").is_file():
        cmd = [sys.executable, str(ROOT / "tools" / "make_large.py"), "--preset", preset, "--layers", str(layers),
               "--dtype", "bfloat16", "--format", "pt", str(src)]
        subprocess.run(cmd, check=True)
    return src


def measure(src: Path, work: Path, repeats: int) -> list[dict[str, Any]]:
    rows = []
    for version, what in FORMATS:
        out = work / f"v{version}.bb"
        t0 = time.perf_counter()
        bbformat.pack(src, out, scheme="none", entropy="auto", format_version=version, overwrite=True)
        pack_s = time.perf_counter() - t0
        rep = bbformat.verify(out)
        assert rep.exact and rep.digests, rep
        info = bbformat.inspect(out)
        rows.append({"key": version, "row": what, "bytes": info["totals"]["weights_bytes"], "pack_s": pack_s,
                     "verify_s": best_s(lambda: bbformat.verify(out), repeats),
                     "largest_payload": max(b["payload_bytes"] for b in info["blocks"]),
                     **{f"decode_{m}_s": entropy_decode_s(out, m, repeats) for m in DECODE_MODES}, "codecs": codecs(out)})
        print(f"bench_parts: format {version} done", file=sys.stderr)
    return rows


def section(res: dict[str, Any], argv: list[str]) -> str:
    plain, values = res["plain_bytes"], res["values"]
    lines = [SECTION, "",
             f"Machine: {cpu_and_memory()}; {python_and_numpy()}. Command: `python tools/bench_parts.py {' '.join(argv)}` "
             f"({time.strftime('%Y-%m-%d')}). Input: `tools/make_large.py --preset {res['preset']} --layers {res['layers']} --dtype bfloat16` "
             f"(sparsity 0.25; {values:,} weights, plain {plain:,} B): **random weights at the real shapes**, so the sizes say "
             "little about trained weights; what this measures is time. Both files `pack --scheme none --entropy auto`, verified "
             f"bit for bit. Entropy decoding reads and entropy-decodes every payload (no linear algebra; digests not computed): "
             f"on one thread; chunk after chunk with each payload's parts on {THREADS} threads (`Reader(threads={THREADS})`, what "
             f"a loader reading blocks in order gets); and {THREADS} chunks at a time with parts in turn. Every decode time is the best of {res['repeats']} passes; pack times are one measurement.",
             "", f"| what | bytes | pack s | verify s | entropy decode s: 1 thread / parts on {THREADS} / blocks on {THREADS} | "
             "largest payload B | payload codecs (parts) |", "|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        if r.get("bytes") is None:
            continue
        if "decode_one_s" in r:
            ent = " / ".join(f"{r[f'decode_{m}_s']:.3g}" for m in DECODE_MODES)
            lines.append(f"| {r['row']} | {r['bytes']:,} | {r['pack_s']:.3g} | {r['verify_s']:.3g} | {ent} | {r['largest_payload']:,} | "
                         f"{codecs_text(r['codecs'])} |")
        elif r.get("decode_s") is not None:
            lines.append(f"| {r['row']} | {r['bytes']:,} | {r['pack_s']:.3g} | - | {r['decode_s']:.3g} (decompression) | - | |")
    by = {r["key"]: r for r in res["rows"]}
    if {"1.4", "1.5"} <= by.keys():
        a, b = by["1.4"], by["1.5"]
        lines += ["", f"- In order, one block after another: format 1.5 entropy-decodes in {b['decode_parts_s']:.3g} s on {THREADS} "
                      f"threads against 1.4's {a['decode_parts_s']:.3g} s ({a['decode_parts_s'] / b['decode_parts_s']:.2f}×); on one "
                      f"thread {b['decode_one_s']:.3g} against {a['decode_one_s']:.3g} s.",
                  f"- Size: 1.5 stores {b['bytes'] - a['bytes']:+,} B against 1.4 ({100 * (b['bytes'] - a['bytes']) / a['bytes']:+.3f}%)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--preset", default="llama-2-7b", help="tools/make_large.py's preset (default llama-2-7b; tiny-llama for tests)")
    ap.add_argument("--work", type=Path, default=None, help="keeps the input and the containers (default: a temporary directory)")
    ap.add_argument("--repeats", type=int, default=5, help="passes of each decode timed; the best is reported")
    ap.add_argument("--report", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--no-zipnn", action="store_true", help="skip the reference coders")
    a = ap.parse_args(argv)
    if a.layers < 1 or a.repeats < 1:
        ap.error("--layers and --repeats must be at least 1")
    with tempfile.TemporaryDirectory() as tmp:
        work = a.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        src = make_input(work, a.layers, a.preset)
        bits, dtype = weights(src)
        res = {"preset": a.preset, "layers": a.layers, "repeats": a.repeats, "plain_bytes": sum(b.nbytes for b in bits), "values": sum(b.size for b in bits),
               "rows": measure(src, work, a.repeats)}
        if not a.no_zipnn:
            res["rows"] += [r for r in reference_coders(bits, dtype, a.repeats) if r["key"].startswith("zipnn")]
    text = section(res, argv)
    print(text)
    if a.json is not None:
        a.json.write_text(json.dumps(res, indent=1, default=str) + "\n")
    if a.report is not None:
        write_section(a.report, text, SECTION)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python3
"""Long mutation-fuzz run of the readers (issue #5); writes FUZZING.md.

    python tools/fuzz.py --cases 200000 --seed 1 --report FUZZING.md [--findings DIR]

Each case takes a valid conformance vector (conformance/valid, conformance/optional's
accepted ones), corrupts it with bbformat.fuzz.mutate, and decodes it with the
random-access and the stream reader under tracemalloc. A case fails when a reader raises
anything but a bbformat error, goes over the memory bound of SPEC.md 11.5 or the time
limit, the two readers disagree on accepting, or a corruption without recomputed CRCs
decodes. Failing inputs are saved to --findings.
"""
from __future__ import annotations

import argparse
import collections
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from bbformat.fuzz import check, mutate, verdict  # noqa: E402
from bbformat.reader import Reader  # noqa: E402
from machine import cpu_and_memory, python_and_numpy  # noqa: E402


def corpus() -> list[tuple[str, bytes]]:
    out = []
    for d in ("valid", "optional"):
        for p in sorted((ROOT / "conformance" / d).glob("*.bb")):
            data = p.read_bytes()
            try:
                with Reader(p) as r:
                    for i in range(len(r)):
                        r.decode_block(i)
            except Exception:  # noqa: BLE001 - optional vectors the reference rejects are no seeds
                continue
            out.append((f"{d}/{p.name}", data))
    return out


def machine() -> str:
    return f"{cpu_and_memory()}; {python_and_numpy()}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=200_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--seconds-limit", type=float, default=10.0, help="per case, both readers")
    ap.add_argument("--report", type=Path, default=None, help="write a markdown report (e.g. FUZZING.md)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--findings", type=Path, default=Path("fuzz-findings"))
    a = ap.parse_args(argv)
    seeds = corpus()
    # The 1 MB vector decodes a D=511 site; draw it rarely so the run covers the small ones widely.
    weights = [0.02 if len(d) > 100_000 else 1.0 for _, d in seeds]
    rng = random.Random(a.seed)
    by_kind: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    findings = []
    max_s = max_ratio = 0.0
    max_s_case = max_ratio_case = ""
    retimed = 0
    t0 = time.time()
    for k in range(a.cases):
        name, data = rng.choices(seeds, weights)[0]
        what, mutated = mutate(data, rng)
        o = check(mutated)
        kind = what.split()[0]
        for r in set(o.results.values()):
            by_kind[kind][r] += 1
        if o.seconds > max_s:
            max_s, max_s_case = o.seconds, f"{name} {what}"
        ratio = o.peak_bytes / o.bound_bytes
        if ratio > max_ratio:
            max_ratio, max_ratio_case = ratio, f"{name} {what} (peak {o.peak_bytes:,} B, bound {o.bound_bytes:,} B)"
        why = verdict(data, what, mutated, o, a.seconds_limit)
        if why and why.startswith("took"):  # re-time once, alone: a busy machine is not a finding
            o = check(mutated)
            why = verdict(data, what, mutated, o, a.seconds_limit)
            retimed += 1
        if why:
            a.findings.mkdir(parents=True, exist_ok=True)
            f = a.findings / f"case{k}.bb"
            f.write_bytes(mutated)
            findings.append({"case": k, "seed_file": name, "mutation": what, "why": why, "file": str(f)})
            print(f"FINDING case {k}: {name} {what}: {why}", file=sys.stderr)
        if (k + 1) % 10_000 == 0:
            print(f"{k + 1:,} cases, {time.time() - t0:.0f} s, {len(findings)} findings", file=sys.stderr)
    elapsed = time.time() - t0
    res = {
        "cases": a.cases, "seed": a.seed, "seconds_limit": a.seconds_limit, "seed_files": len(seeds), "elapsed_s": elapsed, "findings": findings,
        "max_case_seconds": max_s, "retimed": retimed, "max_case_seconds_case": max_s_case, "max_memory_ratio": max_ratio,
        "max_memory_ratio_case": max_ratio_case, "outcomes": {k: dict(v) for k, v in sorted(by_kind.items())},
        "machine": machine(), "date": time.strftime("%Y-%m-%d"),
    }
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))
    if a.report:
        a.report.write_text(report(res, argv if argv is not None else sys.argv[1:]), encoding="utf-8")
    print(f"{a.cases:,} cases in {elapsed:.0f} s: {len(findings)} findings; slowest case {max_s * 1000:.1f} ms; "
          f"peak memory at most {max_ratio:.1%} of the bound")
    return 1 if findings else 0


def report(res: dict, argv: list[str]) -> str:
    codes = sorted({c for v in res["outcomes"].values() for c in v})
    kinds = list(res["outcomes"])
    lines = [
        "# Fuzzing the readers",
        "",
        f"Machine: {res['machine']}.",
        "",
        f"Command: `python tools/fuzz.py {' '.join(argv)}` ({res['date']}, {res['elapsed_s'] / 60:.0f} min).",
        "",
        f"**{res['cases']:,} cases, {len(res['findings'])} findings.** Each case corrupts one of {res['seed_files']} valid conformance "
        "vectors with `bbformat.fuzz.mutate` and decodes it with the random-access reader and the stream reader. A finding is: an "
        "exception that is not a `BBFormatError`; traced memory over the bound of SPEC.md 11.5 (2 × the declared working set of "
        "the largest chunk + 2 × the file + 16 MiB); a case over the time limit; the two readers disagreeing on accepting; or a "
        "corruption with no recomputed CRC that decodes.",
        "",
        f"- Slowest case (both readers): {res['max_case_seconds'] * 1000:.1f} ms ({res['max_case_seconds_case']}); "
        f"cases over the {res['seconds_limit']} s limit re-timed once alone: {res['retimed']}.",
        f"- Highest traced peak, as a share of its bound: {res['max_memory_ratio']:.1%} ({res['max_memory_ratio_case']}).",
        "",
        "Outcomes by mutation (cases, counted once per distinct result of the two readers):",
        "",
        "| result | " + " | ".join(kinds) + " |",
        "|---|" + "---:|" * len(kinds),
    ]
    for c in codes:
        lines.append(f"| {c} | " + " | ".join(str(res["outcomes"][k].get(c, "")) for k in kinds) + " |")
    lines += ["", "`accept` appears only where the mutation recomputed CRCs (`*_resealed`, `swap_chunks`: the result can be a valid "
              "file) or left the bytes unchanged (a field set to its own value); anything else would be a finding.", ""]
    if res["findings"]:
        lines += ["## Findings", ""] + [f"- case {f['case']}: {f['seed_file']} {f['mutation']}: {f['why']}" for f in res["findings"]] + [""]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())

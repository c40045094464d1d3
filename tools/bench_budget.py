#!/usr/bin/env python3
"""Decode workers within a memory budget: peak memory and time of a decode for each count of
workers, with and without a budget, side by side in one run.

    python tools/bench_budget.py CONTAINER [--workers 1,2,4] [--fits 1,2] [--rounds 2]
                                 [--input TEXT] [--json OUT] [--report BENCHMARKS.md] [--notes NOTES.md]
    python tools/bench_budget.py --from-json OUT [--report BENCHMARKS.md] [--notes NOTES.md]

Each decode is `bbformat.verify(CONTAINER, workers=N, max_block_bytes=B)` (every block
decoded, checked and dropped: the path of `load_model(device=...)` and `load_file(device=...)`,
whose blocks go to the device and leave the host) in a fresh Python, in turn, each round
starting with the next configuration. B is "none" (no budget: what every worker count did
before the budget) or the sum of the declared working sets (SPEC.md 11.5) of the `fits`
largest chunks. Each child reports its wall seconds and the growth of its peak RSS over the
decode (VmHWM, reset after the imports).
"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from bench_load import PEAK  # noqa: E402
from machine import cpu_and_memory, python_and_numpy  # noqa: E402
from mdsection import publish, section_args, section_results  # noqa: E402

SECTION = "## 24. Decode workers within a memory budget (tools/bench_budget.py)"
GIB = 1 << 30

DECODE = PEAK + """
import bbformat
budget = None if sys.argv[3] == "none" else int(sys.argv[3])
begun = start()
rep = bbformat.verify(sys.argv[1], workers=int(sys.argv[2]), max_block_bytes=budget)
stop(begun, ok=not rep.inexact, decoded=rep.decoded_bytes)
"""


def working_sets(container: Path) -> list[int]:
    sys.path.insert(0, str(ROOT))
    from bbformat import Reader

    with Reader(container) as r:
        return [r.working_set(i) for i in range(len(r))]


def child(container: Path, workers: int, budget: int | None) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", DECODE, str(container), str(workers), "none" if budget is None else str(budget)],
                         check=True, capture_output=True, text=True, cwd=ROOT)
    res: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    if not res["ok"]:
        raise RuntimeError(f"verify failed: {res}")
    return res


def measure(container: Path, workers: list[int], fits: list[int], rounds: int) -> dict[str, Any]:
    ws = working_sets(container)
    budgets: dict[str, int | None] = {"none": None, **{str(k): sum(sorted(ws)[-k:]) for k in fits}}
    configs = [(w, b) for b in budgets for w in workers]
    runs: dict[str, list[dict[str, Any]]] = {f"{w}|{b}": [] for w, b in configs}
    for k in range(rounds):
        for w, b in configs[k % len(configs):] + configs[: k % len(configs)]:
            runs[f"{w}|{b}"].append(child(container, w, budgets[b]))
            print(f"bench_budget: round {k + 1}, {w} workers, budget {b}: {runs[f'{w}|{b}'][-1]['s']:.1f} s", file=sys.stderr)
    return {"working_sets": ws, "budgets": budgets, "runs": runs}


def median(runs: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] for r in runs))


def section(res: dict[str, Any]) -> str:
    run, m = res["run"], res["measured"]
    ws, budgets = m["working_sets"], m["budgets"]
    lines = [SECTION, "", f"Machine: {run['machine']}; {run['software']}. Command: `python tools/bench_budget.py "
             f"{shlex.join(run['argv'])}` ({run['date']}). Input: {run['input']}: {len(ws)} chunks, declared working sets "
             f"{min(ws) / GIB:.2f}–{max(ws) / GIB:.2f} GiB. {run['rounds']} rounds; each decode (`bbformat.verify`) in a fresh "
             "process, in turn. Peak RSS growth: over the decode, after the imports.", "",
             "| budget (max_block_bytes) | workers | wall s, median | peak RSS growth GiB, median |", "|---|---|---|---|"]
    peaks: dict[str, dict[int, float]] = {}
    for key, runs in m["runs"].items():
        w, b = key.split("|")
        label = "none" if b == "none" else f"{budgets[b] / GIB:.2f} GiB (the {b} largest chunk{'s' if b != '1' else ''})"
        peaks.setdefault(b, {})[int(w)] = median(runs, "rss_grew") / GIB
        lines.append(f"| {label} | {w} | {median(runs, 's'):.2f} | {median(runs, 'rss_grew') / GIB:.2f} |")
    lines.append("")
    for b, by_w in peaks.items():
        lo, hi = min(by_w), max(by_w)
        trend = f"{lo} → {hi} workers: {by_w[lo]:.2f} → {by_w[hi]:.2f} GiB"
        if b == "none":
            lines.append(f"- no budget: peak growth {trend}")
            continue
        most = max(by_w.values())
        lines.append(f"- budget {budgets[b] / GIB:.2f} GiB: peak growth within the budget at every worker count: "
                     f"{'**met**' if most <= budgets[b] / GIB else '**missed**'} (at most {most:.2f} GiB; {trend})")
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("container", nargs="?", type=Path)
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--fits", default="1,2", help="budgets: room for the N largest chunks' working sets, per N")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--input", default="the container given", help="what the container is, for the section")
    section_args(ap)
    a = ap.parse_args(argv)
    if a.from_json is None and a.container is None:
        ap.error("give a CONTAINER (or --from-json)")
    res = section_results(a, lambda: {
        "run": {"machine": cpu_and_memory(), "software": python_and_numpy(), "date": time.strftime("%Y-%m-%d"),
                "argv": argv, "rounds": a.rounds, "input": a.input},
        "measured": measure(a.container, [int(x) for x in a.workers.split(",")], [int(x) for x in a.fits.split(",")], a.rounds)})
    publish(section(res), SECTION, a.report, a.notes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

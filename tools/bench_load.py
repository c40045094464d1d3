#!/usr/bin/env python3
"""Loading a container into a model on the CPU, before and after a change, side by side: fresh
processes in turn, round by round, each variant first in its turn, so every variant meets the machine's drift and
the order's effect alike.

    python tools/bench_load.py --case LABEL CONTAINER DIR [--case ...] [--before REV] [--rounds 5]
                               [--warm-only] [--work W] [--json OUT] [--report BENCHMARKS.md] [--notes NOTES.md]
    python tools/bench_load.py --from-json OUT [--report BENCHMARKS.md] [--notes NOTES.md]

Per round and case, each in a fresh Python with the model's class imported before the clock:
`bbformat.load_model(CONTAINER)` from a worktree of REV ("before", built there) and from this
tree ("after"); and, where DIR (the plain Hugging Face directory the container was packed
from; "-" for none) is given, the baseline of BENCHMARKS §21's goal: safetensors' `load_file`,
every tensor read into the process's memory (a clone), and the model built on the meta device
with `load_state_dict(assign=True)`. Each child reports its wall seconds, CPU seconds (user and
system), minor page faults and the growth of its peak RSS over the load (VmHWM, reset after the
imports). Where the page cache can be dropped (root on Linux), every round is run twice: warm,
then cold with the cache dropped before each child.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from bench_host import before_tree  # noqa: E402
from machine import cpu_and_memory, drop_caches, python_and_numpy  # noqa: E402
from mdsection import publish, section_args, section_results  # noqa: E402

SECTION = "## 23. Loading into a model without a copy (tools/bench_load.py)"

PEAK = """
import json, re, resource, sys, time

def status(key):
    return int(re.search(key + r":\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) * 1024

def start():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    return status("VmRSS"), resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()

def stop(begun, **extra):
    rss, r0, t0 = begun
    t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"s": t1 - t0, "user_s": r1.ru_utime - r0.ru_utime, "sys_s": r1.ru_stime - r0.ru_stime,
                      "faults": r1.ru_minflt - r0.ru_minflt, "rss_grew": status("VmHWM") - rss, **extra}))
"""
LOAD_BB = PEAK + """
import transformers, bbformat
getattr(transformers, sys.argv[2])  # the model class imported before the clock, as in LOAD_ST
begun = start()
m = bbformat.load_model(sys.argv[1])
stop(begun, model=sum(p.numel() * p.element_size() for p in m.parameters()), bbformat=bbformat.__file__)
"""
LOAD_ST = PEAK + """
import torch, transformers
from pathlib import Path
from safetensors.torch import load_file
d = Path(sys.argv[1])
cls = getattr(transformers, sys.argv[2])
cfg = cls.config_class.from_pretrained(str(d))
begun = start()
sd = {}
for f in sorted(d.glob("*.safetensors")):
    sd.update(load_file(str(f)))
sd = {k: v.clone() for k, v in sd.items()}  # the bytes read into the process's own memory, as a loaded model holds them
with torch.device("meta"):
    m = cls(cfg)
m.load_state_dict(sd, assign=True, strict=False)
m.tie_weights()
m.eval()
stop(begun, model=sum(p.numel() * p.element_size() for p in m.parameters()))
"""
METRICS = ("s", "user_s", "sys_s", "faults", "rss_grew")


def child(code: str, tree: Path, *args: str) -> dict[str, Any]:
    """`code` in a fresh Python importing bbformat from `tree` (its working directory too: `-c`
    puts the working directory first on sys.path); its last line of output, parsed."""
    out = subprocess.run([sys.executable, "-c", code, *args], check=True, capture_output=True, text=True, cwd=tree,
                         env={**os.environ, "PYTHONPATH": str(tree)})
    res: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    if "bbformat" in res and not Path(res["bbformat"]).resolve().is_relative_to(tree.resolve()):
        raise RuntimeError(f"the child imported {res['bbformat']}, not bbformat from {tree}")
    return res


def measure_case(container: Path, src: Path | None, trees: dict[str, Path], rounds: int, cold: bool) -> dict[str, Any]:
    """{cache: {variant: [child results per round]}} for one container."""
    cfg = json.loads((src / "config.json").read_text()) if src is not None else None
    arch = cfg["architectures"][0] if cfg else "LlamaForCausalLM"
    caches = ["warm", "cold"] if cold else ["warm"]
    variants = [*trees, *(["safetensors"] if src else [])]
    out: dict[str, Any] = {c: {v: [] for v in variants} for c in caches}
    for k in range(rounds):
        for cache in caches:
            for variant in variants[k % len(variants):] + variants[: k % len(variants)]:  # each first in turn
                if cache == "cold":
                    drop_caches()
                if variant == "safetensors":
                    assert src is not None
                    out[cache][variant].append(child(LOAD_ST, ROOT, str(src), arch))
                else:
                    out[cache][variant].append(child(LOAD_BB, trees[variant], str(container), arch))
    return out


def median(runs: list[dict[str, float]], key: str) -> float:
    return float(statistics.median(r[key] for r in runs))


def case_table(label: str, case: dict[str, Any]) -> list[str]:
    lines = [f"### {label}", "", "| page cache | load | wall s, median (best) | CPU s, user + system | minor faults | peak RSS growth, × the model |",
             "|---|---|---|---|---|---|"]
    for cache, variants in case["times"].items():
        for variant, runs in variants.items():
            model = runs[0]["model"]
            what = "safetensors `load_file` + read + build" if variant == "safetensors" else f"`bbformat.load_model` ({variant})"
            lines.append(f"| {cache} | {what} | {median(runs, 's'):.3f} ({min(r['s'] for r in runs):.3f}) | "
                         f"{median(runs, 'user_s'):.2f} + {median(runs, 'sys_s'):.2f} | {median(runs, 'faults'):,.0f} | "
                         f"{median(runs, 'rss_grew') / model:.2f} |")
    lines.append("")
    for cache, variants in case["times"].items():
        if "safetensors" in variants:
            base = median(variants["safetensors"], "s")
            for variant in (v for v in variants if v != "safetensors"):
                ratio = median(variants[variant], "s") / base
                lines.append(f"- `load_model` ({variant}) ≤ 1.5× the baseline, page cache {cache}: "
                             f"{'**met**' if ratio <= 1.5 else '**missed**'} ({ratio:.2f}×, medians)")
    return lines + [""]


def section(res: dict[str, Any]) -> str:
    run = res["run"]
    lines = [SECTION, "", f"Machine: {run['machine']}; {run['software']}. Command: `python tools/bench_load.py "
             f"{shlex.join(run['argv'])}` ({run['date']}). {run['rounds']} rounds; in each, every load below ran once in a "
             f"fresh process, in turn, each round starting with the next one. \"before\" is {run['before']}, the commit before this change, built in a worktree; "
             "\"after\" is this tree. Peak RSS growth is the load's, over the model's parameter bytes (VmHWM reset after the "
             "imports).", ""]
    for label, case in res["cases"].items():
        lines += case_table(label, case)
    return "\n".join(lines).rstrip("\n") + "\n"


def measure(a: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    """Every --case, each variant in its turn (measure_case), with the run's record."""
    trees = {"after": ROOT}
    if a.before:
        a.work.mkdir(parents=True, exist_ok=True)
        trees = {"before": before_tree(a.work.resolve(), a.before), **trees}
    cold = not a.warm_only and drop_caches()
    res: dict[str, Any] = {"run": {"machine": cpu_and_memory(), "software": python_and_numpy(), "date": time.strftime("%Y-%m-%d"),
                                   "argv": argv, "rounds": a.rounds, "before": a.before or "not measured"}, "cases": {}}
    for label, container, src in a.case:
        times = measure_case(Path(container), None if src == "-" else Path(src), trees, a.rounds, cold)
        res["cases"][label] = {"container": container, "dir": src, "times": times}
        print(f"bench_load: {label} done", file=sys.stderr)
    return res


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", nargs=3, action="append", metavar=("LABEL", "CONTAINER", "DIR"), default=[],
                    help="a container and the plain directory it was packed from ('-' for none)")
    ap.add_argument("--before", default=None, help="the git revision to compare with (default: none, this tree only)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warm-only", action="store_true", help="no cold rounds (the page cache is left alone)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/bench_load"), help="where the worktree goes")
    section_args(ap)
    a = ap.parse_args(argv)
    if a.from_json is None and not a.case:
        ap.error("give at least one --case (or --from-json)")
    res = section_results(a, lambda: measure(a, argv))
    publish(section(res), SECTION, a.report, a.notes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Reproduce every table of BENCHMARKS.md in one run on this machine.

    python tools/bench.py [--work DIR] [--calib FILE] [--out BENCHMARKS.md] [--quick]
                          [--sections smollm2,table1,scaling,entropy,speed,residuals]
    (the same: python -m tools.bench ..., from the repository root)

Sections:
  smollm2  SmolLM2-135M-Instruct sliced at 0.2/0.25/0.3: sizes, corrections, perplexity
           before/after, pack/unpack/load_model times and peak RSS; alternatives
           (safetensors, zstd-3 on byte-grouped fp16, ZipNN) measured in the same run.
  table1   The paper's Table 1 compression columns, from published model shapes and
           per-rotation overheads measured by the real encoder on shape-faithful
           synthetic sites.
  scaling  Pack/unpack time against rotation dimension and number of layers, next to
           the time of the eigendecompositions alone.
  entropy  SmolLM2 s=0.25 exact with every `--entropy` mode next to ZipNN and byte-grouped
           zstd on the same plain model (issue 6, part 1).
  speed    The same containers: decode, unpack, load_model and pack against the linear
           algebra they cannot avoid on the same thread budget, and streaming peak memory
           (issue 6, part 2).
  residuals  Exact mode's residual coding against what its residuals allow
           (tools/residual_contexts.py; issue 6, part 3).
  scale    Paper-sized models (Llama-2-7B, OPT-13B shapes, synthetic weights): pack, unpack,
           verify, load_model with wall time and peak RSS against their floors
           (tools/bench_scale.py, which owns section 7 and its results file; not in the
           default --sections, it takes hours: `--sections scale`).
Timings are medians of --repeats runs (default 3). `--merge tools/bench_results.json`
re-runs only the named sections and keeps the rest of an earlier run. The sliced models and
containers go to --work; the calibration text (--calib) and the evaluation text that
tools/evaluate.py reads come from tools/data/ (tools/data/README.md: source, licence, checksums).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Callable

from . import entropy, residuals, scaling, smollm2, speed, table1
from .common import DEFAULT_WORK, ROOT, SECTIONS, Json, Run, log, machine
from .report import write_report

# The order the sections run in; the first three record their own command and date (a later
# --merge run may replace them alone).
RUN_ORDER: tuple[tuple[str, Callable[[Run], Json], bool], ...] = (
    ("entropy", entropy.measure, True), ("speed", speed.measure, True), ("residuals", residuals.measure, True),
    ("scaling", scaling.measure, False), ("table1", table1.measure, False), ("smollm2", smollm2.measure, False))


def build_parser() -> argparse.ArgumentParser:
    from slice import DATA  # tools/data/, as tools/slice.py and tools/evaluate.py read it

    ap = argparse.ArgumentParser(prog="tools/bench.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=DEFAULT_WORK, help=f"sliced models and containers (default {DEFAULT_WORK})")
    ap.add_argument("--calib", type=Path, default=DATA / "calib.txt",
                    help="calibration text: tools/slice.py's --calib and the calibrated rows' pack --calibration (default %(default)s)")
    ap.add_argument("--out", type=Path, default=ROOT / "BENCHMARKS.md")
    ap.add_argument("--json", type=Path, default=None, help="also write raw results as JSON")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="fewer tokens and smaller dims, to try the tool")
    ap.add_argument("--sections", default=",".join(SECTIONS))
    ap.add_argument("--from-json", type=Path, default=None, help="rewrite the report from a --json file of an earlier run")
    ap.add_argument("--merge", type=Path, default=None,
                    help="start from the results of an earlier --json run and replace only the sections run now "
                         "(each of sections entropy and speed records its own command and date)")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="speed section: also time pack, unpack and load_model of this other checkout (e.g. a git worktree "
                         "of the previous commit) in the same run")
    return ap


def check_args(ap: argparse.ArgumentParser, a: argparse.Namespace) -> list[str]:
    """The sections asked for; a bad option is one line and exit 2, before anything is measured."""
    if a.baseline is not None and not (a.baseline / "bbformat" / "__init__.py").is_file():
        ap.error(f"--baseline {a.baseline}: not a checkout of bbformat (no bbformat/__init__.py there)")
    secs = a.sections.split(",")
    unknown = [s for s in secs if s not in SECTIONS + ("scale",)]
    if unknown:
        ap.error(f"--sections: unknown {', '.join(unknown)} (choose from {', '.join(SECTIONS + ('scale',))})")
    if "smollm2" in secs and not a.from_json and not a.calib.is_file():
        ap.error(f"--calib {a.calib}: no such file (the smollm2 section's calibrated rows need it)")
    return secs


def run_sections(run: Run, secs: list[str], res: Json, argv: list[str]) -> None:
    for name, measure, own_record in RUN_ORDER:
        if name not in secs:
            continue
        t1 = time.time()
        res[name] = measure(run)
        if own_record:
            res[name]["run"] = {"argv": " ".join(argv), "date": time.strftime("%Y-%m-%d"), "elapsed_min": (time.time() - t1) / 60,
                                "machine": machine()}


def start_results(merge: Path | None, repeats: int) -> Json:
    """A new run's results, or with --merge the earlier run's, which this run's sections replace."""
    if not merge:
        return {"machine": machine(), "repeats": repeats, "date": time.strftime("%Y-%m-%d")}
    res: Json = json.loads(merge.read_text())
    if res.get("machine") != machine():
        log(f"note: the merged results were measured on {res.get('machine')}")
    return res


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = build_parser()
    a = ap.parse_args(argv)
    secs = check_args(ap, a)
    if a.from_json:
        res = json.loads(a.from_json.read_text())
        write_report(a.out, res, res.get("argv", argv))
        return 0
    a.work.mkdir(parents=True, exist_ok=True)
    if "scale" in secs:  # its own tool, results file and section of the report
        import bench_scale

        code = bench_scale.main(["--work", str(a.work / "scale"), "--report", str(a.out)] + (["--quick"] if a.quick else []))
        secs.remove("scale")
        if not secs:
            return int(code)
    import torch

    torch.set_grad_enabled(False)
    t0 = time.time()
    res = start_results(a.merge, a.repeats)
    run_sections(Run(a.work, a.repeats, a.quick, a.calib, a.baseline), secs, res, argv)
    if not a.merge:  # a merged run keeps the header (command, date, time) of the run it extends
        res["elapsed_min"] = (time.time() - t0) / 60
        res["argv"] = argv
    if a.json:
        a.json.write_text(json.dumps(res, indent=1, default=str))
    write_report(a.out, res, res.get("argv", argv))
    log(f"wrote {a.out}")
    return 0

#!/usr/bin/env python3
"""CLI start-up: how long `bbformat --help`, `inspect` and `verify` take on a tiny container,
next to `import torch` alone (what the CLI used to pay before doing anything).

    python tools/bench_startup.py [--repeats 7] [--report BENCHMARKS.md]

Each command runs in a fresh process; the figure is the median wall time of --repeats runs
after one warm-up run (file cache warm). The section "## 9. CLI start-up" replaces the
section of that heading in --report, or is appended; other sections are never touched.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from machine import cpu_and_memory, python_and_numpy  # noqa: E402
from mdsection import publish  # noqa: E402

SECTION = "## 9. CLI start-up"
GOAL_S = 0.5


def wall(cmd: list[str], repeats: int) -> float:
    subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)  # warm-up
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def measure(repeats: int) -> list[tuple[str, float]]:
    py = sys.executable
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([py, "-m", "bbformat", "demo", "--keep", d, "--quiet"], check=True, capture_output=True, cwd=ROOT)
        bb = str(Path(d) / "model.bb")
        cmds = [
            ("python -c pass (the interpreter alone)", [py, "-c", "pass"]),
            ("python -c 'import bbformat'", [py, "-c", "import bbformat"]),
            ("bbformat --help", [py, "-m", "bbformat", "--help"]),
            ("bbformat inspect (tiny demo container)", [py, "-m", "bbformat", "inspect", bb]),
            ("bbformat verify (tiny demo container)", [py, "-m", "bbformat", "verify", bb]),
            ("python -c 'import torch' (for comparison)", [py, "-c", "import torch"]),
        ]
        return [(name, wall(cmd, repeats)) for name, cmd in cmds]


def section(rows: list[tuple[str, float]], repeats: int) -> str:
    lines = [SECTION, "",
             f"Machine: {cpu_and_memory()}; {python_and_numpy()}. Command: `python tools/bench_startup.py --repeats {repeats}` "
             f"({time.strftime('%Y-%m-%d')}); median wall time of {repeats} fresh processes after a warm-up. Goal: under "
             f"{GOAL_S} s for `--help`, `inspect` and `verify` (issue 16). `import bbformat` does not import torch: torch loads "
             "only when a torch tensor or model is made (pack, unpack, load_model).", "",
             "| command | wall time (s) | goal |", "|---|---|---|"]
    for name, t in rows:
        goal = ("met" if t < GOAL_S else "MISSED") if name.startswith("bbformat") else ""
        lines.append(f"| {name} | {t:.3f} | {goal} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--report", type=Path, default=None, help="write the section into this markdown file")
    a = ap.parse_args(argv)
    publish(section(measure(a.repeats), a.repeats), SECTION, a.report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

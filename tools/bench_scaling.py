#!/usr/bin/env python3
"""Two decode threads against two processes: how much of a second core a decode's host work
can use on this machine, and how much of that two threads of one process get.

    python tools/bench_scaling.py CONTAINER [CONTAINER ...] [--rounds 5]
                                  [--json OUT] [--report BENCHMARKS.md] [--notes NOTES.md]
    python tools/bench_scaling.py --from-json OUT [--report BENCHMARKS.md] [--notes NOTES.md]

Per container, two Pythons each record the linear algebra in a first pass (bench_host.Replay),
so that every timed pass is the host's work alone: reading, CRC32C, entropy decoding, rounding,
corrections, digests. No pass reads ahead (read_ahead_bytes=0), so "one thread" is one. Then,
each round, the three phases in an order rotated from the round before:
- alone: process A decodes the container once, on one thread (one worker, threads=1);
- threads: A decodes it with two workers and two part threads (bench_host's "2 threads");
- processes: A and B each decode it once, on one thread, started together.
"threads / alone" is bench_host's two-thread ratio; "processes / alone" is the same measure
for two independent processes: the time per decode with both cores busy (the slower process's
seconds over two) over one decode alone. Two processes share no interpreter, lock or address
space, so their ratio is what this machine gives two decodes (memory bandwidth, the kernel's
zeroing of fresh pages); the gap between the two ratios is what one process loses to itself.
Each child reports its wall, user and system seconds per pass (getrusage); "cores busy" is
the CPU seconds of a phase over its wall seconds (two processes: both's over the slower's).
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
from machine import cpu_and_memory, python_and_numpy  # noqa: E402
from mdsection import publish, section_args, section_results  # noqa: E402

SECTION = "## 25. Two decode threads against two processes (tools/bench_scaling.py)"
PHASES = ("alone", "threads", "processes")

CHILD = """
import json, resource, sys, time
sys.path.insert(0, sys.argv[2])
from bench_host import Replay
from bbformat.reader import Reader

rep = Replay()
la = rep.install()

def one(workers):
    u0, t = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    with Reader(sys.argv[1], device=la, share_payload=True, threads=workers, read_ahead_bytes=0) as r:
        for block in r.iter_blocks(workers=workers):
            del block
    wall, u1 = time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF)
    return {"s": wall, "user": u1.ru_utime - u0.ru_utime, "sys": u1.ru_stime - u0.ru_stime}

one(1)
rep.record = False
print("ready", flush=True)
for line in sys.stdin:
    print(json.dumps(one(int(line))), flush=True)
"""


class Child:
    """A Python that recorded the container's linear algebra and decodes it on command."""

    def __init__(self, container: Path) -> None:
        self.p = subprocess.Popen([sys.executable, "-c", CHILD, str(container), str(ROOT / "tools")], cwd=ROOT,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ready(self) -> None:
        assert self.p.stdout is not None
        if self.p.stdout.readline().strip() != "ready":
            raise RuntimeError(f"bench_scaling: a child failed (exit {self.p.wait()})")

    def send(self, workers: int) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write(f"{workers}\n")
        self.p.stdin.flush()

    def result(self) -> dict[str, float]:
        assert self.p.stdout is not None
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError(f"bench_scaling: a child failed (exit {self.p.wait()})")
        res: dict[str, float] = json.loads(line)
        return res

    def close(self) -> None:
        if self.p.stdin is not None:
            self.p.stdin.close()
        self.p.wait()


def measure_one(container: Path, rounds: int) -> dict[str, list[Any]]:
    a, b = Child(container), Child(container)
    try:
        a.ready()
        b.ready()
        runs: dict[str, list[Any]] = {p: [] for p in PHASES}
        for k in range(rounds):
            for phase in PHASES[k % 3:] + PHASES[: k % 3]:
                if phase == "processes":
                    a.send(1)
                    b.send(1)  # both lines written before either answer is read: they start together
                    runs[phase].append([a.result(), b.result()])
                else:
                    a.send(1 if phase == "alone" else 2)
                    runs[phase].append(a.result())
            print(f"bench_scaling: {container.name}, round {k + 1} of {rounds}", file=sys.stderr)
        return runs
    finally:
        a.close()
        b.close()


def ratios(runs: dict[str, list[Any]]) -> dict[str, float]:
    alone = statistics.median(r["s"] for r in runs["alone"])
    threads = statistics.median(r["s"] for r in runs["threads"])
    both = statistics.median(max(x["s"] for x in pair) / 2 for pair in runs["processes"])
    return {"alone": alone, "threads": threads / alone, "processes": both / alone}


def cores(run: dict[str, float]) -> float:
    return (run["user"] + run["sys"]) / run["s"]


def section(res: dict[str, Any]) -> str:
    run = res["run"]
    med = statistics.median
    lines = [SECTION, "", f"Machine: {run['machine']}; {run['software']}. Command: `python tools/bench_scaling.py "
             f"{shlex.join(run['argv'])}` ({run['date']}). {run['rounds']} rounds, the phases' order rotated each round; "
             "medians. The linear algebra is replayed: every pass is the host's work alone; no pass reads ahead.", "",
             "| container | one thread s | cores busy: one thread / two threads / two processes | two threads / one "
             "| two processes / one (s per decode, both busy) | sys s per process: alone / two processes |",
             "|---|---|---|---|---|---|"]
    goal = []
    for name, runs in res["measured"].items():
        r = ratios(runs)
        pairs = runs["processes"]
        busy = med(sum(x["user"] + x["sys"] for x in p) / max(x["s"] for x in p) for p in pairs)
        alone_sys = med(x["sys"] for x in runs["alone"])
        both_sys = med(x["sys"] for p in pairs for x in p)
        lines.append(f"| {name} | {r['alone']:.2f} | {med(cores(x) for x in runs['alone']):.2f} / "
                     f"{med(cores(x) for x in runs['threads']):.2f} / {busy:.2f} | {r['threads']:.2f} | {r['processes']:.2f} "
                     f"| {alone_sys:.2f} / {both_sys:.2f} |")
        goal.append(f"- two threads ≤ 0.55× one (issue 39), {name}: {'**met**' if r['threads'] <= 0.55 else '**missed**'} "
                    f"({r['threads']:.2f}); two independent processes on this machine: {r['processes']:.2f}")
    return "\n".join(lines + [""] + goal).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("containers", nargs="*", type=Path)
    ap.add_argument("--rounds", type=int, default=5)
    section_args(ap)
    a = ap.parse_args(argv)
    if a.from_json is None and not a.containers:
        ap.error("give a CONTAINER (or --from-json)")
    res = section_results(a, lambda: {
        "run": {"machine": cpu_and_memory(), "software": python_and_numpy(), "date": time.strftime("%Y-%m-%d"),
                "argv": argv, "rounds": a.rounds},
        "measured": {c.name: measure_one(c, a.rounds) for c in a.containers}})
    publish(section(res), SECTION, a.report, a.notes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python3
"""The host's work of a decode on one and two threads (issue 39 item 3): a one-worker pass with
and without its read-ahead thread, and the element-wise steps on the part threads
(host_native.spread) or in one call, side by side in one process.

    python tools/bench_readahead.py FILE.bb [--rounds 12] [--json OUT] [--report BENCHMARKS.md] [--notes NOTES.md]
    python tools/bench_readahead.py --from-json OUT [--report BENCHMARKS.md] [--notes NOTES.md]

The linear algebra is replayed (tools/bench_host.py's Replay: each site's Gram, eigenvectors
and regenerated block recorded by a first pass and looked up after), so a pass's wall time is
the host's work alone: reading, CRCs, entropy decoding, widening, rounding, corrections,
digests. Every configuration runs once per round, in turn, so all meet the machine's drift
alike; the table gives the best and the median of the rounds.
"""
from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))
from machine import cpu_and_memory, python_and_numpy  # noqa: E402
from mdsection import publish, section_args, section_results  # noqa: E402

SECTION = "## 22. One decode worker reading ahead, and element-wise steps on the part threads (tools/bench_readahead.py)"
# label: (workers, part threads, read_ahead_bytes, spread)
CONFIGS: dict[str, tuple[int, int, int | str, bool]] = {
    "1 worker, 1 part thread, no read-ahead (before)": (1, 1, 0, False),
    "1 worker, 1 part thread, read-ahead": (1, 1, "auto", False),
    "1 worker, 2 part threads, no read-ahead, no spread (before)": (1, 2, 0, False),
    "1 worker, 2 part threads, read-ahead, no spread": (1, 2, "auto", False),
    "1 worker, 2 part threads, read-ahead, spread": (1, 2, "auto", True),
    "2 workers, 2 part threads, no spread (before)": (2, 2, 0, False),
    "2 workers, 2 part threads, spread": (2, 2, 0, True),
}


def measure(path: Path, rounds: int) -> dict[str, list[float]]:
    from bench_host import Replay
    from bbformat.codec import host_native
    from bbformat.reader import Reader

    split = host_native.SPLIT_VALUES
    rep = Replay()
    la = rep.install()

    def run(workers: int, threads: int, ahead: int | str, spread: bool) -> float:
        host_native.SPLIT_VALUES = split if spread else 1 << 62  # no array is that large: every step in one call
        with Reader(path, device=la, share_payload=True, threads=threads, read_ahead_bytes=ahead) as r:
            t = time.perf_counter()
            for block in r.iter_blocks(workers=workers):
                del block
            return time.perf_counter() - t

    run(1, 1, 0, False)  # records the linear algebra
    rep.record = False
    times: dict[str, list[float]] = {k: [] for k in CONFIGS}
    for _ in range(rounds):
        for k, c in CONFIGS.items():
            times[k].append(run(*c))
    host_native.SPLIT_VALUES = split
    return times


def median(v: list[float]) -> float:
    s = sorted(v)
    return (s[len(s) // 2] + s[(len(s) - 1) // 2]) / 2


def section(res: dict[str, Any]) -> str:
    t = res["times"]
    first = next(iter(CONFIGS))
    lines = [SECTION, "", f"Machine: {res['machine']}. Command: `python tools/bench_readahead.py {shlex.join(res['argv'])}` "
             f"({res['date']}). Input: {res['input']}. {res['rounds']} rounds; host seconds of a whole pass with the linear "
             "algebra replayed.", "", "| configuration | best s | median s | median / the first row's |", "|---|---|---|---|"]
    for k, v in t.items():
        lines.append(f"| {k} | {min(v):.3f} | {median(v):.3f} | {median(v) / median(t[first]):.2f} |")
    default = "2 workers, 2 part threads, spread"  # what verify, unpack and load_model do on 2 cores now
    ratio = median(t[default]) / median(t[first])
    lines += ["", f"- two threads ≤ 0.55× one (medians: \"{default}\", the library's default on 2 cores, against the "
              f"first row): {'**met**' if ratio <= 0.55 else '**missed**'} ({ratio:.2f})"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file", type=Path, nargs="?", help="the container to decode")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--input", default=None, help="how the section names the input (default: the file's name)")
    section_args(ap)
    a = ap.parse_args(argv)
    if a.from_json is None and a.file is None:
        ap.error("FILE or --from-json is needed")
    res = section_results(a, lambda: {
        "machine": f"{cpu_and_memory()}; {python_and_numpy()}", "date": time.strftime("%Y-%m-%d"), "argv": argv,
        "input": a.input or a.file.name, "rounds": a.rounds, "times": measure(a.file, a.rounds)})
    publish(section(res), SECTION, a.report, a.notes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

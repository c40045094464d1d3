#!/usr/bin/env python3
"""Where a pack's wall time goes outside its linear algebra (issue 39: pack's host work;
bench_host.py counts it as wall time minus the summed linear algebra seconds of all threads,
this tool as the wall time no linear algebra call covers, both reported).

    python tools/pack_timeline.py SRC [--interval 0.02] [--top 15] [--json OUT.json]

Packs SRC (`pack`'s defaults) into a temporary file with rotation.linalg_clock on, and samples
every thread's stack each `--interval` seconds. Afterwards each sample is classed by whether
some linear algebra call (gram, eigh, rotate_axis, regenerate, and the reference backend's
matmul, in any thread) was running at that moment. Reported: the wall time, the summed seconds of the linear algebra calls and the
time they cover (their union: a call on one thread overlapping one on another counts once),
the rest (the host time on the critical path), the largest stretches without linear algebra
with the main thread's commonest frames in each, and for the samples in the rest, per
thread, the innermost
bbformat frame: what the pack was doing while no linear algebra ran, in seconds = the share
of those samples times the rest (the GIL delays samples; the share is what is measured). A
thread blocked in a wait shows the frame that waits. Sampling adds a little time; the bytes are
those of a plain pack.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from unittest import mock
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
OURS = (str(ROOT / "bbformat"),)


def innermost_ours(frame: FrameType | None) -> str | None:
    """`file:function` of the innermost frame in bbformat, None where there is none."""
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(OURS):
            return f"{Path(name).relative_to(ROOT)}:{frame.f_code.co_name}"
        frame = frame.f_back
    return None


def sample_pack(src: str, interval: float) -> tuple[float, list[tuple[float, float]], list[tuple[float, dict[str, str]]]]:
    """(wall seconds, linear algebra intervals, samples (time, {thread: frame})) of one pack."""
    from bbformat import api
    from bbformat.codec import linalg, rotation

    calls: list[tuple[float, float]] = []
    lock = threading.Lock()
    samples: list[tuple[float, dict[str, str]]] = []
    done = threading.Event()
    me = threading.get_ident()

    def record(name: str, seconds: float) -> None:
        end = time.perf_counter()
        with lock:
            calls.append((end - seconds, end))

    def sampler() -> None:
        names = {}
        while not done.wait(interval):
            now = time.perf_counter()
            for t in threading.enumerate():
                names[t.ident] = t.name
            row = {}
            for ident, frame in sys._current_frames().items():
                if ident == threading.get_ident():
                    continue
                where = innermost_ours(frame)
                if where is not None:
                    row["main" if ident == me else names.get(ident, str(ident))] = where
            samples.append((now, row))

    def timed(inner: Any) -> Any:
        def matmul(self: Any, a: Any, b: Any) -> Any:  # not on linalg_clock: timed as bench_host.py does
            t = time.perf_counter()
            out = inner(self, a, b)
            record("matmul", time.perf_counter() - t)
            return out
        return matmul

    s = threading.Thread(target=sampler, name="sampler", daemon=True)
    with tempfile.TemporaryDirectory() as tmp, rotation.linalg_clock(record), \
            mock.patch.object(linalg.NumpyLinalg, "matmul", timed(linalg.NumpyLinalg.matmul)), \
            mock.patch.object(linalg.TorchLinalg, "matmul", timed(linalg.TorchLinalg.matmul)):
        s.start()
        t0 = time.perf_counter()
        api.pack(src, Path(tmp) / "out.bb")
        wall = time.perf_counter() - t0
        done.set()
        s.join()
    return wall, sorted((a - t0, b - t0) for a, b in calls), [(t - t0, row) for t, row in samples]


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The sorted intervals merged where they overlap."""
    out: list[tuple[float, float]] = []
    for a, b in intervals:
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def report(wall: float, calls: list[tuple[float, float]], samples: list[tuple[float, dict[str, str]]], top: int) -> dict[str, Any]:
    """The wall time split into linear algebra and the rest, and what each thread did in the rest."""
    merged = union(calls)
    covered = sum(b - a for a, b in merged)
    starts = [a for a, _ in merged]

    def in_linalg(t: float) -> bool:
        import bisect
        i = bisect.bisect_right(starts, t) - 1
        return i >= 0 and t < merged[i][1]

    rest = [row for t, row in samples if not in_linalg(t)]
    by_thread: dict[str, Counter[str]] = {}
    for row in rest:
        for thread, where in row.items():
            by_thread.setdefault(thread, Counter())[where] += 1
    gaps = sorted(((a, b) for a, b in zip([0.0] + [b for _, b in merged], starts + [wall]) if b > a), key=lambda g: g[0] - g[1])[:top]

    def main_frames(a: float, b: float) -> list[tuple[str, int]]:
        return Counter(row["main"] for t, row in samples if a <= t < b and "main" in row).most_common(3)

    return {"wall_s": wall, "linalg_sum_s": sum(b - a for a, b in calls), "linalg_union_s": covered,
            "linalg_calls": len(calls), "rest_s": wall - covered, "rest_samples": len(rest), "samples": len(samples),
            "largest_gaps_s": [[round(a, 3), round(b - a, 3), main_frames(a, b)] for a, b in gaps],
            "rest_by_thread": {t: c.most_common(top) for t, c in sorted(by_thread.items(), key=lambda kv: -sum(kv[1].values()))}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pack_timeline.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("src")
    ap.add_argument("--interval", type=float, default=0.02, help="seconds between samples")
    ap.add_argument("--top", type=int, default=15, help="frames and gaps listed")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    if args.interval <= 0 or args.top < 1:
        ap.error("--interval must be above 0 and --top at least 1")
    r = report(*sample_pack(args.src, args.interval), args.top)
    r["argv"] = sys.argv[1:] if argv is None else argv
    print(f"{args.src}: wall {r['wall_s']:.2f} s; linear algebra calls sum to {r['linalg_sum_s']:.2f} s and cover "
          f"{r['linalg_union_s']:.2f} s; the rest {r['rest_s']:.2f} s ({r['rest_samples']} of {r['samples']} samples)")
    print("  largest stretches without linear algebra (start s, length s, main thread's frames by samples):")
    for a, n, frames in r["largest_gaps_s"][:8]:
        print(f"    {a:9.3f} {n:7.3f}  {frames}")
    for thread, rows in r["rest_by_thread"].items():
        print(f"  {thread}:")
        for where, n in rows:
            print(f"    {n / max(1, r['rest_samples']) * r['rest_s']:7.2f} s  {where}")
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

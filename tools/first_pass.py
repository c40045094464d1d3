#!/usr/bin/env python3
"""A decode's first pass in a process against its later ones: the host work before the first
linear algebra (issue 39, the gap between a real decode's host seconds and the replay's).

    python tools/first_pass.py FILE.bb [--processes 2] [--passes 3] [--idle S] [--json OUT.json]

Each process (a fresh interpreter) decodes FILE `--passes` times with one worker, no reading
ahead and one part thread; each pass stops at its first Gram matrix (the reference backend
with its gram raising), so it holds reading, CRC, entropy decoding and widening, and no linear
algebra. Per pass: wall, user and system seconds, minor page faults, and where the kernel
reports free memory to its host (Linux free page reporting, as in Firecracker VMs) the MiB it
reported during the pass and during the wait before it. `--idle S`: each process waits S
seconds before its first pass. A file without sites decodes whole. bench_host.py's replay runs
its timed passes after a first pass in the same process, so it times later passes; a user's
load is a first pass.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


REPORTED = Path("/sys/module/page_reporting/parameters/reported_kib")


def reported_mib() -> float:
    """The MiB of free memory this kernel has reported to its host so far (0 without it)."""
    try:
        return int(REPORTED.read_text()) / 1024
    except (OSError, ValueError):
        return 0.0


def child(path: str, passes: int, idle: float = 0.0) -> list[dict[str, float]]:
    import resource
    import time

    from bbformat.codec.linalg import NumpyLinalg
    from bbformat.reader import Reader

    class FirstGram(Exception):
        pass

    def gram(m: Any) -> Any:
        raise FirstGram

    la = NumpyLinalg()
    la.gram = gram  # type: ignore[method-assign]
    out = []
    waited = reported_mib()
    time.sleep(idle)
    for _ in range(passes):
        r0 = reported_mib()
        u0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        try:
            with Reader(path, device=la, share_payload=True, threads=1, read_ahead_bytes=0) as r:
                for block in r.iter_blocks(workers=1):
                    del block
        except FirstGram:
            pass
        t1, u1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        r1 = reported_mib()
        out.append({"s": t1 - t0, "user": u1.ru_utime - u0.ru_utime, "sys": u1.ru_stime - u0.ru_stime,
                    "minflt": float(u1.ru_minflt - u0.ru_minflt), "reported_mib": r1 - r0, "reported_before_mib": r0 - waited})
        waited = r1
    return out


def _count(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {n}")
    return n


def _seconds(text: str) -> float:
    s = float(text)
    if not s >= 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {text}")
    return s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file")
    ap.add_argument("--processes", type=_count, default=2)
    ap.add_argument("--passes", type=_count, default=3)
    ap.add_argument("--idle", type=_seconds, default=0.0, help="seconds each process waits before its first pass")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        from bbformat.errors import BBFormatError

        try:
            print(json.dumps(child(a.file, a.passes, a.idle)))
        except (BBFormatError, OSError) as exc:
            print(f"first_pass: {a.file}: {exc}", file=sys.stderr)
            return 2
        return 0
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    runs = []
    for _ in range(a.processes):
        r = subprocess.run([sys.executable, __file__, a.file, "--passes", str(a.passes), "--idle", str(a.idle), "--child"],
                           env=env, capture_output=True, text=True)
        if r.returncode:
            print((r.stderr.strip().splitlines() or [f"first_pass: a child failed (exit {r.returncode})"])[-1], file=sys.stderr)
            return 2
        runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    print("process  pass  wall s  user s  sys s  minor faults  reported MiB: before, during")
    for i, passes in enumerate(runs):
        for k, p in enumerate(passes):
            print(f"{i:7d} {k:5d} {p['s']:7.3f} {p['user']:7.2f} {p['sys']:6.2f} {int(p['minflt']):13d}"
                  f"  {p['reported_before_mib']:8.0f} {p['reported_mib']:7.0f}")
    if a.json:
        old = json.loads(a.json.read_text()) if a.json.exists() else {"runs": []}
        old["runs"].append({"file": a.file, "idle_s": a.idle, "processes": runs})
        a.json.write_text(json.dumps(old, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Where a decode's time goes: the linear algebra against everything else, per backend.

    python tools/decode_split.py FILE.bb [--devices cpu,torch:cpu] [--workers 1] [--share] [--peak]

Decodes every block of FILE with each backend (bbformat.codec.linalg device specs) on one
decoding thread, timing the linear algebra through rotation.linalg_clock (Gram, eigh,
regenerate; on a GPU each call is synchronized), and prints the whole decode, the linear
algebra by kind, and the rest: the host's work (reading, CRCs, entropy stage, corrections,
rounding, digests, copies), which stays on the host whatever the device. --peak adds the
largest block's peak of numpy's allocations (tracemalloc; torch's tensors are not counted:
on a GPU they are device memory), the host memory a decoding thread needs for a block.
"""
from __future__ import annotations

import argparse
import sys
import threading
import time
import tracemalloc
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bbformat.codec import rotation as rot  # noqa: E402
from bbformat.reader import Reader  # noqa: E402


def split(path: Path, device: str, workers: int, share: bool = False, peak: bool = False) -> dict[str, float]:
    spent: dict[str, float] = defaultdict(float)
    lock = threading.Lock()
    largest = 0

    def record(name: str, seconds: float) -> None:
        with lock:
            spent[name] += seconds

    if peak:
        tracemalloc.start()
    with rot.linalg_clock(record), Reader(path, device=device, share_payload=share) as r:
        t = time.perf_counter()
        for block in r.iter_blocks(workers=workers):
            del block  # the next block's peak is its own
            if peak:
                largest = max(largest, tracemalloc.get_traced_memory()[1])
                tracemalloc.reset_peak()
        total = time.perf_counter() - t
    if peak:
        tracemalloc.stop()
    return {"total": total, **spent, "host": total - sum(spent.values()), "peak_mb": largest / 1e6}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file", type=Path)
    ap.add_argument("--devices", default="cpu,torch:cpu")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--share", action="store_true", help="decode as verify, unpack and load_model do (Reader share_payload)")
    ap.add_argument("--peak", action="store_true", help="also the largest block's peak of numpy allocations (tracemalloc; slower)")
    a = ap.parse_args(argv)
    print("| device | decode s | linear algebra s (gram / eigh / regenerate) | host s |" + (" numpy peak MB |" if a.peak else ""))
    print("|---|---|---|---|" + ("---|" if a.peak else ""))
    for dev in a.devices.split(","):
        s = split(a.file, dev, a.workers, a.share, a.peak)
        la = " / ".join(f"{s.get(k, 0.0):.2f}" for k in ("gram", "eigh", "regenerate"))
        print(f"| {dev} | {s['total']:.2f} | {s['total'] - s['host']:.2f} ({la}) | {s['host']:.2f} |"
              + (f" {s['peak_mb']:.3f} |" if a.peak else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())

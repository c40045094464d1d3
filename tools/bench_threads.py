#!/usr/bin/env python3
"""What BLAS pinning and parallel block decoding cost and win, side by side in one run.

    python tools/bench_threads.py [CONTAINER] [--repeats 3]

CONTAINER defaults to the s=0.25 `symmetric exact` container tools/bench.py leaves in
/tmp/bbformat-bench. Variants alternate within each repeat; the medians are printed as a
markdown table with the machine:
- decode (every block, reverse order): one BLAS thread (as shipped) vs BLAS unpinned, and
  with 2 worker threads;
- unpack and load_model with 1 and 2 workers;
- eigh of a D = 2048 Gram matrix on one BLAS thread vs the default.
"""
from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import numpy as np  # noqa: E402

import bbformat  # noqa: E402
import bbformat.reader as reader  # noqa: E402
from bbformat.codec import rotation as rot  # noqa: E402
from machine import cpu_and_memory, python_and_numpy  # noqa: E402

DEFAULT = Path("/tmp/bbformat-bench/smol_0.25_symmetric_0.0.bb")


@contextlib.contextmanager
def blas_unpinned():  # type: ignore[no-untyped-def]
    pinned = rot.one_blas_thread
    rot.one_blas_thread = contextlib.nullcontext  # type: ignore[assignment]
    try:
        yield
    finally:
        rot.one_blas_thread = pinned


@contextlib.contextmanager
def workers(n: int):  # type: ignore[no-untyped-def]
    before = reader.DECODE_WORKERS
    reader.DECODE_WORKERS = n
    bbformat.api.DECODE_WORKERS = n  # type: ignore[attr-defined]
    try:
        yield
    finally:
        reader.DECODE_WORKERS = before
        bbformat.api.DECODE_WORKERS = before  # type: ignore[attr-defined]


def timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("container", type=Path, nargs="?", default=DEFAULT)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args(argv)
    if not a.container.is_file():
        print(f"bench_threads: no container at {a.container} (run tools/bench.py first, or pass one)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="bbformat-threads-"))
    g = np.random.default_rng(0).normal(size=(2048, 2048))
    gram = g @ g.T

    def decode(n: int) -> Callable[[], object]:
        def run() -> None:
            with bbformat.Reader(a.container) as r:
                for _ in r.iter_blocks("reverse", workers=n):
                    pass
        return run

    def unpack() -> None:
        shutil.rmtree(work / "u", ignore_errors=True)
        bbformat.unpack(a.container, work / "u")

    def one_thread_eigh() -> None:
        with rot.one_blas_thread():
            np.linalg.eigh(gram)

    variants: dict[str, Callable[[], float]] = {
        "decode, 1 worker, BLAS pinned to 1 thread (shipped)": lambda: timed(decode(1)),
        "decode, 1 worker, BLAS unpinned": lambda: _unpinned(decode(1)),
        "decode, 2 workers": lambda: timed(decode(2)),
        "unpack, 1 worker": lambda: _with_workers(1, unpack),
        "unpack, 2 workers": lambda: _with_workers(2, unpack),
        "load_model, 1 worker": lambda: _with_workers(1, lambda: bbformat.load_model(a.container)),
        "load_model, 2 workers": lambda: _with_workers(2, lambda: bbformat.load_model(a.container)),
        "eigh D=2048, 1 BLAS thread": lambda: timed(one_thread_eigh),
        "eigh D=2048, default BLAS threads": lambda: timed(lambda: np.linalg.eigh(gram)),
    }
    res: dict[str, list[float]] = {k: [] for k in variants}
    try:
        for _ in range(a.repeats):
            for k, fn in variants.items():
                res[k].append(fn())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"Machine: {cpu_and_memory()}; {python_and_numpy()}. Container: {a.container.name}. "
          f"Median of {a.repeats}, variants alternating.\n")
    print("| variant | median s | runs s |\n|---|---:|---|")
    for k, v in res.items():
        print(f"| {k} | {statistics.median(v):.2f} | {', '.join(f'{x:.2f}' for x in v)} |")
    return 0


def _unpinned(fn: Callable[[], object]) -> float:
    with blas_unpinned():
        return timed(fn)


def _with_workers(n: int, fn: Callable[[], object]) -> float:
    with workers(n):
        return timed(fn)


if __name__ == "__main__":
    raise SystemExit(main())

"""What tools/bench measures in a fresh process: `python -m tools.bench.child TASK ARGS`, run from
the repository root (common.run_child). Each task prints its result on stdout.

    load-model PATH                  wall time (imports included) and peak RSS of load_model
    stream-peak PATH                 RSS growth while iter_stream decodes PATH and keeps every tensor
    baseline TREE SRC WORK REPEATS   pack, unpack and load_model of the bbformat checkout TREE

Only the standard library is imported here at start: each task imports bbformat itself, so the
load time includes the imports, and `baseline` gets TREE's bbformat, not this checkout's.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any, Callable


def load_model_task(path: str) -> str:
    """'<seconds> <peak RSS MiB>' of load_model(path), clock started before the imports; the peak
    is this process's VmHWM (ru_maxrss survives exec and could report the parent's larger peak)."""
    t = time.perf_counter()
    from bbformat.loader import load_model
    from tools.bench_scale import vm_hwm

    load_model(path)
    return f"{time.perf_counter() - t} {vm_hwm() / 2**20}"


def _warm_up() -> None:
    """The libraries' fixed buffers (LAPACK/BLAS workspace, zstd contexts) are not the model: warm
    them up on a 64 x 64 problem before the baseline."""
    import numpy as np
    import zstandard

    from bbformat.codec import rotation as rot

    with rot.one_blas_thread():
        np.linalg.eigh(np.eye(64) + 1e-3 * np.arange(64.0)[:, None] * np.arange(64.0)[None, :])
    zstandard.ZstdDecompressor().decompress(zstandard.ZstdCompressor(level=3).compress(bytes(4096)))


def stream_peak_task(path: str) -> str:
    """JSON: growth of the peak RSS (VmHWM of /proc/self/status: ru_maxrss survives exec and would
    report the parent's larger peak) while iter_stream decodes the whole file and keeps every
    tensor, as a loader does; the decoded model's bytes and the largest block's."""
    from bbformat import iter_stream
    from tools.bench_scale import vm_hwm

    _warm_up()
    base = vm_hwm()
    kept, largest = [], 0
    with open(path, "rb") as f:
        for item in iter_stream(f):  # the blocks (the header is the stream's .header)
            largest = max(largest, sum(t.bits.nbytes for t in item.tensors.values()))
            kept.append(item.tensors)
    peak = vm_hwm()
    model = sum(t.bits.nbytes for d in kept for t in d.values())
    return json.dumps({"growth": peak - base, "model": model, "largest_block": largest})


def _median_seconds(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def baseline_task(tree: str, src: str, work: str, repeats: str) -> str:
    """JSON: median pack, unpack and load_model seconds of the checkout `tree`, per entropy mode."""
    sys.path.insert(0, tree)  # before the first import of bbformat
    import bbformat
    from bbformat.loader import load_model

    import inspect

    res: dict[str, Any] = {"version": bbformat.__version__}
    # repeats write the same outputs: allowed explicitly where the checkout knows overwrite= (issue 25)
    again: dict[str, Any] = {"overwrite": True} if "overwrite" in inspect.signature(bbformat.pack).parameters else {}
    for mode in ("none", "auto"):
        out = f"{work}/baseline_{mode}.bb"
        steps: tuple[tuple[str, Callable[[], object]], ...] = (
            ("pack_s", lambda: bbformat.pack(src, out, entropy=mode, **again)),
            ("unpack_s", lambda: bbformat.unpack(out, f"{work}/baseline_unpacked_{mode}", **again)),
            ("load_s", lambda: load_model(out)))
        res[mode] = {what: _median_seconds(fn, int(repeats)) for what, fn in steps}
    return json.dumps(res)


TASKS: dict[str, Callable[..., str]] = {"load-model": load_model_task, "stream-peak": stream_peak_task, "baseline": baseline_task}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in TASKS:
        print(f"usage: python -m tools.bench.child {{{','.join(TASKS)}}} ARGS", file=sys.stderr)
        return 2
    print(TASKS[argv[0]](*argv[1:]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

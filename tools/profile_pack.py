#!/usr/bin/env python3
"""pack's host work per step, in CPU seconds (issue 39 item 2).

    python tools/profile_pack.py SRC DST OUT.json [--tree DIR]   # one pack, profiled
    python tools/profile_pack.py --table BEFORE.json AFTER.json ... # the side-by-side table

One pack (`--entropy auto`, the defaults otherwise) runs sequentially in this process: the
compression worker's tasks run inline, the canonical directions are not computed ahead, and one
thread codes the payload parts, so one cProfile with a CPU clock (time.thread_time) sees all
of it. The bytes are those of the threaded pack (packing.py). Every function's own CPU time
goes to a step: the linear algebra (Gram, eigh, rotations, regenerate, matmul), else by the
module and function; a helper's (numpy, builtins, dtypes, host_native, zstd ...) to the steps
of its callers, in proportion to the time each caller spent in it.

Run it with PYTHONPATH set to the tree to measure (this file may come from another tree).
"""
from __future__ import annotations

import cProfile
import json
import pstats
import sys
import time
from typing import Any

LINALG = {("linalg.py", "matmul"), ("rotation.py", "gram"), ("rotation.py", "regenerate"), ("rotation.py", "rotate_axis"),
          ("_linalg.py", "eigh"), ("_linalg.py", "eigvalsh")}
# (file, function or "*") -> step; the first match wins. Anything else is a helper.
STEPS = [
    (("encoder.py", "rotate_rounded_blocks"), "rotate and round (large tensors)"),
    (("encoder.py", "_final_value"), "rotate and round (other tensors)"),
    (("encoder.py", "round_rotated"), "rotate and round (other tensors)"),
    (("encoder.py", "canonical_rotation_of"), "canonical directions (host part)"),
    (("encoder.py", "canonical_rotation"), "canonical directions (host part)"),
    (("encoder.py", "_eigen_of_top"), "pop X: peek, widen, eigenvalues"),
    (("encoder.py", "_forward_site"), "pop X: peek, widen, eigenvalues"),
    (("encoder.py", "_run_forward"), "stack push (forward)"),
    (("encoder.py", "_encode_once"), "payload bytes (forward's stack to bytes)"),
    (("encoder.py", "finish"), "side sections (corrections coding)"),
    (("encoder.py", "*"), "encoder, other"),
    (("stack.py", "push"), "stack push (forward)"),
    (("stack.py", "*"), "stack peek/pop copies"),
    (("simulate.py", "correct_x"), "simulated decode: corrections, band"),
    (("simulate.py", "correct_anchor"), "simulated decode: corrections, band"),
    (("simulate.py", "needs_fix"), "simulated decode: corrections, band"),
    (("simulate.py", "*"), "simulated decode: second eigensolver glue"),
    (("band.py", "*"), "simulated decode: corrections, band"),
    (("decoder.py", "_undo_site"), "simulated decode: round regenerated X"),
    (("decoder.py", "*"), "simulated decode: stack, basis"),
    (("section_kinds.py", "*"), "side sections (corrections coding)"),
    (("sections.py", "*"), "side sections (corrections coding)"),
    (("exponent.py", "*"), "payload: codec 3 (exponent)"),
    (("rans.py", "*"), "payload: codec 3 (exponent)"),
    (("entropy.py", "*"), "payload: codec 2 (planes)"),
    (("payload.py", "_code_symbols"), "payload: codec 1 (zstd)"),
    (("payload.py", "*"), "payload: parts, choice"),
    (("parts.py", "*"), "payload: parts, choice"),
    (("digest.py", "*"), "CRCs and content digests"),
    (("api.py", "_digest"), "CRCs and content digests"),
    (("crc.py", "*"), "CRCs and content digests"),
    (("writer.py", "*"), "writer (chunk bytes, writes, fsync)"),
    (("fsutil.py", "*"), "writer (chunk bytes, writes, fsync)"),
    (("chunkfile.py", "*"), "writer (chunk bytes, writes, fsync)"),
    (("base.py", "_nonfinite"), "input: NaN/Inf check"),
    (("base.py", "check_finite"), "input: NaN/Inf check"),
    (("tensors.py", "*"), "input: read, torch to numpy"),
    (("mapped.py", "*"), "input: read, torch to numpy"),
    (("packing.py", "*"), "input: read, torch to numpy"),
]
HELPER_FILES = ("dtypes.py", "host_native.py", "varint.py", "zstdframe.py", "linalg.py", "rotation.py", "native.py", "program.py")


def _step(func: tuple[str, int, str]) -> str | None:
    """The step a function's own time belongs to, "linear algebra", or None for a helper."""
    path, _, name = func
    base = path.rsplit("/", 1)[-1]
    if (base, name) in LINALG:
        return "linear algebra"
    if "importlib" in path and name == "_find_and_load":
        return "imports (torch, on first use)"
    if "bbformat" not in path:
        return None
    for (f, n), step in STEPS:
        if base == f and n in ("*", name):
            return step
    return None if base in HELPER_FILES else "other bbformat"


def attribute(stats: pstats.Stats) -> dict[str, float]:
    """CPU seconds per step (see the module docstring)."""
    table: dict[tuple[str, int, str], Any] = stats.stats  # type: ignore[attr-defined]
    memo: dict[tuple[str, int, str], dict[str, float]] = {}

    def shares(func: tuple[str, int, str], depth: int = 0) -> dict[str, float]:
        """How one second of func's time divides among steps."""
        step = _step(func)
        if step is not None or depth > 40:
            return {step or "other (mostly imports)": 1.0}
        if func in memo:
            return memo[func]
        callers = table[func][4]
        total = sum(v[3] for v in callers.values()) or 1.0
        out: dict[str, float] = {}
        for caller, v in callers.items():
            for s, f in shares(caller, depth + 1).items():
                out[s] = out.get(s, 0.0) + f * v[3] / total
        memo[func] = out or {"other (mostly imports)": 1.0}
        return memo[func]

    steps: dict[str, float] = {}
    for func, (_, _, tt, _, callers) in table.items():
        if _step(func) is not None or not callers:
            s = _step(func) or "other (mostly imports)"
            steps[s] = steps.get(s, 0.0) + tt
            continue
        total = sum(v[3] for v in callers.values()) or 1.0
        for caller, v in callers.items():  # a helper: its own time, caller by caller
            for s, f in shares(caller).items():
                steps[s] = steps.get(s, 0.0) + tt * (v[3] / total) * f
    return steps


def profile(src: str, dst: str, out: str) -> None:
    from bbformat import packing
    from bbformat.api import pack

    packing.CANONICAL_AHEAD = 0
    packing.BoundedWorker.submit = lambda self, fn, *args: fn(*args)  # type: ignore[method-assign]
    prof = cProfile.Profile(time.thread_time)
    c0 = time.thread_time()
    prof.enable()
    pack(src, dst, overwrite=True, entropy="auto", threads=1)
    prof.disable()
    cpu = time.thread_time() - c0
    steps = attribute(pstats.Stats(prof))
    host = sum(v for k, v in steps.items() if k != "linear algebra")
    with open(out, "w") as f:
        json.dump({"src": src, "cpu": cpu, "host": host, "steps": steps}, f, indent=1)
    prof.dump_stats(out + ".prof")
    print(json.dumps({"cpu": round(cpu, 2), "host": round(host, 2)}))


def _load(path: str) -> dict[str, Any]:
    """A profile's json, its steps attributed afresh from its .prof where that is kept (so runs
    profiled by another version of this file share its steps)."""
    with open(path) as f:
        run: dict[str, Any] = json.load(f)
    try:
        run["steps"] = attribute(pstats.Stats(path + ".prof"))
    except OSError:
        return run
    run["host"] = sum(v for k, v in run["steps"].items() if k != "linear algebra")
    return run


def table(paths: list[str]) -> str:
    """Markdown: steps as rows, a before/after pair of columns per (before, after) pair of files."""
    runs = [_load(p) for p in paths]
    pairs = list(zip(runs[0::2], runs[1::2]))
    names = sorted({k for r in runs for k in r["steps"] if k != "linear algebra"},
                   key=lambda k: -max(r["steps"].get(k, 0.0) for r in runs))
    head = "| step | " + " | ".join(f"{b['src'].rstrip('/').rsplit('_', 1)[-1]}: before → after" for b, _ in pairs) + " |"
    lines = [head, "|---|" + "---|" * len(pairs)]
    for k in names:
        lines.append(f"| {k} | " + " | ".join(f"{b['steps'].get(k, 0.0):.2f} → {a['steps'].get(k, 0.0):.2f}" for b, a in pairs) + " |")
    lines.append("| **host total** | " + " | ".join(f"**{b['host']:.2f} → {a['host']:.2f}** ({a['host'] / b['host']:.2f}×)"
                                                  for b, a in pairs) + " |")
    lines.append("| linear algebra (not host) | " + " | ".join(
        f"{b['steps'].get('linear algebra', 0.0):.1f} → {a['steps'].get('linear algebra', 0.0):.1f}" for b, a in pairs) + " |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--table":
        print(table(argv[1:]))
        return 0
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    profile(*argv)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

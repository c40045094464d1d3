#!/usr/bin/env python3
"""The host's work of a decode and of a pack (issue 39), before and after the compiled host
path, next to ZipNN's one-thread decompression of the same weights, in one run.

    python tools/bench_host.py --work DIR [--dtypes bfloat16,float16,float32] [--before REV]
                               [--pack-dtypes bfloat16] [--torch-dtypes bfloat16] [--report BENCHMARKS.md]

Input per dtype: the one-layer Llama-2-7B shape (tools/make_large.py --preset llama-2-7b
--layers 1 --key-order tc), packed with the defaults (symmetric, --entropy auto, format 1.5).

Every measurement runs in a child process (its peak RSS is its own), one at a time:
  * decode host seconds: Reader.iter_blocks on one worker and one part thread, wall time
    minus the linear algebra (Gram, eigh, regenerate, as rotation.linalg_clock times them),
    for the reference backend (cpu) and for torch:cpu (the GPU path's host code);
  * one thread against two: the same decode with the linear algebra replayed from a first
    pass (the Gram, eigenvectors and regenerated block of each site, looked up instead of
    computed), so the wall time is the host's work alone, on 1 worker x 1 part thread and on
    2 x 2;
  * pack host seconds: `pack`'s wall time minus its linear algebra;
  * "before": the same, from a worktree of REV (the commit before the compiled host path),
    alternating with "after" per dtype;
  * "heap.kept": the after tree's decode and pack inside bbformat.heap.kept(), as the bbformat
    command runs every command (the decode on one worker and one part thread, on the main
    thread), alternating with "after"; its pack's bytes are compared with after's every round.
ZipNN 0.5.4 compresses the safetensors' tensor bytes once; its one-thread decompression from
memory is timed best of 3.
"""
from __future__ import annotations

import argparse
import filecmp
import json
import os
import resource
import subprocess
import sys
import threading
import time
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from machine import cpu_and_memory, python_and_numpy  # noqa: E402
from mdsection import write_section  # noqa: E402

from bbformat.heap import USER_SETTINGS  # noqa: E402

SECTION = "## 19. The host's work of a decode and a pack (tools/bench_host.py)"
DTYPES = ("bfloat16", "float16", "float32")


# ----------------------------------------------------------------------------- child side

def _clocked() -> tuple[Any, dict[str, float]]:
    """rotation.linalg_clock (Gram, eigh, rotate_axis, regenerate), plus the backends' matmul,
    which it does not time (pack rotates large tensors in row blocks with it). The patch is
    the benchmark's own, so the "before" tree is timed the same way."""
    from bbformat.codec import linalg, rotation as rot

    spent: dict[str, float] = {}
    lock = threading.Lock()

    def record(name: str, seconds: float) -> None:
        with lock:
            spent[name] = spent.get(name, 0.0) + seconds

    for cls in (linalg.NumpyLinalg, linalg.TorchLinalg):
        def timed(self: Any, a: Any, b: Any, _inner: Any = cls.matmul) -> Any:
            t0 = time.perf_counter()
            out = _inner(self, a, b)
            if getattr(self, "device", None) is not None and self.device.type == "cuda":
                self._torch.cuda.synchronize(self.device)
            record("matmul", time.perf_counter() - t0)
            return out
        cls.matmul = timed  # type: ignore[method-assign]
    return rot.linalg_clock(record), spent


def _heap(kept: bool) -> AbstractContextManager[None]:
    """bbformat.heap.kept() where `kept` (the after tree only: as the bbformat command runs), else nothing."""
    if not kept:
        return nullcontext()
    from bbformat import heap

    return heap.kept()


def child_decode(path: str, device: str, workers: int, threads: int, kept: bool = False) -> dict[str, float]:
    from bbformat.reader import Reader

    clock, spent = _clocked()
    with _heap(kept), clock, Reader(path, device=device, share_payload=True, threads=threads) as r:
        t = time.perf_counter()
        for block in r.iter_blocks(workers=workers):
            del block
        wall = time.perf_counter() - t
    return {"wall": wall, "linalg": sum(spent.values())}


class Replay:
    """The reference backend with its Gram, eigh and regenerate looked up from a first pass."""

    def __init__(self) -> None:
        from bbformat.codec.linalg import NumpyLinalg

        self.la = NumpyLinalg()
        self.record = True
        self.grams: dict[bytes, Any] = {}
        self.eigs: dict[int, Any] = {}
        self.regens: dict[int, Any] = {}

    def install(self) -> Any:
        la, me = self.la, self
        real_gram, real_eigh, real_regen = la.gram, la.eigh, la.regenerate

        def gram(m: Any) -> Any:
            key = repr(m.shape).encode() + m[:4].tobytes()
            if me.record:
                me.grams[key] = real_gram(m)
            return me.grams[key]

        def eigh(g: Any) -> Any:
            if me.record:
                me.eigs[id(g)] = real_eigh(g)
            return me.eigs[id(g)]

        def regenerate(e: Any, mu: Any, paper: bool) -> Any:
            if me.record:
                me.regens[id(e)] = real_regen(e, mu, paper)
            return me.regens[id(e)]

        la.gram, la.eigh, la.regenerate = gram, eigh, regenerate  # type: ignore[method-assign]
        return la


def child_replay(path: str) -> dict[str, float]:
    """Host seconds with the linear algebra replayed: one pass to record, then 1x1 and 2x2."""
    from bbformat.reader import Reader

    rep = Replay()
    la = rep.install()
    out: dict[str, float] = {}
    for label, workers, threads, record in (("record", 1, 1, True), ("host1", 1, 1, False), ("host2", 2, 2, False),
                                            ("host1b", 1, 1, False), ("host2b", 2, 2, False)):
        rep.record = record
        with Reader(path, device=la, share_payload=True, threads=threads) as r:
            t = time.perf_counter()
            for block in r.iter_blocks(workers=workers):
                del block
            out[label] = time.perf_counter() - t
    return {"host1": min(out["host1"], out["host1b"]), "host2": min(out["host2"], out["host2b"])}


def child_pack(src: str, dst: str, kept: bool = False) -> dict[str, float]:
    from bbformat.api import pack

    clock, spent = _clocked()
    t = time.perf_counter()
    with _heap(kept), clock:
        pack(src, dst, overwrite=True, entropy="auto")
    return {"wall": time.perf_counter() - t, "linalg": sum(spent.values())}


def child_zipnn(src: str, dtype: str) -> dict[str, float]:
    import zipnn
    from safetensors import safe_open

    raw = bytearray()
    with safe_open(src, framework="numpy" if dtype != "bfloat16" else "pt") as f:
        for k in f.keys():
            t = f.get_tensor(k)
            raw += t.view(__import__("torch").int16).numpy().tobytes() if dtype == "bfloat16" else t.tobytes()
    z = zipnn.ZipNN(input_format="byte", bytearray_dtype=dtype, threads=1)
    comp = z.compress(bytearray(raw))
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        back = z.decompress(comp)
        best = min(best, time.perf_counter() - t0)
    assert bytes(back) == bytes(raw), "ZipNN did not give the bytes back"
    return {"wall": best, "bytes": len(comp), "plain": len(raw)}


def child_main(argv: list[str]) -> None:
    kind, *args = argv
    fn = {"decode": lambda: child_decode(args[0], args[1], int(args[2]), int(args[3]), args[4:] == ["kept"]),
          "replay": lambda: child_replay(args[0]), "pack": lambda: child_pack(args[0], args[1], args[2:] == ["kept"]),
          "zipnn": lambda: child_zipnn(args[0], args[1])}[kind]
    out = fn()
    out["rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print("RESULT " + json.dumps(out))


# ----------------------------------------------------------------------------- parent side

# Settings that would change what the children measure (bbformat.heap): left out of their environment.
MALLOC_ENV = ("BBFORMAT_HEAP", "GLIBC_TUNABLES", *USER_SETTINGS)


def run_child(tree: Path, *args: str) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k not in MALLOC_ENV}
    env["PYTHONPATH"] = str(tree)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", *args]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tree)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return dict(json.loads(line[7:]))
    raise RuntimeError(f"child {args} failed ({p.returncode}): {p.stderr.strip()[-2000:]}")


def before_tree(work: Path, rev: str) -> Path:
    tree = work / f"before-{rev}"
    if not tree.exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), rev], check=True, capture_output=True)
        subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=tree, check=True, capture_output=True)
    return tree


def source(work: Path, dtype: str, preset: str) -> Path:
    src = work / f"src_{preset}_{dtype}"
    if not src.exists():
        subprocess.run([sys.executable, str(ROOT / "tools" / "make_large.py"), "--preset", preset, "--layers", "1",
                        "--dtype", dtype, "--key-order", "tc", "--format", "safetensors", str(src)], check=True, capture_output=True)
    return src


def after_rev() -> str:
    """This checkout's commit, "-dirty" where bbformat/ or tools/ differ from it ("unknown" outside git)."""
    try:
        rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "bbformat", "tools"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return rev + ("-dirty" if dirty else "")


def measure(a: argparse.Namespace) -> dict[str, Any]:
    work = a.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    old = before_tree(work, a.before)
    res: dict[str, Any] = {"run": {"machine": cpu_and_memory(), "software": python_and_numpy(), "before": a.before,
                                   "after": after_rev(),
                                   "date": time.strftime("%Y-%m-%d"), "argv": sys.argv[1:],
                                   "preset": a.preset}, "dtypes": {}}
    for dtype in a.dtypes:
        src = source(work, dtype, a.preset)
        weights = next(src.glob("*.safetensors"))
        bb, bb_old = work / f"{a.preset}-{dtype}.bb", work / f"{a.preset}-{dtype}-before.bb"
        bb_kept = work / f"{a.preset}-{dtype}-kept.bb"
        r: dict[str, Any] = res["dtypes"].setdefault(dtype, {})
        print(f"[{dtype}]", flush=True)
        if dtype in a.pack_dtypes or not bb.exists():
            for rnd in range(a.rounds if dtype in a.pack_dtypes else 0):
                r.setdefault("pack_before", []).append(run_child(old, "pack", str(src), str(bb_old)))
                r.setdefault("pack_after", []).append(run_child(ROOT, "pack", str(src), str(bb)))
                r.setdefault("pack_kept", []).append(run_child(ROOT, "pack", str(src), str(bb_kept), "kept"))
                r["pack_kept_same_bytes"] = r.get("pack_kept_same_bytes", True) and filecmp.cmp(bb, bb_kept, shallow=False)
                print(f"  pack round {rnd}: before {r['pack_before'][-1]}, after {r['pack_after'][-1]}, "
                      f"heap.kept {r['pack_kept'][-1]}, same bytes {r['pack_kept_same_bytes']}", flush=True)
            if not bb.exists():
                run_child(ROOT, "pack", str(src), str(bb))
        r["file_bytes"], r["plain_bytes"] = bb.stat().st_size, weights.stat().st_size
        for rnd in range(a.rounds):
            r.setdefault("decode_before", []).append(run_child(old, "decode", str(bb), "cpu", "1", "1"))
            r.setdefault("decode_after", []).append(run_child(ROOT, "decode", str(bb), "cpu", "1", "1"))
            r.setdefault("decode_kept", []).append(run_child(ROOT, "decode", str(bb), "cpu", "1", "1", "kept"))
        if dtype in a.torch_dtypes:
            r["decode_torch_before"] = run_child(old, "decode", str(bb), "torch:cpu", "1", "1")
            r["decode_torch_after"] = run_child(ROOT, "decode", str(bb), "torch:cpu", "1", "1")
        r["replay_before"] = run_child(old, "replay", str(bb))
        r["replay_after"] = run_child(ROOT, "replay", str(bb))
        r["zipnn"] = run_child(ROOT, "zipnn", str(weights), dtype)
        print(f"  {json.dumps(r)}", flush=True)
    return res


# ----------------------------------------------------------------------------- report

def _host(m: dict[str, float]) -> float:
    return m["wall"] - m["linalg"]


def _best(ms: list[dict[str, float]]) -> dict[str, float]:
    return min(ms, key=_host)


def _goal(ok: bool, how: str) -> str:
    return f"**met** ({how})" if ok else f"**missed** ({how})"


def render(res: dict[str, Any], notes: str = "") -> str:
    run = res["run"]
    lines = [SECTION, "",
             f"Machine: {run['machine']}; {run['software']}. Run {run['date']}: `python tools/bench_host.py "
             f"{' '.join(run['argv'])}`. \"Before\" is {run['before']}, the commit before the compiled host path, "
             "built in a worktree" + (f"; \"after\" is {run['after']}" if "after" in run else "")
             + "; each figure is the better of the alternating rounds.", "",
             "Input: the one-layer Llama-2-7B shape (`make_large.py --preset llama-2-7b --layers 1 --key-order tc`, random "
             "weights), packed with the defaults (symmetric, `--entropy auto`, format 1.5). Host seconds = wall time minus "
             "the linear algebra (rotation.linalg_clock, and the backends' matmul); \"replayed\" = the decode with the linear algebra looked up from a "
             "first pass, so its wall time is the host's work alone. \"heap.kept\": the after tree inside "
             "`bbformat.heap.kept()` (glibc keeps freed memory for reuse), as the `bbformat` command runs every command; "
             "the decode here is one worker and one part thread, on the main thread. Alternating "
             "with \"after\" (the library's default: malloc as the process has it).", "",
             "| dtype | file % of plain | ZipNN 1 thread s | decode host s, reference: before → after | × ZipNN (after) | "
             "decode host s, heap.kept (× ZipNN) | torch:cpu host s: before → after | replayed host s, 1 thread: "
             "before → after | 2 threads / 1 (after) | decode peak RSS GiB: before → after → heap.kept | "
             "pack host s: before → after → heap.kept | pack after / before (heap.kept / before) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    goals = []
    for dtype, r in res["dtypes"].items():
        z = r["zipnn"]["wall"]
        db, da = _best(r["decode_before"]), _best(r["decode_after"])
        ratio = _host(da) / z
        tb, ta = r.get("decode_torch_before"), r.get("decode_torch_after")
        torch_cell = f"{_host(tb):.2f} → {_host(ta):.2f}" if tb and ta else "not run"
        rb, ra = r["replay_before"], r["replay_after"]
        two = ra["host2"] / ra["host1"]
        dk = _best(r["decode_kept"]) if r.get("decode_kept") else None
        kept_cell = f"{_host(dk):.2f} ({_host(dk) / z:.2f})" if dk else "not run"
        rss_cell = f"{db['rss_gib']:.2f} → {da['rss_gib']:.2f}" + (f" → {dk['rss_gib']:.2f}" if dk else "")
        pb, pa, pk = r.get("pack_before"), r.get("pack_after"), r.get("pack_kept")
        pack_cell, pack_ratio = "not run", ""
        if pb and pa:
            hb, ha = _host(_best(pb)), _host(_best(pa))
            pack_cell, pack_ratio = f"{hb:.1f} → {ha:.1f}", f"{ha / hb:.2f}"
            goals.append(f"- pack's host work ≤ 1/4 of before, {dtype}: " + _goal(ha / hb <= 0.25, f"{ha / hb:.2f} of before"))
            if pk:
                hk = _host(_best(pk))
                pack_cell, pack_ratio = pack_cell + f" → {hk:.1f}", pack_ratio + f" ({hk / hb:.2f})"
                goals.append(f"- pack's host work ≤ 1/4 of before, {dtype}, inside heap.kept (as `bbformat pack`): "
                             + _goal(hk / hb <= 0.25, f"{hk / hb:.2f} of before; the same bytes: "
                                     f"{'yes' if r.get('pack_kept_same_bytes') else 'NO'}"))
        lines.append(f"| {dtype} | {100 * r['file_bytes'] / r['plain_bytes']:.2f}% | {z:.2f} | {_host(db):.2f} → {_host(da):.2f} | "
                     f"{ratio:.2f} | {kept_cell} | {torch_cell} | {rb['host1']:.2f} → {ra['host1']:.2f} | {two:.2f} | "
                     f"{rss_cell} | {pack_cell} | {pack_ratio} |")
        goals.append(f"- decode host work ≤ 1.5× ZipNN's one-thread decompression, {dtype}: "
                     + _goal(ratio <= 1.5, f"{ratio:.2f}×, reference backend") + ("" if not ta else
                     f"; torch:cpu {_host(ta) / z:.2f}×"))
        if dk:
            goals.append(f"- decode host work ≤ 1.5× ZipNN's one-thread decompression, {dtype}, inside heap.kept (one "
                         "worker and one part thread, on the main thread, as `bbformat verify --workers 1 --threads 1`): "
                         + _goal(_host(dk) / z <= 1.5, f"{_host(dk) / z:.2f}×, reference backend"))
        goals.append(f"- two threads ≤ 0.55× one, {dtype}: " + _goal(two <= 0.55, f"{two:.2f}, replayed"))
        goals.append(f"- nothing slower on the reference, {dtype}: " + _goal(_host(da) <= _host(db) * 1.05,
                     f"host {_host(db):.2f} → {_host(da):.2f} s"))
    tail = ["", notes.strip()] if notes.strip() else []
    return "\n".join(lines + ["", "Goals (issue 39):", ""] + goals + tail) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        child_main(argv[1:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, help="working directory (inputs, containers, the before worktree)")
    ap.add_argument("--dtypes", type=lambda s: s.split(","), default=list(DTYPES))
    ap.add_argument("--pack-dtypes", type=lambda s: s.split(","), default=["bfloat16"], help="dtypes whose pack is timed before/after")
    ap.add_argument("--torch-dtypes", type=lambda s: s.split(","), default=["bfloat16"], help="dtypes decoded with torch:cpu too")
    ap.add_argument("--before", default="435de56", help="the commit to compare against")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--preset", default="llama-2-7b", help="make_large.py's preset (tiny-llama: a quick check of the tool)")
    ap.add_argument("--json", type=Path, default=ROOT / "tools" / "bench_host_results.json")
    ap.add_argument("--from-json", type=Path, help="render the section from a --json of an earlier run")
    ap.add_argument("--report", type=Path, help="write the section into this markdown file (BENCHMARKS.md)")
    ap.add_argument("--notes", type=Path, help="markdown appended to the section (what the table shows and why)")
    a = ap.parse_args(argv)
    if a.from_json:
        res = json.loads(a.from_json.read_text())
    else:
        if a.work is None:
            ap.error("--work is required unless --from-json")
        res = measure(a)
        a.json.write_text(json.dumps(res, indent=1) + "\n")
    text = render(res, a.notes.read_text(encoding="utf-8") if a.notes else "")
    print(text)
    if a.report:
        write_section(a.report, text, SECTION)
    return 0


if __name__ == "__main__":
    sys.exit(main())

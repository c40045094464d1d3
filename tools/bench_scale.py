#!/usr/bin/env python3
"""The paper's model sizes on one machine: pack, verify, unpack and load_model of synthetic
Llama-2-7B and OPT-13B checkpoints sliced at 0.25, with the wall time and peak RSS of each
command in a fresh process, against floors run with the codec's own linear algebra and
against plain loaders (safetensors, ZipNN, zstd-3) on the same checkpoint.

    python tools/bench_scale.py --work DIR [--models llama-2-7b,opt-13b] [--layers llama-2-7b=32,opt-13b=8]
        [--repeats 1] [--json tools/bench_scale_results.json] [--report BENCHMARKS.md]
        [--skip-generate] [--keep] [--quick] [--pt-pack first|all|none] [--rss-limit GIB] [--timeout S]
    python tools/bench_scale.py --from-json R1.json [R2.json ...] --report BENCHMARKS.md   # rewrite the section only

Each model: `tools/make_large.py` writes the checkpoint into DIR/<model>/gen; its files are
hard-linked into DIR/<model>/st (the .safetensors and the side files) and DIR/<model>/pt (the
.pt and the side files), so pack can be timed from each input format. Every measured command
runs in a fresh child process (`python -c ... bench_scale.child_main`) that reads its own
VmHWM from /proc/self/status at exit (ru_maxrss would survive exec from this larger parent);
the parent kills a child whose RSS passes --rss-limit and records the failure. A failed
command is a row saying so, never the end of the run. Unpacked outputs, the .pt checkpoint,
the compressed copies and (unless --keep) the checkpoint and the container are deleted as
soon as nothing needs them.

Floors: the codec's primitives (bbformat.codec.rotation) on random matrices of each site's
exact shapes (from the container's programs), one BLAS thread, timed on one representative
site per distinct shape (median of 3) and multiplied by the number of such sites. Decoder
floor with N workers = max(sum / N, largest chunk); pack floor on T threads = max(sum / T,
the part that waits on the chain of sites). --quick uses make_large's tiny presets
(tiny-llama, tiny-opt) and, unless given, writes no JSON or report. The markdown section "## 7. Paper-sized models (scale)" replaces the section of the
same heading in --report, or is appended to it; other sections are never touched.
"""
from __future__ import annotations

import argparse
import json
import re
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / "tools"
SECTION = "## 7. Paper-sized models (scale)"
MODELS = ("llama-2-7b", "opt-13b")
DEFAULT_LAYERS = {"llama-2-7b": 32, "opt-13b": 8}
QUICK_LAYERS = 2
SPARSITY = 0.25  # the paper's Table 1 rows measured here
TINY_PRESETS = {"llama-2-7b": "tiny-llama", "opt-13b": "tiny-opt"}
RSS_GOAL_GIB = 4.0
UNPACK_GOAL = 1.3
PACK_GOAL = 1.5
PROJECT_N = (1, 2, 4, 8, 16)
FLOOR_REPEATS = 3
GIB = 2**30
ST_DTYPES = {"F16": ("float16", 2), "BF16": ("bfloat16", 2), "F32": ("float32", 4), "F64": ("float64", 8)}

Json = dict[str, Any]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ====================================================================== child side
# Everything below runs inside the fresh child processes; each task returns a JSON dict.


def vm_hwm() -> int:
    """Peak resident set of this process in bytes (VmHWM; reset by exec, unlike ru_maxrss)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _task_cli(args: list[str]) -> Json:
    """`bbformat ARGS`: main(argv) of bbformat.cli, timed without the imports (bbformat and torch)."""
    t0 = time.perf_counter()
    import bbformat  # noqa: F401  (the package: torch, numpy and the codec, imported lazily by main otherwise)
    from bbformat.cli import main

    t1 = time.perf_counter()
    try:
        rc = main(args)
    except SystemExit as exc:  # a usage error (e.g. an unknown command) exits from argparse
        rc = exc.code if isinstance(exc.code, int) else 1
    return {"rc": rc, "wall_s": time.perf_counter() - t1, "import_s": t1 - t0}


def _task_load_model(args: list[str]) -> Json:
    """bbformat.load_model(path) at its default dtype (timed), then one forward pass on 8 tokens.
    The libraries are imported before the clock starts, as for the commands."""
    import torch

    import bbformat

    _import_modeling()
    t = time.perf_counter()
    model = bbformat.load_model(args[0])
    load_s = time.perf_counter() - t
    res: Json = {"wall_s": load_s, "load_peak_rss_bytes": vm_hwm(), "dtype": str(next(model.parameters()).dtype)}
    try:
        vocab = int(getattr(model.config, "vocab_size", 2))
        ids = torch.randint(0, vocab, (1, 8), generator=torch.Generator().manual_seed(0))
        t = time.perf_counter()
        with torch.no_grad():
            out = model(ids)
        logits = out.logits if hasattr(out, "logits") else out[0]
        res.update(forward_ok=True, forward_s=time.perf_counter() - t, logits_shape=list(logits.shape),
                   logits_finite=bool(torch.isfinite(logits).all()))
    except Exception as exc:  # the load is what is timed; a failed forward is reported next to it
        res.update(forward_ok=False, forward_error=f"{type(exc).__name__}: {exc}"[:300])
    return res


def _import_modeling() -> None:
    """transformers' Llama and OPT modules (imported lazily by transformers), if installed."""
    import importlib

    for name in ("transformers.models.llama.modeling_llama", "transformers.models.opt.modeling_opt"):
        try:
            importlib.import_module(name)
        except ImportError:
            pass


def st_entries(path: Path) -> tuple[int, list[Json]]:
    """(data offset, [{name, dtype, itemsize, begin, end}]) from a .safetensors header."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    out = []
    for name, e in header.items():
        if name == "__metadata__":
            continue
        dtype, size = ST_DTYPES.get(e["dtype"], (e["dtype"].lower(), 1))
        out.append({"name": name, "dtype": dtype, "itemsize": size, "begin": e["data_offsets"][0], "end": e["data_offsets"][1]})
    out.sort(key=lambda e: e["begin"])
    return 8 + n, out


def _task_st_load(args: list[str]) -> Json:
    """safetensors.torch.load_file of the whole checkpoint, one byte of every page touched."""
    import safetensors.torch
    import torch

    t = time.perf_counter()
    sd = safetensors.torch.load_file(args[0])
    touched = 0
    for v in sd.values():
        touched += int(v.reshape(-1).view(torch.uint8)[::4096].sum())
    return {"wall_s": time.perf_counter() - t, "tensors": len(sd), "bytes": sum(v.numel() * v.element_size() for v in sd.values())}


def _group(raw: bytes, itemsize: int) -> bytes:
    import numpy as np

    return np.ascontiguousarray(np.frombuffer(raw, np.uint8).reshape(-1, itemsize).T).tobytes()


def _ungroup(data: bytes, itemsize: int) -> bytes:
    import numpy as np

    return np.ascontiguousarray(np.frombuffer(data, np.uint8).reshape(itemsize, -1).T).tobytes()


def _zipnn_codec(cache: dict[str, Any], dtype: str, threads: int) -> Any:
    """One ZipNN object per dtype."""
    if dtype not in cache:
        import zipnn

        cache[dtype] = zipnn.ZipNN(input_format="byte", bytearray_dtype=dtype, threads=threads)
    return cache[dtype]


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return ""


def _task_compress(args: list[str]) -> Json:
    """Compress the checkpoint tensor by tensor with ZipNN and byte-grouped zstd-3 into
    STORE/<codec>.bin (+ index.json); compression time per codec, memory about one tensor."""
    src, store, threads = Path(args[0]), Path(args[1]), int(args[2])
    import zstandard

    start, entries = st_entries(src)
    store.mkdir(parents=True, exist_ok=True)
    zc = zstandard.ZstdCompressor(level=3)
    codecs: dict[str, Callable[[bytes, Json], bytes]] = {"zstd": lambda raw, e: zc.compress(_group(raw, e["itemsize"]))}
    res: Json = {}
    try:
        import zipnn  # noqa: F401  (here only to say whether it is installed)

        zipnns: dict[str, Any] = {}
        codecs["zipnn"] = lambda raw, e: _zipnn_codec(zipnns, e["dtype"], threads).compress(bytearray(raw))  # ZipNN rewrites bf16 input
        res["zipnn_version"] = _version("zipnn")
    except ImportError as exc:
        res["zipnn"] = {"ok": False, "error": f"not installed ({exc})"}
    index: Json = {}
    for name, fn in codecs.items():
        try:
            res[name] = _compress_all(src, start, entries, store / f"{name}.bin", fn, index.setdefault(name, []))
        except Exception as exc:  # one codec's failure (e.g. a dtype it does not take) is its row's
            res[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:240]}
    (store / "index.json").write_text(json.dumps(index))
    return res


def _compress_all(src: Path, start: int, entries: list[Json], out: Path, fn: Callable[[bytes, Json], bytes], index: list[Json]) -> Json:
    seconds, written = 0.0, 0
    with open(src, "rb") as f, open(out, "wb") as g:
        for e in entries:
            f.seek(start + e["begin"])
            raw = f.read(e["end"] - e["begin"])
            t = time.perf_counter()
            blob = fn(raw, e)
            seconds += time.perf_counter() - t
            g.write(blob)
            index.append({**e, "offset": written, "length": len(blob), "raw": len(raw)})
            written += len(blob)
    return {"ok": True, "compress_s": seconds, "bytes": written}


def _task_decompress(args: list[str]) -> Json:
    """Read STORE/<codec>.bin and decompress every tensor (one at a time); with a third
    argument (a .safetensors file), also compare each tensor with it (tests only)."""
    codec, store, threads = args[0], Path(args[1]), int(args[2])
    check = Path(args[3]) if len(args) > 3 else None
    import zstandard

    index = json.loads((store / "index.json").read_text())[codec]
    zd = zstandard.ZstdDecompressor()
    zipnns: dict[str, Any] = {}
    for e in index if codec == "zipnn" else []:  # created (and zipnn imported) before the clock starts
        _zipnn_codec(zipnns, e["dtype"], threads)
    t = time.perf_counter()
    with open(store / f"{codec}.bin", "rb") as f:
        for e in index:
            blob = f.read(e["length"])
            if codec == "zstd":
                raw = _ungroup(zd.decompress(blob), e["itemsize"])
            else:
                raw = bytes(_zipnn_codec(zipnns, e["dtype"], threads).decompress(blob))
            if len(raw) != e["raw"]:
                raise RuntimeError(f"{codec}: {e['name']} decompressed to {len(raw)} B, not {e['raw']}")
            if check is not None:
                _check_tensor(check, e, raw)
    return {"wall_s": time.perf_counter() - t, "tensors": len(index)}


def _check_tensor(st: Path, e: Json, raw: bytes) -> None:
    start, _ = st_entries(st)
    with open(st, "rb") as f:
        f.seek(start + e["begin"])
        if f.read(e["end"] - e["begin"]) != raw:
            raise RuntimeError(f"{e['name']}: decompressed bytes differ from the checkpoint's")


# ---------------------------------------------------------------- floors (child side)


def read_sites(path: Path) -> list[Json]:
    """Every non-plain rotation site of the container: chunk, D, the anchor's shape and axis,
    the shapes and axes of every tensor the encoder rotates with it, paper flag."""
    import bbformat

    with bbformat.open_container(path) as r:
        programs = [r.read_chunk(i).program for i in range(len(r))]
    shapes = {t.name: list(t.shape) for p in programs for t in p.tensors}
    sites = []
    for ci, p in enumerate(programs):
        for s in p.sites:
            if s.plain:
                continue
            anchor = [list(p.tensors[s.anchor].shape), s.anchor_axis]
            followers = [] if s.paper else [[shapes[f.tensor], f.axis] for f in s.followers if f.tensor in shapes]
            sites.append({"chunk": ci, "dim": s.dim, "anchor": anchor, "paper": s.paper, "touched": [anchor, *followers]})
    return sites


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def decode_site_times(anchor: Any, axis: int, mu: Any, paper: bool) -> Json:
    """What the decoder cannot avoid for one site (codec/decoder.py decode_program): the
    anchor's Gram, one eigh, the rebuild E·diag(μ)·Eᵀ, and for paper sites the un-rotation M·E."""
    from bbformat.codec import rotation as rot

    m = rot.axis_matrix(anchor, axis)
    g, t_gram = _timed(lambda: rot.gram(m))
    (_, e), t_eigh = _timed(lambda: rot.eigh(g))
    _, t_rebuild = _timed(lambda: rot.regenerate(e, mu, paper))
    _, t_unrot = _timed(lambda: m @ e) if paper else (None, 0.0)
    return {"gram": t_gram, "eigh": t_eigh, "rebuild": t_rebuild, "unrotate": t_unrot}


def encode_site_times(tensors: list[tuple[Any, int]], x: Any, mu: Any) -> Json:
    """What the encoder does for one symmetric site (codec/encoder.py): the canonical direction
    (Gram + eigh of the anchor, off the chain), the eigh of the popped block, R = U0·Vᵀ, the
    rotation of every touched axis (anchor first), the decoder's simulation (Gram, eigh, rebuild)
    on the rotated anchor, and format 1.2's band: a second eigh of that Gram (upper triangle) and
    its rebuild (codec/simulate.py SimulatingCorrector.note_basis)."""
    from bbformat.codec import rotation as rot

    anchor, axis = tensors[0]
    g, t_cg = _timed(lambda: rot.gram(rot.axis_matrix(anchor, axis)))
    (_, u0), t_ce = _timed(lambda: rot.eigh(g))
    (_, v), t_pe = _timed(lambda: rot.eigh(x))
    r, t_comp = _timed(lambda: u0 @ v.T)
    rotated, t_rot = _timed(lambda: [rot.rotate_axis(t, ax, r) for t, ax in tensors])
    g2, t_sg = _timed(lambda: rot.gram(rot.axis_matrix(rotated[0], axis)))
    (_, e), t_se = _timed(lambda: rot.eigh(g2))
    _, t_sr = _timed(lambda: rot.regenerate(e, mu, False))
    (_, e2), t_be = _timed(lambda: rot.eigh_upper(g2))
    _, t_br = _timed(lambda: rot.regenerate(e2, mu, False))
    return {"canonical_gram": t_cg, "canonical_eigh": t_ce, "popped_eigh": t_pe, "compose": t_comp, "rotate": t_rot,
            "sim_gram": t_sg, "sim_eigh": t_se, "sim_rebuild": t_sr, "band_eigh": t_be, "band_rebuild": t_br}


def _median_parts(runs: list[Json]) -> Json:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


class _Arrays:
    """Random float64 arrays of any shape, as views of one buffer (the codec's inputs are float64)."""

    def __init__(self, sites: list[Json]) -> None:
        import numpy as np

        from math import prod

        n = max([prod(s) for site in sites for s, _ in site["touched"]] + [site["dim"] ** 2 for site in sites] + [1])
        self.buf = np.random.default_rng(0).standard_normal(n)

    def get(self, shape: list[int]) -> Any:
        from math import prod

        return self.buf[: prod(shape)].reshape(shape)

    def sym(self, d: int) -> Any:
        a = self.get([d, d])
        return (a + a.T) / 2


def _floor_keys(sites: list[Json]) -> tuple[list[Json], list[Json]]:
    """Distinct decoder and encoder site shapes, with each site's index into them."""
    dec: dict[str, Json] = {}
    enc: dict[str, Json] = {}
    for s in sites:
        dk = json.dumps([s["dim"], s["anchor"], s["paper"]])
        ek = json.dumps([s["dim"], s["touched"], s["paper"]])
        s["dkey"] = dec.setdefault(dk, {"i": len(dec), "dim": s["dim"], "anchor": s["anchor"], "paper": s["paper"], "count": 0})["i"]
        s["ekey"] = enc.setdefault(ek, {"i": len(enc), "dim": s["dim"], "touched": s["touched"], "paper": s["paper"], "count": 0})["i"]
        dec[dk]["count"] += 1
        enc[ek]["count"] += 1
    return list(dec.values()), list(enc.values())


def measure_floor_shapes(sites: list[Json], repeats: int = FLOOR_REPEATS) -> Json:
    """Per distinct site shape: decoder and encoder seconds (median of `repeats`), one BLAS thread."""
    from bbformat.codec import rotation as rot

    dec, enc = _floor_keys(sites)
    arrays = _Arrays(sites)
    with rot.one_blas_thread():
        for k in dec:
            mu = arrays.get([k["dim"]]).copy()
            runs = [decode_site_times(arrays.get(k["anchor"][0]), k["anchor"][1], mu, k["paper"]) for _ in range(repeats)]
            k.update(parts=_median_parts(runs), site_s=statistics.median(sum(r.values()) for r in runs))
        for k in enc:
            mu, x = arrays.get([k["dim"]]).copy(), arrays.sym(k["dim"])
            tensors = [(arrays.get(shape), ax) for shape, ax in k["touched"]]
            runs = [encode_site_times(tensors, x, mu) for _ in range(repeats)]
            k.update(parts=_median_parts(runs), site_s=statistics.median(sum(r.values()) for r in runs),
                     canonical_s=statistics.median(r["canonical_gram"] + r["canonical_eigh"] for r in runs))
    return {"sites": [{"chunk": s["chunk"], "dkey": s["dkey"], "ekey": s["ekey"]} for s in sites], "decode_shapes": dec,
            "encode_shapes": enc, "repeats": repeats}


def _task_floor(args: list[str]) -> Json:
    t = time.perf_counter()
    res = measure_floor_shapes(read_sites(Path(args[0])), int(args[1]) if len(args) > 1 else FLOOR_REPEATS)
    res["wall_s"] = time.perf_counter() - t
    return res


CHILD_TASKS: dict[str, Callable[[list[str]], Json]] = {
    "cli": _task_cli, "load_model": _task_load_model, "st_load": _task_st_load, "compress": _task_compress,
    "decompress": _task_decompress, "floor": _task_floor,
}


def child_main(argv: list[str]) -> int:
    """Entry of a child: TASK RESULT.json ARGS...; writes the task's result with this process's VmHWM."""
    kind, out, args = argv[0], Path(argv[1]), argv[2:]
    t = time.perf_counter()
    res = CHILD_TASKS[kind](args)
    res.setdefault("wall_s", time.perf_counter() - t)
    res["peak_rss_bytes"] = vm_hwm()
    out.write_text(json.dumps(res))
    return int(res.get("rc", 0) or 0)


# ====================================================================== parent side


@dataclass
class Ctx:
    work: Path
    repeats: int = 1
    quick: bool = False
    keep: bool = False
    skip_generate: bool = False
    pt_pack: str = "first"
    entropy: str = "none"
    rss_limit: int = 20 * GIB
    timeout: float | None = None
    decode_workers: int = 2
    pack_threads: int = 2
    unpack_workers_option: bool = False
    verify_command: bool = False
    verify_workers: tuple[int, ...] = (1, 2)
    floor_repeats: int = FLOOR_REPEATS
    logs: Path = field(default_factory=Path)


def _rss_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(TOOLS)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("HF_HUB_OFFLINE", "1")
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # nothing written into the repository
    return env


CHILD_BOOT = "import sys, bench_scale; raise SystemExit(bench_scale.child_main(sys.argv[1:]))"


def _watch(p: "subprocess.Popen[bytes]", ctx: Ctx) -> tuple[int, str | None]:
    """Wait for the child, polling its RSS; kill it (by its pid) past --rss-limit or --timeout."""
    t0, peak = time.perf_counter(), 0
    while True:
        try:
            p.wait(timeout=0.1)
            return peak, None
        except subprocess.TimeoutExpired:
            pass
        peak = max(peak, _rss_of(p.pid))
        why = (f"killed: RSS {peak / GIB:.2f} GiB over --rss-limit {ctx.rss_limit / GIB:.2f} GiB" if peak > ctx.rss_limit else
               f"killed: over --timeout {ctx.timeout:.0f} s" if ctx.timeout and time.perf_counter() - t0 > ctx.timeout else None)
        if why:
            p.kill()
            p.wait()
            return peak, why


def _tail(path: Path, n: int = 15) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-n:]
    except OSError:
        return []


def run_child(ctx: Ctx, kind: str, args: list[str], slug: str) -> Json:
    """One fresh process: {"ok", "wall_s", "peak_rss_bytes", "process_s", "error", ...task result}."""
    out, err = ctx.logs / f"{slug}.json", ctx.logs / f"{slug}.log"
    out.unlink(missing_ok=True)
    t = time.perf_counter()
    with open(err, "wb") as errf:
        p = subprocess.Popen([sys.executable, "-c", CHILD_BOOT, kind, str(out), *args], stdout=errf, stderr=errf,
                             env=_child_env(), cwd=str(ctx.work))
        polled, killed = _watch(p, ctx)
    res: Json = {"process_s": time.perf_counter() - t, "rc": p.returncode}
    if out.is_file():
        res.update(json.loads(out.read_text()))
    res["ok"] = killed is None and p.returncode == 0 and out.is_file()
    if not res["ok"]:
        tail = _tail(err)
        last = next((x for x in reversed(tail) if x.strip()), "no output")
        res["error"] = killed or f"exit {p.returncode}: {last.strip()[:240]}"
        res.setdefault("peak_rss_bytes", polled or None)
        log(f"{slug} FAILED ({res['error']}); last lines of {err}:\n    " + "\n    ".join(tail))
    return res


def measure(ctx: Ctx, kind: str, args: list[str], slug: str, before: Callable[[], None] = lambda: None,
            after: Callable[[], None] = lambda: None) -> Json:
    """--repeats fresh runs: median wall time, largest VmHWM; stops at the first failure."""
    runs = []
    for i in range(ctx.repeats):
        before()
        r = run_child(ctx, kind, args, f"{slug}.{i}")
        after()
        runs.append(r)
        if not r["ok"]:
            break
    ok = all(r["ok"] for r in runs)
    res: Json = {k: v for k, v in runs[-1].items() if k not in ("wall_s", "peak_rss_bytes", "process_s")}
    res.update(ok=ok, runs=[{k: r.get(k) for k in ("wall_s", "peak_rss_bytes", "process_s", "ok")} for r in runs])
    res["wall_s"] = statistics.median(r["wall_s"] for r in runs) if ok else None
    res["peak_rss_bytes"] = max((r.get("peak_rss_bytes") or 0 for r in runs), default=0) or None
    return res


def rm(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


# ---------------------------------------------------------------- checkpoint generation


def generator_cmd(model: str, layers: int, out: Path, quick: bool, formats: str) -> list[str]:
    """tools/make_large.py writing the checkpoint into OUT (its tiny presets with --quick)."""
    preset = TINY_PRESETS[model] if quick else model
    return [sys.executable, str(TOOLS / "make_large.py"), str(out), "--preset", preset, "--layers", str(layers), "--format", formats,
            "--sparsity", str(SPARSITY), "--key-order", "tc"]


def split_formats(gen: Path, st: Path, pt: Path) -> None:
    """Hard-link the .safetensors (st/) and the .pt (pt/) each with every side file, then drop gen/."""
    files = [p for p in gen.iterdir() if p.is_file()]
    weights = {p.suffix: p for p in files if p.suffix in (".safetensors", ".pt")}
    sides = [p for p in files if p.suffix not in (".safetensors", ".pt")]
    for suffix, d in ((".safetensors", st), (".pt", pt)):
        if suffix not in weights:
            continue
        rm(d)
        d.mkdir(parents=True)
        for p in sides + [weights[suffix]]:
            try:
                os.link(p, d / p.name)
            except OSError:
                shutil.copy2(p, d / p.name)
    rm(gen)


def generate(ctx: Ctx, model: str, layers: int, mdir: Path, with_pt: bool) -> tuple[str, float | None]:
    """Write DIR/<model>/st (and pt); returns the generator's command line and its seconds."""
    gen = mdir / "gen"
    rm(gen)
    cmd = generator_cmd(model, layers, gen, ctx.quick, "both" if with_pt else "safetensors")
    shown = shlex.join(["python", os.path.relpath(cmd[1], ROOT), *cmd[2:]])
    log(f"{model}: {shown}")
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=_child_env())
    if r.returncode != 0:
        raise RuntimeError(f"generator failed (exit {r.returncode}): " + " | ".join(r.stderr.strip().splitlines()[-3:]))
    split_formats(gen, mdir / "st", mdir / "pt")
    return shown, time.perf_counter() - t


def weights_file(d: Path, suffix: str) -> Path | None:
    found = sorted(d.glob(f"*{suffix}")) if d.is_dir() else []
    return found[0] if found else None


def model_shape(st: Path) -> Json:
    """Layers, hidden → d, FFN, vocab, heads, dtypes of the checkpoint in st/."""
    cfg = json.loads((st / "config.json").read_text())
    w = weights_file(st, ".safetensors")
    sc = json.loads((st / f"{w.stem}.json").read_text()) if w else {}
    emb = (sc.get("embedding_dimensions") or {}).get("0")
    _, entries = st_entries(w) if w else (0, [])
    return {"architecture": cfg.get("model_type"), "layers": cfg.get("num_hidden_layers"), "hidden": cfg.get("hidden_size"),
            "d": sc.get("const_dimension") or emb, "ffn": cfg.get("intermediate_size") or cfg.get("ffn_dim"),
            "vocab": cfg.get("vocab_size"), "heads": cfg.get("num_attention_heads"),
            "dtypes": sorted({e["dtype"] for e in entries}), "tensors": len(entries),
            "plain_bytes": sum(e["end"] - e["begin"] for e in entries)}


# ---------------------------------------------------------------- one model


def _op(key: str, label: str, floor: str | None, workers: int | None, res: Json, cmd: str) -> Json:
    return {"key": key, "label": label, "floor": floor, "workers": workers, "command": cmd, **res}


def cli_op(ctx: Ctx, model: str, key: str, label: str, argv: list[str], floor: str | None, workers: int | None,
           before: Callable[[], None] = lambda: None, after: Callable[[], None] = lambda: None) -> Json:
    log(f"{model}: bbformat {' '.join(argv)}")
    res = measure(ctx, "cli", argv, f"{model}.{key}", before, after)
    return _op(key, label, floor, workers, res, "bbformat " + " ".join(argv))


def entropy_args(ctx: Ctx) -> list[str]:
    """pack's --entropy, where the run asks for one (--entropy auto: format 1.3's codecs on random weights)."""
    return [] if ctx.entropy == "none" else ["--entropy", ctx.entropy]


def pack_ops(ctx: Ctx, model: str, mdir: Path, out: Path, with_pt: bool, sizes: Json) -> list[Json]:
    """pack from .pt first (then its output and the .pt go), then from .safetensors (kept)."""
    ops = []  # the .pt row is measured first (disk: its output and the .pt go before the main pack), listed second
    if with_pt:
        out_pt = mdir / "from_pt.bb"
        op = cli_op(ctx, model, "pack_pt", "pack (from .pt)", ["pack", str(mdir / "pt"), str(out_pt), "--quiet", *entropy_args(ctx)], "pack", None,
                    before=lambda: rm(out_pt))
        sizes["container_from_pt_bytes"] = out_pt.stat().st_size if out_pt.is_file() else None
        ops.append(op)
        rm(out_pt)
    if not ctx.keep:
        rm(mdir / "pt")
    ops.insert(0, cli_op(ctx, model, "pack", "pack (from .safetensors)", ["pack", str(mdir / "st"), str(out), "--quiet", *entropy_args(ctx)], "pack",
                         None, before=lambda: rm(out)))
    sizes["container_bytes"] = out.stat().st_size if out.is_file() else None
    return ops


def decode_ops(ctx: Ctx, model: str, mdir: Path, out: Path) -> list[Json]:
    """verify with 1 and 2 workers, unpack to .pt and to .safetensors (outputs deleted after each run)."""
    dst = mdir / "unpacked"
    clean = lambda: rm(dst)  # noqa: E731
    ops = [cli_op(ctx, model, f"verify_w{w}", f"verify --workers {w}", ["verify", str(out), "--workers", str(w)], "decode", w)
           for w in ctx.verify_workers]
    for fmt in ("pt", "safetensors"):
        ops.append(cli_op(ctx, model, f"unpack_{fmt}", f"unpack --format {fmt}", ["unpack", str(out), str(dst), "--format", fmt, "--quiet"],
                          "decode", ctx.decode_workers, before=clean, after=clean))
    log(f"{model}: load_model")
    res = measure(ctx, "load_model", [str(out)], f"{model}.load_model")
    ops.append(_op("load_model", "load_model (load timed; then a forward pass on 8 tokens)", "decode", ctx.decode_workers, res,
                   f"bbformat.load_model({out.name!r})"))
    return ops


def plain_loaders(ctx: Ctx, model: str, mdir: Path, st_file: Path) -> list[Json]:
    """safetensors load_file, and ZipNN / byte-grouped zstd-3 decompression of the same tensors."""
    threads = os.cpu_count() or 1
    log(f"{model}: plain loaders")
    rows = [{"key": "safetensors", "label": "safetensors.torch.load_file (every page touched)", "bytes": st_file.stat().st_size,
             **measure(ctx, "st_load", [str(st_file)], f"{model}.st_load")}]
    store = mdir / "compressed"
    comp = run_child(ctx, "compress", [str(st_file), str(store), str(threads)], f"{model}.compress")
    names = {"zipnn": f"ZipNN {comp.get('zipnn_version', '')} decompress, {threads} threads".replace("  ", " "),
             "zstd": "zstd-3 decompress, byte-grouped, 1 thread"}
    for codec, label in names.items():
        c = comp.get(codec) or {"ok": False, "error": comp.get("error", "compression failed")}
        row: Json = {"key": codec, "label": label, "bytes": c.get("bytes"), "compress_s": c.get("compress_s")}
        if c.get("ok"):
            row.update(measure(ctx, "decompress", [codec, str(store), str(threads)], f"{model}.{codec}"))
        else:
            row.update(ok=False, error=c.get("error"), wall_s=None, peak_rss_bytes=None)
        rows.append(row)
    rm(store)
    return rows


def prepare(ctx: Ctx, model: str, layers: int, mdir: Path, with_pt: bool) -> tuple[str, float | None]:
    if ctx.skip_generate:
        if not (mdir / "st").is_dir() or (with_pt and not (mdir / "pt").is_dir()):
            raise FileNotFoundError(f"--skip-generate: {mdir}/st{' and pt' if with_pt else ''} missing (run once with --keep)")
        return "(reused with --skip-generate)", None
    return generate(ctx, model, layers, mdir, with_pt)


def bench_model(ctx: Ctx, model: str, layers: int, with_pt: bool) -> Json:
    mdir = ctx.work / model
    mdir.mkdir(parents=True, exist_ok=True)
    res: Json = {"name": model, "layers": layers, "ok": True, "ops": [], "plain_loaders": [], "floors": None,
                 "unpack_workers_option": ctx.unpack_workers_option, "entropy": ctx.entropy}
    t = time.perf_counter()
    try:
        res["generator"], res["generate_s"] = prepare(ctx, model, layers, mdir, with_pt)
        st_file = weights_file(mdir / "st", ".safetensors")
        pt_file = weights_file(mdir / "pt", ".pt")
        if st_file is None:
            raise FileNotFoundError(f"no .safetensors in {mdir / 'st'}")
        res["shape"] = model_shape(mdir / "st")
        res["sizes"] = {"plain_bytes": res["shape"]["plain_bytes"], "safetensors_bytes": st_file.stat().st_size,
                        "pt_bytes": pt_file.stat().st_size if pt_file else None}
        out = mdir / "model.bb"
        res["ops"] = pack_ops(ctx, model, mdir, out, with_pt and pt_file is not None, res["sizes"])
        if out.is_file():
            res["ops"] += decode_ops(ctx, model, mdir, out)
            log(f"{model}: floors (codec primitives on each distinct site shape)")
            fl = run_child(ctx, "floor", [str(out), str(ctx.floor_repeats)], f"{model}.floor")
            res["floors"] = fl if fl["ok"] else {"ok": False, "error": fl.get("error")}
        res["plain_loaders"] = plain_loaders(ctx, model, mdir, st_file)
    except Exception as exc:  # the model's failure is a row of the report, not the end of the run
        res.update(ok=False, error=f"{type(exc).__name__}: {exc}")
        log(f"{model} FAILED: {res['error']}")
    finally:
        if not ctx.keep:
            for name in ("st", "pt", "gen", "model.bb", "unpacked", "compressed", "from_pt.bb"):
                rm(mdir / name)
    res["elapsed_min"] = (time.perf_counter() - t) / 60
    summarise_model(ctx, res)
    return res


# ---------------------------------------------------------------- floors, projection, goals (pure)


def floor_summary(fl: Json, pack_threads: int) -> Json:
    """Totals from the per-shape site times: decoder floor with N workers = max(sum / N, largest
    chunk); pack floor on T threads = max(sum / T, chain), the chain being everything but the
    canonical directions (which pack computes ahead on another thread)."""
    dec = {k["i"]: k["site_s"] for k in fl["decode_shapes"]}
    enc = {k["i"]: k for k in fl["encode_shapes"]}
    chunks: dict[int, float] = {}
    for s in fl["sites"]:
        chunks[s["chunk"]] = chunks.get(s["chunk"], 0.0) + dec[s["dkey"]]
    d_sum = sum(chunks.values())
    e_sum = sum(enc[s["ekey"]]["site_s"] for s in fl["sites"])
    chain = e_sum - sum(enc[s["ekey"]]["canonical_s"] for s in fl["sites"])
    largest = max(chunks.values(), default=0.0)
    return {"sites": len(fl["sites"]), "decode_sum_s": d_sum, "largest_chunk_s": largest, "encode_sum_s": e_sum, "encode_chain_s": chain,
            "pack_threads": pack_threads, "pack_floor_s": max(e_sum / pack_threads, chain),
            "projection": [{"n": n, "decode_s": max(d_sum / n, largest), "pack_s": max(e_sum / n, chain)} for n in PROJECT_N]}


def decode_floor(summary: Json, workers: int) -> float:
    """The decoder's floor with WORKERS threads: blocks decode in parallel, one chunk per worker."""
    return max(float(summary["decode_sum_s"]) / max(workers, 1), float(summary["largest_chunk_s"]))


def summarise_model(ctx: Ctx, res: Json) -> None:
    """Attach each op's floor and ratio, and the model's goals."""
    fl = res.get("floors") or {}
    summary = floor_summary(fl, ctx.pack_threads) if fl.get("ok") and fl.get("sites") else None
    res["floor_summary"] = summary
    for op in res["ops"]:
        floor = None
        if summary and op["floor"] == "decode":
            floor = decode_floor(summary, op["workers"] or 1)
        elif summary and op["floor"] == "pack":
            floor = summary["pack_floor_s"]
        op["floor_s"] = floor
        op["vs_floor"] = op["wall_s"] / floor if floor and op.get("wall_s") else None
    res["goals"] = model_goals(res)


def _missed_by(value: float, limit: float, unit: str) -> str:
    """How far over its limit a result is, in digits that do not round a near miss to zero."""
    over, pct = value - limit, 100 * (value - limit) / limit
    return (f"missed by {over:.2f}{unit} " if over >= 0.01 else f"missed by {over:.2g}{unit} ") + \
        (f"({pct:.0f}% over)" if pct >= 1 else f"({pct:.1f}% over)")


def _goal(model: str, goal: str, value: float | None, limit: float, unit: str, err: str | None = None) -> Json:
    met = value is not None and value <= limit
    if value is None:
        text = f"not measured ({_failed({'error': err})[8:]})"
    elif met:
        text = "met"
    else:
        text = _missed_by(value, limit, unit)
    return {"model": model, "goal": goal, "value": value, "limit": limit, "unit": unit, "met": met, "text": text}


def model_goals(res: Json) -> list[Json]:
    out = []
    for op in res["ops"]:
        kind = op["key"].split("_")[0]
        if kind not in ("pack", "unpack", "verify"):
            continue
        rss = op["peak_rss_bytes"] / GIB if op.get("ok") and op.get("peak_rss_bytes") else None
        out.append(_goal(res["name"], f"{op['label']}: peak RSS ≤ {RSS_GOAL_GIB:g} GiB", rss, RSS_GOAL_GIB, " GiB", op.get("error")))
        if kind in ("pack", "unpack") and "--workers" not in op["label"]:
            limit = PACK_GOAL if kind == "pack" else UNPACK_GOAL
            err = op.get("error") or (None if op.get("vs_floor") else "no floor")
            out.append(_goal(res["name"], f"{op['label']}: ≤ {limit}× its floor", op.get("vs_floor"), limit, "×", err))
    return out


# ---------------------------------------------------------------- report


def _s(x: float | None) -> str:
    return "n/a" if x is None else _sec(x)


def _sec(x: float) -> str:
    """Seconds with the digits that matter: tiny floors (--quick) keep theirs."""
    return f"{x:.2f}" if x >= 0.995 else f"{x:.3g}"


def _b(n: int | None) -> str:
    return "n/a" if n is None else f"{n:,}"


def _gib(b: int | None) -> str:
    return "n/a" if not b else f"{b / GIB:.2f}"


def _pct(a: int | None, b: int | None) -> str:
    return "n/a" if not a or not b else f"{100 * a / b:.2f}%"


def _shape_line(m: Json) -> str:
    s = m.get("shape") or {}
    return (f"### {m['name']}: {s.get('layers')} layers, hidden {s.get('hidden')} → d {s.get('d')}, FFN {s.get('ffn')}, "
            f"vocab {s.get('vocab')}, {s.get('heads')} heads, {', '.join(s.get('dtypes') or ['?'])}"
            + (f"; pack --entropy {m['entropy']} (random weights: not a trained model's exponents)"
               if m.get("entropy", "none") != "none" else ""))


def _sizes_line(m: Json) -> str:
    z = m.get("sizes") or {}
    plain, st, bb = z.get("plain_bytes"), z.get("safetensors_bytes"), z.get("container_bytes")
    line = (f"Checkpoint: {z.get('plain_bytes') or 0:,} B of tensors ({(m.get('shape') or {}).get('tensors')} tensors), "
            f".safetensors file {st or 0:,} B" + (f", .pt file {z['pt_bytes']:,} B" if z.get("pt_bytes") else "") + ". ")
    if bb:
        line += f"Container {bb:,} B = {_pct(bb, plain)} of the plain tensor bytes, {_pct(bb, st)} of the .safetensors file"
        fp = z.get("container_from_pt_bytes")
        line += (f"; packed from the .pt: {fp:,} B ({'same size' if fp == bb else 'DIFFERENT size'})." if fp else ".")
    return line


def _vs_floor(op: Json) -> str:
    if not op.get("vs_floor"):
        return "n/a"
    who = f", {op['workers']} worker{'s' if op['workers'] != 1 else ''}" if op["floor"] == "decode" else ""
    return f"{op['vs_floor']:.2f}× ({op['floor']} floor {_sec(op['floor_s'])} s{who})"


def _failed(r: Json) -> str:
    err = str(r.get("error") or "failed").replace("|", "/")
    return "FAILED: " + (err if len(err) <= 140 else err[:137] + "...")


def _op_cell(op: Json) -> tuple[str, str, str]:
    if not op.get("ok"):
        return _failed(op), _gib(op.get("peak_rss_bytes")), ""
    return _s(op.get("wall_s")), _gib(op.get("peak_rss_bytes")), _vs_floor(op)


def ops_table(m: Json) -> list[str]:
    L = ["| operation | wall s | peak RSS GiB | vs floor |", "|---|---|---|---|"]
    for op in m["ops"]:
        wall, rss, vs = _op_cell(op)
        label = op["label"]
        if op["key"] == "load_model" and op.get("ok"):
            label += (f": forward ran, logits {op.get('logits_shape')}, {op.get('dtype')}" if op.get("forward_ok")
                      else f": forward FAILED ({op.get('forward_error')})")
        L.append(f"| {label} | {wall} | {rss} | {vs} |")
    return L


def floor_lines(m: Json) -> list[str]:
    fl, su = m.get("floors") or {}, m.get("floor_summary")
    if not su:
        return [f"Floors: not measured ({fl.get('error') or 'no container'})."]
    L = [f"Floors from the codec's primitives (`bbformat.codec.rotation`) on random float64 matrices of each site's exact shapes, "
         f"one BLAS thread: one representative site per distinct shape timed (median of {fl['repeats']}), multiplied by the "
         f"number of such sites ({su['sites']} non-plain sites); computed, not a run of the whole model.", "",
         "| floor | site shape | sites | s per site | s in all |", "|---|---|---|---|---|"]
    for k in fl["decode_shapes"]:
        shape = f"D {k['dim']}, anchor {'×'.join(map(str, k['anchor'][0]))} axis {k['anchor'][1]}"
        L.append(f"| decoder: Gram + eigh + rebuild E·diag(μ)·Eᵀ{' + M·E' if k['paper'] else ''} | {shape} | {k['count']} | "
                 f"{_sec(k['site_s'])} | {_sec(k['site_s'] * k['count'])} |")
    for k in fl["encode_shapes"]:
        t = "; ".join(f"{'×'.join(map(str, s))}/{a}" for s, a in k["touched"])
        L.append(f"| encoder: 2 Grams + 4 eigh + U0·Vᵀ + {len(k['touched'])} rotations + 2 rebuilds (band) | D {k['dim']}; rotated "
                 f"(shape/axis) {t} | {k['count']} | {_sec(k['site_s'])} | {_sec(k['site_s'] * k['count'])} |")
    L += ["", f"Decoder floor: {_sec(su['decode_sum_s'])} s on 1 worker (largest chunk {_sec(su['largest_chunk_s'])} s). "
          f"Pack floor: {_sec(su['encode_sum_s'])} s on one thread; {_sec(su['pack_floor_s'])} s on pack's {su['pack_threads']} threads "
          f"(= max(sum / {su['pack_threads']}, the chain's {_sec(su['encode_chain_s'])} s): the canonical directions are computed off "
          "the chain)."]
    return L


def loaders_table(m: Json) -> list[str]:
    plain = (m.get("sizes") or {}).get("plain_bytes")
    L = ["| loader (same checkpoint) | stored B | % of plain | compress s | wall s | peak RSS GiB |", "|---|---|---|---|---|---|"]
    by = {op["key"]: op for op in m["ops"]}
    bb = (m.get("sizes") or {}).get("container_bytes")
    for key in ("verify_w2", "unpack_safetensors", "load_model"):
        op = by.get(key)
        if op:
            wall, rss, _ = _op_cell(op)
            L.append(f"| bbformat: {op['label'].split(' (')[0]} | {bb or 0:,} | {_pct(bb, plain)} | | {wall} | {rss} |")
    for r in m.get("plain_loaders", []):
        if r.get("ok"):
            L.append(f"| {r['label']} | {r['bytes']:,} | {_pct(r['bytes'], plain)} | {_s(r.get('compress_s'))} | "
                     f"{_s(r['wall_s'])} | {_gib(r['peak_rss_bytes'])} |")
        else:
            L.append(f"| {r['label']} | {_b(r.get('bytes'))} | | {_s(r.get('compress_s'))} | {_failed(r)} | |")
    return L


def workers_table(m: Json) -> list[str]:
    by = {op["key"]: op for op in m["ops"]}
    L = ["| operation | 1 worker s | 2 workers s | speed-up | decoder floor 1 / 2 workers s |", "|---|---|---|---|---|"]
    su = m.get("floor_summary")
    fl = f"{_sec(decode_floor(su, 1))} / {_sec(decode_floor(su, 2))}" if su else "n/a"
    for name, k1, k2 in (("verify", "verify_w1", "verify_w2"),):
        a, b = by.get(k1), by.get(k2)
        if not a or not b:
            L.append(f"| {name} | {'not run (--verify-workers)' if not a else ''} | {'not run' if not b else ''} | | {fl} |")
            continue
        up = f"{a['wall_s'] / b['wall_s']:.2f}×" if a.get("wall_s") and b.get("wall_s") else "n/a"
        L.append(f"| {name} | {_op_cell(a)[0]} | {_op_cell(b)[0]} | {up} | {fl} |")
    return L


def projection_table(m: Json) -> list[str]:
    su = m.get("floor_summary")
    if not su:
        return []
    L = ["| cores N | decoder floor s (projection, not measured) | pack floor s (projection, not measured) |", "|---|---|---|"]
    L += [f"| {p['n']} | {_sec(p['decode_s'])} | {_sec(p['pack_s'])} |" for p in su["projection"]]
    return L + ["", "Decode is parallel per chunk: max(sum / N, largest chunk). Pack: max(sum / N, the chain of sites)."]


def model_section(m: Json) -> list[str]:
    L = [_shape_line(m), ""]
    if m.get("generator"):
        took = f" in {m['generate_s']:.0f} s" if m.get("generate_s") is not None else ""
        L += [f"Checkpoint generated by `{m['generator']}`{took}.", ""]
    if not m.get("ok"):
        L += [f"**FAILED**: {m.get('error')}", ""]
    if m.get("sizes"):
        L += [_sizes_line(m), ""]
    if m["ops"]:
        L += ops_table(m) + [""]
    L += floor_lines(m) + [""]
    if m["plain_loaders"]:
        L += ["Plain loaders, side by side in the same run (fresh processes; ZipNN and zstd compressed and decompressed "
              "tensor by tensor, so their memory stays about one tensor):", ""] + loaders_table(m) + [""]
    if m["ops"]:
        L += ["Workers:", ""] + workers_table(m) + [""]
    proj = projection_table(m)
    return L + (["Projection to N cores from the measured per-site times (projection, not measured):", ""] + proj + [""] if proj else [])


def goals_table(res: Json) -> list[str]:
    goals = [g for m in res["models"] for g in m.get("goals", [])]
    L = ["### Goals", "", "| model | goal | result | met |", "|---|---|---|---|"]
    for g in goals:
        val = "n/a" if g["value"] is None else f"{g['value']:.3f}{g['unit']}" if not g["met"] else f"{g['value']:.2f}{g['unit']}"
        text = "met" if g["met"] else g["text"] if g["value"] is None else _missed_by(g["value"], g["limit"], g["unit"])
        L.append(f"| {g['model']} | {g['goal']} | {val} | {text} |")
    missed = sum(not g["met"] for g in goals)
    return L + ["", f"{len(goals) - missed} of {len(goals)} goals met." if goals else "No goal could be checked.", ""]


def commands_line(res: Json) -> str:
    runs = res.get("runs") or [res]
    text = "; ".join(f"`python tools/bench_scale.py {shlex.join(r['argv'])}` ({r['date']}, {r['elapsed_min']:.0f} min)" for r in runs)
    return ("Command: " if len(runs) == 1 else "Commands, run one after the other on this machine: ") + text + "."


def merge_results(parts: list[Json]) -> Json:
    """Several runs (e.g. one model each) as one result: their models and goals in order, each
    run's command kept; the machine must be the same."""
    # the same words in any order: threadpoolctl lists the libraries in no fixed order
    machines = {tuple(sorted(re.findall(r"[\w.+-]+", p["machine"]))) for p in parts}
    if len(machines) != 1:
        raise ValueError(f"runs from different machines cannot be merged: {sorted(machines)}")
    out = dict(parts[0])
    out["runs"] = [{"argv": p["argv"], "date": p["date"], "elapsed_min": p["elapsed_min"]} for p in parts]
    out["models"] = [m for p in parts for m in p["models"]]
    out["goals"] = [g for p in parts for g in p.get("goals", [])]
    out["elapsed_min"] = sum(p["elapsed_min"] for p in parts)
    return out


def render_section(res: Json) -> str:
    L = [SECTION, "", f"Machine: {res['machine']}.", "",
         commands_line(res) + " "
         f"Each command ran {res['repeats']} time(s), each in a fresh process: wall s is the median, measured inside the process "
         "around the call (the command's `main(argv)`, or `load_model` alone; Python's start and imports excluded); peak RSS is "
         "the process's VmHWM (the largest over the runs). Checkpoints are synthetic (`tools/make_large.py`: random weights "
         "at the models' shapes, sliced at sparsity " + str(res.get("sparsity", SPARSITY)) + ")" + (" — **--quick: tiny shapes, not the paper's**" if res.get("quick") else "") + ".", ""]
    for m in res["models"]:
        L += model_section(m)
    L += goals_table(res)
    if res.get("notes"):
        L += ["", *res["notes"]]
    return "\n".join(L).rstrip() + "\n"


def write_report(path: Path, res: Json) -> None:
    from mdsection import write_section  # tools/ is on sys.path when this runs as a script

    write_section(path, render_section(res), SECTION)


# ---------------------------------------------------------------- main


def machine() -> str:
    """The machine, in the style of tools/bench.py."""
    import platform

    sys.path.insert(0, str(TOOLS))
    from machine import cpu_and_memory, python_and_numpy

    try:
        from threadpoolctl import threadpool_info

        blas = ", ".join(sorted(f"{i.get('internal_api')} {i.get('version')} ({i.get('architecture')}, {i.get('num_threads')} threads)"
                                for i in threadpool_info()))
    except Exception:
        blas = "n/a"
    import torch

    import bbformat

    return (f"{cpu_and_memory()}, {platform.system()} {platform.release()}; {python_and_numpy()} (BLAS: {blas}), "
            f"torch {torch.__version__}, bbformat {bbformat.__version__}")


def cli_has(argv: list[str], needle: str | None = None) -> bool:
    """Whether `bbformat ARGV --help` succeeds (and shows NEEDLE): bbformat's own parser."""
    import contextlib
    import io

    from bbformat.cli import build_parser

    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
            build_parser().parse_args([*argv, "--help"])
    except SystemExit as exc:
        return exc.code == 0 and (needle is None or needle in buf.getvalue())
    return False


def parse_layers(text: str | None, models: list[str], quick: bool) -> dict[str, int]:
    layers = {m: QUICK_LAYERS if quick else DEFAULT_LAYERS.get(m, 8) for m in models}
    for part in filter(None, (text or "").split(",")):
        name, _, n = part.partition("=")
        if name.strip() not in layers or not n.strip().isdigit() or int(n) < 1:
            raise ValueError(f"--layers: {part!r} is not MODEL=N for a model in --models")
        layers[name.strip()] = int(n)
    return layers


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, help="scratch directory for checkpoints, containers and logs (required unless --from-json)")
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from {', '.join(MODELS)}")
    ap.add_argument("--layers", default=None, help="MODEL=N,... (default llama-2-7b=32,opt-13b=8; --quick: 2)")
    ap.add_argument("--repeats", type=int, default=1, help="fresh runs per command (median time, largest peak RSS)")
    ap.add_argument("--json", type=Path, default=None, help="results (default tools/bench_scale_results.json; none with --quick)")
    ap.add_argument("--report", type=Path, default=None, help="markdown file whose section 7 is written (default BENCHMARKS.md; none with --quick)")
    ap.add_argument("--skip-generate", action="store_true", help="reuse DIR/<model>/st and pt from a run with --keep")
    ap.add_argument("--keep", action="store_true", help="keep the checkpoints and containers")
    ap.add_argument("--quick", action="store_true", help="tiny shapes: the whole tool in about a minute")
    ap.add_argument("--pt-pack", choices=("first", "all", "none"), default="first", help="pack from .pt too: first model only (default), all, none")
    ap.add_argument("--entropy", choices=("none", "zstd", "planes", "exponent", "auto"), default="none",
                    help="pack --entropy (default none). The weights are random, not trained: their exponents are not a trained "
                         "model's, so the entropy stage's saving here says nothing about a real model's (BENCHMARKS.md 15)")
    ap.add_argument("--floor-repeats", type=int, default=FLOOR_REPEATS, metavar="N",
                    help=f"timings of each distinct site shape for the floors (median; default {FLOOR_REPEATS})")
    ap.add_argument("--verify-workers", default="1,2", metavar="N,...",
                    help="worker counts verify is measured with (default 1,2: the workers comparison)")
    ap.add_argument("--rss-limit", type=float, default=None, metavar="GIB", help="kill a child whose RSS passes this (default 80%% of RAM)")
    ap.add_argument("--timeout", type=float, default=None, metavar="S", help="kill a child that runs longer (default: none)")
    ap.add_argument("--notes", type=Path, default=None,
                    help="with --from-json: a markdown file whose lines end the section (what the numbers mean, why a goal is missed)")
    ap.add_argument("--from-json", type=Path, nargs="+", default=None,
                    help="rewrite the --report section from earlier --json files (several: merged in order), measuring nothing")
    return ap


def make_ctx(a: argparse.Namespace) -> Ctx:
    from bbformat.reader import DECODE_WORKERS

    phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    work = a.work.resolve()
    ctx = Ctx(work=work, repeats=a.repeats, quick=a.quick, keep=a.keep, skip_generate=a.skip_generate, pt_pack=a.pt_pack, entropy=a.entropy,
              rss_limit=int(a.rss_limit * GIB) if a.rss_limit else int(0.8 * phys), timeout=a.timeout,
              decode_workers=DECODE_WORKERS, pack_threads=min(2, os.cpu_count() or 1),
              unpack_workers_option=cli_has(["unpack"], "--workers"), verify_command=cli_has(["verify"]),
              verify_workers=tuple(int(x) for x in a.verify_workers.split(",") if x.strip()), floor_repeats=max(1, a.floor_repeats),
              logs=work / "logs")
    ctx.logs.mkdir(parents=True, exist_ok=True)
    return ctx


def run(a: argparse.Namespace, argv: list[str], models: list[str], layers: dict[str, int]) -> Json:
    ctx = make_ctx(a)
    if not ctx.verify_command:
        log("note: this bbformat has no `verify` command; its rows will say so")
    t0 = time.time()
    res: Json = {"tool": "bench_scale", "machine": machine(), "date": time.strftime("%Y-%m-%d"), "argv": argv, "repeats": a.repeats,
                 "quick": a.quick, "sparsity": SPARSITY, "work": str(ctx.work), "rss_limit_bytes": ctx.rss_limit, "decode_workers": ctx.decode_workers,
                 "cli": {"verify": ctx.verify_command, "unpack_workers": ctx.unpack_workers_option}, "models": []}
    for i, model in enumerate(models):
        with_pt = a.pt_pack == "all" or (a.pt_pack == "first" and i == 0)
        res["models"].append(bench_model(ctx, model, layers[model], with_pt))
    res["elapsed_min"] = (time.time() - t0) / 60
    res["goals"] = [g for m in res["models"] for g in m.get("goals", [])]
    return res


def main(argv: list[str] | None = None) -> int:
    sys.dont_write_bytecode = True  # nothing written into the repository (tools/__pycache__)
    argv = sys.argv[1:] if argv is None else argv
    ap = build_parser()
    a = ap.parse_args(argv)
    if a.from_json:
        res = merge_results([json.loads(p.read_text()) for p in a.from_json])
        if a.notes:
            res["notes"] = a.notes.read_text().rstrip("\n").splitlines()
        if a.json:
            a.json.write_text(json.dumps(res, indent=1))
        write_report(a.report or ROOT / "BENCHMARKS.md", res)
        return 0
    models = [m.strip() for m in a.models.split(",") if m.strip()]
    bad = [m for m in models if m not in MODELS]
    if a.work is None or bad or not models or a.repeats < 1:
        ap.error("--work DIR is required" if a.work is None else f"unknown model(s) {bad}; choose from {', '.join(MODELS)}" if bad
                 else "--models is empty" if not models else "--repeats must be at least 1")
    try:
        layers = parse_layers(a.layers, models, a.quick)
    except ValueError as exc:
        ap.error(str(exc))
    json_path = a.json or (None if a.quick else TOOLS / "bench_scale_results.json")
    report = a.report or (None if a.quick else ROOT / "BENCHMARKS.md")
    res = run(a, argv, models, layers)
    if json_path:
        json_path.write_text(json.dumps(res, indent=1))
        log(f"wrote {json_path}")
    if report:
        write_report(report, res)
        log(f"wrote section 7 of {report}")
    else:
        print(render_section(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

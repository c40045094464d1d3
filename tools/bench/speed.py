"""Section 5 (issue 6, part 2): on the containers of section 4, decode, unpack, load_model and pack
against the linear algebra they cannot avoid on the same thread budget, the linear algebra pack
itself spends (rotation.linalg_clock), and streaming peak memory."""
from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

import numpy as np

from .common import Json, Run, log, run_child, slice_dir, timed
from .entropy import SPARSITY, container_path


def site_dims(path: Path) -> list[int]:
    """D of every rotation site the container does not store plainly."""
    from bench_scale import read_sites

    return [s["dim"] for s in read_sites(path)]


def floor_work(dims: list[int], per_site: int, workers: int) -> None:
    """Wall time of the linear algebra alone: per site `per_site` symmetric eigendecompositions
    of a D x D Gram and one rebuild E diag(mu) E^T, in `workers` threads of one BLAS thread."""
    from concurrent.futures import ThreadPoolExecutor

    from bbformat.codec import rotation as rot

    rng = np.random.default_rng(0)
    grams = {dim: rot.gram(rng.normal(size=(dim + 8, dim))) for dim in set(dims)}

    def one(dim: int) -> None:
        g = grams[dim]
        for _ in range(per_site):
            mu, e = rot.eigh(g)
        _ = (e * mu) @ e.T

    with rot.one_blas_thread():
        if workers == 1:
            for dim in dims:
                one(dim)
        else:
            with ThreadPoolExecutor(workers) as ex:
                list(ex.map(one, dims))


class SecondsSum:
    """A rotation.linalg_clock record function: the seconds reported, summed over threads."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._lock = threading.Lock()

    def __call__(self, name: str, seconds: float) -> None:
        with self._lock:
            self.seconds += seconds


def pack_linalg_seconds(src: Path, out: Path, mode: str) -> float:
    """Seconds one pack spends inside the codec's linear algebra (gram, eigh, eigh_upper,
    rotate_axis, regenerate), summed over its threads, as rotation.linalg_clock reports them."""
    import bbformat
    from bbformat.codec import rotation as rot

    total = SecondsSum()
    with rot.linalg_clock(total):
        bbformat.pack(src, out, entropy=mode, overwrite=True)
    return total.seconds


def stream_peak(path: Path) -> Json:
    """child.py stream-peak, with glibc's mmap threshold fixed at 1 MiB (`growth`: live memory)
    and with its default, dynamic threshold (`growth_default_malloc`)."""
    res: Json = {}
    for key, extra in (("growth", {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}), ("growth_default_malloc", {})):
        env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
        got = json.loads(run_child("stream-peak", str(path.resolve()), env={**env, **extra}))
        res[key] = got.pop("growth")
        res.update(got)
    return res


def baseline_times(tree: Path, src: Path, work: Path, repeats: int) -> Json:
    """pack, unpack and load_model of another checkout (e.g. the previous commit), timed in a
    fresh process of this run (child.py baseline), on the same model and machine."""
    out = run_child("baseline", str(tree.resolve()), str(src.resolve()), str(work.resolve()), str(repeats))
    res: Json = json.loads(out.strip().splitlines()[-1])
    res["commit"] = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    return res


def measure_mode(run: Run, d: Path, mode: str) -> Json:
    import bbformat
    from bbformat.loader import load_model
    from bbformat.reader import DECODE_WORKERS

    path = container_path(run, mode)
    if not path.exists():
        bbformat.pack(d, path, entropy=mode)
    dims = site_dims(path)
    _, floor_dec = timed(lambda: floor_work(dims, 1, DECODE_WORKERS), run.repeats)
    _, floor_pack = timed(lambda: floor_work(dims, 3, 1), run.repeats)

    def decode_all() -> None:
        with bbformat.open_container(path) as r:
            for _ in r.iter_blocks("reverse", workers=DECODE_WORKERS):
                pass

    _, t_dec = timed(decode_all, run.repeats)
    _, t_unpack = timed(lambda: bbformat.unpack(path, run.work / f"speed_unpacked_{mode}", overwrite=True), run.repeats)
    _, t_load = timed(lambda: load_model(path), run.repeats)
    _, t_pack = timed(lambda: bbformat.pack(d, run.work / f"speed_{mode}.bb", entropy=mode, overwrite=True), run.repeats)
    linalg = pack_linalg_seconds(d, run.work / f"speed_{mode}.bb", mode)
    log(f"speed {mode}: floor {floor_dec:.2f}s decode {t_dec:.2f}s unpack {t_unpack:.2f}s load {t_load:.2f}s "
        f"pack {t_pack:.1f}s (floor {floor_pack:.2f}s)")
    return {"entropy": mode, "sites": len(dims), "dims": sorted(set(dims)), "workers": DECODE_WORKERS,
            "floor_decode_s": floor_dec, "floor_pack_s": floor_pack, "decode_s": t_dec, "unpack_s": t_unpack,
            "load_s": t_load, "pack_s": t_pack, "pack_linalg_s": linalg, **stream_peak(path)}


def measure(run: Run) -> Json:
    """Goal 2 of issue 6, on the real containers of section 4."""
    d = slice_dir(run, SPARSITY)
    res: Json = {"sparsity": SPARSITY, "rows": [measure_mode(run, d, mode) for mode in ("none", "auto")]}
    if run.baseline is not None:
        res["baseline"] = baseline_times(run.baseline, d, run.work, run.repeats)
        log(f"speed baseline {res['baseline']}")
    return res


# ---------------------------------------------------------------- report

INTRO = ("Floor = the linear algebra a decoder cannot avoid (one symmetric eigendecomposition of a D×D Gram and one rebuild "
         "E·diag(μ)·Eᵀ per rotation) run alone on the same thread budget as the decoder (the same worker pool, one BLAS "
         "thread per worker); for pack, three eigendecompositions and one rebuild per rotation on one thread (the encoder "
         "follows the chain of sites). *pack linalg s* = the seconds pack itself spends in eigendecompositions, Gram "
         "matrices, rotating the weights and rebuilding, summed over its threads (the floor leaves out the rotations and "
         "Grams, which no encoder can skip either). Streaming peak = growth of peak RSS while `iter_stream` decodes the file "
         "and keeps every tensor, in a fresh process, after warming up LAPACK and zstd on a 64×64 problem; measured with "
         "glibc's mmap threshold fixed at 1 MiB (`MALLOC_MMAP_THRESHOLD_=1048576`, so freed blocks go back to the OS and "
         "the figure is the decoder's live memory) and with the default, dynamic threshold (whose retained free memory "
         "moves the figure between runs with allocation history).")


def _mib(b: float) -> float:
    return b / 2**20


def _row_line(r: Json) -> str:
    la = f"{r['pack_linalg_s']:.1f}" if "pack_linalg_s" in r else ""
    dm = f" ({_mib(r['growth_default_malloc']):.0f})" if "growth_default_malloc" in r else ""
    return (f"| `--entropy {r['entropy']}` | {r['sites']} ({', '.join(map(str, r['dims']))}) | {r['workers']} | {r['floor_decode_s']:.2f} | "
            f"{r['decode_s']:.2f} | {r['unpack_s']:.2f} | {r['load_s']:.2f} | {r['unpack_s'] / r['floor_decode_s']:.1f} | "
            f"{r['load_s'] / r['floor_decode_s']:.1f} | {r['pack_s']:.1f} | {r['floor_pack_s']:.2f} | {r['pack_s'] / r['floor_pack_s']:.1f} | "
            f"{la} | {_mib(r['growth']):.0f}{dm} | {_mib(r['model'] + 2 * r['largest_block']):.0f} |")


def _baseline_lines(sp: Json) -> list[str]:
    b = sp.get("baseline")
    if not b:
        return []
    L = ["", f"Side by side in the same run: the checkout of commit `{b['commit']}` (bbformat {b['version']}), timed by a fresh "
         "process on the same model and machine (median of the same number of runs).", "",
         "| payload | pack s: then → now | unpack s: then → now | load_model s: then → now |", "|---|---|---|---|"]
    for r in sp["rows"]:
        t = b.get(r["entropy"])
        if t:
            L.append(f"| `--entropy {r['entropy']}` | {t['pack_s']:.1f} → {r['pack_s']:.1f} | {t['unpack_s']:.2f} → {r['unpack_s']:.2f} | "
                     f"{t['load_s']:.2f} → {r['load_s']:.2f} |")
    return L


def _where_time_goes(r0: Json) -> list[str]:
    if "pack_linalg_s" not in r0:
        return []
    return ["", f"Where the time goes (`--entropy {r0['entropy']}`). Decoding: the blocks decode on {r0['workers']} threads, "
            f"{r0['decode_s']:.2f} s against a floor of {r0['floor_decode_s']:.2f} s; the rest is each site's Gram matrix "
            "(a D×D product over the anchor's rows, which the floor leaves out), reading the file, the residual sections and "
            "the float conversions. unpack also writes the checkpoint with `torch.save` after the last block, which the `.pt` "
            "layout cannot overlap with decoding; load_model builds and fills the model while blocks decode. Encoding: pack's "
            f"own linear algebra takes {r0['pack_linalg_s']:.1f} s summed over its threads (timed inside each call, so it "
            f"includes waiting for a core), against the floor's {r0['floor_pack_s']:.2f} s: besides its three "
            "eigendecompositions per site it rotates every weight (about 3 GFLOP per layer and 33 GFLOP for the head) and forms "
            "the Gram matrices, which no encoder can skip. The rest of the chain is float16 ↔ float64 conversions, the stack's "
            "copies and the decoder's simulation (residuals); everything else (canonical directions, zstd of the side "
            "sections and metadata, the entropy stage) overlaps it on the second core."]


def report(res: Json) -> list[str]:
    sp = res["speed"]
    run = sp.get("run", {})
    L = ["## 5. Decode and encode against their linear algebra (issue 6, part 2): SmolLM2 s=%s" % sp["sparsity"], ""]
    if run:
        L += [f"Command: `python tools/bench.py {run['argv']}` ({run['date']}, {run['elapsed_min']:.0f} min) on {run['machine']}.", ""]
    L += [INTRO, "",
          "| payload | sites (D) | workers | floor s | decode s | unpack s | load_model s | unpack / floor | load_model / floor | "
          "pack s | pack floor s | pack / floor | pack linalg s | stream peak growth MiB (default malloc) | model + 2 blocks MiB |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    L += [_row_line(r) for r in sp["rows"]]
    return L + _baseline_lines(sp) + _where_time_goes(sp["rows"][0]) + [""]


def goals(res: Json) -> list[str]:
    out = []
    for r in res.get("speed", {}).get("rows", []):
        e = r["entropy"]
        for what, ratio, limit in (("unpack", r["unpack_s"] / r["floor_decode_s"], 1.3), ("load_model", r["load_s"] / r["floor_decode_s"], 1.3),
                                   ("pack", r["pack_s"] / r["floor_pack_s"], 1.5)):
            out.append(f"| s=0.25 `--entropy {e}`: {what} ≤ {limit}× its linear-algebra floor | {ratio:.1f}× | {'yes' if ratio <= limit else 'NO'} |")
        bound = r["model"] + 2 * r["largest_block"]
        peaks = [("", r["growth"])] if "growth_default_malloc" not in r else [
            (" (live memory: fixed mmap threshold)", r["growth"]), (" (glibc's default allocator)", r["growth_default_malloc"])]
        for how, g in peaks:
            out.append(f"| s=0.25 `--entropy {e}`: streaming peak{how} ≤ decoded model + 2 blocks | {_mib(g):.0f} MiB vs "
                       f"{_mib(bound):.0f} MiB | {'yes' if g <= bound else 'NO'} |")
    return out

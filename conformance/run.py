#!/usr/bin/env python3
"""Run the bbformat conformance suite against one or more decoder commands.

    python conformance/run.py                                   # the Python reader and tools/bbread-c/bbread
    python conformance/run.py --impl 'CMD {path} --out {out}'   # any decoder speaking the protocol
    python conformance/run.py --c-sanitize                      # tools/bbread-c/bbread-asan (ASan/UBSan build)

Options: --impl may be repeated; --filter SUBSTR keeps vectors whose id contains SUBSTR;
-j N runs N vectors at once; --timeout S (default 60) per vector; --manifest PATH.
{path} is replaced by the vector's absolute path, {out} (optional) by a fresh empty
directory for the tensors' raw bytes. The protocol and the tolerance rule are in
conformance/README.md. Only the standard library is needed.

Prints `PASS id` or `FAIL id: reason` per vector and ends with exactly `N passed, N failed`;
exits 1 if anything failed.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import os
import shlex
import signal
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
C_DIR = ROOT / "tools" / "bbread-c"
SANITIZER_MARKERS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:", "SUMMARY: UndefinedBehaviorSanitizer",
                     "SUMMARY: AddressSanitizer", "ERROR: MemorySanitizer", "WARNING: ThreadSanitizer")

# dtype -> (struct format of the raw element, fraction bits p, minimum normal exponent emin)
DTYPES = {"float16": (16, 10, -14), "bfloat16": (16, 7, -126), "float32": (32, 23, -126)}


# ---- values and the tolerance rule --------------------------------------------------------


def values(data: bytes, dtype: str) -> list[float]:
    """Raw little-endian bytes of a tensor -> Python floats (exact)."""
    if dtype == "float16":
        return [v for (v,) in struct.iter_unpack("<e", data)]
    if dtype == "float32":
        return [v for (v,) in struct.iter_unpack("<f", data)]
    if dtype == "bfloat16":
        return [struct.unpack("<f", struct.pack("<I", b << 16))[0] for (b,) in struct.iter_unpack("<H", data)]
    raise ValueError(f"unknown dtype {dtype!r}")


def ulp(x: float, dtype: str) -> float:
    """The spacing of `dtype` at |x|: 2^(max(e, emin) - p) with e = floor(log2 |x|)."""
    _, p, emin = DTYPES[dtype]
    if x == 0 or not math.isfinite(x):
        return math.ldexp(1.0, emin - p)
    e = math.frexp(abs(x))[1] - 1
    return math.ldexp(1.0, max(e, emin) - p)


def within(ref: bytes, got: bytes, dtype: str, tol: dict) -> str | None:
    """None if every value of `got` is within max(tol.abs, tol.ulp * ulp(ref)) of `ref`
    (NaN matches NaN, infinities must be equal); else a reason."""
    if len(ref) != len(got):
        return f"{len(got)} bytes, expected {len(ref)}"
    a, b = values(ref, dtype), values(got, dtype)
    worst = None
    for i, (r, g) in enumerate(zip(a, b)):
        if math.isnan(r) or math.isnan(g):
            ok = math.isnan(r) and math.isnan(g)
        elif math.isinf(r) or math.isinf(g):
            ok = r == g
        else:
            bound = max(float(tol.get("abs", 0.0)), float(tol.get("ulp", 0)) * ulp(r, dtype))
            ok = abs(g - r) <= bound
        if not ok and worst is None:
            worst = f"element {i}: {g!r}, reference {r!r}"
    return worst


# ---- one vector ------------------------------------------------------------------------------


def check(vec: dict, res: dict | None, base: Path = HERE) -> str | None:
    """Compare a decoder's protocol object with the manifest entry; None = pass, else the reason.
    Tensor "file" paths in `res` are read for tolerance comparisons."""
    if res is None:
        return "no result"
    kind = res.get("result")
    if kind not in ("accept", "reject"):
        return f"result is {kind!r}"
    expected = vec["expected"]
    optional = bool(vec.get("may_reject"))
    if kind == "reject":
        codes = [vec["code"], *vec.get("also_allowed", [])] if "code" in vec else []
        if expected == "accept" and not optional:
            return f"rejected a valid container with {res.get('code')}: {res.get('message', '')}"[:300]
        if res.get("code") not in codes:
            return f"code {res.get('code')}, expected {' or '.join(codes)}"
        return None
    if expected == "reject" and not optional:
        return f"accepted, expected reject with {vec['code']}"
    want = vec.get("tensors")
    if want is None:
        return "accepted, and the manifest lists no tensors for an accepting reader"
    got = res.get("tensors")
    if not isinstance(got, dict):
        return "no tensor map"
    if set(got) != set(want):
        missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
        return f"tensor set differs: missing {missing[:5]}, unexpected {extra[:5]}"
    for name in sorted(want):
        w, g = want[name], got[name]
        if g.get("dtype") != w["dtype"] or list(g.get("shape", [None])) != w["shape"]:
            return f"tensor {name!r}: {g.get('dtype')} {g.get('shape')}, expected {w['dtype']} {w['shape']}"
        if g.get("sha256") == w["sha256"]:
            continue
        if w.get("tolerance") is None:
            return f"tensor {name!r}: sha256 differs (stored values must be bit-exact)"
        if not g.get("file"):
            return f"tensor {name!r}: sha256 differs and no value file was given (--out)"
        try:
            data = Path(g["file"]).read_bytes()
        except OSError as exc:
            return f"tensor {name!r}: cannot read {g['file']}: {exc.strerror}"
        ref = (base / w["file"]).read_bytes()
        why = within(ref, data, w["dtype"], w["tolerance"])
        if why is not None:
            return f"tensor {name!r} outside tolerance {w['tolerance']}: {why}"
    return None


def run_command(template: str, path: Path, timeout: float) -> tuple[dict | None, str | None, str]:
    """Run one decoder; returns (protocol object, crash reason or None, stderr)."""
    with tempfile.TemporaryDirectory(prefix="bbconf-") as out:
        argv = [a.replace("{path}", str(path)).replace("{out}", out) for a in shlex.split(template)]
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True)
        except OSError as exc:
            return None, f"crash: cannot run {argv[0]}: {exc.strerror}", ""
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
            p = subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the decoder and anything it started
            except OSError:
                pass
            proc.communicate()
            return None, f"crash: timeout after {timeout:g} s", ""
        err = p.stderr.decode("utf-8", "replace")
        if any(m in err for m in SANITIZER_MARKERS):
            line = next(ln for ln in err.splitlines() if any(m in ln for m in SANITIZER_MARKERS))
            return None, f"crash: sanitizer report: {line.strip()[:200]}", err
        if p.returncode < 0:
            return None, f"crash: killed by signal {signal.Signals(-p.returncode).name}", err
        if p.returncode not in (0, 1):
            return None, f"crash: exit status {p.returncode}: {err.strip().splitlines()[-1:] or ''}"[:300], err
        try:
            res = json.loads(p.stdout.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return None, "crash: stdout is not one JSON object", err
        if not isinstance(res, dict):
            return None, "crash: stdout is not one JSON object", err
        if (res.get("result") == "accept") != (p.returncode == 0):
            return None, f"crash: result {res.get('result')!r} with exit status {p.returncode}", err
        # read the value files before the temporary directory goes away
        tensors = res.get("tensors") if res.get("result") == "accept" else None
        for t in tensors.values() if isinstance(tensors, dict) else ():
            if isinstance(t, dict) and isinstance(t.get("file"), str):
                try:
                    t["_data"] = Path(t["file"]).read_bytes()
                except OSError:
                    pass
        return res, None, err


def _materialise(res: dict, keep: Path) -> None:
    """Write the value files read by run_command to `keep` so check() can read them."""
    for k, t in enumerate((res.get("tensors") or {}).values()):
        if isinstance(t, dict) and "_data" in t:
            f = keep / f"{k}.bin"
            f.write_bytes(t.pop("_data"))
            t["file"] = str(f)


def run_vector(template: str, vec: dict, timeout: float) -> str | None:
    res, crash, _ = run_command(template, HERE / vec["path"], timeout)
    if crash:
        return crash
    with tempfile.TemporaryDirectory(prefix="bbconf-v-") as keep:
        try:
            _materialise(res, Path(keep))
            return check(vec, res)
        except (AttributeError, TypeError, KeyError, ValueError) as exc:  # a malformed protocol object
            return f"crash: malformed protocol object: {type(exc).__name__}: {exc}"[:300]


def load_manifest(path: Path = HERE / "manifest.json") -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def run_impl(label: str, template: str, vectors: list[dict], timeout: float, jobs: int) -> tuple[int, int]:
    passed = failed = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as ex:
        futures = [ex.submit(run_vector, template, v, timeout) for v in vectors]
        for v, fut in zip(vectors, futures):
            why = fut.result()
            if why is None:
                passed += 1
                print(f"PASS {v['id']}", flush=True)
            else:
                failed += 1
                print(f"FAIL {v['id']}: {why}", flush=True)
    return passed, failed


# ---- the C reader ----------------------------------------------------------------------------


def c_sources_exist() -> bool:
    return (C_DIR / "Makefile").is_file() and any(C_DIR.glob("*.c"))


def build_c(target: str | None = None) -> tuple[Path | None, str]:
    """make -C tools/bbread-c [target] when the binary is missing or older than its sources.
    Returns (binary or None, log)."""
    binary = C_DIR / ("bbread-asan" if target == "asan" else "bbread")
    sources = [p for p in C_DIR.rglob("*") if p.is_file() and (p.suffix in (".c", ".h") or p.name == "Makefile")]
    if not sources:
        return None, f"no C reader sources in {C_DIR}"
    newest = max(p.stat().st_mtime for p in sources)
    if binary.is_file() and binary.stat().st_mtime >= newest:
        return binary, ""
    cmd = ["make", "-C", str(C_DIR)] + ([target] if target else [])
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{' '.join(cmd)}: {exc}"
    log = p.stdout + p.stderr
    if p.returncode != 0 or not binary.is_file():
        return None, f"{' '.join(cmd)} failed (exit {p.returncode}):\n{log[-3000:]}"
    return binary, log


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--impl", action="append", default=[], help="decoder command template with {path} and optionally {out}")
    ap.add_argument("--filter", default="", help="only vectors whose id contains this")
    ap.add_argument("-j", "--jobs", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--c-sanitize", action="store_true", help="build and run tools/bbread-c/bbread-asan")
    ap.add_argument("--manifest", type=Path, default=HERE / "manifest.json")
    a = ap.parse_args(argv)
    vectors = [v for v in load_manifest(a.manifest)["vectors"] if a.filter in v["id"]]

    impls: list[tuple[str, str]] = [(f"impl{k + 1}", t) for k, t in enumerate(a.impl)]
    build_failures: list[str] = []
    wanted_c = []
    if a.c_sanitize:
        wanted_c.append("asan")
    if not a.impl and not a.c_sanitize:
        impls.append(("python", f"{shlex.quote(sys.executable)} {shlex.quote(str(HERE / 'impl_python.py'))} {{path}} --out {{out}}"))
        wanted_c.append(None)
    for target in wanted_c:
        label = "c-asan" if target else "c"
        binary, log = build_c(target)
        if binary is None:
            print(f"FAIL build-{label}: {log}", flush=True)
            build_failures.append(label)
            continue
        impls.append((label, f"{shlex.quote(str(binary))} {{path}} --out {{out}}"))
    if a.c_sanitize:  # sanitizer runtime options, unless the user set them
        os.environ.setdefault("ASAN_OPTIONS", "detect_leaks=1:exitcode=86")
        os.environ.setdefault("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1:exitcode=87")

    total_p, total_f = 0, len(build_failures)
    summaries = []
    for label, template in impls:
        if len(impls) + len(build_failures) > 1:
            print(f"== {label}: {template}", flush=True)
        p, f = run_impl(label, template, vectors, a.timeout, a.jobs)
        total_p, total_f = total_p + p, total_f + f
        summaries.append(f"{label}: {p} passed, {f} failed")
    if len(impls) + len(build_failures) > 1:
        for s in summaries:
            print(f"== {s}")
        for b in build_failures:
            print(f"== {b}: build failed")
    print(f"{total_p} passed, {total_f} failed")
    return 1 if total_f else 0


if __name__ == "__main__":
    sys.exit(main())

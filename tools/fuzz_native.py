#!/usr/bin/env python3
"""Mutation fuzz of the compiled decoders under ASan and UBSan (issue #41); writes FUZZING.md.

    python tools/fuzz_native.py --cases 20000 --seed 1 --report FUZZING.md [--findings DIR]

Seeds: the accepted conformance vectors (conformance/valid) and writer-made files of every
dtype (float16, bfloat16, float32; `--entropy auto`, and codec 3 in parts). Each case edits
one seed with bbformat.fuzz: mostly `mutate_payload` (an edit inside a chunk, weighted to the
payload's fields, then the chunk resealed), else `mutate`'s whole-file mutations. It is then
decoded by

- the Python reader with bbformat/codec/_exponent_native.c built with
  -fsanitize=address,undefined, in a worker process run with LD_PRELOAD of libasan (a
  worker that dies is restarted; its sanitizer report is the finding), and
- tools/bbread-c built the same way (`make asan`), one process per case.

A finding: a sanitizer report, a crash or a hang of either, an exception that is not a
bbformat error, or the two readers disagreeing on accept/reject. Codes that differ are
counted and listed, not findings: SPEC.md 1 makes codes a SHOULD. A case "reaches the
payload decoders" when the Python reader enters its codec-2/3/4 payload decoder for the
edited chunk (counted in the worker); "compiled" when it calls the extension there. The
compiled rANS decoder takes its AVX2 steps in every other case and its scalar steps in the
others (where the CPU has AVX2).
"""
from __future__ import annotations

import argparse
import collections
import io
import json
import os
import random
import select
import shlex
import struct
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "conformance"))

SAN_FLAGS = ["-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]
ASAN_OPTIONS = "detect_leaks=0:abort_on_error=0:exitcode=86"
UBSAN_OPTIONS = "print_stacktrace=1:halt_on_error=1:exitcode=87"
C_ASAN_OPTIONS = "detect_leaks=1:exitcode=86"  # the C reader is a whole program: leaks count too
DTYPES = ("float16", "bfloat16", "float32")
PAYLOAD_SHARE = 0.85  # of cases edited by mutate_payload; the rest by mutate


# ---- builds -------------------------------------------------------------------------------


def libasan() -> str:
    """The compiler's ASan runtime, to LD_PRELOAD into Python (it must load first)."""
    return subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True, check=True).stdout.strip()


def build_extension(dest: Path, name: str = "_exponent_native") -> Path:
    """bbformat/codec/NAME.c built with SAN_FLAGS into `dest`; returns the .so. The run builds
    both compiled modules: _exponent_native (codecs 2 and 3) and _host_native (x_residuals,
    rounding, widening, margins), which the worker loads from the same folder."""
    dest.mkdir(parents=True, exist_ok=True)
    so = dest / (name + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))
    src = ROOT / "bbformat" / "codec" / f"{name}.c"
    cmd = ["gcc", *SAN_FLAGS, "-fPIC", "-shared", "-Wall", "-Werror", f"-I{sysconfig.get_paths()['include']}", str(src), "-o", str(so)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return so


def build_c_reader() -> Path:
    """tools/bbread-c/bbread-asan (make asan: the same sanitizer flags)."""
    from run import build_c

    binary, log = build_c("asan")
    if binary is None:
        raise RuntimeError(log)
    return binary


# ---- seeds --------------------------------------------------------------------------------


def writer_seed(dtype: str, entropy: str, part_symbols: int | None = None, seed: int = 5) -> bytes:
    """A format-1.5 file from the writer: a chunk of `dtype` with one symmetric site (D = 32)
    and a float32 chunk without sites, coded with `entropy` (and in parts of `part_symbols`)."""
    import numpy as np

    from bbformat.codec.dtypes import RawTensor
    from bbformat.codec.encoder import encode_chunk
    from bbformat.codec.layout import ChunkLayout, SiteSpec
    from bbformat.container.program import AxisRef
    from bbformat.writer import Writer

    rng = np.random.default_rng(seed)
    d = 32
    t0 = {"src": RawTensor.from_f64(rng.normal(0, 0.05, (72, d)), dtype), "anchor": RawTensor.from_f64(rng.normal(0, 0.05, (d, 80)), dtype)}
    l0 = ChunkLayout("block0", ("src", "anchor"), (SiteSpec("site0", d, AxisRef("anchor", 0), ()),))
    t1 = {"bias": RawTensor.from_f64(rng.normal(0, 1, (48, 40)), "float32")}
    l1 = ChunkLayout("block1", ("bias",), ())
    buf = io.BytesIO()
    extra = {} if part_symbols is None else {"part_symbols": part_symbols}
    w = Writer(buf, "symmetric", 2, {"format": "bbformat", "scheme": "symmetric"}, entropy=entropy, format_version="1.5", **extra)
    for lay, ts in ((l0, t0), (l1, t1)):
        w.add_encoded(encode_chunk(lay, ts, {}, "symmetric", 0.0, band=True, bands=True))
    w.close()
    return buf.getvalue()


def seeds(max_bytes: int = 100_000) -> list[tuple[str, bytes]]:
    """Accepted conformance vectors under max_bytes, then the writer-made files."""
    from bbformat.fuzz import read_random

    out = []
    for p in sorted((ROOT / "conformance" / "valid").glob("*.bb")):
        data = p.read_bytes()
        if len(data) <= max_bytes:
            out.append((f"valid/{p.name}", data))
    for dtype in DTYPES:
        out.append((f"writer/{dtype}-auto", writer_seed(dtype, "auto")))
        out.append((f"writer/{dtype}-exponent-parts", writer_seed(dtype, "exponent", part_symbols=1024)))
    for name, data in out:
        read_random(data)  # every seed decodes
    return out


# ---- the worker: the Python reader on the sanitized extension ------------------------------


def worker_main(so: Path) -> int:
    """Read cases from stdin (u32 length, i32 edited chunk, bytes), answer one JSON line each."""
    import importlib.util
    import types

    spec = importlib.util.spec_from_file_location("bbformat.codec._exponent_native", so)
    assert spec is not None and spec.loader is not None
    real = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(real)
    calls: collections.Counter[str] = collections.Counter()
    proxy = types.ModuleType("bbformat.codec._exponent_native")
    for name in dir(real):
        v = getattr(real, name)
        if callable(v):
            def counted(*a: Any, _f: Any = v, _n: str = name) -> Any:
                calls[_n] += 1
                return _f(*a)
            v = counted
        setattr(proxy, name, v)
    simd = [True]  # odd cases keep the compiled decoder to its scalar steps (decode's simd=False)
    counted_decode = proxy.decode
    proxy.decode = lambda *a: counted_decode(*a, simd[0])  # type: ignore[attr-defined]
    sys.modules["bbformat.codec._exponent_native"] = proxy
    host_so = so.with_name(so.name.replace("_exponent_native", "_host_native"))
    if host_so.exists():  # the host path's residual decoding, rounding and margins, sanitized too
        hspec = importlib.util.spec_from_file_location("bbformat.codec._host_native", host_so)
        assert hspec is not None and hspec.loader is not None
        host = importlib.util.module_from_spec(hspec)
        hspec.loader.exec_module(host)
        sys.modules["bbformat.codec._host_native"] = host
    from bbformat.codec import host_native, native, payload
    from bbformat.errors import BBFormatError
    from bbformat.reader import Reader

    assert native.compiled is proxy, "the sanitized extension was not taken"
    assert not host_so.exists() or host_native.compiled is sys.modules["bbformat.codec._host_native"], "sanitized host path not taken"
    entered = [0]
    decode_payload = payload.decode_payload

    def counting(*a: Any, **kw: Any) -> Any:
        entered[0] += 1
        return decode_payload(*a, **kw)

    payload.decode_payload = counting  # type: ignore[assignment]
    inp, outp = sys.stdin.buffer, sys.stdout
    while True:
        head = inp.read(8)
        if len(head) < 8:
            return 0
        n, edited = struct.unpack("<Ii", head)
        data = inp.read(n)
        simd[0] = not simd[0]
        res: dict[str, Any] = {"reached": False, "compiled": False}
        t0 = time.perf_counter()
        try:
            with Reader(io.BytesIO(data), max_block_bytes="auto", threads=1) as r:
                for i in range(len(r)):
                    before, native_before = entered[0], sum(calls.values())
                    try:
                        r.decode_block(i)
                    finally:
                        if i == edited:
                            res["reached"] = entered[0] > before
                            res["compiled"] = sum(calls.values()) > native_before
            res["result"] = "accept"
        except BBFormatError as exc:
            res["result"] = exc.code
        except Exception as exc:  # noqa: BLE001 - the point: anything else is a finding
            res["result"] = "UNEXPECTED"
            res["error"] = f"{type(exc).__name__}: {exc}"[:300]
        res["seconds"] = time.perf_counter() - t0
        outp.write(json.dumps(res) + "\n")
        outp.flush()


class Worker:
    """The worker process; restarted after it dies (a sanitizer report) or hangs."""

    def __init__(self, so: Path, log_dir: Path) -> None:
        self.so, self.log_dir, self.proc, self.starts = so, log_dir, None, 0
        self.log: Path | None = None

    def start(self) -> None:
        self.starts += 1
        self.log = self.log_dir / f"worker{self.starts}.log"
        env = dict(os.environ, LD_PRELOAD=libasan(), ASAN_OPTIONS=ASAN_OPTIONS, UBSAN_OPTIONS=UBSAN_OPTIONS,
                   PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
        with open(self.log, "wb") as err:
            self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker", str(self.so)], env=env,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, start_new_session=True)

    def decode(self, data: bytes, edited: int, timeout: float) -> dict[str, Any]:
        """The worker's answer, or {"result": "CRASH"/"HANG", "error": ...}."""
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        assert self.proc is not None and self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(struct.pack("<Ii", len(data), edited) + data)
            self.proc.stdin.flush()
            ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
            line = self.proc.stdout.readline() if ready else None
        except BrokenPipeError:
            line = b""
        if line:
            return json.loads(line)
        hung = line is None
        self.proc.kill()
        self.proc.wait()
        self.proc = None
        text = self.log.read_text("utf-8", "replace") if self.log else ""
        report = [ln for ln in text.splitlines() if "ERROR:" in ln or "runtime error" in ln or "SUMMARY" in ln]
        return {"result": "HANG" if hung else "CRASH", "error": (report[0] if report else text[-300:]).strip()[:300], "log": str(self.log)}

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()


# ---- the run ------------------------------------------------------------------------------


def c_decode(binary: Path, data: bytes, work: Path, timeout: float) -> dict[str, Any]:
    """The C reader's protocol object for `data`, or {"result": "CRASH", "error": ...}."""
    from run import run_command

    path = work / "case.bb"
    path.write_bytes(data)
    res, crash, _ = run_command(f"{shlex.quote(str(binary))} {{path}}", path, timeout)
    if crash:
        return {"result": "HANG" if "timeout" in crash else "CRASH", "error": crash}
    assert res is not None
    return {"result": "accept" if res["result"] == "accept" else res.get("code", "?")}


def entropy_coded(data: bytes) -> bool:
    """Whether a seed has a codec-2, 3 or 4 payload (header flags PLANES, EXPONENT or PARTS)."""
    from bbformat.constants import RequiredFlag

    return bool(int.from_bytes(data[12:16], "little") & (RequiredFlag.PLANES | RequiredFlag.EXPONENT | RequiredFlag.PARTS))


def seed_weight(data: bytes) -> float:
    """Seeds with entropy-coded payloads are drawn three times as often as the others."""
    return 3.0 if entropy_coded(data) else 1.0


def case(rng: random.Random, pool: list[tuple[str, bytes]]) -> tuple[str, str, bytes, int]:
    """(seed name, what was done, the mutated bytes, the edited chunk or -1)."""
    from bbformat.fuzz import mutate, mutate_payload

    name, data = rng.choices(pool, [seed_weight(d) for _, d in pool])[0]
    what, mutated = mutate_payload(data, rng) if rng.random() < PAYLOAD_SHARE else mutate(data, rng)
    parts = what.split()
    edited = int(parts[1]) if parts[0] in ("payload_resealed", "chunk_resealed") and len(parts) > 1 and parts[1].isdigit() else -1
    return name, what, mutated, edited


def family(what: str) -> str:
    """The row of the reach table: the region for payload_resealed, else the mutation."""
    parts = what.split()
    if parts[0] == "payload_resealed" and len(parts) >= 4:
        return " ".join(parts[2:-1])
    return parts[0]


def run(cases: int, seed: int, findings_dir: Path | None, timeout: float = 60.0, log: Any = None, work: Path | None = None) -> dict[str, Any]:
    """`cases` cases from `seed`; builds and scratch files go to `work` (default: a temporary
    directory), failing inputs to `findings_dir`."""
    pool = seeds()
    rng = random.Random(seed)
    found: list[dict[str, Any]] = []
    rows: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    codes: collections.Counter[tuple[str, str]] = collections.Counter()
    code_examples: dict[tuple[str, str], str] = {}
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="bbfuzz-native-", dir=work) as tmp:
        work = Path(tmp)
        so = build_extension(work / "ext")
        build_extension(work / "ext", "_host_native")
        binary = build_c_reader()
        worker = Worker(so, work)
        try:
            for k in range(cases):
                name, what, mutated, edited = case(rng, pool)
                py = worker.decode(mutated, edited, timeout)
                c = c_decode(binary, mutated, work, timeout)
                row = rows[family(what)]
                row["cases"] += 1
                row["reached"] += bool(py.get("reached"))
                row["compiled"] += bool(py.get("compiled"))
                row["accepted"] += py["result"] == "accept"
                why = None
                if py["result"] in ("CRASH", "HANG", "UNEXPECTED"):
                    why = f"Python reader ({so.name}): {py['result']}: {py.get('error')}"
                elif c["result"] in ("CRASH", "HANG"):
                    why = f"C reader: {c['error']}"
                elif (py["result"] == "accept") != (c["result"] == "accept"):
                    why = f"readers disagree: Python {py['result']}, C {c['result']}"
                elif py["result"] != c["result"]:
                    codes[(py["result"], c["result"])] += 1
                    code_examples.setdefault((py["result"], c["result"]), f"{name} {what}")
                if why:
                    f = None
                    if findings_dir is not None:
                        findings_dir.mkdir(parents=True, exist_ok=True)
                        f = findings_dir / f"case{k}.bb"
                        f.write_bytes(mutated)
                    found.append({"case": k, "seed_file": name, "mutation": what, "why": why, "file": str(f) if f else None})
                    if log:
                        print(f"FINDING case {k}: {name} {what}: {why}", file=log, flush=True)
                if log and (k + 1) % 1000 == 0:
                    print(f"{k + 1:,} cases, {time.time() - t0:.0f} s, {len(found)} findings", file=log, flush=True)
        finally:
            worker.close()
    return {
        "cases": cases, "seed": seed, "seed_files": len(pool), "elapsed_s": time.time() - t0, "findings": found,
        "rows": {r: dict(v) for r, v in sorted(rows.items())}, "worker_starts": worker.starts,
        "code_differences": [{"python": p, "c": c, "cases": n, "example": code_examples[(p, c)]} for (p, c), n in codes.most_common()],
        "date": time.strftime("%Y-%m-%d"), "flags": " ".join(SAN_FLAGS), "host_path": True,
    }


def report(res: dict[str, Any]) -> str:
    rows = res["rows"]
    pay = {r: v for r, v in rows.items() if r not in ("bitflip", "bitflips", "truncate", "overwrite", "append", "splice", "field",
                                                       "field_resealed", "chunk_resealed", "index_resealed", "swap_chunks")}
    n_pay = sum(v["cases"] for v in pay.values())
    reach_pay = sum(v.get("reached", 0) for v in pay.values())
    n_all = sum(v["cases"] for v in rows.values())
    reach_all = sum(v.get("reached", 0) for v in rows.values())
    L = [
        "# Fuzzing the compiled decoders",
        "",
        f"{res['date']}, format 1.5. Machine: {res['machine']}.",
        "",
        f"Command: `python tools/fuzz_native.py {' '.join(res['argv'])}` ({res['elapsed_s'] / 60:.0f} min on one core).",
        "",
        f"**{res['cases']:,} cases, {len(res['findings'])} findings.** Both compiled decoders are built with `gcc {res['flags']}`: "
        "`bbformat/codec/_exponent_native.c` (codecs 2 and 3)"
        + (" and `bbformat/codec/_host_native.c` (x_residuals, rounding, widening, margins)" if res.get("host_path") else "")
        + ", loaded by the Python reader in a worker run with "
        "`LD_PRELOAD=$(gcc -print-file-name=libasan.so)` and `ASAN_OPTIONS=detect_leaks=0` (Python's own allocations are "
        "not leaks of ours), and the C reader `tools/bbread-c` (`make asan`, leak checking on). Each case goes to both; the extension's rANS decoder takes its AVX2 steps in every other case and its scalar steps in the others. A "
        "finding is a sanitizer report, a crash or a hang (60 s) of either, an exception from the Python reader that is not a "
        "bbformat error, or the readers disagreeing on accept/reject.",
        "",
        f"Seeds ({res['seed_files']}): the conformance vectors of `conformance/valid` under 100 kB and six writer-made files "
        "(`tools/fuzz_native.py: writer_seed`): float16, bfloat16 and float32 blocks with a symmetric site, `--entropy auto`, "
        "and codec 3 in parts of 1,024 symbols.",
        "",
        f"How cases are made: {PAYLOAD_SHARE:.0%} by `bbformat.fuzz.mutate_payload`: a seed's chunks are split into labelled "
        "regions (`chunk_regions`: head, descriptor, section table, each section, and a codec-2/3/4 payload into its fields), "
        "a region is drawn with the weights of `REGION_WEIGHTS` (rANS tables 5, class maps and part tables 4, band, headers "
        "and stream 3, …; not by size), one to three length-preserving edits are made inside it, and the chunk is resealed "
        "(chunk CRC, its index entry, index CRC, footer CRC; content_crc is kept, so an edit that changes values ends at "
        f"`E_DIGEST` after the decoders ran). The other {1 - PAYLOAD_SHARE:.0%} use `bbformat.fuzz.mutate`'s whole-file mutations.",
        "",
        f"**Reach.** {reach_pay / max(n_pay, 1):.1%} of the `mutate_payload` cases ({reach_pay:,} of {n_pay:,}) got past the CRC "
        f"into a payload decoder (codec 2, 3 or 4) of the edited chunk; {reach_all / max(n_all, 1):.1%} of all cases. "
        "Counted in the Python reader, which checks in SPEC.md 11.3's order as the C reader does. \"compiled\": the "
        "extension was called for that chunk.",
        "",
        "| region or mutation | cases | reached a payload decoder | compiled code called | accepted |",
        "|---|---:|---:|---:|---:|",
    ]
    for r, v in sorted(rows.items(), key=lambda kv: -kv[1]["cases"]):
        n = v["cases"]
        L.append(f"| {r} | {n:,} | {v.get('reached', 0) / n:.0%} | {v.get('compiled', 0) / n:.0%} | {v.get('accepted', 0) / n:.0%} |")
    L += ["", "Why a region reaches less than 100%: edits to the descriptor, section table, chunk head, side sections "
          "(signs, residuals, patches, band) and raw/zstd payloads are checked before or instead of a codec-2/3/4 decoder; "
          "a seed whose payload is raw has none. Whole-file mutations without resealing stop at a CRC.", ""]
    diffs = res["code_differences"]
    L += [f"**Codes.** The readers agreed on accept/reject in every case; they gave different codes in "
          f"{sum(d['cases'] for d in diffs):,} cases:" if not any("disagree" in f["why"] for f in res["findings"]) else "**Codes.**", ""]
    if diffs:
        L += ["| Python | C | cases | example |", "|---|---|---:|---|"]
        L += [f"| {d['python']} | {d['c']} | {d['cases']:,} | {d['example']} |" for d in diffs]
        L.append("")
    L += ["## Findings", ""]
    L += [f"- case {f['case']}: {f['seed_file']} {f['mutation']}: {f['why']}" for f in res["findings"]] or ["None in this run."]
    L.append("")
    return "\n".join(L)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--worker"]:
        return worker_main(Path(args[1]))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=60.0, help="per case and reader (a hang)")
    ap.add_argument("--report", type=Path, default=None, help="write a markdown report (FUZZING.md)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--findings", type=Path, default=Path("fuzz-findings"))
    ap.add_argument("--from-json", type=Path, default=None, help="re-render --report from a run's --json")
    a = ap.parse_args(args)
    if a.from_json:
        res = json.loads(a.from_json.read_text())
    else:
        from machine import cpu_and_memory, python_and_numpy

        res = run(a.cases, a.seed, a.findings, a.timeout, log=sys.stderr)
        res["machine"], res["argv"] = f"{cpu_and_memory()}; {python_and_numpy()}", args
    if a.json and not a.from_json:
        a.json.write_text(json.dumps(res, indent=1))
    if a.report:
        a.report.write_text(report(res), encoding="utf-8")
    print(f"{res['cases']:,} cases in {res['elapsed_s']:.0f} s: {len(res['findings'])} findings")
    return 1 if res["findings"] else 0


if __name__ == "__main__":
    raise SystemExit(main())

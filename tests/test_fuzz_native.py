"""The compiled decoders under ASan and UBSan (issue #41): the payload mutation's regions and
resealing, a smoke run of tools/fuzz_native.py on both compiled decoders (CI), the harness
catching a sanitizer report, and a longer run under the slow marker. The long run (30,000
cases) is FUZZING.md."""
from __future__ import annotations

import io
import random
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from bbformat.container.crc import crc32c
from bbformat.container.rebuild import split
from bbformat.errors import BBFormatError
from bbformat.fuzz import REGION_WEIGHTS, chunk_regions, mutate_payload, read_random
from bbformat.reader import Reader

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "conformance"))

import fuzz_native  # noqa: E402
from run import SANITIZER_MARKERS  # noqa: E402

VALID = sorted((ROOT / "conformance" / "valid").glob("*.bb"))
MANTISSA_EXPONENT = {"float16": (10, 5), "bfloat16": (7, 8), "float32": (23, 8)}


def _sanitizers_problem() -> str | None:
    if shutil.which("gcc") is None or shutil.which("make") is None:
        return "no gcc or make"
    if not Path(fuzz_native.libasan()).is_file():
        return "no libasan"
    try:
        fuzz_native.build_c_reader()
    except RuntimeError as exc:
        return f"the C reader does not build: {str(exc)[-200:]}"
    return None


def _need_sanitizers() -> None:
    problem = _sanitizers_problem()
    if problem:
        pytest.skip(problem)


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.name)
def test_regions_tile_every_chunk(path: Path) -> None:
    """chunk_regions covers each chunk from after its magic to its CRC, without gaps or
    overlaps, with labels that REGION_WEIGHTS knows."""
    for chunk in split(path.read_bytes()).chunks:
        spans = sorted(chunk_regions(chunk))
        assert spans[0][0] == 4 and spans[-1][1] == len(chunk) - 4
        assert all(b == a2 for (_, b, _), (a2, _, _) in zip(spans, spans[1:])), spans
        assert {lab for _, _, lab in spans} <= set(REGION_WEIGHTS)


@pytest.mark.parametrize("dtype", fuzz_native.DTYPES)
def test_the_rest_fields_region_is_the_rest_of_spec_8_7(dtype: str) -> None:
    """In a writer-made codec-3 payload the region labelled "rest fields" has the length SPEC.md
    8.7 gives the rest: P·floor(R/8) + ceil(P/8)·(R mod 8) bytes, R = 1 + s − t."""
    data = fuzz_native.writer_seed(dtype, "exponent")
    chunk = split(data).chunks[0]
    with Reader(io.BytesIO(data)) as r:
        total = r.read_chunk(0).program.payload_symbols()
    spans = {lab: (a, b) for a, b, lab in chunk_regions(chunk)}
    t = chunk[spans["exponent head"][0]]
    s, e = MANTISSA_EXPONENT[dtype]
    rest = 1 + s - t
    a, b = spans["rest fields"]
    assert b - a == total * (rest // 8) + -(-total // 8) * (rest % 8)
    assert {"class maps", "rans tables", "rans stream"} <= set(spans)


def test_payload_mutations_are_resealed_and_stay_in_their_chunk() -> None:
    """Every chunk CRC of a mutated file is right, the bytes differ only inside the edited
    chunk's region (and the seals after it), and no reader stops at a CRC."""
    data = fuzz_native.writer_seed("bfloat16", "exponent", part_symbols=1024)
    rng = random.Random(4)
    labels = set()
    for _ in range(150):
        what, mutated = mutate_payload(data, rng)
        _, k, *label, at = what.split()
        labels.add(" ".join(label))
        if label == ["chunk", "head"]:  # chunk_length may be edited: split() cannot follow it
            continue
        parts, old = split(mutated), split(data)
        for c in parts.chunks:
            assert crc32c(c[:-4]) == int.from_bytes(c[-4:], "little")
        a, b = next((a, b) for a, b, lab in chunk_regions(old.chunks[int(k)]) if a <= int(at[1:]) < b and lab == " ".join(label))
        for j, (c, o) in enumerate(zip(parts.chunks, old.chunks)):
            diff = [i for i in range(len(c) - 4) if c[i] != o[i]]
            assert not diff or (j == int(k) and a <= min(diff) and max(diff) < b), (what, diff[:5])
        try:
            read_random(mutated)
        except BBFormatError as exc:
            assert not exc.code.startswith("E_CRC"), (what, exc.code)
    assert {"part table", "rans tables", "class maps", "rest fields", "band"} <= labels


def _smoke(cases: int, seed: int, work: Path) -> dict:
    _need_sanitizers()
    res = fuzz_native.run(cases, seed, None, timeout=60.0, work=work)
    assert not res["findings"], res["findings"]
    payload = [v for r, v in res["rows"].items() if r in REGION_WEIGHTS]
    n, reached = sum(v["cases"] for v in payload), sum(v["reached"] for v in payload)
    assert reached >= 0.3 * n, (reached, n)  # 52% in FUZZING.md's run
    assert sum(v["compiled"] for v in res["rows"].values()) > 0
    res["machine"], res["argv"] = "test", ["--cases", str(cases)]
    md = fuzz_native.report(res)
    assert f"**{cases:,} cases, 0 findings.**" in md and "| rans tables |" in md
    return res


def test_sanitizer_fuzz_smoke(tmp_path: Path) -> None:
    """CI: 60 cases, fixed seed, on both sanitized decoders (about 15 s with the builds)."""
    _smoke(60, 41, tmp_path)


@pytest.mark.slow
def test_sanitizer_fuzz_long(tmp_path: Path) -> None:
    """3,000 cases (about 3 minutes on one core)."""
    _smoke(3000, 7, tmp_path)


BOOM = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdlib.h>
static PyObject *boom(PyObject *self, PyObject *args) {
    volatile char *p = malloc(8);
    int v = p[8];  /* a heap-buffer-overflow */
    free((void *)p);
    return PyLong_FromLong(v);
}
static PyMethodDef m[] = {{"tables", boom, METH_VARARGS, ""}, {"decode", boom, METH_VARARGS, ""},
                          {"unpermute", boom, METH_VARARGS, ""}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef d = {PyModuleDef_HEAD_INIT, "_exponent_native", NULL, -1, m, NULL, NULL, NULL, NULL};
PyMODINIT_FUNC PyInit__exponent_native(void) {
    PyObject *mod = PyModule_Create(&d);
    PyModule_AddIntConstant(mod, "ABI", 6);
    PyModule_AddIntConstant(mod, "SIMD", 0);
    return mod;
}
"""


def test_the_harness_reports_a_sanitizer_error_in_the_extension(tmp_path: Path) -> None:
    """A stand-in extension that reads past a heap block: the worker dies with a sanitizer's report, the
    harness returns it as a crash, and the next case gets a fresh worker."""
    _need_sanitizers()
    src = tmp_path / "boom.c"
    src.write_text(BOOM)
    so = tmp_path / ("_exponent_native" + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))
    subprocess.run(["gcc", *fuzz_native.SAN_FLAGS, "-fPIC", "-shared", f"-I{sysconfig.get_paths()['include']}", str(src), "-o", str(so)],
                   check=True, capture_output=True)
    worker = fuzz_native.Worker(so, tmp_path)
    try:
        codec3 = (ROOT / "conformance" / "valid" / "v_exponent_writer_auto.bb").read_bytes()
        got = worker.decode(codec3, 0, 60.0)
        assert got["result"] == "CRASH" and any(m in got["error"] for m in SANITIZER_MARKERS), got  # UBSan's object-size check or ASan
        plain = (ROOT / "conformance" / "valid" / "sym_f16_exact.bb").read_bytes()  # no compiled code on its path
        assert worker.decode(plain, 0, 60.0)["result"] == "accept" and worker.starts == 2
    finally:
        worker.close()


# ---- findings of the long run (FUZZING.md) ------------------------------------------------

EMPTY_FRAME = bytes.fromhex("28b52ffd2000010000")  # a frame declaring 0 bytes: one empty raw block
DAMAGED_EMPTY_FRAMES = {
    "block size past the end": bytes.fromhex("28b52ffd200001ff00"),
    "block size past the end, high byte": bytes.fromhex("28b52ffd20000100ff"),
    "no block": bytes.fromhex("28b52ffd2000"),
    "a byte after the frame": EMPTY_FRAME + b"\x00",
}


@pytest.mark.parametrize("how", sorted(DAMAGED_EMPTY_FRAMES))
def test_a_damaged_frame_declaring_no_bytes_is_e_zstd(how: str) -> None:
    """python-zstandard returns b"" for a frame whose content size is 0 without reading its
    blocks; the reference now reads them, as libzstd and the C reader do (SPEC.md 8.2)."""
    from bbformat.zstdframe import decompress_frame

    assert decompress_frame(EMPTY_FRAME) == b""
    with pytest.raises(BBFormatError) as info:
        decompress_frame(DAMAGED_EMPTY_FRAMES[how])
    assert info.value.code == "E_ZSTD"


@pytest.mark.parametrize("how", ["block size past the end", "block size past the end, high byte"])
def test_both_readers_reject_a_damaged_empty_class_map_group(how: str, tmp_path: Path) -> None:
    """The long run's disagreement: v_planes_one_segment_zstd's class-map group (G = 0, zstd)
    with a damaged block header, resealed. The Python reader accepted it; both now say E_ZSTD."""
    from run import build_c, run_command

    from bbformat.container.rebuild import join, reseal_chunk

    data = (ROOT / "conformance" / "valid" / "v_planes_one_segment_zstd.bb").read_bytes()
    parts = split(data)
    chunk = bytearray(parts.chunks[0])
    a, b = next((a, b) for a, b, lab in chunk_regions(bytes(chunk)) if lab == "class maps")
    assert bytes(chunk[a + 2 : b]) == EMPTY_FRAME  # varint 9, codec 1, the frame
    chunk[a + 2 : b] = DAMAGED_EMPTY_FRAMES[how]
    parts.chunks[0] = reseal_chunk(bytes(chunk))
    mutated = join(parts)
    with pytest.raises(BBFormatError) as info:
        read_random(mutated)
    assert info.value.code == "E_ZSTD"
    binary, _ = build_c()
    if binary is None:
        pytest.skip("the C reader does not build here")
    path = tmp_path / "case.bb"
    path.write_bytes(mutated)
    res, crash, _ = run_command(f"{binary} {{path}}", path, 60)
    assert crash is None and res is not None and res.get("code") == "E_ZSTD", (res, crash)


HOST_ODD_OFFSETS = r"""
import importlib.util, sys
import numpy as np
spec = importlib.util.spec_from_file_location("bbformat.codec._host_native", sys.argv[1])
h = importlib.util.module_from_spec(spec)
spec.loader.exec_module(h)

def odd(dtype, n, fill):
    raw = bytearray(np.dtype(dtype).itemsize * n + 1)
    a = np.frombuffer(raw, dtype, count=n, offset=1)  # one byte off: misaligned for every element
    a[...] = fill
    return a

rng = np.random.default_rng(0)
n = 4099  # the AVX2 loops' steps and a scalar tail
x = rng.standard_normal(n)
for code, bits in ((0, np.uint16), (1, np.uint16), (2, np.uint32)):
    b = odd(bits, n, rng.integers(0, np.iinfo(bits).max, n, dtype=np.uint64).astype(bits))
    xs = odd(np.float64, n, x)
    h.map(0, b, code, odd(np.float64, n, 0.0))
    h.map(1, xs, code, odd(bits, n, 0))
    h.map(2, xs, code, odd(np.float64, n, 0.0))
    h.map(3, xs, code, odd(np.uint8, n, 0), 1e-3)
    h.min_distance(xs, code, np.zeros(0, np.uint8))
    h.nonfinite(b, code)
    w = 32 if code == 2 else 16
    h.context_counts(b, w, 2, 3, np.zeros(0, np.uint8), np.zeros(8, np.int64))
    groups = tuple(b"\x00" * int(k) for k in np.bincount((b.astype(np.int64) >> 2) & 7, minlength=8))
    assert h.apply_residuals(b, b, np.zeros(0, np.uint8), w, 2, 3, groups, odd(bits, n, 0)) == 0
    keep, deltas = odd(np.uint8, n, 1), odd(np.int64, n, 0)
    h.ordinal_deltas(b, b[::-1].copy(), keep, w, deltas)
    h.residual_sizes(b, deltas, keep, w, 2, 3, np.zeros(8, np.int64), np.zeros(8, np.int64))
d = 67  # a tile and a part of one
h.symmetric(odd(np.float64, d * (d + 1) // 2, 1.5), d, odd(np.float64, d * d, 0.0))
print("ok")
"""


def test_the_host_path_reads_and_writes_misaligned_buffers_under_sanitizers(tmp_path: Path) -> None:
    """_host_native built with ASan and UBSan, every function on views one byte off alignment
    (a view into a file's bytes can start anywhere): no sanitizer report. Before its element
    loads and stores went through memcpy, UBSan stopped this at the first widening."""
    _need_sanitizers()
    so = fuzz_native.build_extension(tmp_path / "ext", "_host_native")
    env = dict(__import__("os").environ, LD_PRELOAD=fuzz_native.libasan(), ASAN_OPTIONS=fuzz_native.ASAN_OPTIONS,
               UBSAN_OPTIONS=fuzz_native.UBSAN_OPTIONS)
    r = subprocess.run([sys.executable, "-c", HOST_ODD_OFFSETS, str(so)], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]

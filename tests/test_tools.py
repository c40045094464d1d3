"""The measurement tools added for issues #5 and #6 run, write their reports, and refuse bad
input with one line."""
from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

TOOLS = Path(__file__).resolve().parent.parent / "tools"


def _tool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=600)


def test_fuzz_tool_writes_its_report(tmp_path: Path) -> None:
    r = _tool(str(TOOLS / "fuzz.py"), "--cases", "60", "--seed", "9", "--report", str(tmp_path / "F.md"),
              "--findings", str(tmp_path / "found"))
    assert r.returncode == 0, r.stderr
    report = (tmp_path / "F.md").read_text()
    assert "**60 cases, 0 findings.**" in report and "Machine: " in report and "cores" in report
    assert not (tmp_path / "found").exists()


def test_fuzz_tool_refuses_a_bad_flag() -> None:
    r = _tool(str(TOOLS / "fuzz.py"), "--cases", "many")
    assert r.returncode == 2 and "invalid int value" in r.stderr and "Traceback" not in r.stderr


def test_bench_threads_refuses_a_missing_container(tmp_path: Path) -> None:
    r = _tool(str(TOOLS / "bench_threads.py"), str(tmp_path / "none.bb"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no container at" in r.stderr


def test_bench_refuses_a_baseline_that_is_not_a_checkout(tmp_path: Path) -> None:
    """Checked before anything is measured: one line, exit 2."""
    r = _tool(str(TOOLS / "bench.py"), "--sections", "speed", "--baseline", str(tmp_path), "--work", str(tmp_path / "w"))
    assert r.returncode == 2 and "not a checkout of bbformat" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "w").exists()


def test_residual_contexts_measures_a_container_and_refuses_bad_input(tmp_path: Path) -> None:
    from conftest import sample_container

    good = tmp_path / "s.bb"
    good.write_bytes(sample_container())
    r = _tool(str(TOOLS / "residual_contexts.py"), str(good))
    assert r.returncode == 0, r.stderr
    import json

    m = json.loads(r.stdout)
    assert m["sites"] == 1 and m["exp_zstd"] == m["stored"] and m["exp_entropy"] <= m["stored"]
    for bad, text in ((tmp_path / "none.bb", "usage"), (tmp_path / "junk.bb", "E_MAGIC")):
        if bad.name == "junk.bb":
            bad.write_bytes(b"not a container at all, long enough to have a footer" * 3)
        r = _tool(str(TOOLS / "residual_contexts.py"), str(bad))
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and text in r.stderr and "Traceback" not in r.stderr


def test_crosscheck_runs_two_cells_on_a_tiny_container(tmp_path: Path) -> None:
    """tools/crosscheck.py on one synthetic D=24 site, packed by the reference and by the torch
    backend: the reference and torch's decoder (--device torch:cpu, no fallback) verify both
    files' digests, and section 8 is appended to the report (then replaced, not doubled)."""
    import json

    report = tmp_path / "B.md"
    report.write_text("# Benchmarks\n\n## 7. Before\n\nkept\n")
    r = _tool(str(TOOLS / "crosscheck.py"), "--work", str(tmp_path / "w"), "--dims", "24", "--dtypes", "float32", "--versions", "1.2",
              "--no-smollm2", "--cells", "solver-torch", "--pack-devices", "cpu,torch:cpu", "--jobs", "1", "--json", str(tmp_path / "r.json"),
              "--report", str(report))
    assert r.returncode == 0, r.stderr
    res = json.loads((tmp_path / "r.json").read_text())
    assert [c.get("packed_on") for c in res["containers"]] == ["cpu", "torch:cpu"]
    assert sorted((x["container"].endswith("pk-torchcpu"), x["cell"], x["status"], x["values_differ"]) for x in res["results"]) == [
        (False, "reference", "verified", 0), (False, "solver-torch", "verified", 0),
        (True, "reference", "verified", 0), (True, "solver-torch", "verified", 0)]
    assert all(x["device"] == ("torch:cpu" if x["cell"] == "solver-torch" else "cpu") for x in res["results"])
    for x in res["results"]:
        if x["cell"] == "solver-torch":
            site = x["sites"][0]
            assert site["d"] == 24 and site["rounded_differ_outside_band"] == 0 and 0 <= site["dx_over_delta"] <= 1
    text = report.read_text()
    assert text.startswith("# Benchmarks\n\n## 7. Before\n\nkept\n\n## 8. Exact on every reader") and "| synthetic D=24 fp32 | 1 | ✓ | ✓ |" in text
    assert "| synthetic D=24 fp32, packed on torch:cpu | 1 | ✓ | ✓ |" in text
    sys.path.insert(0, str(TOOLS))
    from mdsection import write_section

    write_section(report, "\n".join(["## 8. Exact on every reader (format 1.2): the cross-reader matrix", "", "again"]),
                  "## 8. Exact on every reader (format 1.2): the cross-reader matrix")
    assert report.read_text() == "# Benchmarks\n\n## 7. Before\n\nkept\n\n## 8. Exact on every reader (format 1.2): the cross-reader matrix\n\nagain\n"


# ---------------------------------------------------------------- tools/bench (the package)

ROOT = TOOLS.parent


def _bench(module: str) -> ModuleType:
    """tools.bench.<module>, imported without writing bytecode into tools/."""
    saved = sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    try:
        return importlib.import_module(f"tools.bench.{module}")
    finally:
        sys.dont_write_bytecode = saved


def _bbformat_names(tree: ast.AST) -> set[str]:
    """Names a module binds to bbformat modules or to anything imported from them."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.asname or a.name.split(".")[0] for a in node.names if a.name.split(".")[0] == "bbformat"}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "bbformat":
            names |= {a.asname or a.name for a in node.names}
    return names


def _attribute_targets(tree: ast.AST) -> list[ast.Attribute]:
    targets: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets += node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets.append(node.target)
        elif isinstance(node, ast.Delete):
            targets += node.targets
    return [t for t in targets if isinstance(t, ast.Attribute)]


def test_bench_package_imports_and_patches_no_bbformat_module() -> None:
    """Every module of tools/bench imports; none calls setattr, mentions monkeypatching, or assigns
    an attribute of a bbformat module (it times the codec through rotation.linalg_clock)."""
    files = sorted((TOOLS / "bench").glob("*.py"))
    assert {f.stem for f in files} >= {"__init__", "__main__", "cli", "common", "report", "child", "smollm2", "table1", "scaling",
                                       "entropy", "speed", "residuals"}
    for f in files:
        if f.stem not in ("__init__", "__main__"):
            _bench(f.stem)
        text = f.read_text()
        assert "setattr(" not in text and "monkeypatch" not in text.lower() and "__dict__" not in text, f
        tree = ast.parse(text)
        bb = _bbformat_names(tree)
        patched = [ast.unparse(t) for t in _attribute_targets(tree) if isinstance(t.value, ast.Name) and t.value.id in bb]
        assert not patched, f"{f.name} assigns {patched}"
    assert len((TOOLS / "bench.py").read_text().splitlines()) <= 12  # the entry point only


def test_bench_refuses_an_unknown_section_from_the_package_entry_point(tmp_path: Path) -> None:
    r = _tool(str(TOOLS / "bench"), "--sections", "table1,bogus", "--work", str(tmp_path / "w"))
    assert r.returncode == 2 and "unknown bogus" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "w").exists()


def test_bench_report_keeps_other_tools_sections(tmp_path: Path) -> None:
    """The committed results rewrite sections 1 to 6 and the goals, with the run's machine and
    command under section 1's heading; a section before them (the summary) stays first, and
    sections the tool does not write (7 onward) stay, after the goals."""
    report = _bench("report")
    res = json.loads((TOOLS / "bench_results.json").read_text())
    out = tmp_path / "B.md"
    out.write_text("# Benchmarks\n\nold header\n\n## Summary\n\nkept s\n\n## 1. Old\n\ngone\n\n## 7. Scale\n\nkept 7\n## 8. Other\n\nkept 8\n")
    report.write_report(out, res, res["argv"])
    text = out.read_text()
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert [h[:5] for h in headings] == ["## Su", "## 1.", "## 2.", "## 3.", "## 4.", "## 5.", "## 6.", "## Go", "## 7.", "## 8."]
    assert "gone" not in text and "old header" not in text
    assert text.rstrip("\n").endswith("\n\n## 7. Scale\n\nkept 7\n\n## 8. Other\n\nkept 8")
    assert text.startswith("# Benchmarks\n\n## Summary\n\nkept s\n\n## 1. ")
    first = text.index("## 1. ")
    assert text[text.index("\n\n", first) + 2:].startswith(
        f"Machine: {res['machine']}.\n\nCommand: `python tools/bench.py {' '.join(res['argv'])}`")
    report.write_report(out, res, res["argv"])  # a second rewrite changes nothing
    assert out.read_text() == text


def test_linalg_clock_times_pack_and_changes_no_byte(tmp_path: Path) -> None:
    """rotation.linalg_clock (what the speed section's `pack linalg s` reads) sees the codec's linear
    algebra in every thread of pack, and the container is the same byte for byte with it on."""
    from bbformat.checkpoint import write_checkpoint
    from bbformat.codec import rotation as rot
    from bbformat.testing import make_tiny_checkpoint

    import bbformat

    speed = _bench("speed")
    src = tmp_path / "src"
    write_checkpoint(make_tiny_checkpoint("llama", seed=3, layers=2), src)
    bbformat.pack(src, tmp_path / "plain.bb", entropy="none")
    seconds = speed.pack_linalg_seconds(src, tmp_path / "clocked.bb", "none")
    assert (tmp_path / "plain.bb").read_bytes() == (tmp_path / "clocked.bb").read_bytes()
    assert seconds > 0
    names: list[str] = []
    with rot.linalg_clock(lambda name, s: names.append(name)):
        with pytest.raises(RuntimeError, match="already active"):
            with rot.linalg_clock(lambda name, s: None):
                pass
        rot.regenerate(*rot.eigh(rot.gram(np.eye(3))), False)
    rot.gram(np.eye(2))  # off again: not recorded
    assert names == ["gram", "eigh", "regenerate"]


def test_bench_child_runs_as_a_module(tmp_path: Path) -> None:
    """child.py's tasks are a module run with -m from the repository root, not code strings."""
    from conftest import sample_container

    path = tmp_path / "s.bb"
    path.write_bytes(sample_container())
    r = subprocess.run([sys.executable, "-m", "tools.bench.child", "stream-peak", str(path)], capture_output=True, text=True,
                       timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["model"] > 0 and 0 < got["largest_block"] <= got["model"] and got["growth"] >= 0
    r = subprocess.run([sys.executable, "-m", "tools.bench.child"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 2 and "usage" in r.stderr


# ---------------------------------------------------------------- tools/bench_gpu.py


def test_bench_gpu_runs_its_steps_through_the_torch_backend(tmp_path: Path) -> None:
    """tools/bench_gpu.py unchanged, on the tiny preset with --device torch:cpu (the GPU code path
    on the CPU): every step runs in its own process, the GPU-packed stand-in verifies on the
    device without a fallback and on the numpy reference, and section 12 is written."""
    import json

    report = tmp_path / "B.md"
    report.write_text("# Benchmarks\n")
    r = _tool(str(TOOLS / "bench_gpu.py"), "--work", str(tmp_path / "w"), "--quick", "--device", "torch:cpu", "--layers", "2",
              "--skip-cold", "--load-workers", "1", "--json", str(tmp_path / "r.json"), "--report", str(report))
    assert r.returncode == 0, r.stderr
    res = json.loads((tmp_path / "r.json").read_text())
    for step in ("pack", "verify_device", "verify_cpu", "load_model_cold", "load_model_warm", "st_load_warm", "unpack", "floors"):
        assert res[step]["ok"], (step, res[step])
    assert res["verify_device"]["report"]["exact"] is True and res["verify_device"]["report"]["fallback_chunks"] == []
    assert res["verify_device"]["report"]["device"] == "torch:cpu" and res["verify_cpu"]["report"]["exact"] is True
    assert res["load_model_warm"]["logits_finite"] and res["floors"]["sites"] >= 2
    assert res["determinism"] == {"ok": True, "dim": 64, "same": True, "sha256": res["determinism"]["sha256"]}
    text = report.read_text()
    assert "## 12. On a GPU" in text and "| every digest verified on the device, 0 fallbacks | met" in text
    # a partial checkpoint's pack time is a projection, never "met"
    assert "| pack --device of the full Llama-2-7B shape ≤ 300 s | not measured at the full shape" in text
    # the side rows: a process's memory floor, margins-off verify, load_model per worker count
    assert res["load_model_workers_1"]["ok"] and res["verify_device_nomargins"]["report"]["exact"] is True
    assert "after importing transformers and the sliced model" in text and "without measuring margins" in text and "| 1 | " in text
    # a second run merged into the first (--only: generate and pack alone), rendered with notes
    r = _tool(str(TOOLS / "bench_gpu.py"), "--work", str(tmp_path / "w"), "--quick", "--device", "torch:cpu", "--layers", "2",
              "--only", "none", "--merge", str(tmp_path / "r.json"), "--json", str(tmp_path / "r2.json"), "--report", str(report))
    assert r.returncode == 0, r.stderr
    both = json.loads((tmp_path / "r2.json").read_text())
    assert both["pack"] == res["pack"] and both["second_run"]["pack"]["ok"] and "verify_device" not in both["second_run"]
    notes = tmp_path / "notes.md"
    notes.write_text("\nA note by hand.\n")
    r = _tool(str(TOOLS / "bench_gpu.py"), "--render", str(tmp_path / "r2.json"), "--notes", str(notes), "--report", str(report))
    text = report.read_text()
    assert r.returncode == 0 and "A second run" in text and "A note by hand." in text and text.count("## 12.") == 1
    r = _tool(str(TOOLS / "bench_gpu.py"), "--not-run", "No GPU was lent to this session.", "--report", str(report))
    assert r.returncode == 0 and "**Not run.** No GPU was lent" in report.read_text() and report.read_text().count("## 12.") == 1


def test_gpu_fixtures_records_what_the_device_decoded(tmp_path: Path) -> None:
    """tools/gpu_fixtures.py on torch:cpu (the GPU code path): its manifest's tensor digests are
    what the numpy reference decodes from each file, and each file's sha256 is its bytes'."""
    import hashlib
    import json

    from bbformat.reader import Reader

    r = _tool(str(TOOLS / "gpu_fixtures.py"), str(tmp_path), "--device", "torch:cpu", "--layers", "1")
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "gpu_fixtures.json").read_text())
    assert doc["machine"]["device"] == "torch:cpu" and len(doc["files"]) == 4
    for name, entry in doc["files"].items():
        assert hashlib.sha256((tmp_path / name).read_bytes()).hexdigest() == entry["sha256"]
        with Reader(tmp_path / name) as rd:
            got = {n: hashlib.sha256(t.tobytes()).hexdigest() for b in rd.iter_blocks() for n, t in b.tensors.items()}
        assert entry["decoded_on_device"]["exact"] is True and got == entry["decoded_on_device"]["tensors"], name


def test_decode_split_accounts_for_the_whole_decode(tmp_path: Path) -> None:
    """tools/decode_split.py: per backend, the decode's seconds split into linear algebra and host."""
    from bbformat.checkpoint import write_checkpoint
    from bbformat.testing import make_tiny_checkpoint
    import bbformat

    write_checkpoint(make_tiny_checkpoint("llama", seed=1, layers=2), tmp_path / "src")
    bbformat.pack(tmp_path / "src", tmp_path / "m.bb")
    r = _tool(str(TOOLS / "decode_split.py"), str(tmp_path / "m.bb"), "--devices", "cpu,torch:cpu", "--share", "--peak")
    assert r.returncode == 0, r.stderr
    rows = [line.split("|") for line in r.stdout.splitlines()[2:]]
    assert [row[1].strip() for row in rows] == ["cpu", "torch:cpu"]
    for row in rows:
        total, la, host = float(row[2]), float(row[3].split()[0]), float(row[4])
        assert la >= 0 and host > 0 and abs(total - la - host) < 0.02 and row[3].count("/") == 2
        assert float(row[5]) > 0  # --peak: the largest block's numpy peak, MB


def test_exponent_study_measures_known_sources() -> None:
    """tools/exponent_study.py on bf16 patterns with exactly 4 equally frequent exponents and a
    column-determined exponent: the ideal order-0 row is 2 bits a value, the adaptive and real
    coders land just above it, and a column context takes the exponent to almost nothing."""
    import zstandard

    sys.path.insert(0, str(TOOLS))
    import exponent_study as es

    zstd = {lvl: zstandard.ZstdCompressor(level=lvl) for lvl in (3, 19)}
    rng = np.random.default_rng(0)
    rows, cols = 256, 512
    exp = rng.permutation(np.repeat(np.arange(120, 124), rows * cols // 4)).reshape(rows, cols)
    bits = ((rng.integers(0, 2, exp.shape) << 15) | (exp << 7) | rng.integers(0, 128, exp.shape)).astype(np.uint16)
    r = es.study_tensor(bits, "bfloat16", zstd)
    n = rows * cols
    assert r["order0-ideal"] == pytest.approx(2 * n)
    assert 2 * n < r["order0-adaptive"] < 2 * n + 2000
    try:
        import constriction  # noqa: F401  (optional: the study's rANS row)

        assert 2 * n < r["rans-static-order0"] < 2.01 * n + 100
    except ImportError:
        assert np.isnan(r["rans-static-order0"])
    assert r["sign_mant_raw"] == 8 * n and r["plain"] == 16 * n
    by_col = np.broadcast_to(120 + (np.arange(cols) * 4 // cols)[None, :], (rows, cols))  # the exponent follows the column
    bits2 = ((by_col << 7) | rng.integers(0, 128, (rows, cols))).astype(np.uint16)
    r2 = es.study_tensor(bits2, "bfloat16", zstd)
    assert r2["order0-ideal"] == pytest.approx(2 * n)
    assert r2["ctx-column-class"] < 0.1 * r2["order0-ideal"]


def test_bench_entropy_writes_its_table(tmp_path: Path) -> None:
    """tools/bench_entropy.py --quick on two tiny slices: every input's table, its goals marked,
    and the section written into a report; ZipNN's bfloat16 input rewriting is worked around."""
    for dtype in ("float16", "float32"):
        r = _tool(str(TOOLS / "make_tiny.py"), "--dtype", dtype, "--layers", "1", "--hidden", "32", "--heads", "4", "--kv-heads", "2",
                  "--vocab", "64", str(tmp_path / dtype))
        assert r.returncode == 0, r.stderr
    report = tmp_path / "B.md"
    report.write_text("# B\n")
    r = _tool(str(TOOLS / "bench_entropy.py"), "--f16", str(tmp_path / "float16"), "--f32", str(tmp_path / "float32"), "--quick",
              "--repeats", "2", "--rounds", "3", "--report", str(report), "--json", str(tmp_path / "b.json"))
    assert r.returncode == 0, r.stderr
    text = report.read_text()
    assert "is the best of 2 passes" in text
    assert text.count("| `--scheme none` (entropy auto, format 1.5) |") == 3 and "bits per weight" in text
    saved = json.loads((tmp_path / "b.json").read_text())
    res = saved["inputs"]
    for inp in res:
        rows = {x["key"]: x for x in inp["rows"]}
        assert set(rows) >= {"none", "sym_raw", "sym", "zstd", "ideal"} and rows["none"]["codecs"]
        assert all(rows[k]["entropy_decode_s"] > 0 and rows[k]["entropy_decode_parts_s"] > 0 for k in ("none", "sym"))
        assert 0 < rows["ideal"]["bytes"] < inp["plain_bytes"] and all(x["bytes"] > 0 for x in rows.values() if x["bytes"] is not None)
    assert text.count("**met**") + text.count("**missed**") >= 6
    assert all(inp["decode_repeats"] == 2 for inp in res)
    if importlib.util.find_spec("zipnn") is not None:  # passes in turn, and the goal read from them
        assert all(len(v) == 3 and min(v) > 0 for inp in res for v in inp["head_to_head"].values())
        assert text.count("Head to head: 3 rounds") == 3 and text.count("best of 3 passes each, taken in turn") == 3
        assert all({"bbformat memory one", "bbformat memory blocks"} <= inp["head_to_head"].keys() for inp in res)
        assert text.count("both decoding from compressed bytes in memory") == 3
    else:
        assert all(inp["head_to_head"] == {} for inp in res)
    # --from-json states the run's machine, date and command, not those of the rewrite
    saved["run"].update(machine="Elsewhere CPU, 3 cores", date="2001-02-03")
    (tmp_path / "c.json").write_text(json.dumps(saved))
    r = _tool(str(TOOLS / "bench_entropy.py"), "--from-json", str(tmp_path / "c.json"), "--report", str(report))
    assert r.returncode == 0, r.stderr
    again = report.read_text()
    assert "Machine: Elsewhere CPU, 3 cores. Command: `python tools/bench_entropy.py --f16 " in again and "(2001-02-03)" in again
    assert again.count("| `--scheme none` (entropy auto, format 1.5) |") == 3 and time.strftime("(%Y-%m-%d)") not in again
    (tmp_path / "d.json").write_text(json.dumps(res))  # measurements without their run record
    r = _tool(str(TOOLS / "bench_entropy.py"), "--from-json", str(tmp_path / "d.json"))
    assert r.returncode == 2 and "no run record" in r.stderr


def test_bench_parts_writes_its_table(tmp_path: Path) -> None:
    """tools/bench_parts.py on a tiny model: both formats packed, verified and timed in each
    decode mode, the section written into a report."""
    report = tmp_path / "B.md"
    report.write_text("# B\n")
    r = _tool(str(TOOLS / "bench_parts.py"), "--preset", "tiny-llama", "--layers", "1", "--repeats", "1", "--no-zipnn",
              "--work", str(tmp_path / "w"), "--report", str(report), "--json", str(tmp_path / "p.json"))
    assert r.returncode == 0, r.stderr
    res = json.loads((tmp_path / "p.json").read_text())
    rows = {x["key"]: x for x in res["rows"]}
    assert set(rows) == {"1.4", "1.5"} and all(rows[k]["decode_parts_s"] > 0 and rows[k]["bytes"] > 0 for k in rows)
    text = report.read_text()
    assert "## 17. Parts (format 1.5)" in text and "| format 1.5: payloads over 2^21 symbols cut into parts |" in text


def test_bench_read_times_every_way_of_reading_and_writes_its_section(tmp_path: Path) -> None:
    """tools/bench_read.py on a small container whose payloads are zstd frames: every way of
    reading gives the same payloads (the tool checks), each is timed, the section is written."""
    from conftest import sample_container

    path = tmp_path / "s.bb"
    path.write_bytes(sample_container(entropy="zstd", format_version="1.2"))
    report = tmp_path / "B.md"
    report.write_text("# B\n\n## 17. Other\n\nkept\n")
    r = _tool(str(TOOLS / "bench_read.py"), str(path), "--rounds", "2", "--json", str(tmp_path / "r.json"), "--report", str(report))
    assert r.returncode == 0, r.stderr
    (res,) = json.loads((tmp_path / "r.json").read_text())["results"]
    assert set(res["times"]) == {"default", "writable", "writable, mapping (before)", "zstd decompressobj (before)"}
    assert all(len(v) == 2 and min(v) > 0 for v in res["times"].values())
    text = report.read_text()
    assert "## 17. Other\n\nkept" in text and "## 18. Reading chunks" in text and "| zstd decompressobj (before) |" in text
    (tmp_path / "bad.bb").write_bytes(b"not a container")
    for bad in ("missing.bb", "bad.bb"):
        r = _tool(str(TOOLS / "bench_read.py"), str(tmp_path / bad))
        assert r.returncode == 2 and r.stderr.startswith("bench_read: ") and "Traceback" not in r.stderr, r.stderr


def test_pop_precision_study_measures_a_symmetric_container_and_refuses_one_without_sites(tmp_path: Path) -> None:
    """tools/pop_precision_study.py decodes a container with a rotation site and gives, per
    fixed-point precision P, the share of values a reader would regenerate wrongly: a share that
    can only grow with P (the tolerance halves each bit). A file without sites, and a missing
    file, are refused with one line and exit status 2."""
    from conftest import sample_container

    path = tmp_path / "s.bb"
    path.write_bytes(sample_container(format_version="1.5"))
    r = _tool(str(TOOLS / "pop_precision_study.py"), str(path), "--json", str(tmp_path / "p.json"))
    assert r.returncode == 0, r.stderr
    res = json.loads((tmp_path / "p.json").read_text())[str(path)]
    assert res["sites"] == 1 and res["values"] == 24 * 25 // 2 and res["dims"] == [24]
    shares = [v["wrong_share"] for v in res["precisions"].values()]
    assert all(0 <= a <= b <= 1 for a, b in zip(shares, shares[1:])) and "| P (fixed-point bits) |" in r.stdout
    from bbformat.codec.dtypes import RawTensor
    from bbformat.codec.encoder import encode_chunk
    from bbformat.codec.layout import ChunkLayout
    from bbformat.writer import Writer

    plain = tmp_path / "plain.bb"
    with open(plain, "wb") as f:
        w = Writer(f, "symmetric", 1, {"format": "bbformat", "scheme": "symmetric", "tolerance": 0.0}, format_version="1.5")
        w.add_encoded(encode_chunk(ChunkLayout("b", ("bias",), ()), {"bias": RawTensor.from_f64(np.ones((3, 4)), "float32")}, {},
                                   "symmetric", 0.0, band=True, bands=True))
        w.close()
    for bad, why in ((plain, "no rotation site"), (tmp_path / "missing.bb", "no such file")):
        r = _tool(str(TOOLS / "pop_precision_study.py"), str(bad))
        assert r.returncode == 2 and why in r.stderr and "Traceback" not in r.stderr


DATA_FILES = ("calib.txt", "eval.txt", "README.md", "LICENSE-PSF.txt", "SHA256SUMS")


def test_text_data_is_in_the_repository_with_its_licence_and_checksums() -> None:
    """tools/data/ holds the texts the real-model tools read, their PSF licence, and sha256 sums
    that match both the files and the README's table (expected values from the source's README)."""
    import hashlib

    data = TOOLS / "data"
    expected = {"eval.txt": ("8b156b176e2c3eabb6ea86afea29302078cea08b96d85d52bff5b8093851487f", 1_000_048),
                "calib.txt": ("5b00cbbdfbf5fcbe636f8da4833127e9cdd6fe3910225cb0b50802d94fa32cb6", 200_008)}
    sums = dict(reversed(line.split()) for line in (data / "SHA256SUMS").read_text().splitlines())
    readme = (data / "README.md").read_text(encoding="utf-8")
    for name, (digest, size) in expected.items():
        raw = (data / name).read_bytes()
        assert len(raw) == size and hashlib.sha256(raw).hexdigest() == digest == sums[name]
        assert digest in readme and f"{size:,}" in readme
        raw.decode("utf-8")  # the tools read it as UTF-8
    assert "PYTHON SOFTWARE FOUNDATION LICENSE VERSION 2" in (data / "LICENSE-PSF.txt").read_text(encoding="utf-8")
    assert "Python Software Foundation License" in readme and "LICENSE-PSF.txt" in readme


def test_text_data_is_not_gitignored() -> None:
    """A fresh clone gets tools/data/: git ignores none of its files."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    r = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "--no-index", *(f"tools/data/{n}" for n in DATA_FILES)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stdout == "", r.stdout  # 1: no path is ignored


def test_real_model_tools_default_to_the_repositorys_texts() -> None:
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import slice, evaluate, bench_hf, tc_interop; "
            "print(slice.build_parser().get_default('calib')); print(evaluate.build_parser().get_default('text')); "
            "print(tc_interop.build_parser().get_default('smol_text')); print(bench_hf.DATA)")
    r = subprocess.run([sys.executable, "-c", code, str(TOOLS)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    data = (TOOLS / "data").resolve()
    assert r.stdout.split("\n")[:4] == [str(data / "calib.txt"), str(data / "eval.txt"), str(data / "eval.txt"), str(data)]


@pytest.mark.parametrize("tool, args, option", [
    ("slice.py", ["smollm2", "--sparsity", "0.25", "--out", "{tmp}/out", "--calib", "{missing}"], "--calib"),
    ("evaluate.py", ["smollm2", "--text", "{missing}"], "--text"),
    ("bench_hf.py", ["--work", "{tmp}/out", "--text", "{missing}"], "--text"),
    ("tc_interop.py", ["--tc-src", "{tmp}", "--tc-python", "python", "--work", "{tmp}/out", "--smol-text", "{missing}"], "--smol-text"),
])
def test_real_model_tools_refuse_a_missing_text_in_one_line(tmp_path: Path, tool: str, args: list[str], option: str) -> None:
    """A missing text file is one line on stderr and exit status 1, before any model loads or output is made."""
    missing = tmp_path / "none.txt"
    r = _tool(str(TOOLS / tool), *(s.format(tmp=tmp_path, missing=missing) for s in args))
    assert r.returncode == 1, r.stderr
    assert r.stderr == f"{tool[:-3]}: {option} {missing} does not exist\n"
    assert not (tmp_path / "out").exists()


def test_text_reader_refuses_a_directory_and_non_utf8_in_one_line(tmp_path: Path) -> None:
    sys.path.insert(0, str(TOOLS))
    try:
        import textdata
    finally:
        sys.path.remove(str(TOOLS))
    with pytest.raises(SystemExit, match=rf"^t: --x {tmp_path} is not a file$"):
        textdata.read_text(tmp_path, "t", "--x")
    bad = tmp_path / "latin1.txt"
    bad.write_bytes(b"caf\xe9\n")
    with pytest.raises(SystemExit, match=r"^t: cannot read --x .*latin1\.txt: 'utf-8' codec can't decode"):
        textdata.read_text(bad, "t", "--x")
    good = tmp_path / "ok.txt"
    good.write_text("prose\n", encoding="utf-8")
    assert textdata.read_text(good, "t", "--x") == "prose\n"


def test_profile_pack_splits_the_pack_into_steps_and_writes_the_same_bytes(tmp_path: Path) -> None:
    """tools/profile_pack.py: one sequential pack, profiled; its steps share out the profiled CPU
    time (the linear algebra apart), the container is the threaded pack's byte for byte, and
    --table renders a before/after pair."""
    import os

    import bbformat
    from bbformat.checkpoint import write_checkpoint
    from bbformat.testing import make_tiny_checkpoint

    src = tmp_path / "src"
    write_checkpoint(make_tiny_checkpoint("llama", seed=4, layers=2, dtype="bfloat16"), src)
    env = dict(os.environ, PYTHONPATH=str(TOOLS.parent))
    p = subprocess.run([sys.executable, str(TOOLS / "profile_pack.py"), str(src), str(tmp_path / "p.bb"), str(tmp_path / "p.json")],
                       capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stderr
    res = json.loads((tmp_path / "p.json").read_text())
    steps = res["steps"]
    assert steps["linear algebra"] > 0 and steps["payload: codec 3 (exponent)"] > 0 and steps["simulated decode: round regenerated X"] > 0
    assert 0.5 * res["cpu"] < sum(steps.values()) <= 1.01 * res["cpu"]
    assert abs(res["host"] - (sum(steps.values()) - steps["linear algebra"])) < 1e-6
    bbformat.pack(src, tmp_path / "t.bb")
    assert (tmp_path / "p.bb").read_bytes() == (tmp_path / "t.bb").read_bytes()
    t = subprocess.run([sys.executable, str(TOOLS / "profile_pack.py"), "--table", str(tmp_path / "p.json"), str(tmp_path / "p.json")],
                       capture_output=True, text=True, timeout=60)
    assert t.returncode == 0 and "| **host total** | **" in t.stdout and "(1.00×)" in t.stdout


def test_bench_readahead_times_every_configuration(tmp_path: Path) -> None:
    """tools/bench_readahead.py on a tiny packed Llama: every configuration timed each round,
    the section written with its goal line."""
    import bbformat
    from bbformat.checkpoint import write_checkpoint
    from bbformat.testing import make_tiny_checkpoint

    write_checkpoint(make_tiny_checkpoint("llama", seed=2, layers=2, hidden=32), tmp_path / "src")
    bbformat.pack(tmp_path / "src", tmp_path / "m.bb")
    report = tmp_path / "B.md"
    report.write_text("# Benchmarks\n")
    r = _tool(str(TOOLS / "bench_readahead.py"), str(tmp_path / "m.bb"), "--rounds", "2", "--json", str(tmp_path / "r.json"),
              "--report", str(report))
    assert r.returncode == 0, r.stderr
    res = json.loads((tmp_path / "r.json").read_text())
    assert len(res["times"]) == 7 and all(len(v) == 2 and min(v) > 0 for v in res["times"].values())
    text = report.read_text()
    assert "## 22. One decode worker reading ahead" in text and "- two threads ≤ 0.55× one" in text


def test_bench_load_times_each_load_in_turn(tmp_path: Path) -> None:
    """tools/bench_load.py on a tiny plain Llama: load_model and the safetensors baseline, each
    round in a fresh process, the section written with its goal lines."""
    pytest.importorskip("transformers")
    import torch
    import transformers

    import bbformat

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        max_position_embeddings=32, tie_word_embeddings=False))
    model.to(torch.bfloat16).save_pretrained(str(tmp_path / "src"))
    bbformat.pack(tmp_path / "src", tmp_path / "m.bb")
    report = tmp_path / "B.md"
    report.write_text("# Benchmarks\n")
    r = _tool(str(TOOLS / "bench_load.py"), "--case", "tiny", str(tmp_path / "m.bb"), str(tmp_path / "src"), "--rounds", "2",
              "--warm-only", "--json", str(tmp_path / "r.json"), "--report", str(report))
    assert r.returncode == 0, r.stderr
    res = json.loads((tmp_path / "r.json").read_text())
    for variants in res["cases"]["tiny"]["times"].values():
        assert sorted(variants) == ["after", "safetensors"]
        assert all(len(runs) == 2 and all(x["s"] > 0 and x["model"] > 0 for x in runs) for runs in variants.values())
    text = report.read_text()
    assert "## 23. Loading into a model without a copy" in text and "- `load_model` (after) ≤ 1.5× the baseline" in text


def test_bench_budget_decodes_each_configuration_in_turn(tmp_path: Path) -> None:
    """tools/bench_budget.py on a conformance model: every worker count with and without a
    budget, each in a fresh process, the section written with its goal lines."""
    src = TOOLS.parent / "conformance" / "valid" / "model_llama_sym.bb"
    report = tmp_path / "B.md"
    report.write_text("# Benchmarks\n")
    r = _tool(str(TOOLS / "bench_budget.py"), str(src), "--workers", "1,2", "--fits", "1", "--rounds", "1",
              "--json", str(tmp_path / "r.json"), "--report", str(report))
    assert r.returncode == 0, r.stderr
    m = json.loads((tmp_path / "r.json").read_text())["measured"]
    assert sorted(m["runs"]) == ["1|1", "1|none", "2|1", "2|none"] and m["budgets"]["1"] == max(m["working_sets"])
    assert all(len(runs) == 1 and runs[0]["s"] > 0 and runs[0]["decoded"] > 0 for runs in m["runs"].values())
    text = report.read_text()
    assert "## 24. Decode workers within a memory budget" in text and "- no budget: peak growth 1 → 2 workers" in text


def test_bench_scaling_times_each_phase_in_every_round(tmp_path: Path) -> None:
    """tools/bench_scaling.py on a conformance model: alone, two threads and two processes in
    every round, each pass timed with its user and system seconds, the section written with
    its goal line."""
    src = TOOLS.parent / "conformance" / "valid" / "model_llama_sym.bb"
    report = tmp_path / "B.md"
    report.write_text("# Benchmarks\n")
    r = _tool(str(TOOLS / "bench_scaling.py"), str(src), "--rounds", "2", "--json", str(tmp_path / "r.json"),
              "--report", str(report))
    assert r.returncode == 0, r.stderr
    runs = json.loads((tmp_path / "r.json").read_text())["measured"]["model_llama_sym.bb"]
    assert sorted(runs) == ["alone", "processes", "threads"] and all(len(v) == 2 for v in runs.values())
    passes = runs["alone"] + runs["threads"] + [x for pair in runs["processes"] for x in pair]
    assert all(p["s"] > 0 and p["user"] >= 0 and p["sys"] >= 0 for p in passes) and len(runs["processes"][0]) == 2
    text = report.read_text()
    assert "## 25. Two decode threads against two processes" in text and "- two threads ≤ 0.55× one (issue 39), model_llama_sym.bb:" in text


def test_first_pass_stops_each_pass_at_its_first_gram(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tools/first_pass.py: every process times every pass, and a pass stops at its first Gram
    matrix (the conformance model's whole decode computes several)."""
    src = TOOLS.parent / "conformance" / "valid" / "model_llama_sym.bb"
    r = _tool(str(TOOLS / "first_pass.py"), str(src), "--processes", "2", "--passes", "2", "--json", str(tmp_path / "r.json"))
    assert r.returncode == 0, r.stderr
    runs = json.loads((tmp_path / "r.json").read_text())["runs"][0]["processes"]
    assert len(runs) == 2 and all(len(p) == 2 for p in runs)
    assert all(p["s"] > 0 and p["user"] >= 0 and p["sys"] >= 0 and p["minflt"] >= 0 and p["reported_mib"] >= 0
               and p["reported_before_mib"] >= 0 for ps in runs for p in ps)
    monkeypatch.syspath_prepend(str(TOOLS))
    import first_pass
    from bbformat.codec import linalg

    seen: list[int] = []

    class Counting(linalg.NumpyLinalg):
        def __setattr__(self, name: str, value: object) -> None:
            if name == "gram":
                def counted(m: object, _inner: object = value) -> object:
                    seen.append(1)
                    return _inner(m)  # type: ignore[operator]
                value = counted
            super().__setattr__(name, value)

    monkeypatch.setattr(linalg, "NumpyLinalg", Counting)
    assert len(first_pass.child(str(src), 3)) == 3 and len(seen) == 3


@pytest.mark.parametrize("args", [["MISSING"], ["NOT_BB"], ["SRC", "--passes", "0"], ["SRC", "--idle", "-1"]])
def test_first_pass_refuses_bad_input_in_one_line(tmp_path: Path, args: list[str]) -> None:
    src = TOOLS.parent / "conformance" / "valid" / "model_llama_sym.bb"
    (tmp_path / "x.bb").write_bytes(b"not a container")
    paths = {"MISSING": str(tmp_path / "none.bb"), "NOT_BB": str(tmp_path / "x.bb"), "SRC": str(src)}
    r = _tool(str(TOOLS / "first_pass.py"), *[paths.get(a, a) for a in args])
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and "Traceback" not in r.stderr and lines, r.stderr
    if args[0] == "SRC":  # a bad flag: argparse's usage, then one line that names it
        assert lines[-1].startswith("first_pass.py: error: argument --") and ("at least 1" in lines[-1] or "0 or more" in lines[-1])
    else:  # a bad file: one line that names it
        assert len(lines) == 1 and lines[0].startswith(f"first_pass: {paths[args[0]]}: ")


def test_section_zstd_prices_the_side_sections_of_a_pack(tmp_path: Path) -> None:
    """tools/section_zstd.py: the file it packed is pack's own (same size), the writer's setting
    and each level price the same inputs, none stored above raw; a bad --levels is one line."""
    import bbformat
    from bbformat.checkpoint import write_checkpoint
    from bbformat.testing import make_tiny_checkpoint

    src = tmp_path / "src"
    write_checkpoint(make_tiny_checkpoint("llama", seed=6, layers=2, dtype="bfloat16"), src)
    r = _tool(str(TOOLS / "section_zstd.py"), str(src), "--levels", "19,3", "--json", str(tmp_path / "z.json"))
    assert r.returncode == 0, r.stderr
    res = json.loads((tmp_path / "z.json").read_text())
    bbformat.pack(src, tmp_path / "t.bb")
    assert res["file_bytes"] == (tmp_path / "t.bb").stat().st_size
    assert res["writer_params"] == {"strategy": 8, "window_log": 20, "chain_log": 16, "hash_log": 16,  # zstd's btultra = 8
                                    "search_log": 1, "min_match": 3, "target_length": 64}
    assert res["inputs"] > 0 and set(res["settings"]) == {"writer", "level 19", "level 3"}
    assert all(0 < s["stored"] <= res["input_bytes"] for s in res["settings"].values())
    bad = _tool(str(TOOLS / "section_zstd.py"), str(src), "--levels", "high")
    assert bad.returncode == 2 and "integers separated by commas" in bad.stderr and "Traceback" not in bad.stderr


def test_skip_planes_counts_what_each_margin_would_skip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tools/skip_planes.py: summary() on rows worked by hand, then a real pack whose parts'
    estimates come out near the codecs' own sizes."""
    monkeypatch.syspath_prepend(str(TOOLS))
    import skip_planes
    from bbformat.checkpoint import write_checkpoint
    from bbformat.testing import make_tiny_checkpoint

    rows = [{"symbols": 10, "est_planes": 110.0, "est_exponent": 100.0, "planes": 90.0, "exponent": 100.0},  # ratio 1.10, codec 2 wins
            {"symbols": 20, "est_planes": 104.0, "est_exponent": 100.0, "planes": 120.0, "exponent": 100.0},  # 1.04, codec 3 wins
            {"symbols": 40, "est_planes": 90.0, "est_exponent": 100.0, "planes": 95.0, "exponent": 100.0},  # 0.90, codec 2 wins
            {"symbols": 80, "est_planes": 150.0, "est_exponent": 100.0, "planes": 150.0, "exponent": 100.0, "planes_block": True}]  # never skipped
    rows = [{"planes_block": False, **r} for r in rows]
    s = skip_planes.summary(rows, [0.0, 0.05, 0.2])
    assert s["parts"] == 4 and s["codec 2 smaller"] == 2
    assert s["highest estimated ratio where codec 2 wins"] == pytest.approx(1.10)
    assert s["estimate/actual, codec 2"] == pytest.approx(454 / 455)
    m = s["margins"]
    assert (m["0.0"]["skipped"], m["0.0"]["skipped_symbols"], m["0.0"]["lost_parts"], m["0.0"]["lost_bytes"]) == (2, 30, 1, 10 / 8)
    assert (m["0.05"]["skipped"], m["0.05"]["lost_parts"]) == (1, 1) and m["0.2"]["skipped"] == 0

    src = tmp_path / "src"
    write_checkpoint(make_tiny_checkpoint("llama", seed=5, layers=1, vocab=4096, dtype="float16"), src)
    parts = skip_planes.parts_of(str(src))
    assert parts and all(0.9 < r["est_planes"] / r["planes"] < 1.1 and 0.9 < r["est_exponent"] / r["exponent"] < 1.1 for r in parts)
    assert sum(r["symbols"] for r in parts) >= 4096 * 64  # the embedding's payload at least


def test_pack_timeline_splits_a_pack_at_its_linear_algebra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tools/pack_timeline.py: overlapping calls merged and samples classed by hand-made
    intervals; then a real pack of a tiny checkpoint whose parts add up to its wall time."""
    monkeypatch.syspath_prepend(str(TOOLS))
    import pack_timeline
    from bbformat.checkpoint import write_checkpoint
    from bbformat.testing import make_tiny_checkpoint

    assert pack_timeline.union([(0.0, 1.0), (0.5, 2.0), (3.0, 4.0)]) == [(0.0, 2.0), (3.0, 4.0)]
    samples = [(0.5, {"main": "a"}), (2.5, {"main": "b", "w": "c"}), (3.5, {"main": "d"}), (4.5, {"main": "b"})]
    r = pack_timeline.report(5.0, [(0.0, 1.0), (0.5, 2.0), (3.0, 4.0)], samples, top=5)
    assert r["linalg_union_s"] == 3.0 and r["rest_s"] == 2.0 and r["rest_samples"] == 2
    assert r["rest_by_thread"] == {"main": [("b", 2)], "w": [("c", 1)]}
    assert r["largest_gaps_s"] == [[2.0, 1.0, [("b", 1)]], [4.0, 1.0, [("b", 1)]]] and r["linalg_sum_s"] == 3.5

    src = tmp_path / "src"
    write_checkpoint(make_tiny_checkpoint("llama", seed=7, layers=2), src)
    r = _tool(str(TOOLS / "pack_timeline.py"), str(src), "--interval", "0.005", "--json", str(tmp_path / "t.json"))
    assert r.returncode == 0, r.stderr
    res = json.loads((tmp_path / "t.json").read_text())
    assert res["linalg_calls"] > 0 and 0 < res["linalg_union_s"] <= res["linalg_sum_s"] and res["linalg_union_s"] < res["wall_s"]
    assert res["samples"] > 0 and "main" in res["rest_by_thread"] and res["largest_gaps_s"]
    bad = _tool(str(TOOLS / "pack_timeline.py"), str(src), "--interval", "0")
    assert bad.returncode == 2 and "--interval must be above 0" in bad.stderr

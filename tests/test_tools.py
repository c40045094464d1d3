"""The measurement tools added for issues #5 and #6 run, write their reports, and refuse bad
input with one line."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
    """tools/crosscheck.py on one synthetic D=24 site: the reference and one other eigensolver both
    verify the 1.2 file's digest, and section 8 is appended to the report (then replaced, not doubled)."""
    import json

    report = tmp_path / "B.md"
    report.write_text("# Benchmarks\n\n## 7. Before\n\nkept\n")
    r = _tool(str(TOOLS / "crosscheck.py"), "--work", str(tmp_path / "w"), "--dims", "24", "--dtypes", "float32", "--versions", "1.2",
              "--no-smollm2", "--cells", "solver-numpy-upper", "--jobs", "1", "--json", str(tmp_path / "r.json"), "--report", str(report))
    assert r.returncode == 0, r.stderr
    res = json.loads((tmp_path / "r.json").read_text())
    assert [(x["cell"], x["status"], x["values_differ"]) for x in res["results"]] == [("reference", "verified", 0),
                                                                                     ("solver-numpy-upper", "verified", 0)]
    site = res["results"][1]["sites"][0]
    assert site["d"] == 24 and site["rounded_differ_outside_band"] == 0 and 0 <= site["dx_over_delta"] <= 1
    text = report.read_text()
    assert text.startswith("# Benchmarks\n\n## 7. Before\n\nkept\n\n## 8. Exact on every reader") and "| synthetic D=24 fp32 | 1 | ✓ | ✓ |" in text
    sys.path.insert(0, str(TOOLS))
    from crosscheck import replace_section

    replace_section(report, ["## 8. Exact on every reader (format 1.2): the cross-reader matrix", "", "again"])
    assert report.read_text() == "# Benchmarks\n\n## 7. Before\n\nkept\n\n## 8. Exact on every reader (format 1.2): the cross-reader matrix\n\nagain\n"

"""tools/tc_interop.py: the pieces that need neither TransformerCompression nor its venv
(argument parsing, the report), fast; the harness itself runs only under -m slow, and only
where TC's checkout and its venv exist (TC_SRC, TC_PYTHON)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parent.parent / "tools"
sys.path.insert(0, str(TOOLS))

import tc_interop  # noqa: E402
from mdsection import replace_section  # noqa: E402

ROW = {
    "arch": "phi2", "label": "Phi-2", "model_name": "microsoft/phi-2", "dtype": "fp32", "pack_rc": 0, "pack_verify_ok": True,
    "container_bytes": 900, "tc_pt_bytes": 1000, "side_files_identical": True, "errors": [], "ref_max_abs_logit": 0.5,
    "tc_reload_tc": {"max_abs": 0.0123, "top1": 1.0}, "tc_reload_unpacked": {"max_abs": 0.0125, "top1": 0.9921875},
    "tc_reload_unpacked_ckpt_dtype": {"max_abs": 1.5e-6, "top1": 1.0}, "load_model": {"error": "ValueError: a|b"},
}
RESULT = {
    "machine": "Some CPU, 2 cores, 8 GiB RAM; Python 3.11.7, numpy 2.0", "date": "2026-01-01", "command": "python tools/tc_interop.py",
    "tc": {"commit": "6b12cdee", "commit_date": "2024-05-17"}, "sparsity": 0.25, "ids_shape": "4×32",
    "versions": {"tc_side": {"transformers": "4.41.0", "datasets": "2.18.0", "torch": "2.13.0+cpu", "python": "3.11.7"},
                 "ours": {"bbformat": "1.2.0", "transformers": "5.0", "torch": "2.13.0+cpu", "python": "3.11.7"}},
    "rows": [ROW, {"arch": "opt", "label": "OPT", "model_name": "facebook/opt-x", "dtype": "fp16", "pack_rc": 3,
                   "pack_verify_ok": False, "errors": ["bbformat pack --verify exited 3: nope"]}],
    "smollm2": {"stem": "SmolLM2-135M-Instruct_0.25", "tc_model_name": "meta-llama/Llama-2/../SmolLM2-135M-Instruct",
                "tokens": 8192, "windows": 8, "window": 1024, "same_token_ids": True, "tc_rope_theta": 100000.0,
                "pack_verify_ok": True, "side_files_identical": True, "errors": [], "ppl_gap": 0.004,
                "models": [{"what": "TC", "perplexity": 30.1234, "tc_evaluate_ppl": 30.1299},
                           {"what": "bbformat `load_model(.bb, float32)`", "perplexity": 30.1274, "max_abs": 0.05, "top1": 0.998}]},
}


def test_parse_args_defaults_and_lists():
    a = tc_interop.parse_args(["--tc-src", "/x", "--tc-python", "/y/python", "--arches", "opt,phi3", "--dtypes", "fp32"])
    assert a.arches == ["opt", "phi3"] and a.dtypes == ["fp32"] and a.sparsity == 0.25 and not a.no_smollm2
    a = tc_interop.parse_args(["--tc-src", "/x", "--tc-python", "p"])
    assert a.arches == list(tc_interop.ARCHES) and a.dtypes == ["fp16", "fp32"]


@pytest.mark.parametrize("argv", [[], ["--tc-src", "/x"], ["--tc-src", "/x", "--tc-python", "p", "--arches", "gpt2"],
                                  ["--tc-src", "/x", "--tc-python", "p", "--dtypes", "bf16"], ["--render-only"]])
def test_parse_args_refuses(argv, capsys):
    with pytest.raises(SystemExit) as e:
        tc_interop.parse_args(argv)
    assert e.value.code == 2


def test_model_names_pick_tc_adapters():
    """The names TC's adapters accept (prefix tests in its adapters' _from_pretrained)."""
    names = {k: v["model"] for k, v in tc_interop.ARCHES.items()}
    assert names["opt"].startswith("facebook/opt")
    assert names["llama2"].startswith("meta-llama/Llama-2") and names["llama3"].startswith("meta-llama/Meta-Llama-3")
    assert names["phi2"] == "microsoft/phi-2" and names["phi3"].startswith("microsoft/Phi-3-mini-4k-instruct")
    smol = tc_interop.SMOL_TC_NAME.format(name="SmolLM2-135M-Instruct")
    assert smol.startswith("meta-llama/Llama-2") and Path(smol).name == "SmolLM2-135M-Instruct"


def test_render_section():
    md = tc_interop.render_section(RESULT)
    assert md.startswith(tc_interop.SECTION + "\n")
    assert "Some CPU, 2 cores" in md and "`6b12cdee`" in md and "transformers 4.41.0" in md
    line = next(ln for ln in md.splitlines() if ln.startswith("| Phi-2 |"))
    assert "| ok | 900 | 1,000 | 0.900 | identical | 0.5 | 0.0123 / 100.0% | 0.0125 / 99.2% | 1.5e-06 / 100.0% |" in line
    assert "fp32 TC, ckpt dtype 3e-06 (unit roundoff 6e-08)" in md
    assert "failed: ValueError: a\\|b" in line
    assert "**failed** (exit 3)" in md and "- OPT fp16: bbformat pack --verify exited 3: nope" in md
    assert "| 30.1234 | 30.1299 |" in md and "= 0.0040: within 0.02" in md


def test_replace_section_appends_then_replaces():
    text = "# T\n\n## 10. Ten\n\nbody\n"
    once = replace_section(text, tc_interop.SECTION + "\n\nv1\n", tc_interop.SECTION)
    assert once == text + "\n" + tc_interop.SECTION + "\n\nv1\n"
    twice = replace_section(once + "\n## 12. Later\n\nkeep\n", tc_interop.SECTION + "\n\nv2\n", tc_interop.SECTION)
    assert twice == text + "\n" + tc_interop.SECTION + "\n\nv2\n\n## 12. Later\n\nkeep\n"


def test_render_only_writes_the_report(tmp_path):
    js, md = tmp_path / "r.json", tmp_path / "B.md"
    js.write_text(json.dumps(RESULT))
    md.write_text("# B\n\n## 10. Ten\n\nx\n")
    p = subprocess.run([sys.executable, str(TOOLS / "tc_interop.py"), "--render-only", "--json", str(js), "--report", str(md)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert md.read_text().startswith("# B\n\n## 10. Ten\n\nx\n\n" + tc_interop.SECTION)


def test_committed_results_render():
    """tools/tc_interop_results.json, when present, renders."""
    js = TOOLS / "tc_interop_results.json"
    if not js.is_file():
        pytest.skip("no committed results")
    assert tc_interop.render_section(json.loads(js.read_text())).startswith(tc_interop.SECTION)


TC_SRC, TC_PYTHON = os.environ.get("TC_SRC"), os.environ.get("TC_PYTHON")


@pytest.mark.slow
@pytest.mark.skipif(not (TC_SRC and TC_PYTHON and Path(TC_SRC, "src", "slicegpt").is_dir() and Path(TC_PYTHON).is_file()),
                    reason="needs TransformerCompression's checkout (TC_SRC) and its transformers 4.41 venv (TC_PYTHON)")
def test_harness_one_architecture(tmp_path):
    out = tmp_path / "r.json"
    p = subprocess.run([sys.executable, str(TOOLS / "tc_interop.py"), "--tc-src", str(TC_SRC), "--tc-python", str(TC_PYTHON),
                        "--work", str(tmp_path / "w"), "--arches", "llama3", "--dtypes", "fp16", "--no-smollm2", "--json", str(out)],
                       capture_output=True, text=True, timeout=1800)
    assert p.returncode == 0, p.stderr[-2000:]
    row = json.loads(out.read_text())["rows"][0]
    assert row["errors"] == [] and row["pack_verify_ok"] and row["side_files_identical"]
    assert row["tc_reload_unpacked"]["top1"] == 1.0 and row["load_model"]["top1"] == 1.0

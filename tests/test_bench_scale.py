"""tools/bench_scale.py (paper-sized models on one machine): its pure parts (report section,
floors, projection), its children (codecs, floors, unpack against the container's intent) on
tiny inputs, and the whole tool with --quick (slow)."""
from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import cast

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / "tools"


def _load_tool(name: str) -> ModuleType:
    """tools/<name>.py as a module, without writing bytecode into tools/."""
    saved = sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    sys.path.insert(0, str(TOOLS))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(TOOLS))
        sys.dont_write_bytecode = saved


bs = _load_tool("bench_scale")
md = _load_tool("mdsection")

OTHER = "# Benchmarks\n\nintro\n\n## 1. First\n\nrow 1\n\n## Goals\n\n| goal |\n"


def test_section_is_appended_then_replaced_and_other_sections_kept() -> None:
    one = md.replace_section(OTHER, bs.SECTION + "\n\nfirst run\n", bs.SECTION)
    assert one.startswith(OTHER) and one.count(bs.SECTION) == 1 and "first run" in one
    two = md.replace_section(one, bs.SECTION + "\n\nsecond run\n", bs.SECTION)
    assert two.startswith(OTHER) and two.count(bs.SECTION) == 1 and "second run" in two and "first run" not in two
    # a section in the middle: the one after it stays where it was, byte for byte
    middle = "# B\n\n" + bs.SECTION + "\n\nold\n\n## 8. Later\n\nkept\n"
    assert md.replace_section(middle, bs.SECTION + "\n\nnew\n", bs.SECTION) == "# B\n\n" + bs.SECTION + "\n\nnew\n\n## 8. Later\n\nkept\n"
    assert md.replace_section("", bs.SECTION + "\n", bs.SECTION) == bs.SECTION + "\n"


def _floors() -> dict:
    """Two chunks: chunk 0 has sites of 1 s and 3 s to decode, chunk 1 one of 1 s."""
    shape = {"dim": 48, "anchor": [[48, 64], 0], "touched": [[[48, 64], 0], [[128, 48], 1]], "paper": False, "count": 0}
    dec = [{**shape, "i": 0, "site_s": 1.0}, {**shape, "i": 1, "site_s": 3.0}]
    enc = [{**shape, "i": 0, "site_s": 10.0, "canonical_s": 2.0}, {**shape, "i": 1, "site_s": 20.0, "canonical_s": 4.0}]
    sites = [{"chunk": 0, "dkey": 0, "ekey": 0}, {"chunk": 0, "dkey": 1, "ekey": 1}, {"chunk": 1, "dkey": 0, "ekey": 0}]
    return {"sites": sites, "decode_shapes": dec, "encode_shapes": enc, "repeats": 3, "ok": True}


def test_floor_summary_and_projection() -> None:
    s = bs.floor_summary(_floors(), pack_threads=2)
    assert s["decode_sum_s"] == 5.0 and s["largest_chunk_s"] == 4.0
    assert s["encode_sum_s"] == 40.0 and s["encode_chain_s"] == 32.0 and s["pack_floor_s"] == 32.0
    assert bs.decode_floor(s, 1) == 5.0 and bs.decode_floor(s, 2) == 4.0  # the largest chunk bounds it
    proj = {p["n"]: p for p in s["projection"]}
    assert sorted(proj) == [1, 2, 4, 8, 16]
    assert proj[1]["decode_s"] == 5.0 and proj[16]["decode_s"] == 4.0 and proj[1]["pack_s"] == 40.0 and proj[16]["pack_s"] == 32.0


def test_layers_option() -> None:
    assert bs.parse_layers(None, ["llama-2-7b", "opt-13b"], False) == {"llama-2-7b": 32, "opt-13b": 8}
    assert bs.parse_layers("opt-13b=40", ["llama-2-7b", "opt-13b"], False) == {"llama-2-7b": 32, "opt-13b": 40}
    assert bs.parse_layers(None, ["opt-13b"], True) == {"opt-13b": bs.QUICK_LAYERS}
    for bad in ("opt-13b", "llama-2-7b=0", "gpt=3"):
        with pytest.raises(ValueError):
            bs.parse_layers(bad, ["llama-2-7b", "opt-13b"], False)


def _result() -> dict:
    ok = {"ok": True, "wall_s": 8.0, "peak_rss_bytes": 5 * bs.GIB, "workers": None}
    ops = [{"key": "pack", "label": "pack (from .safetensors)", "floor": "pack", **ok},
           {"key": "verify_w1", "label": "verify --workers 1", "floor": "decode", "ok": False, "error": "exit 64: no | verify",
            "wall_s": None, "peak_rss_bytes": None, "workers": 1},
           {"key": "unpack_pt", "label": "unpack --format pt", "floor": "decode", **{**ok, "workers": 2, "peak_rss_bytes": bs.GIB}}]
    good = {"name": "llama-2-7b", "layers": 2, "ok": True, "ops": ops, "plain_loaders": [], "floors": _floors(),
            "shape": {"layers": 2, "hidden": 64, "d": 48, "ffn": 128, "vocab": 256, "heads": 4, "dtypes": ["float16"], "tensors": 3},
            "sizes": {"plain_bytes": 1000, "safetensors_bytes": 1100, "pt_bytes": None, "container_bytes": 950}}
    ctx = bs.Ctx(work=Path("."))
    bs.summarise_model(ctx, good)
    bad = {"name": "opt-13b", "layers": 2, "ok": False, "error": "RuntimeError: generator failed", "ops": [], "plain_loaders": [],
           "floors": None}
    bs.summarise_model(ctx, bad)
    return {"machine": "test machine", "date": "2026-01-01", "argv": ["--work", "w"], "repeats": 1, "elapsed_min": 0.1,
            "quick": True, "models": [good, bad]}


def test_report_names_floors_failures_and_goals() -> None:
    res = _result()
    pack = res["models"][0]["ops"][0]
    assert pack["floor_s"] == 32.0 and pack["vs_floor"] == 0.25
    goals = {g["goal"]: g for g in res["models"][0]["goals"]}
    assert goals["pack (from .safetensors): peak RSS ≤ 4 GiB"]["text"].startswith("missed by 1.00 GiB")
    assert goals["pack (from .safetensors): ≤ 1.5× its floor"]["met"]
    assert goals["unpack --format pt: ≤ 1.3× its floor"]["text"].startswith("missed by 0.70×")  # 8 s vs a 4 s floor
    assert goals["verify --workers 1: peak RSS ≤ 4 GiB"]["text"].startswith("not measured (exit 64")
    text = bs.render_section(res)
    assert text.startswith(bs.SECTION) and "Machine: test machine." in text and "python tools/bench_scale.py --work w" in text
    assert "FAILED: exit 64: no / verify" in text and "**FAILED**: RuntimeError: generator failed" in text
    assert "projection, not measured" in text and "95.00% of the plain tensor bytes" in text and "0.25× (pack floor 32.00 s)" in text
    for line in text.splitlines():  # every table row has the columns of its header
        if line.startswith("| ") and "---" not in line:
            assert line.count(" | ") >= 1


def test_floor_shapes_from_a_container(tmp_path: Path) -> None:
    from conftest import sample_container

    path = tmp_path / "s.bb"
    path.write_bytes(sample_container(dim=24))
    sites = bs.read_sites(path)
    assert sites == [{"chunk": 0, "dim": 24, "anchor": [[24, 28], 0], "paper": False, "touched": [[[24, 28], 0], [[3, 24], 1]]}]
    fl = bs.measure_floor_shapes(sites, repeats=1)
    (dec,), (enc,) = fl["decode_shapes"], fl["encode_shapes"]
    assert dec["count"] == enc["count"] == 1 and dec["site_s"] > 0 and enc["site_s"] > enc["canonical_s"] > 0
    assert set(dec["parts"]) == {"gram", "eigh", "rebuild", "unrotate"} and enc["parts"]["rotate"] > 0


def _tiny_safetensors(path: Path) -> None:
    import safetensors.torch

    g = torch.Generator().manual_seed(0)
    safetensors.torch.save_file({"a": torch.randn(40, 24, generator=g).half(), "b": torch.randn(7, generator=g),
                                 "c": torch.randn(3, 5, generator=g).to(torch.bfloat16)}, str(path))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # zipnn's import calls torch.jit.script
def test_compressed_copies_decompress_to_the_checkpoint(tmp_path: Path) -> None:
    st = tmp_path / "m.safetensors"
    _tiny_safetensors(st)
    start, entries = bs.st_entries(st)
    assert {e["name"]: e["dtype"] for e in entries} == {"a": "float16", "b": "float32", "c": "bfloat16"}
    comp = bs._task_compress([str(st), str(tmp_path / "store"), "1"])
    codecs = ["zstd"] + (["zipnn"] if comp.get("zipnn", {}).get("ok") else [])
    for codec in codecs:
        assert comp[codec]["bytes"] > 0
        out = bs._task_decompress([codec, str(tmp_path / "store"), "1", str(st)])  # compares every tensor's bytes
        assert out["tensors"] == 3 and out["wall_s"] > 0


def test_children_unpack_the_container_s_intent_and_failures_are_recorded(tmp_path: Path) -> None:
    import bbformat
    from bbformat.checkpoint import read_checkpoint, write_checkpoint
    from bbformat.testing import make_tiny_checkpoint

    write_checkpoint(make_tiny_checkpoint("llama", seed=3, layers=2), tmp_path / "src")
    bb = tmp_path / "m.bb"
    bbformat.pack(tmp_path / "src", bb)
    intent = cast(dict[str, torch.Tensor], bbformat.read_tensors(bb))
    ctx = bs.Ctx(work=tmp_path, logs=tmp_path / "logs")
    ctx.logs.mkdir()
    for fmt in ("pt", "safetensors"):
        r = bs.run_child(ctx, "cli", ["unpack", str(bb), str(tmp_path / fmt), "--format", fmt, "--quiet"], f"unpack_{fmt}")
        assert r["ok"] and r["wall_s"] > 0 and r["peak_rss_bytes"] > 2**20
        back = read_checkpoint(tmp_path / fmt).state_dict
        assert sorted(back) == sorted(intent) and all(torch.equal(back[k], intent[k]) for k in intent)
    r = bs.run_child(ctx, "cli", ["no-such-command", str(bb)], "bad")
    assert not r["ok"] and r["error"].startswith("exit 64: bbformat: usage error") and r["peak_rss_bytes"] > 0


def _allowed_failure(res: dict, op: dict) -> bool:
    """Rows that wait on commands other engineers are adding: `bbformat verify` (absent from this
    bbformat) and load_model of OPT (Llama only so far)."""
    if op["key"].startswith("verify") and not res["cli"]["verify"]:
        return True
    return op["key"] == "load_model" and "UnsupportedModelError" in (op.get("error") or "")


@pytest.mark.slow
def test_quick_run_writes_every_row_and_replaces_its_section(tmp_path: Path) -> None:
    report = tmp_path / "B.md"
    report.write_text(OTHER)
    base = [sys.executable, str(TOOLS / "bench_scale.py"), "--work", str(tmp_path / "w"), "--quick", "--report", str(report)]
    r = subprocess.run(base + ["--json", str(tmp_path / "r.json")], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((tmp_path / "r.json").read_text())
    assert [m["name"] for m in res["models"]] == ["llama-2-7b", "opt-13b"] and res["machine"]
    for m in res["models"]:
        assert m["ok"], m.get("error")
        for op in m["ops"]:  # first, so that a failing command shows its own error
            assert (op["ok"] and op["wall_s"] > 0 and op["peak_rss_bytes"] > 0) or _allowed_failure(res, op), op
        keys = [op["key"] for op in m["ops"]]
        expected = ["pack"] + (["pack_pt"] if m["name"] == "llama-2-7b" else []) + ["verify_w1", "verify_w2", "unpack_pt", "unpack_safetensors"]
        assert keys[: len(expected)] == expected and keys[-1] == "load_model"
        for row in m["plain_loaders"]:
            assert (row["ok"] and row["wall_s"] > 0 and row["peak_rss_bytes"] > 0 and row["bytes"] > 0) or "not installed" in row["error"], row
        assert m["floors"]["ok"] and m["floor_summary"]["decode_sum_s"] > 0 and m["floor_summary"]["pack_floor_s"] > 0
        assert m["sizes"]["container_bytes"] < m["sizes"]["plain_bytes"] and m["goals"]
        assert not any((tmp_path / "w" / m["name"]).iterdir())  # checkpoint, container and outputs deleted
    text = report.read_text()
    assert text.startswith(OTHER) and text.count(bs.SECTION) == 1 and "### opt-13b" in text
    # a second run replaces the section: one model now, the rest of the file unchanged
    r = subprocess.run(base + ["--models", "llama-2-7b", "--pt-pack", "none"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    again = report.read_text()
    assert again.startswith(OTHER) and again.count(bs.SECTION) == 1 and "### llama-2-7b" in again and "### opt-13b" not in again


def test_runs_of_one_model_each_merge_into_one_section() -> None:
    def run(model: str, minutes: float) -> dict:
        return {"machine": "m", "argv": ["--models", model], "date": "2026-11-24", "elapsed_min": minutes, "repeats": 1,
                "models": [{"name": model}], "goals": [{"model": model}]}

    merged = bs.merge_results([run("opt-13b", 30.0), run("llama-2-7b", 60.0)])
    assert [m["name"] for m in merged["models"]] == ["opt-13b", "llama-2-7b"]
    assert [g["model"] for g in merged["goals"]] == ["opt-13b", "llama-2-7b"]
    assert merged["elapsed_min"] == 90.0
    text = bs.commands_line(merged)
    assert text.startswith("Commands, run one after the other") and "--models opt-13b" in text and "--models llama-2-7b" in text
    with pytest.raises(ValueError):
        bs.merge_results([run("a", 1.0), {**run("b", 1.0), "machine": "other"}])

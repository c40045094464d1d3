"""Side files an older transformers (TransformerCompression's 4.41) would misread: pack and
inspect warn, and tools/slice.py writes files both versions read alike."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from bbformat.checkpoint import write_checkpoint
from bbformat.cli import main
from bbformat.compat import legacy_reader_problems
from bbformat.testing import make_tiny_checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import slice as slice_tool  # noqa: E402

NEW_CONFIG = {"model_type": "llama", "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}}
NEW_TOKENIZER_CONFIG = {"tokenizer_class": "TokenizersBackend"}
NEW_TOKENIZER = {"model": {"type": "BPE", "merges": [["Ġ", "t"], ["h", "e"]]}}


def _files(cfg: dict, tc: dict, tj: dict) -> dict[str, bytes]:
    return {"config.json": json.dumps(cfg).encode(), "tokenizer_config.json": json.dumps(tc).encode(),
            "tokenizer.json": json.dumps(tj).encode()}


def test_each_misread_setting_is_one_line() -> None:
    problems = legacy_reader_problems(_files(NEW_CONFIG, NEW_TOKENIZER_CONFIG, NEW_TOKENIZER))
    assert len(problems) == 3 and all("\n" not in p for p in problems)
    assert "rope_theta (100000.0)" in problems[0]
    both = {**NEW_CONFIG, "rope_theta": 100000.0}
    fine = _files(both, {"tokenizer_class": "PreTrainedTokenizerFast"}, {"model": {"merges": ["Ġ t", "h e"]}})
    assert legacy_reader_problems(fine) == []
    assert legacy_reader_problems({"config.json": b"not json"}) == []


def test_slice_tool_writes_files_both_versions_read(tmp_path: Path) -> None:
    cfg = slice_tool.legacy_readable_config(json.loads(json.dumps(NEW_CONFIG)))
    assert cfg["rope_theta"] == 100000.0 and cfg["rope_parameters"] == NEW_CONFIG["rope_parameters"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(NEW_TOKENIZER_CONFIG))
    (tmp_path / "tokenizer.json").write_text(json.dumps(NEW_TOKENIZER))
    slice_tool.legacy_readable_tokenizer(tmp_path)
    files = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    files["config.json"] = json.dumps(cfg).encode()
    assert legacy_reader_problems(files) == []
    assert json.loads(files["tokenizer.json"])["model"]["merges"] == ["Ġ t", "h e"]


def test_pack_and_inspect_warn(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "src"
    write_checkpoint(make_tiny_checkpoint("llama", seed=2, layers=1), src)
    cfg = json.loads((src / "config.json").read_text())
    theta = cfg.pop("rope_theta")
    cfg["rope_parameters"] = {"rope_theta": theta, "rope_type": "default"}
    (src / "config.json").write_text(json.dumps(cfg))
    (src / "tokenizer_config.json").write_text(json.dumps(NEW_TOKENIZER_CONFIG))
    assert main(["pack", str(src), str(tmp_path / "m.bb"), "--quiet"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len([e for e in err if e.startswith("bbformat: warning:")]) == 2, err
    assert main(["inspect", str(tmp_path / "m.bb")]) == 0
    captured = capsys.readouterr()
    assert len([e for e in captured.err.splitlines() if "warning:" in e]) == 2
    assert main(["inspect", "--json", str(tmp_path / "m.bb")]) == 0
    assert len(json.loads(capsys.readouterr().out)["warnings"]) == 2

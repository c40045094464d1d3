"""Packaging (issue 25): the licence text ships in the wheel, and what needs transformers says
which extra to install instead of failing with a bare ModuleNotFoundError."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

import bbformat
from bbformat.checkpoint import write_checkpoint
from bbformat.errors import InputError
from bbformat.testing import make_tiny_checkpoint

ROOT = Path(__file__).resolve().parent.parent


def test_license_is_declared_and_shipped() -> None:
    """The wheel carries LICENSE (setuptools >= 77 puts `license-files` in .dist-info/licenses;
    checked by hand with `pip wheel . --no-deps`: bbformat-*.dist-info/licenses/LICENSE)."""
    tomllib = pytest.importorskip("tomllib")
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License") and "Copyright (c) 2026 the bbformat authors" in text
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["license"] == "MIT" and meta["project"]["license-files"] == ["LICENSE"]
    assert any(r.replace(" ", "").startswith("setuptools>=77") for r in meta["build-system"]["requires"])
    assert any(r.startswith("transformers") for r in meta["project"]["optional-dependencies"]["hf"])


@pytest.fixture
def no_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in a plain install: `import transformers` fails (None in sys.modules makes it raise)."""
    for name in [n for n in sys.modules if n == "transformers" or n.startswith("transformers.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "transformers", None)  # type: ignore[arg-type]


def _one_line_naming_the_extra(exc: BaseException) -> None:
    msg = str(exc)
    assert isinstance(exc, InputError) and "\n" not in msg
    assert "pip install 'bbformat[hf]'" in msg and "transformers" in msg


def test_load_model_without_transformers_names_the_extra(tmp_path: Path, no_transformers: None) -> None:
    write_checkpoint(make_tiny_checkpoint("llama", seed=0, layers=1, hidden=32, vocab=64), tmp_path / "m")
    bbformat.pack(tmp_path / "m", tmp_path / "m.bb")
    for path in (tmp_path / "m.bb", tmp_path / "m"):
        with pytest.raises(InputError) as ei:
            bbformat.load_model(path)
        _one_line_naming_the_extra(ei.value)


def test_calibration_without_transformers_names_the_extra(tmp_path: Path, no_transformers: None) -> None:
    write_checkpoint(make_tiny_checkpoint("llama", seed=0, layers=1, hidden=32, vocab=64), tmp_path / "m")
    (tmp_path / "calib.txt").write_text("some text " * 50)
    with pytest.raises(InputError) as ei:
        bbformat.pack(tmp_path / "m", tmp_path / "m.bb", calibration=tmp_path / "calib.txt")
    _one_line_naming_the_extra(ei.value)
    assert not (tmp_path / "m.bb").exists()

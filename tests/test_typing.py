"""The package type-checks in mypy's strict mode (the configuration and its short allow-list of
untyped third-party modules are in pyproject.toml's [tool.mypy])."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_strict_is_clean(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
         "--cache-dir", str(tmp_path / "mypy_cache"), str(ROOT / "bbformat")],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Success: no issues found" in run.stdout

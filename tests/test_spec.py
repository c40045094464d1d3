"""SPEC.md stays true: its worked example is the writer's real output, and every error
code the reader can raise is documented."""
from __future__ import annotations

import re
import runpy
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPEC = (ROOT / "SPEC.md").read_text()


def test_worked_example_bytes_are_real() -> None:
    data = runpy.run_path(str(ROOT / "docs" / "make_spec_example.py"), run_name="example")["data"]
    appendix = SPEC.split("## Appendix A", 1)[1]
    dumped = bytearray()
    for m in re.finditer(r"^([0-9a-f]{6})  ((?:[0-9a-f]{2} ?){1,16})", appendix, flags=re.M):
        assert int(m.group(1), 16) == len(dumped)
        dumped += bytes.fromhex(m.group(2))
    assert bytes(dumped) == data


def test_every_reader_error_code_is_specified() -> None:
    codes = set()
    for p in (ROOT / "bbformat").rglob("*.py"):
        if p.name in ("cli.py", "errors.py", "writer.py"):
            continue
        codes |= set(re.findall(r'"(E_[A-Z_]+)"', p.read_text()))
    missing = sorted(c for c in codes if c not in SPEC)
    assert not missing, missing

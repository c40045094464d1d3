"""The tools' text data: tools/data/ in the repository (calib.txt, eval.txt; tools/data/README.md
gives their source, licence and checksums), or another file named on the command line."""
from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"


def require_text(path: Path, tool: str, option: str) -> Path:
    """PATH if it is a file; otherwise a one-line SystemExit (exit status 1) naming TOOL and OPTION."""
    if not path.is_file():
        what = "is not a file" if path.exists() else "does not exist"
        raise SystemExit(f"{tool}: {option} {path} {what}")
    return path


def read_text(path: Path, tool: str, option: str) -> str:
    """PATH's UTF-8 text; a missing, unreadable or non-UTF-8 file is a one-line SystemExit."""
    require_text(path, tool, option)
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SystemExit(f"{tool}: cannot read {option} {path}: {e}") from None

"""`python -m tools.bench` (from the repository root) or `python tools/bench`."""
import sys
from pathlib import Path

if not __package__:  # run as a directory: its own folder is on sys.path, the repository is not
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from tools.bench.cli import main  # noqa: E402

raise SystemExit(main())

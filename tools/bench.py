#!/usr/bin/env python3
"""`python tools/bench.py ARGS`, as README.md and BENCHMARKS.md give it: the tool is the package tools/bench/."""
import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tools.bench.cli import main

    raise SystemExit(main())

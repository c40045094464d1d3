"""The machine a tool's figures were measured on, for the reports (BENCHMARKS.md, FUZZING.md)."""
from __future__ import annotations

import os
import platform
from pathlib import Path


def cpu_and_memory() -> str:
    """'<CPU model>, <n> cores, <m> GiB RAM'."""
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{cpu}, {os.cpu_count()} cores, {mem:.0f} GiB RAM"


def python_and_numpy() -> str:
    import numpy as np

    return f"Python {platform.python_version()}, numpy {np.__version__}"


def drop_caches() -> bool:
    """Empty the page cache (root on Linux): the next read of a file comes from the disk.
    False where that is not allowed."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False

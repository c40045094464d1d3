"""Filesystem helpers shared by the writers."""
from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Make a rename in `path` durable; best effort where directories cannot be fsynced."""
    try:
        fd = os.open(path if str(path) else ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)

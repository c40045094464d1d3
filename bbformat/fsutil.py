"""Filesystem helpers shared by the writers: fsync, temp names, stale-temp cleanup.

Every temporary that bbformat creates for an output named NAME is called
`.NAME.bbtmp-XXXXXXXXXXXX` (a dot, the output's name, `.bbtmp-`, 12 lowercase hex digits)
and lives in the directory where NAME is published (for `unpack` into an existing,
non-empty directory: inside that directory). A process killed with SIGKILL can leave
one behind; no reader takes it for output (hidden, and no `.bb`/`.pt`/`.json` suffix).
A later successful write of the same NAME removes such leftovers once they have not been
modified for `STALE_TEMP_SECONDS` (so a concurrent writer's live temp is left alone).
"""
from __future__ import annotations

import os
import re
import secrets
import shutil
import stat
import time
from pathlib import Path

TEMP_MARK = ".bbtmp-"
# a temp untouched this long belongs to a dead process: a live writer modifies it far more often
STALE_TEMP_SECONDS = 3600.0


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


def temp_name(name: str) -> str:
    """A fresh temp name for an output called `name`: `.NAME.bbtmp-<12 hex>`."""
    return f".{name}{TEMP_MARK}{secrets.token_hex(6)}"


def temp_pattern(name: str) -> re.Pattern[str]:
    """Matches exactly the names `temp_name(name)` can return."""
    return re.compile(r"\." + re.escape(name) + re.escape(TEMP_MARK) + r"[0-9a-f]{12}\Z")


def _newest_mtime(path: Path, st: os.stat_result) -> float | None:
    """Newest mtime of a temp file, or of a staging directory and its files; None if the
    directory holds anything but regular files (then it is not one of ours to delete)."""
    newest = st.st_mtime
    if stat.S_ISDIR(st.st_mode):
        with os.scandir(path) as it:
            for e in it:
                est = e.stat(follow_symlinks=False)
                if not stat.S_ISREG(est.st_mode):
                    return None
                newest = max(newest, est.st_mtime)
    return newest


def remove_stale_temps(directory: Path, name: str, older_than: float = STALE_TEMP_SECONDS) -> list[Path]:
    """Remove leftovers of killed writers of `name` in `directory`: entries named exactly
    like `temp_name(name)`, regular files or directories holding only regular files (never
    symlinks), whose newest modification time (a directory's own or any of its entries') is more than `older_than`
    seconds ago. Best effort: errors are ignored. Returns what was removed."""
    pattern = temp_pattern(name)
    now = time.time()
    removed: list[Path] = []
    try:
        entries = [e for e in os.scandir(directory) if pattern.match(e.name)]
    except OSError:
        return removed
    for e in entries:
        p = Path(e.path)
        try:
            st = e.stat(follow_symlinks=False)
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                continue
            newest = _newest_mtime(p, st)
            if newest is None or now - newest <= older_than:
                continue
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(p)
            else:
                p.unlink()
            removed.append(p)
        except OSError:
            continue
    return removed


def probe_write(path: str | os.PathLike[str]) -> OSError | None:
    """The OSError behind a failed write of `path` that a library reported without an errno
    (torch's C++ writer raises a RuntimeError), found by appending up to 1 MiB to the file,
    which is discarded afterwards: a full disk or a file-size limit shows up as ENOSPC or EFBIG."""
    try:
        with open(path, "ab") as f:
            for _ in range(16):
                f.write(bytes(65536))
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        return exc
    return None

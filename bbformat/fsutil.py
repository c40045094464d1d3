"""Filesystem helpers shared by the writers: atomic publication (`AtomicOutput`), fsync,
temp names, stale-temp cleanup.

Every temporary that bbformat creates for an output named NAME is called
`.NAME.bbtmp-XXXXXXXXXXXX` (a dot, the output's name, `.bbtmp-`, 12 lowercase hex digits)
and lives in the directory where NAME is published (for `unpack` into an existing,
non-empty directory: inside that directory). Its writer holds an exclusive flock(2) on it
from creation to publication or removal, so the lock says whether a temp is in use. A
process killed with SIGKILL can leave one behind (the kernel releases its lock); no reader
takes it for output (hidden, and no `.bb`/`.pt`/`.json` suffix). A later successful write
of the same NAME removes such leftovers: any whose lock it can take and that has not been
modified for `LOCK_GRACE_SECONDS` (the moment between a temp's creation and its lock); where
the file system has no flock, only those untouched for `STALE_TEMP_SECONDS`.
"""
from __future__ import annotations

import ctypes
import errno
import os
import re
import secrets
import shutil
import stat
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import BinaryIO, Callable

from .errors import InputError, OutputExistsError, output_exists

try:
    import fcntl
except ImportError:  # not POSIX: temps are judged by their age alone
    fcntl = None  # type: ignore[assignment]

TEMP_MARK = ".bbtmp-"
# a temp untouched this long belongs to a dead process: a live writer modifies it far more often
STALE_TEMP_SECONDS = 3600.0
# a temp whose lock is free is a dead writer's once it is older than the gap between a temp's
# creation and its locking (microseconds): then no process holds or will take its lock
LOCK_GRACE_SECONDS = 2.0


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


def lock_temp(path: Path) -> tuple[str, int | None]:
    """Try the exclusive flock(2) of the temp file or directory `path` without waiting, never
    following a symlink: ("free", a descriptor that holds the lock now: close it to release),
    ("held", None): another open file holds it, or ("unknown", None): no flock here."""
    if fcntl is None:
        return "unknown", None
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return "unknown", None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return "held", None
    except OSError:
        os.close(fd)
        return "unknown", None
    return "free", fd


def remove_stale_temps(directory: Path, name: str, older_than: float = STALE_TEMP_SECONDS,
                       grace: float = LOCK_GRACE_SECONDS) -> list[Path]:
    """Remove leftovers of killed writers of `name` in `directory`: entries named exactly
    like `temp_name(name)`, regular files or directories holding only regular files (never
    symlinks), that no process is writing: their lock (lock_temp) is free and their newest
    modification time (a directory's own or any of its entries') is more than `grace` seconds
    ago; where the lock cannot be tested (no flock), more than `older_than` seconds ago. A
    temp whose lock is held is left alone, however old. Best effort: errors are ignored.
    Returns what was removed."""
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
            if newest is None:
                continue
            state, fd = lock_temp(p)
            try:
                if state == "held" or now - newest <= (grace if state == "free" else older_than):
                    continue
                if stat.S_ISDIR(st.st_mode):
                    shutil.rmtree(p)
                else:
                    p.unlink()
                removed.append(p)
            finally:
                if fd is not None:
                    os.close(fd)
        except OSError:
            continue
    return removed


_NO_LINK = {errno.EPERM, errno.EACCES, errno.EMLINK, errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP}
_RENAME_NOREPLACE = 1  # linux/fs.h


def _renameat2_noreplace(src: Path, dst: Path) -> bool:
    """Linux renameat2(RENAME_NOREPLACE): True once renamed; FileExistsError if `dst` exists;
    False where the call or the file system does not offer it."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    if fn(at_fdcwd, os.fsencode(src), at_fdcwd, os.fsencode(dst), _RENAME_NOREPLACE) == 0:
        return True
    err = ctypes.get_errno()
    if err == errno.EEXIST:
        raise FileExistsError(err, os.strerror(err), str(dst))
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM):
        return False
    raise OSError(err, os.strerror(err), str(dst))


def rename_no_replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """Give the complete file `src` the name `dst` unless `dst` exists (FileExistsError: nothing
    changed), in one step, so that nothing that appears at `dst` meanwhile, under any name a
    check saw absent, is ever replaced. A hard link (fails with EEXIST, atomically) then the
    temp name's removal; where the file system has no hard links, Linux's renameat2 with
    RENAME_NOREPLACE; only where neither exists (e.g. FAT on another OS) a check and a plain
    rename, whose window is the few microseconds between them. For files only: a directory
    is renamed with os.replace, which never replaces anything but an empty directory."""
    src, dst = Path(src), Path(dst)
    try:
        os.link(src, dst)
    except FileExistsError:
        raise
    except OSError as exc:
        if exc.errno not in _NO_LINK:
            raise
        if _renameat2_noreplace(src, dst):
            return
        if os.path.lexists(dst):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(dst)) from None
        os.rename(src, dst)
        return
    os.unlink(src)


def check_output_file(path: str | os.PathLike[str], overwrite: bool) -> None:
    """Refuse, before anything is written, an output file that may not be replaced: a directory
    (or a symlink to one), and anything but a regular file or a symlink (a device, FIFO or socket:
    a rename would remove it, not write to it), whatever `overwrite` says; anything that exists
    without `overwrite` (OutputExistsError, E_EXISTS). A symlink is replaced itself, never the file
    it points to. The publication is checked again, atomically (rename_no_replace): this check
    only makes the refusal come before the work."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except OSError:
        return  # absent, or unreachable: the write itself reports it
    if path.is_dir():
        raise InputError(f"{path} is a directory; give the path of the file to write")
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
        raise InputError(f"{path} is not a regular file; refusing to replace it")
    if not overwrite:
        raise output_exists(str(path))


def probe_write(path: str | os.PathLike[str]) -> OSError | None:
    """The OSError behind a failed write of `path` that a library reported without an errno
    (torch's C++ writer raises a RuntimeError), found by appending to the file, which is
    discarded afterwards, 1 MiB more than its file system says is free (at most 64 MiB): a full
    disk or a file-size limit shows up as ENOSPC or EFBIG, even when another writer freed some
    space since the failure."""
    try:
        st = os.statvfs(os.path.dirname(os.path.abspath(path)) or ".")
        free = st.f_bavail * st.f_frsize
    except OSError:
        free = 0
    chunks = min(1024, (free + (1 << 20)) // 65536 + 1)
    try:
        with open(path, "ab") as f:
            for _ in range(chunks):
                f.write(bytes(65536))
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        return exc
    return None


def fsync_path(path: str | os.PathLike[str]) -> None:
    """fsync a file that someone else wrote and closed (torch.save, torch's zip writer)."""
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def write_synced(path: Path, data: bytes) -> None:
    """Create `path` (it must not exist), write `data` and fsync it."""
    with open(path, "xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def remove_entry(path: Path, best_effort: bool = False) -> None:
    """Remove a file, a symlink (not what it points to) or a directory tree: OSError if it
    fails, or with best_effort as much as can be removed and no error (a temp file or staging
    directory that may be gone already)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=best_effort)
        return
    try:
        path.unlink()
    except OSError:
        if not best_effort:
            raise


_LIVE: set[Path] = set()  # temps of this process not yet published or discarded


def remove_abandoned_temps() -> list[Path]:
    """Remove this process's temps that no publish() or discard() has settled: the CLI calls it
    after an interrupt (SIGINT, SIGTERM), which can land between a temp's creation and the
    code that would discard it. Returns those removed."""
    gone = []
    for p in sorted(_LIVE):
        _LIVE.discard(p)
        if os.path.lexists(p):
            remove_entry(p, best_effort=True)
            gone.append(p)
    return gone


class AtomicOutput:
    """One output published atomically: built under a temp name, renamed over its final name
    only once complete, so readers see it absent, old or new, never partial.

    The temp is `temp_name(name)` in `where` (defaults: the output's own directory and file
    name), created here: a file open for binary writing as `.file`, or with directory=True
    an empty directory for the caller to fill (writing and fsyncing its files, e.g. with
    write_synced). publish() makes it durable and renames it over `path`; publish_entries()
    instead moves a staging directory's files one by one into the directory `path`. Both fsync
    the directories they change and then remove leftovers of killed writers of the same name
    in `where` (remove_stale_temps). discard() removes the temp; any failure before publishing
    leaves the output untouched. As a context manager: leaving the block by an exception
    (KeyboardInterrupt included) discards; leaving it normally publishes, unless publish(),
    publish_entries() or discard() already ran. OSErrors propagate as they are.

    replace=False never replaces anything that exists at publication: a file is published
    with rename_no_replace, a directory with a rename (which on POSIX replaces at most an
    empty directory, with or without replace), and publish_entries moves each file with
    rename_no_replace. What exists
    raises FileExistsError (publish_entries first takes back the files it had moved).
    """

    def __init__(self, path: str | os.PathLike[str], *, directory: bool = False, where: Path | None = None,
                 name: str | None = None, replace: bool = True) -> None:
        self.path = Path(path)
        self.replace = replace
        self.where = self.path.parent if where is None else where
        self.name = self.path.name if name is None else name
        self.temp = self.where / temp_name(self.name)
        self.file: BinaryIO | None = None
        self.moved = 0  # files publish_entries has moved so far
        self._done = False
        self._lock: int | None = None
        _LIVE.add(self.temp)  # before it exists: an interrupt at any point finds it (remove_abandoned_temps)
        try:
            if directory:
                os.mkdir(self.temp)
            else:
                self.file = open(self.temp, "xb")  # noqa: SIM115 (closed by publish or discard)
        except OSError:  # never created (an interrupt keeps it listed: it may exist, and lexists decides)
            _LIVE.discard(self.temp)
            raise
        try:
            self._lock = lock_temp(self.temp)[1]  # held until published or discarded: the temp is in use
        except BaseException:  # an interrupt right here: no temp is left
            self.discard()
            raise

    def _unlock(self) -> None:
        _LIVE.discard(self.temp)
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    def _sync(self) -> None:
        if self.file is None:
            for sub in sorted(p for p in self.temp.rglob("*") if p.is_dir() and not p.is_symlink()):
                fsync_dir(sub)  # a plain directory's subfolders (1_Pooling/ ...)
            fsync_dir(self.temp)  # its files were fsynced by whoever wrote them
        elif not self.file.closed:
            self.file.flush()
            os.fsync(self.file.fileno())
            self.file.close()

    def publish(self, check: Callable[[Path], None] | None = None) -> None:
        """fsync the temp (a file is also closed), call `check(temp)` if given (if it raises,
        nothing is published), rename it over `path` and fsync `path`'s directory."""
        self._sync()
        if check is not None:
            check(self.temp)
        if self.replace or self.file is None:  # a directory: rename(2) replaces at most an empty directory
            os.replace(self.temp, self.path)
        else:
            rename_no_replace(self.temp, self.path)
        self._done = True
        self._unlock()
        fsync_dir(self.path.parent)
        remove_stale_temps(self.where, self.name)

    def publish_entries(self, names: list[str]) -> None:
        """For a staging directory: fsync it, then move its entries `names`, in that order, over
        their names in the directory `path` (created if absent), and remove it. Each file is at
        every moment old or new; a failure part way leaves `moved` files new."""
        assert self.file is None, "publish_entries is for a staging directory"
        self._sync()
        self.path.mkdir(exist_ok=True)
        moved: list[str] = []
        for entry in names:
            if "/" in entry:  # a subfolder's file: its folder is made in DST, and left there
                (self.path / entry).parent.mkdir(parents=True, exist_ok=True)
            if self.replace:
                os.replace(self.temp / entry, self.path / entry)
            else:
                try:
                    rename_no_replace(self.temp / entry, self.path / entry)
                except FileExistsError:
                    for back in reversed(moved):  # take back what this call published: nothing is left half-new
                        os.rename(self.path / back, self.temp / back)
                    self.moved = 0
                    raise
            moved.append(entry)
            self.moved += 1
        for sub in sorted((p for p in self.temp.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            os.rmdir(sub)  # emptied subfolders, deepest first
        for entry in {str(Path(e).parent) for e in names if "/" in e}:
            fsync_dir(self.path / entry)
        os.rmdir(self.temp)
        self._done = True
        self._unlock()
        fsync_dir(self.path)
        fsync_dir(self.path.parent)
        remove_stale_temps(self.where, self.name)

    def discard(self) -> None:
        """Close and remove the temp (idempotent; nothing to do once published)."""
        if self._done:
            return
        self._done = True
        if self.file is not None:
            try:
                self.file.close()  # flushes what is buffered: may fail again on a full disk
            except OSError:
                pass
        remove_entry(self.temp, best_effort=True)
        self._unlock()

    def __enter__(self) -> "AtomicOutput":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc_type is not None:
            self.discard()
        elif not self._done:
            try:
                self.publish()
            except BaseException:
                self.discard()
                raise


def check_relative_path(name: str, what: str = "file") -> str:
    """A relative POSIX path inside a directory: no absolute path, `.` or `..` part, empty part,
    backslash or NUL (InputError)."""
    if (not name or name.startswith("/") or "\\" in name or "\x00" in name
            or any(p in ("", ".", "..") for p in name.split("/"))):
        raise InputError(f"refusing {what} name {name!r}: not a relative path inside the directory")
    return name


def refuse_existing(dst: Path, order: list[str]) -> None:
    """OutputExistsError unless DST is absent or an empty directory: names the files of `order`
    (a directory's files in publication order, the weights last) that DST already has (or, with
    none of them, says that DST is not empty). Imports nothing heavy: unpack refuses before torch."""
    if not os.path.lexists(dst):
        return
    try:
        with os.scandir(dst) as it:
            present = sorted(e.name for e in it)
    except OSError:
        return  # not a directory we can list: the write reports it
    if not present:
        return
    clash = [n for n in order[-1:] + order[:-1] if n in present]  # the weights file first
    if clash:
        more = f" and {len(clash) - 3} more" if len(clash) > 3 else ""
        raise output_exists(f"{', '.join(clash[:3])}{more} in {dst}", many=len(clash) > 1)
    raise OutputExistsError(f"{dst} is not empty ({len(present)} entries, e.g. {present[0]}); give a new or empty "
                            f"directory, or --force (Python: overwrite=True) to add the files to it")

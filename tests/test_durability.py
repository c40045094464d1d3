"""Durability: a pack or unpack killed at any moment leaves no output, the previous complete
output or the new complete one, never a partial one; running out of space gives a one-line
error with exit status 8 (E_NO_SPACE) and leaves nothing partial.

The SIGKILL tests run `python -m bbformat` as subprocesses. Each measures one uninterrupted run
first, then kills at seeded, deterministic points: half spread over the whole run by time,
half aimed at the write phase (poll until our temp file or staging directory appears, then
wait a seeded fraction of the measured write window). Both with the output absent beforehand
and present from an earlier complete run with different content. What a kill may leave:
`.m.bb.bbtmp-<12 hex>` files next to m.bb, `.u.bbtmp-<12 hex>/` staging directories next to
(or, for an existing u/, inside) u/; the next successful run removes those whose lock is free.
"""
from __future__ import annotations

import errno
import io
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch

import bbformat
from bbformat.checkpoint import Checkpoint, read_checkpoint, write_checkpoint
from bbformat.codec.dtypes import RawTensor
from bbformat.codec.encoder import encode_chunk
from bbformat.codec.layout import ChunkLayout
from bbformat.errors import BBFormatError, NoSpaceError, OutputError
from bbformat.fsutil import STALE_TEMP_SECONDS, temp_pattern
from bbformat.testing import make_tiny_checkpoint
from bbformat.writer import Writer, WriterStateError

resource = pytest.importorskip("resource")  # POSIX only
pytestmark = pytest.mark.skipif(os.name != "posix" or not hasattr(signal, "SIGKILL"), reason="POSIX signals and rlimits")

ROOT = Path(__file__).resolve().parent.parent
SEED = 5_2024
# kill points per scenario (x 2 scenarios, output absent / present), half spread over the whole run
# by time, half aimed at the write phase: 6 in the default suite, 10 under `slow`
KILLS = [pytest.param(6, id="6-kills"), pytest.param(10, id="10-kills", marks=pytest.mark.slow)]
RUN_TIMEOUT = 300.0
# an 11 MB Llama: writing is a real part of the run, the whole file stays well under a minute
BIG = dict(seed=5, layers=2, hidden=64, vocab=49152)
SMALL = dict(seed=6, layers=1, hidden=32, vocab=512)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["OMP_NUM_THREADS"] = "1"  # the same thread environment for every run: pack is deterministic
    return env


def _argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "bbformat", *args, "--quiet"]


def _model(root: Path, name: str, ckpt: Checkpoint, **changed_files: bytes) -> Path:
    if changed_files:
        ckpt = Checkpoint(ckpt.stem, ckpt.state_dict, ckpt.slicing_config, ckpt.hf_config, {**ckpt.extra_files, **changed_files})
    write_checkpoint(ckpt, root / name)
    return root / name


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()}


def _age(p: Path, seconds: float = 2 * STALE_TEMP_SECONDS) -> None:
    t = time.time() - seconds
    if p.is_dir() and not p.is_symlink():
        for q in p.iterdir():
            os.utime(q, (t, t), follow_symlinks=False)
    os.utime(p, (t, t), follow_symlinks=False)


@contextmanager
def _held(p: Path) -> Iterator[None]:
    """Hold the temp's lock, as its live writer does (fsutil.AtomicOutput)."""
    import fcntl

    fd = os.open(p, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield
    finally:
        os.close(fd)


# ---------------------------------------------------------------- running and killing


@dataclass
class KillPoint:
    how: str  # "time": after `delay` s from the start; "write": `delay` s after our temp appears
    delay: float


def _temps(watch: Path, pattern: re.Pattern[str]) -> set[str]:
    try:
        return {n for n in os.listdir(watch) if pattern.match(n)}
    except FileNotFoundError:
        return set()


def _has_temp(watch: Path, pattern: re.Pattern[str], before: set[str] = frozenset()) -> bool:  # type: ignore[assignment]
    """Has a temp appeared that was not there before (not a leftover of an earlier kill)?"""
    return bool(_temps(watch, pattern) - before)


def _measure(argv: list[str], watch: Path, pattern: re.Pattern[str], published: Callable[[], bool]) -> tuple[float, float]:
    """One uninterrupted run: (total seconds, seconds from the temp's appearance to publication)."""
    t0 = time.monotonic()
    p = subprocess.Popen(argv, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    seen = pub = None
    while p.poll() is None:
        now = time.monotonic()
        if seen is None and _has_temp(watch, pattern):
            seen = now
        if seen is not None and pub is None and published():
            pub = now
        assert now - t0 < RUN_TIMEOUT, "reference run hangs"
        time.sleep(0.0005)
    end = time.monotonic()
    err = p.stderr.read().decode() if p.stderr else ""
    assert p.wait() == 0, err
    return end - t0, max((pub or end) - (seen or end), 0.005)


def _kill_points(rng: random.Random, total: float, window: float, kills: int) -> list[KillPoint]:
    by_time = [KillPoint("time", total * (i + rng.uniform(0.05, 0.95)) / (kills // 2)) for i in range(kills // 2)]
    by_write = [KillPoint("write", window * rng.uniform(0.0, 1.5)) for _ in range(kills - kills // 2)]
    points = by_time + by_write
    rng.shuffle(points)
    return points


def _run_until(argv: list[str], kp: KillPoint, watch: Path, pattern: re.Pattern[str]) -> str:
    """Start the command, SIGKILL it at the kill point; "killed" or "finished" (then it succeeded)."""
    before = _temps(watch, pattern)
    t0 = time.monotonic()
    p = subprocess.Popen(argv, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        if kp.how == "time":
            deadline = t0 + kp.delay
        else:
            while p.poll() is None and not _has_temp(watch, pattern, before):
                assert time.monotonic() - t0 < RUN_TIMEOUT
                time.sleep(0.0005)
            deadline = time.monotonic() + kp.delay
        while p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.0005)
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)  # the child we started, by its pid
            p.wait()
            return "killed"
        err = p.stderr.read().decode() if p.stderr else ""
        assert p.returncode == 0, err
        return "finished"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        if p.stderr:
            p.stderr.close()


@dataclass
class Tally:
    states: dict[str, int] = field(default_factory=dict)
    killed: int = 0
    mid_write: int = 0  # kills that left a new temp behind: they interrupted a write
    log: list[tuple[str, float, str, str, int]] = field(default_factory=list)

    def add(self, kp: KillPoint, state: str, outcome: str, new_temps: int) -> None:
        self.log.append((kp.how, round(kp.delay, 3), outcome, state, new_temps))
        self.states[state] = self.states.get(state, 0) + 1
        self.killed += outcome == "killed"
        self.mid_write += new_temps > 0


# ---------------------------------------------------------------- pack killed


def _pack_scenario(src: Path, out_dir: Path, new: bytes, old: bytes | None, points: list[KillPoint]) -> Tally:
    out = out_dir / "m.bb"
    pattern = temp_pattern("m.bb")
    out_dir.mkdir()
    if old is not None:
        out.write_bytes(old)
    tally, temps = Tally(), set()
    force = ["--force"] if old is not None else []  # without it, an existing output is refused (E_EXISTS)
    for kp in points:
        outcome = _run_until(_argv("pack", str(src), str(out), *force), kp, out_dir, pattern)
        names = set(os.listdir(out_dir))
        now_temps = {n for n in names if pattern.match(n)}
        assert names - now_temps <= {"m.bb"}, (kp, names)
        assert all((out_dir / n).is_file() and not (out_dir / n).is_symlink() for n in now_temps)
        if out.exists():
            data = out.read_bytes()
            assert data == new or (old is not None and data == old), (kp, outcome, len(data), "a partial or foreign .bb")
            state = "new" if data == new else "old"
        else:
            assert old is None, (kp, outcome, "the previous output vanished")
            state = "none"
        tally.add(kp, state, outcome, len(now_temps - temps))
        temps = now_temps
        if old is None:
            out.unlink(missing_ok=True)
        elif state == "new":
            out.write_bytes(old)
    # the next successful run removes our stale temps (an hour untouched), nothing else
    for n in temps:
        _age(out_dir / n)
    stale = out_dir / ".m.bb.bbtmp-00112233aabb"
    stale.write_bytes(b"stale")
    _age(stale)
    keep = {
        ".m.bb.bbtmp-0123456789ab": None,  # our pattern, locked below: a live writer's, however old
        ".m.bb.bbtmp-0123456789aZ": "age",  # not hex
        ".m.bb.bbtmp-0123456789ab.x": "age",
        "m.bb.bbtmp-0123456789ab": "age",  # no leading dot
        ".n.bb.bbtmp-0123456789ab": "age",  # another output's temp
    }
    for n, how in keep.items():
        (out_dir / n).write_bytes(b"x")
        if how:
            _age(out_dir / n)
    os.symlink(out_dir / "m.bb.bbtmp-0123456789ab", out_dir / ".m.bb.bbtmp-ffffffffffff")  # never a symlink
    _age(out_dir / ".m.bb.bbtmp-ffffffffffff")
    keep[".m.bb.bbtmp-ffffffffffff"] = None
    _age(out_dir / ".m.bb.bbtmp-0123456789ab")
    with _held(out_dir / ".m.bb.bbtmp-0123456789ab"):
        r = subprocess.run(_argv("pack", str(src), str(out), *force), env=_env(), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == new  # deterministic: the same bytes as the measured run
    assert set(os.listdir(out_dir)) == {"m.bb", *keep}
    return tally


@pytest.mark.parametrize("kills", KILLS)
def test_pack_killed_leaves_no_or_complete_output(tmp_path: Path, kills: int) -> None:
    ckpt = make_tiny_checkpoint("llama", **BIG)
    src = _model(tmp_path, "src", ckpt)
    ref_dir = tmp_path / "ref"
    ref_dir.mkdir()
    ref = ref_dir / "m.bb"
    total, window = _measure(_argv("pack", str(src), str(ref)), ref_dir, temp_pattern("m.bb"), ref.exists)
    new = ref.read_bytes()
    bbformat.pack(src, tmp_path / "old.bb", scheme="paper", tolerance=0.01)  # earlier complete run, different bytes
    old = (tmp_path / "old.bb").read_bytes()
    assert old != new
    rng = random.Random(SEED)
    plans = [_kill_points(rng, total, window, kills) for _ in range(2)]
    with ThreadPoolExecutor(2) as ex:
        absent = ex.submit(_pack_scenario, src, tmp_path / "absent", new, None, plans[0])
        present = ex.submit(_pack_scenario, src, tmp_path / "present", new, old, plans[1])
        tallies = [absent.result(), present.result()]
    assert sum(t.killed for t in tallies) >= kills, tallies  # most points really killed it
    assert sum(t.mid_write for t in tallies) >= 2, tallies  # and several while the output was being written
    assert tallies[1].states.get("old", 0) >= 1, tallies


# ---------------------------------------------------------------- unpack killed


def _staging_ok(p: Path, names: set[str]) -> None:
    assert p.is_dir() and not p.is_symlink(), p
    assert {q.name for q in p.iterdir()} <= names and all(q.is_file() for q in p.iterdir()), p


def _unpack_scenario(bb: Path, parent: Path, new: dict[str, bytes], old: dict[str, bytes] | None,
                     sds: dict[str, dict[str, torch.Tensor]], weights: str, points: list[KillPoint]) -> Tally:
    dst = parent / "u"
    pattern = temp_pattern("u")
    parent.mkdir()
    if old is not None:
        dst.mkdir()
        for n, data in old.items():
            (dst / n).write_bytes(data)
    watch = dst if old is not None else parent  # staging: inside an existing DST, else next to it
    force = ["--force"] if old is not None else []  # without it, an existing DST with files is refused (E_EXISTS)
    tally, temps = Tally(), set()
    for kp in points:
        outcome = _run_until(_argv("unpack", str(bb), str(dst), *force), kp, watch, pattern)
        around = set(os.listdir(parent))
        sibling = {n for n in around if pattern.match(n)}
        assert around - sibling <= {"u"}, (kp, around)
        if old is not None:
            assert not sibling, (kp, sibling)
        for n in sibling:
            _staging_ok(parent / n, set(new))
        inner: set[str] = set()
        if not dst.exists():
            assert old is None, (kp, outcome, "the previous output vanished")
            state = "none"
        else:
            entries = set(os.listdir(dst))
            inner = {n for n in entries if pattern.match(n)}
            for n in inner:
                _staging_ok(dst / n, set(new))
            files = entries - inner
            assert files == set(new), (kp, outcome, sorted(files))
            version = {}  # of the files that differ between the two versions
            for n in files:
                data = (dst / n).read_bytes()
                if old is not None and old[n] == new[n]:
                    assert data == new[n], (kp, outcome, n, "a partial or foreign file")
                elif data == new[n]:
                    version[n] = "new"
                else:
                    assert old is not None and data == old[n], (kp, outcome, n, "a partial or foreign file")
                    version[n] = "old"
            if old is None:
                assert not inner and set(version.values()) == {"new"}, (kp, outcome, version)
            if version[weights] == "new":  # the weights file is replaced last
                assert set(version.values()) == {"new"}, (kp, outcome, version)
            state = version[weights] if len(set(version.values())) == 1 else "mixed"
            back = read_checkpoint(dst)  # every state on disk loads ...
            want = sds[version[weights]]  # ... as the model of its weights file
            assert list(back.state_dict) == list(want) and all(torch.equal(back.state_dict[k], v) for k, v in want.items())
        now_temps = {("p", n) for n in sibling} | {("d", n) for n in inner}
        tally.add(kp, state, outcome, len(now_temps - temps))
        temps = now_temps
        if old is None:
            shutil.rmtree(dst, ignore_errors=True)
        else:
            for n, data in old.items():
                if (dst / n).read_bytes() != data:
                    (dst / n).write_bytes(data)
    # stale staging directories go on the next successful run; fresh ones, look-alikes and
    # directories holding anything but files stay
    for where, n in temps:
        _age((parent if where == "p" else dst) / n)
    home = watch
    stale = home / ".u.bbtmp-00112233aabb"
    stale.mkdir()
    (stale / "config.json").write_bytes(b"{}")
    _age(stale)
    keep = [".u.bbtmp-0123456789ab", ".u.bbtmp-0123456789aZ", ".v.bbtmp-0123456789ab", ".u.bbtmp-aaaaaaaaaaaa"]
    for n in keep:
        (home / n).mkdir()
        (home / n / "x").write_bytes(b"x")
    (home / ".u.bbtmp-aaaaaaaaaaaa" / "sub").mkdir()  # holds a directory: not ours to delete
    for n in keep:
        _age(home / n)
    with _held(home / keep[0]):  # a live writer's staging directory, however old
        r = subprocess.run(_argv("unpack", str(bb), str(dst), *force), env=_env(), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert _files(dst) == new
    left = set(os.listdir(home)) - set(new) - {"u"}
    assert left == set(keep), left
    return tally


def _new_container_and_old_files(tmp_path: Path, ckpt: Checkpoint) -> tuple[Path, dict[str, bytes]]:
    """m.bb packed from ckpt, and the files of an earlier unpack of a different container (paper
    scheme, another generation_config.json) to find in DST before the unpack under test."""
    src = _model(tmp_path, "src", ckpt)
    src_old = _model(tmp_path, "src_old", ckpt, **{"generation_config.json": b'{"max_new_tokens": 99}\n'})
    bb = tmp_path / "m.bb"
    bbformat.pack(src, bb)
    bbformat.pack(src_old, tmp_path / "old.bb", scheme="paper", tolerance=0.01)
    bbformat.unpack(tmp_path / "old.bb", tmp_path / "old")
    return bb, _files(tmp_path / "old")


@pytest.mark.parametrize("kills", KILLS)
def test_unpack_killed_leaves_no_or_complete_output(tmp_path: Path, kills: int) -> None:
    ckpt = make_tiny_checkpoint("llama", **BIG)
    bb, old = _new_container_and_old_files(tmp_path, ckpt)
    ref_parent = tmp_path / "ref"
    ref_parent.mkdir()
    ref = ref_parent / "u"
    total, window = _measure(_argv("unpack", str(bb), str(ref)), ref_parent, temp_pattern("u"), ref.exists)
    new = _files(ref)
    weights = f"{ckpt.stem}.pt"
    assert set(new) == set(old) and old[weights] != new[weights] and old["generation_config.json"] != new["generation_config.json"]
    sds = {v: torch.load(d / weights, weights_only=True) for v, d in (("new", ref), ("old", tmp_path / "old"))}
    rng = random.Random(SEED + 1)
    plans = [_kill_points(rng, total, window, kills) for _ in range(2)]
    with ThreadPoolExecutor(2) as ex:
        absent = ex.submit(_unpack_scenario, bb, tmp_path / "absent", new, None, sds, weights, plans[0])
        present = ex.submit(_unpack_scenario, bb, tmp_path / "present", new, old, sds, weights, plans[1])
        tallies = [absent.result(), present.result()]
    assert sum(t.killed for t in tallies) >= kills, tallies
    assert sum(t.mid_write for t in tallies) >= 2, tallies
    assert tallies[1].states.get("old", 0) >= 1, tallies


def test_unpack_into_empty_directory_is_one_rename(tmp_path: Path) -> None:
    ckpt = make_tiny_checkpoint("llama", **SMALL)
    bb = tmp_path / "m.bb"
    bbformat.pack(_model(tmp_path, "src", ckpt), bb)
    (tmp_path / "out" / "empty").mkdir(parents=True)
    before = os.stat(tmp_path / "out" / "empty").st_ino
    bbformat.unpack(bb, tmp_path / "out" / "empty")
    # staged next to DST and renamed over the empty directory: a new inode, nothing left around
    assert os.stat(tmp_path / "out" / "empty").st_ino != before
    assert os.listdir(tmp_path / "out") == ["empty"]
    assert read_checkpoint(tmp_path / "out" / "empty").stem == ckpt.stem
    # an existing non-empty DST: files replaced in place, other files left alone, no staging left
    (tmp_path / "out" / "empty" / "notes.txt").write_bytes(b"mine")
    bbformat.unpack(bb, tmp_path / "out" / "empty", fmt="pt", overwrite=True)
    assert sorted(os.listdir(tmp_path / "out" / "empty")) == sorted([*_files(tmp_path / "src"), "notes.txt"])
    assert os.listdir(tmp_path / "out") == ["empty"]


# ---------------------------------------------------------------- out of space

_WRAP = (
    "import resource, runpy, signal, sys\n"
    "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"  # writes past the limit fail with EFBIG
    "limit = int(sys.argv.pop(1))\n"
    "resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))\n"
    "sys.argv[0] = 'bbformat'\n"
    "runpy.run_module('bbformat', run_name='__main__', alter_sys=True)\n"
)


def _one_line_no_space(r: subprocess.CompletedProcess) -> None:
    assert r.returncode == 8, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bbformat: error [E_NO_SPACE]: cannot write "), r.stderr
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr


def _listing(d: Path) -> dict[str, bytes | None]:
    """Everything under d, recursively (hidden entries too): name -> bytes (None for directories)."""
    return {str(p.relative_to(d)): (None if p.is_dir() else p.read_bytes()) for p in sorted(d.rglob("*"))}


@pytest.fixture
def two_versions(tmp_path: Path) -> dict[str, Path]:
    """A big model, its container (new), and a small earlier output of each kind (old)."""
    big = make_tiny_checkpoint("llama", **BIG)
    small = make_tiny_checkpoint("llama", **SMALL)
    paths = {"src": _model(tmp_path, "src", big), "bb": tmp_path / "m.bb", "old_bb": tmp_path / "old.bb", "old_dir": tmp_path / "old"}
    bbformat.pack(paths["src"], paths["bb"])
    bbformat.pack(_model(tmp_path, "small", small), paths["old_bb"])
    bbformat.unpack(paths["old_bb"], paths["old_dir"])
    return paths


def _no_space_cases(v: dict[str, Path], root: Path, run: Callable[[list[str]], subprocess.Popen]) -> None:
    """pack and unpack into `root`, each with the output absent and present; all must fail cleanly."""
    cases = []
    for present in (False, True):
        d = root / ("present" if present else "absent")
        d.mkdir()
        if present:
            shutil.copy(v["old_bb"], d / "m.bb")
            shutil.copytree(v["old_dir"], d / "u")
        before = _listing(d)
        force = ["--force"] if present else []  # without it, the old outputs are refused before any write (E_EXISTS)
        cases.append((d, before, run(["pack", str(v["src"]), str(d / "m.bb"), *force])))
        cases.append((d, before, run(["unpack", str(v["bb"]), str(d / "u"), *force])))
    for d, before, p in cases:
        out, err = p.communicate(timeout=RUN_TIMEOUT)
        _one_line_no_space(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    for d, before, _ in cases:
        assert _listing(d) == before  # no output, or the old one byte for byte; no temp left


def test_cli_file_size_limit(two_versions: dict[str, Path], tmp_path: Path) -> None:
    limit = min(os.path.getsize(two_versions["bb"]), max(os.path.getsize(p) for p in two_versions["src"].iterdir())) // 2

    def run(args: list[str]) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", _WRAP, str(limit), *args, "--quiet"], env=_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    (tmp_path / "out").mkdir()
    _no_space_cases(two_versions, tmp_path / "out", run)


def test_cli_full_tmpfs(two_versions: dict[str, Path], tmp_path: Path) -> None:
    if not sys.platform.startswith("linux") or os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a real full disk needs root and mount -t tmpfs (Linux)")
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    size = 2 * 1024 * 1024  # the old outputs fit; the new 11 MB ones do not
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip() or r.returncode}")
    try:
        used = shutil.disk_usage(mnt).used

        def run(args: list[str]) -> subprocess.Popen:
            return subprocess.Popen(_argv(*args), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

        _no_space_cases(two_versions, mnt, run)
        for d in ("absent", "present"):
            shutil.rmtree(mnt / d)
        assert shutil.disk_usage(mnt).used == used  # nothing left behind that takes space
    finally:
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@contextmanager
def _file_size_limit(limit: int) -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


def test_api_pack_out_of_space(tmp_path: Path) -> None:
    src = _model(tmp_path, "src", make_tiny_checkpoint("llama", **SMALL))
    bbformat.pack(src, tmp_path / "ref.bb")
    bbformat.pack(src, tmp_path / "old.bb", scheme="paper")
    old = (tmp_path / "old.bb").read_bytes()
    for present in (False, True):
        d = tmp_path / f"out{int(present)}"
        d.mkdir()
        if present:
            (d / "m.bb").write_bytes(old)
        with _file_size_limit(os.path.getsize(tmp_path / "ref.bb") // 2), pytest.raises(NoSpaceError, match="cannot write") as ei:
            bbformat.pack(src, d / "m.bb", overwrite=present)
        assert isinstance(ei.value, OutputError) and isinstance(ei.value, BBFormatError)
        assert ei.value.code == "E_NO_SPACE" and ei.value.exit_status == 8
        assert _listing(d) == ({"m.bb": old} if present else {})


@pytest.mark.parametrize("fmt", ["pt", "safetensors"])
def test_api_unpack_out_of_space(tmp_path: Path, fmt: str) -> None:
    ckpt = make_tiny_checkpoint("llama", **SMALL)
    bbformat.pack(_model(tmp_path, "src", ckpt), tmp_path / "m.bb")
    bbformat.unpack(tmp_path / "m.bb", tmp_path / "ref", fmt=fmt)
    limit = os.path.getsize(tmp_path / "ref" / f"{ckpt.stem}.{fmt}") // 2
    other = make_tiny_checkpoint("llama", seed=7, layers=1, hidden=32, vocab=64)
    for present in (False, True):
        d = tmp_path / f"out{int(present)}"
        d.mkdir()
        if present:
            write_checkpoint(other, d / "u", fmt=fmt)
        before = _listing(d)
        with _file_size_limit(limit), pytest.raises(NoSpaceError, match="cannot write"):
            bbformat.unpack(tmp_path / "m.bb", d / "u", fmt=fmt, overwrite=present)
        assert _listing(d) == before


def test_torch_save_failures_become_no_space(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.save reports a failed write as a RuntimeError (not an OSError); write_checkpoint
    finds the real cause. Limits just under the size hit the archive's tail."""
    ckpt = make_tiny_checkpoint("llama", seed=0, layers=1, hidden=16, heads=2, kv_heads=1, vocab=16)
    write_checkpoint(ckpt, tmp_path / "ref")
    size = os.path.getsize(tmp_path / "ref" / f"{ckpt.stem}.pt")
    for cut in (1, 50, 150, size // 2):
        with _file_size_limit(size - cut), pytest.raises(NoSpaceError):
            write_checkpoint(ckpt, tmp_path / "out" / "u")
        assert _listing(tmp_path / "out") == {}
    # a write lost without any exception (a truncated zip) is caught by the check of the zip's end
    real_save = torch.save

    def lossy_save(obj, f, *a, **k):  # type: ignore[no-untyped-def]
        real_save(obj, f, *a, **k)
        os.truncate(f, os.path.getsize(f) - 10)

    monkeypatch.setattr(torch, "save", lossy_save)
    with pytest.raises(OutputError, match="incomplete"):
        write_checkpoint(ckpt, tmp_path / "out" / "u")
    assert _listing(tmp_path / "out") == {}


def _chunk() -> tuple:
    rng = np.random.default_rng(0)
    lay = ChunkLayout("block0", ("w",), ())
    enc = encode_chunk(lay, {"w": RawTensor.from_f64(rng.normal(0, 1, (256, 256)), "float32")}, {}, "symmetric", 0.0)
    return enc.program, enc.sections


def test_writer_out_of_space(tmp_path: Path) -> None:
    program, sections = _chunk()
    for present in (False, True):
        d = tmp_path / f"out{int(present)}"
        d.mkdir()
        if present:
            (d / "m.bb").write_bytes(b"an earlier container")
        before = _listing(d)
        with _file_size_limit(4096), pytest.raises(NoSpaceError, match="m.bb"):
            with Writer(d / "m.bb", "symmetric", 2, {"a": 1}, format_version="1.1", overwrite=present) as w:
                w.add_chunk(program, sections)
                w.add_chunk(program, sections)
        assert _listing(d) == before


class _FailingStream(io.RawIOBase):
    def __init__(self, err: int) -> None:
        self.err = err

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:  # type: ignore[no-untyped-def]
        raise OSError(self.err, os.strerror(self.err))


@pytest.mark.parametrize("err, cls, code", [(errno.ENOSPC, NoSpaceError, "E_NO_SPACE"), (errno.EIO, OutputError, "E_OUTPUT")])
def test_writer_stream_errors_are_output_errors(err: int, cls: type, code: str) -> None:
    program, sections = _chunk()
    with pytest.raises(cls) as ei:
        Writer(_FailingStream(err), "symmetric", 1, {})
    assert type(ei.value) is cls and ei.value.code == code and ei.value.exit_status == 8
    w = Writer(io.BytesIO(), "symmetric", 1, {}, format_version="1.1")
    w._out = _FailingStream(err)  # type: ignore[assignment]  # fails at the chunk now
    with pytest.raises(cls):
        w.add_chunk(program, sections)
    with pytest.raises(WriterStateError):
        w.add_chunk(program, sections)


# ---------------------------------------------------------------- deterministic kill points

_KILL_AT_REPLACE = """
import os, signal, sys
k, calls = int(sys.argv[1]), [0]
real = os.replace
def replace(*a, **kw):
    calls[0] += 1
    if calls[0] == k:
        os.kill(os.getpid(), signal.SIGKILL)
    return real(*a, **kw)
os.replace = replace
from bbformat.cli import main
rc = main(sys.argv[2:])
print("REPLACES", calls[0])
sys.exit(rc)
"""


def _run_killing_at_replace(k: int, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _KILL_AT_REPLACE, str(k), *args, "--quiet"], env=_env(), capture_output=True, text=True,
                          timeout=RUN_TIMEOUT)


def test_unpack_killed_before_every_rename_of_the_burst(tmp_path: Path) -> None:
    """Deterministic points in the window the timed kills rarely hit: SIGKILL just before each
    os.replace of an unpack into an existing directory (one per file, weights last) and into an
    absent one. Every state on disk is old or new file by file, loads as the model of its
    weights file, and new weights come only with every other new file."""
    ckpt = make_tiny_checkpoint("llama", **SMALL)
    bb, old = _new_container_and_old_files(tmp_path, ckpt)
    bbformat.unpack(bb, tmp_path / "new")
    new = _files(tmp_path / "new")
    weights = f"{ckpt.stem}.pt"
    assert old[weights] != new[weights]
    sds = {v: read_checkpoint(tmp_path / v).state_dict for v in ("old", "new")}
    dst = tmp_path / "u"
    dst.mkdir()
    for n, data in old.items():
        (dst / n).write_bytes(data)
    full = _run_killing_at_replace(0, "unpack", str(bb), str(dst), "--force")
    assert full.returncode == 0, full.stderr
    n_replace = int(full.stdout.split()[-1])
    assert n_replace >= len(new)  # one replace per file into an existing directory
    seen = set()
    for k in range(1, n_replace + 1):
        shutil.rmtree(dst)
        dst.mkdir()
        for n, data in old.items():
            (dst / n).write_bytes(data)
        r = _run_killing_at_replace(k, "unpack", str(bb), str(dst), "--force")
        assert r.returncode == -signal.SIGKILL, (k, r.returncode, r.stderr)
        files = {p.name: p.read_bytes() for p in dst.iterdir() if p.is_file()}
        assert set(files) == set(new), (k, sorted(files))
        version = {n: "new" if data == new[n] else "old" for n, data in files.items() if old[n] != new[n]}
        assert all(files[n] in (old[n], new[n]) for n in files), k
        if version[weights] == "new":
            assert set(version.values()) == {"new"}, (k, version)
        back = read_checkpoint(dst).state_dict
        want = sds[version[weights]]
        assert list(back) == list(want) and all(torch.equal(back[key], v) for key, v in want.items()), k
        seen.add(tuple(sorted(version.items())))
    assert len(seen) >= 2  # the points really fell between renames of the burst
    shutil.rmtree(dst)
    r = _run_killing_at_replace(1, "unpack", str(bb), str(dst))  # absent DST: the one rename of the staging directory
    assert r.returncode == -signal.SIGKILL
    assert not dst.exists()
    assert all(temp_pattern("u").match(n) for n in os.listdir(tmp_path) if n.startswith(".u"))


# ---------------------------------------------------------------- SIGTERM (issue 41)


def _terminate_mid_write(argv: list[str], watch: Path, pattern: re.Pattern[str]) -> subprocess.CompletedProcess[str]:
    """Start the command, send SIGTERM once its temp has appeared (as `timeout` does), and
    return what it did."""
    p = subprocess.Popen(argv, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    while p.poll() is None and not _has_temp(watch, pattern):
        assert time.monotonic() - t0 < RUN_TIMEOUT
        time.sleep(0.0005)
    assert p.poll() is None, "finished before its temp could be seen"
    p.send_signal(signal.SIGTERM)  # the child we started, by its pid
    out, err = p.communicate(timeout=RUN_TIMEOUT)
    return subprocess.CompletedProcess(argv, p.returncode, out, err)


@pytest.mark.parametrize("cmd", ["pack", "unpack"])
def test_sigterm_removes_the_temps_and_exits_143(tmp_path: Path, cmd: str) -> None:
    """The issue's `timeout -s TERM 4 bbformat pack SRC OUT`: stopped mid-write, it leaves no
    `.bbtmp-` temp and no output, says so in one line and exits 128 + SIGTERM."""
    ckpt = make_tiny_checkpoint("llama", **BIG)
    src = _model(tmp_path, "src", ckpt)
    work = tmp_path / "w"
    work.mkdir()
    if cmd == "pack":
        argv, name = _argv("pack", str(src), str(work / "m.bb")), "m.bb"
    else:
        bbformat.pack(src, tmp_path / "m.bb")
        argv, name = _argv("unpack", str(tmp_path / "m.bb"), str(work / "u")), "u"
    r = _terminate_mid_write(argv, work, temp_pattern(name))
    assert r.returncode == 143, (r.returncode, r.stderr)
    assert r.stderr.count("\n") == 1 and "terminated" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert os.listdir(work) == []


def test_a_killed_writers_temp_goes_at_the_next_run_at_once(tmp_path: Path) -> None:
    """SIGKILL cannot be handled: the temp stays, but its lock died with the process, so the
    next successful pack of the same OUT removes it without waiting an hour."""
    ckpt = make_tiny_checkpoint("llama", **SMALL)
    src = _model(tmp_path, "src", ckpt)
    work = tmp_path / "w"
    work.mkdir()
    out = work / "m.bb"
    outcome = _run_until(_argv("pack", str(src), str(out)), KillPoint("write", 0.0), work, temp_pattern("m.bb"))
    assert outcome == "killed"
    left = _temps(work, temp_pattern("m.bb"))
    assert left and not out.exists()
    time.sleep(2.5)  # past fsutil.LOCK_GRACE_SECONDS: a temp's creation-to-lock moment
    r = subprocess.run(_argv("pack", str(src), str(out)), env=_env(), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert os.listdir(work) == ["m.bb"]

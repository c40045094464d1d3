"""Every subcommand's path handling (issue 25, part 2): an existing output is never replaced
without --force (API: overwrite=True), and a path that cannot be used is one line with its
documented status (2: bad input or path, E_INPUT / E_EXISTS; 8: a place nothing can be written,
E_OUTPUT), never an internal error (70) or a traceback. Everything is written under tmp_path."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import bbformat
from bbformat.checkpoint import read_checkpoint, write_checkpoint
from bbformat.cli import main
from bbformat.constants import FORMAT_MAJOR, FORMAT_MINOR, FORMAT_VERSIONS
from bbformat.errors import InputError, OutputExistsError
from bbformat.testing import make_tiny_checkpoint
from bbformat.writer import Writer

# a place where nothing can be created, even by root: the issue's /proc example (Linux only)
UNWRITABLE = Path("/proc/bbformat-test-no-such-dir")
needs_proc = pytest.mark.skipif(not Path("/proc/self").is_dir() or UNWRITABLE.exists(), reason="needs Linux's /proc")


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a tiny Llama checkpoint directory, its container); tests copy them before changing anything."""
    root = tmp_path_factory.mktemp("packed")
    write_checkpoint(make_tiny_checkpoint("llama", seed=3, layers=1, hidden=32, vocab=64), root / "src")
    bbformat.pack(root / "src", root / "m.bb")
    return root / "src", root / "m.bb"


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def _err(capsys: pytest.CaptureFixture[str], code: str) -> str:
    """The one stderr line of a failed main(), which names `code`."""
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"[{code}]" in err and "Traceback" not in err and "internal error" not in err, err
    return err


# ---------------------------------------------------------------- pack


def test_pack_refuses_an_existing_output(packed: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, _ = packed
    out = tmp_path / "unrelated.txt"
    out.write_bytes(b"someone's notes")
    assert main(["pack", str(src), str(out), "--quiet"]) == 2
    assert str(out) in _err(capsys, "E_EXISTS") and out.read_bytes() == b"someone's notes"
    assert os.listdir(tmp_path) == ["unrelated.txt"]  # no temp left either
    for flag in ("--force", "-f"):
        assert main(["pack", str(src), str(out), "--quiet", flag]) == 0
        assert out.read_bytes()[:8] == b"\x89BBF\r\n\x1a\n"


def test_pack_never_replaces_what_force_cannot_mean(packed: tuple[Path, Path], tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Even with --force: not a directory, not a FIFO (a rename would remove it), not an input file."""
    src, _ = packed
    model = tmp_path / "model"
    shutil.copytree(src, model)
    weights = next(p for p in model.iterdir() if p.suffix == ".pt")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir").mkdir()
    for out, what in ((tmp_path / "fifo", "not a regular file"), (tmp_path / "dir", "is a directory"),
                      (weights, "input file"), (model / "config.json", "input file")):
        for force in ([], ["--force"]):
            before = _files(model)
            assert main(["pack", str(model), str(out), "--quiet", *force]) == 2, (out, force)
            assert what in _err(capsys, "E_INPUT")
            assert _files(model) == before
    assert (tmp_path / "fifo").exists() and not (tmp_path / "fifo").is_file()


def test_pack_replaces_a_symlink_not_its_target(packed: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, _ = packed
    target = tmp_path / "target.bin"
    target.write_bytes(b"keep me")
    link = tmp_path / "link.bb"
    link.symlink_to(target)
    assert main(["pack", str(src), str(link), "--quiet"]) == 2
    _err(capsys, "E_EXISTS")
    assert main(["pack", str(src), str(link), "--quiet", "--force"]) == 0
    assert not link.is_symlink() and target.read_bytes() == b"keep me"


@pytest.mark.parametrize("case", ["missing input", "input is a file", "output in a missing directory",
                                  "output under a file", "calibration text missing", "calibration text is a directory"])
def test_pack_bad_paths_are_input_errors(packed: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         case: str) -> None:
    src, bb = packed
    (tmp_path / "afile").write_bytes(b"x")
    argv = {
        "missing input": ["pack", str(tmp_path / "nope"), str(tmp_path / "o.bb")],
        "input is a file": ["pack", str(bb), str(tmp_path / "o.bb")],
        "output in a missing directory": ["pack", str(src), str(tmp_path / "no" / "dir" / "o.bb")],
        "output under a file": ["pack", str(src), str(tmp_path / "afile" / "o.bb")],
        "calibration text missing": ["pack", str(src), str(tmp_path / "o.bb"), "--calibration", str(tmp_path / "nope.txt")],
        "calibration text is a directory": ["pack", str(src), str(tmp_path / "o.bb"), "--calibration", str(tmp_path)],
    }[case]
    if case.startswith("calibration"):
        pytest.importorskip("transformers")
    assert main([*argv, "--quiet"]) == 2
    _err(capsys, "E_INPUT")
    assert sorted(os.listdir(tmp_path)) == ["afile"]


@needs_proc
def test_pack_into_an_unwritable_place_is_an_output_error(packed: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    src, _ = packed
    assert main(["pack", str(src), str(Path("/proc") / "bbformat-test.bb"), "--quiet"]) == 8
    _err(capsys, "E_OUTPUT")


# ---------------------------------------------------------------- unpack


def test_unpack_does_not_replace_the_original_checkpoint(packed: tuple[Path, Path], tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's `bbformat unpack demo/model.bb demo/model`: the original stays byte for byte."""
    src, bb = packed
    model = tmp_path / "model"
    shutil.copytree(src, model)
    original = _files(model)
    for fmt in ("pt", "safetensors"):
        assert main(["unpack", str(bb), str(model), "--format", fmt, "--quiet"]) == 2
        err = _err(capsys, "E_EXISTS")
        assert str(model) in err and (fmt == "safetensors" or f"{read_checkpoint(src).stem}.pt" in err)
        assert _files(model) == original and sorted(os.listdir(tmp_path)) == ["model"]
    assert main(["unpack", str(bb), str(model), "--quiet", "--force"]) == 0
    after = _files(model)
    assert set(after) == set(original) and after != original  # the rotated model replaced it, as asked


def test_unpack_into_a_non_empty_directory_needs_force(packed: tuple[Path, Path], tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    _, bb = packed
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "notes.txt").write_bytes(b"mine")
    assert main(["unpack", str(bb), str(dst), "--quiet"]) == 2
    assert "not empty" in _err(capsys, "E_EXISTS") and os.listdir(dst) == ["notes.txt"]
    assert main(["unpack", str(bb), str(dst), "--quiet", "-f"]) == 0
    assert (dst / "notes.txt").read_bytes() == b"mine" and len(os.listdir(dst)) > 1  # files added, others left alone
    (tmp_path / "empty").mkdir()  # an empty directory replaces nothing: no --force needed
    assert main(["unpack", str(bb), str(tmp_path / "empty"), "--quiet"]) == 0
    capsys.readouterr()


@pytest.mark.parametrize("cmd", ["pack", "unpack"])
def test_missing_output_parents_are_refused_by_both(packed: tuple[Path, Path], tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str], cmd: str) -> None:
    """One rule (README, Paths): bbformat creates the output it is given, never a missing parent;
    pack and unpack alike refuse, before any work, and leave nothing behind."""
    src, bb = packed
    out = tmp_path / "a" / "b" / ("m.bb" if cmd == "pack" else "u")
    assert main([cmd, str(src if cmd == "pack" else bb), str(out), "--quiet"]) == 2
    assert "does not exist" in _err(capsys, "E_INPUT") and os.listdir(tmp_path) == []
    (tmp_path / "a" / "b").mkdir(parents=True)
    assert main([cmd, str(src if cmd == "pack" else bb), str(out), "--quiet"]) == 0


@pytest.mark.parametrize("force", [[], ["--force"]])
@pytest.mark.parametrize("case", ["missing input", "input is a directory", "output is a file", "output is the input",
                                  "output under a file"])
def test_unpack_bad_paths_are_input_errors(packed: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           case: str, force: list[str]) -> None:
    src, bb = packed
    mine = tmp_path / "m.bb"
    shutil.copy(bb, mine)
    (tmp_path / "afile").write_bytes(b"x")
    argv = {
        "missing input": ["unpack", str(tmp_path / "nope.bb"), str(tmp_path / "u")],
        "input is a directory": ["unpack", str(src), str(tmp_path / "u")],
        "output is a file": ["unpack", str(mine), str(tmp_path / "afile")],
        "output is the input": ["unpack", str(mine), str(mine)],
        "output under a file": ["unpack", str(mine), str(tmp_path / "afile" / "u")],
    }[case]
    before = {p: p.read_bytes() for p in (mine, tmp_path / "afile")}
    assert main([*argv, "--quiet", *force]) == 2
    _err(capsys, "E_INPUT")
    assert sorted(os.listdir(tmp_path)) == ["afile", "m.bb"] and all(p.read_bytes() == b for p, b in before.items())


@needs_proc
def test_unpack_into_an_unwritable_place_is_an_output_error(packed: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    _, bb = packed
    assert main(["unpack", str(bb), str(UNWRITABLE), "--quiet"]) == 8
    _err(capsys, "E_OUTPUT")


# ---------------------------------------------------------------- inspect, verify


@pytest.mark.parametrize("cmd", ["inspect", "verify"])
def test_readers_bad_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str], cmd: str) -> None:
    for path in (tmp_path / "nope.bb", tmp_path):
        assert main([cmd, str(path)]) == 2
        _err(capsys, "E_INPUT")


# ---------------------------------------------------------------- demo


def test_demo_keep_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's `demo --keep existing_file` (was FileExistsError, 70) and `--keep /proc/demo`
    (FileNotFoundError, 70); and demo's own outputs are not replaced without --force. Each is
    refused before the model is made."""
    (tmp_path / "afile").write_bytes(b"x")
    for keep in (tmp_path / "afile", tmp_path / "afile" / "sub"):
        assert main(["demo", "--keep", str(keep), "--quiet"]) == 2
        assert "is not a directory" in _err(capsys, "E_INPUT")
    keep = tmp_path / "d"
    (keep / "model.bb").mkdir(parents=True)
    (keep / "model.bb" / "x").write_bytes(b"mine")
    assert main(["demo", "--keep", str(keep), "--quiet"]) == 2
    assert str(keep / "model.bb") in _err(capsys, "E_EXISTS")
    assert sorted(p.name for p in keep.rglob("*")) == ["model.bb", "x"]
    if Path("/proc/self").is_dir():
        assert main(["demo", "--keep", "/proc/bbformat-test-demo", "--quiet"]) == 8
        _err(capsys, "E_OUTPUT")


def test_demo_keep_twice_needs_force(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    keep = tmp_path / "d"
    assert main(["demo", "--keep", str(keep), "--layers", "1", "--quiet"]) == 0
    capsys.readouterr()
    before = {p: p.read_bytes() for p in keep.rglob("*") if p.is_file()}
    assert main(["demo", "--keep", str(keep), "--layers", "1", "--quiet"]) == 2
    assert "--force" in _err(capsys, "E_EXISTS")
    assert {p: p.read_bytes() for p in keep.rglob("*") if p.is_file()} == before
    assert main(["demo", "--keep", str(keep), "--layers", "1", "--quiet", "--force"]) == 0


def test_demo_force_with_another_arch_replaces_the_old_model_whole(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A kept llama demo, then --force --arch opt: the old model's files go (before, the two
    weight files side by side made pack refuse the directory as ambiguous); others stay."""
    keep = tmp_path / "d"
    assert main(["demo", "--keep", str(keep), "--arch", "llama", "--layers", "1", "--quiet"]) == 0
    (keep / "notes.txt").write_text("mine")
    link_target = tmp_path / "elsewhere"
    link_target.mkdir()
    (link_target / "keep.txt").write_text("x")
    capsys.readouterr()
    assert main(["demo", "--keep", str(keep), "--arch", "opt", "--layers", "1", "--quiet", "--force"]) == 0
    names = {p.name for p in (keep / "model").iterdir()} | {p.name for p in (keep / "unpacked").iterdir()}
    assert any("opt" in n for n in names) and not any("llama" in n for n in names)
    assert (keep / "notes.txt").read_text() == "mine"
    (keep / "unpacked").rename(tmp_path / "old_unpacked")
    (keep / "unpacked").symlink_to(link_target, target_is_directory=True)  # a link is removed, not followed
    assert main(["demo", "--keep", str(keep), "--arch", "opt", "--layers", "1", "--quiet", "--force"]) == 0
    assert (link_target / "keep.txt").read_text() == "x" and not (keep / "unpacked").is_symlink()


# ---------------------------------------------------------------- the API: overwrite=


def test_api_overwrite(packed: tuple[Path, Path], tmp_path: Path) -> None:
    src, bb = packed
    out, dst = tmp_path / "m.bb", tmp_path / "u"
    out.write_bytes(b"old")
    with pytest.raises(OutputExistsError) as ei:
        bbformat.pack(src, out)
    assert isinstance(ei.value, InputError) and ei.value.code == "E_EXISTS" and ei.value.exit_status == 2
    assert "overwrite=True" in str(ei.value) and "\n" not in str(ei.value) and out.read_bytes() == b"old"
    bbformat.pack(src, out, overwrite=True)
    assert out.read_bytes() == bb.read_bytes()
    write_checkpoint(read_checkpoint(src), dst)
    with pytest.raises(OutputExistsError):
        write_checkpoint(read_checkpoint(src), dst)
    with pytest.raises(OutputExistsError):
        bbformat.unpack(out, dst, fmt="safetensors")
    bbformat.unpack(out, dst, fmt="safetensors", overwrite=True)
    with pytest.raises(OutputExistsError):
        Writer(out, "symmetric", 0, {})
    assert out.read_bytes() == bb.read_bytes()
    with Writer(out, "symmetric", 0, {}, overwrite=True):
        pass
    assert out.read_bytes() != bb.read_bytes()
    assert sorted(os.listdir(tmp_path)) == ["m.bb", "u"]


def test_a_file_that_appears_while_pack_writes_is_not_replaced(packed: tuple[Path, Path], tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The check before the work is not all: the publication itself refuses a name taken meanwhile."""
    src, _ = packed
    out = tmp_path / "m.bb"
    import bbformat.api

    real = bbformat.api.verify_container

    def someone_writes(path: str, *a: object, **k: object) -> None:  # runs on the finished temp, just before publication
        out.write_bytes(b"written meanwhile")
        real(path, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(bbformat.api, "verify_container", someone_writes)
    with pytest.raises(OutputExistsError, match="appeared"):
        bbformat.pack(src, out, verify=True)
    assert out.read_bytes() == b"written meanwhile" and os.listdir(tmp_path) == ["m.bb"]


def test_a_directory_that_fills_while_unpack_writes_is_not_replaced(packed: tuple[Path, Path], tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    src, bb = packed
    import bbformat.api

    real = bbformat.api._stream_weights
    for dst_exists in (False, True):  # absent: the staging directory's rename; empty: no-replace moves inside it
        dst = tmp_path / f"u{int(dst_exists)}"
        if dst_exists:
            dst.mkdir()
            monkeypatch.chdir(dst)  # the current directory is never renamed over: staged inside, moved file by file
        # the weights file is moved last: the side files moved before it must be taken back
        names = [f"{read_checkpoint(src).stem}.pt"] if dst_exists else ["other.txt"]

        def fill(*a: object, _dst: Path = dst, _names: list[str] = names) -> None:
            real(*a)  # type: ignore[arg-type]
            _dst.mkdir(exist_ok=True)
            for n in _names:
                (_dst / n).write_bytes(b"theirs")

        monkeypatch.setattr(bbformat.api, "_stream_weights", fill)
        with pytest.raises(OutputExistsError, match="appeared"):
            bbformat.unpack(bb, dst)
        assert _files(dst) == {n: b"theirs" for n in names}, dst  # theirs only: nothing of ours moved in, or it was taken back
    assert sorted(os.listdir(tmp_path)) == ["u0", "u1"]


# ---------------------------------------------------------------- bare bbformat, --version


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bbformat", *args], capture_output=True, text=True, timeout=120)


def test_bare_bbformat_prints_the_help_as_a_usage_error() -> None:
    r = _run()
    assert r.returncode == 64 and r.stdout == ""
    assert r.stderr.startswith("usage: bbformat") and "required" not in r.stderr
    assert all(cmd in r.stderr for cmd in ("pack", "unpack", "verify", "inspect", "demo", "--version"))


def test_version_names_the_package_and_the_format_versions() -> None:
    r = _run("--version")
    assert r.returncode == 0 and r.stderr == ""
    first, second, third, fourth = r.stdout.splitlines()
    assert first == f"bbformat {bbformat.__version__}"
    from bbformat.codec import host_native
    from bbformat.codec.exponent import NATIVE_DECODER

    assert third.startswith("payload codec 3 coder: " + ("compiled" if NATIVE_DECODER else "numpy"))
    assert fourth.startswith("host path (") and ("compiled" if host_native.active() else "numpy") in fourth
    assert all(v in second for v in FORMAT_VERSIONS) and f"{FORMAT_MAJOR}.{FORMAT_MINOR}" in second
    assert second.index("writes") < second.index(FORMAT_VERSIONS[0]) < second.index("reads")

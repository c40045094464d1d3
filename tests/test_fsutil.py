"""fsutil.AtomicOutput: the one way bbformat publishes a file or a directory (the container
Writer, checkpoints, unpack): the output is absent, old or new, never partial."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from bbformat.fsutil import TEMP_MARK, AtomicOutput, remove_stale_temps, temp_name, temp_pattern, write_synced


def _temps(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if TEMP_MARK in p.name)


def test_file_appears_only_when_published(tmp_path: Path) -> None:
    out = tmp_path / "m.bb"
    out.write_bytes(b"old")
    a = AtomicOutput(out)
    assert a.file is not None
    a.file.write(b"new")
    assert out.read_bytes() == b"old" and len(_temps(tmp_path)) == 1
    a.publish()
    assert out.read_bytes() == b"new" and _temps(tmp_path) == []


def test_failed_check_publishes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "m.bb"

    def refuse(p: Path) -> None:
        assert p.read_bytes() == b"x"  # the check sees the complete, synced temp
        raise ValueError("no")

    with pytest.raises(ValueError), AtomicOutput(out) as a:
        assert a.file is not None
        a.file.write(b"x")
        a.publish(check=refuse)
    assert not out.exists() and _temps(tmp_path) == []


@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
def test_leaving_by_an_exception_discards(tmp_path: Path, exc: type[BaseException]) -> None:
    out = tmp_path / "m.bb"
    out.write_bytes(b"old")
    with pytest.raises(exc), AtomicOutput(out) as a:
        assert a.file is not None
        a.file.write(b"half")
        raise exc()
    assert out.read_bytes() == b"old" and _temps(tmp_path) == []


def test_leaving_normally_publishes(tmp_path: Path) -> None:
    out = tmp_path / "m.bb"
    with AtomicOutput(out) as a:
        assert a.file is not None
        a.file.write(b"done")
    assert out.read_bytes() == b"done"


def test_directory_is_renamed_whole(tmp_path: Path) -> None:
    out = tmp_path / "ckpt"
    with AtomicOutput(out, directory=True) as a:
        write_synced(a.temp / "a.json", b"{}")
        write_synced(a.temp / "w.pt", b"w")
        assert not out.exists()
    assert sorted(p.name for p in out.iterdir()) == ["a.json", "w.pt"] and _temps(tmp_path) == []


def test_entries_move_into_an_existing_directory(tmp_path: Path) -> None:
    out = tmp_path / "ckpt"
    out.mkdir()
    (out / "keep.txt").write_bytes(b"k")
    (out / "w.pt").write_bytes(b"old")
    a = AtomicOutput(out, directory=True, where=out, name="w.pt")
    write_synced(a.temp / "w.pt", b"new")
    a.publish_entries(["w.pt"])
    assert (out / "w.pt").read_bytes() == b"new" and (out / "keep.txt").read_bytes() == b"k"
    assert a.moved == 1 and _temps(out) == []


def test_stale_temps_go_live_ones_stay(tmp_path: Path) -> None:
    stale, live = tmp_path / temp_name("m.bb"), tmp_path / temp_name("m.bb")
    other = tmp_path / temp_name("n.bb")
    for p in (stale, live, other):
        p.write_bytes(b"x")
    old = time.time() - 7200
    os.utime(stale, (old, old))
    os.utime(other, (old, old))
    assert remove_stale_temps(tmp_path, "m.bb") == [stale]
    assert live.exists() and other.exists()


def test_temp_names_match_only_their_output() -> None:
    name = temp_name("a.bb")
    assert temp_pattern("a.bb").match(name) and not temp_pattern("b.bb").match(name)
    assert not temp_pattern("a.bb").match(name + "x") and name.startswith(".a.bb" + TEMP_MARK)


@pytest.mark.parametrize("no_link, no_renameat2", [(False, False), (True, False), (True, True)])
def test_rename_no_replace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_link: bool, no_renameat2: bool) -> None:
    """A name that exists is never replaced, whichever way the file system lets the file be
    published: a hard link, Linux's renameat2(RENAME_NOREPLACE), or (neither) a check and a rename."""
    import errno

    from bbformat import fsutil

    if no_link:
        def refuse_link(*a: object, **k: object) -> None:
            raise OSError(errno.EPERM, "no hard links here")

        monkeypatch.setattr(fsutil.os, "link", refuse_link)
    if no_renameat2:
        monkeypatch.setattr(fsutil, "_renameat2_noreplace", lambda src, dst: False)
    src, dst = tmp_path / ".a.bbtmp-0123456789ab", tmp_path / "a"
    src.write_bytes(b"new")
    dst.write_bytes(b"theirs")
    with pytest.raises(FileExistsError):
        fsutil.rename_no_replace(src, dst)
    assert dst.read_bytes() == b"theirs" and src.read_bytes() == b"new"
    dst.unlink()
    fsutil.rename_no_replace(src, dst)
    assert dst.read_bytes() == b"new" and not src.exists() and os.listdir(tmp_path) == ["a"]


def test_publish_without_replace(tmp_path: Path) -> None:
    """AtomicOutput(replace=False): a file is published only under a free name; a staging
    directory's files are moved in only if none is taken, else those moved are taken back."""
    out = tmp_path / "m.bb"
    a = AtomicOutput(out, replace=False)
    assert a.file is not None
    a.file.write(b"new")
    out.write_bytes(b"theirs")
    with pytest.raises(FileExistsError):
        a.publish()
    a.discard()
    assert out.read_bytes() == b"theirs" and _temps(tmp_path) == []
    dst = tmp_path / "d"
    dst.mkdir()
    s = AtomicOutput(dst, directory=True, where=dst, name="d", replace=False)
    for n in ("a.json", "b.json", "w.pt"):
        write_synced(s.temp / n, n.encode())
    (dst / "w.pt").write_bytes(b"theirs")
    with pytest.raises(FileExistsError):
        s.publish_entries(["a.json", "b.json", "w.pt"])
    assert s.moved == 0 and sorted(os.listdir(s.temp)) == ["a.json", "b.json", "w.pt"]
    s.discard()
    assert os.listdir(dst) == ["w.pt"] and (dst / "w.pt").read_bytes() == b"theirs"

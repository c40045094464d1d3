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

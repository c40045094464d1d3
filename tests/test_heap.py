"""bbformat.heap: glibc keeps the memory a command frees while it runs; the library leaves
the process's malloc alone."""
from __future__ import annotations

import ctypes
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from bbformat import cli, heap
from bbformat.api import pack
from bbformat.checkpoint.write import write_checkpoint
from bbformat.reader import Reader
from bbformat.testing import make_tiny_checkpoint

CONFORMANCE = Path(__file__).resolve().parents[1] / "conformance" / "valid"


class FakeLibc:
    """Records mallopt and malloc_trim calls; `refuse` makes mallopt of the mmap threshold fail."""

    def __init__(self, refuse: bool = False) -> None:
        self.calls: list[tuple[str, int, int]] = []
        self.refuse = refuse

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append(("mallopt", param, value))
        return 0 if self.refuse and param == heap.M_MMAP_THRESHOLD else 1

    def malloc_trim(self, pad: int) -> int:
        self.calls.append(("trim", pad, 0))
        return 1


HOLD = [("mallopt", heap.M_MMAP_THRESHOLD, heap.HELD), ("mallopt", heap.M_TRIM_THRESHOLD, heap.HELD)]
LET_GO = [("mallopt", heap.M_MMAP_THRESHOLD, heap.AFTER_MMAP), ("mallopt", heap.M_TRIM_THRESHOLD, heap.AFTER_TRIM),
          ("trim", 0, 0)]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeLibc]:
    assert heap.depth() == 0
    libc = FakeLibc()
    monkeypatch.setattr(heap, "glibc", lambda: libc)
    yield libc
    assert heap.depth() == 0


def test_only_the_outermost_block_sets_and_restores(fake: FakeLibc) -> None:
    with heap.kept():
        assert fake.calls == HOLD and heap.depth() == 1
        with heap.kept():
            assert heap.depth() == 2
        assert fake.calls == HOLD
    assert fake.calls == HOLD + LET_GO
    with pytest.raises(RuntimeError), heap.kept():
        raise RuntimeError("inside")
    assert fake.calls == 2 * (HOLD + LET_GO)


def test_blocks_on_two_threads_overlap(fake: FakeLibc) -> None:
    """A block that ends while another thread's is open restores nothing; the last one does."""
    inside, release = threading.Event(), threading.Event()

    def other() -> None:
        with heap.kept():
            inside.set()
            release.wait(10)

    t = threading.Thread(target=other)
    with heap.kept():
        t.start()
        assert inside.wait(10)
    assert fake.calls == HOLD  # the other thread's block is still open
    release.set()
    t.join(10)
    assert fake.calls == HOLD + LET_GO


def test_a_failed_entry_leaves_nothing_open(monkeypatch: pytest.MonkeyPatch) -> None:
    """An interruption while the thresholds are being set (a signal's exception) rolls back."""
    libc = FakeLibc()

    def interrupted(param: int, value: int) -> int:
        libc.calls.append(("mallopt", param, value))
        if param == heap.M_TRIM_THRESHOLD and value == heap.HELD:
            raise KeyboardInterrupt
        return 1

    monkeypatch.setattr(libc, "mallopt", interrupted)
    monkeypatch.setattr(heap, "glibc", lambda: libc)
    with pytest.raises(KeyboardInterrupt), heap.kept():
        pass
    assert heap.depth() == 0 and not heap.holding() and libc.calls == HOLD + LET_GO


def test_a_failing_command_restores_the_thresholds(fake: FakeLibc, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["verify", str(tmp_path / "missing.bb")]) != 0
    assert fake.calls == HOLD + LET_GO
    capsys.readouterr()


def test_a_glibc_that_refuses_the_threshold_is_left_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    libc = FakeLibc(refuse=True)
    monkeypatch.setattr(heap, "glibc", lambda: libc)
    with heap.kept():
        pass
    assert libc.calls == HOLD[:1] and heap.depth() == 0  # refused: no trim threshold, nothing to restore


@pytest.mark.parametrize("env", [{"BBFORMAT_HEAP": "default"}, {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}]
                         + [{k: "1048576"} for k in heap.USER_SETTINGS])
def test_the_environment_s_own_malloc_settings_are_left_alone(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    heap.glibc.cache_clear()
    try:
        assert heap.glibc() is None
        with heap.kept():  # a no-op
            assert heap.depth() == 0
    finally:
        heap.glibc.cache_clear()


def test_other_tunables_do_not_turn_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in heap.USER_SETTINGS + ("BBFORMAT_HEAP",):
        monkeypatch.delenv(k, raising=False)
    heap.glibc.cache_clear()
    try:
        plain = heap.glibc()
        heap.glibc.cache_clear()
        monkeypatch.setenv("GLIBC_TUNABLES", "glibc.cpu.hwcaps=-AVX512F")
        if plain is None:
            pytest.skip("not glibc on 64-bit Linux")
        assert heap.glibc() is not None
    finally:
        heap.glibc.cache_clear()


def test_the_library_leaves_malloc_alone_and_the_command_holds_it(fake: FakeLibc, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """A decode pass and a pack through the API change nothing; `bbformat verify` runs inside kept()."""
    with Reader(CONFORMANCE / "chain_propagation.bb") as r:
        for _ in r.iter_blocks():
            pass
    ckpt = write_checkpoint(make_tiny_checkpoint("llama", seed=3, layers=1), tmp_path / "ckpt", "safetensors")
    pack(ckpt, tmp_path / "out.bb")
    assert fake.calls == []
    seen: list[int] = []
    real = heap.kept

    @contextmanager
    def watched() -> Iterator[None]:
        with real():
            seen.append(heap.depth())
            yield

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(heap, "kept", watched)
        assert cli.main(["verify", str(tmp_path / "out.bb")]) == 0
    assert seen == [1] and fake.calls == HOLD + LET_GO
    capsys.readouterr()


class Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                                               "uordblks", "fordblks", "keepcost")]


def test_glibc_serves_large_arrays_from_its_heap_inside_and_maps_them_after() -> None:
    """The real glibc, on this (main) thread: inside kept() a 96 MiB array comes from the heap
    (no new mapped block); after it, such an array is mapped on its own again."""
    assert heap.depth() == 0
    heap.glibc.cache_clear()
    libc = heap.glibc()
    if libc is None or not hasattr(libc, "mallinfo2"):
        pytest.skip("not glibc 2.33 or later on 64-bit Linux, or malloc is set by the environment")
    libc.mallinfo2.restype = Mallinfo2

    def mapped() -> int:
        return int(libc.mallinfo2().hblkhd)

    n = 96 << 20
    with heap.kept():
        if not heap.holding():
            pytest.skip("this glibc refuses an mmap threshold over 32 MiB")
        before = mapped()
        a = np.ones(n, np.uint8)
        assert mapped() < before + n
        del a
    before = mapped()
    b = np.ones(n, np.uint8)
    assert mapped() >= before + n
    del b

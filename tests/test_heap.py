"""bbformat.heap: glibc keeps the memory a decode or a pack frees, only while one runs."""
from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import numpy as np
import pytest

from bbformat import heap
from bbformat.api import pack
from bbformat.checkpoint.write import write_checkpoint
from bbformat.reader import Reader
from bbformat.testing import make_tiny_checkpoint

CONFORMANCE = Path(__file__).resolve().parents[1] / "conformance" / "valid"


class FakeLibc:
    """Records mallopt and malloc_trim calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int]] = []

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append(("mallopt", param, value))
        return 1

    def malloc_trim(self, pad: int) -> int:
        self.calls.append(("trim", pad, 0))
        return 1


HOLD = [("mallopt", heap.M_MMAP_THRESHOLD, heap.HELD), ("mallopt", heap.M_TRIM_THRESHOLD, heap.HELD)]
LET_GO = [("mallopt", heap.M_MMAP_THRESHOLD, heap.AFTER_MMAP), ("mallopt", heap.M_TRIM_THRESHOLD, heap.AFTER_TRIM),
          ("trim", 0, 0)]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeLibc:
    libc = FakeLibc()
    monkeypatch.setattr(heap, "glibc", lambda: libc)
    return libc


def test_only_the_outermost_block_sets_and_restores(fake: FakeLibc) -> None:
    with heap.kept():
        assert fake.calls == HOLD
        with heap.kept():
            pass
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


@pytest.mark.parametrize("env", [{"BBFORMAT_HEAP": "default"}, {"MALLOC_ARENA_MAX": "2"},
                                 {"MALLOC_MMAP_THRESHOLD_": "1000000"}, {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}])
def test_the_environment_s_own_malloc_settings_are_left_alone(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    heap.glibc.cache_clear()
    try:
        assert heap.glibc() is None
        with heap.kept():  # a no-op
            pass
    finally:
        heap.glibc.cache_clear()


def test_a_decode_pass_and_a_pack_hold_the_heap_while_they_run(fake: FakeLibc, tmp_path: Path) -> None:
    src = CONFORMANCE / "chain_propagation.bb"
    with Reader(src) as r:
        blocks = r.iter_blocks()
        next(blocks)
        assert fake.calls == HOLD  # held between blocks: the next one reuses the memory
        for _ in blocks:
            pass
    assert fake.calls == HOLD + LET_GO
    fake.calls.clear()
    ckpt = write_checkpoint(make_tiny_checkpoint("llama", seed=3, layers=1), tmp_path / "ckpt", "safetensors")
    pack(ckpt, tmp_path / "out.bb")
    assert fake.calls == HOLD + LET_GO


class Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                                               "uordblks", "fordblks", "keepcost")]


def test_glibc_serves_large_arrays_from_its_heap_inside_and_maps_them_after() -> None:
    """The real glibc, on this (main) thread: inside kept() a 96 MiB array comes from the heap
    (no new mapped block); after it, such an array is mapped on its own again."""
    heap.glibc.cache_clear()
    libc = heap.glibc()
    if libc is None or not hasattr(libc, "mallinfo2"):
        pytest.skip("not glibc 2.33 or later, or malloc is set by the environment")
    libc.mallinfo2.restype = Mallinfo2

    def mapped() -> int:
        return int(libc.mallinfo2().hblkhd)

    n = 96 << 20
    with heap.kept():
        before = mapped()
        a = np.ones(n, np.uint8)
        assert mapped() < before + n
        del a
    before = mapped()
    b = np.ones(n, np.uint8)
    assert mapped() >= before + n
    del b

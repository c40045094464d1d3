"""iter_blocks' workers within the memory budget (max_block_bytes): a block is started only
while the declared working sets of the blocks under way fit in the budget together."""
from __future__ import annotations

import io
import threading
import time
from pathlib import Path

import pytest

from bbformat import Reader
from bbformat.container.chunks import parse_chunk
from bbformat.codec.payload import decode_payload
from bbformat.errors import BBFormatError, LimitError

VALID = Path(__file__).resolve().parent.parent / "conformance" / "valid"
MODEL = VALID / "model_llama_sym.bb"
FILES = sorted(p for p in VALID.glob("*.bb") if p.name.startswith(("model_", "v_parts", "v_exponent", "v_planes", "v_bands_pack")))


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_working_set_is_what_parse_chunk_refuses_above(path: Path) -> None:
    """Reader.working_set reads only a chunk's head; parse_chunk, given the whole chunk, accepts
    it at that budget and refuses it (E_LIMIT_MEMORY) one byte below."""
    with Reader(path) as r:
        flags = r.header.required_flags
        for i in range(len(r)):
            need, raw = r.working_set(i), r.read_chunk_bytes(i)
            assert need > 0
            parse_chunk(raw, max_block_bytes=need, required_flags=flags, decode_payload=decode_payload)
            with pytest.raises(LimitError) as e:
                parse_chunk(raw, max_block_bytes=need - 1, required_flags=flags, decode_payload=decode_payload)
            assert e.value.code == "E_LIMIT_MEMORY"


def _watch(monkeypatch: pytest.MonkeyPatch, r: Reader, delay: float) -> tuple[list[list[int]], set[int], threading.Lock]:
    """Wraps r.decode_block: each start records the blocks then under way (started, not yet
    passed by the caller) with itself; `released` takes what the caller is done with."""
    starts: list[list[int]] = []
    started: list[int] = []
    released: set[int] = set()
    lock = threading.Lock()
    decode = r.decode_block

    def watched(i: int):  # type: ignore[no-untyped-def]
        with lock:
            starts.append([j for j in started if j not in released] + [i])
            started.append(i)
        time.sleep(delay)
        return decode(i)

    monkeypatch.setattr(r, "decode_block", watched)
    return starts, released, lock


def _consume(r: Reader, workers: int, released: set[int], lock: threading.Lock) -> list[tuple[int, dict[str, bytes]]]:
    """Every block, each released just before the next is asked for (the contract)."""
    out: list[tuple[int, dict[str, bytes]]] = []
    it = r.iter_blocks("reverse", workers=workers)
    while True:
        with lock:
            if out:
                released.add(out[-1][0])
        try:
            b = next(it)
        except StopIteration:
            return out
        out.append((b.index, {k: t.tobytes() for k, t in b.tensors.items()}))
        time.sleep(0.02)


@pytest.mark.parametrize("fits", [1, 2, 3])
def test_blocks_under_way_fit_the_budget_and_decode_the_same(monkeypatch: pytest.MonkeyPatch, fits: int) -> None:
    with Reader(MODEL) as r:
        need = [r.working_set(i) for i in range(len(r))]
        serial = [(b.index, {k: t.tobytes() for k, t in b.tensors.items()}) for b in r.iter_blocks("reverse")]
    budget = sum(sorted(need)[-fits:])  # room for the `fits` largest blocks at once
    with Reader(MODEL, max_block_bytes=budget) as r:
        starts, released, lock = _watch(monkeypatch, r, 0.05)
        got = _consume(r, 4, released, lock)
    assert got == serial and len(starts) == len(need) > 3
    for live in starts:
        assert len(live) <= 4 and (len(live) == 1 or sum(need[j] for j in live) <= budget), (live, budget)
    if fits == 1:  # the largest block's alone: so is every block that meets it
        largest = need.index(max(need))
        assert all(live == [largest] or largest not in live for live in starts)


def test_without_a_budget_workers_run_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two workers decode two blocks at the same time (each waits for the other at a barrier)."""
    meet = threading.Barrier(2, timeout=20)
    with Reader(MODEL, max_block_bytes=None) as r:
        decode = r.decode_block

        def together(i: int):  # type: ignore[no-untyped-def]
            if i >= len(r) - 2:  # the first two of a reverse pass
                meet.wait()
            return decode(i)

        monkeypatch.setattr(r, "decode_block", together)
        assert len(list(r.iter_blocks("reverse", workers=2))) == len(r)


def _corrupt_descriptor(data: bytes, chunk: int) -> bytes:
    from bbformat.constants import CHUNK_MAGIC

    with Reader(io.BytesIO(data)) as r:
        e = r.entries[chunk]
    at = e.offset + len(CHUNK_MAGIC) + 4 + 8 + 4  # the fixed header's descriptor_length (SPEC.md 5)
    raw = bytearray(data)
    raw[at : at + 4] = (0xFFFFFFFF).to_bytes(4, "little")
    return bytes(raw)


@pytest.mark.parametrize("workers", [1, 3])
def test_a_chunk_whose_head_cannot_be_read_fails_in_its_turn(workers: int) -> None:
    """working_set is 0 for it (it is started like any other), and the error is the one
    decoding it alone meets, after the blocks before it."""
    data = _corrupt_descriptor(MODEL.read_bytes(), 2)
    with Reader(io.BytesIO(data)) as r:
        assert r.working_set(2) == 0 and r.working_set(1) > 0
        with pytest.raises(BBFormatError) as alone:
            r.decode_block(2)
    with Reader(io.BytesIO(data), max_block_bytes=max(r.working_set(i) for i in (0, 1, 3, 4))) as r:
        got: list[int] = []
        with pytest.raises(BBFormatError) as e:
            for b in r.iter_blocks("reverse", workers=workers):
                got.append(b.index)
    assert got == [4, 3] and e.value.code == alone.value.code

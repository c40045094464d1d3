"""The reader API: random access, reverse order, and forward streaming with awkward read sizes."""
from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bbformat import FormatError, Reader, iter_stream
from bbformat.container.framing import Header
from bbformat.summary import inspect

from conftest import sample_container


class Dribble(io.RawIOBase):
    """A non-seekable stream that returns at most `step` bytes per read."""

    def __init__(self, data: bytes, step: int) -> None:
        self._data, self._pos, self._step = data, 0, step

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = len(self._data)
        take = min(n, self._step, len(self._data) - self._pos)
        out = self._data[self._pos : self._pos + take]
        self._pos += take
        return out


class DribbleInto(Dribble):
    """The same stream, with readinto as well as read (as files and pipes have)."""

    def readinto(self, b) -> int:  # type: ignore[no-untyped-def,override]
        part = self.read(len(b))
        b[: len(part)] = part
        return len(part)


def _tensors(blocks) -> dict:  # type: ignore[no-untyped-def]
    return {n: t for b in blocks for n, t in b.tensors.items()}


@settings(max_examples=40, deadline=None)
@given(step=st.integers(1, 4096), scheme=st.sampled_from(["symmetric", "paper"]), into=st.booleans())
def test_stream_reads_across_every_boundary(step: int, scheme: str, into: bool) -> None:
    data = sample_container(scheme, 0.0 if scheme == "symmetric" else 0.005)
    stream = iter_stream((DribbleInto if into else Dribble)(data, step))  # type: ignore[arg-type]
    assert isinstance(stream.header, Header) and stream.header.chunk_count == len(Reader(io.BytesIO(data)))
    ref = _tensors(Reader(io.BytesIO(data)).iter_blocks())
    got = _tensors(list(stream))
    assert ref.keys() == got.keys() and all(ref[n].equal(got[n]) for n in ref)


def test_blocks_decode_in_any_order(sample_bytes: bytes) -> None:
    r = Reader(io.BytesIO(sample_bytes))
    fwd = _tensors(r.iter_blocks("forward"))
    rev = _tensors(r.iter_blocks("reverse"))
    one = _tensors([r.decode_block(1), r.decode_block(0)])
    assert all(fwd[n].equal(rev[n]) and fwd[n].equal(one[n]) for n in fwd)
    with pytest.raises(IndexError):
        r.read_chunk(2)


@pytest.mark.parametrize("order", ["forward", "reverse"])
@pytest.mark.parametrize("workers", [2, 3, 8])
def test_parallel_decoding_gives_the_same_blocks_in_order(order: str, workers: int) -> None:
    """iter_blocks(workers=N) yields the blocks of workers=1, in the same order, bit for bit,
    on a model container whose chunks have rotation sites of D up to 64."""
    data = (Path(__file__).resolve().parent.parent / "conformance" / "valid" / "model_llama_sym.bb").read_bytes()
    with Reader(io.BytesIO(data)) as r:
        serial = [(b.index, b.name, {k: t.tobytes() for k, t in b.tensors.items()}) for b in r.iter_blocks(order)]
        parallel = [(b.index, b.name, {k: t.tobytes() for k, t in b.tensors.items()}) for b in r.iter_blocks(order, workers=workers)]
    assert parallel == serial and len(serial) > 2


def test_parallel_decoding_refuses_no_workers(sample_bytes: bytes) -> None:
    from bbformat.errors import InputError

    with pytest.raises(InputError):
        next(Reader(io.BytesIO(sample_bytes)).iter_blocks(workers=0))


def test_inspect_agrees_with_independent_sizes(sample_bytes: bytes, tmp_path: Path) -> None:
    p = tmp_path / "s.bb"
    p.write_bytes(sample_bytes)
    info = inspect(p)
    t = info["totals"]
    assert t["container_bytes"] == os.path.getsize(p)
    index_len = 8 + 24 * len(info["blocks"])
    assert t["metadata_bytes"] + sum(b["chunk_bytes"] for b in info["blocks"]) + index_len + 40 == os.path.getsize(p)
    # plain bytes computed from the tensors themselves
    blocks = list(Reader(p).iter_blocks())
    plain = sum(x.bits.nbytes for b in blocks for x in b.tensors.values())
    assert t["plain_bytes"] == plain
    assert t["saved_bits"] == 8 * (plain - (os.path.getsize(p) - t["metadata_bytes"]))


def test_reader_rejects_garbage_cleanly(tmp_path: Path) -> None:
    p = tmp_path / "g.bb"
    p.write_bytes(os.urandom(1000))
    with pytest.raises(FormatError):
        Reader(p)
    p.write_bytes(b"")
    with pytest.raises(FormatError):
        Reader(p)


DUPLICATE = Path(__file__).parent.parent / "conformance" / "optional" / "o_duplicate_tensor_across_chunks.bb"


@pytest.mark.parametrize("order", ["forward", "reverse"])
@pytest.mark.parametrize("workers", [1, 2])
def test_a_tensor_name_in_two_chunks_is_refused(order: str, workers: int, tmp_path: Path) -> None:
    from bbformat import api

    data = DUPLICATE.read_bytes()
    with Reader(DUPLICATE) as r:
        assert len(r) == 2
        names = [set(r.decode_block(i).tensors) for i in range(2)]  # one block at a time: no clash to see
        assert names[0] == names[1]
        with pytest.raises(FormatError, match="in chunk . and again in chunk .") as exc:
            list(r.iter_blocks(order, workers=workers))
    assert exc.value.code == "E_DESCRIPTOR"
    with pytest.raises(FormatError) as exc:
        list(iter_stream(Dribble(data, 97)))
    assert exc.value.code == "E_DESCRIPTOR"
    with pytest.raises(FormatError):
        api.read_tensors(DUPLICATE)
    with pytest.raises(FormatError):
        api.unpack(DUPLICATE, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("source", ["path", "stream"])
@pytest.mark.parametrize("entropy", ["none", "zstd", "planes", "exponent"])
def test_shared_payload_gives_the_same_tensors_as_views(entropy: str, source: str, tmp_path: Path) -> None:
    """share_payload=True (verify, unpack, load_model): the tensors that lie wholly in their
    chunk's payload are views of one buffer, with the same bytes as the owning copies; with
    writable_chunks (load_model) they are writable but for a zstd payload; writing to one
    changes no other tensor; the torch backend takes read-only ones without a warning."""
    import warnings

    import numpy as np

    import bbformat

    path = tmp_path / "s.bb"
    path.write_bytes(sample_container(format_version="1.4", entropy=entropy))
    decoded = {}
    for share in (False, True, "writable"):
        src = path if source == "path" else io.BytesIO(path.read_bytes())
        with Reader(src, share_payload=bool(share), writable_chunks=share == "writable") as r:
            decoded[share] = {n: t for b in r.iter_blocks() for n, t in b.tensors.items()}
    assert {n: t.tobytes() for n, t in decoded["writable"].items()} == {n: t.tobytes() for n, t in decoded[False].items()}
    want = {n: t.tobytes() for n, t in decoded[False].items()}
    assert {n: t.tobytes() for n, t in decoded[True].items()} == want

    def root(a: object) -> int:  # the object at the bottom of a chain of numpy views
        while hasattr(a, "base") and a.base is not None:
            a = a.base
        return id(a)

    owned = [root(t.bits) for t in decoded[False].values()]
    assert len(set(owned)) == len(owned)  # every copy owns its memory
    roots = [root(t.bits) for t in decoded[True].values()]
    shared = [n for n, r in zip(decoded[True], roots) if roots.count(r) > 1]
    assert len(shared) >= 2  # views of one payload
    # views of a raw payload are read-only, unless the chunk was read into a writable mapping; a
    # zstd payload comes back from zstandard as bytes (read-only: torch copies); codecs 2 and 3
    # decode into fresh arrays
    assert all(decoded[True][n].bits.flags.writeable == (entropy in ("planes", "exponent")) for n in shared)
    assert all(decoded["writable"][n].bits.flags.writeable == (entropy != "zstd") for n in shared)
    if entropy != "zstd":
        decoded["writable"][shared[0]].bits[...] = 0  # the views do not overlap
        assert all(decoded["writable"][n].tobytes() == want[n] for n in shared[1:])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert bbformat.verify(path, device="torch:cpu").exact is True
    got = bbformat.read_tensors(path)  # not shared: the caller keeps these
    assert all(not np.shares_memory(got[a].numpy(), got[b].numpy()) for a in got for b in got if a != b)


def test_writable_chunks_reader_fails_and_decodes_as_the_default_one(tmp_path: Path) -> None:
    """Reading chunks into writable mappings (load_model) changes nothing a reader reports:
    on damaged copies of a container, the same error code or the same tensors."""
    import numpy as np

    from bbformat.errors import BBFormatError
    from conftest import DAMAGE, damage

    good = sample_container(format_version="1.4", entropy="exponent")
    rng = np.random.default_rng(11)

    def outcome(path: Path, **kw: bool) -> object:
        try:
            with Reader(path, share_payload=True, **kw) as r:
                return {n: t.tobytes() for b in r.iter_blocks() for n, t in b.tensors.items()}
        except BBFormatError as exc:
            return exc.code

    codes = set()
    for k in range(40):
        path = tmp_path / f"d{k}.bb"
        path.write_bytes(bytes(damage(bytearray(good), rng, DAMAGE[k % len(DAMAGE)])))
        got = outcome(path, writable_chunks=True)
        assert got == outcome(path), k
        codes.add(got if isinstance(got, str) else "decoded")
    assert len(codes) >= 3  # the damage reached several checks


# ---------------------------------------------------------------- read-ahead (one worker)

@pytest.fixture(scope="module")
def model_bb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny sliced Llama packed by today's writer: five chunks, digests, rotation sites."""
    import bbformat
    from bbformat.checkpoint import write_checkpoint
    from bbformat.testing import make_tiny_checkpoint

    d = tmp_path_factory.mktemp("read_ahead")
    write_checkpoint(make_tiny_checkpoint("llama", seed=3, layers=3, hidden=32), d / "src")
    bbformat.pack(d / "src", d / "m.bb")
    return d / "m.bb"


def _blocks(r: Reader, order: str = "forward") -> list[tuple[int, str, dict[str, bytes], bool | None]]:
    return [(b.index, b.name, {k: t.tobytes() for k, t in b.tensors.items()}, b.exact) for b in r.iter_blocks(order)]


def _parsed_on(r: Reader, monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, str]]:
    """(chunk, thread name) of every read_chunk call of reader r from now on."""
    import threading

    calls: list[tuple[int, str]] = []
    real = r.read_chunk

    def spy(i: int):  # type: ignore[no-untyped-def]
        calls.append((i, threading.current_thread().name))
        return real(i)

    monkeypatch.setattr(r, "read_chunk", spy)
    return calls


@pytest.mark.parametrize("order", ["forward", "reverse"])
def test_read_ahead_gives_the_blocks_of_a_reader_without_it(order: str, model_bb: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One worker, the next chunk parsed on the read-ahead thread: the same blocks, bits,
    digests and order as read_ahead_bytes=0, and every chunk but none was really parsed there."""
    with Reader(model_bb, read_ahead_bytes=0) as r:
        calls = _parsed_on(r, monkeypatch)
        want = _blocks(r, order)
        assert all(not name.startswith("bbformat-read-ahead") for _, name in calls)
    with Reader(model_bb) as r:
        calls = _parsed_on(r, monkeypatch)
        got = _blocks(r, order)
        ahead = [i for i, name in calls if name.startswith("bbformat-read-ahead")]
    assert got == want and len(want) > 2 and all(b[3] is True for b in want)
    assert sorted(ahead) == sorted(b[0] for b in want) and len(calls) == len(want)  # each chunk parsed once, there


def test_read_ahead_keeps_to_its_byte_budget(model_bb: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A chunk whose stored bytes plus decoded payload exceed read_ahead_bytes is read by the
    decoding thread in its turn; those within it are read ahead."""
    with Reader(model_bb, read_ahead_bytes=0) as r:
        held = {i: r.entries[i].length + r.read_program(i).payload_symbols() * (r.read_program(i).symbol_bits // 8)
                for i in range(len(r))}
        want = _blocks(r)
    limit = sorted(held.values())[len(held) // 2]
    with Reader(model_bb, read_ahead_bytes=limit) as r:
        calls = _parsed_on(r, monkeypatch)
        assert _blocks(r) == want
    on = {i: name.startswith("bbformat-read-ahead") for i, name in calls}
    assert on == {i: held[i] <= limit for i in held} and any(on.values()) and not all(on.values())


def test_read_ahead_raises_a_damaged_chunk_in_its_turn(model_bb: Path, tmp_path: Path) -> None:
    """A chunk damaged past its descriptor (its CRC fails) or in its descriptor's length (the
    read-ahead cannot even size it): the blocks before it arrive first, then the error it gives
    without read-ahead, with the same code; a pass that stops before it meets no error."""
    from bbformat.errors import BBFormatError

    data = bytearray(model_bb.read_bytes())
    with Reader(model_bb) as r:
        e = r.entries[2]
    for where in (e.offset + e.length - 8, e.offset + 23):  # in the sections; descriptor_length's top byte
        bad = bytearray(data)
        bad[where] ^= 0x40
        path = tmp_path / f"bad{where}.bb"
        path.write_bytes(bytes(bad))
        codes = []
        for budget in (0, "auto"):
            seen = []
            with Reader(path, read_ahead_bytes=budget) as r, pytest.raises(BBFormatError) as exc:
                for b in r.iter_blocks():
                    seen.append(b.index)
            codes.append(exc.value.code)
            assert seen == [0, 1], (where, budget, seen)
            with Reader(path, read_ahead_bytes=budget) as r:
                it = r.iter_blocks()
                assert [next(it).index, next(it).index] == [0, 1]  # chunk 2 is being read ahead now
                it.close()
        assert codes[0] == codes[1] == "E_CRC_CHUNK", (where, codes)


def test_read_ahead_of_a_pass_left_early_and_bad_budgets(model_bb: Path) -> None:
    """A pass left after its first block, or left open when the reader closes, or ended by an
    error in the caller's loop, leaves no read-ahead thread behind; a negative or non-integer
    budget is an InputError."""
    import threading

    from bbformat.errors import InputError

    def ahead() -> int:
        return sum(t.name.startswith("bbformat-read-ahead") for t in threading.enumerate())

    with Reader(model_bb) as r:
        it = r.iter_blocks()
        assert next(it).index == 0 and ahead() == 1
        it.close()
    assert ahead() == 0
    r = Reader(model_bb)
    it = r.iter_blocks()
    assert next(it).index == 0 and ahead() == 1
    r.close()  # the pass is still open: its read-ahead ends before the file does
    assert ahead() == 0
    it.close()
    with Reader(model_bb) as r, pytest.raises(ZeroDivisionError):
        for b in r.iter_blocks():
            1 / 0
    assert ahead() == 0
    for bad in (-1, 1.5, "lots", True):
        with pytest.raises(InputError, match="read_ahead_bytes"):
            Reader(model_bb, read_ahead_bytes=bad)  # type: ignore[arg-type]

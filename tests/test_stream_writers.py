"""bbformat.stream_writers: files written tensor by tensor, in any order, equal to what
safetensors.torch.save and torch.save write for the same tensors."""
from __future__ import annotations

import io
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import textwrap
import zipfile
from pathlib import Path

import pytest
import safetensors.torch
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bbformat import stream_writers
from bbformat.errors import BBFormatError, InputError
from bbformat.stream_writers import SafetensorsWriter, TorchZipWriter

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
BITS = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32}
SHAPES = st.one_of(st.just(()), st.lists(st.integers(0, 5), min_size=1, max_size=3).map(tuple))
# any text safetensors can hold: no lone surrogates (not UTF-8), not its reserved key
ST_NAMES = st.text(st.characters(codec="utf-8"), max_size=8).filter(lambda s: s != "__metadata__")
PT_NAMES = st.one_of(st.from_regex(r"[a-z_][a-z0-9_]{0,5}(\.[a-z0-9_]{1,5}){0,3}", fullmatch=True),
                     st.integers(0, 20).map(str), st.sampled_from(["cpu", "storage", "data", "model.layers.0.mlp_shortcut_Q"]))


def _tensor(shape: tuple[int, ...], dtype: torch.dtype, seed: int, kind: str) -> torch.Tensor:
    """Random values, as a tensor of its own or as a view into a larger storage."""
    g = torch.Generator().manual_seed(seed)

    def rand(*s: int) -> torch.Tensor:
        return (torch.randn(s, generator=g) * 3).to(dtype)

    if kind == "offset":  # contiguous, at an offset in a larger storage
        return rand(torch.Size(shape).numel() + 3)[3:].view(shape)
    if kind == "transposed" and len(shape) > 1:
        return rand(*shape[:-2], shape[-1], shape[-2]).transpose(-1, -2)
    if kind == "strided" and shape:
        return rand(2 * shape[0], *shape[1:])[::2]
    return rand(*shape)


def _tensors(draw: st.DrawFn, names: st.SearchStrategy[str], max_size: int) -> dict[str, torch.Tensor]:
    keys = draw(st.lists(names, max_size=max_size, unique=True))
    kinds = st.sampled_from(["plain", "offset", "transposed", "strided"])
    return {k: _tensor(draw(SHAPES), draw(st.sampled_from(DTYPES)), i, draw(kinds)) for i, k in enumerate(keys)}


@st.composite
def st_case(draw: st.DrawFn) -> tuple[dict[str, torch.Tensor], dict[str, str] | None, list[str]]:
    tensors = _tensors(draw, ST_NAMES, 6)
    values = st.text(st.characters(codec="utf-8"), max_size=6)
    metadata = draw(st.one_of(st.none(), st.dictionaries(ST_NAMES, values, max_size=3)))
    return tensors, metadata, draw(st.permutations(list(tensors)))


@st.composite
def pt_case(draw: st.DrawFn) -> tuple[dict[str, torch.Tensor], list[str]]:
    tensors = _tensors(draw, PT_NAMES, 6)
    return tensors, draw(st.permutations(list(tensors)))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(BITS[t.dtype])


def _st_write(tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None, order: list[str]) -> bytes:
    buf = io.BytesIO()
    w = SafetensorsWriter(buf, [(k, v.dtype, tuple(v.shape)) for k, v in tensors.items()], metadata)
    for k in order:
        w.write(k, tensors[k])
    w.finish()
    return buf.getvalue()


def _header(data: bytes) -> tuple[int, dict[str, object]]:
    (n,) = struct.unpack("<Q", data[:8])
    return n, json.loads(data[8 : 8 + n])


# ---------------------------------------------------------------------------- safetensors


@settings(max_examples=150, deadline=None)
@given(st_case())
def test_safetensors_equals_safetensors_save(case: tuple[dict[str, torch.Tensor], dict[str, str] | None, list[str]]) -> None:
    tensors, metadata, order = case
    ours = _st_write(tensors, metadata, order)
    loaded = safetensors.torch.load(ours)
    assert set(loaded) == set(tensors)
    for k, v in tensors.items():
        assert loaded[k].dtype == v.dtype and loaded[k].shape == v.shape and torch.equal(_bits(loaded[k]), _bits(v))
    if not tensors and metadata == {}:
        return  # safetensors 0.8 writes an unreadable header here ('{},"__metadata__":{}}'); ours is valid
    ref = safetensors.torch.save({k: v.contiguous() for k, v in tensors.items()}, metadata=metadata)
    if metadata is None or len(metadata) <= 1:
        assert ours == ref
    else:  # safetensors orders metadata keys at random (a Rust HashMap): all else is equal
        n, header = _header(ref)
        assert _header(ours) == (n, header) and ours[8 + n :] == ref[8 + n :]


def test_safetensors_order_rule_over_all_supported_dtypes() -> None:
    """Data area: dtype descending in safetensors' enum order, then name; every supported dtype."""
    tensors = {f"t{i}": torch.ones(2, dtype=d) for i, d in enumerate(stream_writers._ST_CODE)}
    tensors |= {f"s{i}": torch.zeros(1, dtype=d) for i, d in enumerate(stream_writers._ST_CODE)}
    order = list(tensors)
    random.Random(3).shuffle(order)
    assert _st_write(tensors, {"format": "pt"}, order) == safetensors.torch.save(tensors, metadata={"format": "pt"})


def test_safetensors_writes_into_a_real_file_at_its_final_size(tmp_path: Path) -> None:
    tensors = {"b": torch.arange(6, dtype=torch.float32).reshape(2, 3), "a": torch.ones(4, dtype=torch.float16)}
    path = tmp_path / "x.safetensors"
    with open(path, "wb") as f:
        w = SafetensorsWriter(f, [(k, v.dtype, tuple(v.shape)) for k, v in tensors.items()], {"format": "pt"})
        assert os.fstat(f.fileno()).st_size == len(safetensors.torch.save(tensors, metadata={"format": "pt"}))
        w.write("a", tensors["a"])
        w.write("b", tensors["b"])
        w.finish()
    assert path.read_bytes() == safetensors.torch.save(tensors, metadata={"format": "pt"})


def test_safetensors_refuses_caller_mistakes() -> None:
    specs = [("a", torch.float16, (2, 3)), ("b", torch.float32, ())]
    w = SafetensorsWriter(io.BytesIO(), specs)
    with pytest.raises(InputError, match="not one of"):
        w.write("c", torch.zeros(()))
    with pytest.raises(InputError, match=r"expected torch.float16 \[2, 3\], got torch.float32"):
        w.write("a", torch.zeros(2, 3))
    with pytest.raises(InputError, match=r"got torch.float16 \[3, 2\]"):
        w.write("a", torch.zeros(3, 2, dtype=torch.float16))
    w.write("a", torch.zeros(2, 3, dtype=torch.float16))
    with pytest.raises(InputError, match="already written"):
        w.write("a", torch.zeros(2, 3, dtype=torch.float16))
    with pytest.raises(InputError, match="1 tensor.*never written: 'b'"):
        w.finish()
    w.write("b", torch.zeros(()))
    w.finish()
    with pytest.raises(InputError, match="already finished"):
        w.write("b", torch.zeros(()))
    for bad, text in (([("a", torch.float16, (1,)), ("a", torch.float16, (1,))], "twice"),
                      ([("__metadata__", torch.float16, (1,))], "__metadata__"),
                      ([("a", torch.complex64, (1,))], "not supported"), ([("a", torch.float16, (-1,))], "non-negative")):
        with pytest.raises(InputError, match=text):
            SafetensorsWriter(io.BytesIO(), bad)
    with pytest.raises(InputError, match="strings"):
        SafetensorsWriter(io.BytesIO(), specs, {"a": 1})  # type: ignore[dict-item]


# ---------------------------------------------------------------------------- torch zip


def _zip_records(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as z:
        return {i.filename: z.read(i) for i in z.infolist()}


def _check_pt(tensors: dict[str, torch.Tensor], order: list[str], work: Path, name: str = "model.pt") -> None:
    (work / "ours").mkdir()
    (work / "ref").mkdir()
    ours, ref = work / "ours" / name, work / "ref" / name
    w = TorchZipWriter(ours, list(tensors))
    for k in order:
        w.write(k, tensors[k])
    w.finish()
    for mmap in (False, True):
        loaded = torch.load(ours, weights_only=True, mmap=mmap)
        assert list(loaded) == list(tensors)
        for k, v in tensors.items():
            assert loaded[k].dtype == v.dtype and loaded[k].shape == v.shape and torch.equal(_bits(loaded[k]), _bits(v))
    torch.save({k: v.contiguous().clone() for k, v in tensors.items()}, ref)
    a, b = _zip_records(ours), _zip_records(ref)
    assert set(a) == set(b)
    for record in b:
        if not record.endswith("/.data/serialization_id"):  # a hash over the records in archive order
            assert a[record] == b[record], record


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pt_case())
def test_torch_zip_equals_torch_save(tmp_path: Path, case: tuple[dict[str, torch.Tensor], list[str]]) -> None:
    tensors, order = case
    with tempfile.TemporaryDirectory(dir=tmp_path) as work:
        _check_pt(tensors, order, Path(work))


def test_torch_zip_non_ascii_path_as_torch_save(tmp_path: Path) -> None:
    """torch.save writes a non-ASCII path through a Python file (root folder 'archive'): so do we."""
    tensors = {"a": torch.ones(3, dtype=torch.bfloat16), "b.c": torch.zeros(2, 2)}
    _check_pt(tensors, ["b.c", "a"], tmp_path, "modèle.pt")
    assert all(n.startswith("archive/") for n in _zip_records(tmp_path / "ours" / "modèle.pt"))


def test_torch_zip_refuses_caller_mistakes(tmp_path: Path) -> None:
    path = tmp_path / "m.pt"
    w = TorchZipWriter(path, ["a", "b"])
    with pytest.raises(InputError, match="not one of"):
        w.write("c", torch.zeros(1))
    w.write("a", torch.zeros(1))
    with pytest.raises(InputError, match="already written"):
        w.write("a", torch.zeros(1))
    with pytest.raises(InputError, match="complex64"):
        w.write("b", torch.zeros(1, dtype=torch.complex64))
    with pytest.raises(InputError, match="never written: 'b'"):
        w.finish()
    w.abort()
    w.abort()
    with pytest.raises(InputError, match="closed"):
        w.write("b", torch.zeros(1))
    with pytest.raises(InputError, match="twice"):
        TorchZipWriter(path, ["a", "a"])
    with pytest.raises(FileNotFoundError):
        TorchZipWriter(tmp_path / "missing" / "m.pt", ["a"])
    with pytest.raises(InputError, match="CPU"):
        TorchZipWriter(path, ["a"]).write("a", torch.zeros(2).to_sparse())


def test_torch_zip_pins_the_torch_internals_it_copies(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert torch.__version__.startswith(stream_writers.TORCH_PIN)
    names = torch.storage._dtype_to_storage_type_map()
    assert {d: names[d] for d in stream_writers._STORAGE} == stream_writers._STORAGE
    assert not set(stream_writers._STORAGE) & torch.storage._new_dtypes()  # all rebuilt by _rebuild_tensor_v2
    func, args = torch.ones(2)._reduce_ex_internal(2)  # type: ignore[no-untyped-call]
    assert func is torch._utils._rebuild_tensor_v2 and len(args) == 6
    assert torch.serialization.DEFAULT_PROTOCOL == 2
    monkeypatch.setattr(torch, "__version__", "2.14.0")
    with pytest.raises(BBFormatError, match="2.13"):
        TorchZipWriter(tmp_path / "m.pt", ["a"])


def test_torch_zip_disk_full_is_an_oserror_and_the_process_survives(tmp_path: Path) -> None:
    """torch's C++ writer aborts the process if a failed archive is finalized in its destructor:
    a failed write closes it first, and the OSError (ENOSPC) is recovered."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    code = textwrap.dedent("""
        import errno, torch
        from bbformat.stream_writers import TorchZipWriter
        w = TorchZipWriter("/dev/full", ["a", "b"])
        try:
            w.write("a", torch.ones(1 << 20))
            w.write("b", torch.ones(1 << 20))
            w.finish()
        except OSError as exc:
            print("errno", exc.errno == errno.ENOSPC)
        w.abort()
        del w
        print("alive")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    assert r.returncode == 0 and r.stdout.split() == ["errno", "True", "alive"], r.stdout + r.stderr


def test_writers_make_no_copy_of_a_tensor(tmp_path: Path) -> None:
    """A 256 MiB tensor at an offset in a larger storage is written by both writers without
    the process's peak RSS growing by a copy of it."""
    code = textwrap.dedent(f"""
        import torch
        from bbformat.stream_writers import SafetensorsWriter, TorchZipWriter
        def hwm():
            return int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1]) << 10
        big = torch.ones((1 << 27) + 64, dtype=torch.float16)
        t = big[64:].view(1 << 14, 1 << 13)  # 256 MiB at an offset
        before = hwm()
        with open({str(tmp_path / 'x.safetensors')!r}, "wb") as f:
            w = SafetensorsWriter(f, [("t", t.dtype, tuple(t.shape))])
            w.write("t", t)
            w.finish()
        z = TorchZipWriter({str(tmp_path / 'x.pt')!r}, ["t"])
        z.write("t", t)
        z.finish()
        print((hwm() - before) >> 20)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    assert r.returncode == 0, r.stderr
    assert int(r.stdout) < 48, f"peak RSS grew by {r.stdout.strip()} MiB"
    loaded = torch.load(tmp_path / "x.pt", weights_only=True, mmap=True)["t"]
    assert loaded.shape == (1 << 14, 1 << 13) and bool((loaded[::997] == 1).all())


@pytest.mark.slow
def test_torch_zip64_archive_over_4_gib_loads_with_mmap(tmp_path: Path) -> None:
    if shutil.disk_usage(tmp_path).free < 15 * 10**9:
        pytest.skip("needs 15 GB of free disk")
    path = tmp_path / "big.pt"
    names = ["a", "b", "c"]
    n = 3 * (1 << 28)  # 1.5 GiB of float16 each
    w = TorchZipWriter(path, names)
    for i, k in reversed(list(enumerate(names))):
        t = torch.full((n,), float(i + 1), dtype=torch.float16)
        t[-1] = -(i + 1)
        w.write(k, t)
        del t
    w.finish()
    assert path.stat().st_size > 4.5 * 2**30
    loaded = torch.load(path, weights_only=True, mmap=True)
    assert list(loaded) == names
    for i, k in enumerate(names):
        t = loaded[k]
        assert t.shape == (n,) and float(t[0]) == i + 1 and float(t[n // 2]) == i + 1 and float(t[-1]) == -(i + 1)
    with zipfile.ZipFile(path) as z:
        assert max(info.header_offset for info in z.infolist()) > 2**32

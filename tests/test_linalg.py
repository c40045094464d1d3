"""The linear-algebra backends (codec/linalg.py): the torch backend on the CPU runs the same
code path a GPU runs, so everything here holds for `--device cuda` but for the device's own
floating point, which the digests check. CUDA-only tests are marked `gpu` and skip without one."""
from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from bbformat import api
from bbformat.checkpoint import write_checkpoint
from bbformat.codec import rotation as rot
from bbformat.codec.dtypes import RawTensor
from bbformat.codec.linalg import REFERENCE, NumpyLinalg, TorchLinalg, device_backend
from bbformat.errors import DeviceError, DigestError, InputError
from bbformat.loader import load_model
from bbformat.reader import Reader
from bbformat.testing import make_tiny_checkpoint

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conformance"
sys.path.insert(0, str(CONF))
import impl_python  # noqa: E402
import run as runner  # noqa: E402

MANIFEST = json.loads((CONF / "manifest.json").read_text())
ACCEPTED = [v for v in MANIFEST["vectors"] if v["expected"] == "accept"]
HAS_CUDA = torch.cuda.is_available()
gpu = pytest.mark.gpu


def _has_digests(path: Path) -> bool:
    return bool(path.read_bytes()[12] & 0x2)


# ---- the backend object ---------------------------------------------------------------------


def test_device_specs() -> None:
    assert device_backend(None) is REFERENCE and device_backend("cpu") is REFERENCE
    assert device_backend("numpy").is_reference
    la = device_backend("numpy:scipy-evr:2")
    assert isinstance(la, NumpyLinalg) and (la.solver, la.blas_threads, la.name) == ("scipy-evr", 2, "numpy:scipy-evr:2")
    assert device_backend("numpy:numpy:unpinned").blas_threads is None
    t = device_backend("torch:cpu")
    assert isinstance(t, TorchLinalg) and t.name == "torch:cpu" and not t.is_reference
    assert device_backend(t) is t  # a backend object passes through
    for bad in ("gpu", "numpy:lapack", "numpy:numpy:0", "numpy:numpy:1:2", "torch:nonsense"):
        with pytest.raises(InputError):
            device_backend(bad)


@pytest.mark.skipif(HAS_CUDA, reason="a GPU is present")
@pytest.mark.parametrize("spec", ["cuda", "cuda:0", "torch:cuda"])
def test_missing_gpu_is_a_device_error(spec: str) -> None:
    with pytest.raises(DeviceError) as e:
        device_backend(spec)
    assert e.value.code == "E_DEVICE" and e.value.exit_status == 10 and "\n" not in str(e.value)


def test_widening_is_exact_for_every_bit_pattern() -> None:
    """The torch backend uploads bit patterns and widens on the device; that must give numpy's
    float64 values for every float16 and bfloat16 pattern and for float32 edge cases."""
    t = TorchLinalg("cpu")
    patterns = {"float16": np.arange(1 << 16, dtype=np.uint16), "bfloat16": np.arange(1 << 16, dtype=np.uint16)}
    edge32 = np.array([0, 1, 2, 0x7FFFFF, 0x800000, 0x3F800000, 0x7F7FFFFF, 0x7F800000, 0x7FC00000, 0x80000001, 0xFF800000,
                       0x00400000, 0x33800000], dtype=np.uint32)
    patterns["float32"] = np.concatenate([edge32, np.random.default_rng(0).integers(0, 1 << 32, 100_000, dtype=np.uint64).astype(np.uint32)])
    for dtype, bits in patterns.items():
        raw = RawTensor(dtype, bits.reshape(-1, 4) if bits.size % 4 == 0 else bits)
        want = raw.to_f64()
        got = t.host(t.widen(raw))
        assert got.shape == want.shape
        nan = np.isnan(want)
        assert np.array_equal(np.isnan(got), nan), dtype
        assert np.array_equal(got[~nan].view(np.uint64), want[~nan].view(np.uint64)), dtype  # -0.0 included


@pytest.mark.parametrize("d", [1, 2, 7, 64])
def test_block_layout_matches_the_reference(d: int) -> None:
    t = TorchLinalg("cpu")
    rng = np.random.default_rng(d)
    values = rng.normal(size=rot.block_size(d))
    x_ref = rot.block_to_matrix(values, d)
    x_t = t.host(t.from_block(values, d))
    assert np.array_equal(x_ref, x_t)
    assert np.array_equal(t.block(t.asarray(x_ref)), rot.matrix_to_block(x_ref))


def test_backends_agree_to_rounding() -> None:
    """Gram, eigh, regeneration and rotation on torch land within float64 rounding of numpy."""
    t = TorchLinalg("cpu")
    rng = np.random.default_rng(1)
    m = rng.normal(size=(90, 40))
    for la in (REFERENCE, t):
        g = la.gram(la.asarray(m))
        w, e = la.eigh(g)
        x = la.regenerate(e, w, False)
        assert np.abs(la.host(x) - m.T @ m).max() < 1e-10
        assert np.abs(la.host(la.rotate(la.asarray(m), 1, e)) - m @ la.host(e)).max() < 1e-12


# ---- decoding -------------------------------------------------------------------------------


def test_every_accepted_vector_decodes_bit_exactly_through_torch() -> None:
    """Every accepted conformance vector, read with --device torch:cpu, gives the manifest's bits:
    1.2 files through torch itself (the fallback off: no chunk may miss its digest), 1.0/1.1
    files through the reference (they carry no digests), with the reader's note saying so."""
    bad, through_torch, via_reference = [], 0, 0
    for v in ACCEPTED:
        path = CONF / v["path"]
        res = impl_python.decode_path(path, device="torch:cpu")
        for name, want in v["tensors"].items():
            got = res["tensors"].get(name) if res["result"] == "accept" else None
            if got is None or got["sha256"] != want["sha256"]:
                bad.append(f"{v['id']} {name}")
        with Reader(path, device="torch:cpu", fallback=False) as r:
            if _has_digests(path):
                assert r.linalg.name == "torch:cpu" and r.note is None
                assert all(b.exact for b in r.iter_blocks()), v["id"]
                through_torch += 1
            else:
                assert r.linalg is REFERENCE and "no digests" in (r.note or "")
                via_reference += 1
    assert not bad, bad
    assert through_torch >= 10 and via_reference >= 10, (through_torch, via_reference)


class Perturbed(TorchLinalg):
    """A device whose regenerated values are off by far more than any band: every site misses."""

    def regenerate(self, e, mu, paper):  # type: ignore[no-untyped-def]
        return super().regenerate(e, mu, paper) * (1 + 1e-3)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("linalg")
    src = root / "src"
    write_checkpoint(make_tiny_checkpoint("llama", seed=5, layers=2), src)
    out = {"src": src}
    for name, kw in {"ref": {}, "torch": {"device": "torch:cpu"}, "torch_paper": {"device": "torch:cpu", "scheme": "paper", "tolerance": 0.005},
                     "v11": {"format_version": "1.1"}}.items():
        out[name] = root / f"{name}.bb"
        api.pack(src, out[name], verify=True, **kw)  # type: ignore[arg-type]
    return out


def test_a_missed_chunk_falls_back_to_the_reference(tiny: dict[str, Path]) -> None:
    dev = Perturbed("cpu")
    rep = api.verify(tiny["ref"], device=dev)
    assert rep.exact is True and rep.device == "torch:cpu"
    assert rep.fallback and len(rep.fallback) == sum(1 for s in _sites(tiny["ref"]) if not s)  # every chunk with a rotated site
    assert "decoded again with the reference" in rep.summary()
    assert rep.as_dict()["fallback_chunks"] == rep.fallback
    with Reader(tiny["ref"], device=dev, fallback=False, allow_inexact=True) as r, pytest.raises(DigestError) as e:
        list(r.iter_blocks())  # without the fallback the device's own failure shows: the numerics', never the file's
    assert "left the file's band" in str(e.value) or "decoded to other values" in str(e.value)
    with pytest.warns(api.DeviceNote, match="missed their digests"):
        got = api.read_tensors(tiny["ref"], device=dev)
    want = api.read_tensors(tiny["ref"])
    assert list(got) == list(want)
    assert all(torch.equal(got[k].contiguous().view(torch.uint8), want[k].contiguous().view(torch.uint8)) for k in want)


def _sites(path: Path) -> list[bool]:
    """Per chunk: True when it has no rotated (non-plain) site."""
    with Reader(path) as r:
        return [all(s.plain for s in r.read_program(i).sites) for i in range(len(r))]


def test_packed_through_torch_verifies_on_the_reference(tiny: dict[str, Path]) -> None:
    """Files packed with torch's numerics (its simulation of the decoder and its band) verify
    every digest with the numpy reference, with no fallback on torch itself."""
    for key in ("torch", "torch_paper"):
        assert api.verify(tiny[key]).exact is True
        rep = api.verify(tiny[key], device="torch:cpu")
        assert rep.exact is True and not rep.fallback
        assert sum(not plain for plain in _sites(tiny[key])) >= 2, "the test needs rotated sites"


def test_c_reader_verifies_a_torch_packed_file(tiny: dict[str, Path], tmp_path: Path) -> None:
    if not runner.c_sources_exist():
        pytest.skip("no C reader sources")
    binary, log = runner.build_c()
    if binary is None:
        pytest.skip(f"C reader not built: {log[-300:]}")
    ref = impl_python.decode_path(tiny["torch"])
    for key in ("torch", "torch_paper"):
        p = subprocess.run([str(binary), str(tiny[key]), "--out", str(tmp_path / key)], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stdout + p.stderr
        got = json.loads(p.stdout)
        assert got["result"] == "accept"
        if key == "torch":
            assert {n: t["sha256"] for n, t in got["tensors"].items()} == {n: t["sha256"] for n, t in ref["tensors"].items()}


def test_torch_pack_is_deterministic(tiny: dict[str, Path], tmp_path: Path) -> None:
    again = tmp_path / "again.bb"
    api.pack(tiny["src"], again, device="torch:cpu")
    assert again.read_bytes() == tiny["torch"].read_bytes()


def test_old_files_decode_with_the_reference_and_say_so(tiny: dict[str, Path]) -> None:
    rep = api.verify(tiny["v11"], device="torch:cpu")
    assert rep.device == "cpu" and rep.exact is None and "no digests" in (rep.note or "")
    with pytest.warns(api.DeviceNote, match="no digests"):
        api.read_tensors(tiny["v11"], device="torch:cpu")


def test_load_model_on_a_torch_device(tiny: dict[str, Path]) -> None:
    ids = torch.tensor([[1, 5, 9, 3, 7, 2]])
    want = load_model(tiny["ref"], dtype=torch.float32)(ids).logits
    for dev in ("cpu", "torch:cpu"):
        model = load_model(tiny["ref"], dtype=torch.float32, device=dev)
        assert all(p.device.type == "cpu" for p in model.parameters())
        assert torch.equal(model(ids).logits, want)
    out = load_model(tiny["ref"], device="torch:cpu").generate(ids, max_new_tokens=3, do_sample=False)
    assert out.shape == (1, 9)


class OutOfMemory(TorchLinalg):
    def eigh(self, g):  # type: ignore[no-untyped-def]
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


def test_out_of_memory_is_a_device_error_and_writes_nothing(tiny: dict[str, Path], tmp_path: Path) -> None:
    dst = tmp_path / "out"
    with pytest.raises(DeviceError, match="out of memory"):
        api.unpack(tiny["ref"], dst, device=OutOfMemory("cpu"))
    assert not dst.exists()
    bb = tmp_path / "x.bb"
    with pytest.raises(DeviceError, match="out of memory"):
        api.pack(tiny["src"], bb, device=OutOfMemory("cpu"))
    assert not bb.exists() and not list(tmp_path.glob(".x.bb*"))


def test_cli_device_errors_and_notes(tiny: dict[str, Path], tmp_path: Path) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "bbformat", *args], capture_output=True, text=True, timeout=300)

    p = cli("verify", str(tiny["torch"]), "--device", "torch:cpu", "--json")
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert rep["exact"] is True and rep["device"] == "torch:cpu" and rep["fallback_chunks"] == []
    p = cli("verify", str(tiny["v11"]), "--device", "torch:cpu")
    assert p.returncode == 0 and "bbformat: note:" in p.stderr and "no digests" in p.stderr
    p = cli("unpack", str(tiny["v11"]), str(tmp_path / "u"), "--device", "torch:cpu")
    assert p.returncode == 0 and "no digests" in p.stderr
    p = cli("verify", str(tiny["ref"]), "--device", "bogus")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "unknown device" in p.stderr
    if not HAS_CUDA:
        for args in (("pack", str(tiny["src"]), str(tmp_path / "g.bb")), ("unpack", str(tiny["ref"]), str(tmp_path / "g"))):
            p = cli(*args, "--device", "cuda")
            assert p.returncode == 10, p.stderr
            assert p.stderr.startswith("bbformat: error [E_DEVICE]:") and p.stderr.count("\n") == 1
        assert not (tmp_path / "g.bb").exists() and not (tmp_path / "g").exists()


# ---- on a GPU (skipped without one; CI has none) ---------------------------------------------


@gpu
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")
def test_gpu_decodes_every_digest_vector_itself() -> None:
    for v in ACCEPTED:
        path = CONF / v["path"]
        if _has_digests(path):
            with Reader(path, device="cuda", fallback=False) as r:
                assert all(b.exact for b in r.iter_blocks()), v["id"]


@gpu
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")
def test_gpu_pack_verifies_on_the_reference(tiny: dict[str, Path], tmp_path: Path) -> None:
    for scheme in ("symmetric", "paper"):
        dst = tmp_path / f"{scheme}.bb"
        api.pack(tiny["src"], dst, device="cuda", scheme=scheme, verify=True)
        assert api.verify(dst).exact is True
        assert not api.verify(dst, device="cuda").fallback
    model = load_model(tiny["ref"], device="cuda")
    assert next(model.parameters()).device.type == "cuda"
    with warnings.catch_warnings():
        warnings.simplefilter("error", api.DeviceNote)
        model(torch.tensor([[1, 2, 3]], device="cuda"))

"""Format 1.2: content digests (SPEC.md 5.4), the encoder's band (SPEC.md 9, 12.6) and mixed
corrections (SPEC.md 8.4), through every reader surface."""
from __future__ import annotations

import io
import subprocess
import sys
import warnings
from pathlib import Path

import crc32c
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from bbformat.constants import RequiredFlag, SectionKind
from bbformat.checkpoint import write_checkpoint
from bbformat.api import InexactWarning, pack, read_tensors, unpack, verify
from bbformat.codec import band
from bbformat.codec.dtypes import RawTensor, f64_to_bits
from bbformat.codec.encoder import encode_chunk
from bbformat.codec.layout import ChunkLayout, SiteSpec
from bbformat.codec.linalg import NumpyLinalg
from bbformat.container.program import AxisRef
from bbformat.container import records as R
from bbformat.container.rebuild import split
from bbformat.errors import DigestError
from bbformat.loader import load_model
from bbformat.reader import Reader, iter_stream
from bbformat.testing import make_tiny_checkpoint
from conftest import sample_container, with_content_crc

HERE = Path(__file__).parent
DTYPES = ("float16", "bfloat16", "float32")


def _model(tmp_path: Path, dtype: str, name: str = "m") -> Path:
    ck = make_tiny_checkpoint("llama", seed=11, layers=2, hidden=32, heads=4, kv_heads=2, vocab=48, max_positions=16, dtype=dtype)
    write_checkpoint(ck, tmp_path / name)
    return tmp_path / name


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A verified 1.2 container per dtype (symmetric, exact)."""
    root = tmp_path_factory.mktemp("digests")
    out = {}
    for dtype in DTYPES:
        out[dtype] = root / f"{dtype}.bb"
        pack(_model(root, dtype, dtype), out[dtype], verify=True, format_version="1.2")
    return out


def _damaged(src: Path, dst: Path, chunk: int = 1) -> Path:
    data = src.read_bytes()
    old = int.from_bytes(split(data).chunks[chunk][4:8], "little")
    dst.write_bytes(with_content_crc(data, chunk, old ^ 1))
    return dst


def test_digest_is_the_crc32c_of_the_decoded_tensors(packed: dict[str, Path]) -> None:
    """content_crc computed independently: crc32c over each decoded tensor's bytes in record order."""
    for path in packed.values():
        with Reader(path) as r:
            assert r.header.minor == 2 and r.header.required_flags & RequiredFlag.DIGESTS and r.has_digests
            for i in range(len(r)):
                chunk = r.read_chunk(i)
                block = r.decode_block(i)
                value = 0
                for t in chunk.program.tensors:
                    value = crc32c.crc32c(block.tensors[t.name].bits.astype(block.tensors[t.name].bits.dtype.newbyteorder("<")).tobytes(), value)
                assert chunk.content_crc == value and block.exact is True


def test_verify_reports_exact(packed: dict[str, Path]) -> None:
    rep = verify(packed["float32"])
    assert rep.exact is True and rep.digests and not rep.inexact
    assert rep.summary().endswith(f"exact: all {rep.chunks} chunks verified ({rep.tensors} tensors, {rep.values:,} values)")


def test_a_digest_mismatch_is_refused_by_every_reader(packed: dict[str, Path], tmp_path: Path) -> None:
    bad = _damaged(packed["float16"], tmp_path / "bad.bb")
    with Reader(bad) as r:
        with pytest.raises(DigestError) as ei:
            r.decode_block(1)
        assert ei.value.code == "E_DIGEST" and ei.value.exit_status == 9 and "chunk 1" in str(ei.value)
        r.decode_block(0)  # the other chunks are fine
        for workers in (1, 2):
            with pytest.raises(DigestError):
                list(r.iter_blocks(workers=workers))
    with pytest.raises(DigestError):
        list(iter_stream(io.BytesIO(bad.read_bytes())))
    with pytest.raises(DigestError):
        read_tensors(bad)
    with pytest.raises(DigestError):
        load_model(bad)
    with pytest.raises(DigestError):
        unpack(bad, tmp_path / "u")
    assert not (tmp_path / "u").exists()


def test_allow_inexact_decodes_and_names_the_chunks(packed: dict[str, Path], tmp_path: Path) -> None:
    bad = _damaged(packed["float16"], tmp_path / "bad.bb")
    with Reader(bad, allow_inexact=True) as r:
        assert [b.exact for b in r.iter_blocks()] == [True, False] + [True] * (len(r) - 2)
    blocks = list(iter_stream(io.BytesIO(bad.read_bytes()), allow_inexact=True))
    assert [b.exact for b in blocks].count(False) == 1
    for call in (lambda: read_tensors(bad, allow_inexact=True), lambda: unpack(bad, tmp_path / "u", allow_inexact=True),
                 lambda: load_model(bad, allow_inexact=True)):
        with pytest.warns(InexactWarning, match="1 chunks .*1 layer"):
            call()
    assert (tmp_path / "u").is_dir()
    rep = verify(bad)
    assert rep.exact is False and len(rep.inexact) == 1 and "NOT exact" in rep.summary()


def test_cli_digest_mismatch(packed: dict[str, Path], tmp_path: Path) -> None:
    bad = _damaged(packed["float16"], tmp_path / "bad.bb")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "bbformat", *args], capture_output=True, text=True, timeout=300)

    p = run("verify", str(bad))
    assert p.returncode == 9 and "NOT exact" in p.stdout and p.stderr == ""
    p = run("unpack", str(bad), str(tmp_path / "u"))
    assert p.returncode == 9 and p.stderr.count("\n") == 1 and "[E_DIGEST]" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "u").exists()
    p = run("unpack", str(bad), str(tmp_path / "u"), "--allow-inexact", "--quiet")
    assert p.returncode == 0 and p.stderr.startswith("bbformat: warning:") and "E_DIGEST" in p.stderr
    p = run("inspect", str(bad))
    assert p.returncode == 0 and "content digests: yes" in p.stdout


def test_old_files_carry_no_digest_and_still_decode() -> None:
    for name in ("sample_v1_0.bb", "sample_v1_1_planes.bb"):
        path = HERE / "fixtures" / name
        with Reader(path) as r:
            assert not r.has_digests
            assert all(b.exact is None for b in r.iter_blocks())
        assert verify(path).exact is None


def test_golden_v1_2_fixture_decodes_forever() -> None:
    """Written once (numcodecs style): a 1.2 container with digests; every future reader must
    decode it with its digests verified."""
    path = HERE / "fixtures" / "sample_v1_2.bb"
    with Reader(path) as r:
        assert (r.header.major, r.header.minor) == (1, 2) and r.has_digests
        assert all(b.exact for b in r.iter_blocks())


def test_writer_and_flags_agree() -> None:
    """A 1.2 writer sets DIGESTS and MIXED_CORRECTIONS and writes minor 2; 1.1 neither."""
    new, old = sample_container(format_version="1.2"), sample_container(format_version="1.1")
    assert R.HEADER_FIXED.parse(new[:32]).required_flags == RequiredFlag.DIGESTS | RequiredFlag.MIXED_CORRECTIONS
    assert R.HEADER_FIXED.parse(old[:32]).required_flags == 0
    assert R.FOOTER.parse(new[-40:]).minor == 2 and R.FOOTER.parse(old[-40:]).minor == 0
    a = {n: t.tobytes() for b in Reader(io.BytesIO(new)).iter_blocks() for n, t in b.tensors.items()}
    b = {n: t.tobytes() for b in Reader(io.BytesIO(old)).iter_blocks() for n, t in b.tensors.items()}
    assert a == b  # the band stores values, it does not change them


@pytest.mark.parametrize("device", ["numpy:scipy-evr", "torch:cpu"])
def test_other_eigensolvers_decode_bit_exactly(packed: dict[str, Path], device: str) -> None:
    """The reduced cross-reader matrix: another eigensolver, and torch's Gram, eigensolver and
    products (the GPU code path on the CPU), all three dtypes; every chunk's digest verifies on
    that backend itself, with the reference fallback off (tools/crosscheck.py runs the full matrix)."""
    pytest.importorskip("scipy") if "scipy" in device else None
    for path in packed.values():
        with Reader(path, device=device, fallback=False) as r:
            assert r.linalg.name == device
            assert all(b.exact and not b.fallback for b in r.iter_blocks())


class SpyLinalg(NumpyLinalg):
    """The numpy backend, counting the eigendecompositions it is asked for."""

    def __init__(self) -> None:
        super().__init__("numpy-upper")
        self.calls: list[tuple[int, ...]] = []

    def eigh(self, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self.calls.append(g.shape)
        return super().eigh(g)


def test_backend_setting_takes_effect(packed: dict[str, Path]) -> None:
    """The reader's backend is really used (else the test above proves nothing)."""
    spy = SpyLinalg()
    with Reader(packed["float16"], device=spy) as r:
        assert r.linalg is spy
        list(r.iter_blocks())
    assert spy.calls


def test_float32_sites_mix_patches_and_residuals() -> None:
    """fp32 symmetric sites: the band's values go to x_patches, the rest to x_residuals (1.2);
    the 1.1 encoder never puts both on a site, and both decode to the intended tensors."""
    rng = np.random.default_rng(3)
    d = 96
    ts = {"src": RawTensor.from_f64(rng.normal(0, 0.05, (2 * d, d)), "float32"),
          "w": RawTensor.from_f64(rng.normal(0, 0.05, (d, 2 * d)), "float32")}
    lay = ChunkLayout("c", ("src", "w"), (SiteSpec("s", d, AxisRef("w", 0)),))
    new = encode_chunk(lay, ts, {}, "symmetric", 0.0)
    old = encode_chunk(lay, ts, {}, "symmetric", 0.0, band=False)
    kinds_new = {s.kind for s in new.sections if s.site == 0}
    kinds_old = {s.kind for s in old.sections if s.site == 0}
    assert kinds_new == {SectionKind.X_PATCHES, SectionKind.X_RESIDUALS} and new.reports[0].banded > 0
    assert len(kinds_old & {SectionKind.X_PATCHES, SectionKind.X_RESIDUALS}) == 1 and old.reports[0].banded == 0
    for enc in (new, old):
        assert all(enc.intended[n].equal(t) for n, t in old.intended.items())


FLOATS = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e6, max_value=1e6)


@settings(max_examples=400, deadline=None)
@given(x=FLOATS, dtype=st.sampled_from(DTYPES), frac=st.floats(0.0, 0.999))
def test_values_outside_the_band_round_the_same_when_moved_less_than_their_distance(x: float, dtype: str, frac: float) -> None:
    """The band's invariant: a value moved by less than its distance to the nearest rounding
    boundary keeps its rounded bits (so a reader within the band decodes bit-exactly)."""
    d = float(band.boundary_distance(np.array([x]), dtype)[0])
    if d == 0:  # on a boundary (a tie, or zero between -0 and +0): always in the band
        return
    for sign in (1.0, -1.0):
        moved = x + sign * frac * d
        if not abs(moved - x) < d:  # the float64 sum rounded the move up to the distance (subnormal x)
            continue
        assert f64_to_bits(np.array([moved]), dtype)[0] == f64_to_bits(np.array([x]), dtype)[0]


@settings(max_examples=300, deadline=None)
@given(x=FLOATS, dtype=st.sampled_from(DTYPES))
def test_boundary_distance_is_tight(x: float, dtype: str) -> None:
    """Moving a little past the distance crosses a boundary (or lands on a tie), so the
    distance is not an underestimate that would waste patches ... nor an overestimate."""
    d = float(band.boundary_distance(np.array([x]), dtype)[0])
    if d == 0:
        return
    base = f64_to_bits(np.array([x]), dtype)[0]
    crossed = False
    for s in (1.0, -1.0):
        y = x + s * d  # the boundary, up to the float64 rounding of this sum
        for _ in range(4):  # a few float64 steps past it
            crossed |= bool(f64_to_bits(np.array([y]), dtype)[0] != base)
            y = float(np.nextafter(y, s * np.inf))
    assert crossed


def test_boundary_distance_edges() -> None:
    assert band.boundary_distance(np.array([0.0]), "float16")[0] == 0.0  # +0 | -0
    assert band.boundary_distance(np.array([np.nan, np.inf]), "float32").tolist() == [0.0, 0.0]
    big = float(np.finfo(np.float16).max)
    assert band.boundary_distance(np.array([big]), "float16")[0] == pytest.approx(16.0)  # 65504 -> threshold 65520
    assert band.boundary_distance(np.array([1.0]), "float32")[0] == pytest.approx(2.0**-25)  # half an ulp below 1


def test_no_warning_when_exact(packed: dict[str, Path], tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", InexactWarning)
        unpack(packed["bfloat16"], tmp_path / "u", allow_inexact=True)
        assert isinstance(read_tensors(packed["bfloat16"])["model.embed_tokens.weight"], torch.Tensor)

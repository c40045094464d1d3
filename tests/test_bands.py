"""Format 1.4: band sections and reader margins (SPEC.md 8.8, 9 item 7), through pack, the
reader, verify and the CLI. The byte rules are also conformance vectors (v_bands_*, x_band_*)."""
from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bbformat.api import pack, verify
from bbformat.checkpoint import write_checkpoint
from bbformat.codec import band
from bbformat.codec.encoder import encode_chunk
from bbformat.codec.layout import ChunkLayout
from bbformat.codec.linalg import NumpyLinalg
from bbformat.codec.dtypes import RawTensor
from bbformat.constants import RequiredFlag, SectionKind
from bbformat.errors import InputError
from bbformat.reader import Reader, decode_parsed
from bbformat.testing import make_tiny_checkpoint
from bbformat.writer import Writer
from conftest import assert_refused_without, sample_container, sample_tensors

DTYPES = ("float16", "bfloat16", "float32")
FIXTURE_KERNEL = "Haswell"  # the OpenBLAS kernel tests/fixtures/sample_v1_4_bands.bb was written under
CASES = [(scheme, dtype) for scheme in ("symmetric", "paper") for dtype in DTYPES]


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    """pack's default (format 1.4) of a tiny Llama, per scheme and dtype, verified."""
    root = tmp_path_factory.mktemp("bands")
    out = {}
    for scheme, dtype in CASES:
        ck = make_tiny_checkpoint("llama", seed=5, layers=2, hidden=32, heads=4, kv_heads=2, vocab=48, max_positions=16, dtype=dtype)
        write_checkpoint(ck, root / f"{scheme}-{dtype}")
        out[(scheme, dtype)] = root / f"{scheme}-{dtype}.bb"
        pack(root / f"{scheme}-{dtype}", out[(scheme, dtype)], scheme=scheme, verify=True, entropy="none")
    return out


def _widths(path: Path) -> list[tuple[bool, np.ndarray]]:
    """(PAPER, widths) of every band section, straight from the section bytes."""
    out = []
    with Reader(path) as r:
        for i in range(len(r)):
            chunk = r.read_chunk(i)
            for (kind, site), data in chunk.side.items():
                if kind == SectionKind.BAND:
                    out.append((chunk.program.sites[site].paper, np.frombuffer(data, "<f8")))
    return out


@pytest.mark.parametrize("case", CASES, ids=[f"{s}-{d}" for s, d in CASES])
def test_pack_writes_1_4_with_one_band_section_per_rotated_site(packed: dict[tuple[str, str], Path], case: tuple[str, str]) -> None:
    with Reader(packed[case]) as r:
        assert r.header.minor == 4 and r.header.required_flags & RequiredFlag.BANDS and r.has_digests
        rotated = 0
        for i in range(len(r)):
            chunk = r.read_chunk(i)
            for s_idx, site in enumerate(chunk.program.sites):
                has = (SectionKind.BAND, s_idx) in chunk.side
                assert has == (not site.plain), (i, site.name)
                rotated += not site.plain
        assert rotated
    widths = _widths(packed[case])
    assert len(widths) == rotated
    for paper, w in widths:
        assert w.size == (3 if paper else 1) and np.isfinite(w).all() and (w > 0).all()


@pytest.mark.parametrize("case", CASES, ids=[f"{s}-{d}" for s, d in CASES])
def test_the_writers_own_decoding_has_margin_above_one(packed: dict[tuple[str, str], Path], case: tuple[str, str]) -> None:
    """SPEC.md 9 item 7: every value within a band width of a boundary is stored, so the
    reference reader's margin is > 1 at every site; verify reports the smallest one."""
    with Reader(packed[case], margins=True) as r:
        margins = [b.margin for b in r.iter_blocks()]
    assert all(m is None or m > 1 for m in margins) and any(m is not None for m in margins)
    rep = verify(packed[case])
    assert rep.exact and rep.margin == min(m for m in margins if m is not None)
    assert rep.margin_chunk is not None and rep.as_dict()["band_margin"] == rep.margin


class Shifted(NumpyLinalg):
    """A reader whose regenerated block values are all `by` off the reference's (a stand-in
    for another eigensolver or summation order), on the CPU."""

    def __init__(self, by: float) -> None:
        super().__init__()
        self.by = by
        self.is_reference = False
        self.name = "shifted"

    def block(self, x: np.ndarray) -> np.ndarray:
        return super().block(x) + self.by


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_reader_off_by_less_than_the_band_decodes_exactly_and_its_margin_moves_by_its_error(
        packed: dict[tuple[str, str], Path], dtype: str) -> None:
    """The band's guarantee and the margin's meaning, on the symmetric sites (SPEC.md 9):
    values moved by 0.9 of the smallest band width still round as the reference's (the digest
    verifies), and each chunk's margin moves by at most that shift over the band width."""
    path = packed[("symmetric", dtype)]
    smallest = min(float(w[0]) for _, w in _widths(path))
    shift = 0.9 * smallest
    with Reader(path) as r:
        for i in range(len(r)):
            chunk = r.read_chunk(i)
            widths = [float(np.frombuffer(d, "<f8")[0]) for (k, _), d in chunk.side.items() if k == SectionKind.BAND]
            if not widths:
                continue
            ref = decode_parsed(chunk, margins=True)
            off = decode_parsed(chunk, la=Shifted(shift), fallback=False, margins=True)
            assert off.exact and not off.fallback  # inside the band: bit for bit
            assert ref.margin is not None and off.margin is not None
            assert abs(off.margin - ref.margin) <= shift / min(widths) * (1 + 1e-9)
            assert off.margin != ref.margin  # the shift is seen
            far = decode_parsed(chunk, la=Shifted(4 * max(widths)), fallback=False, margins=True, allow_inexact=True)
            assert far.margin is not None  # outside the band: perhaps inexact; the margin still bounds the shift from below
            assert 1 - far.margin < 4 * max(widths) / min(widths)


def test_margin_is_the_distance_to_a_boundary_in_band_widths() -> None:
    """band.min_distance, computed independently on a few float16 values: 1.5 lies on the
    grid (its nearest boundaries are half an ulp away), a midpoint is a boundary, and 1.0
    sits on a binade edge (the spacing below it is half as large)."""
    ulp = 2.0 ** -10  # float16 spacing in [1, 2)
    x = np.array([1.5, 1.5 + ulp / 2, 1.5 + ulp / 4])
    assert band.min_distance(x[:1], "float16") == ulp / 2
    assert band.min_distance(np.array([1.0]), "float16") == ulp / 4
    assert band.min_distance(x, "float16") == 0.0
    assert band.min_distance(x, "float16", skip=np.array([1])) == ulp / 4
    assert band.min_distance(x, "float16", skip=np.array([0, 1, 2])) == np.inf
    # the overflow threshold of float16 is 65520 (65504 + half its spacing of 32): 65519.99 is 0.01 from it
    assert band.boundary_distance(np.array([65519.99, 65520.0, 65536.0, np.inf, np.nan]), "float16") == pytest.approx([0.01, 0, 0, 0, 0])
    # +0 and -0 meet at 0; the smallest subnormal float16 is 2^-24, so its midpoint with 0 is 2^-25
    tiny = 2.0 ** -24
    got = band.boundary_distance(np.array([0.0, -0.0, tiny / 8, -tiny / 8, tiny, 3 * tiny / 8]), "float16")
    assert got.tolist() == [0.0, 0.0, tiny / 8, tiny / 8, tiny / 2, tiny / 8]


def test_format_1_3_and_scheme_none_write_no_band(tmp_path: Path) -> None:
    ck = make_tiny_checkpoint("llama", seed=6, layers=1, hidden=32, heads=4, kv_heads=2, vocab=48, max_positions=16)
    write_checkpoint(ck, tmp_path / "m")
    pack(tmp_path / "m", tmp_path / "v13.bb", format_version="1.3", entropy="none")
    pack(tmp_path / "m", tmp_path / "none.bb", scheme="none", format_version="1.4")
    pack(tmp_path / "m", tmp_path / "none15.bb", scheme="none")
    for name, minor in (("v13.bb", 2), ("none.bb", 3), ("none15.bb", 5)):  # scheme none: entropy auto, codec 3 (and 4) allowed
        with Reader(tmp_path / name) as r:
            assert r.header.minor == minor and not r.header.required_flags & RequiredFlag.BANDS
        assert not _widths(tmp_path / name)
        assert verify(tmp_path / name).margin is None


def test_the_writer_refuses_chunks_whose_band_sections_do_not_match_its_format() -> None:
    enc12 = _one_site_chunk(bands=False)
    enc14 = _one_site_chunk(bands=True)
    assert any(s.kind == SectionKind.BAND for s in enc14.sections)
    for fmt, enc, bad in (("1.4", enc12, "stores a band section for every non-PLAIN site"), ("1.3", enc14, "need format 1.4")):
        w = Writer(io.BytesIO(), "symmetric", 1, {}, format_version=fmt)
        with pytest.raises(InputError, match=bad):
            w.add_encoded(enc)


@pytest.mark.parametrize("widths, why", [(np.array([1e-3, 1e-3], "<f8").tobytes(), "wrong size"), (None, "finite and > 0")])
def test_the_writer_refuses_band_widths_a_reader_would_refuse(widths: bytes | None, why: str) -> None:
    """SPEC.md 8.8's rules on a band section's content, enforced by the writer too: one float64
    width (8 bytes) for a symmetric site, finite and > 0 (here a section of two, then a NaN)."""
    from dataclasses import replace

    enc = _one_site_chunk(bands=True)
    band = next(s for s in enc.sections if s.kind == SectionKind.BAND)
    data = widths if widths is not None else np.array([np.nan], "<f8").tobytes()
    if why == "wrong size":
        assert len(band.data) != len(data)
    bad = replace(enc, sections=[replace(s, data=data) if s is band else s for s in enc.sections])
    w = Writer(io.BytesIO(), "symmetric", 1, {}, format_version="1.4")
    with pytest.raises(InputError, match="band section holds" if why == "wrong size" else why):
        w.add_encoded(bad)
    Writer(io.BytesIO(), "symmetric", 1, {}, format_version="1.4").add_encoded(enc)  # the encoder's own: accepted


def test_inspect_counts_the_band_sections(packed: dict[tuple[str, str], Path], capsys: pytest.CaptureFixture[str]) -> None:
    """inspect's band_bytes (per block and in all) are the stored bytes of the band sections it
    lists, 8 per rotated symmetric site; the summary line names them."""
    from bbformat.cli import main
    from bbformat.summary import inspect

    path = packed[("symmetric", "float16")]
    info = inspect(path)
    for b in info["blocks"]:
        listed = sum(s["stored_bytes"] for s in b["sections"] if s["kind"] == "band")
        rotated = sum(not x["stored_plainly"] for x in b["rotations"])
        assert b["band_bytes"] == listed == 8 * rotated
    assert info["totals"]["band_bytes"] == sum(b["band_bytes"] for b in info["blocks"]) > 0
    assert main(["inspect", str(path)]) == 0
    assert f"band widths {info['totals']['band_bytes']:,} B" in capsys.readouterr().out


def _one_site_chunk(bands: bool):  # type: ignore[no-untyped-def]
    data = sample_container(format_version="1.2")
    with Reader(io.BytesIO(data)) as r:
        tensors = r.decode_block(0).tensors
        program = r.read_program(0)
    from bbformat.codec.layout import SiteSpec
    from bbformat.container.program import AxisRef

    site = program.sites[0]
    layout = ChunkLayout("block0", tuple(t.name for t in program.tensors),
                         (SiteSpec("site0", site.dim, AxisRef(program.tensors[site.anchor].name, site.anchor_axis), ()),))
    ts: dict[str, RawTensor] = dict(tensors)
    enc = encode_chunk(layout, ts, {}, "symmetric", 0.0, band=True, bands=bands)
    assert not enc.program.sites[0].plain
    return enc


def test_cli_verify_prints_the_margin(packed: dict[tuple[str, str], Path]) -> None:
    path = packed[("paper", "float32")]
    run = lambda *a: subprocess.run([sys.executable, "-m", "bbformat", "verify", str(path), *a],  # noqa: E731
                                    capture_output=True, text=True, check=True).stdout
    text = run()
    assert "exact: all" in text and "band margin" in text and "smallest, chunk" in text
    rep = json.loads(run("--json"))
    assert rep["band_margin"] > 1 and rep["band_margin_chunk"]
    assert "exact: all" in run("--no-margin") and "band margin" not in run("--no-margin")
    assert json.loads(run("--json", "--no-margin"))["band_margin"] is None


@pytest.mark.parametrize("dtype", DTYPES)
def test_boundary_distance_equals_the_ordinal_formulation(dtype: str) -> None:
    """band.boundary_distance against SPEC.md 9's definition written another way: neighbours by
    stepping dtypes.bits_to_ordinal (+0 and -0 adjacent), on every 16-bit pattern (a sample
    of the 32-bit ones), values between them, and the special values."""
    from bbformat.codec.dtypes import bits_to_f64, bits_to_ordinal, f64_to_bits, ordinal_to_bits

    w = 32 if dtype == "float32" else 16
    rng = np.random.default_rng(3)
    bits = np.arange(1 << 16) if w == 16 else rng.integers(0, 1 << 32, 1 << 18)
    grid = bits_to_f64(bits.astype(f"uint{w}"), dtype)
    with np.errstate(all="ignore"):
        x = np.concatenate([grid, grid * (1 + 1e-3), grid * (1 - 1e-3), np.nextafter(grid, np.inf), rng.standard_normal(4096) * 0.02,
                            [0.0, -0.0, 1e-300, -1e-300, np.inf, -np.inf, np.nan, 1e300, -1e300, 65504.0, 65519.99, 65520.0]])
        o = bits_to_ordinal(f64_to_bits(x, dtype), w)
        lo, hi = -(1 << (w - 1)), (1 << (w - 1)) - 1
        v = bits_to_f64(ordinal_to_bits(o, w), dtype)
        down = bits_to_f64(ordinal_to_bits(np.maximum(o - 1, lo), w), dtype)
        up = bits_to_f64(ordinal_to_bits(np.minimum(o + 1, hi), w), dtype)
        mid_lo = np.where(np.isinf(down), v - (up - v) / 2, (v + down) / 2)
        mid_hi = np.where(np.isinf(up), v + (v - down) / 2, (v + up) / 2)
        d = np.minimum(x - mid_lo, mid_hi - x)
        want = np.where(np.isfinite(x) & np.isfinite(v) & np.isfinite(d), np.abs(d), 0.0)
        got = band.boundary_distance(x, dtype)
    assert np.array_equal(got, want)


def test_golden_v1_4_fixture_decodes_forever() -> None:
    """Written once (numcodecs style): the 1.4 fixture pins the writer's bytes (a band section
    on its one rotated site), verifies its digests with margin > 1, and decodes to the same
    tensors as the 1.2 writer's file of the same input; the 1.0-1.3 fixtures still decode
    (test_entropy.py, test_digests.py, test_exponent.py)."""
    import hashlib

    from threadpoolctl import threadpool_info

    fix = Path(__file__).parent / "fixtures"
    golden = (fix / "sample_v1_4_bands.bb").read_bytes()
    assert hashlib.sha256(golden).hexdigest() == (fix / "sample_v1_4_bands.sha256").read_text().split()[0]
    kernels = {str(i.get("architecture")) for i in threadpool_info() if i.get("user_api") == "blas"}
    if kernels == {FIXTURE_KERNEL}:  # the band widths are measured float64 disagreements: the writer's bytes
        assert sample_container(format_version="1.4") == golden  # depend on the BLAS kernel (SPEC.md 12.7)
    with Reader(io.BytesIO(golden), margins=True) as r:
        assert r.header.minor == 4 and r.header.required_flags & RequiredFlag.BANDS
        assert (SectionKind.BAND, 0) in r.read_chunk(0).side
        blocks = list(r.iter_blocks())
        assert all(b.exact for b in blocks) and blocks[0].margin is not None and blocks[0].margin > 1
        new = {n: t.tobytes() for b in blocks for n, t in b.tensors.items()}
    assert new == sample_tensors("1.2")


def test_a_1_3_reader_refuses_a_1_4_file_cleanly(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader that knows the 1.3 flags only stops at the header with E_REQUIRED_FLAG."""
    assert_refused_without(monkeypatch, RequiredFlag.BANDS, (Path(__file__).parent / "fixtures" / "sample_v1_4_bands.bb").read_bytes())

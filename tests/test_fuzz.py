"""Untrusted containers (issue #5): mutation fuzzing of both readers and the CLI, every
single-bit flip of small containers, and the memory bound of SPEC.md 11.5. The long run
(200,000 cases) is tools/fuzz.py; its result is FUZZING.md."""
from __future__ import annotations

import io
import random
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bbformat.cli import main
from bbformat.container.chunks import parse_chunk, working_set_bytes
from bbformat.errors import BBFormatError, FormatError, LimitError
from bbformat.fuzz import check, crc_coverage, mutate, read_random, read_stream, verdict
from bbformat.reader import Reader, iter_stream

from conftest import sample_container

CONF = Path(__file__).resolve().parent.parent / "conformance"
SEEDS = sorted(p for p in (CONF / "valid").glob("*.bb") if p.stat().st_size < 100_000)
SEED_BYTES = [p.read_bytes() for p in SEEDS]
DOCUMENTED_EXIT = {0, 1, 2, 3, 4, 5, 6}  # README "Exit codes"; 70 would be a bug


def _mutated_gives_our_errors(which: int, seed: int) -> None:
    data = SEED_BYTES[which]
    what, mutated = mutate(data, random.Random(seed))
    outcome = check(mutated)
    assert verdict(data, what, mutated, outcome, seconds_limit=10.0) is None, (SEEDS[which].name, what, outcome)


# 1,200 cases in the default suite (about 30 s), 2,500 more under `slow`; tools/fuzz.py runs as many as asked
@settings(max_examples=1200, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
@given(which=st.integers(0, len(SEEDS) - 1), seed=st.integers(0, 2**32 - 1))
def test_mutated_containers_give_our_errors_within_bounds(which: int, seed: int) -> None:
    _mutated_gives_our_errors(which, seed)


@pytest.mark.slow
@settings(max_examples=2500, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
@given(which=st.integers(0, len(SEEDS) - 1), seed=st.integers(0, 2**32 - 1))
def test_more_mutated_containers_give_our_errors_within_bounds(which: int, seed: int) -> None:
    _mutated_gives_our_errors(which, seed)


@pytest.mark.parametrize("kind", ["bitflip", "truncate", "field_resealed", "chunk_resealed", "index_resealed"])
def test_every_mutation_kind_is_exercised(kind: str) -> None:
    rng = random.Random(3)
    seen = {mutate(SEED_BYTES[i % len(SEED_BYTES)], rng)[0].split()[0] for i in range(400)}
    assert kind in seen


def test_cli_on_mutated_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = random.Random(11)
    models = [p.read_bytes() for p in sorted((CONF / "valid").glob("model_*.bb"))]
    statuses = set()
    for k in range(60):
        data = models[k % len(models)]
        _, mutated = mutate(data, rng)
        path = tmp_path / f"m{k}.bb"
        path.write_bytes(mutated)
        for argv in (["inspect", str(path)], ["unpack", str(path), str(tmp_path / f"out{k}"), "--quiet"]):
            status = main(argv)
            err = capsys.readouterr().err
            statuses.add(status)
            assert status in DOCUMENTED_EXIT, (argv, status, err)
            if status != 0 and not (argv[0] == "inspect" and status == 5):  # inspect reports a CRC mismatch on stdout
                assert err.count("\n") == 1 and err.startswith("bbformat: error [E_"), err
    assert {4, 5} <= statuses


FLIP_FILES = ["sample", "zstd_sym.bb", "paper_f16_exact.bb", "metadata_zstd_writer.bb"]


@pytest.mark.parametrize("name", FLIP_FILES)
def test_every_single_bit_flip_is_detected(name: str) -> None:
    """Exhaustive, not sampled: each of the 8·n flips is rejected by both readers."""
    data = sample_container() if name == "sample" else (CONF / "valid" / name).read_bytes()
    cover = crc_coverage(data)  # every byte in a range whose stored CRC is recomputed (or the magic)
    assert len(cover) == len(data)
    missed = []
    regions = set()
    for bit in range(8 * len(data)):
        b = bytearray(data)
        b[bit // 8] ^= 1 << (bit % 8)
        flipped = bytes(b)
        for read in (read_random, read_stream):
            try:
                read(flipped)
            except BBFormatError:
                continue
            missed.append((bit, cover[bit // 8], read.__name__))
        regions.add(cover[bit // 8].split()[0])
    assert not missed, missed[:10]
    assert {"header", "chunk", "index", "footer"} <= regions


@pytest.mark.parametrize("vector", sorted(p.relative_to(CONF).as_posix() for p in CONF.glob("*/*.bb")))
def test_conformance_vectors_stay_within_the_memory_bound(vector: str) -> None:
    """Every vector, bombs included: traced peak <= 2 x declared working set + 2 x file + slack."""
    data = (CONF / vector).read_bytes()
    o = check(data)
    assert not o.unexpected, o.unexpected
    assert o.peak_bytes <= o.bound_bytes, (o.peak_bytes, o.bound_bytes)


@pytest.mark.parametrize("vector", ["valid/large_d.bb", "valid/model_llama_sym.bb", "valid/paper_f32_exact.bb"])
def test_decoding_stays_within_twice_the_declared_working_set(vector: str) -> None:
    """The tight form of the bound, where the block is large enough to dominate."""
    data = (CONF / vector).read_bytes()
    with Reader(io.BytesIO(data)) as r:
        chunks = [r.read_chunk(i) for i in range(len(r))]
        need = max(working_set_bytes(c.program, r.entries[c.index].length) for c in chunks)
        tracemalloc.start()
        try:
            for i in range(len(r)):
                r.decode_block(i)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peak <= 2 * need + (1 << 20), (peak, need)


def test_block_budget_at_the_limit_and_one_below() -> None:
    """max_block_bytes = the declared working set decodes; one byte less is E_LIMIT_MEMORY,
    raised before any section is decompressed."""
    data = (CONF / "valid" / "large_d.bb").read_bytes()
    with Reader(io.BytesIO(data), max_block_bytes=None) as r:
        raw = r.read_chunk_bytes(0)
        need = working_set_bytes(r.read_chunk(0).program, len(raw))
    with Reader(io.BytesIO(data), max_block_bytes=need) as r:
        r.decode_block(0)
    with pytest.raises(LimitError) as info:
        parse_chunk(raw, max_block_bytes=need - 1)
    assert info.value.code == "E_LIMIT_MEMORY" and info.value.exit_status == 6
    with pytest.raises(LimitError, match="needs up to"):
        for _ in iter_stream(io.BytesIO(data), max_block_bytes=need - 1):
            pass


def test_default_budget_is_half_the_physical_memory() -> None:
    from bbformat.reader import physical_memory, resolve_budget

    assert resolve_budget("auto") == (physical_memory() or 0) // 2 and (physical_memory() or 0) > 0
    assert resolve_budget(None) is None
    for bad in (0, -1, "lots", 1.5):
        with pytest.raises(BBFormatError):
            resolve_budget(bad)  # type: ignore[arg-type]


def test_budget_is_checked_at_entry_0_whatever_its_kind() -> None:
    """SPEC.md 11.3 (1.5 wording): the working set is checked once, at section entry 0, after its
    kind and the other table checks and before its limit check, also where entry 0 is neither
    the payload nor a band (here x_residuals: v_mixed_sections_reordered's reversed table)."""
    import struct

    from bbformat.constants import SectionKind

    data = (CONF / "valid" / "v_mixed_sections_reordered.bb").read_bytes()
    with Reader(io.BytesIO(data)) as r:
        raw, flags = bytearray(r.read_chunk_bytes(0)), r.header.required_flags
    entry0 = 32 + struct.unpack_from("<I", raw, 20)[0]
    assert raw[entry0] == SectionKind.X_RESIDUALS
    with pytest.raises(LimitError) as info:
        parse_chunk(bytes(raw), max_block_bytes=1, required_flags=flags, check_crc=False)
    assert info.value.code == "E_LIMIT_MEMORY"
    over = bytearray(raw)
    struct.pack_into("<Q", over, entry0 + 24, 1 << 40)  # entry 0's decoded_length over its limit: the budget comes first
    with pytest.raises(LimitError) as info:
        parse_chunk(bytes(over), max_block_bytes=1, required_flags=flags, check_crc=False)
    assert info.value.code == "E_LIMIT_MEMORY"
    with pytest.raises(LimitError) as info:
        parse_chunk(bytes(over), required_flags=flags, check_crc=False)
    assert info.value.code == "E_LIMIT_SECTION"
    raw[entry0] = 9  # an unknown kind at entry 0 is reported before the budget
    with pytest.raises(FormatError) as err:
        parse_chunk(bytes(raw), max_block_bytes=1, required_flags=flags, check_crc=False)
    assert err.value.code == "E_SECTION_KIND"

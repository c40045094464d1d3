"""SPEC.md 11.1 limits, each at the limit and one past it (issue #5). At the limit the file
either decodes or fails for another reason than the limit (where a file at the limit
cannot be decoded in a test: 2^40 elements, 16,384 sections); one past, the limit's code."""
from __future__ import annotations

import io
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
import zstandard

from bbformat.constants import (
    MAX_CHUNKS,
    MAX_DESCRIPTOR,
    MAX_FOLLOWERS_PER_CHUNK,
    MAX_METADATA,
    MAX_NDIM,
    MAX_SECTIONS_PER_CHUNK,
    MAX_SITES_PER_CHUNK,
    MAX_TENSORS_PER_CHUNK,
    NO_SITE,
    SectionKind,
)
from bbformat.errors import BBFormatError
from bbformat.fuzz import read_random, read_stream
from bbformat.reader import Reader, iter_stream

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "conformance"))
from generate import BB, Chk, Sec, raw_sec  # noqa: E402

PUSH, SITE = 1, 2
F16, F32 = 1, 3  # dtype codes (SPEC.md 6.1)
PLAIN, PAPER = 1, 2


def name(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<H", len(b)) + b


def descriptor(tensors: list[tuple[str, int, list[int]]], sites: list[tuple], ops: list[tuple[int, int]], chunk: str = "c",
               symbol_dtype: int = F16) -> bytes:
    """Descriptor bytes (SPEC.md 5.1) with struct: fast enough for 65,536 records."""
    out = [name(chunk), struct.pack("<BBHI", symbol_dtype, 0, 0, len(tensors))]
    out += [name(n) + struct.pack(f"<BBH{len(d)}Q", dt, len(d), 0, *d) for n, dt, d in tensors]
    out.append(struct.pack("<I", len(sites)))
    for s in sites:
        sname, dim, anchor, axis, flags, followers = s
        out.append(name(sname) + struct.pack("<IIBBHI", dim, anchor, axis, flags, 0, len(followers)))
        out += [name(f) + struct.pack("<BB", a, 0) for f, a in followers]
    out.append(struct.pack("<I", len(ops)))
    out += [struct.pack("<BBHI", k, 0, 0, i) for k, i in ops]
    return b"".join(out)


def container(desc: bytes, payload: bytes, extra: list[Sec] | None = None, meta: bytes = b"{}") -> bytes:
    return BB([Chk({}, [raw_sec(SectionKind.PAYLOAD, NO_SITE, payload), *(extra or [])], desc=desc)], meta=meta).build()


def outcome(data: bytes, agree: bool = True) -> str:
    """'accept' or the code; both readers must agree (else: the random-access reader's code)."""
    got = []
    for read in (read_random, read_stream):
        try:
            read(data)
            got.append("accept")
        except BBFormatError as exc:
            got.append(exc.code)
    assert got[0] == got[1] or not agree, got
    return got[0] if agree else got[0] if got[0] == got[1] else f"{got[0]}/{got[1]}"


def scalars(n: int) -> bytes:
    tensors = [(f"{i:x}", F16, []) for i in range(n)]
    return container(descriptor(tensors, [], [(PUSH, i) for i in range(n)]), bytes(2 * n))


def test_tensors_per_chunk() -> None:
    assert outcome(scalars(MAX_TENSORS_PER_CHUNK)) == "accept"
    assert outcome(scalars(MAX_TENSORS_PER_CHUNK + 1)) == "E_LIMIT_COUNT"


def plain_sites(n: int) -> bytes:
    sites = [(f"s{i}", 2, 0, 0, PLAIN, []) for i in range(n)]
    return container(descriptor([("w", F16, [2, 2])], sites, [*((SITE, i) for i in range(n)), (PUSH, 0)]), bytes(8))


def test_sites_per_chunk() -> None:
    assert outcome(plain_sites(MAX_SITES_PER_CHUNK)) == "accept"
    assert outcome(plain_sites(MAX_SITES_PER_CHUNK + 1)) == "E_LIMIT_COUNT"


def followers(n: int) -> bytes:
    sites = [("s", 2, 0, 0, PLAIN, [("", 0)] * n)]
    return container(descriptor([("w", F16, [2, 2])], sites, [(SITE, 0), (PUSH, 0)]), bytes(8))


def test_followers_per_chunk_the_references_own_limit() -> None:
    assert outcome(followers(MAX_FOLLOWERS_PER_CHUNK)) == "accept"
    assert outcome(followers(MAX_FOLLOWERS_PER_CHUNK + 1)) == "E_LIMIT_COUNT"


@pytest.mark.parametrize("ndim, expect", [(MAX_NDIM, "accept"), (MAX_NDIM + 1, "E_LIMIT_NDIM")])
def test_rank(ndim: int, expect: str) -> None:
    assert outcome(container(descriptor([("t", F16, [1] * ndim)], [], [(PUSH, 0)]), bytes(2))) == expect


@pytest.mark.parametrize("dims, expect", [([1 << 20, 1 << 20], "E_SYMBOL_COUNT"), ([(1 << 40) + 1], "E_LIMIT_TENSOR"),
                                          ([1 << 40], "E_SYMBOL_COUNT")])
def test_elements_per_tensor(dims: list[int], expect: str) -> None:
    """2^40 elements passes the limit (and fails on the 2-byte payload); 2^40 + 1 does not."""
    assert outcome(container(descriptor([("t", F16, dims)], [], [(PUSH, 0)]), bytes(2))) == expect


@pytest.mark.parametrize("d, expect", [(1 << 15, "accept"), ((1 << 15) + 1, "E_LIMIT_DIM")])
def test_site_dimension(d: int, expect: str) -> None:
    """A PLAIN site of D = 32,768 decodes (no eigensolver needed); 32,769 is over the limit."""
    desc = descriptor([("w", F16, [d])], [("s", d, 0, 0, PLAIN, [])], [(SITE, 0), (PUSH, 0)])
    assert outcome(container(desc, bytes(2 * d))) == expect


def descriptor_of_length(n: int) -> bytes:
    """A valid descriptor of exactly n bytes: empty tensors with long names."""
    head = len(descriptor([], [], []))
    per = 6 + 8  # tensor record without its name, one dim
    tensors = []
    left = n - head
    k = 0
    while left > 0:
        # a record of this size, leaving room for its PUSH op
        size = min(left, per + 0xFFFF + 8)
        if left - size and left - size < per + 8 + 1:
            size = left - (per + 8 + 1)
        tensors.append((f"{k:04x}".ljust(size - per - 8, "x"), F16, [0]))
        left -= size
        k += 1
    desc = descriptor(tensors, [], [(PUSH, i) for i in range(len(tensors))])
    assert len(desc) == n
    return desc


@pytest.mark.parametrize("extra, expect", [(0, "accept"), (1, "E_LIMIT_COUNT")])
def test_descriptor_length(extra: int, expect: str) -> None:
    desc = descriptor_of_length(MAX_DESCRIPTOR + extra)
    assert outcome(container(desc, b"")) == expect


@pytest.mark.parametrize("extra, expect", [(0, "accept"), (1, "E_LIMIT_METADATA")])
def test_metadata_size_stored(extra: int, expect: str) -> None:
    n = MAX_METADATA + extra
    meta = b'{"pad":"' + b"x" * (n - 10) + b'"}'
    assert len(meta) == n
    assert outcome(BB([], meta=meta).build()) == expect


@pytest.mark.parametrize("extra, expect", [(0, "accept"), (1, "E_LIMIT_METADATA")])
def test_metadata_size_decoded(extra: int, expect: str) -> None:
    """A small zstd frame declaring exactly 64 MiB decodes; 64 MiB + 1 is refused before decompressing."""
    n = MAX_METADATA + extra
    meta = b'{"pad":"' + b"x" * (n - 10) + b'"}'
    frame = zstandard.ZstdCompressor(level=1, write_content_size=True).compress(meta)
    assert len(frame) < 1 << 20
    assert outcome(BB([], meta=frame, meta_codec=1).build()) == expect


@pytest.mark.parametrize("count, expect", [(MAX_CHUNKS, "not a limit"), (MAX_CHUNKS + 1, "E_LIMIT_COUNT")])
def test_chunk_count_header_check(count: int, expect: str) -> None:
    """At the limit the header is accepted and the file fails later (it has no such chunks)."""
    bb = BB([])
    bb.hdr = {"chunk_count": count}
    code = outcome(bb.build(), agree=False)
    if expect == "E_LIMIT_COUNT":
        assert code == expect
    else:  # the stream reader meets the index where it expects a chunk: E_MAGIC
        assert "E_LIMIT" not in code and code.startswith("E_"), code


@pytest.mark.slow
def test_chunk_count_full_file_at_the_limit() -> None:
    """65,536 real chunks decode (slow: one chunk at a time)."""
    desc = descriptor([("t", F16, [])], [], [(PUSH, 0)])
    chunks = [Chk({}, [raw_sec(SectionKind.PAYLOAD, NO_SITE, b"\x00\x00")], desc=desc) for _ in range(MAX_CHUNKS)]
    assert outcome(BB(chunks).build()) == "accept"


@pytest.mark.parametrize("count, expect", [(MAX_SECTIONS_PER_CHUNK, "E_BOUNDS"), (MAX_SECTIONS_PER_CHUNK + 1, "E_LIMIT_COUNT")])
def test_sections_per_chunk(count: int, expect: str) -> None:
    """16,384 sections cannot all be valid (4,096 sites x 3 kinds + payload < 16,384): at the limit
    the table check is reached (and the table runs past the chunk); one past, the limit."""
    c = Chk({}, [raw_sec(SectionKind.PAYLOAD, NO_SITE, b"\x00\x00")], desc=descriptor([("t", F16, [])], [], [(PUSH, 0)]))
    c.head = {"section_count": count}
    assert outcome(BB([c]).build()) == expect


def paper_site(sign_bytes: int, patch_bytes: int | None = None, anchor_patch_bytes: int | None = None) -> bytes:
    """One PAPER site of D = 16 on a (16, 16) anchor, with a sign section of `sign_bytes`
    (limit ceil(16/8) = 2) and optionally an x_patches section of `patch_bytes`."""
    d = 16
    rng = np.random.default_rng(0)
    n = d * (d + 1) // 2
    desc = descriptor([("x", F16, [n]), ("a", F16, [d, d])], [("s", d, 1, 0, PAPER, [])], [(PUSH, 0), (SITE, 0), (PUSH, 1)])
    payload = np.sort(rng.normal(0, 0.05, d)).astype("<f4").tobytes() + rng.normal(0, 0.05, d * d).astype("<f2").tobytes()
    extra = [raw_sec(SectionKind.SIGNS, 0, bytes(sign_bytes))]
    if patch_bytes is not None:
        extra.append(raw_sec(SectionKind.X_PATCHES, 0, b"\x00" + bytes(patch_bytes - 1)))
    if anchor_patch_bytes is not None:
        extra.append(raw_sec(SectionKind.ANCHOR_PATCHES, 0, b"\x00" + bytes(anchor_patch_bytes - 1)))
    return container(desc, payload, extra)


def symmetric_site(residual_bytes: int) -> bytes:
    """One symmetric site of D = 16 on a (16, 16) anchor with an x_residuals section."""
    d = 16
    rng = np.random.default_rng(1)
    n = d * (d + 1) // 2
    desc = descriptor([("x", F16, [n]), ("a", F16, [d, d])], [("s", d, 1, 0, 0, [])], [(PUSH, 0), (SITE, 0), (PUSH, 1)])
    payload = np.sort(rng.normal(0, 0.05, d)).astype("<f4").tobytes() + rng.normal(0, 0.05, d * d).astype("<f2").tobytes()
    return container(desc, payload, [raw_sec(SectionKind.X_RESIDUALS, 0, bytes(residual_bytes))])


def test_section_decoded_size_signs() -> None:
    assert outcome(paper_site(2)) == "accept"
    assert outcome(paper_site(3)) == "E_LIMIT_SECTION"


def test_section_decoded_size_patches() -> None:
    """x_patches limit: 10 + n(D)·(10 + W/8) bytes. At the limit the content is checked (a
    count of 0 then trailing bytes); one past, the size is refused before parsing."""
    n = 16 * 17 // 2
    limit = 10 + n * (10 + 2)
    at = outcome(paper_site(2, limit))
    assert at != "E_LIMIT_SECTION" and at.startswith("E_"), at
    assert outcome(paper_site(2, limit + 1)) == "E_LIMIT_SECTION"


def test_callers_site_dim_budget() -> None:
    """max_site_dim (the caller's bound on decode time) refuses a larger non-PLAIN site with
    E_LIMIT_DIM before anything is decompressed; a PLAIN site of any D passes (no eigensolver)."""
    data = (Path(__file__).resolve().parent.parent / "conformance" / "valid" / "large_d.bb").read_bytes()
    with Reader(io.BytesIO(data)) as r:
        d = r.read_chunk(0).program.sites[0].dim
    with Reader(io.BytesIO(data), max_site_dim=d) as r:
        r.decode_block(0)
    for read in (lambda: Reader(io.BytesIO(data), max_site_dim=d - 1).decode_block(0),
                 lambda: list(iter_stream(io.BytesIO(data), max_site_dim=d - 1))):
        with pytest.raises(BBFormatError) as info:
            read()
        assert info.value.code == "E_LIMIT_DIM" and f"D = {d}" in str(info.value)
    plain = container(descriptor([("w", F16, [4096])], [("s", 4096, 0, 0, PLAIN, [])], [(SITE, 0), (PUSH, 0)]), bytes(8192))
    with Reader(io.BytesIO(plain), max_site_dim=2) as r:
        r.decode_block(0)


def test_section_decoded_size_anchor_patches() -> None:
    """anchor_patches limit: 10 + A·(10 + a/8) bytes (A = 256 float16 elements)."""
    limit = 10 + 256 * (10 + 2)
    at = outcome(paper_site(2, None, limit))
    assert at != "E_LIMIT_SECTION" and at.startswith("E_"), at
    assert outcome(paper_site(2, None, limit + 1)) == "E_LIMIT_SECTION"


def test_section_decoded_size_residuals() -> None:
    """x_residuals limit: 11·2^E_w + n(D)·3 bytes for 16-bit symbols (E_w = 5 for float16)."""
    limit = 11 * 2**5 + (16 * 17 // 2) * 3
    at = outcome(symmetric_site(limit))
    assert at != "E_LIMIT_SECTION" and at.startswith("E_"), at
    assert outcome(symmetric_site(limit + 1)) == "E_LIMIT_SECTION"

"""Mutation fuzzing of the readers (issue #5): corrupt valid containers, decode them with
the random-access reader and the stream reader, and check that every outcome is either
a clean decode or one of our errors, within the time and memory SPEC.md 11.5 states.

`mutate` makes one corrupted file; `check` runs the readers on it and returns an Outcome.
`tools/fuzz.py` drives the long run; tests/test_fuzz.py runs a short one.
"""
from __future__ import annotations

import io
import random
import time
import traceback
import tracemalloc
from dataclasses import dataclass, field

from .constants import (
    CHUNK_FIXED_SIZE,
    CHUNK_MAGIC,
    CRC_SIZE,
    FILE_MAGIC,
    FOOTER_CRC_OFFSET,
    FOOTER_INDEX_CRC_OFFSET,
    FOOTER_SIZE,
    HEADER_FIXED_SIZE,
    INDEX_ENTRY_SIZE,
    INDEX_FIXED_SIZE,
    MAGIC_SIZE,
    MAX_DESCRIPTOR,
    MAX_METADATA,
    MIN_CHUNK_LENGTH,
    REQUIRED_FLAGS_KNOWN,
    SECTION_ENTRY_SIZE,
)
from .container import records as R
from .container.chunks import parse_descriptor, working_set_bytes
from .container.crc import crc32c
from .container.rebuild import Parts, join, reseal_chunk, reseal_footer, reseal_header, split
from .errors import BBFormatError
from .reader import Reader, iter_stream

# Values that sit on the edges of every size and count check.
EDGE_U64 = (0, 1, 2, 7, 8, 31, 32, 33, 35, 36, 255, 256, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x10000, 0x10001, (1 << 24) + 1,
            (1 << 26) + 1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 1 << 32, (1 << 40) + 1, (1 << 63) - 1, 1 << 63, (1 << 64) - 1)
# Slack of the memory bound: the interpreter, construct's parse trees and numpy's small arrays.
MEMORY_SLACK = 16 << 20
# Mutations that recompute CRCs (or rebuild the index): their result may be a valid file.
RESEALED = ("field_resealed", "chunk_resealed", "index_resealed", "swap_chunks", "payload_resealed")
MUTATIONS = ("bitflip", "bitflips", "truncate", "overwrite", "append", "splice", "field", "field_resealed", "chunk_resealed",
             "index_resealed", "swap_chunks", "payload_resealed")
# How often payload_resealed edits each kind of region (payload_regions' labels), whatever its size:
# the small, dense parts a payload decoder parses first weigh the most.
REGION_WEIGHTS = {
    "chunk head": 0.5, "descriptor": 1.0, "section table": 1.0, "payload raw": 0.5, "payload zstd": 1.0,
    "planes head": 3.0, "planes groups": 2.0, "exponent head": 3.0, "class maps": 4.0, "rans tables": 5.0,
    "rans stream": 3.0, "rest fields": 2.0, "part table": 4.0, "part raw": 0.5, "part zstd": 1.0,
    "signs": 1.0, "residuals": 2.0, "patches": 2.0, "band": 3.0,
}
SIDE_LABELS = {2: "signs", 3: "residuals", 4: "patches", 5: "patches", 6: "band"}


def _field_offsets(data: bytes) -> list[tuple[int, int]]:
    """(offset, width) of every integer field of the header, chunk heads, section tables,
    index and footer of a well-formed container."""
    out = [(8, 2), (10, 2), (12, 4), (16, 4), (20, 1), (21, 1), (22, 2), (24, 4), (28, 4)]
    try:
        parts = split(data)
    except Exception:  # noqa: BLE001 - not well formed: header fields only
        return out
    pos = len(parts.header)
    for c in parts.chunks:
        out += [(pos + 4, 4), (pos + 8, 8), (pos + 16, 4), (pos + 20, 4), (pos + 24, 4), (pos + 28, 4)]
        if len(c) >= CHUNK_FIXED_SIZE:
            head = R.CHUNK_FIXED.parse(c[: CHUNK_FIXED_SIZE])
            table = pos + CHUNK_FIXED_SIZE + head.descriptor_length
            for k in range(head.section_count):
                e = table + SECTION_ENTRY_SIZE * k
                out += [(e, 1), (e + 1, 1), (e + 2, 2), (e + 4, 4), (e + 8, 8), (e + 16, 8), (e + 24, 8)]
        pos += len(c)
    idx = pos
    out += [(idx + 4, 4)]
    for k in range(len(parts.chunks)):
        e = idx + INDEX_FIXED_SIZE + k * INDEX_ENTRY_SIZE
        out += [(e, 8), (e + 8, 8), (e + 16, 4), (e + 20, 4)]
    f = len(data) - FOOTER_SIZE
    out += [(f, 8), (f + 8, 8), (f + 16, 4), (f + 20, 2), (f + 22, 2), (f + 24, 4), (f + 28, 4)]
    return [(o, w) for o, w in out if o + w <= len(data)]


def _edge(rng: random.Random, width: int, current: int, n: int) -> int:
    choices = [v for v in EDGE_U64 if v < (1 << (8 * width))]
    choices += [v & ((1 << (8 * width)) - 1) for v in (current + 1, current - 1, current * 2, n, n - 1, n + 1, current ^ (1 << rng.randrange(8 * width)))]
    return rng.choice(choices)


def _set_field(data: bytes, off: int, width: int, rng: random.Random) -> bytes:
    cur = int.from_bytes(data[off : off + width], "little")
    v = _edge(rng, width, cur, len(data))
    return data[:off] + v.to_bytes(width, "little") + data[off + width :]


def _reseal_all(data: bytes) -> bytes:
    """Fresh CRCs everywhere the structure still allows (the mutation then meets the checks
    behind the CRCs); returns the input unchanged where the structure is too broken."""
    try:
        parts = split(data)
        chunks = [reseal_chunk(c) if len(c) >= MIN_CHUNK_LENGTH else c for c in parts.chunks]
        body = reseal_header(parts.header) + b"".join(chunks)
        return body + data[len(body) :] if len(body) <= len(data) else data
    except Exception:  # noqa: BLE001
        return data


class _Spans:
    """Labels byte ranges of one payload section while walking its fields (SPEC.md 8.6, 8.7,
    8.9); stops quietly (the rest keeps its coarse label) where the bytes stop making sense."""

    def __init__(self, data: bytes, start: int, end: int) -> None:
        self.data, self.pos, self.end = data, start, end
        self.out: list[tuple[int, int, str]] = []

    def varint(self) -> int:
        v = shift = 0
        while self.pos < self.end and shift < 70:
            b = self.data[self.pos]
            self.pos += 1
            v |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                return v
        raise ValueError("varint")

    def u8(self) -> int:
        if self.pos >= self.end:
            raise ValueError("u8")
        self.pos += 1
        return self.data[self.pos - 1]

    def skip(self, n: int) -> None:
        if n > self.end - self.pos:
            raise ValueError("skip")
        self.pos += n

    def mark(self, since: int, label: str) -> None:
        if self.pos > since:
            self.out.append((since, self.pos, label))

    def group(self, label: str) -> None:
        a = self.pos
        self.skip(self.varint() + 1)
        self.mark(a, label)


def _segments(sp: _Spans) -> list[int]:
    """Segment records (n, r, K): the classes K of each."""
    return [(sp.varint(), sp.varint(), sp.u8())[2] for _ in range(min(sp.varint(), 65_536))]


def _label_codec(sp: _Spans, codec: int, prefix: str) -> None:
    """Label the section bytes [sp.pos, sp.end) of one payload (or part) of `codec`; bytes the
    walk cannot place keep a coarse label."""
    first = sp.pos
    coarse = {2: "planes groups", 3: "rest fields", 4: "part table"}.get(codec, f"{prefix} {'zstd' if codec == 1 else 'raw'}")
    try:
        if codec == 3:
            sp.u8()
            _segments(sp)
            sp.varint()
            sp.mark(first, "exponent head")
            sp.group("class maps")
            a = sp.pos
            sp.varint()
            sp.group("rans tables")
            sp.out[-1] = (a, sp.pos, "rans tables")
            a = sp.pos
            sp.skip(sp.varint())
            sp.mark(a, "rans stream")
            sp.out.append((sp.pos, sp.end, "rest fields"))
        elif codec == 2:
            _segments(sp)
            sp.mark(first, "planes head")
            sp.group("class maps")
            sp.out.append((sp.pos, sp.end, "planes groups"))
        elif codec == 4:
            records = [(sp.u8(), sp.varint(), sp.varint()) for _ in range(min(sp.varint(), 65_536))]
            sp.mark(first, "part table")
            for c, _, n in records:
                sub = _Spans(sp.data, sp.pos, min(sp.pos + n, sp.end))
                _label_codec(sub, c, "part")
                sp.out += sub.out
                sp.skip(n)
            sp.pos = sp.end
        else:
            sp.out.append((sp.pos, sp.end, coarse))
        return
    except ValueError:
        done = max([b for _, b, _ in sp.out], default=first)
        sp.out.append((done, sp.end, coarse))


def chunk_regions(chunk: bytes) -> list[tuple[int, int, str]]:
    """(start, end, label) of the parts of one well-formed chunk, offsets from its start: the
    head, descriptor, section table, and each section's bytes, a codec-2/3/4 payload split into
    its fields (labels: REGION_WEIGHTS). Empty ranges are left out."""
    head = R.CHUNK_FIXED.parse(chunk[:CHUNK_FIXED_SIZE])
    table = CHUNK_FIXED_SIZE + head.descriptor_length
    out = [(len(CHUNK_MAGIC), CHUNK_FIXED_SIZE, "chunk head"), (CHUNK_FIXED_SIZE, table, "descriptor"),
           (table, table + SECTION_ENTRY_SIZE * head.section_count, "section table")]
    for k in range(head.section_count):
        e = chunk[table + SECTION_ENTRY_SIZE * k : table + SECTION_ENTRY_SIZE * (k + 1)]
        kind, codec = e[0], e[1]
        start, length = int.from_bytes(e[8:16], "little"), int.from_bytes(e[16:24], "little")
        end = min(start + length, len(chunk) - CRC_SIZE)
        if kind != 1:
            out.append((start, end, SIDE_LABELS.get(kind, "residuals")))
            continue
        sp = _Spans(chunk, start, end)
        _label_codec(sp, codec, "payload")
        out += sp.out
    return [(a, b, lab) for a, b, lab in out if a < b]


def _edit_region(chunk: bytearray, a: int, b: int, rng: random.Random) -> int:
    """One length-preserving edit inside chunk[a:b]; returns its offset."""
    i = rng.randrange(a, b)
    how = rng.randrange(4)
    if how == 0:  # a value on an edge, a flipped bit, or any byte
        chunk[i] = rng.choice([0, 1, 0x7F, 0x80, 0xFF, chunk[i] ^ (1 << rng.randrange(8)), rng.randrange(256)])
    elif how == 1:  # a count or length one or two off (varints, table fields)
        chunk[i] = (chunk[i] + rng.choice([-2, -1, 1, 2])) & 0xFF
    elif how == 2:  # a short run of zeros, ones or noise
        m = rng.randint(1, min(8, b - i))
        chunk[i : i + m] = rng.choice([bytes(m), b"\xff" * m, rng.randbytes(m)])
    else:  # bytes from elsewhere in the same region
        m = rng.randint(1, min(16, b - i))
        j = rng.randrange(a, b - m + 1)
        chunk[i : i + m] = chunk[j : j + m]
    return i


def mutate_payload(data: bytes, rng: random.Random) -> tuple[str, bytes]:
    """Edit bytes inside one chunk, in a region drawn by its label (REGION_WEIGHTS: payload
    fields first, whatever their size), and
    reseal it: fresh chunk CRC, index (its entry CRC), index CRC and footer, so the edit meets
    the payload decoders instead of the chunk CRC. content_crc is left as it was: an edit that
    decodes to other values is E_DIGEST after the decoders ran. Returns (what, bytes); `what`
    is "payload_resealed CHUNK LABEL @OFFSET"."""
    try:
        parts = split(data)
        regions = [(k, a, b, lab) for k, c in enumerate(parts.chunks) if len(c) > MIN_CHUNK_LENGTH for a, b, lab in chunk_regions(c)]
    except Exception:  # noqa: BLE001 - not well formed
        regions = []
    if not regions:  # a flipped bit, as mutate's fallback
        i = rng.randrange(8 * len(data)) if data else 0
        flipped = bytearray(data)
        if data:
            flipped[i // 8] ^= 1 << (i % 8)
        return f"bitflip {i}", bytes(flipped)
    labels = sorted({r[3] for r in regions})  # a label first, by weight; then one of its ranges
    label = rng.choices(labels, [REGION_WEIGHTS.get(lab, 1.0) for lab in labels])[0]
    k, a, b, _ = rng.choice([r for r in regions if r[3] == label])
    chunk = bytearray(parts.chunks[k])
    at = _edit_region(chunk, a, b, rng)
    for _ in range(rng.choice([0, 0, 0, 1, 2])):  # sometimes more edits in the same region
        _edit_region(chunk, a, b, rng)
    parts.chunks[k] = reseal_chunk(bytes(chunk))
    return f"payload_resealed {k} {label} @{at}", join(parts)


def mutate(data: bytes, rng: random.Random) -> tuple[str, bytes]:
    """One corruption of `data`: returns (what was done, the new bytes)."""
    kind = rng.choice(MUTATIONS)
    if kind == "payload_resealed":
        return mutate_payload(data, rng)
    n = len(data)
    if kind == "bitflip" and n:
        i = rng.randrange(8 * n)
        b = bytearray(data)
        b[i // 8] ^= 1 << (i % 8)
        return f"bitflip {i}", bytes(b)
    if kind == "bitflips" and n:
        b = bytearray(data)
        k = rng.randint(2, 16)
        for _ in range(k):
            i = rng.randrange(8 * n)
            b[i // 8] ^= 1 << (i % 8)
        return f"bitflips x{k}", bytes(b)
    if kind == "truncate":
        cut = rng.randrange(n + 1)
        return f"truncate {cut}", data[:cut]
    if kind == "overwrite" and n:
        a = rng.randrange(n)
        m = rng.randint(1, min(64, n - a))
        fill = rng.choice([bytes(m), b"\xff" * m, rng.randbytes(m)])
        return f"overwrite {a}+{m}", data[:a] + fill + data[a + m :]
    if kind == "append":
        tail = rng.choice([rng.randbytes(rng.randint(1, 64)), data[-FOOTER_SIZE :], data[: rng.randint(1, 64)]])
        return f"append {len(tail)}", data + tail
    if kind == "splice" and n:
        a = rng.randrange(n)
        m = rng.randint(1, min(256, n - a))
        c = rng.randrange(n + 1)
        return f"splice {a}+{m}@{c}", data[:c] + data[a : a + m] + data[c:]
    fields = _field_offsets(data)
    if kind in ("field", "field_resealed") and fields:
        off, width = rng.choice(fields)
        out = _set_field(data, off, width, rng)
        if kind == "field_resealed":
            out = reseal_footer(_reseal_all(out)) if len(out) >= FOOTER_SIZE else out
        return f"{kind} @{off}/{width}", out
    if kind == "chunk_resealed":
        # edit a byte inside a chunk's descriptor or sections, then fresh CRCs, index and footer
        try:
            parts = split(data)
        except Exception:  # noqa: BLE001
            return "chunk_resealed (unsplittable)", data
        if parts.chunks:
            k = rng.randrange(len(parts.chunks))
            chunk = bytearray(parts.chunks[k])
            if len(chunk) > MIN_CHUNK_LENGTH:
                for _ in range(rng.randint(1, 4)):
                    i = rng.randrange(len(CHUNK_MAGIC), len(chunk) - CRC_SIZE)
                    chunk[i] = rng.choice([0, 1, 0xFF, 0x80, 0x7F, chunk[i] ^ (1 << rng.randrange(8)), rng.randrange(256)])
            parts.chunks[k] = reseal_chunk(bytes(chunk))
            return f"chunk_resealed {k}", join(parts)
    if kind == "index_resealed" and n >= FOOTER_SIZE:
        idx = int.from_bytes(data[-FOOTER_SIZE : -FOOTER_SIZE + 8], "little")
        if 0 <= idx < n - FOOTER_SIZE:
            off = rng.randrange(idx, n - FOOTER_SIZE)
            b = bytearray(data)
            b[off] = rng.randrange(256)
            return f"index_resealed @{off}", reseal_footer(bytes(b))
    if kind == "swap_chunks":
        try:
            parts = split(data)
        except Exception:  # noqa: BLE001
            return "swap_chunks (unsplittable)", data
        if len(parts.chunks) >= 2:
            i, j = rng.sample(range(len(parts.chunks)), 2)
            parts.chunks[i], parts.chunks[j] = parts.chunks[j], parts.chunks[i]
            return f"swap_chunks {i},{j}", join(Parts(parts.header, parts.chunks))
    i = rng.randrange(8 * n) if n else 0
    b = bytearray(data)
    if n:
        b[i // 8] ^= 1 << (i % 8)
    return f"bitflip {i}", bytes(b)


def declared_bytes(data: bytes) -> int:
    """What SPEC.md 11.5 lets a reader spend on this file: the largest declared working set
    of a chunk whose descriptor parses, plus the declared metadata size."""
    worst = 0
    if len(data) >= HEADER_FIXED_SIZE and data[:MAGIC_SIZE] == FILE_MAGIC:
        fixed = R.HEADER_FIXED.parse(data[: HEADER_FIXED_SIZE])
        worst = MAX_METADATA if fixed.metadata_codec else min(fixed.metadata_length, MAX_METADATA)
    pos = data.find(CHUNK_MAGIC)
    while pos >= 0:
        head = data[pos : pos + CHUNK_FIXED_SIZE]
        if len(head) == CHUNK_FIXED_SIZE:
            h = R.CHUNK_FIXED.parse(head)
            end = pos + CHUNK_FIXED_SIZE + h.descriptor_length
            if h.descriptor_length <= MAX_DESCRIPTOR and end <= len(data):
                try:
                    program = parse_descriptor(data[pos + CHUNK_FIXED_SIZE : end], REQUIRED_FLAGS_KNOWN)
                    worst = max(worst, working_set_bytes(program, min(h.chunk_length, len(data)), mixed=True, exponent=True, bands=True))
                except BBFormatError:
                    pass
        pos = data.find(CHUNK_MAGIC, pos + 1)
    return worst


@dataclass
class Outcome:
    """What the readers did with one file."""

    results: dict[str, str] = field(default_factory=dict)  # reader -> "accept" or an E_ code
    unexpected: list[str] = field(default_factory=list)  # tracebacks of anything that is not our error
    seconds: float = 0.0  # the slower reader
    peak_bytes: int = 0  # traced by tracemalloc, the larger of the readers
    bound_bytes: int = 0  # 2 x declared + 2 x file + slack

    @property
    def ok(self) -> bool:
        return not self.unexpected and self.peak_bytes <= self.bound_bytes


def verdict(original: bytes, what: str, mutated: bytes, outcome: Outcome, seconds_limit: float) -> str | None:
    """None if the outcome is allowed, else why not: an exception that is not ours, memory
    over the bound, time over the limit, the two readers disagreeing on accept/reject, or a
    corruption that no CRC was recomputed for yet decodes."""
    if outcome.unexpected:
        return "unexpected exception: " + outcome.unexpected[0].strip().splitlines()[-1]
    if outcome.peak_bytes > outcome.bound_bytes:
        return f"memory {outcome.peak_bytes:,} B over the bound {outcome.bound_bytes:,} B"
    if outcome.seconds > seconds_limit:
        return f"took {outcome.seconds:.2f} s (limit {seconds_limit} s)"
    accepted = {r == "accept" for r in outcome.results.values()}
    if len(accepted) > 1:
        return f"readers disagree: {outcome.results}"
    if True in accepted and mutated != original and what.split()[0] not in RESEALED:
        return "undetected corruption: a mutation with no recomputed CRC decodes"
    return None


def read_random(data: bytes, budget: int | str | None = "auto") -> None:
    """Decode every block of `data` with the random-access reader (raises on a bad file)."""
    with Reader(io.BytesIO(data), max_block_bytes=budget) as r:
        for i in range(len(r)):
            r.decode_block(i)


def read_stream(data: bytes, budget: int | str | None = "auto") -> None:
    """Decode every block of `data` forward with the stream reader (raises on a bad file)."""
    for _ in iter_stream(io.BytesIO(data), max_block_bytes=budget):
        pass


READERS = {"random": read_random, "stream": read_stream}


def check(data: bytes, *, budget: int | str | None = "auto", trace_memory: bool = True) -> Outcome:
    """Run both readers on `data`; never raises for a reader's failure."""
    out = Outcome(bound_bytes=2 * declared_bytes(data) + 2 * len(data) + MEMORY_SLACK)
    for name, read in READERS.items():
        if trace_memory:
            tracemalloc.start()
            tracemalloc.reset_peak()
        t0 = time.perf_counter()
        try:
            read(data, budget)
            out.results[name] = "accept"
        except BBFormatError as exc:
            out.results[name] = exc.code
        except Exception:  # noqa: BLE001 - the point: anything else is a finding
            out.results[name] = "UNEXPECTED"
            out.unexpected.append(f"{name}: {traceback.format_exc(limit=-4)}")
        finally:
            out.seconds = max(out.seconds, time.perf_counter() - t0)
            if trace_memory:
                out.peak_bytes = max(out.peak_bytes, tracemalloc.get_traced_memory()[1])
                tracemalloc.stop()
    return out


def crc_coverage(data: bytes) -> list[str]:
    """For each byte of a well-formed container, the check that covers it: the CRC32C whose
    stored value is recomputed here over exactly its range (header_crc, chunk k's crc, the
    index CRC in the footer, footer_crc), or the footer magic, which is compared. Raises
    AssertionError if a stored CRC does not match its range: the map is then wrong."""
    parts = split(data)
    cover: list[str] = []

    def covered(label: str, body: bytes, stored: bytes) -> None:
        assert crc32c(body) == int.from_bytes(stored, "little"), label
        cover.extend([label] * (len(body) + len(stored)))

    covered("header", parts.header[:-4], parts.header[-4:])
    for k, c in enumerate(parts.chunks):
        covered(f"chunk {k}", c[:-4], c[-4:])
    footer = data[-FOOTER_SIZE :]
    index = data[len(cover) : len(data) - FOOTER_SIZE]
    index_crc = footer[FOOTER_INDEX_CRC_OFFSET : FOOTER_INDEX_CRC_OFFSET + CRC_SIZE]
    assert crc32c(index) == int.from_bytes(index_crc, "little"), "index"
    cover.extend(["index"] * len(index))
    covered("footer", footer[:FOOTER_CRC_OFFSET], footer[FOOTER_CRC_OFFSET : FOOTER_CRC_OFFSET + CRC_SIZE])
    cover.extend(["footer magic"] * MAGIC_SIZE)
    return cover

"""How the reader's buffers and zstd contexts cost: one process, passes taken in turn.

    python tools/bench_read.py FILE.bb [FILE.bb ...] [--rounds 9] [--json OUT] [--report BENCHMARKS.md]

For each container, each round reads and entropy-decodes every chunk (Reader.read_chunk: no
linear algebra) once in each of these ways, in turn:

- `default`: Reader(path, threads=1), chunks read with pread into bytes;
- `writable`: writable_chunks=True (what load_model uses): each chunk read into a numpy buffer;
- `writable, mapping (before)`: the same, each chunk read into an anonymous mapping of its own,
  as the reader did before (reproduced here);
- `zstd decompressobj (before)`: default, with every zstd frame decoded through a new
  ZstdDecompressor and its decompressobj, as zstdframe did before (reproduced here), instead of
  one-shot decoding in a per-thread context.

Every way must give the same payload bytes (checked first). Times: best and median of the rounds.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import mmap
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any
from datetime import date
from pathlib import Path

import zstandard

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bbformat  # noqa: E402
from bbformat import zstdframe  # noqa: E402
from bbformat.errors import BBFormatError, FormatError  # noqa: E402
from machine import cpu_and_memory, python_and_numpy  # noqa: E402
from mdsection import section_args, write_section  # noqa: E402

SECTION_TITLE = "## 18. Reading chunks: read buffers and zstd contexts (tools/bench_read.py)"


class MappingReader(bbformat.Reader):
    """The reader before this change: writable chunks read into an anonymous mapping each."""

    def _read_into(self, offset: int, n: int, writable: bool = True) -> memoryview:
        view = memoryview(mmap.mmap(-1, max(n, 1)))[:n]
        got = 0
        while got < n:
            k = os.preadv(self._f.fileno(), [view[got:]], offset + got)
            if k <= 0:
                break
            got += k
        if got != n:
            raise FormatError("unexpected end of file", "E_TRUNCATED")
        return view


def frame_by_decompressobj(stored: zstdframe.Buffer) -> bytes:
    """zstdframe.decompress_frame before this change."""
    try:
        dobj = zstandard.ZstdDecompressor().decompressobj()
        data = dobj.decompress(stored)
        if not dobj.eof or dobj.unused_data:
            raise FormatError("zstd section is not exactly one frame", "E_ZSTD")
    except zstandard.ZstdError as exc:
        raise FormatError(f"bad zstd data: {exc}", "E_ZSTD") from None
    return data


def passes(path: Path) -> dict[str, Callable[[bool], str]]:
    """Each way of reading `path`: a pass, which returns the sha256 of every chunk's payload
    when asked to (the timed passes are not)."""
    now = zstdframe.decompress_frame

    def read_all(reader: bbformat.Reader, frame: Callable[..., bytes], digest: bool) -> str:
        zstdframe.decompress_frame = frame
        try:
            h = hashlib.sha256()
            for i in range(len(reader)):
                payload = reader.read_chunk(i).payload
                if digest:
                    h.update(payload.tobytes())
            return h.hexdigest()
        finally:
            zstdframe.decompress_frame = now

    plain = bbformat.Reader(path, threads=1)
    writable = bbformat.Reader(path, threads=1, writable_chunks=True)
    mapping = MappingReader(path, threads=1, writable_chunks=True)
    return {"default": lambda d: read_all(plain, now, d), "writable": lambda d: read_all(writable, now, d),
            "writable, mapping (before)": lambda d: read_all(mapping, now, d),
            "zstd decompressobj (before)": lambda d: read_all(plain, frame_by_decompressobj, d)}


def measure(path: Path, rounds: int) -> dict[str, Any]:
    ways = passes(path)
    digests = {k: fn(True) for k, fn in ways.items()}
    if len(set(digests.values())) != 1:
        raise SystemExit(f"bench_read: the ways disagree on {path}: {digests}")
    times: dict[str, list[float]] = {k: [] for k in ways}
    for _ in range(rounds):
        for k, fn in ways.items():
            t0 = time.perf_counter()
            fn(False)
            times[k].append(time.perf_counter() - t0)
    return {"file": str(path), "bytes": path.stat().st_size, "times": times}


def table(res: dict[str, Any]) -> list[str]:
    times: dict[str, list[float]] = res["times"]
    lines = [f"`{res['file']}` ({res['bytes']:,} B)", "", "| pass | best s | median s |", "|---|---|---|"]
    lines += [f"| {k} | {min(v):.3f} | {statistics.median(v):.3f} |" for k, v in times.items()]
    return lines + [""]


def section(run: dict[str, Any]) -> str:
    results: list[dict[str, Any]] = run["results"]
    rounds = len(next(iter(results[0]["times"].values())))
    head = [SECTION_TITLE, "", f"Machine: {run['machine']}; {run['software']}. Command: `python tools/bench_read.py "
            f"{' '.join(run['argv'])}` ({run['date']}). {rounds} rounds, each one pass of every row in turn, one process; a "
            "pass reads and entropy-decodes every chunk (Reader.read_chunk, one thread). Every row gave the same payload "
            "bytes.", ""]
    return "\n".join(head + [line for r in results for line in table(r)])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="*", type=Path)
    p.add_argument("--rounds", type=int, default=9)
    section_args(p)
    args = p.parse_args(argv)
    if args.from_json:
        run = json.loads(args.from_json.read_text())
    elif args.files:
        try:
            results = [measure(f, args.rounds) for f in args.files]
        except BBFormatError as exc:  # a missing or damaged container: one line
            print(f"bench_read: {exc}", file=sys.stderr)
            return 2
        run = {"argv": sys.argv[1:] if argv is None else argv, "date": str(date.today()), "machine": cpu_and_memory(),
               "software": f"{python_and_numpy()}, zstandard {zstandard.__version__}", "results": results}
    else:
        p.error("give containers to measure, or --from-json")
    text = section(run)
    if args.notes:
        text += "\n" + args.notes.read_text()
    print(text)
    if args.json:
        args.json.write_text(json.dumps(run, indent=1) + "\n")
    if args.report:
        write_section(args.report, text, SECTION_TITLE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

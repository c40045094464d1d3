#!/usr/bin/env python3
"""The writer's zstd settings for side sections against zstd levels, on the sections of a real pack
(issue 39: pack's host work; SPEC.md 12.4).

    python tools/section_zstd.py SRC [--levels 19,12,3] [--json OUT.json]

Packs SRC (a checkpoint or model directory, `pack`'s defaults) into a temporary file once,
keeping every input the writer passes to its side-section compressor (patch sections,
x_residuals groups and whole sections), then compresses those inputs, one at a time and each
with a fresh compressor, with the writer's settings (zstdframe.SECTION_PARAMS) and with each
level. (The writer makes one compressor per side section, and one per x_residuals section for
all its groups: the bytes are the same, the CPU seconds here include a compressor's set-up per
group.) Per setting: the bytes stored (each input at most raw, as the writer
keeps the smaller) and the CPU seconds. The inputs are those of a pack with the writer's
settings: a whole x_residuals section, compressed after its groups, holds the groups as those
settings stored them, so a level's figure prices the same inputs, not a pack at that level.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from unittest import mock
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def capture(src: str) -> tuple[list[bytes], int]:
    """(the side-section compressor's inputs, the file's size) of one pack of `src`."""
    import bbformat.codec.section_kinds as kinds
    import bbformat.codec.sections as sections
    from bbformat import api, zstdframe

    seen: list[bytes] = []
    lock = threading.Lock()

    class Recording:
        def __init__(self) -> None:
            self.z = zstdframe.section_compressor()

        def compress(self, data: Any) -> bytes:
            with lock:
                seen.append(bytes(data))
            return self.z.compress(data)

    with mock.patch.object(sections, "section_compressor", Recording), mock.patch.object(kinds, "section_compressor", Recording), \
            tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.bb"
        api.pack(src, out)
        size = out.stat().st_size
    return seen, size


def measure(inputs: list[bytes], make: Callable[[], Any]) -> dict[str, float]:
    """Stored bytes and CPU seconds of `inputs`, each through a fresh compressor from `make`."""
    t = time.thread_time()
    stored = sum(min(len(make().compress(d)), len(d)) for d in inputs)
    return {"stored": stored, "cpu_s": round(time.thread_time() - t, 3)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="section_zstd.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("src")
    ap.add_argument("--levels", default="19,12,3", help="zstd levels to compare (comma-separated)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    try:
        levels = [int(x) for x in args.levels.split(",")]
    except ValueError:
        ap.error("argument --levels: integers separated by commas")
    from bbformat import zstdframe

    inputs, size = capture(args.src)
    rows = {"writer": measure(inputs, zstdframe.section_compressor)}
    for level in levels:
        rows[f"level {level}"] = measure(inputs, lambda: zstdframe.compressor(level))
    result = {"argv": sys.argv[1:] if argv is None else argv, "src": args.src, "file_bytes": size, "inputs": len(inputs), "input_bytes": sum(map(len, inputs)),
              "writer_params": {k: int(v) for k, v in zstdframe.SECTION_PARAMS.items()}, "settings": rows}
    print(f"{args.src}: {len(inputs)} inputs, {result['input_bytes']:,} bytes; file {size:,} bytes")
    base = rows.get("level 19")
    for name, r in rows.items():
        vs = f"  {100 * (r['stored'] - base['stored']) / size:+.4f}% of the file vs level 19" if base else ""
        print(f"  {name:10s} {r['stored']:>14,} B  {r['cpu_s']:7.2f} s{vs}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

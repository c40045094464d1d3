#!/usr/bin/env python3
"""The reference Python reader as a conformance-protocol decoder (see conformance/README.md).

    python conformance/impl_python.py PATH [--out DIR]

Reads PATH with bbformat's random-access Reader (footer first, SPEC.md section 2 strategy 1),
verifies and decodes every chunk in index order, and prints exactly one JSON object:

    accept (exit 0): {"result": "accept", "tensors": {NAME: {"dtype", "shape", "sha256"[, "file"]}}}
    reject (exit 1): {"result": "reject", "code": "E_...", "message": "..."}

With --out DIR, each tensor's raw little-endian bytes (C order) go to DIR/<k>.bin, k = the
tensor's position in sorted-name order, and "file" gives that path. A tensor name that occurs
in more than one chunk keeps the last one (the reference's behaviour, SPEC.md section 7.1).
Anything else (a bug, an unreadable path) is not a protocol answer: traceback, exit 70 / 2.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _import_reader():  # type: ignore[no-untyped-def]
    """Import bbformat's reader without running bbformat/__init__.py, which imports torch for
    the model-level API (about a second per process; this command runs once per vector)."""
    if "bbformat" not in sys.modules:
        spec = importlib.util.find_spec("bbformat")
        if spec is None or not spec.submodule_search_locations:
            sys.path.insert(0, str(ROOT))
            spec = importlib.util.find_spec("bbformat")
        assert spec is not None and spec.submodule_search_locations
        pkg = types.ModuleType("bbformat")
        pkg.__path__ = list(spec.submodule_search_locations)
        pkg.__file__ = spec.origin
        sys.modules["bbformat"] = pkg
    from bbformat.errors import BBFormatError, InputError
    from bbformat.reader import Reader

    return Reader, BBFormatError, InputError


def decode_path(path: str | Path, device: object = None) -> dict:
    """Decode a container; returns the protocol object, with each tensor's raw bytes under
    the extra key "bytes" (removed before printing). Raises only for non-protocol failures.
    device: the reader's backend (bbformat.codec.linalg.device_backend; None: the reference)."""
    Reader, BBFormatError, InputError = _import_reader()
    try:
        tensors = {}
        with Reader(path, device=device) as r:
            for block in r.iter_blocks():  # every chunk in order; rejects a name in two chunks
                tensors.update(block.tensors)
    except InputError:
        raise
    except BBFormatError as exc:
        return {"result": "reject", "code": exc.code, "message": str(exc), "class": type(exc).__name__}
    out = {}
    for name, t in tensors.items():
        data = t.tobytes()
        out[name] = {"dtype": t.dtype, "shape": list(t.shape), "sha256": hashlib.sha256(data).hexdigest(), "bytes": data}
    return {"result": "accept", "tensors": out}


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    out_dir = None
    if "--out" in args:
        k = args.index("--out")
        if k + 1 >= len(args):
            print("usage: impl_python.py PATH [--out DIR]", file=sys.stderr)
            return 64
        out_dir = Path(args[k + 1])
        del args[k : k + 2]
    if len(args) != 1:
        print("usage: impl_python.py PATH [--out DIR]", file=sys.stderr)
        return 64
    try:
        res = decode_path(args[0])
    except Exception as exc:  # noqa: BLE001 - not a protocol answer
        if type(exc).__name__ == "InputError":
            print(f"impl_python: {exc}", file=sys.stderr)
            return 2
        raise
    if res["result"] == "reject":
        res.pop("class", None)
        print(json.dumps(res, sort_keys=True))
        return 1
    for k, name in enumerate(sorted(res["tensors"])):
        entry = res["tensors"][name]
        data = entry.pop("bytes")
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
            f = out_dir / f"{k}.bin"
            f.write_bytes(data)
            entry["file"] = str(f.resolve())
    print(json.dumps(res, sort_keys=True))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SystemExit:
        raise
    except BaseException:  # noqa: BLE001
        import traceback

        traceback.print_exc()
        sys.exit(70)

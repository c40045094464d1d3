"""Containers packed on a GPU (tools/gpu_fixtures.py on an H100, --device cuda; tests/fixtures/gpu)
decode exactly on the CPU: the numpy reference, the torch backend on the CPU and the C reader
give every tensor the bytes the GPU's own reader gave there (gpu_fixtures.json, recorded on the
device), and every digest verifies. Written once, decoded forever (numcodecs style)."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bbformat.reader import Reader

FIX = Path(__file__).parent / "fixtures" / "gpu"
MANIFEST = json.loads((FIX / "gpu_fixtures.json").read_text())
FILES = sorted(MANIFEST["files"])
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "conformance"))
import run as runner  # noqa: E402


def test_the_fixtures_were_packed_on_a_gpu() -> None:
    assert "H100" in MANIFEST["machine"]["gpu"] and MANIFEST["machine"]["device"] == "cuda"
    assert len(FILES) == 4
    for name in FILES:
        entry = MANIFEST["files"][name]
        assert hashlib.sha256((FIX / name).read_bytes()).hexdigest() == entry["sha256"], name
        assert entry["decoded_on_device"]["exact"] is True


@pytest.mark.parametrize("device", ["cpu", "torch:cpu"])
@pytest.mark.parametrize("name", FILES)
def test_cpu_readers_decode_what_the_gpu_decoded(name: str, device: str) -> None:
    want = MANIFEST["files"][name]["decoded_on_device"]
    got: dict[str, str] = {}
    with Reader(FIX / name, device=device, fallback=False, margins=True) as r:
        assert r.has_digests
        for b in r.iter_blocks():
            assert b.exact is True and not b.fallback, (name, b.name)
            got.update({n: hashlib.sha256(t.tobytes()).hexdigest() for n, t in b.tensors.items()})
    assert got == want["tensors"]


def test_c_reader_decodes_what_the_gpu_decoded(tmp_path: Path) -> None:
    if not runner.c_sources_exist():
        pytest.skip("no C reader sources")
    binary, log = runner.build_c()
    if binary is None:
        pytest.skip(f"the C reader does not build here: {log[-300:]}")
    for name in FILES:
        p = subprocess.run([str(binary), str(FIX / name), "--out", str(tmp_path / name)], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, (name, p.stderr[-500:])
        out = json.loads(p.stdout)
        assert out["result"] == "accept" and out["digests"] == "verified", name
        assert {n: t["sha256"] for n, t in out["tensors"].items()} == MANIFEST["files"][name]["decoded_on_device"]["tensors"], name

"""tools/make_large.py: synthetic sliced checkpoints at real shapes, streamed to disk; checked
here on its tiny presets (the same code paths)."""
from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import safetensors.torch
import torch

import bbformat
from bbformat.testing import make_tiny_checkpoint

TOOL = Path(__file__).resolve().parent.parent / "tools" / "make_large.py"
TINY = {"tiny-llama": dict(arch="llama", hidden=64, heads=4, kv_heads=4, intermediate=176, vocab=128),
        "tiny-opt": dict(arch="opt", hidden=80, heads=4, intermediate=320, vocab=128)}


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_large", TOOL)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("make_large", mod)  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


ml = _tool()


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One `--format both` run per tiny preset (2 layers, float16, seed 0)."""
    out = {}
    for preset in TINY:
        d = tmp_path_factory.mktemp(preset) / "ckpt"
        assert ml.main([str(d), "--preset", preset, "--format", "both"]) == 0
        out[preset] = d
    return out


def _stem(d: Path) -> str:
    return next(d.glob("*.safetensors")).stem


def _split(d: Path, fmt: str, dst: Path) -> Path:
    """DST holding the side files and only the `fmt` weights file."""
    dst.mkdir()
    for p in d.iterdir():
        if p.suffix not in (".pt", ".safetensors") or p.suffix == f".{fmt}":
            shutil.copy(p, dst / p.name)
    return dst


@pytest.mark.parametrize("preset", sorted(TINY))
@pytest.mark.parametrize("fmt", ["pt", "safetensors"])
def test_tiny_presets_pack_with_verify(made: dict[str, Path], tmp_path: Path, preset: str, fmt: str) -> None:
    src = _split(made[preset], fmt, tmp_path / "src")
    report = bbformat.pack(src, tmp_path / "x.bb", verify=True)
    assert report.architecture == TINY[preset]["arch"] and report.container_bytes > 0


@pytest.mark.parametrize("preset", sorted(TINY))
def test_layout_matches_make_tiny_checkpoint(made: dict[str, Path], preset: str) -> None:
    """Same keys in the same order, shapes and SlicingConfig as the tiny generator's, for
    TC's ConstSlicingScheduler (d = 0.75 hidden, the last MLP output at full width)."""
    kw = dict(TINY[preset])
    arch = kw.pop("arch")
    d = ml.residual_width(kw["hidden"], 0.25)
    ref = make_tiny_checkpoint(arch, seed=0, layers=2, dims=d, max_positions=64, **kw)  # type: ignore[arg-type]
    stem = _stem(made[preset])
    assert stem == f"{preset}_0.25"
    pt = torch.load(made[preset] / f"{stem}.pt", weights_only=True)
    assert [(k, tuple(v.shape)) for k, v in pt.items()] == [(k, tuple(v.shape)) for k, v in ref.state_dict.items()]
    assert (made[preset] / f"{stem}.json").read_bytes() == ref.extra_files[f"{ref.stem}.json"]
    cfg = json.loads((made[preset] / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 2 and cfg["torch_dtype"] == "float16"


@pytest.mark.parametrize("preset", sorted(TINY))
def test_both_formats_hold_identical_tensors(made: dict[str, Path], preset: str) -> None:
    stem = _stem(made[preset])
    pt = torch.load(made[preset] / f"{stem}.pt", weights_only=True)
    st = safetensors.torch.load_file(made[preset] / f"{stem}.safetensors")
    assert set(pt) == set(st)
    for k, v in pt.items():
        assert v.dtype == st[k].dtype == torch.float16 and torch.equal(v.view(torch.int16), st[k].view(torch.int16)), k
        assert bool(torch.isfinite(v).all()) and v.abs().max() > 0


def test_same_seed_same_bytes(made: dict[str, Path], tmp_path: Path) -> None:
    again, other = tmp_path / "again", tmp_path / "other"
    again.mkdir()  # an empty OUT_DIR is replaced
    assert ml.main([str(again), "--preset", "tiny-opt", "--format", "both"]) == 0
    assert ml.main([str(other), "--preset", "tiny-opt", "--format", "safetensors", "--seed", "1"]) == 0
    first = made["tiny-opt"]
    names = sorted(p.name for p in first.iterdir())
    assert names == sorted(p.name for p in again.iterdir())
    for n in names:
        assert (first / n).read_bytes() == (again / n).read_bytes(), n
    st = next(first.glob("*.safetensors")).name
    assert (first / st).read_bytes() != (other / st).read_bytes()


def test_residual_axes_have_a_decaying_spectrum(made: dict[str, Path]) -> None:
    d = made["tiny-llama"]
    sd = safetensors.torch.load_file(next(d.glob("*.safetensors")))
    emb = sd["model.embed_tokens.weight"].double().numpy()  # residual axis 1
    o = sd["model.layers.0.self_attn.o_proj.weight"].double().numpy()  # residual axis 0
    for cols in (np.linalg.norm(emb, axis=0), np.linalg.norm(o, axis=1)):
        q = len(cols) // 4
        assert cols[:q].mean() > 1.4 * cols[-q:].mean()
    eig = np.linalg.eigvalsh(emb.T @ emb)[::-1]
    assert np.all(np.diff(eig) < 0) and eig[0] > 3 * eig[-1]
    assert np.allclose(ml.decay(4), [1, 0.5**0.5, 1 / 3**0.5, 0.5])


def test_shortcuts_are_slices_of_orthogonal_changes_of_basis(made: dict[str, Path]) -> None:
    """R[:a, :b] of an orthogonal R: singular values <= 1, at least a + b - n of them 1; the last
    layer's mlp_shortcut_Q (d, hidden) has orthonormal rows, as TC's."""
    for preset, d in made.items():
        n = TINY[preset]["hidden"]
        sd = safetensors.torch.load_file(next(d.glob("*.safetensors")))
        shortcuts = {k: v.double().numpy() for k, v in sd.items() if k.endswith("_shortcut_Q")}
        assert len(shortcuts) == 4
        for k, q in shortcuts.items():
            a, b = q.shape
            sv = np.linalg.svd(q, compute_uv=False)
            assert sv.max() < 1 + 1e-3 and (sv > 1 - 1e-3).sum() >= a + b - n, k
            assert np.count_nonzero(q) == q.size  # dense
        last = shortcuts[next(k for k in shortcuts if ".1.mlp_shortcut_Q" in k)]
        assert last.shape[1] == n and np.abs(last @ last.T - np.eye(last.shape[0])).max() < 1e-3


def test_orthogonal_block_is_orthogonal_to_float64_rounding() -> None:
    for n in (64, 80, 67):
        r = ml.orthogonal_block(np.random.default_rng(n), n, n, n, torch.float64).numpy()
        assert np.abs(r.T @ r - np.eye(n)).max() < 1e-12 and np.abs(r).min() > 0  # dense
        part = ml.orthogonal_block(np.random.default_rng(n), n, n - 8, n - 16, torch.float64).numpy()
        # a block of the same R: equal to float64 rounding (BLAS may sum a narrower product in
        # another order, so the last bits depend on the kernel: bit equality failed under torch
        # 2.13's OpenBLAS on an AMD EPYC)
        assert np.abs(part - r[: n - 8, : n - 16]).max() < 1e-14


def test_key_order_tc(tmp_path: Path) -> None:
    m = ml.Model(**{k: v for k, v in ml.PRESETS["tiny-opt"].items()}, kv_heads=4)
    names = [s.name for s in ml.plan(m, 56, "tc")]
    p = "model.decoder.layers.0."
    assert names[2:6] == [p + "mlp_shortcut_Q", p + "attn_shortcut_Q", p + "self_attn.k_proj.weight", p + "self_attn.k_proj.bias"]
    assert sorted(names) == sorted(s.name for s in ml.plan(m, 56))


def test_reports_files_sizes_and_peak_memory(made: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert ml.main([str(tmp_path / "c"), "--preset", "tiny-llama", "--layers", "1", "--format", "pt",
                    "--dtype", "bfloat16", "--hidden", "32", "--heads", "2", "--intermediate", "48", "--vocab", "40"]) == 0
    out = capsys.readouterr().out
    assert "tiny-llama_0.25.pt" in out and "VmHWM" in out and "bytes" in out
    sd = torch.load(tmp_path / "c" / "tiny-llama_0.25.pt", weights_only=True)
    assert sd["model.embed_tokens.weight"].shape == (40, 24) and sd["lm_head.weight"].shape == (40, 32)
    assert all(v.dtype == torch.bfloat16 for v in sd.values())
    assert not [p for p in tmp_path.iterdir() if ".bbtmp-" in p.name]


def test_a_failed_write_exits_8_and_leaves_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def full(self: object, name: str, t: torch.Tensor) -> None:
        calls.append(name)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(ml.Outputs, "write", full)
    assert ml.main([str(tmp_path / "out"), "--preset", "tiny-opt", "--format", "both"]) == 8
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot write" in err and "No space left on device" in err, err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("args, text", [
    (["--preset", "gpt-9"], "invalid choice"),
    ([], "required: --preset"),
    (["--preset", "tiny-llama", "--sparsity", "1.5"], "--sparsity must be in [0, 1)"),
    (["--preset", "tiny-llama", "--sparsity", "0.95"], "residual width of 0"),
    (["--preset", "tiny-llama", "--layers", "0"], "positive integer"),
    (["--preset", "tiny-llama", "--hidden", "30"], "not a multiple of --heads"),
    (["--preset", "tiny-llama", "--format", "bin"], "invalid choice"),
    (["--preset", "tiny-opt", "--kv-heads", "2"], "Llama presets only"),
    (["--preset", "tiny-llama", "--seed", "-1"], "non-negative"),
])
def test_bad_options_exit_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], text: str) -> None:
    assert ml.main([str(tmp_path / "out"), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("make_large: error: ") and text in err, err
    assert not list(tmp_path.iterdir())


def test_cli_refuses_a_non_empty_directory_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("x")
    r = subprocess.run([sys.executable, str(TOOL), str(tmp_path), "--preset", "tiny-llama"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "not empty" in r.stderr and "Traceback" not in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]

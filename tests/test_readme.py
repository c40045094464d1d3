"""The README's examples run as written (safetensors style)."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def _run_commands(block: str, cwd: Path) -> list[str]:
    """Run each `bbformat ...` line of an sh block; their standard outputs."""
    outs = []
    for line in block.splitlines():
        cmd = line.split("#", 1)[0].strip()
        if not cmd:
            continue
        argv = shlex.split(cmd)
        assert argv[0] == "bbformat"
        r = subprocess.run([sys.executable, "-m", "bbformat", *argv[1:]], cwd=cwd, capture_output=True, text=True)
        assert r.returncode == 0, (cmd, r.stderr)
        outs.append(r.stdout)
    return outs


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_walkthrough_plain_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("transformers")
    walk = README.split("## Walk-through", 1)[1].split("### SliceGPT checkpoints", 1)[0]
    (make,) = re.findall(r"```python\n(.*?)```", walk, flags=re.S)
    (block,) = re.findall(r"```sh\n(.*?)```", walk, flags=re.S)
    monkeypatch.chdir(tmp_path)
    exec(compile(make, "README.md", "exec"), {})
    outs = _run_commands(block, tmp_path)
    shards = sorted(p.name for p in (tmp_path / "tiny-llama").glob("*.safetensors"))
    assert len(shards) == 4 and (tmp_path / "tiny-llama" / "model.safetensors.index.json").is_file()
    assert "a plain Hugging Face directory: 4 safetensors files and 3 other files" in outs[1] and "exact: all" in outs[2]
    assert _tree(tmp_path / "tiny-back") == _tree(tmp_path / "tiny-llama")  # diff -r finds nothing


def test_walkthrough_commands(tmp_path: Path) -> None:
    walk = README.split("### SliceGPT checkpoints: bits back", 1)[1]
    block = re.search(r"```sh\n(.*?)```", walk, flags=re.S)
    assert block is not None
    _run_commands(block.group(1), tmp_path)
    assert (tmp_path / "demo" / "unpacked").is_dir() and list((tmp_path / "demo" / "st").glob("*.safetensors"))


def test_python_api_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from bbformat.checkpoint import write_checkpoint
    from bbformat.testing import make_tiny_checkpoint

    write_checkpoint(make_tiny_checkpoint("llama", seed=0, layers=2), tmp_path / "demo" / "model")
    monkeypatch.chdir(tmp_path)
    (code,) = [b for b in _blocks("python") if "import bbformat" in b]
    exec(compile(code, "README.md", "exec"), {})
    assert (tmp_path / "demo" / "unpacked").is_dir()
    assert "layers.0" in capsys.readouterr().out


def test_untrusted_files_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import bbformat
    from bbformat.checkpoint import write_checkpoint
    from bbformat.testing import make_tiny_checkpoint

    write_checkpoint(make_tiny_checkpoint("llama", seed=0, layers=2), tmp_path / "demo" / "model")
    bbformat.pack(tmp_path / "demo" / "model", tmp_path / "demo" / "model.bb")
    monkeypatch.chdir(tmp_path)
    (code,) = [b for b in _blocks("python") if "max_block_bytes" in b]
    exec(compile(code, "README.md", "exec"), {"bbformat": bbformat})
    assert "layers.0" in capsys.readouterr().out


def test_hf_loading_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers")
    import bbformat
    from bbformat.checkpoint import write_checkpoint
    from bbformat.testing import make_tiny_checkpoint

    write_checkpoint(make_tiny_checkpoint("llama", seed=0, layers=2), tmp_path / "demo" / "model")
    bbformat.pack(tmp_path / "demo" / "model", tmp_path / "demo" / "model.bb")
    section = README.split("### Loading with transformers", 1)[1]
    (cmd,) = re.findall(r"```sh\n(.*?)```", section, flags=re.S)[:1]
    argv = shlex.split(cmd.strip())
    r = subprocess.run([sys.executable, "-m", "bbformat", *argv[1:]], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)[:1]
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert re.fullmatch(r"tensor\(\[\[ *1, +2, +3(, +\d+){8}\]\]\)\n", out), out


def test_loading_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    transformers = pytest.importorskip("transformers")
    import bbformat
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                   num_attention_heads=2, max_position_embeddings=32)
    transformers.LlamaForCausalLM(cfg).save_pretrained(str(tmp_path / "plain"))
    bbformat.pack(tmp_path / "plain", tmp_path / "plain.bb")
    section = README.split("### Loading\n", 1)[1]
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)[:1]
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {"bbformat": bbformat})
    assert capsys.readouterr().out == "LlamaForCausalLM torch.float32 12\n"

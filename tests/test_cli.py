"""The command line: one-line errors with documented exit codes, never a traceback."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bbformat.checkpoint import write_checkpoint
from bbformat.cli import main
from bbformat.testing import make_tiny_checkpoint


def _run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bbformat", *args], capture_output=True, text=True, cwd=cwd)


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    write_checkpoint(make_tiny_checkpoint("llama", seed=1, layers=2), tmp_path / "src")
    return tmp_path / "src"


def test_pack_inspect_unpack(model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "m.bb"
    r = _run("pack", str(model_dir), str(out), "--verify", "--quiet")
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""  # not a terminal: no progress bar
    r = _run("inspect", str(out))
    assert r.returncode == 0 and "bits saved" in r.stdout
    r = _run("inspect", str(out), "--json")
    info = json.loads(r.stdout)
    assert info["totals"]["container_bytes"] == os.path.getsize(out)
    r = _run("unpack", str(out), str(tmp_path / "back"))
    assert r.returncode == 0
    assert sorted(p.name for p in (tmp_path / "back").iterdir()) == sorted(p.name for p in model_dir.iterdir())


def _one_line_error(r: subprocess.CompletedProcess, status: int, code: str) -> None:
    assert r.returncode == status, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and code in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_missing_input(tmp_path: Path) -> None:
    _one_line_error(_run("pack", str(tmp_path / "nope"), str(tmp_path / "o.bb")), 2, "E_INPUT")
    assert not (tmp_path / "o.bb").exists()


def test_not_a_container(tmp_path: Path) -> None:
    p = tmp_path / "x.bb"
    p.write_bytes(b"hello world" * 20)
    _one_line_error(_run("inspect", str(p)), 4, "E_MAGIC")
    _one_line_error(_run("unpack", str(p), str(tmp_path / "d")), 4, "E_MAGIC")


def test_corrupt_chunk_crc(model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "m.bb"
    assert _run("pack", str(model_dir), str(out), "--quiet").returncode == 0
    data = bytearray(out.read_bytes())
    data[len(data) // 2] ^= 0xFF
    out.write_bytes(bytes(data))
    _one_line_error(_run("unpack", str(out), str(tmp_path / "d")), 5, "E_CRC")


def test_unsupported_model(model_dir: Path, tmp_path: Path) -> None:
    cfg = json.loads((model_dir / "config.json").read_text())
    cfg["model_type"] = "gpt_neox"
    (model_dir / "config.json").write_text(json.dumps(cfg))
    _one_line_error(_run("pack", str(model_dir), str(tmp_path / "o.bb")), 3, "E_UNSUPPORTED_MODEL")


def test_usage_error(tmp_path: Path) -> None:
    r = _run("pack")
    assert r.returncode == 64 and "Traceback" not in r.stderr


def test_main_in_process(model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pack", str(model_dir), str(tmp_path / "m.bb"), "--json"]) == 0
    totals = json.loads(capsys.readouterr().out)
    assert totals["container_bytes"] == os.path.getsize(tmp_path / "m.bb")


def test_demo(tmp_path: Path) -> None:
    r = _run("demo", "--keep", str(tmp_path / "d"), "--layers", "2")
    assert r.returncode == 0, r.stderr
    assert "OK" in r.stdout


def test_max_memory_budget(model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--max-memory refuses a block over its declared working set before decoding it (exit 6)."""
    out = tmp_path / "m.bb"
    assert main(["pack", str(model_dir), str(out), "--quiet"]) == 0
    for argv in (["inspect", str(out)], ["unpack", str(out), str(tmp_path / "u"), "--quiet", "--force"]):
        assert main([*argv, "--max-memory", "4K"]) == 6
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "[E_LIMIT_MEMORY]" in err and "needs up to" in err
        assert main([*argv, "--max-memory", "none"]) == 0
        assert main([*argv, "--max-memory", "1G"]) == 0
    for flag, bad in (("--max-memory", "-3"), ("--max-memory", "inf"), ("--max-site-dim", "1"), ("--max-site-dim", "big")):
        with pytest.raises(SystemExit) as info:
            main(["inspect", str(out), flag, bad])
        assert info.value.code == 64
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("bbformat: usage error:") and flag in err


def test_max_site_dim(model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--max-site-dim refuses a rotation site larger than D before decoding it (exit 6)."""
    out = tmp_path / "m.bb"
    assert main(["pack", str(model_dir), str(out), "--quiet"]) == 0
    assert main(["unpack", str(out), str(tmp_path / "u"), "--quiet", "--max-site-dim", "2"]) == 6
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "[E_LIMIT_DIM]" in err and "this reader's limit is 2" in err
    assert not (tmp_path / "u").exists()
    assert main(["unpack", str(out), str(tmp_path / "u"), "--quiet", "--max-site-dim", "32768"]) == 0


def test_verify(model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """verify decodes every block: a summary line or JSON; a damaged file is one line with its code."""
    out = tmp_path / "m.bb"
    assert main(["pack", str(model_dir), str(out), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["verify", str(out), "--workers", "1"]) == 0
    text = capsys.readouterr().out
    assert "exact: all 4 chunks verified" in text and "band margin" in text
    assert main(["verify", str(out), "--json", "--workers", "2"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["chunks"] == 4 and got["content_digests"] is True and got["exact"] is True and got["format_version"] == "1.5"
    assert got["band_margin"] > 1
    old = tmp_path / "old.bb"
    assert main(["pack", str(model_dir), str(old), "--quiet", "--format-version", "1.1", "--entropy", "none"]) == 0
    capsys.readouterr()
    assert main(["verify", str(old)]) == 0
    text = capsys.readouterr().out
    assert "decoded all 4 chunks" in text and "no digest" in text
    assert main(["verify", str(old), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["content_digests"] is False and got["exact"] is None and got["format_version"] == "1.0"
    data = bytearray(out.read_bytes())
    data[len(data) // 2] ^= 0xFF
    out.write_bytes(bytes(data))
    _one_line_error(_run("verify", str(out)), 5, "E_CRC")
    _one_line_error(_run("verify", str(tmp_path / "absent.bb")), 2, "E_INPUT")


def test_workers_flag(model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "m.bb"
    assert main(["pack", str(model_dir), str(out), "--quiet"]) == 0
    for cmd in (["verify", str(out)], ["unpack", str(out), str(tmp_path / "u")]):
        for bad in ("0", "-1", "two"):
            with pytest.raises(SystemExit) as info:
                main([*cmd, "--workers", bad])
            assert info.value.code == 64
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and err.startswith("bbformat: usage error:") and "--workers" in err
    assert not (tmp_path / "u").exists()
    assert main(["unpack", str(out), str(tmp_path / "u"), "--quiet", "--workers", "1"]) == 0


def test_closed_pipe_ends_quietly(model_dir: Path, tmp_path: Path) -> None:
    """`bbformat inspect --json F | head`: the reader is gone before anything is written; the
    command ends with 141 (128 + SIGPIPE, as Unix tools) and says nothing on stderr."""
    out = tmp_path / "m.bb"
    assert main(["pack", str(model_dir), str(out), "--quiet"]) == 0
    for args in (["inspect", "--json", str(out)], ["verify", str(out)], ["--help"]):
        p = subprocess.Popen([sys.executable, "-m", "bbformat", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert p.stdout is not None and p.stderr is not None
        p.stdout.close()  # before the child, still importing, writes anything
        err = p.stderr.read().decode()
        status = p.wait(timeout=120)
        # --help: argparse itself ignores a failed write of the help text, so it may end with 0
        assert err == "" and (status == 141 or (args == ["--help"] and status == 0)), (args, status, err)


def test_import_and_cli_do_not_load_torch() -> None:
    """torch (seconds to import) loads only when a torch tensor or model is made."""
    code = ("import sys, bbformat, bbformat.cli, bbformat.api, bbformat.summary, bbformat.reader; "
            "assert 'torch' not in sys.modules, 'torch imported'; bbformat.load_file; assert 'torch' in sys.modules; "
            "bbformat.load_model")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_pack_says_when_the_container_is_larger_than_plain(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A tiny model whose tokenizer outweighs what bits-back saves: pack does not call it a saving."""
    src = tmp_path / "src"
    write_checkpoint(make_tiny_checkpoint("llama", seed=1, layers=1), src)
    (src / "tokenizer.json").write_text(json.dumps({"vocab": {os.urandom(12).hex(): i for i in range(40_000)}}))
    assert main(["pack", str(src), str(tmp_path / "m.bb")]) == 0
    err = capsys.readouterr().err
    assert err.count("note:") == 1 and "is not smaller than the plain weights" in err
    assert main(["pack", str(src), str(tmp_path / "m.bb"), "--json", "--quiet", "--force"]) == 0
    assert json.loads(capsys.readouterr().out)["larger_than_plain"] is True
    assert main(["pack", str(src), str(tmp_path / "m.bb"), "--quiet", "--force"]) == 0
    assert "note:" not in capsys.readouterr().err


def test_pack_explains_the_bound_and_inspect_prints_only_the_legend_it_uses(model_dir: Path, tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """pack says what "% of the bits-back bound" means, as inspect does (above 100% with the
    entropy stage); inspect's "P =" legend appears only under a table with a P in it."""
    import copy

    from bbformat.summary import format_summary, inspect

    assert main(["pack", str(model_dir), str(tmp_path / "a.bb"), "--entropy", "auto"]) == 0
    out = capsys.readouterr().out
    assert "of the gross bits-back bound" in out and "the most the rotations alone can save" in out
    assert "the entropy stage saves beyond it" in out
    assert main(["pack", str(model_dir), str(tmp_path / "n.bb"), "--entropy", "none"]) == 0
    out = capsys.readouterr().out
    assert "the most the rotations alone can save" in out and "beyond" not in out
    info = inspect(tmp_path / "n.bb")
    for plainly in (False, True):
        changed = copy.deepcopy(info)
        for b in changed["blocks"]:
            for r in b["rotations"]:
                r["stored_plainly"] = False
        rot = next(r for b in changed["blocks"] for r in b["rotations"])
        rot["stored_plainly"] = plainly
        text = format_summary(changed)
        assert ("P = rotation stored plainly" in text) == plainly
        first = rot["dim"]
        assert any(f" {first}P" in line for line in text.splitlines()) == plainly  # the mark the legend explains

"""Issue 41, part 1: every option's bad values are usage or input errors, never an internal
error (70); stdout on a full disk; `-` for standard input; demo's --quiet and --keep; inspect's
words; the progress bar's rate and ETA; refusals before torch is imported. Writes only under
tmp_path."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import bbformat
from bbformat import cli
from bbformat.checkpoint import write_checkpoint
from bbformat.cli import main
from bbformat.errors import NoSpaceError
from bbformat.testing import make_tiny_checkpoint

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("robust")
    write_checkpoint(make_tiny_checkpoint("llama", seed=3, layers=1, hidden=32, vocab=64), root / "src")
    bbformat.pack(root / "src", root / "m.bb")
    return root / "src", root / "m.bb"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _cli(*args: str, stdin: bytes | None = None, stdout: object = subprocess.PIPE) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "bbformat", *args], input=stdin, stdout=stdout, stderr=subprocess.PIPE,
                          env=_env(), timeout=300)


# The sweep of issue 41 item 2: each (argv, status). SRC/BB/OUT are filled in by the test.
BAD_ARGS = [
    (["demo", "--layers", "-2"], 64),  # was IndexError, 70
    (["demo", "--layers", "0"], 64),
    (["demo", "--layers", "100000000000000000000"], 64),
    (["demo", "--seed", "-1"], 64),  # was ValueError from numpy, 70
    (["demo", "--seed", str(2**70)], 64),
    (["pack", "SRC", "OUT", "--calibration", "SRC/config.json", "--calibration-samples", "0"], 64),
    (["pack", "SRC", "OUT", "--calibration", "SRC/config.json", "--calibration-seqlen", "-5"], 64),
    (["pack", "SRC", "OUT", "--tolerance", "nan"], 2),
    (["pack", "SRC", "OUT", "--tolerance", "-1"], 2),
    (["verify", "BB", "--threads", "0"], 64),
    (["verify", "BB", "--workers", "-3"], 64),
    (["inspect", "BB", "--max-site-dim", "1"], 64),
    (["inspect", "BB", "--max-memory", "1e400"], 64),
    (["inspect", "BB", "--max-memory", "nan"], 64),
    (["unpack", "BB", "OUT", "--format", "hf", "--max-shard-size", "0"], 64),
    (["verify", "BB", "--device", "cuda:-1"], 2),
    (["verify", "BB", "--device", "numpy:nope"], 2),
    (["inspect", "/proc/self/mem"], 2),  # opens, cannot be read: was OSError, 70
    (["verify", "/"], 2),
    (["inspect", ""], 2),
    (["pack", "SRC", "/dev/full"], 2),
    (["unpack", "BB", "/dev/full"], 2),
]


@pytest.mark.parametrize("argv, status", BAD_ARGS, ids=[" ".join(a) for a, _ in BAD_ARGS])
def test_bad_option_values_are_one_line_errors(packed: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               argv: list[str], status: int) -> None:
    src, bb = packed
    if any(a.startswith("/proc/") for a in argv) and not Path("/proc/self/mem").exists():
        pytest.skip("needs Linux's /proc")
    args = [a.replace("SRC", str(src)).replace("BB", str(bb)).replace("OUT", str(tmp_path / "out")) for a in argv]
    try:
        got = main([*args, "--quiet"] if args[0] in ("demo", "pack", "unpack") else args)
    except SystemExit as exc:  # argparse's usage errors
        got = exc.code
    err = capsys.readouterr().err
    assert got == status, (got, err)
    assert err.count("\n") == 1 and "internal error" not in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize("args", [["inspect", "BB"], ["inspect", "--json", "BB"], ["verify", "BB"], ["--version"], ["--help"]])
def test_stdout_on_a_full_disk_is_e_no_space(packed: tuple[Path, Path], args: list[str]) -> None:
    """The issue's `bbformat inspect FILE > /dev/full` (was OSError, 70)."""
    _, bb = packed
    with open("/dev/full", "wb") as full:
        r = _cli(*[str(bb) if a == "BB" else a for a in args], stdout=full)
    err = r.stderr.decode()
    assert r.returncode == 8 and err.count("\n") == 1 and "[E_NO_SPACE]" in err and "standard output" in err, err


def test_inspect_reports_a_corrupt_chunk_on_stderr_too(packed: tuple[Path, Path], tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    _, bb = packed
    data = bytearray(bb.read_bytes())
    with bbformat.Reader(bb) as r:
        e = r.entries[1]
    data[e.offset + e.length // 2] ^= 0x40
    bad = tmp_path / "bad.bb"
    bad.write_bytes(bytes(data))
    assert main(["inspect", str(bad)]) == 5
    out, err = capsys.readouterr()
    assert "MISMATCH" in out and out.splitlines()[0] == f"{bad}: container format 1.5"
    assert err.count("\n") == 1 and "[E_CRC_CHUNK]" in err and "1 of 3 chunks" in err, err


def test_demo_quiet_prints_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--layers", "1", "--quiet"]) == 0
    assert capsys.readouterr() == ("", "")
    assert main(["demo", "--layers", "1"]) == 0
    assert "4. logits before/after" in capsys.readouterr().out


def test_every_option_has_help() -> None:
    parser = cli.build_parser()
    subs = next(a for a in parser._actions if a.dest == "cmd").choices  # noqa: SLF001 (argparse has no public walk)
    for name, sp in subs.items():
        for action in sp._actions:  # noqa: SLF001
            assert action.help, (name, action.dest)


@pytest.mark.parametrize("made", [True, False])
def test_demo_keep_on_a_full_disk_leaves_dir_as_it_was(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch, made: bool) -> None:
    """demo --keep DIR that fails (here: pack meets a full disk) removes what it wrote in DIR,
    and DIR itself if this run created it (was: an empty DIR left behind)."""
    def full(*a: object, **k: object) -> None:
        raise NoSpaceError("cannot write model.bb: No space left on device")

    monkeypatch.setattr(cli, "pack", full)
    keep = tmp_path / "d"
    if not made:
        keep.mkdir()
        (keep / "notes.txt").write_text("mine")
    assert main(["demo", "--keep", str(keep), "--layers", "1", "--quiet"]) == 8
    assert "[E_NO_SPACE]" in capsys.readouterr().err
    if made:
        assert not keep.exists()
    else:
        assert os.listdir(keep) == ["notes.txt"]


def test_demo_keep_needs_its_parent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--keep", str(tmp_path / "a" / "b"), "--quiet"]) == 2
    assert "does not exist" in capsys.readouterr().err and os.listdir(tmp_path) == []


def test_progress_shows_rate_and_eta() -> None:
    assert cli._rate_eta(2, 10, 4.0) == "0.5 blocks/s, ETA 0:16"  # 8 blocks left at 0.5/s
    assert cli._rate_eta(10, 10, 3725.0) == "0.00268 blocks/s, took 1:02:05"
    assert cli._rate_eta(0, 10, 1.0) == "ETA --:--"


def test_refusing_an_existing_output_does_not_import_torch(packed: tuple[Path, Path], tmp_path: Path) -> None:
    """E_EXISTS (and a missing parent) are decided before torch is imported: a fraction of the time."""
    src, _ = packed
    (tmp_path / "m.bb").write_bytes(b"mine")
    code = ("import sys; from bbformat.cli import main; "
            "s = main(sys.argv[1:]); print(s, 'torch' in sys.modules, 'transformers' in sys.modules)")
    for out in (tmp_path / "m.bb", tmp_path / "no" / "m.bb"):
        r = subprocess.run([sys.executable, "-c", code, "pack", str(src), str(out)], capture_output=True, text=True,
                           env=_env(), timeout=120)
        assert r.stdout.split() == ["2", "False", "False"], (r.stdout, r.stderr)
    assert (tmp_path / "m.bb").read_bytes() == b"mine"
    _, bb = packed
    (tmp_path / "u").mkdir()
    (tmp_path / "u" / "keep.txt").write_bytes(b"mine")
    for fmt in ("pt", "safetensors", "hf"):  # unpack into a directory that is not empty, too
        r = subprocess.run([sys.executable, "-c", code, "unpack", str(bb), str(tmp_path / "u"), "--format", fmt],
                           capture_output=True, text=True, env=_env(), timeout=120)
        assert r.stdout.split() == ["2", "False", "False"] and "E_EXISTS" in r.stderr, (r.stdout, r.stderr)
    assert os.listdir(tmp_path / "u") == ["keep.txt"]
    for fmt in ("safetensors", "hf"):  # from a pipe: refused before the pipe is read (and copied aside)
        r = _cli("unpack", "-", str(tmp_path / "u"), "--format", fmt, stdin=b"not a container")
        assert r.returncode == 2 and b"E_EXISTS" in r.stderr, r.stderr
    assert os.listdir(tmp_path / "u") == ["keep.txt"]


def test_dash_reads_standard_input_through_a_pipe(packed: tuple[Path, Path], tmp_path: Path) -> None:
    """`cat m.bb | bbformat inspect -` (was "cannot open -"), and verify and unpack likewise:
    the same results as from the file."""
    _, bb = packed
    data = bb.read_bytes()
    from_file = json.loads(_cli("inspect", "--json", str(bb)).stdout)
    piped = _cli("inspect", "--json", "-", stdin=data)  # subprocess.run's input= is a pipe
    assert piped.returncode == 0, piped.stderr
    got = json.loads(piped.stdout)
    assert got.pop("file") == "-" and from_file.pop("file") == str(bb) and got == from_file
    v = _cli("verify", "--json", "-", stdin=data)
    assert v.returncode == 0 and json.loads(v.stdout)["exact"] is True, v.stderr
    u = _cli("unpack", "-", str(tmp_path / "u"), "--quiet", stdin=data)  # .pt: decoded as it arrives
    assert u.returncode == 0, u.stderr
    bbformat.unpack(bb, tmp_path / "ref")
    got = {p.name: p.read_bytes() for p in (tmp_path / "u").iterdir() if p.suffix != ".pt"}
    assert got == {p.name: p.read_bytes() for p in (tmp_path / "ref").iterdir() if p.suffix != ".pt"} and got
    (pt,) = (tmp_path / "u").glob("*.pt")  # the records in stream order: the same tensors, bit for bit
    a, b = torch.load(pt, weights_only=True), torch.load(tmp_path / "ref" / pt.name, weights_only=True)
    assert list(a) == list(b) and all(torch.equal(a[k].view(torch.uint8), b[k].view(torch.uint8)) for k in a)
    s = _cli("unpack", "-", str(tmp_path / "s"), "--quiet", "--format", "safetensors", stdin=data)  # copied first
    assert s.returncode == 0, s.stderr
    bbformat.unpack(bb, tmp_path / "sref", fmt="safetensors")
    assert {p.name: p.read_bytes() for p in (tmp_path / "s").iterdir()} == \
        {p.name: p.read_bytes() for p in (tmp_path / "sref").iterdir()}
    cut = _cli("verify", "-", stdin=data[:-40])  # a stream that ends early: one line, E_TRUNCATED
    assert cut.returncode == 4 and b"E_TRUNCATED" in cut.stderr and cut.stderr.count(b"\n") == 1, cut.stderr


def test_unpack_from_a_pipe_decodes_before_the_stream_ends(tmp_path: Path) -> None:
    """`curl URL | bbformat unpack - out`: with the container's last bytes (index and footer)
    held back, the first blocks are already decoded into the staging .pt; the rest completes it.
    A stream cut short publishes nothing."""
    import time

    write_checkpoint(make_tiny_checkpoint("llama", seed=4, layers=3, hidden=32, vocab=64), tmp_path / "src")
    bb = bbformat.pack(tmp_path / "src", tmp_path / "m.bb").path
    data = Path(bb).read_bytes()
    for whole in (True, False):
        dst = tmp_path / f"out{whole}"
        p = subprocess.Popen([sys.executable, "-m", "bbformat", "unpack", "-", str(dst), "--quiet"], stdin=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=_env())
        assert p.stdin is not None
        p.stdin.write(data[:-200])
        p.stdin.flush()
        deadline, staged = time.monotonic() + 120, 0
        while time.monotonic() < deadline and not staged:  # records of decoded blocks in the staging archive
            staged = sum(f.stat().st_size for f in tmp_path.glob(f".out{whole}.bbtmp-*/*.pt"))
            time.sleep(0.05)
        assert staged > 0 and p.poll() is None and not dst.exists()
        if whole:
            p.stdin.write(data[-200:])
        p.stdin.close()
        err = p.stderr.read() if p.stderr else b""
        assert p.wait(timeout=120) == (0 if whole else 4), err
        if whole:
            sd = torch.load(next(dst.glob("*.pt")), weights_only=True)
            ref = torch.load(next(bbformat.unpack(bb, tmp_path / "ref").glob("*.pt")), weights_only=True)
            assert list(sd) == list(ref) and all(torch.equal(sd[k], ref[k]) for k in sd)
        else:
            assert b"E_TRUNCATED" in err and err.count(b"\n") == 1 and not dst.exists()
            assert not list(tmp_path.glob(f".out{whole}.bbtmp-*"))


def test_hf_directory_tokenizer_loads_without_running_or_asking_for_code(tmp_path: Path) -> None:
    """README's tokenizer line on an `unpack --format hf` directory: no "[y/N]" prompt, no
    code of the directory run, the checkpoint's own tokenizer (issue 41 item 7). Without
    trust_remote_code=False, transformers 5 reads config.json's auto_map first and asks."""
    pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")

    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({"[UNK]": 0, "hello": 1, "world": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    ckpt = make_tiny_checkpoint("llama", seed=3, layers=1, hidden=32, vocab=64)
    extra = {"tokenizer.json": tok.to_str().encode(),
             "tokenizer_config.json": json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]"}).encode()}
    ckpt = type(ckpt)(ckpt.stem, ckpt.state_dict, ckpt.slicing_config, ckpt.hf_config, {**ckpt.extra_files, **extra})
    write_checkpoint(ckpt, tmp_path / "src")
    bbformat.pack(tmp_path / "src", tmp_path / "m.bb")
    bbformat.unpack(tmp_path / "m.bb", tmp_path / "hf", fmt="hf")
    # in a fresh process, as a user's: this one may have registered the model type already (load_model)
    probe = ("import builtins, json, sys, transformers as T\n"
             "asked = []\n"
             "builtins.input = lambda prompt='': asked.append(prompt) or 'n'\n"
             "t = T.AutoTokenizer.from_pretrained(sys.argv[1], trust_remote_code=False)\n"
             "ran = [m for m in sys.modules if 'bbformat_sliced' in m]\n"
             "first = len(asked)\n"
             "T.AutoTokenizer.from_pretrained(sys.argv[1])\n"
             "print(json.dumps([first, t('hello world')['input_ids'], ran, len(asked) > first]))\n")
    r = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "hf")], capture_output=True, text=True, timeout=300,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    asked, ids, ran, asked_without = json.loads(r.stdout.strip().splitlines()[-1])
    assert asked == 0 and ids == [1, 2] and ran == []
    assert asked_without, "transformers no longer asks without the argument: README's tokenizer line can drop it"

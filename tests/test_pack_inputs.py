"""Untrusted inputs to pack (issue #5): a malicious pickle is refused without running anything;
NaN/Inf, wrong shapes, missing/extra keys, wrong dtypes and configs that contradict the tensors
get one clear error naming the tensor (or config field), and nothing appears at OUT.

Every test writes only inside tmp_path. Tests of refusals pack into an empty directory and
check it is still empty afterwards (no .bb, no temp file)."""
from __future__ import annotations

import builtins
import json
import os
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

import bbformat
from bbformat.adapters import plan
from bbformat.checkpoint import Checkpoint, read_checkpoint, write_checkpoint
from bbformat.container import framing
from bbformat.errors import BBFormatError, InputError, UnsupportedModelError
from bbformat.testing import make_tiny_checkpoint

REPO = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------- helpers


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    env.pop("TORCH_FORCE_WEIGHTS_ONLY_LOAD", None)
    env["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = "1"  # must not weaken our explicit weights_only=True
    return subprocess.run([sys.executable, "-m", "bbformat", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


def _one_line_error(r: subprocess.CompletedProcess, status: int, code: str, *fragments: str) -> str:
    assert r.returncode == status, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(f"bbformat: error [{code}]: "), r.stderr
    assert "Traceback" not in r.stderr and "Warning" not in r.stderr
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    return lines[0]


def _model(tmp_path: Path, arch: str = "llama", name: str = "src", **kw: Any) -> tuple[Path, Checkpoint]:
    kw.setdefault("seed", 3)
    kw.setdefault("layers", 2)
    kw.setdefault("hidden", 32)
    ckpt = make_tiny_checkpoint(arch, **kw)
    write_checkpoint(ckpt, tmp_path / name)
    return tmp_path / name, ckpt


def _variant(tmp_path: Path, ckpt: Checkpoint, name: str = "bad", *, sd: Callable[[dict], None] | None = None,
             hf: Callable[[dict], None] | None = None, sc: Callable[[dict], None] | None = None) -> Path:
    """A copy of `ckpt` on disk with the state dict / config.json / <stem>.json edited."""
    state = dict(ckpt.state_dict)
    hfc, scc = json.loads(json.dumps(ckpt.hf_config)), json.loads(json.dumps(ckpt.slicing_config))
    if sd:
        sd(state)
    if hf:
        hf(hfc)
    if sc:
        sc(scc)
    files = dict(ckpt.extra_files, **{"config.json": json.dumps(hfc).encode(), f"{ckpt.stem}.json": json.dumps(scc).encode()})
    write_checkpoint(Checkpoint(ckpt.stem, state, scc, hfc, files), tmp_path / name)
    return tmp_path / name


def _refused(tmp_path: Path, src: Path, cls: type[BBFormatError], code: str, *fragments: str) -> BBFormatError:
    """pack(src) raises `cls` with `code` and every fragment in its one-line message; OUT's
    directory stays empty."""
    out_dir = tmp_path / "out"
    out_dir.mkdir(exist_ok=True)
    with pytest.raises(cls) as info:
        bbformat.pack(src, out_dir / "m.bb")
    exc = info.value
    assert exc.code == code, (exc.code, str(exc))
    msg = str(exc)
    assert "\n" not in msg
    for f in fragments:
        assert f in msg, (f, msg)
    assert list(out_dir.iterdir()) == [], "a refused pack left something at OUT"
    return exc


class _Payload:
    """Pickles as a call of `fn(*args)`: what a malicious checkpoint runs on unpickling."""

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self) -> tuple:
        return (self.fn, self.args)


def _payloads(marker: Path) -> dict[str, _Payload]:
    return {
        "os.system": _Payload(os.system, f"touch '{marker}'"),
        "Path.touch": _Payload(Path.touch, marker),
        "exec": _Payload(builtins.exec, f"import pathlib; pathlib.Path({str(marker)!r}).touch()"),
    }


# what torch's weights_only unpickler names (torch.save pickles with protocol 2: Path.touch goes through getattr)
GLOBALS = {"os.system": os.system.__module__ + ".system", "Path.touch": "getattr", "exec": "exec"}


def _plausible(ckpt: Checkpoint, payload: _Payload) -> dict:
    """The model's real state dict with the payload tucked inside one more (plausible) entry."""
    sd = dict(ckpt.state_dict)
    sd["model.layers.0.self_attn.rotary_emb.inv_freq"] = {"buffers": [torch.ones(4), payload]}
    return sd


# ---------------------------------------------------------------- malicious pickles


@pytest.mark.parametrize("kind", ["os.system", "Path.touch", "exec"])
def test_malicious_pickle_in_a_torch_zip_is_refused_unexecuted(tmp_path: Path, kind: str) -> None:
    src, ckpt = _model(tmp_path)
    pt = src / f"{ckpt.stem}.pt"
    # the payload is live: unpickled the unsafe way it does create its marker
    control = tmp_path / "control.pt"
    torch.save(_plausible(ckpt, _payloads(tmp_path / "CONTROL")[kind]), control)
    torch.load(control, weights_only=False)
    assert (tmp_path / "CONTROL").exists()

    marker = tmp_path / "MARKER"
    torch.save(_plausible(ckpt, _payloads(marker)[kind]), pt)
    exc = _refused(tmp_path, src, InputError, "E_INPUT", pt.name, f"its pickle asks for {GLOBALS[kind]}", "nothing was executed")
    assert "weights_only=False" not in str(exc)  # torch's advice to retry unsafely is not passed on
    assert not marker.exists()
    # the weights file named directly is refused the same way
    with pytest.raises(InputError, match="nothing was executed"):
        bbformat.pack(pt, tmp_path / "out" / "m.bb")
    assert not marker.exists() and not (tmp_path / "out" / "m.bb").exists()


def test_malicious_pickle_cli(tmp_path: Path) -> None:
    src, ckpt = _model(tmp_path)
    torch.save(_plausible(ckpt, _Payload(os.system, "touch MARKER")), src / f"{ckpt.stem}.pt")  # relative to cwd
    r = _cli("pack", str(src), str(tmp_path / "m.bb"), "--quiet", cwd=tmp_path)
    _one_line_error(r, 2, "E_INPUT", f"asks for {GLOBALS['os.system']}", "nothing was executed")
    assert not (tmp_path / "MARKER").exists() and not (src / "MARKER").exists()
    assert not (tmp_path / "m.bb").exists()


@pytest.mark.parametrize("form", ["plain-pickle", "legacy-torch", "legacy-torch-clean"])
def test_non_zip_pt_files_are_refused_unread(tmp_path: Path, form: str) -> None:
    src, ckpt = _model(tmp_path)
    pt = src / f"{ckpt.stem}.pt"
    marker = tmp_path / "MARKER"
    if form == "plain-pickle":
        pt.write_bytes(pickle.dumps(_plausible(ckpt, _Payload(Path.touch, marker))))
        with open(pt, "rb") as f:  # proof the bytes are live: plain pickle.load runs the payload
            pickle.load(f)
        assert marker.exists()
        marker.unlink()
    elif form == "legacy-torch":
        torch.save(_plausible(ckpt, _Payload(Path.touch, marker)), pt, _use_new_zipfile_serialization=False)
    else:  # a harmless legacy file: still not read (TransformerCompression never writes them)
        torch.save(dict(ckpt.state_dict), pt, _use_new_zipfile_serialization=False)
    _refused(tmp_path, src, InputError, "E_INPUT", pt.name, "not a torch zip archive")
    assert not marker.exists()
    if form == "plain-pickle":
        r = _cli("pack", str(src), str(tmp_path / "m.bb"), cwd=tmp_path)
        _one_line_error(r, 2, "E_INPUT", "not a torch zip archive")
        assert not marker.exists() and not (tmp_path / "m.bb").exists()


def test_other_weight_file_names_are_never_unpickled(tmp_path: Path) -> None:
    src, ckpt = _model(tmp_path)
    marker = tmp_path / "MARKER"
    evil = _plausible(ckpt, _Payload(Path.touch, marker))
    (src / f"{ckpt.stem}.pt").unlink()
    torch.save(evil, src / "pytorch_model.bin")  # HF's legacy name: not ours to read
    _refused(tmp_path, src, InputError, "E_INPUT", "holds no <stem>.pt or <stem>.safetensors")
    _refused(tmp_path, src / "pytorch_model.bin", InputError, "E_INPUT", "not a .pt or .safetensors file")
    (src / "pytorch_model.bin").rename(src / f"{ckpt.stem}.safetensors")  # a pickle in disguise
    _refused(tmp_path, src, InputError, "E_INPUT", "as safetensors")
    assert not marker.exists()


def test_safetensors_is_preferred_over_a_pt_of_the_same_stem(tmp_path: Path) -> None:
    src, ckpt = _model(tmp_path)
    write_checkpoint(ckpt, src, fmt="safetensors", overwrite=True)  # beside the .pt _model wrote
    marker = tmp_path / "MARKER"
    torch.save(_plausible(ckpt, _Payload(Path.touch, marker)), src / f"{ckpt.stem}.pt")
    bbformat.pack(src, tmp_path / "m.bb", verify=True)
    assert not marker.exists()
    with bbformat.open_container(tmp_path / "m.bb") as r:
        assert r.metadata["keys"] == list(read_checkpoint(src / f"{ckpt.stem}.safetensors").state_dict)  # safetensors order
    (src / f"{ckpt.stem}.safetensors").unlink()  # without it the .pt is what pack reads, and refuses
    _refused(tmp_path, src, InputError, "E_INPUT", "nothing was executed")
    assert not marker.exists()


def test_compressed_zip_members_are_refused(tmp_path: Path) -> None:
    """torch.save never compresses; a deflated member is what a decompression bomb needs."""
    src, ckpt = _model(tmp_path)
    pt = src / f"{ckpt.stem}.pt"
    with zipfile.ZipFile(pt) as z:
        members = [(i, z.read(i.filename)) for i in z.infolist()]
    pt.unlink()
    with zipfile.ZipFile(pt, "w") as z:
        for info, data in members:
            z.writestr(info.filename, data, compress_type=zipfile.ZIP_DEFLATED)
    _refused(tmp_path, src, InputError, "E_INPUT", "is compressed")


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_torchscript_archive_is_refused(tmp_path: Path) -> None:
    src, ckpt = _model(tmp_path)
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), str(src / f"{ckpt.stem}.pt"))
    _refused(tmp_path, src, InputError, "E_INPUT", f"{ckpt.stem}.pt is a TorchScript archive")


def test_a_pickle_that_is_not_a_state_dict_is_refused(tmp_path: Path) -> None:
    src, ckpt = _model(tmp_path)
    torch.save([torch.zeros(2)], src / f"{ckpt.stem}.pt")
    _refused(tmp_path, src, InputError, "E_INPUT", "holds a list, not a state dict")
    torch.save({("tuple", "key"): torch.zeros(2)}, src / f"{ckpt.stem}.pt")
    _refused(tmp_path, src, InputError, "E_INPUT", "is not a string")


# ---------------------------------------------------------------- JSON side files


BAD_JSON = {
    "deep": b"[" * 200_000,
    "long-int": b'{"vocab_size": ' + b"7" * 5000 + b"}",
    "malformed": b'{"model_type": "llama",',
    "not-an-object": b'["llama"]',
    "not-utf8": b'{"model_type": "\xff"}',
    "code": b"{\"model_type\": __import__('os').system('touch MARKER')}",
}


@pytest.mark.parametrize("which", ["config.json", "stem"])
@pytest.mark.parametrize("case", sorted(BAD_JSON))
def test_bad_json_is_a_clean_error(tmp_path: Path, which: str, case: str) -> None:
    src, ckpt = _model(tmp_path)
    name = "config.json" if which == "config.json" else f"{ckpt.stem}.json"
    (src / name).write_bytes(BAD_JSON[case])
    _refused(tmp_path, src, InputError, "E_INPUT", name)
    assert not (tmp_path / "MARKER").exists() and not (src / "MARKER").exists()


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json"])
def test_huge_json_is_refused_before_it_is_read(tmp_path: Path, name: str) -> None:
    src, _ = _model(tmp_path)
    with open(src / name, "wb") as f:  # sparse: 47 MiB on paper, nothing on disk
        f.truncate(47 << 20)
    _refused(tmp_path, src, InputError, "E_INPUT", "side files", name)


def test_metadata_over_the_reader_limit_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src, _ = _model(tmp_path)
    (src / "tokenizer.json").write_bytes(b'{"x": "' + b"a" * 5000 + b'"}')
    monkeypatch.setattr(framing, "MAX_METADATA", 4000)  # the Writer's header check, before any file or encoding
    _refused(tmp_path, src, InputError, "E_INPUT", "metadata", "4,000")


@pytest.mark.parametrize(("field", "value"), [("hidden_size", "32"), ("hidden_size", 32.5), ("num_hidden_layers", True),
                                              ("vocab_size", -5), ("vocab_size", None), ("intermediate_size", float("inf")),
                                              ("num_attention_heads", float("nan"))])
def test_config_fields_must_be_positive_integers(tmp_path: Path, field: str, value: object) -> None:
    _, ckpt = _model(tmp_path)
    src = _variant(tmp_path, ckpt, hf=lambda h: h.__setitem__(field, value))
    _refused(tmp_path, src, UnsupportedModelError, "E_UNSUPPORTED_MODEL", "config.json", field)


def test_slicing_config_flags_must_be_booleans(tmp_path: Path) -> None:
    _, ckpt = _model(tmp_path)
    src = _variant(tmp_path, ckpt, sc=lambda c: c.__setitem__("do_slice_head", "false"))
    _refused(tmp_path, src, UnsupportedModelError, "E_UNSUPPORTED_MODEL", "SlicingConfig", "do_slice_head")
    src = _variant(tmp_path, ckpt, "bad2", hf=lambda h: h.__setitem__("tie_word_embeddings", "no"))
    _refused(tmp_path, src, UnsupportedModelError, "E_UNSUPPORTED_MODEL", "tie_word_embeddings")


# ---------------------------------------------------------------- NaN / Inf


def _poison(t: torch.Tensor, nan: int, inf: int) -> torch.Tensor:
    t = t.clone()
    flat = t.view(-1)
    for j in range(nan):
        flat[(j * 7) % flat.numel()] = float("nan")
    for j in range(inf):
        flat[-1 - j * 5] = float("inf") if j % 2 == 0 else float("-inf")
    return t


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("key", ["model.layers.1.self_attn.q_proj.weight", "model.layers.0.attn_shortcut_Q",
                                 "model.layers.1.mlp_shortcut_Q", "model.embed_tokens.weight", "lm_head.weight"])
def test_nonfinite_values_are_refused_naming_the_tensor(tmp_path: Path, key: str, dtype: str) -> None:
    _, ckpt = _model(tmp_path, dtype=dtype)
    src = _variant(tmp_path, ckpt, sd=lambda s: s.__setitem__(key, _poison(s[key], nan=2, inf=3)))
    exc = _refused(tmp_path, src, InputError, "E_INPUT", key, "5 non-finite", "2 NaN", "3 ±Inf",
                   f"of {ckpt.state_dict[key].numel():,}")
    assert exc.exit_status == 2


def test_nonfinite_values_are_refused_where_no_rotation_touches_them(tmp_path: Path) -> None:
    """Refused everywhere, not only in rotated tensors: lm_head.bias and q_proj.bias of OPT are
    stored as-is by both schemes, and still a model holding NaN there is broken."""
    _, ckpt = _model(tmp_path, arch="opt")
    for key in ("lm_head.bias", "model.decoder.layers.0.self_attn.q_proj.bias", "model.decoder.embed_positions.weight"):
        src = _variant(tmp_path, ckpt, key, sd=lambda s: s.__setitem__(key, _poison(s[key], nan=1, inf=0)))
        _refused(tmp_path, src, InputError, "E_INPUT", key, "1 non-finite")


def test_every_nonfinite_tensor_is_counted(tmp_path: Path) -> None:
    _, ckpt = _model(tmp_path)
    keys = ["model.layers.0.mlp.down_proj.weight", "model.layers.1.mlp.up_proj.weight", "lm_head.weight"]

    def edit(s: dict) -> None:
        for k in keys:
            s[k] = _poison(s[k], nan=0, inf=1)

    src = _variant(tmp_path, ckpt, sd=edit)
    exc = _refused(tmp_path, src, InputError, "E_INPUT", keys[0], "2 more tensor(s)")
    assert all(k in str(exc) for k in keys)


def test_nan_outside_a_sliced_view_is_not_refused(tmp_path: Path) -> None:
    """TransformerCompression saves sliced views of unsliced storages: only the tensor's own
    elements count. The same NaN inside the view is refused."""
    _, ckpt = _model(tmp_path)
    key = "model.layers.0.self_attn.q_proj.weight"
    w = ckpt.state_dict[key]

    def view(inside: bool) -> Callable[[dict], None]:
        def edit(s: dict) -> None:
            full = torch.full((w.shape[0], w.shape[1] + 8), float("nan"), dtype=w.dtype)
            full[:, : w.shape[1]] = w
            if inside:
                full[3, 1] = float("nan")
            s[key] = full[:, : w.shape[1]]
        return edit

    src = _variant(tmp_path, ckpt, "view", sd=view(False))
    bbformat.pack(src, tmp_path / "ok.bb", verify=True)
    src = _variant(tmp_path, ckpt, "view-nan", sd=view(True))
    _refused(tmp_path, src, InputError, "E_INPUT", key, "1 non-finite")


def test_nonfinite_cli(tmp_path: Path) -> None:
    _, ckpt = _model(tmp_path)
    key = "model.layers.0.attn_shortcut_Q"
    src = _variant(tmp_path, ckpt, sd=lambda s: s.__setitem__(key, _poison(s[key], nan=1, inf=1)))
    r = _cli("pack", str(src), str(tmp_path / "m.bb"), "--verify", cwd=tmp_path)
    _one_line_error(r, 2, "E_INPUT", key, "2 non-finite")
    assert not (tmp_path / "m.bb").exists()


# ---------------------------------------------------------------- shapes, keys, dtypes


def _shape_cases() -> list[tuple[str, str, Callable[[torch.Tensor], torch.Tensor]]]:
    return [
        ("llama", "model.layers.0.self_attn.q_proj.weight", lambda t: t[:, :-1].clone()),  # wrong in-dim
        ("llama", "model.layers.1.self_attn.k_proj.weight", lambda t: t[:-2].clone()),  # wrong out-dim
        ("llama", "model.layers.0.attn_shortcut_Q", lambda t: t.T.clone()),  # transposed: not (d_in, d_attn)
        ("llama", "model.layers.1.mlp_shortcut_Q", lambda t: torch.eye(t.shape[0] + 1, dtype=t.dtype)),  # square, wrong size
        ("llama", "model.embed_tokens.weight", lambda t: torch.zeros(t.shape[0], t.shape[1] + 8, dtype=t.dtype)),
        ("llama", "lm_head.weight", lambda t: t[:-1].clone()),  # vocab
        ("llama", "model.layers.0.mlp.down_proj.weight", lambda t: t[0].clone()),  # 1-D where 2-D
        ("llama", "model.layers.0.mlp.gate_proj.weight", lambda t: t[None].clone()),  # 3-D
        ("llama", "model.layers.0.attn_shortcut_Q", lambda t: t[0, 0].clone()),  # 0-D
        ("opt", "model.decoder.layers.0.fc1.bias", lambda t: t[:, None].clone()),  # 2-D where 1-D
        ("opt", "model.decoder.embed_positions.weight", lambda t: t[:-1].clone()),
        ("opt", "model.decoder.layers.1.self_attn.out_proj.bias", lambda t: t[:-1].clone()),
    ]


@pytest.mark.parametrize(("arch", "key", "change"), _shape_cases(), ids=[f"{a}-{k.split('.', 2)[-1]}-{i}" for i, (a, k, _) in enumerate(_shape_cases())])
def test_wrong_shapes_name_the_tensor_and_both_shapes(tmp_path: Path, arch: str, key: str, change: Callable) -> None:
    _, ckpt = _model(tmp_path, arch=arch)
    want = tuple(ckpt.state_dict[key].shape)
    got = tuple(change(ckpt.state_dict[key]).shape)
    assert got != want
    src = _variant(tmp_path, ckpt, sd=lambda s: s.__setitem__(key, change(s[key])))
    _refused(tmp_path, src, UnsupportedModelError, "E_UNSUPPORTED_MODEL", key, f"has shape {got}", f"the config implies {want}")


@pytest.mark.parametrize(("arch", "key"), [("llama", "model.layers.1.attn_shortcut_Q"), ("llama", "model.embed_tokens.weight"),
                                           ("llama", "model.layers.0.mlp.gate_proj.weight"),
                                           ("opt", "model.decoder.embed_positions.weight"), ("opt", "model.decoder.layers.1.fc2.weight")])
def test_missing_keys_are_named(tmp_path: Path, arch: str, key: str) -> None:
    _, ckpt = _model(tmp_path, arch=arch)
    src = _variant(tmp_path, ckpt, sd=lambda s: s.pop(key))
    _refused(tmp_path, src, UnsupportedModelError, "E_UNSUPPORTED_MODEL", f"state dict lacks {key}")


@pytest.mark.parametrize("key", ["transformer.wte.weight", "model.layers.0.self_attn.rope_scale", "model.layers.1.mlp.extra_proj.weight",
                                 "model.norm.bias"])
def test_unexpected_keys_are_named(tmp_path: Path, key: str) -> None:
    _, ckpt = _model(tmp_path)
    src = _variant(tmp_path, ckpt, sd=lambda s: s.__setitem__(key, torch.zeros(4, dtype=torch.float16)))
    _refused(tmp_path, src, UnsupportedModelError, "E_UNSUPPORTED_MODEL", f"unexpected tensor {key!r}")


def test_tensors_of_a_layer_the_config_does_not_have(tmp_path: Path) -> None:
    _, ckpt = _model(tmp_path)
    key = "model.layers.2.mlp.up_proj.weight"
    src = _variant(tmp_path, ckpt, sd=lambda s: s.__setitem__(key, s["model.layers.1.mlp.up_proj.weight"].clone()))
    _refused(tmp_path, src, UnsupportedModelError, "E_UNSUPPORTED_MODEL", "num_hidden_layers is 2", "layers 0..2", key)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int8, torch.uint8, torch.bool, torch.float64, torch.complex64])
def test_wrong_dtypes_are_named(tmp_path: Path, dtype: torch.dtype) -> None:
    _, ckpt = _model(tmp_path)
    key = "model.layers.1.self_attn.v_proj.weight"
    src = _variant(tmp_path, ckpt, sd=lambda s: s.__setitem__(key, s[key].to(dtype)))
    _refused(tmp_path, src, UnsupportedModelError, "E_UNSUPPORTED_MODEL", key, f"dtype {dtype}")


def test_sparse_tensors_are_refused() -> None:
    ckpt = make_tiny_checkpoint("llama", seed=3, layers=1, hidden=32)
    key = "model.layers.0.mlp.down_proj.weight"
    sd = dict(ckpt.state_dict)
    sd[key] = sd[key].to_sparse()
    with pytest.raises(UnsupportedModelError, match=rf"{key.replace('.', '[.]')} is a torch.sparse_coo tensor"):
        plan(Checkpoint(ckpt.stem, sd, ckpt.slicing_config, ckpt.hf_config, ckpt.extra_files), "symmetric")


def test_mixed_float_dtypes_are_supported(tmp_path: Path) -> None:
    """Not refused: every tensor keeps its own element type, rotations included."""
    _, ckpt = _model(tmp_path)
    want = {"model.layers.0.mlp.down_proj.weight": torch.float32, "model.layers.0.attn_shortcut_Q": torch.bfloat16,
            "model.layers.1.mlp_shortcut_Q": torch.float32, "lm_head.weight": torch.bfloat16}
    src = _variant(tmp_path, ckpt, sd=lambda s: s.update({k: s[k].to(d) for k, d in want.items()}))
    for scheme in ("symmetric", "paper"):
        bbformat.pack(src, tmp_path / f"{scheme}.bb", scheme=scheme, verify=True)
        got = bbformat.read_tensors(tmp_path / f"{scheme}.bb")
        assert all(got[k].dtype == want.get(k, torch.float16) for k in ckpt.state_dict)


# ---------------------------------------------------------------- configs that contradict the tensors


def _dims_minus_8(c: dict) -> None:
    c["attention_output_dimensions"]["0"] -= 8
    c["mlp_input_dimensions"]["0"] -= 8


CONTRADICTIONS: list[tuple[str, str, dict, tuple[str, ...]]] = [
    # (arch, config.json changes / SlicingConfig edit name, ..., fragments of the message)
    ("llama", "hidden_size", {"hidden_size": 48}, ("SlicingConfig hidden_size 32", "config.json's 48")),
    ("llama", "layers+1", {"num_hidden_layers": 3}, ("num_hidden_layers is 3", "layers 0..1")),
    ("llama", "layers-1", {"num_hidden_layers": 1}, ("num_hidden_layers is 1", "layers 0..1", "model.layers.1.")),
    ("llama", "vocab", {"vocab_size": 100}, ("model.embed_tokens.weight", "the config implies (100,")),
    ("llama", "kv_heads", {"num_key_value_heads": 4}, ("model.layers.0.self_attn.k_proj.weight", "the config implies (32,")),
    ("llama", "intermediate", {"intermediate_size": 48}, ("model.layers.0.mlp.", "the config implies (48,")),
    ("opt", "ffn", {"ffn_dim": 40}, ("model.decoder.layers.0.fc1.weight", "the config implies (40,")),
    ("opt", "positions", {"max_position_embeddings": 16}, ("model.decoder.embed_positions.weight", "the config implies (18,")),
]


@pytest.mark.parametrize(("arch", "what", "hf", "fragments"), CONTRADICTIONS, ids=[c[1] for c in CONTRADICTIONS])
def test_config_json_contradicting_the_tensors(tmp_path: Path, arch: str, what: str, hf: dict, fragments: tuple[str, ...]) -> None:
    _, ckpt = _model(tmp_path, arch=arch)
    src = _variant(tmp_path, ckpt, hf=lambda h: h.update(hf))
    _refused(tmp_path, src, UnsupportedModelError, "E_UNSUPPORTED_MODEL", *fragments)


def test_slicing_config_contradicting_the_tensors(tmp_path: Path) -> None:
    _, ckpt = _model(tmp_path)
    d_attn = ckpt.slicing_config["attention_output_dimensions"]["0"]
    src = _variant(tmp_path, ckpt, sc=_dims_minus_8)  # chains, but the tensors are d_attn wide
    _refused(tmp_path, src, UnsupportedModelError, "E_UNSUPPORTED_MODEL", "model.layers.0.self_attn.o_proj.weight",
             f"has shape ({d_attn}, 32)", f"the config implies ({d_attn - 8}, 32)")
    src = _variant(tmp_path, ckpt, "bad2", sc=lambda c: c.update(do_slice_head=True, head_dimension=24, mlp_output_dimensions={**c["mlp_output_dimensions"], "1": 24}))
    _refused(tmp_path, src, UnsupportedModelError, "E_UNSUPPORTED_MODEL", "shape", "the config implies")
    src = _variant(tmp_path, ckpt, "bad3", sc=lambda c: c.update(layers_num=3))
    _refused(tmp_path, src, UnsupportedModelError, "E_UNSUPPORTED_MODEL", "SlicingConfig has 3 layers")


def test_absurd_layer_count_is_refused_before_anything_is_sized(tmp_path: Path) -> None:
    _, ckpt = _model(tmp_path, dims=24)
    const = {"layers_num": None, "embedding_dimensions": {}, "attention_input_dimensions": {}, "attention_output_dimensions": {},
             "mlp_input_dimensions": {}, "mlp_output_dimensions": {}, "head_dimension": None, "const_dimension": 24}
    src = _variant(tmp_path, ckpt, hf=lambda h: h.__setitem__("num_hidden_layers", 3_000_000), sc=lambda c: c.update(const))
    _refused(tmp_path, src, UnsupportedModelError, "E_UNSUPPORTED_MODEL", "num_hidden_layers is 3000000", "layers 0..1")


def test_tied_embeddings_flag(tmp_path: Path) -> None:
    _, ckpt = _model(tmp_path)
    # config.json copied from a tied source model (SmolLM2): TC unties the head, so this is normal
    src = _variant(tmp_path, ckpt, "tied-true", hf=lambda h: h.__setitem__("tie_word_embeddings", True))
    bbformat.pack(src, tmp_path / "ok.bb")
    src = _variant(tmp_path, ckpt, "tied-false-no-head", sd=lambda s: s.pop("lm_head.weight"))
    _refused(tmp_path, src, UnsupportedModelError, "E_UNSUPPORTED_MODEL", "lm_head.weight is missing", "tie_word_embeddings=false")
    src = _variant(tmp_path, ckpt, "tied-true-no-head", sd=lambda s: s.pop("lm_head.weight"),
                   hf=lambda h: h.__setitem__("tie_word_embeddings", True))
    _refused(tmp_path, src, UnsupportedModelError, "E_UNSUPPORTED_MODEL", "lm_head.weight is missing", "tied")


def test_shape_error_cli(tmp_path: Path) -> None:
    _, ckpt = _model(tmp_path)
    src = _variant(tmp_path, ckpt, hf=lambda h: h.__setitem__("vocab_size", 100))
    r = _cli("pack", str(src), str(tmp_path / "m.bb"), cwd=tmp_path)
    _one_line_error(r, 3, "E_UNSUPPORTED_MODEL", "model.embed_tokens.weight", "has shape (128,", "implies (100,")
    assert not (tmp_path / "m.bb").exists()


# ---------------------------------------------------------------- the output path


def test_output_must_not_replace_an_input_file(tmp_path: Path) -> None:
    src, ckpt = _model(tmp_path)
    before = {p.name: p.read_bytes() for p in src.iterdir()}
    for out in (src / f"{ckpt.stem}.pt", src / "config.json", src / f"{ckpt.stem}.json"):
        with pytest.raises(InputError, match="would replace the input file"):
            bbformat.pack(src, out)
    with pytest.raises(InputError, match="is a directory"):
        bbformat.pack(src, src)
    with pytest.raises(InputError, match="does not exist"):
        bbformat.pack(src, tmp_path / "no" / "m.bb")
    assert {p.name: p.read_bytes() for p in src.iterdir()} == before
    bbformat.pack(src, src / "m.bb")  # next to the inputs is fine

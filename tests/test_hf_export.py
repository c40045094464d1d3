"""unpack --format hf: a directory transformers' from_pretrained(trust_remote_code=True) loads
with no bbformat importable, for every architecture; its logits against load_model and the
independent float64 forward (bbformat.testing), generate(), save_pretrained, shards; and
pack from such a directory back to the same tensors."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

import bbformat  # noqa: E402
from bbformat import hfdir  # noqa: E402
from bbformat.api import pack, unpack  # noqa: E402
from bbformat.checkpoint import read_checkpoint, write_checkpoint  # noqa: E402
from bbformat.errors import OutputExistsError  # noqa: E402
from bbformat.testing import make_tiny_checkpoint, reference_logits  # noqa: E402

IDS = [[3, 17, 42, 5, 9, 77, 11, 2], [8, 1, 64, 23, 5, 90, 31, 7]]
NEW_TOKENS = 6
# name -> (arch, make_tiny_checkpoint arguments, config.json changes)
MODELS = {
    "llama2": ("llama", {"kv_heads": 4}, {}),
    "llama3": ("llama", {"kv_heads": 2}, {"rope_theta": 500000.0, "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16}}),
    "opt": ("opt", {}, {}),
    "phi2": ("phi2", {}, {}),
    "phi3": ("phi3", {"kv_heads": 2}, {"sliding_window": 5}),  # a window shorter than the inputs
}

# runs in a fresh interpreter where `import bbformat` fails: what a user without bbformat has
HF_SIDE = textwrap.dedent("""
    import json, sys
    sys.modules["bbformat"] = None  # any import of bbformat now raises ImportError
    import numpy as np, torch, transformers
    from transformers import AutoModelForCausalLM
    jobs = json.loads(sys.argv[1])
    # the dtype argument: `dtype` from transformers 4.56 (5.x warns on the old name), `torch_dtype` before
    new = tuple(int(x) for x in transformers.__version__.split(".")[:2]) >= (4, 56)
    f32 = {"dtype" if new else "torch_dtype": torch.float32}
    for job in jobs:
        model, info = AutoModelForCausalLM.from_pretrained(job["dir"], trust_remote_code=True, output_loading_info=True, **f32)
        assert not any(info.values()), info
        ids = torch.tensor(job["ids"])
        mask = torch.ones_like(ids)
        with torch.no_grad():
            out = {"logits": model(ids).logits.numpy(),
                   "generated": model.generate(ids, attention_mask=mask, max_new_tokens=job["new"], do_sample=False).numpy()}
        if job.get("save"):
            model.save_pretrained(job["save"])
            again = AutoModelForCausalLM.from_pretrained(job["save"], trust_remote_code=True, **f32)
            with torch.no_grad():
                out["saved_logits"] = again(ids).logits.numpy()
        np.savez(job["out"], **out)
        assert "bbformat" not in {m.split(".")[0] for m, v in sys.modules.items() if v is not None}
""")


def _tiny(name: str, dtype: str = "float32"):
    arch, kw, changes = MODELS[name]
    ck = make_tiny_checkpoint(arch, seed=7, layers=3, dtype=dtype, max_positions=32, **kw)
    if changes:
        ck.hf_config.update(changes)
        ck.extra_files["config.json"] = json.dumps(ck.hf_config).encode()
    return ck


def _run_hf_side(jobs: list[dict], python: str = sys.executable) -> None:
    r = subprocess.run([python, "-c", HF_SIDE, json.dumps(jobs)], capture_output=True, text=True, timeout=600,
                       cwd=jobs[0]["out"].rsplit("/", 1)[0])
    assert r.returncode == 0, r.stderr[-4000:]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Every model packed (symmetric, exact), unpacked to hf, and run through from_pretrained
    in one bbformat-free process: name -> (checkpoint, container, hf dir, results)."""
    root = tmp_path_factory.mktemp("hf")
    made, jobs = {}, []
    for name in MODELS:
        ck = _tiny(name)
        write_checkpoint(ck, root / name / "ckpt")
        pack(root / name / "ckpt", root / name / "m.bb")
        hf = unpack(root / name / "m.bb", root / name / "hf", fmt="hf")
        made[name] = (ck, root / name / "m.bb", hf)
        jobs.append({"dir": str(hf), "ids": IDS, "new": NEW_TOKENS, "out": str(root / name / "hf_out.npz"),
                     "save": str(root / name / "saved")})
    # a sharded directory of the Llama-3-like model (one shard per few tensors)
    unpack(root / "llama3" / "m.bb", root / "llama3" / "sharded", fmt="hf", max_shard_size=20_000)
    jobs.append({"dir": str(root / "llama3" / "sharded"), "ids": IDS, "new": 1, "out": str(root / "llama3" / "sharded.npz")})
    _run_hf_side(jobs)
    return {name: (*made[name], dict(np.load(root / name / "hf_out.npz"))) for name in MODELS} | {"root": root}


@pytest.mark.parametrize("name", list(MODELS))
def test_from_pretrained_matches_load_model_and_reference(exported, name):
    ck, container, _, res = exported[name]
    model = bbformat.load_model(container, dtype=torch.float32)
    ids = torch.tensor(IDS)
    with torch.no_grad():
        ours = model(ids).logits.numpy()
        gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, do_sample=False).numpy()
    np.testing.assert_allclose(res["logits"], ours, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(res["generated"], gen)
    np.testing.assert_array_equal(res["saved_logits"], res["logits"])  # save_pretrained reloads the same model
    if name != "llama3":  # reference_logits implements no rope scaling
        ref = reference_logits(read_checkpoint(container.parent / "ckpt"), np.array(IDS))
        np.testing.assert_allclose(res["logits"], ref, rtol=0, atol=1e-4)


def test_greedy_generate_is_the_reference_argmax(exported):
    """generate() with the cache equals recomputing the whole sequence each step (Phi-3's window included)."""
    ck, _, _, res = exported["phi3"]
    seq = np.array(IDS)
    for _ in range(NEW_TOKENS):
        nxt = reference_logits(ck, seq)[:, -1].argmax(-1)
        seq = np.concatenate([seq, nxt[:, None]], 1)
    np.testing.assert_array_equal(res["generated"], seq)


def test_directory_contents(exported):
    ck, _, hf, _ = exported["opt"]
    names = sorted(p.name for p in hf.iterdir())
    assert names == sorted(["config.json", "generation_config.json", "model.safetensors", hfdir.MODELING_FILE]), names
    assert (hf / hfdir.MODELING_FILE).read_bytes() == (Path(bbformat.__file__).parent / "adapters" / "hf_modeling.py").read_bytes()
    cfg = json.loads((hf / "config.json").read_text())
    assert cfg["model_type"] == "bbformat_sliced" and cfg["auto_map"]["AutoModelForCausalLM"].startswith("modeling_bbformat_sliced.")
    assert cfg["sliced_base"] == ck.hf_config and cfg["sliced_slicing"] == ck.slicing_config and cfg["sliced_stem"] == ck.stem
    assert set(cfg["sliced_biases"]) == {"q", "k", "v", "o", "up", "down", "head"}


def test_sharded_directory_loads(exported):
    root = exported["root"]
    d = root / "llama3" / "sharded"
    index = json.loads((d / hfdir.INDEX).read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 2 and all((d / f).is_file() for f in files)
    assert not (d / hfdir.WEIGHTS).exists()
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in _tiny("llama3").state_dict.values())
    res = dict(np.load(root / "llama3" / "sharded.npz"))
    np.testing.assert_array_equal(res["logits"], exported["llama3"][3]["logits"])


@pytest.mark.parametrize("source", ["hf", "saved", "sharded"])
def test_pack_from_hf_directory_is_bit_exact(exported, tmp_path, source):
    """hf -> .bb (--scheme none) -> tensors: the directory's bits (the rotated model its
    container decoded to); the configs and stem of the original come back."""
    name = "llama3" if source == "sharded" else "phi2"
    ck, _, _, _ = exported[name]
    src = exported["root"] / name / source
    pack(src, tmp_path / "again.bb", scheme="none")
    out = unpack(tmp_path / "again.bb", tmp_path / "tc", fmt="safetensors")
    with read_checkpoint(src) as back, read_checkpoint(out) as got:
        assert back.stem == ck.stem and back.hf_config == ck.hf_config and back.slicing_config == ck.slicing_config
        assert got.hf_config == ck.hf_config and got.slicing_config == ck.slicing_config
        assert set(got.state_dict) == set(back.state_dict) == set(ck.state_dict)
        for k, t in back.state_dict.items():
            assert torch.equal(got.state_dict[k].view(torch.uint8), t.contiguous().view(torch.uint8)), k
    if source == "hf":  # hf -> .bb -> hf: the same directory, byte for byte
        again = unpack(tmp_path / "again.bb", tmp_path / "hf_again", fmt="hf")
        assert sorted(p.name for p in again.iterdir()) == sorted(p.name for p in src.iterdir())
        for p in src.iterdir():
            assert (again / p.name).read_bytes() == p.read_bytes(), p.name


def test_float16_export_keeps_the_bits(tmp_path):
    ck = _tiny("llama2", "float16")
    write_checkpoint(ck, tmp_path / "ckpt")
    pack(tmp_path / "ckpt", tmp_path / "m.bb", scheme="none")
    hf = unpack(tmp_path / "m.bb", tmp_path / "hf", fmt="hf")
    from safetensors.torch import load_file

    got = load_file(hf / hfdir.WEIGHTS)
    assert json.loads((hf / "config.json").read_text())["torch_dtype"] == "float16"
    assert set(got) == set(ck.state_dict)
    for k, t in ck.state_dict.items():
        assert torch.equal(got[k].view(torch.int16), t.view(torch.int16)), k


def test_existing_output_is_refused(tmp_path):
    ck = _tiny("opt")
    write_checkpoint(ck, tmp_path / "ckpt")
    pack(tmp_path / "ckpt", tmp_path / "m.bb", scheme="none")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    with pytest.raises(OutputExistsError):
        unpack(tmp_path / "m.bb", tmp_path / "hf", fmt="hf")
    assert (tmp_path / "hf" / "config.json").read_text() == "{}"
    unpack(tmp_path / "m.bb", tmp_path / "hf", fmt="hf", overwrite=True)
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == "bbformat_sliced"


def test_cli_unpack_hf(tmp_path):
    ck = _tiny("phi3")
    write_checkpoint(ck, tmp_path / "ckpt")
    pack(tmp_path / "ckpt", tmp_path / "m.bb", scheme="none")
    cli = [sys.executable, "-m", "bbformat", "unpack", str(tmp_path / "m.bb"), str(tmp_path / "out"), "--format", "hf", "--quiet"]
    assert subprocess.run(cli, capture_output=True, text=True).returncode == 0
    again = subprocess.run(cli, capture_output=True, text=True)
    assert again.returncode == 2 and "[E_EXISTS]" in again.stderr, again.stderr
    assert "Traceback" not in again.stderr
    bad = subprocess.run(cli[:-3] + ["--format", "pt", "--max-shard-size", "1M"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--max-shard-size" in bad.stderr and "Traceback" not in bad.stderr
    sharded = subprocess.run(cli[:-4] + [str(tmp_path / "sh"), "--format", "hf", "--max-shard-size", "16K", "--quiet"],
                             capture_output=True, text=True)
    assert sharded.returncode == 0, sharded.stderr
    assert (tmp_path / "sh" / hfdir.INDEX).is_file()


def test_shards_split_as_save_pretrained():
    assert hfdir.shards([("a", 4), ("b", 4), ("c", 9), ("d", 1)], 8) == [["a", "b"], ["c"], ["d"]]
    assert hfdir.shard_names(1) == ["model.safetensors"]
    assert hfdir.shard_names(2) == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    with pytest.raises(bbformat.errors.InputError):
        hfdir.shards([("a", 1)], 0)


@pytest.mark.parametrize(("change", "match"), [
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "yarn"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "low_freq_factor"),
    ({"rope_scaling": {"rope_type": "linear", "factor": -1}}, "factor"),
    ({"rope_theta": "big"}, "rope_theta"),
    ({"rope_theta": float("nan")}, "rope_theta"),
    ({"partial_rotary_factor": 1.5}, "partial_rotary_factor"),
    ({"partial_rotary_factor": 0.05}, "rotary dims"),
    ({"num_hidden_layers": 10**12}, "layers"),
    ({"num_hidden_layers": "3"}, "num_hidden_layers"),
    ({"hidden_size": None}, "hidden_size"),
])
def test_bad_config_is_refused_before_a_model_runs(change, match):
    """unpack --format hf and load_model read config.json from the container without the
    planners' checks: every field the layers use is checked (UnsupportedModelError, E_UNSUPPORTED_MODEL)."""
    ck = _tiny("llama2")
    with pytest.raises(bbformat.errors.UnsupportedModelError, match=match):
        hfdir.hf_config(dict(ck.hf_config, **change), ck.slicing_config, "m", list(ck.state_dict), "float32")


@pytest.mark.parametrize("kind", ["linear", "llama3"])
def test_rope_frequencies_match_transformers(kind):
    """hf_modeling.Rotary's inverse frequencies against transformers' own RoPE initialisers."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from bbformat.adapters import hf_modeling
    from bbformat.adapters.sliced_config import rope

    scaling = {"rope_type": kind, "factor": 8.0}
    if kind == "llama3":
        scaling.update(low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=64)
    base = dict(_tiny("llama3").hf_config, rope_theta=500000.0, rope_scaling=scaling, max_position_embeddings=512)
    ours = hf_modeling.Rotary(rope(base, "llama"), 16).inv_freq(torch.device("cpu"))
    theirs, factor = ROPE_INIT_FUNCTIONS[kind](LlamaConfig(**base), "cpu")
    assert factor == 1.0
    torch.testing.assert_close(ours, theirs.float(), rtol=1e-6, atol=0)


def test_generate_from_embeddings_and_ids_agree(exported):
    """A prompt given as embeddings: the generated tokens equal those from its ids (the cache
    then holds the prompt, and input_ids only the new tokens)."""
    _, container, _, _ = exported["llama2"]
    model = bbformat.load_model(container, dtype=torch.float32)
    ids = torch.tensor(IDS)
    mask = torch.ones_like(ids)
    with torch.no_grad():
        want = model.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False)[:, ids.shape[1]:]
        got = model.generate(inputs_embeds=model.get_input_embeddings()(ids), attention_mask=mask, max_new_tokens=5,
                             do_sample=False)
    assert got[:, -5:].tolist() == want.tolist()


def test_load_model_save_pretrained_loads_and_packs(exported, tmp_path):
    """save_pretrained of load_model's model: a directory from_pretrained loads without bbformat
    and pack reads (the checkpoint's stem and configs come back)."""
    ck, container, _, res = exported["opt"]
    bbformat.load_model(container, dtype=torch.float32).save_pretrained(tmp_path / "saved")
    cfg = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert cfg["auto_map"]["AutoModelForCausalLM"].endswith(".SlicedForCausalLM") and cfg["sliced_stem"] == ck.stem
    _run_hf_side([{"dir": str(tmp_path / "saved"), "ids": IDS, "new": NEW_TOKENS, "out": str(tmp_path / "out.npz")}])
    np.testing.assert_array_equal(np.load(tmp_path / "out.npz")["logits"], res["logits"])
    with read_checkpoint(tmp_path / "saved") as back:
        assert back.stem == ck.stem and back.hf_config == ck.hf_config and back.slicing_config == ck.slicing_config


def test_model_type_is_one_name():
    from bbformat.adapters import hf_modeling
    from bbformat.checkpoint.files import HF_MODEL_TYPE

    assert hf_modeling.MODEL_TYPE == HF_MODEL_TYPE == hfdir.MODEL_TYPE


def _hf_copy(exported, tmp_path, source="sharded"):
    import shutil

    d = tmp_path / "d"
    shutil.copytree(exported["root"] / "llama3" / source, d)
    return d


@pytest.mark.parametrize("damage", ["traversal", "not-a-string", "missing-shard", "both-weights", "wrong-map", "stem-clash",
                                    "no-weights"])
def test_damaged_hf_directory_is_a_clean_error(exported, tmp_path, damage):
    d = _hf_copy(exported, tmp_path)
    index = json.loads((d / hfdir.INDEX).read_text())
    first = sorted(index["weight_map"])[0]
    if damage == "traversal":
        index["weight_map"][first] = "../escape.safetensors"
    elif damage == "not-a-string":
        index["weight_map"][first] = 3
    elif damage == "missing-shard":
        (d / index["weight_map"][first]).unlink()
    elif damage == "both-weights":
        (d / hfdir.WEIGHTS).write_bytes(b"")
    elif damage == "wrong-map":
        other = next(v for v in index["weight_map"].values() if v != index["weight_map"][first])
        index["weight_map"][first] = other
    elif damage == "stem-clash":
        cfg = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps(dict(cfg, sliced_stem="generation_config")))
    elif damage == "no-weights":
        (d / hfdir.INDEX).unlink()
    if damage != "no-weights":
        (d / hfdir.INDEX).write_text(json.dumps(index))
    with pytest.raises(bbformat.errors.InputError):
        with read_checkpoint(d):
            pass
    if damage == "traversal":  # the CLI: one line, its code, no traceback (the same InputError for every damage)
        r = subprocess.run([sys.executable, "-m", "bbformat", "pack", str(d), str(tmp_path / "x.bb")], capture_output=True,
                           text=True)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "[E_INPUT]" in r.stderr and "Traceback" not in r.stderr, r.stderr
    else:
        with pytest.raises(bbformat.errors.InputError):
            pack(d, tmp_path / "x.bb")
    assert not (tmp_path / "x.bb").exists()


def test_force_refuses_another_exports_weights(exported, tmp_path):
    """--force replaces files of the same names; shards of an earlier sharded export beside a
    new model.safetensors would make the directory ambiguous, so they are refused, never deleted."""
    d = _hf_copy(exported, tmp_path)
    before = sorted(p.name for p in d.iterdir())
    with pytest.raises(OutputExistsError, match="another export"):
        unpack(exported["llama3"][1], d, fmt="hf", overwrite=True)
    assert sorted(p.name for p in d.iterdir()) == before


@pytest.mark.parametrize("name", ["llama3", "opt", "phi3"])
def test_left_padded_batch_generates_as_each_alone(exported, name):
    """A left-padded batch: masks, positions (OPT's from the mask) and the cache give every row
    what it gives alone (hf_modeling, through load_model: the same class from_pretrained makes)."""
    _, container, _, _ = exported[name]
    model = bbformat.load_model(container, dtype=torch.float32)
    rows = [[5, 9, 77, 11, 2, 40, 3], [8, 1, 64]]
    width = max(map(len, rows))
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    with torch.no_grad():
        batch = model.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0)
        for i, r in enumerate(rows):
            alone = model.generate(torch.tensor([r]), attention_mask=torch.ones(1, len(r), dtype=torch.long), max_new_tokens=5,
                                   do_sample=False, pad_token_id=0)
            assert batch[i, width:].tolist() == alone[0, len(r):].tolist(), (name, i)


@pytest.mark.slow
def test_the_same_under_transformers_441(exported, tmp_path):
    """Every directory again under TransformerCompression's pinned transformers 4.41, in the venv
    that tools/tc_interop.py uses (TC_PYTHON; skipped without it): the same logits, generate()
    and save_pretrained round trip as under this venv's transformers."""
    python = os.environ.get("TC_PYTHON")
    if not python:
        pytest.skip("TC_PYTHON (a python with transformers 4.41, tools/tc_interop.py --help) is not set")
    jobs = [{"dir": str(exported[n][2]), "ids": IDS, "new": NEW_TOKENS, "out": str(tmp_path / f"{n}.npz"),
             "save": str(tmp_path / f"{n}_saved")} for n in MODELS]
    _run_hf_side(jobs, python)
    for n in MODELS:
        got, want = dict(np.load(tmp_path / f"{n}.npz")), exported[n][3]
        np.testing.assert_allclose(got["logits"], want["logits"], rtol=0, atol=1e-5)
        np.testing.assert_array_equal(got["generated"], want["generated"])
        np.testing.assert_array_equal(got["saved_logits"], got["logits"])

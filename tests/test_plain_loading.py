"""Loading plain containers (a Hugging Face directory packed as is): bbformat.load_model builds
the stock transformers class and fills it block by block; its logits and generate() equal
from_pretrained's of the original directory exactly. bbformat.load_file gives every tensor,
equal to safetensors' of the original files, for plain and sliced containers."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file as st_load_file  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

import bbformat  # noqa: E402
from bbformat.errors import InputError, UnsupportedModelError  # noqa: E402
from plain_fixture import craft_plain, pack_plain  # noqa: E402

VOCAB = 96
HAS_CUDA = torch.cuda.is_available()


def _llama_gqa() -> Any:
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=112, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False))


def _llama_tied() -> Any:
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=64, tie_word_embeddings=True))


def _mistral_window() -> Any:
    return transformers.MistralForCausalLM(transformers.MistralConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, sliding_window=6))


def _gpt2() -> Any:
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=48, n_layer=2, n_head=4, n_positions=64))


def _bert() -> Any:
    return transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=48, num_hidden_layers=2, num_attention_heads=4, intermediate_size=80,
        max_position_embeddings=64))


# (builder, stored dtype, causal)
MODELS: dict[str, tuple[Callable[[], Any], torch.dtype, bool]] = {
    "llama_gqa_bf16": (_llama_gqa, torch.bfloat16, True),
    "llama_tied_fp32": (_llama_tied, torch.float32, True),
    "mistral_window_bf16": (_mistral_window, torch.bfloat16, True),
    "gpt2_fp32": (_gpt2, torch.float32, True),
    "bert_fp32": (_bert, torch.float32, False),
}


def _save(name: str, dst: Path) -> Path:
    build, dtype, _ = MODELS[name]
    torch.manual_seed(0)
    model = build()
    with torch.no_grad():  # norms away from their initial ones and zero biases: a dropped weight would show
        for n, p in model.named_parameters():
            if "norm" in n.lower() or "ln_" in n or n.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    model.to(dtype).save_pretrained(str(dst))
    return dst


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """name -> (save_pretrained directory, its plain container)."""
    root = tmp_path_factory.mktemp("plain")
    return {name: (src := _save(name, root / name), pack_plain(src, root / f"{name}.bb")) for name in MODELS}


def _ids(n: int = 19) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, n), generator=torch.Generator().manual_seed(1))


def _reference(src: Path) -> Any:
    arch = json.loads((src / "config.json").read_text())["architectures"][0]
    return getattr(transformers, arch).from_pretrained(str(src))


@pytest.mark.parametrize("name", list(MODELS))
def test_load_model_equals_from_pretrained(packed: dict[str, tuple[Path, Path]], name: str) -> None:
    src, bb = packed[name]
    _, dtype, causal = MODELS[name]
    ref, got = _reference(src), bbformat.load_model(bb)
    assert type(got) is type(ref) and not got.training
    assert got.dtype == ref.dtype == dtype
    assert [(n, p.dtype, p.shape) for n, p in got.named_parameters()] == [(n, p.dtype, p.shape) for n, p in ref.named_parameters()]
    for (n, a), (m, b) in zip(ref.named_buffers(), got.named_buffers(), strict=True):
        assert n == m and a.dtype == b.dtype and torch.equal(a, b), n
    ids = _ids()
    with torch.no_grad():
        assert torch.equal(got(ids).logits, ref(ids).logits)
    if ref.config.tie_word_embeddings:
        assert got.get_output_embeddings().weight is got.get_input_embeddings().weight
    if causal:
        kw = {"max_new_tokens": 6, "do_sample": False, "attention_mask": torch.ones(1, 5, dtype=torch.long)}
        assert torch.equal(got.generate(ids[:1, :5], **kw), ref.generate(ids[:1, :5], **kw))


@pytest.mark.parametrize("name", ["llama_gqa_bf16", "gpt2_fp32"])
def test_load_file_equals_safetensors(packed: dict[str, tuple[Path, Path]], name: str) -> None:
    src, bb = packed[name]
    want = st_load_file(str(src / "model.safetensors"))
    got = bbformat.load_file(bb)
    assert list(got) == list(want)  # safetensors' order (the file's, sorted), which pack kept
    for k, w in want.items():
        g = got[k]
        assert g.dtype == w.dtype and g.shape == w.shape and g.device.type == "cpu"
        assert g.contiguous().view(torch.uint8).numpy().tobytes() == w.contiguous().view(torch.uint8).numpy().tobytes(), k


def test_torch_cpu_device_paths(packed: dict[str, tuple[Path, Path]]) -> None:
    """device="torch:cpu": the GPU code path on the CPU, for both entry points."""
    src, bb = packed["llama_gqa_bf16"]
    want = st_load_file(str(src / "model.safetensors"))
    got = bbformat.load_file(bb, device="torch:cpu")
    assert all(torch.equal(got[k].view(torch.int16), w.view(torch.int16)) for k, w in want.items())
    model = bbformat.load_model(bb, device="torch:cpu")
    with torch.no_grad():
        assert torch.equal(model(_ids()).logits, _reference(src)(_ids()).logits)


def test_load_file_of_a_sliced_container_equals_unpack(tmp_path: Path) -> None:
    from bbformat.checkpoint import write_checkpoint
    from bbformat.testing import make_tiny_checkpoint

    write_checkpoint(make_tiny_checkpoint("llama", seed=0, layers=2), tmp_path / "model")
    bbformat.pack(tmp_path / "model", tmp_path / "m.bb")
    out = bbformat.unpack(tmp_path / "m.bb", tmp_path / "st", fmt="safetensors")
    (weights,) = list(Path(out).glob("*.safetensors"))
    want = st_load_file(str(weights))
    got = bbformat.load_file(tmp_path / "m.bb")
    assert sorted(got) == sorted(want)
    for k, w in want.items():
        assert got[k].dtype == w.dtype and got[k].view(torch.uint8).numpy().tobytes() == w.view(torch.uint8).numpy().tobytes(), k


def test_base_model_checkpoint_into_its_head_model(tmp_path: Path) -> None:
    """A head model's config over a base model's tensors (names without the base prefix, as
    the original GPT-2 checkpoint): the prefix is added as from_pretrained adds it, and the
    head is tied."""
    torch.manual_seed(0)
    src = tmp_path / "gpt2base"
    transformers.GPT2Model(transformers.GPT2Config(vocab_size=VOCAB, n_embd=48, n_layer=2, n_head=4, n_positions=64)).save_pretrained(str(src))
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "architectures": ["GPT2LMHeadModel"]}))
    assert not any(k.startswith("transformer.") for k in st_load_file(str(src / "model.safetensors")))
    got = bbformat.load_model(pack_plain(src, tmp_path / "g.bb"))
    with torch.no_grad():
        assert torch.equal(got(_ids()).logits, transformers.GPT2LMHeadModel.from_pretrained(str(src))(_ids()).logits)


def test_subfolder_tensors_are_loaded_by_load_file_only(packed: dict[str, tuple[Path, Path]], tmp_path: Path) -> None:
    src = tmp_path / "st"
    shutil.copytree(packed["bert_fp32"][0], src)
    (src / "2_Dense").mkdir()
    dense = {"linear.weight": torch.randn(8, 48)}
    save_file(dense, str(src / "2_Dense" / "model.safetensors"))
    bb = pack_plain(src, tmp_path / "st.bb")
    assert torch.equal(bbformat.load_file(bb)["2_Dense/model.safetensors/linear.weight"], dense["linear.weight"])
    with torch.no_grad():
        assert torch.equal(bbformat.load_model(bb)(_ids()).logits, _reference(src)(_ids()).logits)


# ---- refusals: one line, nothing returned ------------------------------------------------------


def _edited(src: Path, dst: Path, config: dict[str, Any] | None = None, tensors: Callable[[dict[str, torch.Tensor]], None] | None = None,
            drop_config: bool = False) -> Path:
    shutil.copytree(src, dst)
    if config is not None:
        cfg = json.loads((dst / "config.json").read_text())
        cfg.update(config)
        (dst / "config.json").write_text(json.dumps(cfg))
    if drop_config:
        (dst / "config.json").unlink()
    if tensors is not None:
        sd = st_load_file(str(dst / "model.safetensors"))
        tensors(sd)
        save_file(sd, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return (craft_plain if drop_config else pack_plain)(dst, dst.with_suffix(".bb"))


def _refused(bb: Path, cls: type[Exception], *words: str) -> None:
    with pytest.raises(cls) as info:
        bbformat.load_model(bb)
    msg = str(info.value)
    assert "\n" not in msg and all(w in msg for w in words), msg


def test_refuses_custom_code_unknown_class_and_missing_config(packed: dict[str, tuple[Path, Path]], tmp_path: Path) -> None:
    src = packed["llama_tied_fp32"][0]
    auto = {"auto_map": {"AutoModelForCausalLM": "modeling_x.XForCausalLM"}}
    _refused(_edited(src, tmp_path / "auto", auto), UnsupportedModelError, "auto_map")
    _refused(_edited(src, tmp_path / "unknown", {"architectures": ["NoSuchModelForCausalLM"]}), UnsupportedModelError,
             "NoSuchModelForCausalLM")
    _refused(_edited(src, tmp_path / "notaclass", {"architectures": ["os.system"]}), UnsupportedModelError, "os.system")
    _refused(_edited(src, tmp_path / "none", {"architectures": []}), UnsupportedModelError, "architectures")
    _refused(_edited(src, tmp_path / "noconfig", drop_config=True), InputError, "config.json")
    shutil.copytree(src, tmp_path / "badjson")
    (tmp_path / "badjson" / "config.json").write_text('{"architectures": ["LlamaForCausalLM"],')
    _refused(craft_plain(tmp_path / "badjson", tmp_path / "badjson.bb"), InputError, "config.json", "not valid JSON")


def test_refuses_tensors_that_do_not_fit(packed: dict[str, tuple[Path, Path]], tmp_path: Path) -> None:
    src = packed["llama_tied_fp32"][0]

    def extra(sd: dict[str, torch.Tensor]) -> None:
        sd["model.layers.0.mlp.extra.weight"] = torch.zeros(3, 3)

    def missing(sd: dict[str, torch.Tensor]) -> None:
        del sd["model.layers.1.mlp.up_proj.weight"]

    def reshaped(sd: dict[str, torch.Tensor]) -> None:
        sd["model.layers.1.mlp.up_proj.weight"] = sd["model.layers.1.mlp.up_proj.weight"][:-1].clone()

    _refused(_edited(src, tmp_path / "extra", tensors=extra), InputError, "model.layers.0.mlp.extra.weight", "no place")
    _refused(_edited(src, tmp_path / "missing", tensors=missing), InputError, "model.layers.1.mlp.up_proj.weight", "lacks")
    _refused(_edited(src, tmp_path / "shape", tensors=reshaped), InputError, "model.layers.1.mlp.up_proj.weight", "shape")
    _refused(_edited(src, tmp_path / "vocab", {"vocab_size": VOCAB + 1}), InputError, "shape")


# ---- memory (slow) and a GPU (skipped without one) ---------------------------------------------------

# VmHWM (this process image's peak resident memory), not getrusage's ru_maxrss: Linux carries
# ru_maxrss over from the parent across fork and exec, so a child of a large pytest starts at its peak.
_PEAK = textwrap.dedent("""
    import json, re, sys
    import torch, transformers, bbformat
    from bbformat.loader import load_model
    from bbformat.reader import Reader

    transformers.LlamaForCausalLM, transformers.GenerationConfig  # their modules' import is not the load
    with Reader(sys.argv[1]) as r:
        block = max(sum(t.numel * 2 for t in r.read_program(i).tensors) for i in range(len(r)))

    def peak():
        with open("/proc/self/status") as f:
            return int(re.search(r"VmHWM:\\s+(\\d+) kB", f.read()).group(1)) * 1024

    before = peak()
    model = load_model(sys.argv[1], workers=2)
    after = peak()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    print(json.dumps({"before": before, "after": after, "weights": weights, "block": block}))
""")


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux's /proc/self/status")
def test_load_model_holds_the_weights_once(tmp_path: Path) -> None:
    """A ~300 MB bfloat16 Llama: load_model's peak resident memory (a fresh process, 2 decode
    workers) grows by the model plus a few blocks in flight (its largest, the embedding and
    the head, are a fifth of the model each), under twice the model."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                                   num_attention_heads=16, num_key_value_heads=4, tie_word_embeddings=False)
    transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(str(tmp_path / "big"))
    bb = pack_plain(tmp_path / "big", tmp_path / "big.bb")
    shutil.rmtree(tmp_path / "big")
    p = subprocess.run([sys.executable, "-c", _PEAK, str(bb)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    m = json.loads(p.stdout.splitlines()[-1])
    grown = m["after"] - m["before"]
    print(f"weights {m['weights'] / 2**20:.0f} MiB, largest block {m['block'] / 2**20:.0f} MiB, "
          f"peak RSS grew {grown / 2**20:.0f} MiB")
    assert m["weights"] > 250 * 2**20
    assert m["weights"] <= grown < min(2 * m["weights"], m["weights"] + 4 * m["block"]), m


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")
def test_cuda_load_model_and_load_file(packed: dict[str, tuple[Path, Path]]) -> None:
    src, bb = packed["llama_gqa_bf16"]
    want = st_load_file(str(src / "model.safetensors"))
    got = bbformat.load_file(bb, device="cuda")
    assert all(got[k].device.type == "cuda" and torch.equal(got[k].cpu().view(torch.int16), w.view(torch.int16))
               for k, w in want.items())
    model = bbformat.load_model(bb, device="cuda")
    assert all(p.device.type == "cuda" for p in model.parameters()) and all(b.device.type == "cuda" for b in model.buffers())
    ref = _reference(src).to("cuda")
    ids = _ids().to("cuda")
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref(ids).logits)

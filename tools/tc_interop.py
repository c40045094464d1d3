#!/usr/bin/env python3
"""Interop harness against Microsoft's TransformerCompression (TC, `slicegpt`), run as a
benchmark: TC's own code slices tiny random models, bbformat packs and unpacks them, and
TC's own `load_sliced_model` loads the result; our SmolLM2 slice is loaded by TC too.

    nice -n 19 python tools/tc_interop.py --tc-src /tmp/TransformerCompression \\
        --tc-python /tmp/venv441/bin/python --report BENCHMARKS.md

Setup (once; nothing of TC is copied into this repository, the harness imports it from
its own checkout at run time):

  1. TC's source, MIT-licensed:
         git clone https://github.com/microsoft/TransformerCompression /tmp/TransformerCompression
     (BENCHMARKS.md section 11 was measured at commit 6b12cdee, the one that pins
     transformers 4.41.0). Without internet, the search tool's `fetch` of
     github:microsoft/TransformerCompression leaves a bare mirror; clone that:
         git clone /work/.mirror/microsoft+TransformerCompression/repo /tmp/TransformerCompression
  2. A separate venv for TC (its pins would break bbformat's environment), with the same CPU
     build of torch as bbformat's (see the README's setup):
         python -m venv /tmp/venv441
         /tmp/venv441/bin/pip install 'torch==2.13.0' 'transformers==4.41.0' 'datasets==2.18.0' \\
             ml-collections accelerate
     (keep torch pinned in every pip command of that venv: an unpinned one pulls CUDA
     wheels). wandb (imported by TC's experiments/run_slicegpt.py) is optional: when it is
     not installed, a stub with wandb's three names is put in its place; the run is offline
     (--no-wandb) either way.

This script itself runs under bbformat's own python (current transformers). Everything TC
does runs in subprocesses under --tc-python (`tools/tc_interop.py tc-side ...`), so the two
transformers versions never meet in one process.

For each architecture (OPT, Llama-2, Llama-3 with GQA and an untied head, Phi-2, Phi-3)
and dtype (fp16, fp32):
  - TC side: a tiny random model is built with transformers 4.41's config class (hidden 64,
    3 layers, vocab 128, non-trivial norm weights and biases) and a word-level tokenizer,
    saved with save_pretrained, then sliced by TC's experiments/run_slicegpt.py
    `slicing_main` (its own model loading, replace_layers, fuse_modules, rotate_and_slice
    with ConstSlicingScheduler, random final orientation, its own save code: <name>_<sparsity>.pt,
    <name>_<sparsity>.json, the model directory's *.json). Only its dataset loader (the HF hub)
    is replaced by local synthetic text. The in-memory sliced model's logits on fixed ids are
    the reference.
  - our side: `bbformat pack --verify`, `bbformat unpack`, side files compared byte for byte.
  - TC side: `hf_utils.load_sliced_model` on TC's own save directory and on the unpacked one;
    logits against the reference. TC builds the reloaded model in float16 whatever the
    checkpoint's dtype (hf_utils.get_model_and_tokenizer's default), so a second column
    casts the model TC built to the checkpoint's dtype and loads the same .pt into it.
  - our side: `bbformat.load_model(<container>)`'s logits against the same reference.
Then SmolLM2-135M-Instruct sliced by tools/slice.py is loaded by TC's load_sliced_model
(model name `meta-llama/Llama-2/../SmolLM2-135M-Instruct`: a Llama-2 prefix for the adapter
and SmolLM2-135M-Instruct as the file name, so no renaming) and by bbformat.load_model, and
both compute perplexity on the same tokens of --smol-text (default tools/data/eval.txt).

Results go to --json (default tools/tc_interop_results.json) and, with --report, to section
"## 11. TransformerCompression interop" of that markdown file (replaced if present, else
appended; no other section is touched). --render-only re-renders the section from the JSON.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from mdsection import write_section  # tools/ is on sys.path (this script's folder)
from textdata import DATA, read_text, require_text

TOOLS = Path(__file__).resolve().parent
ROOT = TOOLS.parent
SECTION = "## 11. TransformerCompression interop"
DEFAULT_JSON = TOOLS / "tc_interop_results.json"

# TC picks its adapter from the model name (ModelAdapter.from_model -> each adapter's
# _from_pretrained/_from_uninitialized): OPT `facebook/opt*`, Llama `meta-llama/Llama-2*` or
# `meta-llama/Meta-Llama-3*`, Phi-2 exactly `microsoft/phi-2`, Phi-3
# `microsoft/Phi-3-mini-4k-instruct*`. It saves and loads <last path component>_<sparsity>.pt.
ARCHES: dict[str, dict[str, str]] = {
    "opt": {"label": "OPT", "model": "facebook/opt-tiny-random"},
    "llama2": {"label": "Llama-2", "model": "meta-llama/Llama-2-tiny-random"},
    "llama3": {"label": "Llama-3 (GQA, untied head)", "model": "meta-llama/Meta-Llama-3-tiny-random"},
    "phi2": {"label": "Phi-2", "model": "microsoft/phi-2"},
    "phi3": {"label": "Phi-3", "model": "microsoft/Phi-3-mini-4k-instruct"},
}
DTYPES = ("fp16", "fp32")
TORCH_DTYPE = {"fp16": "float16", "fp32": "float32"}
VOCAB, HIDDEN, LAYERS, MAXPOS = 128, 64, 3, 2048
SMOL_TC_NAME = "meta-llama/Llama-2/../{name}"

Json = dict[str, Any]


# ---------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="tools/tc_interop.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tc-src", type=Path, help="TransformerCompression checkout (holds src/slicegpt and experiments/)")
    ap.add_argument("--tc-python", help="python of the venv with transformers==4.41.0, datasets==2.18.0, torch==2.13.0")
    ap.add_argument("--work", type=Path, default=Path("/tmp/tc_interop"), help="scratch directory (default /tmp/tc_interop)")
    ap.add_argument("--arches", default=",".join(ARCHES), help=f"comma list from {','.join(ARCHES)} (default: all)")
    ap.add_argument("--dtypes", default=",".join(DTYPES), help="comma list from fp16,fp32 (default: both)")
    ap.add_argument("--sparsity", type=float, default=0.25, help="TC --sparsity for the tiny models (default 0.25: d = 48 of 64)")
    ap.add_argument("--no-smollm2", action="store_true", help="skip the SmolLM2 part")
    ap.add_argument("--smol-from", type=Path, default=None,
                    help="take the SmolLM2 part from an earlier run's results JSON instead of running it (the report says so)")
    ap.add_argument("--smol-slice", type=Path, default=None,
                    help="an existing tools/slice.py output directory to use instead of slicing SmolLM2 again")
    ap.add_argument("--smol-sparsity", type=float, default=0.25)
    ap.add_argument("--smol-nsamples", type=int, default=16, help="tools/slice.py --nsamples (default 16)")
    ap.add_argument("--smol-seqlen", type=int, default=256, help="tools/slice.py --seqlen (default 256)")
    ap.add_argument("--smol-text", type=Path, default=DATA / "eval.txt", help="perplexity text (default: tools/data/eval.txt)")
    ap.add_argument("--smol-tokens", type=int, default=8192, help="perplexity tokens of eval.txt, in 1024-token windows (default 8192)")
    ap.add_argument("--smol-logit-positions", type=int, default=256,
                    help="positions per window whose full logits are kept for max |dlogit| (default 256)")
    ap.add_argument("--smol-tc-fp16", action="store_true",
                    help="also run TC's evaluate_ppl on the model exactly as load_sliced_model returns it (float16 compute)")
    ap.add_argument("--tc-commit", default=None, help="TC commit to report when --tc-src is not a git checkout")
    ap.add_argument("--json", type=Path, default=DEFAULT_JSON, help=f"results JSON (default {DEFAULT_JSON.relative_to(ROOT)})")
    ap.add_argument("--report", type=Path, default=None, help="markdown file whose section 11 is (re)written, e.g. BENCHMARKS.md")
    ap.add_argument("--note", action="append", default=[], help="a line for the report's notes (repeatable)")
    ap.add_argument("--render-only", action="store_true", help="only re-render --report from --json")
    return ap


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = build_parser()
    a = ap.parse_args(argv)
    a.arches = [s for s in a.arches.split(",") if s]
    a.dtypes = [s for s in a.dtypes.split(",") if s]
    bad = [s for s in a.arches if s not in ARCHES] + [s for s in a.dtypes if s not in DTYPES]
    if bad:
        ap.error(f"unknown --arches/--dtypes value(s): {', '.join(bad)}")
    if a.render_only:
        if a.report is None:
            ap.error("--render-only needs --report")
        return a
    if a.tc_src is None or a.tc_python is None:
        ap.error("--tc-src and --tc-python are required (see the setup in --help)")
    if not 0 <= a.sparsity < 1 or not 0 <= a.smol_sparsity < 1:
        ap.error("sparsities must be in [0, 1)")
    if not a.no_smollm2:
        require_text(a.smol_text, "tc_interop", "--smol-text")
    return a


# ---------------------------------------------------------------- rendering (pure)


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


def _cmp_cell(c: Json | None) -> str:
    """'max|Δ| / top-1' of a comparison, or what went wrong."""
    if not c:
        return "—"
    if c.get("error"):
        return "failed: " + str(c["error"]).replace("|", "\\|")[:120]
    return f"{c['max_abs']:.3g} / {_pct(c['top1'])}"


def _int(n: int | None) -> str:
    return "—" if n is None else f"{n:,}"


UNIT_ROUNDOFF = {"fp16": 2.0**-11, "fp32": 2.0**-24}


def relative_summary(rows: list[Json]) -> list[str]:
    """Per dtype: the largest max|Δ| / max|logit| of the unpacked checkpoint (TC's load in the
    checkpoint's dtype, and load_model), next to the dtype's unit roundoff."""
    out = []
    for dt, u in UNIT_ROUNDOFF.items():
        vals = {}
        for col, what in (("tc_reload_unpacked_ckpt_dtype", "TC, ckpt dtype"), ("load_model", "load_model"),
                          ("hf_from_pretrained", "from_pretrained of the hf directory")):
            v = [r[col]["max_abs"] / r["ref_max_abs_logit"] for r in rows if r.get("dtype") == dt and r.get("ref_max_abs_logit")
                 and isinstance(r.get(col), dict) and "max_abs" in r[col]]
            if v:
                vals[what] = max(v)
        if vals:
            out.append(f"{dt} " + ", ".join(f"{k} {v:.2g}" for k, v in vals.items()) + f" (unit roundoff {u:.2g})")
    return out


def _ce_note(s: Json) -> str:
    c = s.get("ce_layouts_window0")
    if not c:
        return ""
    return ("; it takes the loss on the (batch, vocab, positions) layout (`logits.permute(0, 2, 1)`), and on this torch build "
            f"that layout's mean loss on the first window was {c['permuted_f32']:.6f} against {c['contiguous_f32']:.6f} "
            f"contiguous in float32 and {c['contiguous_f64']:.6f} in float64, which is why its column differs from the first")


def render_section(res: Json) -> str:
    tc, v = res.get("tc", {}), res.get("versions", {})
    tcv, ours = v.get("tc_side", {}), v.get("ours", {})
    L = [SECTION, "",
         f"Machine: {res.get('machine', 'unknown')}. Date: {res.get('date', '?')}. Command: `{res.get('command', '?')}`"
         + (f" ({res['elapsed_min']:.0f} min)" if res.get("elapsed_min") else "") + ".", "",
         f"TransformerCompression (TC) at commit `{tc.get('commit', 'unknown')}` ({tc.get('commit_date', '?')}), run from its own "
         f"checkout in its own venv: Python {tcv.get('python', '?')}, torch {tcv.get('torch', '?')}, transformers "
         f"{tcv.get('transformers', '?')}, datasets {tcv.get('datasets', '?')}. bbformat side: bbformat {ours.get('bbformat', '?')}, "
         f"Python {ours.get('python', '?')}, torch {ours.get('torch', '?')}, transformers {ours.get('transformers', '?')}. "
         "The two never share a process (`tools/tc_interop.py --help`).", "",
         f"Each tiny model (transformers 4.41's own config class; hidden {res.get('hidden', HIDDEN)}, {res.get('layers', LAYERS)} "
         f"layers, vocab {res.get('vocab', VOCAB)}, random weights with non-trivial norm weights and biases) is sliced by TC's "
         f"`experiments/run_slicegpt.py` `slicing_main` at `--sparsity {res.get('sparsity', '?')}` (its own loading, fusing, "
         "rotation and save; only its dataset loader is replaced by local synthetic text). Cells are max |Δlogit| / top-1 "
         f"agreement against the in-memory sliced model's logits on {res.get('ids_shape', '?')} fixed token ids. `bbformat pack "
         "--verify` (symmetric, exact), then `bbformat unpack` to TC's `.pt` layout. TC's `load_sliced_model` always builds a "
         "float16 model, so its fp32 rows carry float16 rounding; the next column casts TC's model to the checkpoint's dtype "
         "first. The last column: `bbformat unpack --format hf`, loaded in TC's venv (no bbformat importable) by "
         "`AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True, torch_dtype=\"auto\")`, then a greedy `generate()` "
         "of 4 tokens with the cache.", "",
         "| arch | TC `--model` | dtype | pack --verify | container B | TC .pt B | container/.pt | side files | max \\|logit\\| "
         "| TC reload of TC's .pt | TC reload of unpacked | same, in ckpt dtype | `load_model(.bb)` | `from_pretrained` of "
         "`unpack --format hf`, TC's venv |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res.get("rows", []):
        ratio = "—"
        if r.get("container_bytes") and r.get("tc_pt_bytes"):
            ratio = f"{r['container_bytes'] / r['tc_pt_bytes']:.3f}"
        side = "—" if r.get("side_files_identical") is None else ("identical" if r["side_files_identical"] else "**differ**")
        pv = "—" if r.get("pack_verify_ok") is None else ("ok" if r["pack_verify_ok"] else f"**failed** (exit {r.get('pack_rc')})")
        L.append(f"| {r.get('label', r.get('arch'))} | `{r.get('model_name', '?')}` | {r.get('dtype')} | {pv} | "
                 f"{_int(r.get('container_bytes'))} | {_int(r.get('tc_pt_bytes'))} | {ratio} | {side} | "
                 f"{'—' if r.get('ref_max_abs_logit') is None else format(r['ref_max_abs_logit'], '.3g')} | "
                 f"{_cmp_cell(r.get('tc_reload_tc'))} | {_cmp_cell(r.get('tc_reload_unpacked'))} | "
                 f"{_cmp_cell(r.get('tc_reload_unpacked_ckpt_dtype'))} | {_cmp_cell(r.get('load_model'))} | "
                 f"{_cmp_cell(r.get('hf_from_pretrained'))} |")
    rel = relative_summary(res.get("rows", []))
    if rel:
        L += ["", "Largest max |Δlogit| relative to the reference's max |logit|, over the rows: " + "; ".join(rel) + ". "
              "A top-1 disagreement needs the reference's top two logits within 2·max |Δlogit| of each other (a near tie); "
              "in random tiny models some positions have one."]
    fails = [f"- {r.get('label', r.get('arch'))} {r.get('dtype')}: {e}" for r in res.get("rows", []) for e in r.get("errors", [])]
    s = res.get("smollm2")
    if s:
        L += ["", "### SmolLM2-135M-Instruct sliced by `tools/slice.py`, loaded by TC", ""]
        if s.get("reused_from"):
            u = s["reused_from"]
            L += [f"Not rerun here: this part is the run of {u.get('date', '?')} (`{u.get('command', '?')}`; {u.get('machine', '?')}), "
                  "carried over with `--smol-from`.", ""]
        L += [
              f"Slice: `{s.get('slice_command', '?')}` ({s.get('slice_dtype', '?')}, {s.get('stem', '?')}). TC loads it with "
              f"`load_sliced_model('{s.get('tc_model_name', '?')}', <dir>, sparsity={s.get('sparsity', '?')})`: "
              f"rope_theta as TC reads it: {s.get('tc_rope_theta', '?')} (config.json: {s.get('config_rope_theta', '?')}). "
              f"Tokens: the first {_int(s.get('tokens'))} of eval.txt as TC's tokenizer (transformers 4.41) gives them, in "
              f"{s.get('windows', '?')} windows of {s.get('window', '?')}; bbformat's transformers gives "
              f"{'the same ids' if s.get('same_token_ids') else '**different ids**'}. Perplexity: loss over each window's "
              "predictions, float32 compute on the checkpoint's float16 weights (TC's model cast with `.float()` after "
              "`load_sliced_model`; `load_model(..., torch.float32)`); TC's `gpu_utils.evaluate_ppl` on the cast model is "
              "shown too" + _ce_note(s) + ". max |Δlogit| over the first "
              f"{s.get('logit_positions', '?')} positions of each window; top-1 agreement over all predictions, both against "
              "TC's load of the slice directory.", "",
              f"pack --verify: {'ok' if s.get('pack_verify_ok') else 'failed'}; container {_int(s.get('container_bytes'))} B vs "
              f"the slice's .pt {_int(s.get('pt_bytes'))} B; unpack's side files "
              f"{'identical' if s.get('side_files_identical') else 'differ'}.", "",
              "| model | perplexity | TC evaluate_ppl | max \\|Δlogit\\| | top-1 agreement |", "|---|---|---|---|---|"]
        for m in s.get("models", []):
            ppl = "—" if m.get("perplexity") is None else f"{m['perplexity']:.4f}"
            tce = "—" if m.get("tc_evaluate_ppl") is None else f"{m['tc_evaluate_ppl']:.4f}"
            mx = "—" if m.get("max_abs") is None else f"{m['max_abs']:.4g}"
            t1 = "—" if m.get("top1") is None else _pct(m["top1"])
            if m.get("top1_count"):
                t1 = f"{m['top1_count'][0]:,}/{m['top1_count'][1]:,}"
            L.append(f"| {m.get('what')} | {ppl} | {tce} | {mx} | {t1} |")
        if s.get("ppl_gap") is not None:
            ok = "within" if s["ppl_gap"] <= 0.02 else "**not within**"
            line = f"|perplexity(TC, slice directory) − perplexity(load_model(.bb))| = {s['ppl_gap']:.4f}: {ok} 0.02 (issue 17)"
            if s.get("ppl_gap_dir") is not None:
                line += f"; against `load_model(slice directory)`: {s['ppl_gap_dir']:.4f}"
            L += ["", line + "."]
        fails += [f"- SmolLM2: {e}" for e in s.get("errors", [])]
    L += ["", "Failures: none." if not fails else "Failures:", *fails]
    for n in res.get("notes", []):  # a --note is in the command already
        if n not in res.get("command", ""):
            L += ["", n]
    return "\n".join(L).rstrip() + "\n"


def write_report(path: Path, res: Json) -> None:
    write_section(path, render_section(res), SECTION)


# ---------------------------------------------------------------- TC side (runs under --tc-python)


def _tc_imports(tc_src: str) -> None:
    sys.path[:0] = [str(Path(tc_src) / "src"), str(Path(tc_src) / "experiments")]
    import slicegpt  # noqa: F401  (transformers and accelerate look for wandb while importing: before any stand-in)

    try:
        import wandb  # noqa: F401
    except ImportError:  # run_slicegpt imports it; a stand-in with the names it uses (mode is 'disabled' anyway)
        import types

        stub = types.ModuleType("wandb")

        class UsageError(Exception):
            pass

        stub.UsageError = UsageError  # type: ignore[attr-defined]
        stub.init = lambda *a, **k: None  # type: ignore[attr-defined]
        stub.log = lambda *a, **k: None  # type: ignore[attr-defined]
        sys.modules["wandb"] = stub


def _tc_versions() -> Json:
    import datasets
    import torch
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "datasets": datasets.__version__}


def _words(rng: Any, n: int) -> str:
    return " ".join(f"w{rng.randrange(4, VOCAB)}" for _ in range(n))


def _tc_tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<pad>": 3, **{f"w{i}": i for i in range(4, VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # tokens joined by spaces (TC's dataloader re-joins them)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
                                   model_input_names=["input_ids", "attention_mask"])


def _tc_base_model(arch: str) -> Any:
    """A tiny random model of ARCH in float32, built with transformers 4.41's own classes."""
    import torch
    from transformers import (LlamaConfig, LlamaForCausalLM, OPTConfig, OPTForCausalLM, Phi3Config, Phi3ForCausalLM, PhiConfig,
                              PhiForCausalLM)

    torch.manual_seed(0)
    ids = dict(bos_token_id=1, eos_token_id=2)
    if arch == "opt":  # OPT-125m's shape family: pre-LN, tied head, learned positions
        model = OPTForCausalLM(OPTConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, ffn_dim=160,
                                         num_attention_heads=4, max_position_embeddings=MAXPOS, word_embed_proj_dim=HIDDEN,
                                         pad_token_id=3, **ids))
    elif arch in ("llama2", "llama3"):
        llama3 = arch == "llama3"
        model = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=192 if llama3 else 160,
                                             num_hidden_layers=LAYERS, num_attention_heads=4,
                                             num_key_value_heads=2 if llama3 else 4, max_position_embeddings=MAXPOS,
                                             rms_norm_eps=1e-5, rope_theta=500000.0 if llama3 else 10000.0,
                                             tie_word_embeddings=False, **ids))
    elif arch == "phi2":
        model = PhiForCausalLM(PhiConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=160, num_hidden_layers=LAYERS,
                                         num_attention_heads=4, partial_rotary_factor=0.4, max_position_embeddings=MAXPOS,
                                         resid_pdrop=0.1, tie_word_embeddings=False, **ids))
    elif arch == "phi3":
        model = Phi3ForCausalLM(Phi3Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=96, num_hidden_layers=LAYERS,
                                           num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=MAXPOS,
                                           original_max_position_embeddings=MAXPOS, pad_token_id=3, rms_norm_eps=1e-5,
                                           tie_word_embeddings=False, **ids))
    else:
        raise SystemExit(f"tc-side: unknown arch {arch}")
    with torch.no_grad():  # non-trivial norms, so that fusing them into the linears matters
        for n, p in model.named_parameters():
            if "norm" in n:
                p.copy_((1 + 0.2 * torch.randn_like(p)) if n.endswith("weight") else 0.1 * torch.randn_like(p))
            elif n.endswith("bias"):
                p.copy_(0.05 * torch.randn_like(p))
    return model.eval()


def tc_slice(a: argparse.Namespace) -> Json:
    """Build a tiny model, slice and save it with TC's run_slicegpt.slicing_main, and write the
    in-memory sliced model's logits on fixed ids."""
    import random

    import numpy as np
    import torch

    _tc_imports(a.tc_src)
    import datasets
    import run_slicegpt
    from slicegpt import data_utils, rotate

    work = Path(a.work)
    base, save = work / "base", work / "tc_saved"
    base.mkdir(parents=True, exist_ok=True)
    model = _tc_base_model(a.arch)
    model.save_pretrained(str(base))
    _tc_tokenizer().save_pretrained(str(base))

    rng = random.Random(11)
    train = datasets.Dataset.from_dict({"text": [_words(rng, 40) for _ in range(64)]})
    test = datasets.Dataset.from_dict({"text": [_words(rng, 50) for _ in range(48)]})  # >= 2048 tokens: TC's eval seqlen
    data_utils.get_dataset = lambda name: {"train": train, "test": test}

    captured: dict[str, Any] = {}
    orig = rotate.rotate_and_slice

    def capture(model_adapter: Any, *args: Any, **kwargs: Any) -> Any:
        captured["adapter"] = model_adapter
        return orig(model_adapter, *args, **kwargs)

    rotate.rotate_and_slice = capture
    args = run_slicegpt.slicing_arg_parser(interactive=False)
    args.model, args.model_path, args.dtype, args.sparsity = a.model_name, str(base), a.dtype, a.sparsity
    args.save_dir, args.no_wandb, args.device = str(save), True, "cpu"
    args.cal_nsamples, args.cal_batch_size, args.cal_max_seqlen, args.ppl_eval_batch_size = 8, 4, 64, 1
    run_slicegpt.process_slicing_args(args)
    run_slicegpt.slicing_main(args)

    sliced = captured["adapter"].model.eval()
    ids = torch.randint(4, VOCAB, (4, 32), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        logits = sliced(ids).logits.double().numpy()
    np.savez(work / "reference.npz", ids=ids.numpy(), logits=logits)
    stem = f"{Path(a.model_name).name}_{a.sparsity}"
    return {"versions": _tc_versions(), "stem": stem, "save_dir": str(save), "files": sorted(p.name for p in save.iterdir()),
            "model_dtype": str(next(sliced.parameters()).dtype).replace("torch.", ""),
            "slicing_config": json.loads((save / f"{stem}.json").read_text())}


def _ckpt_dtype(sd: dict[str, Any]) -> Any:
    count: dict[Any, int] = {}
    for t in sd.values():
        count[t.dtype] = count.get(t.dtype, 0) + t.numel()
    return max(count, key=lambda k: count[k])


def _tc_load(model_name: str, d: str, sparsity: float) -> tuple[Any, Any, Json]:
    from slicegpt import hf_utils

    adapter, tok = hf_utils.load_sliced_model(model_name, d, sparsity=sparsity)
    model = adapter.model.eval()
    info = {"adapter": type(adapter).__name__, "model_dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
            "rope_theta": getattr(model.config, "rope_theta", None)}
    return model, tok, info


def _load_pt(model_name: str, d: str, sparsity: float) -> dict[str, Any]:
    import torch

    return torch.load(str(Path(d) / f"{Path(model_name).name}_{sparsity}.pt"), map_location="cpu", weights_only=True)


def tc_load(a: argparse.Namespace) -> Json:
    """load_sliced_model on each DIR: logits as TC returns the model, and with the model cast
    to the checkpoint's dtype and the .pt loaded again into it."""
    import numpy as np
    import torch

    _tc_imports(a.tc_src)
    ids = torch.from_numpy(np.load(a.ids))
    out: Json = {"versions": _tc_versions(), "loads": []}
    for d, o in zip(a.dirs, a.outs):
        rec: Json = {"dir": d}
        try:
            model, _, info = _tc_load(a.model_name, d, a.sparsity)
            rec.update(info)
            with torch.no_grad():
                as_loaded = model(ids).logits.double().numpy()
            sd = _load_pt(a.model_name, d, a.sparsity)
            dt = _ckpt_dtype(sd)
            rec["ckpt_dtype"] = str(dt).replace("torch.", "")
            model.to(dt)
            model.load_state_dict(sd)
            with torch.no_grad():
                cast = model(ids).logits.double().numpy()
            np.savez(o, as_loaded=as_loaded, ckpt_dtype=cast)
        except Exception as e:  # reported, not fatal: the table says what failed
            rec["error"] = f"{type(e).__name__}: {e}"
        out["loads"].append(rec)
    return out


def tc_smol(a: argparse.Namespace) -> Json:
    """TC's load_sliced_model of a Llama-layout slice; per-window losses on eval text."""
    import numpy as np
    import torch

    _tc_imports(a.tc_src)
    from slicegpt import gpu_utils

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    model, tok, info = _tc_load(a.model_name, a.dir, a.sparsity)
    if a.ids:
        ids = torch.from_numpy(np.load(a.ids))
    else:
        text = Path(a.text).read_text(encoding="utf-8")
        ids = tok(text, return_tensors="pt").input_ids[0]
        n = min(a.tokens, ids.numel()) // a.window * a.window
        ids = ids[:n].reshape(-1, a.window)
        np.save(a.ids_out, ids.numpy())
    res: Json = {"versions": _tc_versions(), **info, "config_rope_theta": json.loads((Path(a.dir) / "config.json").read_text()).get("rope_theta")}
    t0 = time.time()
    if a.fp16_ppl:  # exactly as TC returns it (float16)
        loader = [{"input_ids": w[None], "attention_mask": torch.ones_like(w[None])} for w in ids]
        res["tc_evaluate_ppl_as_loaded"] = gpu_utils.evaluate_ppl(model, model.config.pad_token_id, loader)
        res["seconds_fp16"] = time.time() - t0
    model = model.float()
    nll, top, sub = [], [], []

    class Recorder:  # TC's evaluate_ppl drives the forward passes; each window's logits are also summarised here
        def eval(self) -> "Recorder":
            model.eval()
            return self

        def __call__(self, **batch: Any) -> Any:
            out = model(**batch)
            w, lo = batch["input_ids"][0], out.logits[0, :-1].float()
            nll.append(float(torch.nn.functional.cross_entropy(lo, w[1:], reduction="sum")))
            top.append(lo.argmax(-1).numpy())
            sub.append(lo[: a.logit_positions].numpy())
            if len(nll) == 1:  # the loss layouts on this torch build: evaluate_ppl's (batch, vocab, positions), contiguous, float64
                ce = torch.nn.functional.cross_entropy
                res["ce_layouts_window0"] = {
                    "permuted_f32": float(ce(out.logits[:, :-1].permute(0, 2, 1), w[None, 1:]).double()),
                    "contiguous_f32": float(ce(lo, w[1:]).double()), "contiguous_f64": float(ce(lo.double(), w[1:]))}
            return out

    loader = [{"input_ids": w[None], "attention_mask": torch.ones_like(w[None])} for w in ids]
    res["tc_evaluate_ppl"] = gpu_utils.evaluate_ppl(Recorder(), model.config.pad_token_id, loader)
    res["pad_token_id"] = model.config.pad_token_id
    res["seconds"] = time.time() - t0
    np.savez(a.out, nll=np.array(nll), top1=np.stack(top), logits=np.stack(sub))
    return res


def tc_hf(a: argparse.Namespace) -> Json:
    """from_pretrained(trust_remote_code=True) of a directory `bbformat unpack --format hf`
    wrote, with this venv's transformers and bbformat not importable: logits on the ids (in
    the directory's dtype) and a greedy generate() with the cache."""
    sys.modules["bbformat"] = None  # type: ignore[assignment]  # the directory must stand alone
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    ids = torch.from_numpy(np.load(a.ids))
    model = AutoModelForCausalLM.from_pretrained(a.dir, trust_remote_code=True, torch_dtype="auto").eval()
    with torch.no_grad():
        logits = model(ids).logits.double().numpy()
        x = ids[:1, :8]
        gen = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=4, do_sample=False, pad_token_id=0)
    np.savez(a.out, logits=logits)
    return {"versions": _tc_versions(), "class": type(model).__name__,
            "model_dtype": str(next(model.parameters()).dtype).replace("torch.", ""), "generated": int(gen.shape[1] - x.shape[1])}


def tc_side_main(argv: list[str]) -> int:
    for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):  # local files only, never the hub
        os.environ.setdefault(k, "1")
    ap = argparse.ArgumentParser(prog="tc_interop.py tc-side")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("slice")
    s.add_argument("--tc-src", required=True)
    s.add_argument("--arch", required=True)
    s.add_argument("--dtype", required=True, choices=DTYPES)
    s.add_argument("--model-name", required=True)
    s.add_argument("--sparsity", type=float, required=True)
    s.add_argument("--work", required=True)
    s = sub.add_parser("load")
    s.add_argument("--tc-src", required=True)
    s.add_argument("--model-name", required=True)
    s.add_argument("--sparsity", type=float, required=True)
    s.add_argument("--ids", required=True)
    s.add_argument("--dirs", nargs="+", required=True)
    s.add_argument("--outs", nargs="+", required=True)
    s = sub.add_parser("hf")
    s.add_argument("--dir", required=True)
    s.add_argument("--ids", required=True)
    s.add_argument("--out", required=True)
    s = sub.add_parser("smol")
    s.add_argument("--tc-src", required=True)
    s.add_argument("--model-name", required=True)
    s.add_argument("--sparsity", type=float, required=True)
    s.add_argument("--dir", required=True)
    s.add_argument("--text", required=True)
    s.add_argument("--tokens", type=int, required=True)
    s.add_argument("--window", type=int, default=1024)
    s.add_argument("--logit-positions", type=int, default=256)
    s.add_argument("--ids", default=None, help="use these token windows (.npy) instead of tokenizing")
    s.add_argument("--ids-out", default=None)
    s.add_argument("--fp16-ppl", action="store_true")
    s.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    import logging

    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    res = {"slice": tc_slice, "load": tc_load, "hf": tc_hf, "smol": tc_smol}[a.cmd](a)
    print("TC-RESULT " + json.dumps(res))
    return 0


# ---------------------------------------------------------------- our side


def _run(cmd: list[str], log: Path, timeout: float = 3600) -> subprocess.CompletedProcess[str]:
    """CMD in LOG's directory (under --work: `python -m bbformat` then finds the bbformat this
    process imported, from PYTHONPATH or the installed one, not a checkout in the caller's cwd)."""
    print("+ " + " ".join(shlex.quote(c) for c in cmd), file=sys.stderr, flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=log.parent)
    with log.open("a", encoding="utf-8") as f:
        f.write(f"$ {' '.join(shlex.quote(c) for c in cmd)}\n# exit {p.returncode}\n{p.stdout}\n{p.stderr}\n")
    return p


def _tc(a: argparse.Namespace, args: list[str], log: Path) -> Json:
    cmd = [a.tc_python, str(Path(__file__).resolve()), "tc-side", *args]
    p = _run(cmd, log)
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("TC-RESULT ")), None)
    if p.returncode != 0 or line is None:
        tail = [ln for ln in p.stderr.strip().splitlines() if ln.strip()][-1:] or ["no output"]
        raise RuntimeError(f"TC side exited {p.returncode}: {tail[0][:300]} (log: {log})")
    return json.loads(line[len("TC-RESULT "):])


def _bb(args: list[str], log: Path) -> subprocess.CompletedProcess[str]:
    return _run([sys.executable, "-m", "bbformat", *args], log)


def compare(ref: Any, got: Any) -> Json:
    import numpy as np

    ref, got = np.asarray(ref, dtype=np.float64), np.asarray(got, dtype=np.float64)
    return {"max_abs": float(np.abs(ref - got).max()), "top1": float((ref.argmax(-1) == got.argmax(-1)).mean())}


def side_files_identical(src: Path, dst: Path, weights: str) -> tuple[bool, list[str]]:
    """Every file of SRC but the weights file has the same bytes in DST, and DST has no others."""
    a = {p.name for p in src.iterdir() if p.is_file()}
    b = {p.name for p in dst.iterdir() if p.is_file()}
    diffs = sorted(a ^ b) + sorted(n for n in a & b if n != weights and (src / n).read_bytes() != (dst / n).read_bytes())
    return not diffs, diffs


def pack_and_unpack(src: Path, bb: Path, unp: Path, weights: str, rec: Json, log: Path) -> bool:
    """`bbformat pack SRC BB --verify`, then `unpack BB UNP`, recorded in REC (pack_verify_ok,
    container_bytes, side_files_identical, errors); True if the unpacked directory was written."""
    p = _bb(["pack", str(src), str(bb), "--verify", "--quiet", "--force"], log)  # a rerun replaces its own container
    rec["pack_rc"], rec["pack_verify_ok"] = p.returncode, p.returncode == 0
    rec["pack_warnings"] = [ln for ln in p.stderr.splitlines() if "warning" in ln.lower()]
    if p.returncode != 0:
        rec["errors"].append(f"bbformat pack --verify exited {p.returncode}: {p.stderr.strip()[:300]}")
        return False
    rec["container_bytes"] = bb.stat().st_size
    u = _bb(["unpack", str(bb), str(unp), "--quiet"], log)
    if u.returncode != 0:
        rec["errors"].append(f"bbformat unpack exited {u.returncode}: {u.stderr.strip()[:300]}")
        return False
    rec["side_files_identical"], rec["side_file_diffs"] = side_files_identical(src, unp, weights)
    return True


def _weights_layout(p: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    import torch

    sd = torch.load(str(p), map_location="cpu", weights_only=True)
    return {k: (tuple(v.shape), str(v.dtype)) for k, v in sd.items()}


def _load_model_logits(path: Path, ids: Any, dtype: Any = None) -> Any:
    import torch

    import bbformat

    model = bbformat.load_model(path, dtype)
    with torch.no_grad():
        return model(torch.from_numpy(ids)).logits.double().numpy()


def run_tiny(a: argparse.Namespace, arch: str, dtype: str) -> Json:
    import numpy as np

    spec = ARCHES[arch]
    work = a.work / f"{arch}_{dtype}"
    if work.exists():
        import shutil

        shutil.rmtree(work)
    work.mkdir(parents=True)
    log = work / "log.txt"
    row: Json = {"arch": arch, "label": spec["label"], "model_name": spec["model"], "dtype": dtype, "errors": []}
    try:
        t = _tc(a, ["slice", "--tc-src", str(a.tc_src), "--arch", arch, "--dtype", dtype, "--model-name", spec["model"],
                    "--sparsity", str(a.sparsity), "--work", str(work)], log)
    except Exception as e:
        row["errors"].append(f"TC slicing: {e}")
        return row
    row["tc_versions"], row["stem"], row["tc_files"] = t["versions"], t["stem"], t["files"]
    saved, bb, unp = Path(t["save_dir"]), work / "model.bb", work / "unpacked"
    pt = f"{t['stem']}.pt"
    row["tc_pt_bytes"] = (saved / pt).stat().st_size
    ref = np.load(work / "reference.npz")
    np.save(work / "ids.npy", ref["ids"])
    row["ids_shape"] = "×".join(map(str, ref["ids"].shape))
    row["ref_max_abs_logit"] = float(np.abs(ref["logits"]).max())

    if pack_and_unpack(saved, bb, unp, pt, row, log):
        row["weights_keys_shapes_dtypes_equal"] = _weights_layout(saved / pt) == _weights_layout(unp / pt)
        if not row["side_files_identical"]:
            row["errors"].append(f"unpack's files differ from TC's: {row['side_file_diffs']}")
        if not row["weights_keys_shapes_dtypes_equal"]:
            row["errors"].append("unpacked .pt has other keys, shapes or dtypes than TC's")
    dirs = [saved] + ([unp] if unp.is_dir() else [])
    outs = [work / "tc_reload_tc.npz", work / "tc_reload_unpacked.npz"][: len(dirs)]
    try:
        tl = _tc(a, ["load", "--tc-src", str(a.tc_src), "--model-name", spec["model"], "--sparsity", str(a.sparsity),
                     "--ids", str(work / "ids.npy"), "--dirs", *map(str, dirs), "--outs", *map(str, outs)], log)
        for name, rec, o in zip(("tc_reload_tc", "tc_reload_unpacked"), tl["loads"], outs):
            if rec.get("error"):
                row[name] = {"error": rec["error"]}
                row["errors"].append(f"TC load_sliced_model of {Path(rec['dir']).name}: {rec['error']}")
                continue
            z = np.load(o)
            row[name] = {**compare(ref["logits"], z["as_loaded"]), "model_dtype": rec["model_dtype"], "adapter": rec["adapter"]}
            if name == "tc_reload_unpacked":
                row["tc_reload_unpacked_ckpt_dtype"] = {**compare(ref["logits"], z["ckpt_dtype"]), "model_dtype": rec["ckpt_dtype"]}
            else:
                row["tc_reload_tc_ckpt_dtype"] = {**compare(ref["logits"], z["ckpt_dtype"]), "model_dtype": rec["ckpt_dtype"]}
    except Exception as e:
        row["errors"].append(f"TC load: {e}")
    if bb.is_file():
        hf = work / "hf"
        u = _bb(["unpack", str(bb), str(hf), "--format", "hf", "--quiet"], log)
        if u.returncode != 0:
            row["hf_from_pretrained"] = {"error": f"bbformat unpack --format hf exited {u.returncode}"}
            row["errors"].append(f"bbformat unpack --format hf exited {u.returncode}: {u.stderr.strip()[:300]}")
        else:
            try:
                th = _tc(a, ["hf", "--dir", str(hf), "--ids", str(work / "ids.npy"), "--out", str(work / "tc_hf.npz")], log)
                row["hf_from_pretrained"] = {**compare(ref["logits"], np.load(work / "tc_hf.npz")["logits"]),
                                             "model_dtype": th["model_dtype"], "class": th["class"], "generated": th["generated"]}
            except Exception as e:
                row["hf_from_pretrained"] = {"error": str(e)}
                row["errors"].append(f"TC-side from_pretrained of unpack --format hf: {e}")
        try:
            row["load_model"] = compare(ref["logits"], _load_model_logits(bb, ref["ids"]))
        except Exception as e:
            row["load_model"] = {"error": f"{type(e).__name__}: {e}"}
            row["errors"].append(f"bbformat.load_model: {type(e).__name__}: {e}")
    return row


def _smol_nll(model: Any, ids: Any, positions: int) -> tuple[Any, Any, Any]:
    import numpy as np
    import torch

    nll, top, sub = [], [], []
    with torch.no_grad():
        for w in torch.from_numpy(ids):
            lo = model(w[None]).logits[0, :-1].float()
            nll.append(float(torch.nn.functional.cross_entropy(lo, w[1:], reduction="sum")))
            top.append(lo.argmax(-1).numpy())
            sub.append(lo[:positions].numpy())
    return np.array(nll), np.stack(top), np.stack(sub)


def run_smol(a: argparse.Namespace) -> Json:
    import math

    import numpy as np
    import torch

    import bbformat

    work = a.work / "smollm2"
    work.mkdir(parents=True, exist_ok=True)
    log = work / "log.txt"
    s: Json = {"errors": [], "sparsity": a.smol_sparsity, "window": 1024, "logit_positions": a.smol_logit_positions}
    if a.smol_slice is not None:
        sl = a.smol_slice
        s["slice_command"] = f"(existing slice {sl})"
    else:
        sl = work / "slice"
        cmd = [sys.executable, str(TOOLS / "slice.py"), "smollm2", "--sparsity", str(a.smol_sparsity), "--out", str(sl),
               "--nsamples", str(a.smol_nsamples), "--seqlen", str(a.smol_seqlen)]
        s["slice_command"] = (f"python tools/slice.py smollm2 --sparsity {a.smol_sparsity} --out DIR "
                              f"--nsamples {a.smol_nsamples} --seqlen {a.smol_seqlen}")
        p = _run(cmd, log, timeout=7200)
        if p.returncode != 0:
            s["errors"].append(f"tools/slice.py exited {p.returncode}: {p.stderr.strip()[-300:]}")
            return s
    pt = next(iter(sorted(sl.glob("*.pt"))))
    stem = pt.name[:-3]
    name, sparsity = stem.rsplit("_", 1)
    s["stem"], s["pt_bytes"] = stem, pt.stat().st_size
    s["tc_model_name"] = SMOL_TC_NAME.format(name=name)
    s["config_rope_theta"] = json.loads((sl / "config.json").read_text()).get("rope_theta")
    s["slice_dtype"] = str(torch.load(str(pt), map_location="cpu", weights_only=True, mmap=True)["lm_head.weight"].dtype).replace("torch.", "")
    bb, unp = work / "smol.bb", work / "unpacked"
    if unp.exists():
        import shutil

        shutil.rmtree(unp)
    pack_and_unpack(sl, bb, unp, pt.name, s, log)
    ids_path = work / "ids.npy"
    common = ["--tc-src", str(a.tc_src), "--model-name", s["tc_model_name"], "--sparsity", sparsity, "--text", str(a.smol_text),
              "--tokens", str(a.smol_tokens), "--logit-positions", str(a.smol_logit_positions)]
    models: list[Json] = []
    try:
        r = _tc(a, ["smol", *common, "--dir", str(sl), "--ids-out", str(ids_path), "--out", str(work / "tc_slice.npz")]
                + (["--fp16-ppl"] if a.smol_tc_fp16 else []), log)
    except Exception as e:
        s["errors"].append(f"TC load of the slice: {e}")
        return s
    s["tc_rope_theta"], s["tc_versions"], s["tc_adapter"] = r["rope_theta"], r["versions"], r["adapter"]
    s["ce_layouts_window0"] = r.get("ce_layouts_window0")
    ids = np.load(ids_path)
    s["tokens"], s["windows"] = int(ids.size), int(ids.shape[0])
    preds = ids.shape[0] * (ids.shape[1] - 1)
    ref = np.load(work / "tc_slice.npz")
    models.append({"what": "TC `load_sliced_model`, slice directory", "perplexity": math.exp(ref["nll"].sum() / preds),
                   "tc_evaluate_ppl": r["tc_evaluate_ppl"], "seconds": r["seconds"]})
    if a.smol_tc_fp16:
        models.append({"what": "TC `load_sliced_model`, slice directory, as returned (float16 compute)",
                       "tc_evaluate_ppl": r.get("tc_evaluate_ppl_as_loaded")})
    if unp.is_dir():
        try:
            r2 = _tc(a, ["smol", *common, "--dir", str(unp), "--ids", str(ids_path), "--out", str(work / "tc_unpacked.npz")], log)
            z = np.load(work / "tc_unpacked.npz")
            models.append({"what": "TC `load_sliced_model`, bbformat unpack output", "perplexity": math.exp(z["nll"].sum() / preds),
                           "tc_evaluate_ppl": r2["tc_evaluate_ppl"], "max_abs": float(np.abs(z["logits"] - ref["logits"]).max()),
                           "top1": float((z["top1"] == ref["top1"]).mean()), "top1_count": [int((z["top1"] == ref["top1"]).sum()), int(z["top1"].size)]})
        except Exception as e:
            s["errors"].append(f"TC load of the unpacked slice: {e}")
    try:  # the same ids through bbformat's transformers' tokenizer?
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(sl))
        ours = tok(read_text(a.smol_text, "tc_interop", "--smol-text"), return_tensors="np").input_ids[0][: ids.size]
        s["same_token_ids"] = bool(ours.shape[0] == ids.size and (ours == ids.reshape(-1)).all())
    except Exception as e:
        s["errors"].append(f"tokenizing with bbformat's transformers: {type(e).__name__}: {e}")
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    for what, path in (("bbformat `load_model(.bb, float32)`", bb), ("bbformat `load_model(slice directory, float32)`", sl)):
        if not path.exists():
            continue
        try:
            t0 = time.time()
            model = bbformat.load_model(path, torch.float32).eval()
            nll, top, sub = _smol_nll(model, ids, a.smol_logit_positions)
            del model
            models.append({"what": what, "perplexity": math.exp(nll.sum() / preds), "max_abs": float(np.abs(sub - ref["logits"]).max()),
                           "top1": float((top == ref["top1"]).mean()), "top1_count": [int((top == ref["top1"]).sum()), int(top.size)],
                           "seconds": time.time() - t0})
        except Exception as e:
            s["errors"].append(f"{what}: {type(e).__name__}: {e}")
    s["models"] = models
    tc_ppl = models[0]["perplexity"]
    bb_ppl = next((m["perplexity"] for m in models if m["what"].startswith("bbformat `load_model(.bb")), None)
    dir_ppl = next((m["perplexity"] for m in models if m["what"].startswith("bbformat `load_model(slice")), None)
    if bb_ppl is not None:
        s["ppl_gap"] = abs(tc_ppl - bb_ppl)
    if dir_ppl is not None:
        s["ppl_gap_dir"] = abs(tc_ppl - dir_ppl)
    return s


def _machine() -> str:
    sys.path.insert(0, str(TOOLS))
    from machine import cpu_and_memory, python_and_numpy

    return f"{cpu_and_memory()}; {python_and_numpy()}"


def _tc_commit(a: argparse.Namespace) -> tuple[str, str]:
    if a.tc_commit:
        return a.tc_commit, "?"
    p = subprocess.run(["git", "-C", str(a.tc_src), "log", "-1", "--format=%H %cs"], capture_output=True, text=True)
    if p.returncode != 0 or not p.stdout.strip():
        return "unknown (not a git checkout; pass --tc-commit)", "?"
    h, d = p.stdout.split()
    return h, d


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["tc-side"]:
        return tc_side_main(argv[1:])
    a = parse_args(argv)
    for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ.setdefault(k, "1")
    if a.render_only:
        res = json.loads(a.json.read_text())
        if a.note:  # a later remark on the same run: kept in the JSON too
            res["notes"] = res.get("notes", []) + list(a.note)
            a.json.write_text(json.dumps(res, indent=2) + "\n")
        write_report(a.report, res)
        print(f"tc_interop: wrote section 11 of {a.report} from {a.json}")
        return 0
    import numpy
    import torch
    import transformers

    import bbformat

    a.work.mkdir(parents=True, exist_ok=True)
    a.tc_src = a.tc_src.resolve()
    t0 = time.time()
    commit, cdate = _tc_commit(a)
    res: Json = {
        "machine": _machine(), "date": datetime.date.today().isoformat(),
        "command": "python tools/tc_interop.py " + " ".join(shlex.quote(x) for x in argv),
        "tc": {"src": str(a.tc_src), "commit": commit, "commit_date": cdate},
        "versions": {"ours": {"bbformat": getattr(bbformat, "__version__", "?"), "bbformat_path": str(Path(bbformat.__file__).parent),
                              "python": platform.python_version(),
                              "torch": torch.__version__, "transformers": transformers.__version__, "numpy": numpy.__version__}},
        "sparsity": a.sparsity, "hidden": HIDDEN, "layers": LAYERS, "vocab": VOCAB, "rows": [], "notes": list(a.note),
    }
    for arch in a.arches:
        for dtype in a.dtypes:
            print(f"tc_interop: {arch} {dtype}", file=sys.stderr, flush=True)
            row = run_tiny(a, arch, dtype)
            res["rows"].append(row)
            if "tc_versions" in row:
                res["versions"]["tc_side"] = row["tc_versions"]
            res.setdefault("ids_shape", row.get("ids_shape"))
            print(f"tc_interop: {arch} {dtype}: " + json.dumps({k: row.get(k) for k in ("pack_verify_ok", "side_files_identical",
                  "tc_reload_unpacked", "load_model", "hf_from_pretrained", "errors")}), file=sys.stderr, flush=True)
    if a.smol_from is not None:
        earlier = json.loads(a.smol_from.read_text())
        res["smollm2"] = dict(earlier["smollm2"], reused_from={k: earlier.get(k) for k in ("date", "command", "machine")})
        res["versions"].setdefault("tc_side", earlier.get("versions", {}).get("tc_side", {}))
    elif not a.no_smollm2:
        print("tc_interop: SmolLM2", file=sys.stderr, flush=True)
        res["smollm2"] = run_smol(a)
        res["versions"].setdefault("tc_side", res["smollm2"].get("tc_versions", {}))
    res["elapsed_min"] = (time.time() - t0) / 60
    a.json.write_text(json.dumps(res, indent=2) + "\n")
    print(f"tc_interop: wrote {a.json}", file=sys.stderr)
    if a.report is not None:
        write_report(a.report, res)
        print(f"tc_interop: wrote section 11 of {a.report}", file=sys.stderr)
    print(render_section(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

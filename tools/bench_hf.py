#!/usr/bin/env python3
"""Issue 25: a sliced SmolLM2 through `unpack --format hf`, loaded by transformers'
from_pretrained with no bbformat importable, against bbformat.load_model of the container.

    python tools/bench_hf.py --slice DIR --python441 /tmp/venv441/bin/python \\
        --report BENCHMARKS.md --json tools/bench_hf_results.json

DIR is a tools/slice.py output (default: slice SmolLM2 at --sparsity 0.25 into --work). The
slice is packed (`bbformat pack`, its defaults: symmetric, exact), unpacked to an HF directory,
and perplexity is computed on the first --tokens tokens of --text (default tools/data/eval.txt) in
1024-token windows (loss over each window's predictions, float32 compute) by:
  - `bbformat.load_model(container, torch.float32)` in this process;
  - `AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)` in float32, in a
    fresh process where `import bbformat` fails, under this python's transformers and, with
    --python441, under TransformerCompression's pinned transformers 4.41 (tools/tc_interop.py's
    venv).
Each from_pretrained row also reports max |Δlogit| against load_model (every position) and
top-1 agreement. Section "## 16. Hugging Face directories" of --report is (re)written.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TOOLS = Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS))
from mdsection import write_section  # noqa: E402
from textdata import DATA, read_text, require_text  # noqa: E402  (tools/data/: eval.txt)

SECTION = "## 16. Hugging Face directories: `unpack --format hf` and `from_pretrained` (issue 25)"
WINDOW = 1024

def window_losses(model: Any, wins: Any) -> tuple[list[float], list[Any], float]:
    """Each window's summed loss over its predictions and its float32 logits, and the seconds
    the forward passes took: the one computation both sides of the comparison run (this
    module imports nothing of bbformat, so the from_pretrained side imports it too)."""
    import torch

    nll, logits = [], []
    t0 = time.time()
    with torch.no_grad():
        for w in wins:
            lo = model(w[None]).logits[0, :-1].float()
            nll.append(float(torch.nn.functional.cross_entropy(lo, w[1:], reduction="sum")))
            logits.append(lo.numpy())
    return nll, logits, time.time() - t0


# runs under the python given, with bbformat made unimportable: per-window losses and logits
HF_SIDE = """
import json, sys, time
sys.modules["bbformat"] = None
import numpy as np, torch, transformers
from transformers import AutoModelForCausalLM
d, ids_path, out = sys.argv[1:4]
torch.set_num_threads(int(sys.argv[4]))
new = tuple(int(x) for x in transformers.__version__.split(".")[:2]) >= (4, 56)
t0 = time.time()
model = AutoModelForCausalLM.from_pretrained(d, trust_remote_code=True, **{"dtype" if new else "torch_dtype": torch.float32}).eval()
load_s = time.time() - t0
ids = torch.from_numpy(np.load(ids_path))
sys.path.insert(0, sys.argv[5])
from bench_hf import window_losses
nll, logits, forward_s = window_losses(model, ids)
np.savez(out, nll=np.array(nll), logits=np.stack(logits))
print("HF-RESULT " + json.dumps({"transformers": transformers.__version__, "torch": torch.__version__,
                                 "class": type(model).__name__, "load_s": load_s, "forward_s": forward_s}))
"""


def run(cmd: list[str], timeout: float = 7200) -> subprocess.CompletedProcess[str]:
    print("+ " + " ".join(shlex.quote(c) for c in cmd), file=sys.stderr, flush=True)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def bb(*args: str) -> float:
    t0 = time.time()
    p = run([sys.executable, "-m", "bbformat", *args])
    if p.returncode != 0:
        raise SystemExit(f"bbformat {args[0]} exited {p.returncode}: {p.stderr.strip()}")
    return time.time() - t0


def hf_side(python: str, d: Path, ids: Path, out: Path) -> dict[str, Any]:
    p = run([python, "-c", HF_SIDE, str(d), str(ids), str(out), str(os.cpu_count() or 1), str(TOOLS)])
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("HF-RESULT ")), None)
    if p.returncode != 0 or line is None:
        return {"error": (p.stderr.strip().splitlines() or ["no output"])[-1][:300]}
    res: dict[str, Any] = json.loads(line[len("HF-RESULT "):])
    return res


def measure(a: argparse.Namespace) -> dict[str, Any]:
    import numpy as np
    import torch
    from transformers import AutoTokenizer

    import bbformat

    a.work.mkdir(parents=True, exist_ok=True)
    sl = a.slice
    if sl is None:
        sl = a.work / "slice"
        p = run([sys.executable, str(TOOLS / "slice.py"), "smollm2", "--sparsity", "0.25", "--out", str(sl)])
        if p.returncode != 0:
            raise SystemExit(f"tools/slice.py exited {p.returncode}: {p.stderr.strip()[-300:]}")
    container, hf = a.work / "smol.bb", a.work / "hf"
    res: dict[str, Any] = {"slice": str(sl), "rows": []}
    res["pack_s"] = bb("pack", str(sl), str(container), "--quiet", "--force")
    res["unpack_hf_s"] = bb("unpack", str(container), str(hf), "--format", "hf", "--quiet", "--force")
    res["container_bytes"] = container.stat().st_size
    res["hf_files"] = {p.name: p.stat().st_size for p in sorted(hf.iterdir())}
    tok = AutoTokenizer.from_pretrained(str(hf))  # the tokenizer files the container carried
    text = read_text(a.text, "bench_hf", "--text")
    ids = tok(text, return_tensors="pt").input_ids[0]
    n = min(a.tokens, ids.numel()) // WINDOW * WINDOW
    wins = ids[:n].reshape(-1, WINDOW)
    np.save(a.work / "ids.npy", wins.numpy())
    preds = wins.shape[0] * (WINDOW - 1)
    res.update(tokens=int(n), windows=int(wins.shape[0]))
    torch.set_num_threads(os.cpu_count() or 1)
    t0 = time.time()
    model = bbformat.load_model(container, torch.float32).eval()
    load_s = time.time() - t0
    nll, ref, forward_s = window_losses(model, wins)
    del model
    base = {"what": "`bbformat.load_model(container, torch.float32)`", "perplexity": math.exp(sum(nll) / preds),
            "load_s": load_s, "forward_s": forward_s}
    res["rows"].append(base)
    ref_logits = np.stack(ref)
    for label, python in (("this venv", sys.executable), ("transformers 4.41 venv", a.python441)):
        if python is None:
            continue
        out = a.work / f"hf_{len(res['rows'])}.npz"
        r = hf_side(python, hf, a.work / "ids.npy", out)
        row: dict[str, Any] = {"what": f"`from_pretrained(hf directory)`, {label}", **r}
        if "error" not in r:
            z = np.load(out)
            row["perplexity"] = math.exp(float(z["nll"].sum()) / preds)
            row["max_abs"] = float(np.abs(z["logits"] - ref_logits).max())
            row["top1"] = [int((z["logits"].argmax(-1) == ref_logits.argmax(-1)).sum()), int(ref_logits.shape[0] * ref_logits.shape[1])]
            row["ppl_gap"] = abs(row["perplexity"] - base["perplexity"])
        res["rows"].append(row)
    return res


def render(res: dict[str, Any]) -> str:
    L = [SECTION, "",
         f"Machine: {res['machine']}. Date: {res['date']}. Command: `{res['command']}` ({res['elapsed_min']:.0f} min).", "",
         f"The slice `{res['slice_note']}` packed by `bbformat pack` (defaults: symmetric, exact; {res['pack_s']:.0f} s, "
         f"{res['container_bytes']:,} B), then `bbformat unpack --format hf` ({res['unpack_hf_s']:.0f} s) wrote: "
         + ", ".join(f"`{k}` {v:,} B" for k, v in res["hf_files"].items()) + ". "
         f"Perplexity on the first {res['tokens']:,} tokens of eval.txt (the directory's own tokenizer), {res['windows']} "
         "windows of 1,024, float32 compute. Each `from_pretrained` ran in a fresh process in which `import bbformat` fails "
         "(`trust_remote_code=True`: the directory's `modeling_bbformat_sliced.py`). max |Δlogit| and top-1 agreement: "
         "against `load_model`, every prediction. load s: `load_model` (decoding the container) or `from_pretrained`; "
         "forward s: the windows' forward passes, logits kept (each process alone on the machine, one after the other).", "",
         "| model | transformers | perplexity | \\|Δ perplexity\\| vs load_model | max \\|Δlogit\\| | top-1 agreement | load s | forward s |",
         "|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        if r.get("error"):
            L.append(f"| {r['what']} | | failed: {r['error']} | | | | | |")
            continue
        t1 = f"{r['top1'][0]:,}/{r['top1'][1]:,}" if r.get("top1") else "—"
        gap = "—" if r.get("ppl_gap") is None else f"{r['ppl_gap']:.2g}"
        mx = "—" if r.get("max_abs") is None else f"{r['max_abs']:.3g}"
        L.append(f"| {r['what']} | {r.get('transformers', res['transformers'])} | {r['perplexity']:.4f} | {gap} | {mx} | {t1} | "
                 f"{r['load_s']:.1f} | {r['forward_s']:.1f} |")
    gaps = [r["ppl_gap"] for r in res["rows"] if r.get("ppl_gap") is not None]
    if gaps:
        L += ["", f"Goal (issue 25): the HF directory's perplexity equals load_model's: largest gap {max(gaps):.2g} "
              f"({'met' if max(gaps) == 0 else 'within float32 rounding' if max(gaps) < 1e-3 else 'MISSED'})."]
    return "\n".join(L) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tools/bench_hf.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slice", type=Path, default=None, help="a tools/slice.py output directory (default: slice SmolLM2 s=0.25)")
    ap.add_argument("--slice-note", default=None, help="how --slice was made, for the report")
    ap.add_argument("--work", type=Path, default=Path("/tmp/bench_hf"))
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--text", type=Path, default=DATA / "eval.txt", help="evaluation text (default: tools/data/eval.txt)")
    ap.add_argument("--python441", default=None, help="python of a venv with transformers 4.41 (tools/tc_interop.py --help)")
    ap.add_argument("--json", type=Path, default=TOOLS / "bench_hf_results.json")
    ap.add_argument("--report", type=Path, default=None)
    argv = sys.argv[1:] if argv is None else argv
    a = ap.parse_args(argv)
    require_text(a.text, "bench_hf", "--text")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import transformers

    from machine import cpu_and_memory, python_and_numpy

    t0 = time.time()
    res = measure(a)
    res.update(machine=f"{cpu_and_memory()}; {python_and_numpy()}", date=datetime.date.today().isoformat(),
               command="python tools/bench_hf.py " + " ".join(shlex.quote(x) for x in argv), transformers=transformers.__version__,
               slice_note=a.slice_note or ("python tools/slice.py smollm2 --sparsity 0.25" if a.slice is None else str(a.slice)),
               elapsed_min=(time.time() - t0) / 60)
    a.json.write_text(json.dumps(res, indent=2) + "\n")
    text = render(res)
    if a.report is not None:
        write_section(a.report, text, SECTION)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

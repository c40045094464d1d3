#!/usr/bin/env python3
"""Perplexity on a text (default tools/data/eval.txt), and agreement between two models.

    python tools/evaluate.py MODEL --tokens 65536 [--text FILE] [--compare MODEL2] [--json]

MODEL is `smollm2` (the original), a sliced checkpoint directory, or a .bb container.
Non-overlapping 1024-token windows over the first N tokens; loss over the 1023
predictions of each window; float32 compute.
"""
from __future__ import annotations

import argparse
import base64
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from textdata import DATA, read_text, require_text  # noqa: E402  (tools/data/: eval.txt)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

WINDOW = 1024


def load_any(spec: str):  # type: ignore[no-untyped-def]
    """(model in float32, tokenizer) for 'smollm2', a sliced directory or a .bb file."""
    from transformers import AutoTokenizer

    from bbformat.loader import load_model
    from slice import load_source

    if spec == "smollm2":
        return load_source("smollm2", torch.float32)[:2]
    p = Path(spec)
    model = load_model(p, torch.float32)
    if p.is_dir():
        return model, AutoTokenizer.from_pretrained(str(p))
    from bbformat.reader import Reader

    with Reader(p) as r:
        files = r.metadata.get("files", {})
    with tempfile.TemporaryDirectory() as d:
        for name, data in files.items():
            if name.startswith("tokenizer") or name in ("special_tokens_map.json", "chat_template.jinja", "vocab.json", "merges.txt"):
                (Path(d) / name).write_bytes(base64.b64decode(data))
        return model, AutoTokenizer.from_pretrained(d)


def windows(tok, n_tokens: int, path: Path = DATA / "eval.txt") -> torch.Tensor:  # type: ignore[no-untyped-def]
    text = read_text(path, "evaluate", "--text")
    ids = tok(text, return_tensors="pt").input_ids[0]
    n = (min(n_tokens, ids.numel()) // WINDOW) * WINDOW
    if n == 0:
        raise SystemExit("evaluate: fewer than 1024 tokens requested")
    return ids[:n].reshape(-1, WINDOW)


@torch.no_grad()
def run(model, wins: torch.Tensor, other=None) -> dict:  # type: ignore[no-untyped-def]
    total, count, agree, maxdiff = 0.0, 0, 0, 0.0
    t0 = time.time()
    for w in wins:
        logits = model(w[None]).logits[0, :-1].float()
        loss = torch.nn.functional.cross_entropy(logits, w[1:], reduction="sum")
        total += float(loss)
        count += w.numel() - 1
        if other is not None:
            lo = other(w[None]).logits[0, :-1].float()
            agree += int((lo.argmax(-1) == logits.argmax(-1)).sum())
            maxdiff = max(maxdiff, float((lo - logits).abs().max()))
    out = {"perplexity": math.exp(total / count), "tokens": int(wins.numel()), "predictions": count,
           "windows": int(wins.shape[0]), "seconds": time.time() - t0}
    if other is not None:
        out["top1_agreement"] = agree / count
        out["max_abs_logit_diff"] = maxdiff
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=65536)
    ap.add_argument("--text", type=Path, default=DATA / "eval.txt",
                    help="evaluation text, UTF-8 (default: the repository's tools/data/eval.txt)")
    ap.add_argument("--compare", default=None, help="second model: report top-1 agreement and max |logit diff|")
    ap.add_argument("--json", action="store_true")
    return ap


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    require_text(a.text, "evaluate", "--text")  # before the models load
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    model, tok = load_any(a.model)
    other = load_any(a.compare)[0] if a.compare else None
    res = {"model": a.model, "compare": a.compare, **run(model, windows(tok, a.tokens, a.text), other)}
    if a.json:
        print(json.dumps(res, indent=2))
    else:
        line = f"{a.model}: perplexity {res['perplexity']:.4f} on {res['tokens']} tokens ({res['windows']} windows, {res['seconds']:.0f}s)"
        if other is not None:
            line += f"; vs {a.compare}: top-1 agreement {res['top1_agreement']:.4%}, max |logit diff| {res['max_abs_logit_diff']:.4g}"
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python3
"""Issue 24's design study: how should the entropy stage code a float's exponent field?

    python tools/exponent_study.py CKPT_DIR [--dtypes bfloat16,float16,float32] [--report BENCHMARKS.md] [--json OUT]

CKPT_DIR is a sliced checkpoint (TransformerCompression layout, e.g. tools/slice.py's float32
slice of SmolLM2); every float tensor is cast to each dtype with torch and studied alone, as
a payload codec would see it. For every dtype, in bytes over all tensors:

  * the split fields: sign bits and mantissa bits stored raw, the exponent field (one symbol
    per value: 8 bits for bf16/fp32, 5 for fp16, the sign moved out) coded by
      - order0-ideal: each tensor's empirical entropy (the issue's "ideal order-0" row; no
        table cost, a lower bound no real order-0 coder reaches),
      - order0-adaptive: an adaptive order-0 coder per tensor (Krichevsky-Trofimov counts:
        the exact code length of arithmetic coding with those counts; needs no table),
      - context models, adaptive per context (KT): the previous exponent in the row (order 1),
        the column's class and the row's class (each the quantised log2 RMS of that column or
        row, 16 classes, stored at one byte per column/row and counted), and combinations,
      - real coders on the exponent bytes: zstd -3 and -19 (its Huffman literals), and
        constriction's rANS with a static per-tensor table (12-bit probabilities, table counted
        at 2 bytes per used symbol);
  * the mantissa's top byte coded by zstd -3 (is there anything to take there?);
  * ZipNN 0.5.4 on the same tensors, where installed (bytes over all tensors);
  * bits per weight for each.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

TITLE = "## 14. Issue 24 design study: coding the exponent field (tools/exponent_study.py)"
FIELDS = {"bfloat16": (16, 8, 7), "float16": (16, 5, 10), "float32": (32, 8, 23)}  # width, exponent bits, mantissa bits
CLASSES = 16


def split_fields(bits: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sign 0/1, exponent field, mantissa field) of bit patterns, as integer arrays."""
    width, e_bits, m_bits = FIELDS[dtype]
    b = bits.astype(np.uint32 if width == 32 else np.uint16).astype(np.uint64)
    return (b >> (width - 1)) & 1, (b >> m_bits) & ((1 << e_bits) - 1), b & ((1 << m_bits) - 1)


def entropy_bits(counts: np.ndarray) -> float:
    n = counts.sum()
    p = counts[counts > 0] / n
    return float(-(counts[counts > 0] * np.log2(p)).sum())


_LG2 = 1 / math.log(2)


def kt_bits(counts: np.ndarray, k: int) -> float:
    """Code length of an adaptive KT (add-1/2) order-0 coder over an alphabet of k symbols."""
    n = int(counts.sum())
    if n == 0:
        return 0.0
    c = counts[counts > 0].astype(np.float64)
    from scipy.special import gammaln  # type: ignore[import-untyped]

    return float((gammaln(n + k / 2) - gammaln(k / 2) - (gammaln(c + 0.5) - gammaln(0.5)).sum()) * _LG2)


def kt_context_bits(ctx: np.ndarray, sym: np.ndarray, n_sym: int) -> float:
    """Sum over contexts of the adaptive KT code length of that context's symbols."""
    n_ctx = int(ctx.max()) + 1 if ctx.size else 1
    joint = np.bincount(ctx.astype(np.int64) * n_sym + sym.astype(np.int64), minlength=n_ctx * n_sym).reshape(n_ctx, n_sym)
    from scipy.special import gammaln

    n = joint.sum(axis=1).astype(np.float64)
    used = n > 0
    total = (gammaln(n[used] + n_sym / 2) - gammaln(n_sym / 2)).sum()
    c = joint[joint > 0].astype(np.float64)
    total -= (gammaln(c + 0.5) - gammaln(0.5)).sum()
    return float(total * _LG2)


def rms_class(m: np.ndarray, axis: int) -> np.ndarray:
    """Per column (axis=0) or row (axis=1): the quantised log2 RMS, CLASSES classes over the tensor's range."""
    with np.errstate(divide="ignore"):
        lr = np.log2(np.sqrt(np.mean(m * m, axis=axis)) + 1e-30)
    lo, hi = float(lr.min()), float(lr.max())
    return np.minimum(((lr - lo) / max(hi - lo, 1e-9) * CLASSES).astype(np.int64), CLASSES - 1)


def rans_bytes(sym: np.ndarray, n_sym: int) -> float:
    """constriction's rANS with a static table of the symbol frequencies; table 2 B per used
    symbol. NaN where constriction (not a bbformat dependency) is not installed."""
    try:
        import constriction
    except ImportError:
        return float("nan")

    counts = np.bincount(sym, minlength=n_sym).astype(np.float64)
    used = counts > 0
    if used.sum() <= 1:
        return 2 * int(used.sum())
    probs = counts / counts.sum()
    model = constriction.stream.model.Categorical(probs, perfect=False)
    coder = constriction.stream.stack.AnsCoder()
    coder.encode_reverse(sym.astype(np.int32), model)
    return 4 * len(coder.get_compressed()) + 2 * int(used.sum())


def study_tensor(bits: np.ndarray, dtype: str, zstd: Any) -> dict[str, float]:
    """Bits of each coding of one 2-D tensor (1-D tensors: one row)."""
    width, e_bits, m_bits = FIELDS[dtype]
    n_sym = 1 << e_bits
    m2 = bits.reshape(bits.shape[0], -1) if bits.ndim > 1 else bits.reshape(1, -1)
    sign, exp, mant = split_fields(m2, dtype)
    n = exp.size
    flat = exp.reshape(-1)
    counts = np.bincount(flat.astype(np.int64), minlength=n_sym)
    out: dict[str, float] = {"values": n, "plain": n * width, "sign_mant_raw": n * (1 + m_bits)}
    out["order0-ideal"] = entropy_bits(counts)
    out["order0-adaptive"] = kt_bits(counts, n_sym)
    prev = np.concatenate([np.zeros((exp.shape[0], 1), exp.dtype), exp[:, :-1]], axis=1).reshape(-1)
    out["order1-prev-in-row"] = kt_context_bits(prev, flat, n_sym)
    vals = _values(m2, dtype)
    col = np.broadcast_to(rms_class(vals, 0)[None, :], exp.shape).reshape(-1) if exp.shape[0] > 1 else np.zeros(n, np.int64)
    row = np.broadcast_to(rms_class(vals, 1)[:, None], exp.shape).reshape(-1)
    side = 8 * (exp.shape[0] + exp.shape[1])  # one class byte per row and per column
    out["ctx-column-class"] = kt_context_bits(col, flat, n_sym) + 8 * exp.shape[1]
    out["ctx-row-class"] = kt_context_bits(row, flat, n_sym) + 8 * exp.shape[0]
    out["ctx-row×column-class"] = kt_context_bits(row * CLASSES + col, flat, n_sym) + side
    out["ctx-column-class×prev"] = kt_context_bits(col * n_sym + prev, flat, n_sym) + 8 * exp.shape[1]
    e8 = flat.astype(np.uint8).tobytes()
    out["zstd-3"] = 8 * len(zstd[3].compress(e8))
    out["zstd-19"] = 8 * len(zstd[19].compress(e8))
    out["rans-static-order0"] = 8 * rans_bytes(flat.astype(np.int64), n_sym)
    top = (mant.reshape(-1) >> max(0, m_bits - 8)).astype(np.uint8).tobytes()
    out["mantissa-top-byte-zstd3"] = 8 * len(zstd[3].compress(top)) + n * max(0, m_bits - 8)
    return out


def _values(m2: np.ndarray, dtype: str) -> np.ndarray:
    from bbformat.codec.dtypes import bits_to_f64

    with np.errstate(over="ignore", invalid="ignore"):
        v = bits_to_f64(m2, dtype)
    return np.where(np.isfinite(v), v, 0.0)


def zipnn_bits(bits: np.ndarray, dtype: str, codecs: dict[str, Any]) -> int | None:
    try:
        import zipnn
    except ImportError:
        return None
    if dtype not in codecs:
        codecs[dtype] = zipnn.ZipNN(input_format="byte", bytearray_dtype=dtype, threads=1)
    return 8 * len(codecs[dtype].compress(np.ascontiguousarray(bits).astype(bits.dtype.newbyteorder("<")).tobytes()))


def load_tensors(ckpt: Path) -> dict[str, Any]:
    import torch

    from bbformat.checkpoint import read_checkpoint

    with read_checkpoint(ckpt) as c:
        return {k: v.detach().to(torch.float32).clone() for k, v in c.state_dict.items() if v.is_floating_point()}


def study(ckpt: Path, dtypes: list[str]) -> dict[str, Any]:
    import torch
    import zstandard

    from bbformat.tensors import torch_to_raw

    zstd = {lvl: zstandard.ZstdCompressor(level=lvl) for lvl in (3, 19)}
    tensors = load_tensors(ckpt)
    res: dict[str, Any] = {"checkpoint": str(ckpt), "tensors": len(tensors), "dtypes": {}}
    for dt in dtypes:
        t0 = time.perf_counter()
        tot: dict[str, float] = {}
        zip_total: int | None = 0
        codecs: dict[str, Any] = {}
        for name, t in tensors.items():
            raw = torch_to_raw(t.to(getattr(torch, dt)).contiguous(), name)
            for k, v in study_tensor(raw.bits, dt, zstd).items():
                tot[k] = tot.get(k, 0.0) + v
            z = zipnn_bits(raw.bits, dt, codecs)
            zip_total = None if z is None or zip_total is None else zip_total + z
        tot["zipnn"] = zip_total if zip_total is not None else float("nan")
        res["dtypes"][dt] = {"bits": tot, "seconds": time.perf_counter() - t0}
    return res


ROWS = [("order0-ideal", "exponent: ideal order-0 per tensor (no table; lower bound)"),
        ("order0-adaptive", "exponent: adaptive order-0 per tensor (KT)"),
        ("order1-prev-in-row", "exponent: adaptive, context = previous exponent in the row"),
        ("ctx-column-class", "exponent: adaptive, context = column's RMS class (16; 1 B/column counted)"),
        ("ctx-row-class", "exponent: adaptive, context = row's RMS class (16; 1 B/row counted)"),
        ("ctx-row×column-class", "exponent: adaptive, context = row class × column class"),
        ("ctx-column-class×prev", "exponent: adaptive, context = column class × previous exponent"),
        ("zstd-3", "exponent bytes through zstd -3 (real)"),
        ("zstd-19", "exponent bytes through zstd -19 (real)"),
        ("rans-static-order0", "exponent through constriction rANS, static per-tensor table (real)")]


def section(res: dict[str, Any], machine: str, command: str) -> list[str]:
    lines = [TITLE, "", f"Machine: {machine}. Command: `{command}` ({time.strftime('%Y-%m-%d')}). Input: {res['checkpoint']} "
             f"({res['tensors']} float tensors), each cast with torch to the dtype and studied as one array. Every row is the whole "
             "model: sign and mantissa bits raw plus the exponent coded as the row says, as % of the plain bytes and in bits per "
             "weight. Adaptive rows are exact code lengths of an arithmetic coder with Krichevsky-Trofimov counts (what such a coder "
             "writes, to within a few bytes per context), not measured files; rows marked real are measured bytes.", ""]
    for dt, d in res["dtypes"].items():
        b = d["bits"]
        plain, n, sm = b["plain"], b["values"], b["sign_mant_raw"]
        lines += [f"### {dt}", "", "| coding | % of plain | bits per weight |", "|---|---|---|"]
        for key, label in ROWS:
            if math.isnan(b[key]):
                lines.append(f"| {label} | not run: constriction not installed | |")
                continue
            total = sm + b[key]
            lines.append(f"| {label} | {100 * total / plain:.2f} | {total / n:.3f} |")
        mt = b["mantissa-top-byte-zstd3"] + sm - FIELDS[dt][2] * n + b["order0-adaptive"]
        lines.append(f"| exponent adaptive order-0, mantissa's top byte through zstd -3 (real) | {100 * mt / plain:.2f} | {mt / n:.3f} |")
        if not math.isnan(b["zipnn"]):
            lines.append(f"| ZipNN 0.5.4, tensor by tensor (real) | {100 * b['zipnn'] / plain:.2f} | {b['zipnn'] / n:.3f} |")
        lines.append("")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ckpt", type=Path)
    ap.add_argument("--dtypes", default="bfloat16,float16,float32")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--report", type=Path, help="markdown file whose section 14 to write (default: print)")
    a = ap.parse_args(argv)
    res = study(a.ckpt, [d for d in a.dtypes.split(",") if d])
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))
    from machine import cpu_and_memory, python_and_numpy

    lines = section(res, f"{cpu_and_memory()}; {python_and_numpy()}", "python tools/exponent_study.py " + " ".join(argv or sys.argv[1:]))
    if a.report:
        import mdsection

        mdsection.write_section(a.report, "\n".join(lines), TITLE)
    else:
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

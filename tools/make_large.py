#!/usr/bin/env python3
"""Write a synthetic SliceGPT-sliced checkpoint at real model shapes, streamed to disk.

    python tools/make_large.py OUT_DIR --preset llama-2-7b|opt-13b|tiny-llama|tiny-opt
        [--layers N] [--format pt|safetensors|both] [--sparsity 0.25]
        [--dtype float16|bfloat16|float32] [--seed 0] [--key-order tiny|tc]
        [--hidden N] [--intermediate N] [--vocab N] [--heads N] [--kv-heads N] [--max-positions N]

OUT_DIR (absent or empty) gets TransformerCompression's layout, what `bbformat pack` reads:
<stem>.pt and/or <stem>.safetensors, <stem>.json (the SlicingConfig, one line), config.json
(the real model's Hugging Face config; num_hidden_layers = --layers) and
generation_config.json, with stem = f"{model name}_{sparsity}" (e.g. Llama-2-7b-hf_0.25).

Shapes: TC's ConstSlicingScheduler, do_slice_head=False: every residual width is
d = int((1 - sparsity) * hidden) rounded down to a multiple of 8 (7B: 3072, 13B: 3840),
except the last layer's MLP output and the head's input, which keep the full hidden size.
Key order: bbformat.testing.make_tiny_checkpoint's (`--key-order tiny`, the default), or
torch's state_dict order of TC's modules as bbformat/checkpoint/__init__.py describes it
(`--key-order tc`: each layer's mlp_shortcut_Q and attn_shortcut_Q first; OPT k, v, q).

Values, float64 then cast, seeded per tensor name (same seed, same bytes on one machine):
* weights and biases: normal, std 0.05 for the linears reading the residual stream (q/k/v,
  gate/up, fc1), 0.02 for those writing it (o, down, fc2) and for biases, 0.5 for token
  embeddings, 0.2 for OPT's positions, 0.3 for the head; index j of every residual-stream
  axis (width w) is scaled by s_j = (1 + 4 j / w) ** -0.5 (1 down to about 0.45), the
  decaying spectrum of PCA-rotated weights: Gram matrices along that axis have distinct,
  decreasing eigenvalues;
* shortcuts: attn_shortcut_Q (d_in, d_attn) and mlp_shortcut_Q (d_attn, d_mlp) are the
  leading blocks R[:a, :b] of random orthogonal hidden x hidden matrices R, i.e. TC's
  Q_i[:, :a].T @ Q_{i+1}[:, :b] for the bases Q_0 = I, Q_{i+1} = Q_i R_i. Each R is a
  product P3 (A2 x B2) P2 (A1 x B1) P1 of random permutations and Kronecker products of
  Haar orthogonal p x p and q x q matrices (QR of Gaussians; hidden = p q, p the largest
  divisor <= sqrt(hidden)): dense and orthogonal to float64 rounding, for O(hidden^2 (p + q))
  work instead of a hidden x hidden QR.

Streaming: each tensor is generated in row blocks of at most 64 MiB of float64 (two at a
time, on two threads), cast into the output tensor, written to every output file and
dropped, so the peak memory is about the largest tensor plus two blocks (glibc's mmap
threshold is fixed at 1 MiB so that freed blocks go back to the OS, see fixed_mmap_threshold). Files are written
into a staging directory `.OUT_DIR.bbtmp-<hex>` next to OUT_DIR, fsynced, and renamed to
OUT_DIR at the end. Prints the files written, their sizes, the wall time and VmHWM.
Bad options: one line on stderr, exit 2. A failed write: one line, exit 8.
"""
from __future__ import annotations

import time

_STARTED = time.monotonic()  # before numpy and torch are imported

import argparse
import hashlib
import json
import math
import os
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, NoReturn

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bbformat import fsutil  # noqa: E402
from bbformat.errors import BBFormatError, output_error  # noqa: E402
from bbformat.stream_writers import SafetensorsWriter, TorchZipWriter  # noqa: E402

BLOCK_VALUES = 8 << 20  # float64 values per generated block: 64 MiB
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
PRESETS: dict[str, dict[str, Any]] = {
    "llama-2-7b": {"arch": "llama", "name": "Llama-2-7b-hf", "hidden": 4096, "layers": 32, "heads": 32, "kv_heads": 32,
                   "intermediate": 11008, "vocab": 32000, "max_positions": 4096},
    "opt-13b": {"arch": "opt", "name": "opt-13b", "hidden": 5120, "layers": 40, "heads": 40, "intermediate": 20480,
                "vocab": 50272, "max_positions": 2048},
    "tiny-llama": {"arch": "llama", "name": "tiny-llama", "hidden": 64, "layers": 2, "heads": 4, "kv_heads": 4,
                   "intermediate": 176, "vocab": 128, "max_positions": 64},
    "tiny-opt": {"arch": "opt", "name": "tiny-opt", "hidden": 80, "layers": 2, "heads": 4, "intermediate": 320,
                 "vocab": 128, "max_positions": 64},
}


class UsageError(Exception):
    """A bad option: one line, exit 2."""


@dataclass(frozen=True)
class Model:
    arch: str
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    max_positions: int


@dataclass(frozen=True)
class Spec:
    """One tensor: name, shape, and how to fill it."""

    name: str
    shape: tuple[int, ...]
    std: float = 0.0  # normal std; 0 marks a shortcut (an orthogonal block)
    axis: int | None = None  # the residual-stream axis, scaled by the decay


# ---------------------------------------------------------------------------- configs


def hf_config(m: Model, dtype: str) -> dict[str, Any]:
    """config.json: the real model's Hugging Face config values (num_hidden_layers = m.layers)."""
    if m.arch == "llama":
        return {"_name_or_path": f"meta-llama/{m.name}", "architectures": ["LlamaForCausalLM"], "attention_bias": False,
                "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": m.hidden,
                "initializer_range": 0.02, "intermediate_size": m.intermediate, "max_position_embeddings": m.max_positions,
                "model_type": "llama", "num_attention_heads": m.heads, "num_hidden_layers": m.layers,
                "num_key_value_heads": m.kv_heads, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None,
                "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": dtype,
                "transformers_version": "4.31.0.dev0", "use_cache": True, "vocab_size": m.vocab}
    return {"_name_or_path": f"facebook/{m.name}", "_remove_final_layer_norm": False, "activation_dropout": 0.0,
            "activation_function": "relu", "architectures": ["OPTForCausalLM"], "attention_dropout": 0.0,
            "bos_token_id": 2, "do_layer_norm_before": True, "dropout": 0.1, "enable_bias": True, "eos_token_id": 2,
            "ffn_dim": m.intermediate, "hidden_size": m.hidden, "init_std": 0.02, "layer_norm_elementwise_affine": True,
            "layerdrop": 0.0, "max_position_embeddings": m.max_positions, "model_type": "opt",
            "num_attention_heads": m.heads, "num_hidden_layers": m.layers, "output_projection": True, "pad_token_id": 1,
            "prefix": "</s>", "torch_dtype": dtype, "transformers_version": "4.21.0.dev0", "use_cache": True,
            "vocab_size": m.vocab, "word_embed_proj_dim": m.hidden}


def generation_config(m: Model) -> dict[str, Any]:
    if m.arch == "llama":
        return {"bos_token_id": 1, "do_sample": True, "eos_token_id": 2, "max_length": m.max_positions, "pad_token_id": 0,
                "temperature": 0.6, "top_p": 0.9, "transformers_version": "4.31.0.dev0"}
    return {"_from_model_config": True, "bos_token_id": 2, "eos_token_id": 2, "pad_token_id": 1,
            "transformers_version": "4.27.0.dev0"}


def residual_width(hidden: int, sparsity: float) -> int:
    """TC: int((1 - sparsity) * hidden), rounded down to a multiple of 8 (round_interval)."""
    d = int((1 - sparsity) * hidden)
    return d - d % 8


def slicing_config(m: Model, d: int) -> dict[str, Any]:
    """TC's SlicingConfig for ConstSlicingScheduler(d), do_slice_head=False, fields in TC's order."""
    layers = range(m.layers)
    d_mlp = [d] * (m.layers - 1) + [m.hidden]
    d_in = [d] + d_mlp[:-1]
    return {"hidden_size": m.hidden, "layers_num": m.layers, "do_slice_head": False, "parallel_blocks": False,
            "embedding_dimensions": {"0": d, "1": d} if m.arch == "opt" else {"0": d},
            "attention_input_dimensions": {str(i): d_in[i] for i in layers},
            "attention_output_dimensions": {str(i): d for i in layers},
            "mlp_input_dimensions": {str(i): d for i in layers},
            "mlp_output_dimensions": {str(i): d_mlp[i] for i in layers},
            "head_dimension": m.hidden, "const_dimension": None}


# ---------------------------------------------------------------------------- tensor plan


def _layer_specs(m: Model, i: int, d_in: int, d: int, d_out: int, key_order: str) -> list[Spec]:
    """One decoder layer's tensors, in make_tiny_checkpoint's order (or TC's)."""
    f = m.intermediate
    shortcuts = [Spec("attn_shortcut_Q", (d_in, d)), Spec("mlp_shortcut_Q", (d, d_out))]
    if m.arch == "llama":
        hd = m.hidden // m.heads
        attn = {w: Spec(f"self_attn.{w}_proj.weight", (n * hd, d_in), 0.05, 1)
                for w, n in (("q", m.heads), ("k", m.kv_heads), ("v", m.kv_heads))}
        body = [attn["q"], attn["k"], attn["v"], Spec("self_attn.o_proj.weight", (d, m.heads * hd), 0.02, 0),
                Spec("mlp.gate_proj.weight", (f, d), 0.05, 1), Spec("mlp.up_proj.weight", (f, d), 0.05, 1),
                Spec("mlp.down_proj.weight", (d_out, f), 0.02, 0)]
    else:
        qkv = {w: [Spec(f"self_attn.{w}_proj.weight", (m.hidden, d_in), 0.05, 1),
                   Spec(f"self_attn.{w}_proj.bias", (m.hidden,), 0.02, None)] for w in "qkv"}
        order = "kvq" if key_order == "tc" else "qkv"
        body = [s for w in order for s in qkv[w]]
        body += [Spec("self_attn.out_proj.weight", (d, m.hidden), 0.02, 0), Spec("self_attn.out_proj.bias", (d,), 0.02, 0),
                 Spec("fc1.weight", (f, d), 0.05, 1), Spec("fc1.bias", (f,), 0.02, None),
                 Spec("fc2.weight", (d_out, f), 0.02, 0), Spec("fc2.bias", (d_out,), 0.02, 0)]
    specs = shortcuts[::-1] + body if key_order == "tc" else body + shortcuts
    prefix = f"model.layers.{i}." if m.arch == "llama" else f"model.decoder.layers.{i}."
    return [Spec(prefix + s.name, s.shape, s.std, s.axis) for s in specs]


def plan(m: Model, d: int, key_order: str = "tiny") -> list[Spec]:
    """Every tensor of the sliced model, in file order."""
    if m.arch == "llama":
        specs = [Spec("model.embed_tokens.weight", (m.vocab, d), 0.5, 1)]
    else:
        specs = [Spec("model.decoder.embed_tokens.weight", (m.vocab, d), 0.5, 1),
                 Spec("model.decoder.embed_positions.weight", (m.max_positions + 2, d), 0.2, 1)]
    for i in range(m.layers):
        d_out = m.hidden if i == m.layers - 1 else d
        specs += _layer_specs(m, i, d, d, d_out, key_order)
    specs.append(Spec("lm_head.weight", (m.vocab, m.hidden), 0.3, 1))
    if m.arch == "opt":  # TC fuses the final LayerNorm's bias into a new head bias
        specs.append(Spec("lm_head.bias", (m.vocab,), 0.02, None))
    return specs


# ---------------------------------------------------------------------------- values


def _rng(seed: int, name: str, *more: int) -> np.random.Generator:
    """A generator of its own for each tensor (and block): values do not depend on order."""
    key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:16], "little")
    return np.random.default_rng([seed, key, *more])


def decay(w: int) -> np.ndarray:
    """s_j = (1 + 4 j / w) ** -0.5: the scale of index j of a residual axis of width w."""
    return (1.0 + 4.0 * np.arange(w) / w) ** -0.5


def _block(seed: int, spec: Spec, k: int, r0: int, r1: int, cols: int) -> np.ndarray:
    """Rows r0:r1 of the (rows, cols) view of a normal tensor (block k), float64, scaled."""
    out = _rng(seed, spec.name, k).standard_normal((r1 - r0, cols))
    out *= spec.std
    if spec.axis is not None and spec.axis == len(spec.shape) - 1:
        out *= decay(cols)[None, :]
    elif spec.axis is not None:  # the rows of a matrix
        out *= decay(spec.shape[0])[r0:r1, None]
    return out


def normal_tensor(spec: Spec, seed: int, dtype: torch.dtype, pool: ThreadPoolExecutor) -> torch.Tensor:
    """Generated two row blocks at a time (two threads), each cast into the output at once."""
    cols = spec.shape[-1] if spec.shape else 1
    rows = math.prod(spec.shape) // cols if cols else 0
    out = torch.empty(spec.shape, dtype=dtype)
    view = out.view(rows, cols)
    step = max(1, BLOCK_VALUES // max(cols, 1))
    starts = list(range(0, rows, step))
    for i in range(0, len(starts), 2):
        jobs = [(k, r0, min(r0 + step, rows)) for k, r0 in enumerate(starts[i : i + 2], start=i)]
        pending = [(r0, r1, pool.submit(_block, seed, spec, k, r0, r1, cols)) for k, r0, r1 in jobs]
        while pending:  # each block is dropped once copied, before the next pair starts
            r0, r1, fut = pending.pop(0)
            view[r0:r1].copy_(torch.from_numpy(fut.result()))
            del fut
    return out


def _haar(rng: np.random.Generator, n: int) -> np.ndarray:
    """A Haar-random orthogonal n x n matrix (QR of a Gaussian, R's diagonal made positive)."""
    a = torch.from_numpy(rng.standard_normal((n, n)))
    q, r = torch.linalg.qr(a)
    out: np.ndarray = (q * torch.sign(torch.diagonal(r))).numpy()
    return out


def _kron_apply(x: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(a kron b) @ x for x of shape (p q, m), without forming the Kronecker product."""
    p, q, m = a.shape[0], b.shape[0], x.shape[1]
    y = (a @ x.reshape(p, q * m)).reshape(p, q, m)
    out: np.ndarray = np.matmul(b, y).reshape(p * q, m)
    return out


def orthogonal_block(rng: np.random.Generator, n: int, a: int, b: int, dtype: torch.dtype) -> torch.Tensor:
    """R[:a, :b] of a random dense orthogonal n x n matrix R = P3 K2 P2 K1 P1 (K: Kronecker
    products of Haar factors, P: row permutations), computed as R @ I[:, :b] a block of
    columns at a time (at most BLOCK_VALUES float64 values each)."""
    p = max(k for k in range(1, math.isqrt(n) + 1) if n % k == 0)
    q = n // p
    perms = [rng.permutation(n) for _ in range(3)]
    kron = [(_haar(rng, p), _haar(rng, q)) for _ in range(2)]
    out = torch.empty((a, b), dtype=dtype)
    step = max(1, BLOCK_VALUES // n)
    for c0 in range(0, b, step):
        x = _eye_columns(n, c0, min(b, c0 + step))
        for (fa, fb), perm in zip(kron, perms):
            x = _kron_apply(x[perm], fa, fb)
        out[:, c0 : c0 + step].copy_(torch.from_numpy(x[perms[2][:a]]))
    return out


def _eye_columns(n: int, c0: int, c1: int) -> np.ndarray:
    """Columns c0:c1 of the n x n identity."""
    x = np.zeros((n, c1 - c0))
    x[np.arange(c0, c1), np.arange(c1 - c0)] = 1.0
    return x


def make_tensor(spec: Spec, m: Model, seed: int, dtype: torch.dtype, pool: ThreadPoolExecutor) -> torch.Tensor:
    if spec.std:
        return normal_tensor(spec, seed, dtype, pool)
    return orthogonal_block(_rng(seed, spec.name), m.hidden, spec.shape[0], spec.shape[1], dtype)


# ---------------------------------------------------------------------------- writing


def fixed_mmap_threshold(nbytes: int = 1 << 20) -> None:
    """glibc: serve every allocation of at least `nbytes` by mmap and return it on free. Its
    default threshold adapts upwards (to 32 MiB) after frees, and then blocks and tensors
    of a few MiB land in per-thread heaps that fragment: the peak varied by ~150 MiB."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").mallopt(-3, nbytes)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


def vm_hwm() -> int:
    """Peak resident set of this process in bytes (VmHWM from /proc/self/status; 0 if unknown)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


class Outputs:
    """The weights files being written: a SafetensorsWriter and/or a TorchZipWriter."""

    def __init__(self, stage: Path, stem: str, fmt: str, specs: list[Spec], dtype: torch.dtype) -> None:
        self.paths: list[Path] = []
        self._st_file: BinaryIO | None = None
        self._st: SafetensorsWriter | None = None
        self._pt: TorchZipWriter | None = None
        if fmt in ("safetensors", "both"):
            self.paths.append(stage / f"{stem}.safetensors")
            self._st_file = open(self.paths[-1], "xb")
            self._st = SafetensorsWriter(self._st_file, [(s.name, dtype, s.shape) for s in specs], {"format": "pt"})
        if fmt in ("pt", "both"):
            self.paths.append(stage / f"{stem}.pt")
            self._pt = TorchZipWriter(self.paths[-1], [s.name for s in specs])

    def write(self, name: str, t: torch.Tensor) -> None:
        for w in (self._st, self._pt):
            if w is not None:
                w.write(name, t)

    def finish(self) -> None:
        if self._st is not None and self._st_file is not None:
            self._st.finish()
            os.fsync(self._st_file.fileno())
            self._st_file.close()
        if self._pt is not None:
            self._pt.finish()

    def abort(self) -> None:
        if self._pt is not None:
            self._pt.abort()
        if self._st_file is not None:
            self._st_file.close()


def _check_target(out: Path) -> None:
    if os.path.lexists(out) and (out.is_symlink() or not out.is_dir()):
        raise UsageError(f"{out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        raise UsageError(f"{out} exists and is not empty; give a new or empty directory")


def write_checkpoint(out: Path, m: Model, d: int, stem: str, fmt: str, dtype_name: str, seed: int,
                     key_order: str) -> list[Path]:
    """Generate and write everything into a staging directory, then rename it to OUT."""
    _check_target(out)
    specs = plan(m, d, key_order)
    sides = {"config.json": json.dumps(hf_config(m, dtype_name), indent=2, sort_keys=True) + "\n",
             f"{stem}.json": json.dumps(slicing_config(m, d)),
             "generation_config.json": json.dumps(generation_config(m), indent=2, sort_keys=True) + "\n"}
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = out.parent / fsutil.temp_name(out.name)
    os.mkdir(stage)
    outputs: Outputs | None = None
    try:
        for name, text in sides.items():
            _write_synced(stage / name, text.encode())
        outputs = Outputs(stage, stem, fmt, specs, DTYPES[dtype_name])
        with ThreadPoolExecutor(2) as pool:
            for spec in specs:
                t = make_tensor(spec, m, seed, DTYPES[dtype_name], pool)
                outputs.write(spec.name, t)
                del t
        outputs.finish()
        fsutil.fsync_dir(stage)
        os.replace(stage, out)  # onto an absent or empty OUT
    except BaseException:
        if outputs is not None:
            outputs.abort()
        shutil.rmtree(stage, ignore_errors=True)
        raise
    fsutil.fsync_dir(out.parent)
    fsutil.remove_stale_temps(out.parent, out.name)
    return sorted(out / p.name for p in [*map(Path, sides), *outputs.paths])


# ---------------------------------------------------------------------------- command line


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid positive integer: {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {v}")
    return v


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = _Parser(prog="make_large", description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("out", type=Path, help="output directory (absent or empty)")
    p.add_argument("--preset", choices=sorted(PRESETS), required=True, help="model shapes and config")
    p.add_argument("--layers", type=_positive, help="decoder layers (default: the preset's)")
    p.add_argument("--format", choices=("pt", "safetensors", "both"), default="safetensors")
    p.add_argument("--sparsity", type=float, default=0.25, help="SliceGPT sparsity, 0 <= s < 1 (default 0.25)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float16")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--key-order", choices=("tiny", "tc"), default="tiny",
                   help="tensor order: make_tiny_checkpoint's (default) or TC's state_dict order")
    for flag in ("hidden", "intermediate", "vocab", "heads", "kv-heads", "max-positions"):
        p.add_argument(f"--{flag}", type=_positive, help=f"override the preset's {flag.replace('-', ' ')}")
    return p.parse_args(argv)


def model_of(a: argparse.Namespace) -> Model:
    """The preset with the overrides, checked."""
    base = dict(PRESETS[a.preset])
    for key in ("layers", "hidden", "intermediate", "vocab", "heads", "kv_heads", "max_positions"):
        if getattr(a, key) is not None:
            base[key] = getattr(a, key)
    if base["arch"] == "opt":
        base["kv_heads"] = base["heads"]
    elif a.heads is not None and a.kv_heads is None:
        base["kv_heads"] = base["heads"]  # the presets have no grouped-query attention
    m = Model(**base)
    if m.hidden % m.heads:
        raise UsageError(f"--hidden {m.hidden} is not a multiple of --heads {m.heads}")
    if m.heads % m.kv_heads:
        raise UsageError(f"--heads {m.heads} is not a multiple of --kv-heads {m.kv_heads}")
    if m.arch == "opt" and a.kv_heads is not None:
        raise UsageError("--kv-heads applies to Llama presets only")
    return m


def main(argv: list[str] | None = None) -> int:
    fixed_mmap_threshold()
    try:
        a = parse(argv)
        m = model_of(a)
        if not 0 <= a.sparsity < 1 or not math.isfinite(a.sparsity):
            raise UsageError(f"--sparsity must be in [0, 1), not {a.sparsity}")
        if a.seed < 0:
            raise UsageError(f"--seed must be non-negative, not {a.seed}")
        d = residual_width(m.hidden, a.sparsity)
        if d < 8:
            raise UsageError(f"sparsity {a.sparsity} leaves a residual width of {d} of {m.hidden}; at least 8 is needed")
        stem = f"{m.name}_{a.sparsity}"
        files = write_checkpoint(a.out, m, d, stem, a.format, a.dtype, a.seed, a.key_order)
    except UsageError as exc:
        print(f"make_large: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"make_large: error: {output_error(exc, a.out)}", file=sys.stderr)
        return 8
    except BBFormatError as exc:
        print(f"make_large: error: {exc}", file=sys.stderr)
        return exc.exit_status
    n = sum(math.prod(s.shape) for s in plan(m, d))
    print(f"wrote {a.out}: {a.preset} as {stem}, {m.layers} layers, hidden {m.hidden} -> residual width {d}, "
          f"{a.dtype}, {len(plan(m, d))} tensors, {n:,} values")
    for p in files:
        print(f"  {p.name:<40} {p.stat().st_size:>16,} bytes")
    print(f"time {time.monotonic() - _STARTED:.1f} s, VmHWM {vm_hwm() / 2**20:,.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

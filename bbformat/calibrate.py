"""Second moments of the inputs of the tensors a pack rotates, from calibration text.

With them the encoder rounds rotated tensors with error feedback (codec/rounding.py), so
the stored rotated model stays closer to the input model's function. Encoder only: the
container format and decoders are unaffected. Llama only (it runs the sliced model).
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .adapters.torch_models import build_model, require_transformers
from .adapters.llama import NAMES
from .checkpoint import Checkpoint
from .codec.encoder import Moments
from .codec.rounding import quantize_moment
from .errors import InputError, UnsupportedModelError
from .loader import fill_model

DEFAULT_SAMPLES = 16
DEFAULT_SEQLEN = 512
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                    "tokenizer.model", "added_tokens.json", "chat_template.jinja")


def check_calibratable(ckpt: Checkpoint) -> None:
    if ckpt.hf_config.get("model_type") != "llama":
        raise UnsupportedModelError(f"calibrated rounding supports Llama models; this is {ckpt.hf_config.get('model_type')!r}")
    require_transformers("calibration")


def calibration_tokens(ckpt: Checkpoint, text_path: str | os.PathLike[str], samples: int = DEFAULT_SAMPLES,
                       seqlen: int = DEFAULT_SEQLEN) -> torch.Tensor:
    """The first samples × seqlen tokens of a UTF-8 text, with the checkpoint's tokenizer."""
    require_transformers("calibration")
    from transformers import AutoTokenizer

    if samples < 1 or seqlen < 2:
        raise InputError(f"calibration needs samples >= 1 and seqlen >= 2, got {samples} x {seqlen}")
    try:
        text = Path(text_path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read calibration text {text_path}: {exc}") from None
    files = {n: b for n, b in ckpt.extra_files.items() if n in _TOKENIZER_FILES}
    if not files:
        raise InputError("calibration needs the checkpoint's tokenizer files (tokenizer.json, ...)")
    with tempfile.TemporaryDirectory() as d:
        for n, b in files.items():
            (Path(d) / n).write_bytes(b)
        try:
            tok = AutoTokenizer.from_pretrained(d)
        except Exception as exc:  # noqa: BLE001 - any tokenizer failure is a bad input
            raise InputError(f"cannot load the checkpoint's tokenizer: {exc}") from None
    ids: torch.Tensor = tok(text, return_tensors="pt").input_ids[0]
    need = samples * seqlen
    if ids.numel() < need:
        raise InputError(f"calibration text has {ids.numel()} tokens, fewer than {samples} x {seqlen}")
    return ids[:need].reshape(samples, seqlen)


@torch.no_grad()
def stream_moments(ckpt: Checkpoint, batches: torch.Tensor) -> Moments:
    """Per rotated tensor, (axis, E[x xᵀ]) of the inputs along its residual-stream axis:
    the raw stream for the shortcut matrices (axis 0), the normalised stream for the
    q/k/v and gate/up projections (axis 1). float64 accumulation; rounded to 10
    significant bits so rounding decisions do not hinge on the last bits."""
    check_calibratable(ckpt)
    model = build_model(ckpt.hf_config, ckpt.slicing_config, torch.float32, list(ckpt.state_dict))
    fill_model(model, ckpt.state_dict.items(), {n for n, _ in model.named_parameters()})
    hidden = int(ckpt.hf_config["hidden_size"])
    config: Any = model.config  # hf_modeling.SlicedConfig
    eps = float(config.sliced_norm_eps)
    vocab = int(config.vocab_size)
    layers = list(model.get_submodule("model.layers").children())
    if batches.dim() != 2 or batches.numel() == 0 or int(batches.min()) < 0 or int(batches.max()) >= vocab:
        raise InputError(f"calibration tokens must be a non-empty (samples, seqlen) tensor of ids in [0, {vocab})")
    raw: dict[str, torch.Tensor] = {}
    normed: dict[str, torch.Tensor] = {}

    def add(key: str, x: torch.Tensor) -> None:
        x = x.detach().double().reshape(-1, x.shape[-1])
        xn = x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) / hidden + eps)
        raw[key] = raw[key] + x.T @ x if key in raw else x.T @ x
        normed[key] = normed[key] + xn.T @ xn if key in normed else xn.T @ xn

    hooks = []
    for i, layer in enumerate(layers):
        hooks.append(layer.register_forward_pre_hook(lambda m, a, i=i: add(f"attn.{i}", a[0])))  # the stream in
        hooks.append(layer.get_submodule("post_attention_layernorm").register_forward_pre_hook(
            lambda m, a, i=i: add(f"mlp.{i}", a[0])))
    try:
        for b in batches:
            model(b[None].long())
    finally:
        for h in hooks:
            h.remove()
    count = int(batches.numel())
    out: Moments = {}
    up, gate = NAMES.up
    for i in range(len(layers)):
        a_raw, a_n = (quantize_moment(raw[f"attn.{i}"].numpy() / count), quantize_moment(normed[f"attn.{i}"].numpy() / count))
        m_raw, m_n = (quantize_moment(raw[f"mlp.{i}"].numpy() / count), quantize_moment(normed[f"mlp.{i}"].numpy() / count))
        out[NAMES.at(i, NAMES.attn_q)] = (0, a_raw)
        out[NAMES.at(i, NAMES.mlp_q)] = (0, m_raw)
        for n in NAMES.attn_in:  # q, k, v read the normed stream entering the layer
            out[NAMES.at(i, n)] = (1, a_n)
        for n in (gate, up):  # and the MLP's inputs the normed stream after attention
            out[NAMES.at(i, n)] = (1, m_n)
    return {k: v for k, v in out.items() if k in ckpt.state_dict and np.all(np.isfinite(v[1]))}

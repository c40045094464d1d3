"""What a SliceGPT-sliced decoder looks like, whatever the architecture: per-layer
tensor names and shapes, the residual-stream rotation sites, and the chunk layouts
of both schemes."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from ..checkpoint import Checkpoint, MappedWeights
from ..codec import host_native
from ..codec.layout import ChunkLayout, ModelLayout, SiteSpec
from ..container.program import AxisRef
from ..errors import InputError, UnsupportedModelError

# Derived buffers some transformers versions keep in state dicts: stored as-is.
IGNORABLE = re.compile(r".*rotary_emb\.inv_freq$")
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class Names:
    """State-dict names of one architecture (layer-relative names are appended to `layer`)."""

    embed: str
    positions: str | None
    head: str
    head_bias: str | None
    layer: str  # format string with {i}
    attn_in: tuple[str, ...]  # attention input projections in push order: (q, k, v) or (qkv,)
    o: str
    up: tuple[str, ...]  # MLP input projections in push order: (up, gate), (fc1,) or (gate_up,)
    down: str
    attn_q: str = "attn_shortcut_Q"
    mlp_q: str = "mlp_shortcut_Q"  # unused when parallel
    # attention and MLP read the same normed input and both write the layer's output, with one
    # shortcut (attn_q) per layer (Phi-2)
    parallel: bool = False
    # norm parameters TC never leaves (RMSN is parameter-free); tolerated only as identities
    layer_norms: tuple[str, ...] = ()
    final_norms: tuple[str, ...] = ()
    # bias of each role, layer-relative; optional in the state dict, checked when present
    biases: dict[str, str] = field(default_factory=dict)

    def prefix(self, i: int) -> str:
        """Layer i's prefix, e.g. "model.layers.3."."""
        return self.layer.format(i=i)

    def at(self, i: int, rel: str) -> str:
        """The full name of layer i's tensor `rel` (a layer-relative name, e.g. self.o)."""
        return self.prefix(i) + rel


@dataclass
class Dims:
    emb: int
    d_in: list[int]
    d_attn: list[int]
    d_mlp: list[int]
    head: int


def config_int(hf: dict[str, Any], key: str, default: int | None = None) -> int:
    """A positive integer field of config.json (null or absent: `default`, if there is one)."""
    v = hf.get(key)
    if v is None and default is not None:
        return default
    if v is None:
        raise UnsupportedModelError(f"config.json lacks {key}")
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise UnsupportedModelError(f"config.json field {key} must be a positive integer, not {v!r}")
    return int(v)


def config_bool(cfg: dict[str, Any], key: str, where: str) -> bool | None:
    v = cfg.get(key)
    if v is not None and not isinstance(v, bool):
        raise UnsupportedModelError(f"{where} field {key} must be true or false, not {v!r}")
    return v


def _layer_re(names: Names) -> re.Pattern[str]:
    return re.compile(re.escape(names.layer).replace(r"\{i\}", r"(\d{1,9})") + r"(.+)$")


def check_layer_count(sd: Mapping[str, torch.Tensor], names: Names, n_layers: int) -> None:
    """config.json's num_hidden_layers against the layers the state dict holds (before anything
    is sized by the config, so an absurd layer count costs nothing)."""
    rx = _layer_re(names)
    known = {*names.attn_in, names.o, *names.up, names.down, names.attn_q, names.mlp_q, *names.biases.values()}
    top: tuple[int, str] | None = None
    for k in sd:
        m = rx.match(k)  # only a layer's own tensors count; other stray keys are "unexpected" later
        if m and m.group(2) in known and (top is None or int(m.group(1)) > top[0]):
            top = (int(m.group(1)), k)
    if top is None:
        raise UnsupportedModelError(f"config.json num_hidden_layers is {n_layers}, but the state dict holds no "
                                    f"{names.layer.format(i='N')}* tensors")
    if top[0] + 1 != n_layers:
        raise UnsupportedModelError(f"config.json num_hidden_layers is {n_layers}, but the state dict holds layers "
                                    f"0..{top[0]} ({top[0] + 1} layers; the last: {top[1]})")


def _int(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise UnsupportedModelError(f"SlicingConfig {what} must be a positive integer, not {v!r}")
    return int(v)


def _dim_map(sc: dict[str, Any], key: str, n: int, default: int | None) -> list[int]:
    raw = sc.get(key)
    if not raw:  # absent or {}: TC then slices with const_dimension (or keeps the full width)
        if default is None:
            raise UnsupportedModelError(f"SlicingConfig has no {key} and no const_dimension")
        return [default] * n
    if not isinstance(raw, dict):
        raise UnsupportedModelError(f"SlicingConfig field {key} must map layer index to dimension")
    out = []
    for i in range(n):
        v = raw.get(str(i), raw.get(i))
        out.append(_int(v, f"{key}[{i}]"))
    return out


def _check_block_kind(sc: dict[str, Any], parallel: bool) -> None:
    """SlicingConfig's parallel_blocks must match the architecture (absent: either)."""
    said = config_bool(sc, "parallel_blocks", "SlicingConfig")
    if said is True and not parallel:
        raise UnsupportedModelError("SlicingConfig says parallel_blocks=true (Phi-2 style layers), but this "
                                    "architecture's layers are sequential")
    if said is False and parallel:
        raise UnsupportedModelError("SlicingConfig says parallel_blocks=false, but this architecture's layers are "
                                    "parallel (TransformerCompression writes true for them)")


def _parallel_inner(sc: dict[str, Any], d_in: list[int], d_out: list[int]) -> tuple[list[int], list[int]]:
    """(attention output, MLP input) widths of parallel blocks: the layer's output and input
    widths. TC records neither (both {}); entries that are present must agree."""
    for key, want, what in (("attention_output_dimensions", d_out, "mlp_output"), ("mlp_input_dimensions", d_in, "attention_input")):
        if sc.get(key) and _dim_map(sc, key, len(want), None) != want:
            raise UnsupportedModelError(f"SlicingConfig {key} of a parallel-block model must equal its {what}_dimensions")
    return list(d_out), list(d_in)


def slicing_dims(ckpt: Checkpoint, n_layers: int, hidden: int, n_embeddings: int = 1, parallel: bool = False) -> Dims:
    """Per-layer residual widths from the SlicingConfig, checked to chain as TC slices them.
    Parallel blocks have one output width per layer, reported as both d_attn and d_mlp."""
    sc = ckpt.slicing_config
    config_bool(sc, "do_slice_head", "SlicingConfig")
    _check_block_kind(sc, parallel)
    if sc.get("hidden_size") not in (None, 0, hidden):
        raise UnsupportedModelError(f"SlicingConfig hidden_size {sc['hidden_size']} differs from config.json's {hidden}")
    if sc.get("layers_num") not in (None, 0, n_layers):
        raise UnsupportedModelError(f"SlicingConfig has {sc['layers_num']} layers, config.json {n_layers}")
    const = sc.get("const_dimension")
    const = None if const is None else _int(const, "const_dimension")
    slice_head = bool(sc.get("do_slice_head"))
    # one entry per embedding module (OPT: tokens "0", positions "1"); entries beyond "0" optional
    emb = _dim_map(sc, "embedding_dimensions", 1, const)[0]
    raw = sc.get("embedding_dimensions") or {}
    for j in range(1, n_embeddings):
        v = raw.get(str(j), raw.get(j)) if isinstance(raw, dict) else None
        if v is not None and _int(v, f"embedding_dimensions[{j}]") != emb:
            raise UnsupportedModelError(f"SlicingConfig embedding_dimensions differ between embeddings ({emb} vs {v})")
    d_in = _dim_map(sc, "attention_input_dimensions", n_layers, const)
    if not parallel:
        d_attn = _dim_map(sc, "attention_output_dimensions", n_layers, const)
        d_mlp_in = _dim_map(sc, "mlp_input_dimensions", n_layers, const)
    d_mlp = _dim_map(sc, "mlp_output_dimensions", n_layers, const)
    head = sc.get("head_dimension")
    head = (const if slice_head and const else hidden) if head is None else _int(head, "head_dimension")
    if n_layers and not sc.get("mlp_output_dimensions"):
        d_mlp[-1] = head  # TC's scheduler: the last layer writes the head's width
    if parallel:
        d_attn, d_mlp_in = _parallel_inner(sc, d_in, d_mlp)
    if not slice_head and head != hidden:
        raise UnsupportedModelError(f"SlicingConfig head_dimension {head} with do_slice_head=false must be hidden_size {hidden}")
    for i in range(n_layers):
        prev = emb if i == 0 else d_mlp[i - 1]
        if d_in[i] != prev or (not parallel and d_mlp_in[i] != d_attn[i]):
            raise UnsupportedModelError(f"SlicingConfig dimensions of layer {i} do not chain ({prev} -> {d_in[i]}, {d_attn[i]} -> {d_mlp_in[i]})")
    if (d_mlp[-1] if n_layers else emb) != head:
        raise UnsupportedModelError("SlicingConfig head_dimension differs from the last layer's output")
    for v in [emb, *d_attn, *d_mlp, head]:
        if v > hidden:
            raise UnsupportedModelError(f"SlicingConfig dimension {v} exceeds hidden_size {hidden}")
    return Dims(emb, d_in, d_attn, d_mlp, head)


def _is_identity_norm(name: str, t: torch.Tensor) -> bool:
    want = 0.0 if name.endswith(".bias") else 1.0
    return t.dim() == 1 and t.dtype in DTYPES and bool(torch.all(t == want))


@dataclass
class Extras:
    """Tolerated tensors outside the model proper: per layer, and model-level."""

    layers: dict[int, list[str]]
    top: list[str]


def _nonfinite(t: torch.Tensor) -> tuple[int, int]:
    """(NaN count, ±Inf count): compiled from the bit patterns where the tensor is contiguous
    (codec/host_native.py), else a block of rows at a time (views, so TC's sliced views are not
    copied)."""
    dtype = str(t.dtype).removeprefix("torch.")
    if host_native.active() and dtype in host_native.DTYPE_CODES and t.is_contiguous():
        ints, uints = (torch.int32, np.uint32) if dtype == "float32" else (torch.int16, np.uint16)
        return host_native.nonfinite(t.reshape(-1).view(ints).numpy().view(uints), dtype)
    if t.dim() == 0 or t.numel() == 0:
        return int(torch.isnan(t).sum()), int(torch.isinf(t).sum())
    step = max(1, (1 << 22) // max(1, t.numel() // t.shape[0]))
    nan = inf = 0
    for i in range(0, t.shape[0], step):
        block = t[i : i + step]
        if not bool(torch.isfinite(block).all()):
            nan += int(torch.isnan(block).sum())
            inf += int(torch.isinf(block).sum())
    return nan, inf


def check_finite(sd: Mapping[str, torch.Tensor], release: Callable[[str], None] | None = None) -> None:
    """Refuse NaN and ±Inf anywhere. In a rotated tensor they would poison the Gram matrix whose
    eigendecomposition recovers the rotation, and with it the bits-back stack; in the few tensors
    no rotation touches they would be stored faithfully, but a sliced model holding them is
    broken, so they are refused there too. `release(name)` is called after each tensor (a
    mapped checkpoint drops its pages, so this pass holds one tensor at a time)."""
    if release is None and isinstance(sd, MappedWeights):
        release = sd.release
    bad = []
    for k, t in sd.items():
        nan, inf = _nonfinite(t)
        if release is not None:
            release(k)
        if nan or inf:
            bad.append((k, nan, inf, t.numel()))
    if bad:
        k, nan, inf, numel = bad[0]
        more = f"; {len(bad) - 1} more tensor(s) too: {', '.join(b[0] for b in bad[1:4])}" if len(bad) > 1 else ""
        raise InputError(f"{k} holds {nan + inf:,} non-finite value(s) of {numel:,} ({nan:,} NaN, {inf:,} ±Inf): "
                         f"bbformat refuses NaN/Inf weights{more}")


def _describe(shape: tuple[int, ...]) -> str:
    return f"{shape} ({len(shape)}-D)"


def check_state_dict(sd: Mapping[str, torch.Tensor], expected: dict[str, tuple[int, ...]], names: Names, n_layers: int,
                     tied: bool | None = None) -> Extras:
    """Refuse a state dict that does not match its config; return the tolerated extras.

    Order: what a tensor is (dense, CPU, float dtype), the head, missing keys, unexpected keys,
    shapes, and last (a pass over every value) NaN/Inf."""
    for k, t in sd.items():
        if t.layout != torch.strided or t.is_nested or t.is_quantized or t.device.type != "cpu":
            kind = t.layout if t.layout != torch.strided else ("nested" if t.is_nested else "quantized" if t.is_quantized else t.device)
            raise UnsupportedModelError(f"{k} is a {kind} tensor; only dense CPU tensors are stored")
        if t.dtype not in DTYPES:
            raise UnsupportedModelError(f"{k} has dtype {t.dtype}; only float16, bfloat16 and float32 are stored")
    if names.head not in sd:
        if tied is False:
            raise UnsupportedModelError(f"{names.head} is missing, though config.json says the head is not tied "
                                        "(tie_word_embeddings=false): the state dict must hold it")
        raise UnsupportedModelError(f"{names.head} is missing: the head is tied to the embedding (TransformerCompression unties it before slicing)")
    e, h = sd[names.embed] if names.embed in sd else None, sd[names.head]
    if e is not None and e.untyped_storage().data_ptr() == h.untyped_storage().data_ptr():
        raise UnsupportedModelError(f"{names.head} shares storage with {names.embed}: a tied head was not untied")
    missing = [k for k in expected if k not in sd]
    if missing:
        raise UnsupportedModelError(f"state dict lacks {missing[0]}" + (f" and {len(missing) - 1} more" if len(missing) > 1 else ""))
    layer_re = _layer_re(names)
    extras = Extras({}, [])
    for k in sd:
        if k in expected:
            continue
        m = layer_re.match(k)
        i = int(m.group(1)) if m else -1
        rel = m.group(2) if m else ""
        if m and i < n_layers and (IGNORABLE.match(k) or rel in names.layer_norms):
            if rel in names.layer_norms and not _is_identity_norm(k, sd[k]):
                raise UnsupportedModelError(f"{k} is a norm parameter that is not the identity; SliceGPT checkpoints have parameter-free norms")
            extras.layers.setdefault(i, []).append(k)
        elif not m and (IGNORABLE.match(k) or k in names.final_norms):
            if k in names.final_norms and not _is_identity_norm(k, sd[k]):
                raise UnsupportedModelError(f"{k} is a norm parameter that is not the identity; SliceGPT checkpoints have parameter-free norms")
            extras.top.append(k)
        else:
            raise UnsupportedModelError(f"unexpected tensor {k!r} for this architecture/config")
    for k, shape in expected.items():
        got = tuple(sd[k].shape)
        if got != shape:
            if len(got) != len(shape):
                raise UnsupportedModelError(f"{k} has shape {_describe(got)}, the config implies {_describe(shape)}")
            raise UnsupportedModelError(f"{k} has shape {got}, the config implies {shape}")
    check_finite(sd)
    return extras


def add_optional_biases(expected: dict[str, tuple[int, ...]], sd: Mapping[str, torch.Tensor], names: Names, i: int,
                        shapes: dict[str, tuple[int, ...]]) -> None:
    """Expect the bias of each role that is present (shape from `shapes`)."""
    p = names.prefix(i)
    for role, rel in names.biases.items():
        if p + rel in sd and role in shapes:
            expected[p + rel] = shapes[role]


@dataclass(frozen=True)
class _Layers:
    """Tensor names, push orders and rotation sites of the decoder layers (for build_layout)."""

    names: Names
    n_layers: int
    dims: Dims
    present: frozenset[str]

    def name(self, i: int, rel: str) -> str:
        return self.names.at(i, rel)

    def bias(self, i: int, role: str) -> list[str]:
        rel = self.names.biases.get(role)
        return [self.name(i, rel)] if rel is not None and self.name(i, rel) in self.present else []

    def readers(self, i: int) -> list[AxisRef]:
        """Axes that read the residual stream entering layer i (or the head)."""
        if i >= self.n_layers:
            return [AxisRef(self.names.head, 1)]
        n = self.names
        refs = [AxisRef(self.name(i, n.attn_q), 0)] + [AxisRef(self.name(i, w), 1) for w in n.attn_in]
        if n.parallel:  # the MLP reads the same normed input as attention
            refs += [AxisRef(self.name(i, u), 1) for u in n.up]
        return refs

    def sites(self, i: int) -> tuple[SiteSpec, ...]:
        n, L = self.names, self.name
        if n.parallel:  # one stream, written by attention's output (the anchor) and the MLP's, and the shortcut
            f = [AxisRef(x, 0) for x in self.bias(i, "o")] + [AxisRef(L(i, n.down), 0)]
            f += [AxisRef(x, 0) for x in self.bias(i, "down")] + [AxisRef(L(i, n.attn_q), 1)] + self.readers(i + 1)
            return (SiteSpec(f"layers.{i}.out", self.dims.d_mlp[i], AxisRef(L(i, n.o), 0), tuple(f)),)
        attn_f = [AxisRef(x, 0) for x in self.bias(i, "o")] + [AxisRef(L(i, n.attn_q), 1), AxisRef(L(i, n.mlp_q), 0)]
        attn_f += [AxisRef(L(i, u), 1) for u in n.up]
        mlp_f = [AxisRef(x, 0) for x in self.bias(i, "down")] + [AxisRef(L(i, n.mlp_q), 1)] + self.readers(i + 1)
        return (SiteSpec(f"layers.{i}.attn", self.dims.d_attn[i], AxisRef(L(i, n.o), 0), tuple(attn_f)),
                SiteSpec(f"layers.{i}.mlp", self.dims.d_mlp[i], AxisRef(L(i, n.down), 0), tuple(mlp_f)))

    def tensors(self, i: int, scheme: str) -> list[str]:
        """Layer i's tensors in push order: in `paper` Algorithm 5's (the attention shortcut
        first); in `symmetric` the layer's readers first, the shortcuts last."""
        n, L, b = self.names, self.name, self.bias
        qkv = [L(i, w) for w in n.attn_in] + b(i, "q") + b(i, "k") + b(i, "v")
        o = [L(i, n.o)] + b(i, "o")
        up = [L(i, u) for u in n.up] + [x for role in ("up", "gate") for x in b(i, role)]
        down = [L(i, n.down)] + b(i, "down")
        attn_q = [L(i, n.attn_q)]
        if n.parallel:
            return attn_q + qkv + up + down + o if scheme == "paper" else qkv + up + o + down + attn_q
        mlp_q = [L(i, n.mlp_q)]
        if scheme == "paper":
            return attn_q + qkv + o + mlp_q + up + down
        return qkv + o + attn_q + up + down + mlp_q


def build_layout(arch: str, scheme: str, names: Names, n_layers: int, dims: Dims, present: set[str], extras: Extras) -> ModelLayout:
    """Chunks and sites of both schemes; every key of the state dict lands in exactly one chunk."""
    lay = _Layers(names, n_layers, dims, frozenset(present))
    embed_f = ([AxisRef(names.positions, 1)] if names.positions else []) + lay.readers(0)
    embed_site = SiteSpec("embed", dims.emb, AxisRef(names.embed, 1), tuple(embed_f))
    head = [names.head] + ([names.head_bias] if names.head_bias and names.head_bias in present else []) + extras.top
    emb = [names.embed] + ([names.positions] if names.positions else [])
    chunks: list[ChunkLayout] = []
    if scheme == "paper":  # the head is stored first and gives the initial bits
        chunks.append(ChunkLayout("embed", tuple(head + emb), (embed_site,)))
    else:
        chunks.append(ChunkLayout("embed", tuple(emb), (embed_site,)))
    for i in range(n_layers):
        chunks.append(ChunkLayout(f"layers.{i}", tuple(extras.layers.get(i, []) + lay.tensors(i, scheme)), lay.sites(i)))
    if scheme != "paper":
        chunks.append(ChunkLayout("head", tuple(head), ()))
    all_names = [t for c in chunks for t in c.tensors]
    if len(all_names) != len(set(all_names)) or set(all_names) != present:
        raise AssertionError("layout bug: every tensor must be in exactly one chunk")
    return ModelLayout(arch, scheme, chunks)

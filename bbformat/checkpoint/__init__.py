"""SliceGPT checkpoints in TransformerCompression's on-disk layout: read lazily, written atomically.

* `files`: the `Checkpoint` (tensors, the two configs, side files) and the layout's file rules.
* `read`: `read_checkpoint` (.pt through torch.load(weights_only=True), or safetensors), mapped.
* `mapped`: `MappedWeights`, a weights file's tensors mapped, pages released after use.
* `write`: `publish_checkpoint` and `publish_directory` (atomic, through fsutil.AtomicOutput) and
  `write_checkpoint`.

What microsoft/TransformerCompression (TC) writes, from its sources (experiments/run_slicegpt.py,
src/slicegpt/{rotate,layernorm_fusion,model_adapter,slicing_scheduler,hf_utils,modules}.py and
adapters/{llama,opt,phi2,phi3}_adapter.py); we copy no code, only the layout:

* Files. `run_slicegpt.py --save-dir DIR` writes `DIR/<stem>.pt` with
  `torch.save(model.state_dict(), ...)`, where stem = f"{Path(args.model).name}_{args.sparsity}"
  (e.g. `opt-125m_0.25`, `Llama-2-7b-hf_0.3`), and `DIR/<stem>.json` (same stem, `.with_suffix('.json')`)
  with `SlicingConfig.to_json_string()`. Only with `--model-path` does it also copy the source
  model's `*.json` (config.json, generation_config.json, tokenizer*.json, special_tokens_map.json,
  vocab.json ...; names containing 'safetensors' skipped), `*token*.model` and `merges.txt`.
  `load_sliced_model(name, DIR/<stem>.pt)` rebuilds an uninitialised HF model from config.json,
  replaces layers / fuses norms, reads `<stem>.json` next to the .pt (else assumes
  `const_dimension = int((1 - sparsity) * hidden)` rounded down to round_interval), slices the
  skeleton to those dims and calls `load_state_dict(torch.load(path))` (strict).
* <stem>.json = `json.dumps(dataclasses.asdict(SlicingConfig))`, one line, fields in this order:
  hidden_size, layers_num, do_slice_head, parallel_blocks, embedding_dimensions,
  attention_input_dimensions, attention_output_dimensions, mlp_input_dimensions,
  mlp_output_dimensions, head_dimension, const_dimension. The per-layer dicts are int-keyed in
  Python, so JSON keys are "0", "1", ... (from_dict converts numeric string keys back to int).
  embedding_dimensions has one entry per embedding module (Llama {"0": d}; OPT {"0": d, "1": d}:
  tokens and positions). Sequential models: attention_input[i] = embedding[0] (i = 0) or
  mlp_output[i-1]; mlp_input[i] = attention_output[i]; mlp_output[L-1] = head_dimension = hidden
  unless do_slice_head. parallel_blocks=true (Phi-2) has one shortcut per layer and records
  only embedding, attention_input, mlp_output and head dimensions (attention_output and
  mlp_input stay {}: they are the layer's output and input widths).
* State dict. Norms: fuse_modules folds every norm's weight (and LayerNorm bias) into the next
  linears, bakes OPT's mean subtraction into embeddings / out_proj / fc2, then replaces every
  LlamaRMSNorm / nn.LayerNorm by the parameter-free RMSN(mean_dim = hidden_size, eps 1e-5; it
  divides the sum of squares of the sliced vector by the FULL hidden size). So no norm weights
  remain. The head is cloned (untied) before fusion; OPT's lm_head gains a bias (vocab,) from the
  final LayerNorm's bias. Each compressed decoder layer registers `mlp_shortcut_Q` then
  `attn_shortcut_Q` as its own parameters, so they come before the layer's submodule keys.
  Llama keys: model.embed_tokens.weight (V, d_emb);
    model.layers.i.{mlp_shortcut_Q (d_attn, d_mlp), attn_shortcut_Q (d_in, d_attn)},
    model.layers.i.self_attn.{q,k,v}_proj.weight (H*hd | KV*hd, d_in), o_proj.weight (d_attn, H*hd),
    model.layers.i.mlp.{gate,up}_proj.weight (I, d_attn), down_proj.weight (d_mlp, I);
    lm_head.weight (V, d_head). (Old transformers may add self_attn.rotary_emb.inv_freq.)
  OPT keys: model.decoder.embed_tokens.weight (V, d_emb), model.decoder.embed_positions.weight
    (max_pos + 2, d_emb); model.decoder.layers.i.{mlp_shortcut_Q, attn_shortcut_Q},
    .self_attn.{k,v,q}_proj.{weight (D, d_in), bias (D,)}, .self_attn.out_proj.{weight (d_attn, D),
    bias (d_attn,)}, .fc1.{weight (F, d_attn), bias (F,)}, .fc2.{weight (d_mlp, F), bias (d_mlp,)};
    lm_head.weight (V, d_head), lm_head.bias (V,).
  Phi-2 keys (model_type "phi"; LayerNorms fused as OPT's, mean baked into dense and fc2):
    model.embed_tokens.weight; model.layers.i.attn_shortcut_Q (d_in, d_out) (no mlp_shortcut_Q),
    .self_attn.{q,k,v}_proj.{weight (H*hd | KV*hd, d_in), bias}, .self_attn.dense.{weight (d_out, H*hd),
    bias (d_out,)}, .mlp.fc1.{weight (I, d_in), bias}, .mlp.fc2.{weight (d_out, I), bias (d_out,)};
    lm_head.weight (V, d_head), lm_head.bias (V,). Layer: y = x Q + dense(attn(n)) + fc2(gelu_new(fc1(n))), n = RMSN(x).
  Phi-3 keys (model_type "phi3"; sequential, as Llama): model.embed_tokens.weight;
    model.layers.i.{mlp_shortcut_Q, attn_shortcut_Q}, .self_attn.o_proj.weight (d_attn, H*hd),
    .self_attn.qkv_proj.weight ((H + 2 KV) hd, d_in; rows q | k | v), .mlp.gate_up_proj.weight
    (2 I, d_attn; rows gate | up), .mlp.down_proj.weight (d_mlp, I); lm_head.weight (V, d_head).
  Sliced weights are views (`W.data = W.data[:, :d]`), so TC's .pt keeps unsliced storages.
* Forward of a compressed layer (row vectors x of width d_in):
    h = x @ attn_shortcut_Q + o_proj(attn(RMSN(x)));  y = h @ mlp_shortcut_Q + mlp(RMSN(h)).
  Rotating a residual stream h -> h R (R orthogonal, dims d) keeps the function if the writer's
  output rows (o/down weight axis 0, their bias) and the shortcut's column axis are rotated by R,
  and the reader's input columns (q/k/v or up/gate/fc1 or lm_head axis 1) and the next shortcut's
  row axis rotated by R too; with M = moveaxis(T, a, -1).reshape(-1, d) -> M @ R this is exactly
  the layout.py convention on every touched axis (paper, Remark 3.1).
"""
from __future__ import annotations

from .files import (
    FORMATS,
    SIDE_FILES_MAX_BYTES,
    WEIGHT_SUFFIXES,
    Checkpoint,
    check_side_files,
    input_files,
    side_files,
)
from .mapped import MappedWeights, release_mapped
from .read import read_checkpoint
from .write import publish_checkpoint, publish_directory, write_checkpoint

__all__ = [
    "FORMATS",
    "SIDE_FILES_MAX_BYTES",
    "WEIGHT_SUFFIXES",
    "Checkpoint",
    "MappedWeights",
    "check_side_files",
    "input_files",
    "publish_checkpoint",
    "publish_directory",
    "read_checkpoint",
    "release_mapped",
    "side_files",
    "write_checkpoint",
]

"""load_model: a torch model that runs a SliceGPT-sliced Llama, OPT, Phi-2 or Phi-3, filled from
a container block by block as the blocks decode (never holding the decoded model twice), or
from a checkpoint directory; for a plain container (a Hugging Face directory packed as is),
the stock transformers class its config.json names (adapters/stock.py), filled the same way.
load_file: every tensor of a container, as safetensors.torch.load_file gives a file's.

The model is adapters/hf_modeling.py's SlicedForCausalLM (built by adapters/torch_models.py):
a transformers PreTrainedModel whose layers carry the shortcut matrices and parameter-free
RMS norms, as TransformerCompression's compressed layers do, so it runs `generate()` and
`save_pretrained`; the same code `unpack --format hf` writes for from_pretrained. Written
from the architecture, with no dependency on TransformerCompression.
"""
from __future__ import annotations

import base64
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Container, Iterable, Iterator

import torch
from torch import nn

from .adapters.stock import StockFiller, build_empty, config_dtype, is_plain, stock_class
from .adapters.torch_models import build_model, require_transformers
from .api import InexactBlocks
from .checkpoint import Checkpoint, read_checkpoint
from .container.program import bits_of
from .codec.linalg import Linalg, device_backend, torch_device_of
from .errors import InputError
from .reader import DecodedBlock, Reader, decode_workers
from .tensors import dominant, raw_to_torch, torch_dtype


def fill_model(model: nn.Module, tensors: Iterable[tuple[str, torch.Tensor]], expected: set[str],
               own: Container[str] = ()) -> None:
    """Copy each (name, tensor) into the model's parameter of that name, converting to the
    model's dtype, and discard the name from `expected` (what is left there was never filled).
    A tensor named in `own` (the caller gives it up) of the parameter's dtype and device
    becomes the parameter's memory instead of a copy. Norm weights and derived buffers the
    adapters tolerate are skipped; any other name the model lacks, or a shape that differs,
    raises InputError."""
    params = dict(model.named_parameters())
    for name, t in tensors:
        if name not in params and ("norm" in name or name.endswith("inv_freq")):
            continue  # identity norm weights / derived buffers the adapters tolerate
        if name not in params:
            raise InputError(f"checkpoint tensor {name!r} has no place in the model")
        p = params[name]
        if tuple(p.shape) != tuple(t.shape):
            raise InputError(f"{name}: shape {tuple(t.shape)} does not match the model's {tuple(p.shape)}")
        with torch.no_grad():
            if name in own and t.dtype == p.dtype and t.device == p.device:
                p.data = t
            else:
                p.copy_(t)  # converts to the model's dtype in the same pass
        expected.discard(name)


def load_model(path: str | os.PathLike[str], dtype: torch.dtype | None = None, *, max_block_bytes: int | str | None = "auto",
               max_site_dim: int | None = None, workers: int | None = None, allow_inexact: bool = False,
               device: str | Linalg | None = None, threads: int | None = None) -> nn.Module:
    """A runnable torch model from a .bb container or a sliced checkpoint directory.

    A plain container (metadata "directory": a Hugging Face directory packed as is) gives the
    stock transformers class its config.json names (architectures[0]; an auto_map is refused,
    no code from the container runs), built as from_pretrained builds it and filled block by
    block: its logits equal from_pretrained's. Its parameters keep their requires_grad, as
    from_pretrained's do; a name with "/" (a subfolder's weights) is not the model's and is
    passed over.

    dtype: the model's parameter dtype; None (the default) takes the checkpoint's own (the
    dtype most of its bytes are in), so a float16 7B model is not doubled to float32; for a
    plain container config.json's dtype first, as from_pretrained's dtype="auto".
    Containers are decoded one block at a time straight into the model's parameters (peak
    memory: the model and about `workers` + 1 blocks, at most max_block_bytes of declared
    working sets, Reader.iter_blocks): on the CPU a block's decoded tensors of
    the model's dtype become its parameters without a copy where they fill the memory they
    were decoded into (Reader.hand_over; tied names and the rest are copied). max_block_bytes
    and max_site_dim bound the blocks' memory and each one's decode time (Reader, SPEC.md 11.5). A block
    whose decoded values miss its digest (format 1.2) raises DigestError, unless allow_inexact
    (then an InexactWarning names the blocks).

    device: where the model is built and filled, and where a container's linear algebra runs
    (Reader): "cpu" (the reference, the default), "cuda", "cuda:N", "torch:DEV". The model is
    made on that device, and each decoded block is put into it as it arrives, so host
    memory holds a few blocks, never the model. Chunks the device misses are decoded again
    with the reference (a DeviceNote says how many); a missing device is DeviceError.

    threads: how many threads decode the parts of one block's payload (format 1.5; None: every
    CPU this process may use), beside the `workers` decoding blocks ahead.
    """
    require_transformers("load_model")  # before anything is read or decoded
    p = Path(path)
    la = device_backend(device)
    target = torch.device(torch_device_of(la))
    if p.is_file() and p.suffix == ".bb":
        inexact = InexactBlocks(p)
        with _open(p, la, max_block_bytes, max_site_dim, allow_inexact, threads) as r:
            inexact.note(r)
            files = {k: base64.b64decode(v) for k, v in r.metadata.get("files", {}).items()}
            if is_plain(r.metadata):
                stock = _load_stock(r, files, dtype, target, workers, inexact)
                inexact.warn()
                return stock
            stem = r.metadata.get("stem", "model")
            hf = json.loads(files["config.json"])
            sc = json.loads(files[f"{stem}.json"])
            entries = r.tensor_entries()
            if dtype is None:
                dtype = torch_dtype(dominant(((e.dtype, e.numel * bits_of(e.dtype)) for e in entries.values()), "float32"))
            # The model is built on a thread of its own while the first blocks decode.
            with ThreadPoolExecutor(1, thread_name_prefix="bbformat-build") as ex:
                built = ex.submit(build_model, hf, sc, dtype, list(entries), target, stem)
                blocks = r.iter_blocks("reverse", workers=decode_workers(workers))
                first = next(blocks, None)
                model = built.result()
                params = dict(model.named_parameters())
                expected = set(params)

                def fill(block: DecodedBlock) -> None:
                    inexact.see(block)
                    tensors = {n: raw_to_torch(t, copy=False) for n, t in block.tensors.items()}
                    own = r.hand_over(block, [n for n, t in tensors.items() if n in params and params[n].dtype == t.dtype
                                              and params[n].device == t.device])
                    fill_model(model, tensors.items(), expected, own)

                if first is not None:
                    fill(first)
                    del first
                for block in blocks:
                    fill(block)
                    del block
        inexact.warn()
    else:
        with read_checkpoint(p) as ckpt:
            sd = ckpt.state_dict
            if dtype is None:
                dtype = dominant(((t.dtype, t.numel() * t.element_size()) for t in sd.values()), torch.float32)
            model = build_model(ckpt.hf_config, ckpt.slicing_config, dtype, list(sd), target, ckpt.stem)
            expected = {n for n, _ in model.named_parameters()}
            fill_model(model, _released(ckpt), expected)
    if expected:
        raise InputError(f"checkpoint lacks {len(expected)} model tensors, e.g. {sorted(expected)[:3]}")
    return model


def _open(path: Path, la: Linalg, max_block_bytes: int | str | None, max_site_dim: int | None, allow_inexact: bool,
          threads: int | None) -> Reader:
    """A reader whose tensors are views of their chunks: the caller keeps what Reader.hand_over
    gives it, copies the rest into place (the model's parameter, the device), and drops the block."""
    return Reader(path, max_block_bytes=max_block_bytes, max_site_dim=max_site_dim, allow_inexact=allow_inexact, device=la,
                  share_payload=True, writable_chunks=True, threads=threads)


def _torch_blocks(r: Reader, workers: int | None, inexact: InexactBlocks,
                  adoptable: Callable[[str, torch.Tensor], bool] = lambda n, t: False,
                  ) -> Iterator[tuple[dict[str, torch.Tensor], set[str]]]:
    """Each block's tensors as torch tensors sharing the decoded memory, blocks decoded ahead
    on `workers` threads, and the names among those `adoptable` that the caller may keep
    without a copy (Reader.hand_over); the caller copies the others it keeps."""
    for block in r.iter_blocks("reverse", workers=decode_workers(workers)):
        inexact.see(block)
        tensors = {n: raw_to_torch(t, copy=False) for n, t in block.tensors.items()}
        own = r.hand_over(block, [n for n, t in tensors.items() if adoptable(n, t)])
        del block
        yield tensors, own
        del tensors, own  # before the next block is waited for: this one's memory is not held through it


def _load_stock(r: Reader, files: dict[str, bytes], dtype: torch.dtype | None, target: torch.device, workers: int | None,
                inexact: InexactBlocks) -> nn.Module:
    """A plain container's model: the stock class of its config.json, on the meta device, then
    filled block by block on `target`. dtype None: config.json's (from_pretrained's "auto"),
    else the dtype most of the stored bytes are in."""
    if "config.json" not in files:
        raise InputError("this plain container carries no config.json: load_file reads its tensors, load_model needs the config")
    config_json = _json_object(files, "config.json")
    cls, config = stock_class(config_json)
    if dtype is None:
        dtype = config_dtype(config_json) or _stored_dtype(r)
    filler = StockFiller(build_empty(cls, config, dtype), target)
    for tensors, own in _torch_blocks(r, workers, inexact, lambda n, t: filler.keeps_as_is(n, t.dtype)):
        for name, t in tensors.items():
            filler.put(name, t, adopt=name in own)
        del tensors
    model = filler.finish()
    if "generation_config.json" in files and getattr(model, "can_generate", lambda: False)():
        from transformers import GenerationConfig

        model.generation_config = GenerationConfig.from_dict(_json_object(files, "generation_config.json"))
    return model


def _json_object(files: dict[str, bytes], name: str) -> dict[str, object]:
    """The JSON object a container's file holds; InputError, one line, if it is not one."""
    try:
        value = json.loads(files[name])
    except ValueError as exc:
        raise InputError(f"the container's {name} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InputError(f"the container's {name} is not a JSON object")
    return value


def _stored_dtype(r: Reader) -> torch.dtype:
    """The floating dtype most of the container's bytes are in (float32 if none)."""
    entries = r.tensor_entries().values()
    return torch_dtype(dominant(((e.dtype, e.numel * bits_of(e.dtype)) for e in entries if e.dtype.startswith(("float", "bfloat"))),
                                "float32"))


def load_file(path: str | os.PathLike[str], device: str | Linalg | None = "cpu", *, max_block_bytes: int | str | None = "auto",
              max_site_dim: int | None = None, workers: int | None = None, allow_inexact: bool = False,
              threads: int | None = None) -> dict[str, torch.Tensor]:
    """Every tensor of a .bb container (sliced or plain), name -> torch tensor, as
    safetensors.torch.load_file gives a file's: the metadata's key order, then any other
    tensor in chunk order. Bit for bit what unpack writes.

    device: "cpu" (the default), "cuda", "cuda:N", "torch:DEV": where the tensors are put, and
    where a container's linear algebra runs (Reader, with its fallback to the reference for a
    chunk the device misses: a DeviceNote says how many). Each block goes to the device as it
    decodes, so the host holds about `workers` + 1 blocks (within max_block_bytes), never the model. On the CPU the
    tensors that fill the memory they were decoded into are returned as decoded, without a copy
    (Reader.hand_over): a block's tensors may then share one buffer, freed with the last of them.
    A chunk that misses its digest raises DigestError, unless allow_inexact (then an
    InexactWarning names it). max_block_bytes, max_site_dim and threads as for Reader."""
    la = device_backend(device)
    target = torch.device(torch_device_of(la))
    inexact = InexactBlocks(path)
    out: dict[str, torch.Tensor] = {}
    with _open(Path(path), la, max_block_bytes, max_site_dim, allow_inexact, threads) as r:
        inexact.note(r)
        keys = r.metadata.get("keys")
        order = list(r.tensor_entries())
        for tensors, own in _torch_blocks(r, workers, inexact, lambda n, t: t.device == target):
            out.update((n, t if n in own else t.to(target, copy=True)) for n, t in tensors.items())
            del tensors
    inexact.warn()
    first = [k for k in keys if isinstance(k, str) and k in out] if isinstance(keys, list) else []
    return {k: out[k] for k in dict.fromkeys(first + order)}


def _released(ckpt: Checkpoint) -> Iterator[tuple[str, torch.Tensor]]:
    """A checkpoint's tensors one at a time, each one's mapped pages released once it is used."""
    for name, t in ckpt.state_dict.items():
        yield name, t
        ckpt.release(name)

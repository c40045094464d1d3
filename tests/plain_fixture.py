"""Plain containers for the loading tests: pack_plain is `bbformat.pack` of a save_pretrained
directory; craft_plain writes one from the tensors with the low-level Writer, for containers
pack refuses to make (no config.json, a config.json that is not JSON): metadata marking the
container plain ("directory") and carrying the directory's JSON files."""
from __future__ import annotations

import base64
from pathlib import Path

from safetensors import safe_open

from bbformat.codec.encoder import encode_chunk
from bbformat.codec.layout import ChunkLayout
from bbformat.constants import written_version
from bbformat.tensors import torch_to_raw
from bbformat.writer import Writer

FORMAT_VERSION = "1.5"


def _chunk_of(name: str) -> str:
    """Tensors of one layer share a chunk (the name up to its first number), the rest one each."""
    parts = name.split(".")
    for i, p in enumerate(parts):
        if p.isdigit():
            return ".".join(parts[: i + 1])
    return name


def pack_plain(src: Path, dst: Path, entropy: str = "auto") -> Path:
    """`bbformat.pack(src, dst)`: a plain directory, scheme none by default."""
    import bbformat

    bbformat.pack(src, dst, entropy=entropy)
    return dst


def craft_plain(src: Path, dst: Path, entropy: str = "auto") -> Path:
    """Pack every tensor of src's *.safetensors files (a file in a subfolder: names prefixed
    with its folder, "2_Dense/linear.weight") into dst, plain."""
    tensors = {}
    for f in sorted(src.rglob("*.safetensors")):
        folder = f.parent.relative_to(src).as_posix()
        with safe_open(str(f), "pt") as st:
            for k in st.keys():
                tensors[k if folder == "." else f"{folder}/{k}"] = st.get_tensor(k)
    groups: dict[str, list[str]] = {}
    for name in tensors:
        groups.setdefault(_chunk_of(name), []).append(name)
    files = {p.name: base64.b64encode(p.read_bytes()).decode("ascii") for p in sorted(src.glob("*.json"))}
    metadata = {"format": "bbformat", "format_version": written_version(FORMAT_VERSION, entropy, sites=False),
                "scheme": "none", "tolerance": 0.0, "keys": list(tensors), "files": files, "directory": {}}
    with Writer(dst, "none", len(groups), metadata, entropy=entropy, format_version=FORMAT_VERSION) as w:
        for chunk, names in groups.items():
            raw = {n: torch_to_raw(tensors[n], n) for n in names}
            w.add_encoded(encode_chunk(ChunkLayout(chunk, tuple(names), ()), raw, {}, "symmetric", 0.0))
    return dst

"""Section 3: pack/unpack time of one synthetic layer chunk (2 sites, symmetric exact) against the
rotation dimension and the number of layers, next to the time of the eigendecompositions alone."""
from __future__ import annotations

from typing import Any

import numpy as np

from .common import Json, Run, log, timed

LAYERS_D = 460


def layer_chunk(d: int, hidden_ffn: int, seed: int) -> tuple[Any, dict[str, Any]]:
    """A layout of one layer (attention and MLP sites) and random fp16 tensors for it."""
    from bbformat.codec.dtypes import RawTensor
    from bbformat.codec.layout import ChunkLayout, SiteSpec
    from bbformat.container.program import AxisRef

    rng = np.random.default_rng(seed)

    def f(*shape: int) -> RawTensor:
        return RawTensor.from_f64(rng.normal(0, 0.02, shape), "float16")

    t = {"qkv": f(3 * d, d), "o": f(d, d), "sa": f(d, d), "up": f(hidden_ffn, d), "down": f(d, hidden_ffn), "sm": f(d, d)}
    lay = ChunkLayout("layer", ("qkv", "o", "sa", "up", "down", "sm"), (
        SiteSpec("attn", d, AxisRef("o", 0), (AxisRef("sa", 1), AxisRef("sm", 0), AxisRef("up", 1))),
        SiteSpec("mlp", d, AxisRef("down", 0), (AxisRef("sm", 1),)),
    ))
    return lay, t


def decode(enc: Any) -> Any:
    """Decode an encoded chunk in memory, its side sections decompressed as a reader would."""
    from bbformat.codec.decoder import decode_program
    from bbformat.codec.sections import StoredCorrector, decoded_limit
    from bbformat.zstdframe import decompress
    from bbformat.constants import SectionKind

    side = {(s.kind, s.site): decompress(s.stored, s.codec, len(s.data), decoded_limit(enc.program, s.kind, s.site))
            for s in enc.sections if s.kind != SectionKind.PAYLOAD}
    return decode_program(enc.program, enc.payload, StoredCorrector(enc.program, side))


def rng_mat(d: int) -> np.ndarray:
    return np.random.default_rng(1).normal(size=(4 * d, d))


def eigh_seconds(d: int, repeats: int) -> float:
    from bbformat.codec import rotation as rot

    g = rot.gram(rng_mat(d))
    return timed(lambda: np.linalg.eigh(g), repeats)[1]


def by_dim(run: Run) -> list[Json]:
    from bbformat.codec.encoder import encode_chunk

    out = []
    for d in ([460, 1024] if run.quick else [460, 1024, 1638, 2048]):
        lay, t = layer_chunk(d, 4 * d, d)
        enc, t_enc = timed(lambda: encode_chunk(lay, t, {}, "symmetric", 0.0), run.repeats)
        _, t_dec = timed(lambda: decode(enc), run.repeats)
        t_eig = eigh_seconds(d, run.repeats)
        out.append({"d": d, "pack_s": t_enc, "unpack_s": t_dec, "eigh_s": t_eig, "sites": 2})
        log(f"scaling: D={d} pack {t_enc:.2f}s unpack {t_dec:.2f}s eigh {t_eig:.3f}s")
    return out


def by_layers(run: Run) -> list[Json]:
    from bbformat.codec.encoder import encode_chunk

    lay, t = layer_chunk(LAYERS_D, 4 * LAYERS_D, 0)
    t_eig = eigh_seconds(LAYERS_D, run.repeats)
    out = []
    for n in ([1, 2] if run.quick else [1, 2, 4, 8]):
        encs, t_enc = timed(lambda: [encode_chunk(lay, t, {}, "symmetric", 0.0) for _ in range(n)], run.repeats)
        _, t_dec = timed(lambda: [decode(e) for e in encs], run.repeats)
        out.append({"layers": n, "pack_s": t_enc, "unpack_s": t_dec, "eigh_s": t_eig * 2 * n})
    return out


def measure(run: Run) -> Json:
    return {"by_dim": by_dim(run), "by_layers": by_layers(run)}


def report(res: Json) -> list[str]:
    sc = res["scaling"]
    L = ["## 3. Scaling (one synthetic layer chunk: 2 sites, symmetric exact)", "",
         "| D | pack s | unpack s | eigh(D) s | pack / (2 eigh) | unpack / (2 eigh) |", "|---|---|---|---|---|---|"]
    for r in sc["by_dim"]:
        L.append(f"| {r['d']} | {r['pack_s']:.3f} | {r['unpack_s']:.3f} | {r['eigh_s']:.4f} | {r['pack_s'] / (2 * r['eigh_s']):.1f} | "
                 f"{r['unpack_s'] / (2 * r['eigh_s']):.1f} |")
    L += ["", f"| layers (D={LAYERS_D}) | pack s | unpack s | eigh alone s | pack / eigh | unpack / eigh |", "|---|---|---|---|---|---|"]
    for r in sc["by_layers"]:
        L.append(f"| {r['layers']} | {r['pack_s']:.3f} | {r['unpack_s']:.3f} | {r['eigh_s']:.3f} | {r['pack_s'] / r['eigh_s']:.1f} | "
                 f"{r['unpack_s'] / r['eigh_s']:.1f} |")
    L.append("")
    return L


def goals(res: Json) -> list[str]:
    return []  # no goal is set on scaling

#!/usr/bin/env python3
"""How close exact mode's residual coding is to what its residuals allow (issue 6, part 3).

    python tools/residual_contexts.py CONTAINER.bb

Re-runs the decoder on a symmetric exact container, captures every regenerated block
(approximation, residuals, the anchor's eigenvectors E and Gram eigenvalues, the popped
eigenvalues mu) and measures, in bytes:

  stored         the x_residuals sections as written (exponent contexts, varints, zstd-19)
  exp/zstd       the same coding recomputed here (a check of this script)
  exp/entropy    the order-0 entropy of the residuals per exponent context (an ideal coder)
  model/...      contexts from a first-order perturbation model of the regeneration:
                 Var(dX_ij) ~ sum_kl E_ik^2 E_jl^2 (mu_k - mu_l)^2 / (lam_k - lam_l)^2,
                 in half-bit buckets of the predicted error in ulps of the value
  model+exp/...  both contexts together
Nothing here changes the format; it says which coding changes would pay.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import zstandard

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bbformat.codec import decoder as P  # noqa: E402
from bbformat.codec.linalg import NumpyLinalg  # noqa: E402
from bbformat.codec.dtypes import bits_to_f64  # noqa: E402
from bbformat.codec.sections import StoredCorrector  # noqa: E402
from bbformat.constants import SectionKind  # noqa: E402
from bbformat.codec.section_kinds import decode_patches, decode_residuals, residual_contexts  # noqa: E402
from bbformat.codec.varint import encode_varint, encode_varints, zigzag  # noqa: E402
from bbformat.errors import BBFormatError  # noqa: E402
from bbformat.reader import Reader  # noqa: E402

ZSTD = zstandard.ZstdCompressor(level=19)


def _entropy_bytes(x: np.ndarray) -> float:
    if x.size == 0:
        return 0.0
    _, c = np.unique(x, return_counts=True)
    p = c / c.sum()
    return float(-(c * np.log2(p)).sum()) / 8


def _groups(ctx: np.ndarray) -> list[np.ndarray]:
    order = np.argsort(ctx, kind="stable")
    cnt = np.bincount(ctx)
    ends = np.cumsum(cnt)
    return [order[ends[c] - cnt[c] : ends[c]] for c in np.flatnonzero(cnt)]


def _coded(r: np.ndarray, groups: list[np.ndarray]) -> int:
    """Bytes of the format's group coding (varint length, codec byte, smaller of raw and zstd)."""
    total = 0
    for g in groups:
        raw = encode_varints(zigzag(r[g]))
        data = min(raw, ZSTD.compress(raw), key=len)
        total += len(data) + len(encode_varint(len(data))) + 1
    return total


def capture(path: Path) -> list[tuple]:
    """(approx, residuals, E, lambda, mu, stored bytes) of every site with x_residuals."""
    sites: list[tuple] = []
    last: dict = {}

    class Spy(NumpyLinalg):
        """The reference backend, keeping each site's eigenvalues, eigenvectors and mu."""

        def eigh(self, g: np.ndarray):  # type: ignore[no-untyped-def]
            w, v = super().eigh(g)
            last["lam"] = w
            return w, v

        def regenerate(self, e: np.ndarray, mu: np.ndarray, paper: bool) -> np.ndarray:
            last["e"], last["mu"] = e, mu
            return super().regenerate(e, mu, paper)

    class Capture(StoredCorrector):
        def correct_x(self, site: int, approx: np.ndarray, regenerated: np.ndarray | None = None) -> np.ndarray:
            res = self.sections.get((SectionKind.X_RESIDUALS, site))
            if res is not None:
                keep = None
                pat = self.sections.get((SectionKind.X_PATCHES, site))
                if pat is not None:  # 1.2 MIXED_CORRECTIONS: patched positions take no residual
                    keep = np.ones(approx.size, bool)
                    keep[decode_patches(pat, approx.size, self.program.symbol_bits)[0]] = False
                r = decode_residuals(res, approx, self.program.symbol_dtype, keep)
                sites.append((approx.copy(), r, last["e"], last["lam"], last["mu"], len(res), self.program.symbol_dtype))
            return super().correct_x(site, approx, regenerated)

    with Reader(path) as rd:
        for i in range(len(rd)):
            c = rd.read_chunk(i)
            P.decode_program(c.program, c.payload, Capture(c.program, c.side), Spy())
    return sites


def measure(path: Path) -> dict:
    out = {"stored": 0, "exp_zstd": 0, "exp_entropy": 0.0, "model_zstd": 0, "model_entropy": 0.0, "both_zstd": 0,
           "both_entropy": 0.0, "values": 0, "nonzero": 0, "sites": 0, "gross_bound_bytes": 0}
    for approx, r, e, lam, mu, stored, dtype in capture(path):
        d = e.shape[0]
        out["sites"] += 1
        out["values"] += r.size
        out["nonzero"] += int(np.count_nonzero(r))
        out["gross_bound_bytes"] += d * (d - 1) // 2 * 2
        out["stored"] += stored
        ctx = residual_contexts(approx, dtype)
        g = _groups(ctx)
        out["exp_zstd"] += _coded(r, g)
        out["exp_entropy"] += sum(_entropy_bytes(r[x]) for x in g)
        gap = lam[:, None] - lam[None, :]
        np.fill_diagonal(gap, np.inf)
        w = (mu[:, None] - mu[None, :]) ** 2 / gap**2
        e2 = e**2
        v = e2 @ w @ e2.T
        iu = np.triu_indices(d, 1)
        var = np.concatenate((np.diag(v), v[iu]))
        a = np.abs(bits_to_f64(approx, dtype))
        ulp = np.exp2(np.floor(np.log2(np.maximum(a, 2.0**-14))) - 10)
        score = 0.5 * np.log2(np.maximum(var, 1e-300)) - np.log2(ulp)
        score -= np.median(score)  # the noise scale is unknown: buckets relative to the site
        model = np.clip(np.round(2 * score) + 12, 0, 31).astype(np.int64)
        g = _groups(model)
        out["model_zstd"] += _coded(r, g)
        out["model_entropy"] += sum(_entropy_bytes(r[x]) for x in g)
        both = np.clip(np.round(score) + 6, 0, 15).astype(np.int64) * 32 + np.minimum(ctx, 31)
        g = _groups(both)
        out["both_zstd"] += _coded(r, g)
        out["both_entropy"] += sum(_entropy_bytes(r[x]) for x in g)
    return {k: (round(v) if isinstance(v, float) else v) for k, v in out.items()}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or not Path(argv[0]).is_file():
        print("usage: residual_contexts.py CONTAINER.bb (a symmetric exact container)", file=sys.stderr)
        return 2
    try:
        print(json.dumps(measure(Path(argv[0])), indent=1))
    except BBFormatError as exc:
        print(f"residual_contexts: {argv[0]}: {exc} [{exc.code}]", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

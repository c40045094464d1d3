"""Architecture-agnostic description of what to encode: chunks, tensors, rotation sites.

Adapters produce these; the codec turns them into block programs.

Rotation convention: a site of dimension D acts on one axis of each tensor it touches.
For a tensor T and axis a, let M = moveaxis(T, a, -1).reshape(-1, D); the rotated
tensor is M @ R reshaped back, for the same D x D orthogonal R on every touched axis.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..container.program import AxisRef


@dataclass(frozen=True)
class SiteSpec:
    """One rotational symmetry: `anchor` defines it, `followers` rotate with it."""

    name: str
    dim: int
    anchor: AxisRef
    followers: tuple[AxisRef, ...] = ()

    def touched(self) -> tuple[AxisRef, ...]:
        return (self.anchor, *self.followers)


@dataclass(frozen=True)
class ChunkLayout:
    """One self-contained block: tensors in push order and the sites anchored in it.

    `tensors` is the push order the adapter wants; the planner inserts each site
    just before the first tensor that it touches in this scheme.
    """

    name: str
    tensors: tuple[str, ...]
    sites: tuple[SiteSpec, ...] = ()


@dataclass
class ModelLayout:
    """The full plan for one model under one scheme."""

    architecture: str
    scheme: str
    chunks: list[ChunkLayout] = field(default_factory=list)

    def all_sites(self) -> list[SiteSpec]:
        return [s for c in self.chunks for s in c.sites]

"""What SPEC.md allows each section kind (8.1, 8.2), from the descriptor alone: where it may
appear, how it may be stored, and the largest decoded size it may declare.

parse_chunk checks a chunk's section table against these rules and working_set_bytes bounds
a chunk with them. codec/section_kinds.py extends each kind's rules with its encoder and
decoder: one object per kind (numcodecs style), whose format rules live here, below the codec.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, TypeGuard

import numpy as np

from ..constants import BYTE_CODECS, EXPONENT_FIELD, SECTION_KIND_NAMES, Codec, SectionKind
from ..errors import FormatError
from .program import BlockProgram, SiteEntry, bits_of


class SectionRules(ABC):
    """One section kind's rules (SPEC.md 8.1, 8.2). The defaults are a correction section's."""

    kind: SectionKind
    required = False
    """Present wherever allowed, else E_SECTION_MISSING."""
    alternatives: frozenset[SectionKind] = frozenset()
    """Kinds it may share a site with only if the header sets MIXED_CORRECTIONS (E_SECTION_DUPLICATE)."""
    codecs: tuple[Codec, ...] = BYTE_CODECS
    """The storage codecs it may use (E_CODEC); PLANES also needs RequiredFlag.PLANES."""
    exact_declared: str | None = None
    """The code if decoded_length is not exactly the limit, checked before anything else (None: at most)."""
    exact_decoded: str | None = None
    """The code if the decoded bytes are not exactly the limit, checked once decoded (None: at most)."""

    @property
    def name(self) -> str:
        """As SPEC.md 8.1 names it: "payload", "signs", "x_residuals", ..."""
        return SECTION_KIND_NAMES[self.kind]

    @abstractmethod
    def allowed(self, site: SiteEntry | None) -> bool:
        """Whether a section of this kind may belong to `site` (None: to the chunk itself)."""

    @abstractmethod
    def decoded_limit(self, program: BlockProgram, site: int) -> int:
        """The largest decoded size a section of this kind may declare (SPEC.md 8.2)."""


def residual_bytes_per_value(symbol_bits: int) -> int:
    """The most bytes one residual may take, as a varint (SPEC.md 8.2, 8.4): 3 for W = 16, else 5."""
    return 3 if symbol_bits == 16 else 5


def _rotated(site: SiteEntry | None) -> TypeGuard[SiteEntry]:
    """A site that is not PLAIN: the only kind that has sections (SPEC.md 8.1)."""
    return site is not None and not site.plain


def payload_dtype(program: BlockProgram) -> np.dtype[Any]:
    """The payload's symbols as numpy reads them: W-bit little-endian unsigned (SPEC.md 6.3)."""
    return np.dtype(f"<u{program.symbol_bits // 8}")


class PayloadRules(SectionRules):
    """Kind 1: the final stack, one per chunk (SPEC.md 6.3)."""

    kind = SectionKind.PAYLOAD
    required = True
    codecs = (Codec.RAW, Codec.ZSTD, Codec.PLANES, Codec.EXPONENT, Codec.PARTS)
    exact_declared = "E_SYMBOL_COUNT"

    def allowed(self, site: SiteEntry | None) -> bool:
        return site is None

    def decoded_limit(self, program: BlockProgram, site: int) -> int:
        return program.payload_symbols() * (program.symbol_bits // 8)


class SignsRules(SectionRules):
    """Kind 2: a PAPER site's sign bitmap (SPEC.md 8.3)."""

    kind = SectionKind.SIGNS
    required = True
    exact_decoded = "E_SECTION_SIZE"

    def allowed(self, site: SiteEntry | None) -> bool:
        return _rotated(site) and site.paper

    def decoded_limit(self, program: BlockProgram, site: int) -> int:
        return (program.sites[site].dim + 7) // 8


class ResidualsRules(SectionRules):
    """Kind 3: residuals of a symmetric-mode site's regenerated block (SPEC.md 8.4)."""

    kind = SectionKind.X_RESIDUALS
    alternatives = frozenset({SectionKind.X_PATCHES})

    def allowed(self, site: SiteEntry | None) -> bool:
        return _rotated(site) and not site.paper

    def decoded_limit(self, program: BlockProgram, site: int) -> int:
        per_value = residual_bytes_per_value(program.symbol_bits)
        return (1 << EXPONENT_FIELD[program.symbol_dtype][1]) * 11 + program.sites[site].n_pop * per_value


class BlockPatchesRules(SectionRules):
    """Kind 4: patches of any rotated site's regenerated block (SPEC.md 8.5)."""

    kind = SectionKind.X_PATCHES
    alternatives = frozenset({SectionKind.X_RESIDUALS})

    def allowed(self, site: SiteEntry | None) -> bool:
        return _rotated(site)

    def decoded_limit(self, program: BlockProgram, site: int) -> int:
        return 10 + program.sites[site].n_pop * (10 + program.symbol_bits // 8)


class AnchorPatchesRules(SectionRules):
    """Kind 5: patches of a PAPER site's un-rotated anchor (SPEC.md 8.5)."""

    kind = SectionKind.ANCHOR_PATCHES

    def allowed(self, site: SiteEntry | None) -> bool:
        return _rotated(site) and site.paper

    def decoded_limit(self, program: BlockProgram, site: int) -> int:
        anchor = program.tensors[program.sites[site].anchor]
        return 10 + anchor.numel * (10 + bits_of(anchor.dtype) // 8)


BAND_WIDTHS_SYMMETRIC = ("regenerated block values",)
BAND_WIDTHS_PAPER = ("regenerated block values", "un-rotated anchor values", "column sums of E")
"""What each float64 of a band section bounds, in order (SPEC.md 8.8)."""


def band_widths(data: bytes | bytearray | memoryview) -> np.ndarray:
    """A band section's widths (SPEC.md 8.8): float64 little-endian, each finite and > 0, else
    E_SECTION_CONTENT (its size was checked against the site's mode before)."""
    widths = np.frombuffer(data, "<f8").astype(np.float64)
    if not (np.isfinite(widths) & (widths > 0)).all():
        raise FormatError(f"band widths must be finite and > 0, not {widths.tolist()}", "E_SECTION_CONTENT")
    return widths


class BandRules(SectionRules):
    """Kind 6 (1.4, RequiredFlag.BANDS): a non-PLAIN site's band widths (SPEC.md 8.8). Stored
    raw; its decoded_length is exactly 8 bytes per width, checked first."""

    kind = SectionKind.BAND
    codecs = (Codec.RAW,)
    exact_declared = "E_SECTION_SIZE"

    def allowed(self, site: SiteEntry | None) -> bool:
        return _rotated(site)

    def decoded_limit(self, program: BlockProgram, site: int) -> int:
        return 8 * len(BAND_WIDTHS_PAPER if program.sites[site].paper else BAND_WIDTHS_SYMMETRIC)


SECTION_RULES: dict[SectionKind, SectionRules] = {
    r.kind: r for r in (PayloadRules(), SignsRules(), ResidualsRules(), BlockPatchesRules(), AnchorPatchesRules(), BandRules())
}
"""Every section kind's rules, by kind."""


def rules_of(kind: int) -> SectionRules:
    """The rules of a section table entry's kind; an unknown kind is E_SECTION_KIND."""
    try:
        return SECTION_RULES[SectionKind(kind)]
    except ValueError:
        raise FormatError(f"unknown section kind {kind}", "E_SECTION_KIND") from None


def site_sections_limit(program: BlockProgram, site: int, mixed: bool, bands: bool = False) -> int:
    """The largest total decoded size a site's sections may declare (SPEC.md 11.5): every kind
    allowed there, but of kinds that are each other's alternatives only the largest, unless the
    header sets MIXED_CORRECTIONS (`mixed`); the band section only if it sets BANDS (`bands`).
    0 for a PLAIN site."""
    kinds = [r for r in SECTION_RULES.values()
             if r.allowed(program.sites[site]) and (bands or r.kind != SectionKind.BAND)]
    total, counted = 0, set()
    for r in kinds:
        if r.kind in counted:
            continue
        group = [r] if mixed else [r, *(a for a in kinds if a.kind in r.alternatives)]
        counted |= {g.kind for g in group}
        total += max(g.decoded_limit(program, site) for g in group)
    return total

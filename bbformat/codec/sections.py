"""Side sections as the encoder and the reader use them: a Section as stored, a site's
sections from its fix, and the reader's corrector. What each kind holds, where it is allowed
and how it is coded is codec/section_kinds.py's (its rules: container/section_rules.py)."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import partial

import numpy as np

from ..constants import SECTION_ENTRY_SIZE, Codec
from ..container.program import BlockProgram
from ..container.section_rules import rules_of
from ..errors import DigestError, FormatError
from ..zstdframe import section_compressor
from . import band
from .dtypes import RawTensor
from .runner import Runner, in_turn
from .section_kinds import (
    ANCHOR_PATCHES,
    BAND,
    SECTION_KINDS,
    SIGNS,
    X_PATCHES,
    X_RESIDUALS,
    PlannedSection,
    SiteContext,
    correct_residuals,
    site_plan,
)
from .simulate import SiteFix



@dataclass
class Section:
    kind: int
    site: int
    data: bytes  # decoded bytes
    codec: int = Codec.RAW
    stored: bytes = b""
    # (data, kind) that finish(allow_zstd=True) last chose for: its result stands for them.
    # Not an init field, so dataclasses.replace() starts without it.
    _chosen_for: tuple[bytes, int] | None = field(default=None, init=False, repr=False, compare=False)

    def finish(self, allow_zstd: bool = True) -> "Section":
        """Choose the smaller of raw and zstd for storage (deterministic), where the kind may
        be zstd (a band section is raw only). finish(True) again on the same data and kind
        keeps the first's result instead of compressing again."""
        chosen = self._chosen_for
        if allow_zstd and chosen is not None and chosen[0] is self.data and chosen[1] == self.kind:
            return self
        self.codec, self.stored, self._chosen_for = Codec.RAW, self.data, (self.data, self.kind) if allow_zstd else None
        if allow_zstd and len(self.data) > 64 and Codec.ZSTD in rules_of(self.kind).codecs:
            comp = section_compressor().compress(self.data)
            if len(comp) < len(self.data):
                self.codec, self.stored = Codec.ZSTD, comp
        return self

    @property
    def cost(self) -> int:
        return len(self.stored) + SECTION_ENTRY_SIZE


def _built(planned: PlannedSection) -> Section:
    return Section(planned.codec.kind, planned.ctx.site, planned.encode()).finish(planned.codec.compress_whole)


def build_site_sections(program: BlockProgram, site: int, fix: SiteFix, run: Runner = in_turn) -> list[Section]:
    """A rotated site's sections, in the writer's order; of the ways to store the block's
    corrections the cheapest as built (ties: the one ending in the lower kind). The sections
    are built (encoded, compressed) as independent jobs through `run`: the bytes do not depend on it."""
    return build_sections(program, {site: fix}, run)[site]


def build_sections(program: BlockProgram, fixes: dict[int, SiteFix], run: Runner = in_turn) -> dict[int, list[Section]]:
    """build_site_sections of several sites, every site's sections built through one `run`."""
    plans = {site: site_plan(program, site, fix) for site, fix in fixes.items()}
    planned = [p for plan in plans.values() for p in (*plan.first, *(p for c in plan.block_choices for p in c), *plan.last)]
    built = iter(run([partial(_built, p) for p in planned]))
    out: dict[int, list[Section]] = {}
    for site, plan in plans.items():
        first = [next(built) for _ in plan.first]
        choices = [[next(built) for _ in choice] for choice in plan.block_choices]
        block = min(choices, key=lambda secs: (sum(c.cost for c in secs), secs[-1].kind)) if choices else []
        out[site] = [*first, *block, *(next(built) for _ in plan.last)]
    return out


def side_cost_bound(program: BlockProgram, site: int, fix: SiteFix) -> int:
    """An upper bound on sum(c.cost for c in build_site_sections(program, site, fix)) that
    compresses nothing: every section and group stored raw. The encoder decides with it
    that a site pays for itself, and leaves the zstd work for later (EncodedChunk.finish)."""
    plan = site_plan(program, site, fix)
    block = min((sum(p.raw_cost() for p in choice) for choice in plan.block_choices), default=0)
    return sum(p.raw_cost() for p in plan.first + plan.last) + block


def decoded_limit(program: BlockProgram, kind: int, site: int) -> int:
    """The largest decoded size a section of this kind may declare (SPEC.md 8.2)."""
    return rules_of(kind).decoded_limit(program, site)


class StoredCorrector:
    """The decoder's corrector: reads sign and correction sections ((kind, site) -> decoded bytes).

    margins=True (format 1.4): each site with a band section gets its margin in `margins`: the
    smallest distance from a rounding boundary of this decoder's float64 values that the file
    does not store explicitly, in units of the site's band width (SPEC.md 8.8, 9).

    digests=True (a file with DIGESTS): an x_residuals section that cannot be read against this
    decoder's contexts, at a site with a residual position, is DigestError (SPEC.md 8.4)."""

    def __init__(self, program: BlockProgram, sections: dict[tuple[int, int], bytes], margins: bool = False,
                 digests: bool = False) -> None:
        self.program = program
        self.sections = sections
        self.digests = digests
        self.margins_wanted = margins
        self.margins: dict[int, float] = {}
        for s_idx, s in enumerate(program.sites):
            for kind in SECTION_KINDS.values():
                if kind.required and kind.allowed(s) and (kind.kind, s_idx) not in sections:
                    raise FormatError(f"site {s.name!r} has no {kind.name} section", "E_SECTION_MISSING")

    def signs(self, site: int) -> np.ndarray:
        return SIGNS.decode(SiteContext(self.program, site), self.sections[(SIGNS.kind, site)])

    def _widths(self, site: int) -> np.ndarray | None:
        """The site's band widths, where margins are wanted and the file stores them."""
        data = self.sections.get((BAND.kind, site)) if self.margins_wanted else None
        return None if data is None else BAND.decode(SiteContext(self.program, site), data)

    def _note(self, site: int, distance: float, width: float) -> None:
        self.margins[site] = min(self.margins.get(site, np.inf), distance / width)

    def note_columns(self, site: int, sums: np.ndarray) -> None:
        """A PAPER site's column sums of E (the sign decisions): their margin from 0."""
        widths = self._widths(site)
        if widths is not None:  # a column sum that is not finite counts as 0 (SPEC.md 9 item 7)
            dist = np.where(np.isfinite(sums), np.abs(sums), 0.0)
            self._note(site, float(np.min(dist, initial=np.inf)), float(widths[2]))

    def correct_x(self, site: int, approx: np.ndarray, regenerated: np.ndarray | None = None) -> np.ndarray:
        at = SiteContext(self.program, site)
        res = self.sections.get((X_RESIDUALS.kind, site))
        pat = self.sections.get((X_PATCHES.kind, site))
        out, keep = approx, None
        patches = None if pat is None else X_PATCHES.decode(at, pat)
        widths = self._widths(site)
        if widths is not None and regenerated is not None:
            skip = None if patches is None else patches.positions
            self._note(site, band.min_distance(regenerated, self.program.symbol_dtype, skip), float(widths[0]))
        if patches is not None:  # first: with residuals too (MIXED_CORRECTIONS), patched positions take none
            out = patches.apply(approx)
            if res is not None:
                keep = np.ones(approx.size, dtype=bool)
                keep[patches.positions] = False
        if res is not None:
            positions = approx.size if keep is None else int(np.count_nonzero(keep))
            out = self._residuals(replace(at, approx=approx, keep=keep), res, out, positions)
        return out

    def _residuals(self, at: SiteContext, res: bytes, base: np.ndarray, positions: int) -> np.ndarray:
        """The block corrected by x_residuals (base at patched positions). Its groups follow
        contexts of this decoder's own values: with DIGESTS and a residual position, a failure
        is E_DIGEST (SPEC.md 8.4)."""
        assert at.approx is not None
        try:
            return correct_residuals(res, at.approx, base, self.program.symbol_dtype, at.keep)
        except FormatError as exc:
            if not self.digests or positions == 0 or isinstance(exc, DigestError):
                raise
            raise DigestError(f"site {self.program.sites[at.site].name!r}: x_residuals do not fit the contexts of this reader's "
                              f"regenerated values ({exc.code}: {exc}); its numerics left the band, or the section does "
                              "not match the writer's own decoding") from None

    def correct_anchor(self, site: int, approx: RawTensor, unrotated: np.ndarray | None = None) -> RawTensor:
        pat = self.sections.get((ANCHOR_PATCHES.kind, site))
        patches = None if pat is None else ANCHOR_PATCHES.decode(SiteContext(self.program, site), pat)
        widths = self._widths(site)
        if widths is not None and unrotated is not None:
            skip = None if patches is None else patches.positions
            self._note(site, band.min_distance(unrotated, approx.dtype, skip), float(widths[1]))
        if patches is None:
            return approx
        return RawTensor(approx.dtype, patches.apply(approx.bits.reshape(-1)).reshape(approx.shape))

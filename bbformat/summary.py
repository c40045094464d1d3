"""A readable summary of a container, computed from its bytes alone: `bbformat.inspect` and
`bbformat inspect` (the module is not called inspect, so that the function does not shadow it)."""
from __future__ import annotations

import base64
import binascii
import os
from typing import Any, BinaryIO

from .container.program import BlockProgram, bits_of
from .codec.parts import read_parts
from .codec.payload import decode_payload, part_codecs
from .codec.section_kinds import SECTION_KINDS, SiteContext
from .compat import legacy_reader_problems
from .constants import CODEC_NAMES, CRC_SIZE, SECTION_KIND_NAMES, Codec, RequiredFlag, SectionKind
from .container.chunks import parse_chunk
from .container.crc import crc32c
from .container.framing import Header
from .reader import Reader, StreamReader, resolve_budget


def _side_files(meta: dict[str, Any]) -> dict[str, bytes]:
    files: Any = meta.get("files")
    out = {}
    for name in ("config.json", "tokenizer_config.json", "tokenizer.json"):
        try:
            out[name] = base64.b64decode(files[name], validate=True)
        except (TypeError, KeyError, ValueError, binascii.Error):
            continue
    return out


def inspect(path: str | os.PathLike[str] | BinaryIO, *, max_block_bytes: int | str | None = "auto",
            max_site_dim: int | None = None) -> dict[str, Any]:
    """Sizes, sites and corrections of every chunk, and whether each chunk's CRC holds.
    max_block_bytes as for Reader (SPEC.md 11.5). `path` may be a binary stream: one that
    cannot seek (a pipe) is read forward, a chunk at a time (StreamReader.raw_chunks)."""
    budget = resolve_budget(max_block_bytes)
    if not isinstance(path, (str, os.PathLike)) and not path.seekable():
        sr = StreamReader(path, max_block_bytes=budget, max_site_dim=max_site_dim)
        header, meta = sr.header, sr.header.metadata
        blocks = [_block(i, raw, len(raw), int.from_bytes(raw[-CRC_SIZE:], "little"), header.required_flags, budget, max_site_dim)
                  for i, raw in enumerate(sr.raw_chunks())]
        assert sr.size is not None
        container, name = sr.size, "-"
    else:
        with Reader(path, max_block_bytes=budget, max_site_dim=max_site_dim) as r:
            header, meta = r.header, r.metadata
            blocks = [_block(i, r.read_chunk_bytes(i), e.length, e.crc, header.required_flags, budget, max_site_dim)
                      for i, e in enumerate(r.entries)]
            container = r.file_size
        name = str(path) if isinstance(path, (str, os.PathLike)) else "-"
    return _info(name, header, meta, blocks, container)


def _block(i: int, raw: bytes | bytearray, length: int, index_crc: int, flags: int, budget: int | None,
           max_site_dim: int | None) -> dict[str, Any]:
    """One chunk's entry of inspect's "blocks" (its stored bytes `raw`, CRC checked here)."""
    crc_ok = crc32c(raw[:-CRC_SIZE]) == int.from_bytes(raw[-CRC_SIZE:], "little") == index_crc
    ch = parse_chunk(raw, expected_index=i, check_crc=False, max_block_bytes=budget, max_site_dim=max_site_dim,
                     required_flags=flags, decode_payload=decode_payload)
    p = ch.program
    w = p.symbol_bits
    plain = sum(t.numel * bits_of(t.dtype) // 8 for t in p.tensors)
    bound = sum(s.dim * (s.dim - 1) // 2 * w for s in p.sites)
    sign_bits = corrections = corr_bytes = band_bytes = 0
    per_site = {k: {"corrections": 0, "correction_bytes": 0} for k in range(len(p.sites))}
    for sec in ch.sections:
        if sec["kind"] == SectionKind.PAYLOAD:  # not side information
            continue
        if sec["kind"] == SectionKind.BAND:
            band_bytes += sec["stored_length"]
        tally = SECTION_KINDS[sec["kind"]].tally(SiteContext(p, sec["site"]), ch.side[(sec["kind"], sec["site"])])
        sign_bits += tally.sign_bits
        if tally.corrections is not None:
            corrections += tally.corrections
            corr_bytes += sec["stored_length"]
            per_site[sec["site"]]["corrections"] += tally.corrections
            per_site[sec["site"]]["correction_bytes"] += sec["stored_length"]
    payload = next(s for s in ch.sections if s["kind"] == SectionKind.PAYLOAD)
    return {
        "index": i,
        "name": p.name,
        "symbol_dtype": p.symbol_dtype,
        "tensors": [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape)} for t in p.tensors],
        "rotations": [
            {
                "name": s.name,
                "dim": s.dim,
                "anchor": p.tensors[s.anchor].name,
                "mode": "paper" if s.paper else "symmetric",
                "stored_plainly": s.plain,
                **per_site[k],
            }
            for k, s in enumerate(p.sites)
        ],
        "plain_bytes": plain,
        "chunk_bytes": length,
        "payload_bytes": payload["stored_length"],
        "payload_codec": CODEC_NAMES[payload["codec"]],
        "payload_parts": _part_codecs(raw, payload, p, flags),
        "sign_bits": sign_bits,
        "corrections": corrections,
        "correction_bytes": corr_bytes,
        "band_bytes": band_bytes,
        "sections": [
            {"kind": SECTION_KIND_NAMES[s["kind"]], "codec": CODEC_NAMES[s["codec"]],
             "site": s["site"] if s["kind"] != SectionKind.PAYLOAD else None,
             "stored_bytes": s["stored_length"], "decoded_bytes": s["decoded_length"]}
            for s in ch.sections
        ],
        "gross_bound_bits": bound,
        "crc": "ok" if crc_ok else "MISMATCH",
        "content_crc": None if ch.content_crc is None else f"{ch.content_crc:08x}",
        "values": sum(t.numel for t in p.tensors),
    }


def _info(name: str, header: Header, meta: dict[str, Any], blocks: list[dict[str, Any]], container: int) -> dict[str, Any]:
    """inspect's result from the header and the blocks' entries."""
    tot_plain = sum(b["plain_bytes"] for b in blocks)
    tot_bound = sum(b["gross_bound_bits"] for b in blocks)
    tot_values = sum(b.pop("values") for b in blocks)
    weights = container - header.length
    saved = 8 * (tot_plain - weights)
    return {
        "file": name,
        "version": f"{header.major}.{header.minor}",
        "architecture": meta.get("architecture"),
        "scheme": header.scheme,
        "tolerance": meta.get("tolerance"),
        "content_digests": header.has_digests,
        "band_widths": bool(header.required_flags & RequiredFlag.BANDS),
        "warnings": [] if "directory" in meta else legacy_reader_problems(_side_files(meta)),  # plain: not for TC's loader
        "dtypes": sorted({t["dtype"] for b in blocks for t in b["tensors"]}),
        "directory": _directory_counts(meta),
        "blocks": blocks,
        "totals": {
            "plain_bytes": tot_plain,
            "container_bytes": container,
            "metadata_bytes": header.length,
            "weights_bytes": weights,
            "saved_bits": saved,
            "values": tot_values,
            "bits_per_weight": 8.0 * weights / tot_values if tot_values else 0.0,
            "plain_bits_per_weight": 8.0 * tot_plain / tot_values if tot_values else 0.0,
            "file_bits_per_weight": 8.0 * container / tot_values if tot_values else 0.0,
            "saved_pct_of_plain": 100.0 * saved / (8 * tot_plain) if tot_plain else 0.0,
            "gross_bound_bits": tot_bound,
            "saved_pct_of_bound": 100.0 * saved / tot_bound if tot_bound else 0.0,
            "rotations": sum(len(b["rotations"]) for b in blocks),
            "rotations_stored_plainly": sum(x["stored_plainly"] for b in blocks for x in b["rotations"]),
            "sign_bits": sum(b["sign_bits"] for b in blocks),
            "corrections": sum(b["corrections"] for b in blocks),
            "correction_bytes": sum(b["correction_bytes"] for b in blocks),
            "band_bytes": sum(b["band_bytes"] for b in blocks),
            "all_crc_ok": all(b["crc"] == "ok" for b in blocks),
        },
    }


def _part_codecs(raw: bytes | bytearray, payload: dict[str, Any], program: BlockProgram, flags: int) -> dict[str, int] | None:
    """A codec-4 payload's parts by codec name, e.g. {"exponent": 7} (SPEC.md 8.9); None for
    any other payload."""
    if payload["codec"] != Codec.PARTS:
        return None
    stored = memoryview(raw)[payload["offset"] : payload["offset"] + payload["stored_length"]]
    out: dict[str, int] = {}
    for part in read_parts(stored, program.payload_symbols(), program.symbol_bits // 8, part_codecs(flags, program.symbol_dtype)):
        out[CODEC_NAMES[part.codec]] = out.get(CODEC_NAMES[part.codec], 0) + 1
    return out


def bound_words(info: dict[str, Any]) -> str:
    """What "N% of the gross bits-back bound" means, in a few words (inspect's summary and pack's
    report): the bound is what the rotations alone can save; the entropy stage saves on top of
    it, so a file with coded payloads can exceed 100%."""
    t = info["totals"]
    if not t["gross_bound_bits"]:
        return "no bits back (no rotation sites)"
    coded = any(b["payload_codec"] != "raw" for b in info["blocks"])
    return (f"{t['saved_pct_of_bound']:.1f}% of the gross bits-back bound ({t['gross_bound_bits']:,} b: the most the "
            "rotations alone can save" + ("; the entropy stage saves beyond it" if coded else "") + ")")


def _directory_counts(meta: dict[str, Any]) -> dict[str, int] | None:
    """A packed plain directory's file counts (metadata `directory`); None for a sliced checkpoint."""
    st, files = (meta.get("directory") or {}), meta.get("files")
    if not isinstance(st, dict) or not isinstance(st.get("safetensors"), list):
        return None
    return {"safetensors_files": len(st["safetensors"]), "other_files": len(files) if isinstance(files, dict) else 0}


def format_summary(info: dict[str, Any]) -> str:
    t = info["totals"]
    plainly = any(r["stored_plainly"] for b in info["blocks"] for r in b["rotations"])
    lines = [
        f"{info['file']}: container format {info['version']}",
        f"architecture {info['architecture']}  scheme {info['scheme']}  tolerance {info['tolerance']}  dtypes {','.join(info['dtypes'])}",
        "content digests: " + ("yes (every chunk records a CRC32C of its decoded values; `bbformat verify` checks them)"
                               if info["content_digests"] else "no (format 1.0/1.1: exactness on another reader cannot be checked)")
        + ("; band widths stored (`bbformat verify` reports this reader's margin)" if info.get("band_widths") else ""),
        *([] if not info.get("directory") else [
            f"a plain Hugging Face directory: {_count(info['directory']['safetensors_files'], 'safetensors file')} and "
            f"{_count(info['directory']['other_files'], 'other file')}, kept byte for byte (`bbformat unpack` gives it back)"]),
        "",
        f"{'#':>3} {'block':<14} {'tensors':>7} {'rotations (dim)':<22} {'plain B':>11} {'payload B':>11} {'coding':>6} {'sign b':>6} {'corr':>7} {'corr B':>8} {'crc':>5}",
    ]
    for b in info["blocks"]:
        rots = " ".join(f"{r['dim']}{'P' if r['stored_plainly'] else ''}" for r in b["rotations"]) or "-"
        lines.append(
            f"{b['index']:>3} {b['name'][:14]:<14} {len(b['tensors']):>7} {rots[:22]:<22} {b['plain_bytes']:>11,} {b['payload_bytes']:>11,} "
            f"{b['payload_codec']:>6} {b['sign_bits']:>6} {b['corrections']:>7} {b['correction_bytes']:>8,} {b['crc']:>5}"
        )
    lines += [""]
    if plainly:  # the legend of the P marks above, only when there is one
        lines.append("P = rotation stored plainly (did not pay for itself, or no bits source)")
    lines += [
        f"plain array layout  {t['plain_bytes']:>14,} B",
        f"container           {t['container_bytes']:>14,} B  (metadata/header {t['metadata_bytes']:,} B, weights {t['weights_bytes']:,} B)",
        f"bits per weight     {t['bits_per_weight']:>14.3f}    (weights only, {t['values']:,} values; plain {t['plain_bits_per_weight']:g}; "
        f"whole file {t['file_bits_per_weight']:.3f})",
        f"bits saved          {t['saved_bits']:>14,} b  = {t['saved_pct_of_plain']:.3f}% of plain, {bound_words(info)}",
        f"rotations {t['rotations']} ({t['rotations_stored_plainly']} plain)  sign bits {t['sign_bits']}  corrections {t['corrections']:,} ({t['correction_bytes']:,} B)"
        + (f"  band widths {t['band_bytes']:,} B" if t.get("band_bytes") else "") + f"  CRC {'all ok' if t['all_crc_ok'] else 'MISMATCH'}",
    ]
    return "\n".join(lines)


def _count(n: int, noun: str) -> str:
    """"1 other file", "12 other files"."""
    return f"{n} {noun}{'' if n == 1 else 's'}"

"""The public API: pack, unpack, open_container, inspect."""
from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import warnings
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, BinaryIO

import numpy as np

from .codec import host_native
from .codec.dtypes import RawTensor
from .codec.payload import on_pool, part_threads
from .codec.linalg import REFERENCE, Linalg, device_backend, torch_device_of
from .codec.entropy import check_entropy_mode
from . import plaindir
from .constants import FORMAT_VERSIONS, PACK_SCHEMES, SIDE_FILES_MAX_BYTES, RequiredFlag, written_version
from .container.framing import Header, check_format_version
from .codec.encoder import EncodedChunk, Moments, SiteReport
from .codec.layout import ChunkLayout, ModelLayout
from .container.program import TensorEntry, bits_of
from .compat import legacy_reader_problems
from .container.digest import content_crc
from .errors import FormatError, InputError, OutputExistsError, VerifyError, check_choice
from .fsutil import check_output_file, refuse_existing, write_synced
from .packing import BoundedWorker, EncodeChain, Progress, encode_chunks
from .reader import DECODE_WORKERS, DecodedBlock, Reader, StreamReader, decode_workers
from .writer import Writer

if TYPE_CHECKING:  # torch loads only when a torch tensor is made (a fast `import bbformat`, CLI)
    import torch

    from .checkpoint import Checkpoint

# paper: the paper's OPT / Llama thresholds; Phi-2 (LayerNorm, like OPT) and Phi-3 (RMSNorm, like Llama) by analogy
DEFAULT_TOLERANCE = {("paper", "opt"): 0.01, ("paper", "llama"): 0.005, ("paper", "phi"): 0.01, ("paper", "phi3"): 0.005}
FORMAT_VERSION = FORMAT_VERSIONS[0]  # what pack writes unless told format_version="1.1"


@dataclass
class PackReport:
    path: str
    scheme: str
    tolerance: float
    architecture: str
    plain_bytes: int
    container_bytes: int
    metadata_bytes: int
    gross_bound_bits: int
    sites: list[SiteReport] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # side files an older transformers would misread (compat.py)

    @property
    def saved_bits(self) -> int:
        return 8 * (self.plain_bytes - (self.container_bytes - self.metadata_bytes))


def _digest(t: RawTensor) -> str:
    return hashlib.sha256(np.ascontiguousarray(t.little_endian()).reshape(-1).view(np.uint8).data).hexdigest()  # no copy; hashlib drops the GIL


def _encode_files(files: dict[str, bytes]) -> dict[str, str]:
    return {name: base64.b64encode(data).decode("ascii") for name, data in sorted(files.items())}


def _decode_files(files: dict[str, str]) -> dict[str, bytes]:
    return {name: base64.b64decode(data) for name, data in files.items()}


def pack(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    scheme: str | None = None,
    tolerance: float | None = None,
    verify: bool = False,
    progress: Progress | None = None,
    calibration: str | os.PathLike[str] | torch.Tensor | None = None,
    calibration_samples: int = 16,
    calibration_seqlen: int = 512,
    entropy: str = "auto",
    format_version: str = FORMAT_VERSION,
    device: str | Linalg | None = None,
    overwrite: bool = False,
    threads: int | None = None,
) -> PackReport:
    """Encode a SliceGPT checkpoint directory (TransformerCompression layout), or any plain
    Hugging Face model directory, into `dst`.

    A plain directory (config.json, safetensors weights, no SlicingConfig; bbformat.plaindir)
    is packed with scheme "none", every file of it byte for byte: `unpack` gives the same
    directory back. `scheme` None (the default) is "symmetric" for a sliced checkpoint and
    "none" for a plain directory; "symmetric" or "paper" on a plain directory is InputError.

    `dst` must not exist unless `overwrite` (OutputExistsError, E_EXISTS, before any work); the
    finished file is published under its name atomically and, without `overwrite`, only if
    nothing has appeared there meanwhile (fsutil.rename_no_replace). With `overwrite` a file
    or symlink at `dst` is replaced (a symlink itself, not its target); a directory, a device
    or FIFO, and one of the input's own files never are.

    `calibration` (a UTF-8 text file, or a (samples, seqlen) tensor of token ids) makes
    the encoder round rotated tensors with error feedback under the model's own input
    statistics, so the stored rotated model stays closer to the input's function (Llama).
    Decoding is unaffected.

    `entropy` codes each chunk's payload after bits-back (SPEC.md 8.6, 8.7): "none" (raw),
    "zstd", "planes" (byte planes with per-tensor contexts), "exponent" (each float's exponent
    and top mantissa bits as one rANS symbol; format 1.3) or "auto" (the smallest per chunk
    of those the format version allows; the default, for every scheme). "planes" needs a 1.1
    reader at least, "exponent" a 1.3 reader, and so does "auto" in format 1.3 when a chunk
    chose codec 3. "none" stores payloads raw: larger (96% of plain against 64-82% with
    "auto", BENCHMARKS.md 15) and a little faster to decode.

    `scheme` "none" takes no bits back: no rotation, the entropy stage alone, so unpack gives
    back the input's bits exactly (a 1.2 file).

    `format_version` "1.6" (the default) writes what "1.5" writes for a model of float16,
    bfloat16 and float32 tensors, byte for byte (its dtype codes of other dtypes, SPEC.md 6.1,
    need Writer(..., dtypes=True)). "1.5" is 1.4 with each payload of more than 2^21 symbols
    cut into parts that a reader decodes on several cores (payload codec 4, SPEC.md 8.9; 1.4
    readers refuse it; `--entropy none` stores payloads raw and is written as 1.4). "1.4" is
    1.3 plus a band section per rotated site (the
    band widths, from which verify measures a reader's margin, SPEC.md 8.8 and 9; 1.3
    readers refuse it; scheme "none" has no sites and is written as 1.3 or 1.2). "1.3" is
    1.2 with payload codec 3 allowed; a file whose payloads do not use it is written as 1.2. "1.2" records each chunk's digest of its decoded values,
    and stores explicitly every regenerated value another correct reader could round
    differently (the band, SPEC.md 9 and 12.6), so every conforming reader decodes the
    same bits and can prove it; 1.1 readers refuse such files. "1.1" writes files that 1.0
    and 1.1 readers read (1.0 unless "planes" or "auto"), exact only on readers whose
    floating point matches the packing machine's, and unverifiable.

    `device` runs the linear algebra there (codec/linalg.py: "cpu", the reference, by default;
    "cuda", "cuda:N", "torch:DEV"), the encoder's simulation of the decoder and its band
    included, so the corrections and the band are computed from that device's own results.
    Every reader still decodes the file bit-exactly within the band, and checks it by the
    digests (format 1.2). A missing or failing device is DeviceError (E_DEVICE) before or
    instead of writing anything.

    `threads`: how many threads code the parts of one payload (None: every CPU this process
    may use); the bytes do not depend on it.

    The output is deterministic for a given software and thread
    environment (the moments are rounded to 10 bits, which makes a differing BLAS or
    thread count flip a rounding decision rarely, but not never). On another device, for a
    given device model, driver and library versions (README, Devices)."""
    if scheme is not None:
        check_choice("scheme", scheme, PACK_SCHEMES)
    check_entropy_mode(entropy)
    check_format_version(format_version, entropy)
    _check_scheme_options(scheme, format_version, calibration)
    _refuse_output_early(Path(src), Path(dst), overwrite)
    if plaindir.is_plain_dir(Path(src)):
        if scheme not in (None, "none"):
            raise InputError(f"scheme {scheme!r} needs SliceGPT's rotation sites (a sliced checkpoint with its SlicingConfig); "
                             f"{src} is a plain Hugging Face directory: pack it with scheme 'none' (its default)")
        _check_scheme_options("none", format_version, calibration)
        return _pack_plain(Path(src), dst, tolerance, verify, progress, entropy, format_version, device, overwrite, threads)
    scheme = scheme or "symmetric"
    from .checkpoint import read_checkpoint  # torch: after the refusals that need none

    _check_paths(Path(src), Path(dst), overwrite)
    la = device_backend(device)
    # Every input check (files, pickle, JSON, config vs tensors, NaN/Inf) happens before the
    # Writer creates anything at dst. The weights are mapped, not read: each block's tensors
    # are read when it is encoded and released after (memory: a few blocks, not the model).
    with read_checkpoint(Path(src)) as ckpt:
        return _pack_checkpoint(ckpt, dst, scheme, tolerance, verify, progress, calibration, calibration_samples,
                                calibration_seqlen, entropy, format_version, la, overwrite, threads)


def _check_scheme_options(scheme: str | None, format_version: str, calibration: object) -> None:
    if scheme == "none" and format_version == "1.1":
        raise InputError("scheme 'none' needs format 1.2 or later (1.1 readers know only the paper and symmetric schemes)")
    if scheme == "none" and calibration is not None:
        raise InputError("--calibration rounds rotated weights; scheme 'none' rotates nothing")


def _pack_plain(src: Path, dst: str | os.PathLike[str], tolerance: float | None, verify: bool, progress: Progress | None,
                entropy: str, format_version: str, device: str | Linalg | None, overwrite: bool, threads: int | None) -> PackReport:
    """pack of a plain Hugging Face directory: scheme none, every file kept (bbformat.plaindir)."""
    _check_output_against(plaindir.walk(src), src, Path(dst), overwrite)
    tolerance = _checked_tolerance(0.0 if tolerance is None else tolerance)
    la = device_backend(device)
    with plaindir.read_plain_dir(src, SIDE_FILES_MAX_BYTES) as d:  # every check before dst is created
        layout = plaindir.plain_layout(d)
        dtypes = d.extended_dtypes()  # a file holding them is 1.6 (DTYPES); one of floats alone stays 1.5 or lower
        if dtypes and format_version != "1.6":
            raise InputError(f"{src} holds {', '.join(sorted(dtypes))} tensors, which only format 1.6 stores "
                             f"(--format-version {format_version} was asked for)")
        metadata = {
            "format": "bbformat",
            "format_version": written_version(format_version, entropy, sites=False, dtypes=bool(dtypes)),
            "architecture": d.architecture,
            "scheme": "none",
            "tolerance": tolerance,
            "keys": d.keys,
            "files": _encode_files(d.files),
            "directory": plaindir.directory_metadata(d),
        }
        report = PackReport(str(dst), "none", tolerance, d.architecture, 0, 0, 0, 0)
        return _encode_into(dst, layout, d.tensor, metadata, report, None, verify, progress, entropy, format_version, la,
                            overwrite, threads, dtypes=bool(dtypes), describe=d.describe)


def _checked_tolerance(tolerance: float) -> float:
    if not (tolerance >= 0 and np.isfinite(tolerance)):
        raise InputError(f"tolerance must be a finite number >= 0, got {tolerance}")
    return tolerance


def _pack_checkpoint(ckpt: Checkpoint, dst: str | os.PathLike[str], scheme: str, tolerance: float | None, verify: bool,
                     progress: Progress | None, calibration: str | os.PathLike[str] | torch.Tensor | None,
                     calibration_samples: int, calibration_seqlen: int, entropy: str, format_version: str = FORMAT_VERSION,
                     la: Linalg = REFERENCE, overwrite: bool = False, threads: int | None = None) -> PackReport:
    from .adapters import plan

    layout = plan(ckpt, "symmetric" if scheme == "none" else scheme)
    if scheme == "none":  # the same blocks, no rotation sites: every tensor is stored as given
        layout = ModelLayout(layout.architecture, "none", [ChunkLayout(c.name, c.tensors, ()) for c in layout.chunks])
    if tolerance is None:
        tolerance = DEFAULT_TOLERANCE.get((scheme, layout.architecture), 0.0)
    tolerance = _checked_tolerance(tolerance)
    metadata = {
        "format": "bbformat",
        "format_version": written_version(format_version, entropy, sites=scheme != "none"),
        "architecture": layout.architecture,
        "scheme": scheme,
        "tolerance": tolerance,
        "stem": ckpt.stem,
        "keys": list(ckpt.state_dict.keys()),
        "files": _encode_files(ckpt.extra_files),
    }
    moments = None
    if calibration is not None:
        from .calibrate import calibration_tokens, check_calibratable, stream_moments

        check_calibratable(ckpt)
        import torch

        tokens = calibration if isinstance(calibration, torch.Tensor) else calibration_tokens(
            ckpt, calibration, calibration_samples, calibration_seqlen)
        moments = stream_moments(ckpt, tokens)
        metadata["rounding"] = "feedback"
        metadata["calibration_tokens"] = int(tokens.numel())

    from .tensors import raw_dtype, torch_view_raw

    def get(name: str) -> RawTensor:  # read-only, uncopied; its pages released when it is dropped
        return torch_view_raw(ckpt.state_dict[name], name, partial(ckpt.release, name))

    def describe(name: str) -> tuple[str, tuple[int, ...]]:
        t = ckpt.state_dict[name]
        return raw_dtype(t, name), tuple(int(n) for n in t.shape)

    report = PackReport(str(dst), scheme, tolerance, layout.architecture, 0, 0, 0, 0,
                        warnings=legacy_reader_problems(ckpt.extra_files))
    return _encode_into(dst, layout, get, metadata, report, moments, verify, progress, entropy, format_version, la, overwrite,
                        threads, describe=describe)


def _encode_into(dst: str | os.PathLike[str], layout: ModelLayout, get: Callable[[str], RawTensor], metadata: dict[str, object],
                 report: PackReport, moments: Moments | None, verify: bool, progress: Progress | None, entropy: str, format_version: str,
                 la: Linalg, overwrite: bool, threads: int | None, dtypes: bool = False,
                 describe: Callable[[str], tuple[str, tuple[int, ...]]] | None = None) -> PackReport:
    """Encode the layout's chunks (tensors from `get`; `describe` gives a tensor's dtype and shape
    without reading it) into a container at dst, filling `report` (`dtypes`: some tensors are
    of format 1.6's EXTENDED_DTYPES)."""
    scheme, tolerance = report.scheme, report.tolerance
    digests: list[dict[str, str]] = []
    # The pipeline (packing.py): chunk i is compressed and written by one worker, in order, while
    # chunk i + 1 encodes; the bytes are those of a sequential pack. A chunk is dropped as soon
    # as it is written: the encoder holds one block, the worker at most PACK_QUEUE more.
    coding = "symmetric" if scheme == "none" else scheme  # no sites: no mode to choose
    spread = part_threads(threads)  # the encoder's element-wise steps on threads of their own (host_native.spread)
    with Writer(dst, scheme, len(layout.chunks), metadata, entropy=entropy, background_header=True,
                format_version=format_version, overwrite=overwrite, threads=threads, dtypes=dtypes) as w, \
            BoundedWorker() as worker, la.threads(), ThreadPoolExecutor(spread, thread_name_prefix="bbformat-spread") as pool, \
            host_native.spread(on_pool(pool), spread):
        chain = EncodeChain(layout, get, coding, tolerance, moments, band=w.mixed_corrections, progress=progress, la=la,
                            bands=w.bands, describe=describe)
        for _chunk, enc in encode_chunks(chain):
            if verify:  # what --verify compares the decoded file against; nothing else reads them
                digests.append({n: _digest(t) for n, t in enc.intended.items()})
            crc = content_crc(enc.program, enc.intended) if w.digests else None
            enc.intended = {}
            report.sites.extend(enc.reports)  # a deferred site's side_bytes are filled in by finish()
            report.plain_bytes += enc.program.plain_bytes()
            report.gross_bound_bits += enc.program.bits_back_bound()
            worker.submit(_write_chunk, w, enc, crc)  # a worker's error is raised here or at drain()
            del enc
        worker.drain()
        report.metadata_bytes = w.metadata_bytes
        # --verify decodes the finished temp file; only a verified file replaces dst
        report.container_bytes = w.close(check=(lambda tmp: verify_container(tmp, digests, la, threads)) if verify else None)
    return report


def _write_chunk(w: Writer, enc: EncodedChunk, crc: int | None) -> None:
    """On the writer's one worker thread: finish the chunk's sections, code its payload, write it."""
    w.add_chunk(enc.program, w.code_sections(enc.program, enc.finish(w.runner())), coded=True, content_crc=crc)


def _refuse_output_early(src: Path, dst: Path, overwrite: bool) -> None:
    """The output checks that need no look at SRC's files, so no torch (a refusal in a few
    hundred ms): OUT's parent, and an OUT that exists outside SRC (inside it, _check_paths
    first says whether it is one of the input's files)."""
    check_output_parent(dst)
    try:
        inside = dst.resolve().is_relative_to(src.resolve())
    except OSError:
        return
    if not inside and not dst.is_dir():
        check_output_file(dst, overwrite)


def _check_paths(src: Path, dst: Path, overwrite: bool = False) -> None:
    """Refuse an output path that is a directory, would replace one of the input's files, is
    not a regular file, or exists without `overwrite`."""
    from .checkpoint import input_files

    _check_output_against(input_files(src), src, dst, overwrite)  # also: SRC exists and holds a weights file


def _check_output_against(inputs: list[Path] | list[str], src: Path, dst: Path, overwrite: bool) -> None:
    """_check_paths for these input files (paths, or relative to src)."""
    inputs = [src / p if isinstance(p, str) else p for p in inputs]
    if dst.is_dir():
        raise InputError(f"{dst} is a directory; give the path of the .bb file to write")
    check_output_parent(dst)
    target = dst.resolve()
    for p in inputs:
        if p.resolve() == target:
            raise InputError(f"refusing to write {dst}: it would replace the input file {p}")
    check_output_file(dst, overwrite)


def check_output_parent(dst: Path) -> None:
    """pack's OUT and unpack's DST are created, never their parent directories (README, Paths):
    a mistyped path creates nothing, and a failed run leaves nothing behind."""
    parent = dst.parent if str(dst.parent) else Path(".")
    if not parent.is_dir():
        what = "is not a directory" if os.path.lexists(parent) else "does not exist"
        raise InputError(f"output directory {parent} {what} (bbformat creates the output, not its parents)")


def verify_container(path: str | os.PathLike[str], digests: list[dict[str, str]], device: str | Linalg | None = None,
                     threads: int | None = None) -> None:
    """pack --verify: decode the written file (on `device`, with the reader's fallback) and
    compare every tensor's SHA-256 with the encoder's intent."""
    with Reader(path, device=device, share_payload=True, threads=threads) as r:
        if len(r) != len(digests):
            raise VerifyError("chunk count differs from what was encoded")
        for block in r.iter_blocks():
            want = digests[block.index]
            got = {n: _digest(t) for n, t in block.tensors.items()}
            if got != want:
                bad = sorted(n for n in want if got.get(n) != want[n])
                raise VerifyError(f"block {block.name}: decoded tensors differ from the encoder's intent: {', '.join(bad[:5])}")


@dataclass
class VerifyReport:
    path: str
    format_version: str
    chunks: int
    tensors: int
    values: int
    decoded_bytes: int
    digests: bool = False  # the file records a digest of each chunk's decoded values (1.2)
    inexact: list[str] = field(default_factory=list)  # "index name" of chunks whose digest differed
    device: str = "cpu"  # the backend that decoded (codec/linalg.py names)
    fallback: list[str] = field(default_factory=list)  # "index name" of chunks the device missed, decoded again by the reference
    note: str | None = None  # e.g. a file without digests decoded with the reference instead of the device asked for
    bands: bool = False  # 1.4: the file stores band widths (BANDS)
    margin: float | None = None  # with bands: the smallest site margin this reader had (SPEC.md 9 item 7; inf: no value counted)
    margin_chunk: str | None = None  # "index name" of the chunk where it was

    @property
    def exact(self) -> bool | None:
        """True: every chunk's decoded values matched its digest; False: some did not; None: no digests."""
        return (not self.inexact) if self.digests else None

    def as_dict(self) -> dict[str, object]:
        return {"path": self.path, "format_version": self.format_version, "chunks": self.chunks, "tensors": self.tensors,
                "values": self.values, "decoded_bytes": self.decoded_bytes, "crc_verified": True, "content_digests": self.digests,
                "exact": self.exact, "inexact_chunks": list(self.inexact), "device": self.device,
                "fallback_chunks": list(self.fallback), "note": self.note,
                "band_widths": self.bands,
                "band_margin": self.margin if self.margin is None or math.isfinite(self.margin) else None,
                "band_margin_chunk": self.margin_chunk if self.margin is not None and math.isfinite(self.margin) else None}

    def margin_line(self) -> str | None:
        """What the band margin says, in one line (None: the file stores no band widths)."""
        if self.margin is None:
            return None
        m = self.margin
        if not math.isfinite(m):
            return "band margin: no value to measure (every value near a boundary is stored in the file)"
        said = ("no value came within its band width of a rounding boundary" if m >= 1 else
                f"this reader's float64 results differ from the writer's by more than {1 - m:.3g} of a band width somewhere")
        return f"band margin {m:.4g} (smallest, chunk {self.margin_chunk}; the writer's own decoding has > 1): {said}"

    def summary(self) -> str:
        counts = f"{self.chunks} chunks ({self.tensors} tensors, {self.values:,} values)"
        if not self.digests:
            return (f"{self.path}: decoded all {counts}; every CRC32C and structural check passed. Format "
                    f"{self.format_version} files carry no digest of the decoded values, so this is not a proof of "
                    "exactness on this reader")
        if not self.inexact:
            fell = "" if not self.fallback else (f"; {len(self.fallback)} of them missed their digests on {self.device} and were "
                                                 "decoded again with the reference")
            return f"{self.path}: exact: all {self.chunks} chunks verified ({self.tensors} tensors, {self.values:,} values{fell})"
        return (f"{self.path}: NOT exact on this reader: {len(self.inexact)} of {self.chunks} chunks decoded to other values "
                f"than their digests ({', '.join(self.inexact[:5])}{', ...' if len(self.inexact) > 5 else ''})")


def verify(path: str | os.PathLike[str] | BinaryIO, *, max_block_bytes: int | str | None = "auto", max_site_dim: int | None = None,
           workers: int | None = None, progress: Progress | None = None, device: str | Linalg | None = None, threads: int | None = None,
           margins: bool = True) -> VerifyReport:
    """Decode every block (CRC32C, every MUST-reject check and, in a 1.2 file, each chunk's
    content digest) and drop it: memory about `workers` + 1 blocks. Raises the first error met,
    except a digest mismatch: every chunk is decoded and the report lists those that missed.
    On a `device` other than the reference, the report lists the chunks that missed their
    digests there and were decoded again with the reference (`fallback`). In a 1.4 file the
    report has this reader's smallest band margin (`margin`, SPEC.md 9) unless margins=False
    (measuring it costs about 50 ns per regenerated value on one core). `threads`: how many
    threads decode the parts of one block's payload (format 1.5; None: every CPU). `path` may
    be a binary stream; one that cannot seek (a pipe) is decoded forward as it arrives
    (StreamReader; `workers` does not apply)."""
    if not isinstance(path, (str, os.PathLike)) and not path.seekable():
        sr = StreamReader(path, max_block_bytes=max_block_bytes, max_site_dim=max_site_dim, allow_inexact=True, device=device,
                          threads=threads, margins=margins)
        return _verify_report("-", sr.header, sr.linalg.name, sr.note, iter(sr), progress)
    with Reader(path, max_block_bytes=max_block_bytes, max_site_dim=max_site_dim, allow_inexact=True, device=device,
                margins=margins, share_payload=True, threads=threads) as r:
        name = str(path) if isinstance(path, (str, os.PathLike)) else "-"
        return _verify_report(name, r.header, r.linalg.name, r.note, r.iter_blocks("reverse", workers=decode_workers(workers)),
                              progress)


def _verify_report(name: str, header: Header, device: str, note: str | None, blocks: Iterator[DecodedBlock],
                   progress: Progress | None) -> VerifyReport:
    n = header.chunk_count
    rep = VerifyReport(name, f"{header.major}.{header.minor}", n, 0, 0, 0, digests=header.has_digests,
                       bands=bool(header.required_flags & RequiredFlag.BANDS), device=device, note=note)
    for k, block in enumerate(blocks):
        if block.exact is False:
            rep.inexact.append(f"{block.index} {block.name}")
        if block.fallback:
            rep.fallback.append(f"{block.index} {block.name}")
        if block.margin is not None and (rep.margin is None or block.margin < rep.margin):
            rep.margin, rep.margin_chunk = block.margin, f"{block.index} {block.name}"
        rep.tensors += len(block.tensors)
        rep.values += sum(t.bits.size for t in block.tensors.values())
        rep.decoded_bytes += sum(t.bits.nbytes for t in block.tensors.values())
        if progress is not None:
            progress(k + 1, n, block.name)
        del block
    return rep


def open_container(path: str | os.PathLike[str], *, max_block_bytes: int | str | None = "auto", max_site_dim: int | None = None,
                   allow_inexact: bool = False, device: str | Linalg | None = None, threads: int | None = None) -> Reader:
    """A streaming reader: `iter_blocks()` decodes one block at a time, its linear algebra on
    `device` and a payload's parts on `threads` threads (Reader)."""
    return Reader(path, max_block_bytes=max_block_bytes, max_site_dim=max_site_dim, allow_inexact=allow_inexact, device=device,
                  threads=threads)


class InexactWarning(UserWarning):
    """allow_inexact=True decoded chunks whose values differ from their digests."""


class DeviceNote(UserWarning):
    """A decode on a device other than the reference ran (in part) on the reference instead: a
    file without digests, or chunks that missed their digests on the device (the fallback)."""


class InexactBlocks:
    """Collects the blocks that missed their digests, and those the device missed that the
    reference decoded again; warns once, at the end, if any did."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self.names: list[str] = []
        self.fallback: list[str] = []
        self.device = "cpu"  # the reader's backend, from note()

    def see(self, block: DecodedBlock) -> DecodedBlock:
        if block.exact is False:
            self.names.append(f"{block.index} {block.name}")
        if block.fallback:
            self.fallback.append(f"{block.index} {block.name}")
        return block

    def note(self, r: Reader | StreamReader) -> None:
        """Watch reader `r`: its backend names the device in warn(), and its own note (a file
        without digests, decoded with the reference) is given now, as a DeviceNote."""
        self.device = r.linalg.name
        if r.note:
            warnings.warn(DeviceNote(r.note), stacklevel=3)

    def warn(self) -> None:
        if self.fallback:
            warnings.warn(DeviceNote(f"{self.path}: {len(self.fallback)} chunks missed their digests on {self.device} and were decoded "
                                     f"again with the reference: {', '.join(self.fallback[:5])}"
                                     f"{', ...' if len(self.fallback) > 5 else ''}"), stacklevel=3)
        if self.names:
            warnings.warn(InexactWarning(f"{self.path}: {len(self.names)} chunks decoded to values other than their digests "
                                         f"(E_DIGEST, allowed): {', '.join(self.names[:5])}{', ...' if len(self.names) > 5 else ''}"),
                          stacklevel=3)


def read_tensors(path: str | os.PathLike[str], *, max_block_bytes: int | str | None = "auto", max_site_dim: int | None = None,
                 allow_inexact: bool = False, device: str | Linalg | None = None, threads: int | None = None) -> dict[str, torch.Tensor]:
    """Decode a whole container into an ordered dict of torch tensors. A chunk that misses its
    digest raises DigestError, unless allow_inexact (then an InexactWarning names it).
    `device`: where the linear algebra runs (Reader), and where the tensors are put: its torch
    device ("cuda:0" for "cuda"), the CPU for "cpu"."""
    with Reader(path, max_block_bytes=max_block_bytes, max_site_dim=max_site_dim, allow_inexact=allow_inexact, device=device,
                threads=threads) as r:
        inexact = InexactBlocks(path)
        inexact.note(r)
        out = _decode_to_torch(r, None, inexact, torch_device_of(r.linalg))
        keys = r.metadata.get("keys") or list(out)
    inexact.warn()
    return {k: out[k] for k in keys}


def _decode_to_torch(r: Reader, progress: Progress | None, inexact: InexactBlocks, device: str = "cpu") -> dict[str, torch.Tensor]:
    """Every block, decoded in parallel; each becomes torch tensors (sharing its arrays) on
    `device` as it arrives."""
    from .tensors import raw_to_torch

    out: dict[str, torch.Tensor] = {}
    n = len(r)
    for k, block in enumerate(r.iter_blocks("reverse", workers=DECODE_WORKERS)):
        inexact.see(block)
        out.update((name, raw_to_torch(t, copy=False).to(device)) for name, t in block.tensors.items())
        if progress is not None:
            progress(k + 1, n, block.name)
    return out


def unpack(
    src: str | os.PathLike[str] | BinaryIO,
    dst: str | os.PathLike[str],
    *,
    fmt: str | None = None,
    progress: Progress | None = None,
    max_block_bytes: int | str | None = "auto",
    max_site_dim: int | None = None,
    workers: int | None = None,
    allow_inexact: bool = False,
    device: str | Linalg | None = None,
    overwrite: bool = False,
    max_shard_size: int | None = None,
    threads: int | None = None,
) -> Path:
    """Write the TransformerCompression layout back: <stem>.pt (fmt "pt", the default, or
    .safetensors) and the JSON files; or, with fmt="hf", a Hugging Face directory that transformers'
    `AutoModelForCausalLM.from_pretrained(dst, trust_remote_code=True)` loads without bbformat
    (bbformat.hfdir: config.json, the modeling file, model.safetensors or shards of at most
    `max_shard_size` bytes (default 5 GB) with their index, the tokenizer files).

    A packed plain Hugging Face directory (metadata `directory`) comes back with fmt "hf" (its
    default) byte for byte: the same files, subfolders, safetensors headers and shards. Its
    fmt "safetensors" writes those files but with one `model.safetensors` holding every tensor
    (by container name) in place of the safetensors files and index; "pt" is InputError.

    `dst` must be absent or an empty directory unless `overwrite` (OutputExistsError, E_EXISTS,
    naming what would be replaced, before anything is decoded); then files of the same names
    in `dst` are replaced and others left alone. Without `overwrite` the publication never
    replaces anything, even what appears at `dst` while it decodes (checkpoint.publish_checkpoint).

    The weights file is streamed: each tensor is written as its block decodes (safetensors:
    its header first, from the descriptors; .pt: torch's zip, record by record, the pickle
    last), so memory holds about `workers` + 1 blocks, not the model. The files are published
    as atomically as POSIX allows (checkpoint.publish_checkpoint): a new DST appears
    complete in one rename; into an existing DST the files are staged and fsynced, then renamed
    in one burst, weights last. A failed write raises OutputError (NoSpaceError when out of
    space) and leaves nothing partial.

    A chunk whose decoded values miss its digest (format 1.2) raises DigestError and nothing
    is published, unless allow_inexact: then the files are written and an InexactWarning
    names the chunks.

    `device`: where the linear algebra runs (Reader); chunks it misses are decoded again with
    the reference, and a DeviceNote says how many. `threads`: how many threads decode the parts
    of one block's payload (format 1.5; None: every CPU this process may use)."""
    if fmt not in (None, "pt", "safetensors", "hf"):
        raise InputError(f"unknown output format {fmt!r} (choose 'pt', 'safetensors' or 'hf')")
    if max_shard_size is not None and fmt not in (None, "hf"):
        raise InputError("max_shard_size applies to fmt='hf' only")
    check_output_parent(Path(dst))
    if not isinstance(src, (str, os.PathLike)) and not src.seekable():
        return _unpack_stream(src, Path(dst), fmt, progress, max_block_bytes, max_site_dim, allow_inexact, device, overwrite,
                              threads)
    inexact = InexactBlocks(src if isinstance(src, (str, os.PathLike)) else "-")
    with Reader(src, max_block_bytes=max_block_bytes, max_site_dim=max_site_dim, allow_inexact=allow_inexact, device=device,
                share_payload=True, threads=threads) as r:
        inexact.note(r)
        entries = r.tensor_entries()
        keys = r.metadata.get("keys") or list(entries)
        missing = [k for k in keys if k not in entries]
        if missing:
            raise InputError(f"container lacks tensors listed in its metadata: {missing[:3]}")
        if "directory" in r.metadata:
            out = _unpack_plain(r, Path(dst), fmt or "hf", {k: entries[k] for k in keys}, progress, workers, inexact, overwrite,
                                max_shard_size)
            inexact.warn()
            return out
        fmt = fmt or "pt"
        if max_shard_size is not None and fmt != "hf":
            raise InputError("max_shard_size applies to fmt='hf' only")
        stem = r.metadata.get("stem", "model")
        files = _decode_files(r.metadata.get("files", {}))
        if not overwrite:  # before the heavy imports below (torch): a refusal takes no time
            refuse_existing(Path(dst), ["config.json", "model.safetensors"] if fmt == "hf" else sorted(files) + [f"{stem}.{fmt}"])
        from .checkpoint import check_side_files, publish_checkpoint

        check_side_files(stem, files)
        wanted = {k: entries[k] for k in keys}
        if fmt == "hf":
            out = _unpack_hf(r, Path(dst), stem, files, wanted, progress, workers, inexact, overwrite, max_shard_size)
            inexact.warn()
            return out

        def weights(path: Path) -> None:
            _stream_weights(r, path, fmt, wanted, progress, workers, inexact)

        out = publish_checkpoint(Path(dst), stem, files, fmt, weights, overwrite=overwrite)
    inexact.warn()
    return out


def _unpack_stream(f: BinaryIO, dst: Path, fmt: str | None, progress: Progress | None, max_block_bytes: int | str | None,
                   max_site_dim: int | None, allow_inexact: bool, device: str | Linalg | None, overwrite: bool,
                   threads: int | None) -> Path:
    """unpack from a stream that cannot seek (a pipe), decoding each block as its bytes arrive:
    `.pt` only, whose records may come in any order (a safetensors header lists every tensor
    first, and the container lists them only at its end). The tensor names come from the
    header's metadata (`keys`); whether every one was decoded is checked after the last block."""
    if fmt not in (None, "pt"):
        raise InputError(f"unpack from a stream writes fmt='pt' only ({fmt!r} needs every tensor's descriptor before the first "
                         "block, which a container gives at its end); copy the stream into a file first")
    sr = StreamReader(f, max_block_bytes=max_block_bytes, max_site_dim=max_site_dim, allow_inexact=allow_inexact,
                      device=device, threads=threads)
    meta = sr.header.metadata
    if "directory" in meta:
        raise InputError("this container holds a plain Hugging Face directory, which unpacks as hf (every tensor's descriptor "
                         "is needed before the first block, and a container gives them at its end): copy the stream into a "
                         "file first (the CLI does so with --format hf)")
    fmt = "pt"
    keys = meta.get("keys")
    if not isinstance(keys, list) or not keys or not all(isinstance(k, str) for k in keys):
        raise InputError("this container's metadata lists no tensor names (keys): unpack it from a file, not a stream")
    stem = meta.get("stem", "model")
    files = _decode_files(meta.get("files", {}))
    if not overwrite:
        refuse_existing(dst, sorted(files) + [f"{stem}.{fmt}"])
    from .checkpoint import check_side_files, publish_checkpoint
    from .stream_writers import TorchZipWriter

    check_side_files(stem, files)
    inexact = InexactBlocks("-")
    inexact.note(sr)
    wanted: dict[str, TensorEntry | None] = dict.fromkeys(keys)  # descriptors come with each chunk, checked there

    def weights(path: Path) -> None:
        out = TorchZipWriter(path, keys)
        try:
            seen = _write_blocks(iter(sr), sr.header.chunk_count, wanted, out.write, progress, inexact)
            missing = [k for k in keys if k not in seen]
            if missing:
                raise InputError(f"container lacks tensors listed in its metadata: {missing[:3]}")
            out.finish()
        except BaseException:
            out.abort()
            raise

    result = publish_checkpoint(dst, stem, files, fmt, weights, overwrite=overwrite)
    inexact.warn()
    return result


def _stream_weights(r: Reader, path: Path, fmt: str, wanted: dict[str, TensorEntry], progress: Progress | None,
                    workers: int | None, inexact: InexactBlocks) -> None:
    """Decode every block and write its tensors into the weights file at `path` as they come."""
    from .stream_writers import SafetensorsWriter, TorchZipWriter
    from .tensors import torch_dtype

    if fmt == "pt":
        out = TorchZipWriter(path, list(wanted))
        try:
            _write_blocks(_reader_blocks(r, workers), len(r), wanted, out.write, progress, inexact)
            out.finish()  # closes and fsyncs the archive
        except BaseException:
            out.abort()
            raise
        return
    specs = [(k, torch_dtype(e.dtype), e.shape) for k, e in wanted.items()]
    with open(path, "xb") as f:
        st = SafetensorsWriter(f, specs, metadata={"format": "pt"})
        _write_blocks(_reader_blocks(r, workers), len(r), wanted, st.write, progress, inexact)
        st.finish()
        f.flush()
        os.fsync(f.fileno())


def _unpack_hf(r: Reader, dst: Path, stem: str, files: dict[str, bytes], wanted: dict[str, TensorEntry], progress: Progress | None,
               workers: int | None, inexact: InexactBlocks, overwrite: bool, max_shard_size: int | None) -> Path:
    """unpack's fmt="hf": the directory's files (hfdir), its shards streamed as blocks decode."""
    from . import hfdir
    from .adapters.sliced_config import identity_norms
    from .checkpoint import publish_directory
    from .stream_writers import SafetensorsWriter
    from .tensors import dominant, torch_dtype

    base, slicing = json.loads(files["config.json"]), json.loads(files[f"{stem}.json"])
    norms = set(identity_norms(base, list(wanted)))
    keep = {k: e for k, e in wanted.items() if k not in norms}
    nbytes = {k: e.numel * bits_of(e.dtype) // 8 for k, e in keep.items()}
    dtype = dominant(((e.dtype, nbytes[k]) for k, e in keep.items()), "float32")
    side = hfdir.side_files(files, stem, hfdir.hf_config(base, slicing, stem, list(keep), dtype))
    groups = hfdir.shards(list(nbytes.items()), hfdir.DEFAULT_SHARD_BYTES if max_shard_size is None else max_shard_size)
    names = hfdir.shard_names(len(groups))
    written = names + ([hfdir.INDEX] if len(groups) > 1 else [])
    if overwrite and dst.is_dir():  # replaced files are fine; another export's weights left beside them are not
        stale = sorted(p.name for p in dst.iterdir() if hfdir.is_weights_file(p.name) and p.name not in written)
        if stale:
            raise OutputExistsError(f"{dst} holds {', '.join(stale[:3])}{' ...' if len(stale) > 3 else ''} of another export, "
                                    f"which would sit beside the new weights; remove them or give an empty directory")

    def write(where: Path) -> None:
        handles, writers, route = [], [], {}
        try:
            for name, group in zip(names, groups):
                f = open(where / name, "xb")
                handles.append(f)
                writers.append(SafetensorsWriter(f, [(k, torch_dtype(keep[k].dtype), keep[k].shape) for k in group],
                                                 metadata={"format": "pt"}))
                route.update({k: writers[-1] for k in group})
            _write_blocks(_reader_blocks(r, workers), len(r), keep, lambda k, t: route[k].write(k, t), progress, inexact)
            for f, st in zip(handles, writers):
                st.finish()
                f.flush()
                os.fsync(f.fileno())
        finally:
            for f in handles:
                f.close()
        if len(groups) > 1:
            write_synced(where / hfdir.INDEX, hfdir.index_json(groups, names, sum(nbytes.values())))

    return publish_directory(dst, side, written, write, overwrite=overwrite)


def _unpack_plain(r: Reader, dst: Path, fmt: str, wanted: dict[str, TensorEntry], progress: Progress | None,
                  workers: int | None, inexact: InexactBlocks, overwrite: bool, max_shard_size: int | None) -> Path:
    """unpack of a packed plain directory: its files, and its safetensors files written back
    byte for byte (fmt "hf") or all its tensors in one model.safetensors (fmt "safetensors")."""
    if fmt == "pt":
        raise InputError("a packed plain Hugging Face directory unpacks as hf (its default) or safetensors, not pt")
    if max_shard_size is not None:
        raise InputError("max_shard_size: a plain directory's safetensors files come back as they were packed")
    files = plaindir.decode_files(r.metadata.get("files", {}))
    plan = plaindir.unpack_plan(r.metadata["directory"], files, {k: (e.dtype, e.shape) for k, e in wanted.items()})
    index = {plaindir.INDEX: files.pop(plaindir.INDEX)} if fmt == "hf" and plaindir.INDEX in files else {}
    files.pop(plaindir.INDEX, None)  # safetensors: one file, no shards to index
    written = ([f.path for f in plan] + list(index)) if fmt == "hf" else [plaindir.WEIGHTS]
    from .checkpoint import publish_directory

    if fmt == "safetensors" and plaindir.WEIGHTS in files:
        raise FormatError(f"metadata 'files' holds {plaindir.WEIGHTS}", "E_METADATA")
    if not overwrite:
        refuse_existing(dst, sorted(files) + written)
    elif dst.is_dir():  # replaced files are fine; another model's weights left beside them are not
        stale = sorted(p.name for p in dst.iterdir() if p.name.endswith(".safetensors") and p.name not in written)
        if stale:
            raise OutputExistsError(f"{dst} holds {', '.join(stale[:3])}{' ...' if len(stale) > 3 else ''} of another model, "
                                    f"which would sit beside the new weights; remove them or give an empty directory")

    def write(where: Path) -> None:
        if fmt == "safetensors":
            _stream_weights(r, where / plaindir.WEIGHTS, fmt, wanted, progress, workers, inexact)
            return
        plaindir.write_safetensors(where, plan, _plain_tensors(_reader_blocks(r, workers), len(r), progress, inexact))
        for name, data in index.items():
            write_synced(where / name, data)

    return publish_directory(dst, files, written, write, overwrite=overwrite, nested=True)


def _plain_tensors(blocks: Iterator[DecodedBlock], n: int, progress: Progress | None,
                   inexact: InexactBlocks) -> Iterator[tuple[str, RawTensor]]:
    """Every decoded tensor by name, block after block (progress and digests noted)."""
    for k, block in enumerate(blocks):
        inexact.see(block)
        yield from block.tensors.items()
        if progress is not None:
            progress(k + 1, n, block.name)
        del block


def _reader_blocks(r: Reader, workers: int | None) -> Iterator[DecodedBlock]:
    return r.iter_blocks("reverse", workers=decode_workers(workers))


def _write_blocks(blocks: Iterator[DecodedBlock], n: int, wanted: Mapping[str, TensorEntry | None],
                  write: Callable[[str, torch.Tensor], None], progress: Progress | None, inexact: InexactBlocks) -> set[str]:
    """Write each wanted tensor of the n blocks as it decodes (a None entry: no index descriptor
    to compare with, from a stream); returns the names written."""
    from .tensors import raw_to_torch

    written: set[str] = set()
    for k, block in enumerate(blocks):
        inexact.see(block)
        for name, t in block.tensors.items():
            if name not in wanted:
                continue  # a tensor the metadata's key list leaves out is not written
            want = wanted[name]
            if want is not None and (t.dtype, t.shape) != (want.dtype, want.shape):
                raise FormatError(f"tensor {name!r} decodes as {t.dtype} {t.shape}, its descriptor said "
                                  f"{want.dtype} {want.shape}", "E_DESCRIPTOR")
            write(name, raw_to_torch(t, copy=False))
            written.add(name)
        if progress is not None:
            progress(k + 1, n, block.name)
        del block
    return written

"""bbformat command line: pack, unpack, verify, inspect, demo.

Errors print one line on stderr and exit with the error's status (see README).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from .constants import (ENTROPY_MODES, FORMAT_MAJOR, FORMAT_MINOR, FORMAT_VERSIONS, PACK_SCHEMES, ROTATION_SCHEMES, ExitStatus,
                        written_version)
from . import __version__, heap
from .codec import host_native
from .codec.exponent import NATIVE_DECODER
from .api import DeviceNote, InexactWarning, check_output_parent, pack, unpack, verify
from .errors import BBFormatError, DigestError, InputError, IntegrityError, output_error, output_exists
from .fsutil import refuse_existing, remove_abandoned_temps, remove_entry
from .summary import bound_words, format_summary, inspect

EXIT_USAGE = ExitStatus.USAGE
EXIT_INTERNAL = ExitStatus.INTERNAL
EXIT_INTERRUPTED = ExitStatus.INTERRUPTED
EXIT_BROKEN_PIPE = ExitStatus.BROKEN_PIPE  # what a shell reports for a writer whose reader went away
EXIT_TERMINATED = ExitStatus.TERMINATED


class Terminated(KeyboardInterrupt):
    """SIGTERM (timeout, systemd, Kubernetes): raised in the main thread and unwound as Ctrl-C
    is, so that every temp file and staging directory is removed on the way out."""


def _on_sigterm(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the clean-up short
    raise Terminated()


def _handle_sigterm() -> None:
    """Route SIGTERM to Terminated; only from the main thread (where Python runs handlers)."""
    try:
        signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # main() called from another thread: leave the default
        pass


class _Parser(argparse.ArgumentParser):
    def _print_message(self, message: str, file: Any = None) -> None:
        if message:  # argparse's own hides an OSError: --help > /dev/full would say nothing, status 0
            (file or sys.stderr).write(message)

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"bbformat: usage error: {message}\n")
        raise SystemExit(EXIT_USAGE)


STDIN_HELP = "- reads it from standard input as a stream (a pipe: decoded as it arrives)"


def _size(text: str) -> int | str | None:
    """'auto', 'none', or bytes with an optional K/M/G/T suffix (powers of 1024)."""
    t = text.strip().lower()
    if t in ("auto", "none"):
        return None if t == "none" else "auto"
    mult = 1
    if t and t[-1] in "kmgt":
        mult = 1024 ** ("kmgt".index(t[-1]) + 1)
        t = t[:-1]
    try:
        n = int(float(t) * mult)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 2G, 512M, auto, none)") from None
    if n <= 0:
        raise argparse.ArgumentTypeError(f"size must be positive: {text!r}")
    return n


def _int_at_least(low: int, flag: str) -> Callable[[str], int]:
    """An argparse type: an integer >= low (the message names the flag)."""
    return _int_in(low, None, flag)


def _int_in(low: int, high: int | None, flag: str) -> Callable[[str], int]:
    """An argparse type: an integer from low to high (None: no upper bound)."""

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if n < low:
            raise argparse.ArgumentTypeError(f"{flag} must be at least {low}")
        if high is not None and n > high:
            raise argparse.ArgumentTypeError(f"{flag} must be at most {high}")
        return n

    return parse


def _say(text: str = "") -> None:
    """print() to stdout; a failure other than a closed pipe (a full disk: `> /dev/full`) is an
    OutputError naming standard output (one line, exit 8), not an internal error."""
    try:
        print(text)
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise _stdout_error(exc) from None


def _flush_stdout() -> None:
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise _stdout_error(exc) from None


def _stdout_error(exc: OSError) -> BBFormatError:
    """The error for a failed write to stdout; stdout is pointed at /dev/null first, so that the
    text still buffered is not written again (and fails again) at interpreter exit."""
    _silence_stdout()
    return output_error(exc, "standard output")


def _rate_eta(done: int, total: int, elapsed: float) -> str:
    """"1.25 blocks/s, ETA 0:42" (at the end: the time taken), from the blocks done so far."""
    if done <= 0 or elapsed <= 0:
        return "ETA --:--"
    rate = done / elapsed
    left = elapsed if done >= total else (total - done) / rate
    m, sec = divmod(int(round(left)), 60)
    h, m = divmod(m, 60)
    clock = f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"
    return f"{rate:.3g} blocks/s, {'took' if done >= total else 'ETA'} {clock}"


def _progress(quiet: bool, verb: str) -> Callable[[int, int, str], None] | None:
    if quiet or not sys.stderr.isatty():
        return None

    start = time.monotonic()

    def show(done: int, total: int, name: str) -> None:
        width = 30
        fill = width * done // max(total, 1)
        sys.stderr.write(f"\r{verb} [{'#' * fill}{'.' * (width - fill)}] {done}/{total} {name[:24]:<24} "
                         f"{_rate_eta(done, total, time.monotonic() - start)}")
        if done == total:
            sys.stderr.write("\n")
        sys.stderr.flush()

    return show


def _cmd_pack(a: argparse.Namespace) -> int:
    rep = pack(a.src, a.out, scheme=a.scheme, tolerance=a.tolerance, verify=a.verify, progress=_progress(a.quiet, "pack"),
               calibration=a.calibration, calibration_samples=a.calibration_samples, calibration_seqlen=a.calibration_seqlen,
               entropy=a.entropy, format_version=a.format_version, device=a.device, overwrite=a.force, threads=a.threads)
    info = inspect(a.out)
    if a.json:
        _say(json.dumps({**info["totals"], "larger_than_plain": info["totals"]["container_bytes"] >= info["totals"]["plain_bytes"]},
                         indent=2))
    elif not a.quiet:
        t = info["totals"]
        _say(
            f"wrote {a.out}: {t['container_bytes']:,} B for {t['plain_bytes']:,} B plain "
            f"({t['bits_per_weight']:.3f} bits per weight against {t['plain_bits_per_weight']:g}; "
            f"{t['saved_pct_of_plain']:.2f}% saved on the weights"
            + (f", {bound_words(info)}; " if t["gross_bound_bits"] else "; no bits back, ")
            + f"scheme {rep.scheme}, tolerance {rep.tolerance}{', verified' if a.verify else ''})"
        )
    for w in rep.warnings:
        sys.stderr.write(f"bbformat: warning: {w}\n")
    note = _larger_than_plain(info["totals"])
    if note and not a.quiet:
        sys.stderr.write(f"bbformat: note: {note}\n")
    return 0


def _larger_than_plain(t: dict[str, Any]) -> str:
    """One line when the whole container is not smaller than the plain weights (a tiny model
    whose side files outweigh what bits-back saves), else ""."""
    if t["container_bytes"] < t["plain_bytes"]:
        return ""
    return (f"the container ({t['container_bytes']:,} B) is not smaller than the plain weights ({t['plain_bytes']:,} B): "
            f"its header carries {t['metadata_bytes']:,} B of config and tokenizer files, more than the "
            f"{max(0, t['plain_bytes'] - t['weights_bytes']):,} B the weights' coding saves")


def _shard_size(a: argparse.Namespace) -> int | None:
    if a.max_shard_size is None:
        return None
    if a.format not in ("hf", None) or not isinstance(a.max_shard_size, int):
        raise InputError("--max-shard-size takes a size in bytes, with --format hf only")
    return a.max_shard_size


def _stdin_or(src: str) -> Any:
    """SRC, or for `-` standard input's binary stream."""
    return sys.stdin.buffer if src == "-" else src


def _spooled_stdin(fmt: str | None) -> Any:
    """unpack's `-`: standard input itself if it can seek (a file) or the output is `.pt` or
    not given (decoded as it arrives: api.unpack streams it; a plain directory's container,
    whose default is hf, is refused there: give --format hf), else copied into an unlinked temporary
    file (gone however the process ends): safetensors and hf writers need every tensor's
    descriptor before the first block, and a container lists them all only at its end."""
    f = sys.stdin.buffer
    if f.seekable() or fmt in (None, "pt"):
        return f
    spool = None
    try:
        spool = tempfile.TemporaryFile()
        shutil.copyfileobj(f, spool, 1 << 20)
        spool.seek(0)
    except OSError as exc:
        if spool is not None:
            spool.close()
        raise output_error(exc, f"a temporary copy of standard input in {tempfile.gettempdir()}") from None
    return spool


def _cmd_unpack(a: argparse.Namespace) -> int:
    if a.src == "-" and a.format not in (None, "pt"):  # refuse what can be refused before copying a pipe (maybe gigabytes) aside
        check_output_parent(Path(a.dst))
        if not a.force:
            refuse_existing(Path(a.dst), [])
    src = _spooled_stdin(a.format) if a.src == "-" else a.src
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", InexactWarning)
        warnings.simplefilter("always", DeviceNote)
        out = unpack(src, a.dst, fmt=a.format, progress=_progress(a.quiet, "unpack"), max_block_bytes=a.max_memory,
                     max_site_dim=a.max_site_dim, workers=a.workers, allow_inexact=a.allow_inexact, device=a.device,
                     overwrite=a.force, max_shard_size=_shard_size(a), threads=a.threads)
    for w in caught:
        if issubclass(w.category, InexactWarning):
            sys.stderr.write(f"bbformat: warning: {w.message}\n")
        elif issubclass(w.category, DeviceNote):
            sys.stderr.write(f"bbformat: note: {w.message}\n")
    if not a.quiet:
        _say(f"wrote {out}")
    return 0


def _cmd_verify(a: argparse.Namespace) -> int:
    rep = verify(_stdin_or(a.src), max_block_bytes=a.max_memory, max_site_dim=a.max_site_dim, workers=a.workers,
                 progress=_progress(a.quiet or a.json, "verify"), device=a.device, margins=not a.no_margin, threads=a.threads)
    if a.json:
        _say(json.dumps(rep.as_dict(), indent=2))
    else:
        _say(rep.summary())
        margin = rep.margin_line()
        if margin:
            _say(margin)
        if rep.note:
            sys.stderr.write(f"bbformat: note: {rep.note}\n")
    return DigestError.exit_status if rep.exact is False else 0


def _cmd_inspect(a: argparse.Namespace) -> int:
    info = inspect(_stdin_or(a.src), max_block_bytes=a.max_memory, max_site_dim=a.max_site_dim)
    _say(json.dumps(info, indent=2) if a.json else format_summary(info))
    for w in info["warnings"]:
        sys.stderr.write(f"bbformat: warning: {w}\n")
    bad = [f"{b['index']} {b['name']}" for b in info["blocks"] if b["crc"] != "ok"]
    if bad:  # the table shows it; stderr says it too, as every other failure does
        _flush_stdout()
        return _error_line(IntegrityError(f"{len(bad)} of {len(info['blocks'])} chunks fail their CRC32C: "
                                          f"{', '.join(bad[:5])}{', ...' if len(bad) > 5 else ''}", "E_CRC_CHUNK"))
    return 0


def _cmd_demo(a: argparse.Namespace) -> int:
    """Make a tiny sliced model, pack it (verified), inspect, unpack, and check the logits."""
    made = _demo_dir(Path(a.keep), a.force) if a.keep else None  # refusals before torch is imported
    try:
        with tempfile.TemporaryDirectory() as tmp:
            return _run_demo(a, Path(a.keep) if a.keep else Path(tmp))
    except BaseException:
        if made is not None:  # a failed or interrupted demo leaves no DIR it created
            _undo_demo_dir(Path(a.keep), made)
        raise


def _run_demo(a: argparse.Namespace, root: Path) -> int:
    # torch-backed: loaded here, not at start-up (a fast CLI)
    from .checkpoint import read_checkpoint, write_checkpoint
    from .testing import make_tiny_checkpoint, reference_logits

    say = (lambda text: None) if a.quiet else _say
    src, out, back = (root / name for name in DEMO_OUTPUTS)
    ckpt = make_tiny_checkpoint(a.arch, seed=a.seed, layers=a.layers)
    write_checkpoint(ckpt, src, overwrite=a.force)
    say(f"1. wrote a tiny sliced {a.arch} model ({a.layers} layers) to {src}")
    pack(src, out, scheme=a.scheme, verify=True, progress=_progress(a.quiet, "pack"), overwrite=a.force)
    say(f"2. packed it into {out} (scheme {a.scheme}) and verified it bit for bit\n")
    say(format_summary(inspect(out)) + "\n")
    unpack(out, back, overwrite=a.force)
    say(f"3. unpacked it to {back}")
    ids = np.random.default_rng(a.seed).integers(0, int(ckpt.hf_config["vocab_size"]), size=(2, 16))
    before = reference_logits(ckpt, ids)
    after = reference_logits(read_checkpoint(back), ids)
    diff = float(np.abs(after - before).max())
    scale = float(np.abs(before).max())
    ok = diff <= 2e-2 * max(1.0, scale)
    (_say if not ok else say)(f"4. logits before/after: max |diff| {diff:.3g} (max |logit| {scale:.3g}): {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


DEMO_OUTPUTS = ("model", "model.bb", "unpacked")  # what `demo --keep DIR` leaves in DIR
DEMO_MAX_LAYERS = 64  # a tiny model: more only costs time


def _demo_dir(root: Path, force: bool) -> bool:
    """`demo --keep DIR`: DIR, created if absent (its parent must exist, as for pack's OUT and
    unpack's DST). Refused before anything is written: DIR not a directory, or its parent
    missing (E_INPUT); any of DEMO_OUTPUTS already in DIR, unless --force (E_EXISTS); DIR not
    creatable (E_OUTPUT). With --force, the DEMO_OUTPUTS already in DIR are removed first
    (whole, so that a model of another --arch leaves no files beside the new one's); nothing
    else in DIR is touched. Returns whether DIR was created here."""
    if os.path.lexists(root) and not root.is_dir():
        raise InputError(f"--keep {root}: {root} is not a directory")
    if not os.path.lexists(root):
        check_output_parent(root)
    if not force:
        there = [str(root / n) for n in DEMO_OUTPUTS if os.path.lexists(root / n)]
        if there:
            raise output_exists(", ".join(there), hint=f"--force replaces {'them' if len(there) > 1 else 'it'}")
    made = not os.path.lexists(root)
    try:
        root.mkdir(exist_ok=True)
    except OSError as exc:
        raise output_error(exc, root) from None
    for p in (root / n for n in DEMO_OUTPUTS if force and os.path.lexists(root / n)):
        try:
            remove_entry(p)
        except OSError as exc:
            raise output_error(exc, p) from None
    return made


def _undo_demo_dir(root: Path, made: bool) -> None:
    """After a failed demo: the outputs it published in DIR go, and DIR if this run made it."""
    for p in (root / n for n in DEMO_OUTPUTS):
        if os.path.lexists(p):
            remove_entry(p, best_effort=True)
    if made:
        try:
            root.rmdir()
        except OSError:
            pass


def _version() -> str:
    """`bbformat --version`: the package's version and the container versions it writes and reads,
    from constants (FORMAT_VERSIONS: what pack --format-version offers; FORMAT_MAJOR/MINOR: what
    the reader decodes), so that a new format version shows here by itself."""
    written = sorted({written_version(v, e) for v in FORMAT_VERSIONS for e in ENTROPY_MODES},
                     key=lambda v: tuple(map(int, v.split("."))), reverse=True)
    return (f"bbformat {__version__}\n"
            f"container format: writes {', '.join(written)} (pack --format-version {'|'.join(FORMAT_VERSIONS)}, "
            f"default {FORMAT_VERSIONS[0]}); reads {FORMAT_MAJOR}.0 to {FORMAT_MAJOR}.{FORMAT_MINOR} "
            f"(and any later {FORMAT_MAJOR}.x whose required flags it knows)\n"
            f"payload codec 3 coder: {_codec3_coder()}\n"
            f"host path (rounding, widening, band distances, x_residuals): {_host_path()}")


def _codec3_coder() -> str:
    """Which coder payload codec 3 uses here (pack and every reader)."""
    if NATIVE_DECODER:
        return "compiled (bbformat/codec/_exponent_native.c)"
    return "numpy (the compiled coder is not built, or not usable on this host; several times slower)"


def _host_path() -> str:
    if host_native.active():
        return "compiled (bbformat/codec/_host_native.c)"
    return "numpy (the compiled path is not built, or not usable on this host; the same bits, slower)"


class _VersionAction(argparse.Action):
    """--version: _version() as it is (argparse's own version action re-wraps the lines), exit 0."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        sys.stdout.write(_version() + "\n")
        raise SystemExit(0)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="bbformat", description="Bits-back container for SliceGPT-sliced transformer weights.")
    p.add_argument("--version", action=_VersionAction, nargs=0,
                   help="print the package version and the container format versions it writes and reads")
    sub = p.add_subparsers(dest="cmd", parser_class=_Parser)  # none given: main() prints the help
    pk = sub.add_parser("pack", help="encode a SliceGPT checkpoint or a Hugging Face model directory into a .bb container")
    pk.add_argument("src", help="directory in TransformerCompression layout (<stem>.pt or .safetensors, <stem>.json, config.json), "
                                "or any Hugging Face model directory with safetensors weights (every file kept byte for byte)")
    pk.add_argument("out", help="output .bb file (written atomically)")
    pk.add_argument("--scheme", choices=PACK_SCHEMES, default=None,
                    help="symmetric (the default for a sliced checkpoint): bits back, the stored model is an equivalent "
                         "rotated one; paper: the paper's Algorithms 1-6; none (the default, and the only scheme, for a "
                         "plain Hugging Face directory): no rotation, the entropy stage alone (unpack gives back the input's bits)")
    pk.add_argument("--tolerance", type=float, default=None, help="max error of regenerated values (default: 0 = exact for symmetric; paper: 0.01 OPT, 0.005 Llama)")
    pk.add_argument("--verify", action="store_true", help="decode the result and check it bit for bit against the encoder's intent")
    pk.add_argument("--calibration", default=None, metavar="TEXT",
                    help="UTF-8 text: round rotated tensors with error feedback under the model's input statistics (Llama; needs transformers)")
    pk.add_argument("--calibration-samples", type=_int_at_least(1, "--calibration-samples"), default=16, metavar="N", help="calibration sequences (default 16)")
    pk.add_argument("--calibration-seqlen", type=_int_at_least(2, "--calibration-seqlen"), default=512, metavar="T", help="tokens per calibration sequence (default 512)")
    pk.add_argument("--entropy", choices=ENTROPY_MODES, default="auto",
                    help="entropy stage on each payload after bits-back (SPEC.md 8.6, 8.7): auto (the default: the "
                         "smallest per chunk among those the format version allows), none (payloads raw: about 96%% of "
                         "plain with bits-back alone), zstd, planes (byte planes, top byte coded per tensor and context), "
                         "exponent (each float's exponent and top mantissa bits as one rANS symbol per tensor and column "
                         "class; format 1.3)")
    pk.add_argument("--format-version", choices=FORMAT_VERSIONS, default=FORMAT_VERSIONS[0],
                    help="1.6 (default): as 1.5 for float16/bfloat16/float32 models, byte for byte (its other dtypes, "
                         "SPEC.md 6.1, are for writers that store them). 1.5: as 1.4, and a payload of more than 2^21 symbols is cut into parts that a reader "
                         "decodes on several cores (1.4 readers refuse it; a file whose payloads are all raw, --entropy "
                         "none, is written as 1.4). 1.4: as 1.3, and each rotated site stores the band widths it was "
                         "encoded with, from which verify reports this reader's margin (1.3 readers refuse it; --scheme "
                         "none files have no sites and are written as 1.3 or 1.2). 1.3: as 1.2, and payloads may use the "
                         "exponent codec (a file that does not is written as 1.2). 1.2: every chunk records a digest of its "
                         "decoded values and the encoder stores every value another reader's floating point could round "
                         "differently, so every conforming reader decodes the same bits and checks it; 1.1 readers refuse "
                         "it. 1.1: readable by 1.1 readers (1.0 readers too with --entropy none or zstd), exact only on "
                         "readers whose floating point matches this machine's, with nothing to check it by")
    pk.add_argument("-f", "--force", action="store_true", help="replace OUT if it exists (without: refused, exit 2, E_EXISTS)")
    pk.add_argument("--quiet", action="store_true", help="print nothing but errors and warnings (no progress bar, no report)")
    pk.add_argument("--json", action="store_true", help="print the size totals as JSON")
    pk.set_defaults(func=_cmd_pack)
    up = sub.add_parser("unpack", help="decode a container back to the TransformerCompression layout, or to a Hugging Face directory")
    up.add_argument("src", help=f"the container; {STDIN_HELP}")
    up.add_argument("dst", help="output directory")
    up.add_argument("--format", choices=("pt", "safetensors", "hf"), default=None,
                    help="pt (the default for a sliced checkpoint) / safetensors: TransformerCompression's layout; hf: a "
                         "Hugging Face directory that AutoModelForCausalLM.from_pretrained(DST, trust_remote_code=True) "
                         "loads without bbformat. A packed plain directory: hf (its default) gives it back byte for byte, "
                         "safetensors writes its files with every tensor in one model.safetensors")
    up.add_argument("--max-shard-size", type=_size, metavar="BYTES",
                    help="with --format hf: shard the weights above this size (K/M/G/T: powers of 1024; default 5 GB, "
                         "5*10^9 B, as save_pretrained)")
    up.add_argument("-f", "--force", action="store_true",
                    help="write into DST even if it exists and is not empty, replacing its files of the same names "
                         "(without: refused, exit 2, E_EXISTS)")
    up.add_argument("--allow-inexact", action="store_true",
                    help="write the files even if some blocks decode to values other than their digests (E_DIGEST), "
                         "and name those blocks on stderr")
    up.add_argument("--quiet", action="store_true", help="print nothing but errors and warnings (no progress bar, no 'wrote' line)")
    up.set_defaults(func=_cmd_unpack)
    vf = sub.add_parser("verify", help="decode every block of a container and check it")
    vf.add_argument("src", help=f"the container; {STDIN_HELP}")
    vf.add_argument("--json", action="store_true", help="print the report as JSON")
    vf.add_argument("--no-margin", action="store_true",
                    help="do not measure the band margin of a 1.4 file (SPEC.md 9 item 7; it costs about 50 ns per regenerated value)")
    vf.add_argument("--quiet", action="store_true", help="no progress bar (the result is still printed)")
    for sp in (up, vf):
        sp.add_argument("--workers", type=_int_at_least(1, "--workers"), default=None, metavar="N",
                        help="threads decoding blocks ahead (default: up to 4, one per core), as many as --max-memory allows: "
                             "a block is started only while the working sets of the blocks under way fit in it")
    vf.set_defaults(func=_cmd_verify)

    ins = sub.add_parser("inspect", help="summarise a container")
    ins.add_argument("src", help=f"the container; {STDIN_HELP}")
    ins.add_argument("--json", action="store_true", help="print the summary as JSON")
    for sp in (pk, up, vf):
        sp.add_argument("--device", default="cpu", metavar="DEV",
                        help="where the float64 linear algebra runs: cpu (default: the reference, numpy), cuda, cuda:N, "
                             "or torch:DEV for torch on another device (torch:cpu runs the GPU code path on the CPU). "
                             "A decode elsewhere is checked chunk by chunk against the file's digests, and a chunk that "
                             "misses is decoded again with the reference (README, Devices)")
    for sp in (pk, up, vf):
        sp.add_argument("--threads", type=_int_at_least(1, "--threads"), default=None, metavar="N",
                        help="threads that code or decode the parts of one block's payload (format 1.5, SPEC.md 8.9; "
                             "default: every CPU); the bytes and the decoded values do not depend on it")
    for sp in (up, vf, ins):
        ahead = ", and --workers decode ahead only while theirs fit in SIZE together" if sp is not ins else ""
        sp.add_argument("--max-memory", type=_size, default="auto", metavar="SIZE",
                        help=f"the memory budget of decoding, e.g. 6G: a block whose declared working set (SPEC.md 11.5) "
                             f"exceeds SIZE is refused{ahead} (default: auto = half the physical memory; none = no budget)")
        sp.add_argument("--max-site-dim", type=_int_at_least(2, "--max-site-dim"), default=None, metavar="D",
                        help="refuse a rotation site larger than D (bounds decode time, O(D^3) per site; default: 32768)")
    ins.set_defaults(func=_cmd_inspect)
    dm = sub.add_parser("demo", help="run pack/inspect/unpack end to end on a tiny built-in sliced model")
    dm.add_argument("--keep", metavar="DIR", help="keep the model, container and unpacked files in DIR (DIR/model, "
                                                  "DIR/model.bb, DIR/unpacked; none of them may exist, unless --force)")
    dm.add_argument("-f", "--force", action="store_true", help="with --keep: replace DIR/model, DIR/model.bb and DIR/unpacked")
    dm.add_argument("--scheme", choices=ROTATION_SCHEMES, default=ROTATION_SCHEMES[0],
                    help=f"the bits-back scheme to pack with (default {ROTATION_SCHEMES[0]})")
    dm.add_argument("--arch", choices=("llama", "opt", "phi2", "phi3"), default="llama", help="architecture of the tiny model (default llama)")
    dm.add_argument("--layers", type=_int_in(1, DEMO_MAX_LAYERS, "--layers"), default=4, metavar="N",
                    help=f"decoder layers of the tiny model (1 to {DEMO_MAX_LAYERS}; default 4)")
    dm.add_argument("--seed", type=_int_in(0, 2**63 - 1, "--seed"), default=0, metavar="S",
                    help="seed of the tiny model's random weights and of the test tokens (default 0)")
    dm.add_argument("--quiet", action="store_true", help="print nothing but errors (and the result line if the check fails)")
    dm.set_defaults(func=_cmd_demo)
    return p


def _silence_stdout() -> None:
    """Point stdout's descriptor at /dev/null: what is still buffered goes nowhere."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def _quiet_closed_stdout() -> int:
    """stdout's reader went away (`bbformat inspect --json F | head`): end quietly, as Unix
    tools do, with nothing more written to the closed pipe (not even at interpreter exit)."""
    _silence_stdout()
    return EXIT_BROKEN_PIPE


def main(argv: Sequence[str] | None = None) -> int:
    previous = signal.getsignal(signal.SIGTERM)
    _handle_sigterm()
    try:
        return _main(argv)
    finally:
        if previous is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous)  # main() called in-process (tests): as it was


def _error_line(exc: BBFormatError) -> int:
    sys.stderr.write(f"bbformat: error [{exc.code}]: {exc}\n")
    return exc.exit_status


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except BrokenPipeError:
        return _quiet_closed_stdout()
    except OSError as exc:  # --help or --version into a full disk
        return _error_line(_stdout_error(exc))
    except SystemExit:  # --help (or a usage error): flush here, where a closed pipe is handled
        try:
            _flush_stdout()
        except BrokenPipeError:
            return _quiet_closed_stdout()
        except BBFormatError as exc:
            return _error_line(exc)
        raise
    if args.cmd is None:  # a bare `bbformat`: the help, on stderr, as a usage error (README, Exit codes)
        sys.stderr.write(parser.format_help())
        return EXIT_USAGE
    try:
        with heap.kept():  # this process's malloc keeps what a command frees, for its next blocks
            status = int(args.func(args))
        _flush_stdout()  # here, so that a closed pipe or a full disk is met inside this handler
        return status
    except BrokenPipeError:
        return _quiet_closed_stdout()
    except BBFormatError as exc:
        return _error_line(exc)
    except Terminated:
        remove_abandoned_temps()
        sys.stderr.write("bbformat: terminated (SIGTERM); temporary files removed\n")
        return EXIT_TERMINATED
    except KeyboardInterrupt:
        remove_abandoned_temps()
        sys.stderr.write("bbformat: interrupted\n")
        return EXIT_INTERRUPTED
    except MemoryError:
        sys.stderr.write("bbformat: error [E_MEMORY]: out of memory\n")
        return EXIT_INTERNAL
    except Exception as exc:  # a bug: still one line, no traceback
        sys.stderr.write(f"bbformat: internal error: {type(exc).__name__}: {exc}\n")
        return EXIT_INTERNAL


if __name__ == "__main__":
    raise SystemExit(main())

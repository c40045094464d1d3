"""Writing a checkpoint in TransformerCompression's layout, published as atomically as POSIX
allows (fsutil.AtomicOutput on a staging directory)."""
from __future__ import annotations

import errno
import os
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from .. import fsutil
from ..errors import InputError, output_error, output_exists
from ..fsutil import AtomicOutput
from ..stream_writers import torch_zip_is_whole
from .files import WEIGHT_SUFFIXES, Checkpoint, check_format, check_stem, side_files


def publish_checkpoint(dst: Path | str, stem: str, files: Mapping[str, bytes], fmt: str,
                       write_weights: Callable[[Path], None], *, overwrite: bool = False) -> Path:
    """Write <stem>.pt (or .safetensors), <stem>.json, config.json and the side files into DST;
    `write_weights(path)` creates, writes and fsyncs the weights file (it may stream it).

    DST must be absent or an empty directory unless `overwrite` (OutputExistsError, E_EXISTS,
    naming the files that would be replaced, before anything is written). Without `overwrite`
    the publication itself never replaces anything either, so a DST that fills up meanwhile is
    left as it is: the staging directory is renamed onto DST (a rename replaces at most an
    empty directory) or its files are moved in with fsutil.rename_no_replace, which refuses an
    existing name atomically (and the files already moved are taken back). With `overwrite`,
    DST's files of the same names are replaced as below; a DST that is a file never is.

    As atomic as POSIX allows (plain renames, nothing OS-specific). Every file is first
    written and fsynced in a staging directory named `.<DST name>.bbtmp-<12 hex>`; then:

    * DST absent (or an empty directory): the staging directory is created next to DST and
      renamed to DST in one step, so DST is at every moment absent (or empty) or complete.
      An empty DST is replaced by the new directory, except when it is a symlink, a mount
      point, on another device than its parent or the current directory: then as below.
    * DST holds files: the staging directory is inside DST, and once everything is written
      and fsynced its files are moved over their final names (os.replace) in one quick
      burst, the weights file last. Each file is at every moment its old or its new version,
      complete, and whenever the new weights file is in place every other file is new too.
      The remaining window: a crash during the burst (a few renames) can leave new side files
      (config.json, <stem>.json, tokenizer files) next to the old weights file, which may not
      load together if those files differ between the two versions. POSIX has no call that
      swaps two directories atomically.

    Files in DST that the checkpoint does not have are left alone. A killed process can leave
    its staging directory behind, never anything under a name a reader uses; a later
    successful write into the same DST removes such leftovers once they are an hour old
    (fsutil.remove_stale_temps). An OSError while writing becomes an OutputError (NoSpaceError
    for a full disk or a file-size limit) and the staging directory is removed. Returns DST.
    """
    check_format(fmt)
    check_stem(stem)
    weights = f"{stem}.{fmt}"
    return publish_directory(dst, files, [weights], lambda where: write_weights(where / weights), overwrite=overwrite)


def publish_directory(dst: Path | str, files: Mapping[str, bytes], written: list[str], write: Callable[[Path], None], *,
                      overwrite: bool = False, nested: bool = False) -> Path:
    """publish_checkpoint's publication for any directory: the side `files` (name -> bytes) and
    the files `write(staging_dir)` creates there, named in `written` in the order they are
    published (the weights last: a sharded model's index after its shards). The same refusals,
    atomicity and errors as publish_checkpoint. `nested`: names are relative POSIX paths (a
    plain directory's: subfolders, dot files, any suffix)."""
    dst, files = Path(dst), dict(files)
    order = _publish_order(dst, files, written, nested)
    if not overwrite:
        fsutil.refuse_existing(dst, order)
    label = os.path.basename(os.path.abspath(dst)) or "checkpoint"
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise output_error(exc, dst.parent) from None
    existed = os.path.lexists(dst)
    staging: AtomicOutput | None = None
    try:
        staging = _staging(dst, label, existed, overwrite)
        with staging:  # an exception, KeyboardInterrupt included, removes the staging directory
            for name in sorted(files):
                (staging.temp / name).parent.mkdir(parents=True, exist_ok=True)
                fsutil.write_synced(staging.temp / name, files[name])
            write(staging.temp)
            _publish(staging, order)
    except FileExistsError as exc:  # overwrite=False: something appeared at DST while it was written
        what = exc.filename or dst
        raise output_exists(f"{what}: it appeared while {dst} was written; nothing was written") from None
    except OSError as exc:
        raise output_error(exc, dst, _failure_note(dst, existed, staging.moved if staging else 0, len(order))) from None
    except BaseException:  # an interrupt between the staging directory's creation and its `with`
        if staging is not None:
            staging.discard()
        raise
    # a killed earlier run may have staged at the other place (next to DST or inside it)
    assert staging is not None
    fsutil.remove_stale_temps(dst if staging.where != dst else dst.parent, label)
    return dst


def _publish_order(dst: Path, files: dict[str, bytes], written: list[str], nested: bool = False) -> list[str]:
    """The names to publish, the written ones (weights) last; refuses bad names and a DST that
    cannot take them."""
    for name in files:
        if nested:
            fsutil.check_relative_path(name, "side file")
        elif not name or "/" in name or "\\" in name or name.startswith(".") or name.endswith(WEIGHT_SUFFIXES):
            raise InputError(f"refusing to write side file {name!r}")
    for name in written:
        if nested:
            fsutil.check_relative_path(name)
        elif not name or "/" in name or "\\" in name or name.startswith("."):
            raise InputError(f"refusing to write {name!r}")
    if set(files) & set(written) or len(set(written)) != len(written):
        raise InputError(f"a file is named twice among {sorted(files) + written}")
    order = sorted(files) + list(written)  # the weights last: see publish_checkpoint
    if os.path.lexists(dst) and not dst.is_dir():
        raise InputError(f"{dst} exists and is not a directory")
    for up in dst.parents:  # the nearest existing ancestor must be a directory to create DST in
        if os.path.lexists(up):
            if not up.is_dir():
                raise InputError(f"cannot create {dst}: {up} is not a directory")
            break
    for name in order:
        if (dst / name).is_dir():
            raise InputError(f"{dst / name} is a directory; refusing to write there")
    return order


def _can_swap(dst: Path) -> bool:
    """Can a staged sibling directory be renamed onto DST? Yes if DST does not exist, or is an
    empty real directory that is not a mount point, not on another device than its parent and
    not the current directory (renaming over it would leave the shell in a deleted directory)."""
    if not os.path.lexists(dst):
        return True
    try:
        if dst.is_symlink() or not dst.is_dir() or os.path.ismount(dst):
            return False
        with os.scandir(dst) as it:
            if any(True for _ in it):
                return False
        if os.stat(dst).st_dev != os.stat(dst.parent).st_dev:
            return False
        return not os.path.samefile(dst, os.getcwd())
    except OSError:
        return False


def _staging(dst: Path, label: str, existed: bool, overwrite: bool = True) -> AtomicOutput:
    """The staging directory: next to DST if it can be renamed onto DST, else inside DST."""
    if not _can_swap(dst):
        return AtomicOutput(dst, directory=True, where=dst, name=label, replace=overwrite)
    try:
        return AtomicOutput(dst, directory=True, where=dst.parent, name=label, replace=overwrite)
    except PermissionError:
        if not existed:
            raise
        # an empty DST we may write into, in a parent we may not: stage inside DST
        return AtomicOutput(dst, directory=True, where=dst, name=label, replace=overwrite)


def _publish(staging: AtomicOutput, order: list[str]) -> None:
    """One rename of a staging directory next to DST onto DST; else the burst, weights last.
    Without replace, a DST that has meanwhile become anything but an empty directory is left
    alone (FileExistsError)."""
    if staging.where != staging.path:
        try:
            staging.publish()
            return
        except OSError:  # DST appeared and holds files, or the OS cannot replace a directory
            if not staging.replace and os.path.lexists(staging.path) and not _is_empty_dir(staging.path):
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(staging.path)) from None
    staging.publish_entries(order)


def _is_empty_dir(path: Path) -> bool:
    try:
        with os.scandir(path) as it:
            return not any(True for _ in it)
    except OSError:
        return False


def _failure_note(dst: Path, existed: bool, moved: int, total: int) -> str:
    if moved:
        return f"; {dst} now holds {moved} of the {total} new files"
    return f"; the existing {dst} is unchanged" if existed else f"; {dst} was not created"


def _torch_save_synced(path: Path, sd: dict[str, torch.Tensor]) -> None:
    """torch.save to a path (so the zip's root folder is named after the file, as in TC's files),
    fsync, and check the result. torch's C++ writer reports a failed write as a RuntimeError
    ("unexpected pos", "iostream error"), not an OSError, so the real OSError is recovered by
    probing. The zip's end is checked too, in case a write is lost without an exception (an
    unchecked final flush): a cheap guard, the central directory is a few KB."""
    try:
        torch.save(sd, str(path))
    except RuntimeError as exc:
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise fsutil.probe_write(path) or OSError(None, f"torch.save failed: {why}") from None
    fsutil.fsync_path(path)
    if not torch_zip_is_whole(path):
        raise fsutil.probe_write(path) or OSError(None, "torch.save wrote an incomplete file")


def write_checkpoint(ckpt: Checkpoint, dst: Path | str, fmt: str = "pt", *, overwrite: bool = False) -> Path:
    """Write a checkpoint held in memory (see publish_checkpoint for how, atomically, and for
    `overwrite`: DST must be absent or empty without it)."""
    check_format(fmt)
    for k, v in ckpt.state_dict.items():
        if not isinstance(v, torch.Tensor):
            raise InputError(f"value of {k!r} is a {type(v).__name__}, not a tensor")
    files = side_files(ckpt.stem, ckpt.extra_files, ckpt.hf_config, ckpt.slicing_config)

    def weights(path: Path) -> None:
        if fmt == "pt":
            _torch_save_synced(path, dict(ckpt.state_dict))
        else:
            import safetensors.torch

            sd = {k: v.detach().contiguous() for k, v in ckpt.state_dict.items()}
            fsutil.write_synced(path, safetensors.torch.save(sd, metadata={"format": "pt"}))

    return publish_checkpoint(dst, ckpt.stem, files, fmt, weights, overwrite=overwrite)

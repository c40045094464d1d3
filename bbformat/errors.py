"""One exception hierarchy. Every error has a stable code and a CLI exit status."""
from __future__ import annotations

import errno
import os
from collections.abc import Sequence

from .constants import ExitStatus


class BBFormatError(Exception):
    """Base of every error bbformat raises on purpose."""

    code = "E_BBFORMAT"
    exit_status: int = ExitStatus.ERROR

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class InputError(BBFormatError):
    """The user's input (checkpoint, options, paths) cannot be used."""

    code = "E_INPUT"
    exit_status = ExitStatus.INPUT


class UnsupportedModelError(InputError):
    """An architecture or state dict we refuse to encode."""

    code = "E_UNSUPPORTED_MODEL"
    exit_status = ExitStatus.UNSUPPORTED_MODEL


class OutputExistsError(InputError):
    """The output exists and replacing it was not asked for (`--force`, `overwrite=True`).
    Nothing was written."""

    code = "E_EXISTS"
    exit_status = ExitStatus.INPUT


def output_exists(what: str, many: bool = False, hint: str | None = None) -> OutputExistsError:
    """The one wording of a refused replacement: "refusing to replace WHAT; --force (Python:
    overwrite=True) replaces it" (`many`: them), or `hint` instead of the part after ";"."""
    if hint is None:
        hint = f"--force (Python: overwrite=True) replaces {'them' if many else 'it'}"
    return OutputExistsError(f"refusing to replace {what}; {hint}")


class FormatError(BBFormatError):
    """A container violates SPEC.md; `code` names the MUST-reject rule."""

    code = "E_FORMAT"
    exit_status = ExitStatus.FORMAT


class IntegrityError(FormatError):
    """A CRC32C mismatch."""

    code = "E_CRC"
    exit_status = ExitStatus.INTEGRITY


class LimitError(FormatError):
    """A container exceeds a stated reader limit."""

    code = "E_LIMIT"
    exit_status = ExitStatus.LIMIT


class DigestError(FormatError):
    """A chunk decoded to values whose CRC32C differs from the digest the file records
    (SPEC.md 5.4): this reader's arithmetic did not reproduce the encoder's decoding."""

    code = "E_DIGEST"
    exit_status = ExitStatus.DIGEST


class VerifyError(BBFormatError):
    """pack --verify found the decoded container differs from the encoder's intent."""

    code = "E_VERIFY"
    exit_status = ExitStatus.VERIFY


class OutputError(BBFormatError):
    """Writing the output failed (permissions, I/O error, ...). Nothing partial is left at
    the destination: an output that existed before is unchanged, a new one does not appear."""

    code = "E_OUTPUT"
    exit_status = ExitStatus.OUTPUT


class NoSpaceError(OutputError):
    """Writing the output ran out of space: disk full, quota exceeded or file-size limit."""

    code = "E_NO_SPACE"
    exit_status = ExitStatus.OUTPUT


class DeviceError(BBFormatError):
    """The device chosen for the linear algebra (`device=`, `--device`) is missing, cannot run
    float64 linear algebra, or ran out of memory. Nothing is written when it happens."""

    code = "E_DEVICE"
    exit_status = ExitStatus.DEVICE


def check_choice(what: str, value: object, choices: Sequence[str]) -> None:
    """InputError unless `value` is one of `choices`: "unknown {what} {value!r} (choose a, b, ...)".
    The one wording of every option check (scheme, entropy mode, format version)."""
    if value not in choices:
        raise InputError(f"unknown {what} {value!r} (choose {', '.join(choices)})")


def check_count(what: str, value: object) -> int:
    """`value` if it is a whole number of at least 1 (not a bool), else InputError: "{what}
    must be a whole number of at least 1, not {value!r}"."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{what} must be a whole number of at least 1, not {value!r}")
    return value


_NO_SPACE = {errno.ENOSPC, errno.EFBIG} | ({errno.EDQUOT} if hasattr(errno, "EDQUOT") else set())


def output_error(exc: OSError, target: str | os.PathLike[str], note: str = "") -> OutputError:
    """The bbformat error for an OSError met while writing `target` (one line, errno's text)."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    cls = NoSpaceError if exc.errno in _NO_SPACE else OutputError
    return cls(f"cannot write {os.fspath(target)}: {reason}{note}")

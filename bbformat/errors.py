"""One exception hierarchy. Every error has a stable code and a CLI exit status."""
from __future__ import annotations

import errno
import os


class BBFormatError(Exception):
    """Base of every error bbformat raises on purpose."""

    code = "E_BBFORMAT"
    exit_status = 1

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class InputError(BBFormatError):
    """The user's input (checkpoint, options, paths) cannot be used."""

    code = "E_INPUT"
    exit_status = 2


class UnsupportedModelError(InputError):
    """An architecture or state dict we refuse to encode."""

    code = "E_UNSUPPORTED_MODEL"
    exit_status = 3


class FormatError(BBFormatError):
    """A container violates SPEC.md; `code` names the MUST-reject rule."""

    code = "E_FORMAT"
    exit_status = 4


class IntegrityError(FormatError):
    """A CRC32C mismatch."""

    code = "E_CRC"
    exit_status = 5


class LimitError(FormatError):
    """A container exceeds a stated reader limit."""

    code = "E_LIMIT"
    exit_status = 6


class DigestError(FormatError):
    """A chunk decoded to values whose CRC32C differs from the digest the file records
    (SPEC.md 5.4): this reader's arithmetic did not reproduce the encoder's decoding."""

    code = "E_DIGEST"
    exit_status = 9


class VerifyError(BBFormatError):
    """pack --verify found the decoded container differs from the encoder's intent."""

    code = "E_VERIFY"
    exit_status = 7


class OutputError(BBFormatError):
    """Writing the output failed (permissions, I/O error, ...). Nothing partial is left at
    the destination: an output that existed before is unchanged, a new one does not appear."""

    code = "E_OUTPUT"
    exit_status = 8


class NoSpaceError(OutputError):
    """Writing the output ran out of space: disk full, quota exceeded or file-size limit."""

    code = "E_NO_SPACE"
    exit_status = 8


_NO_SPACE = {errno.ENOSPC, errno.EFBIG} | ({errno.EDQUOT} if hasattr(errno, "EDQUOT") else set())


def output_error(exc: OSError, target: str | os.PathLike[str], note: str = "") -> OutputError:
    """The bbformat error for an OSError met while writing `target` (one line, errno's text)."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    cls = NoSpaceError if exc.errno in _NO_SPACE else OutputError
    return cls(f"cannot write {os.fspath(target)}: {reason}{note}")

"""One exception hierarchy. Every error has a stable code and a CLI exit status."""
from __future__ import annotations


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


class VerifyError(BBFormatError):
    """pack --verify found the decoded container differs from the encoder's intent."""

    code = "E_VERIFY"
    exit_status = 7

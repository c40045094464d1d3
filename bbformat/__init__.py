"""bbformat: bits-back coding of rotation-symmetric transformer weights (SliceGPT)."""
from __future__ import annotations

from .api import InexactWarning, PackReport, VerifyReport, open_container, pack, read_tensors, unpack, verify
from .errors import (
    BBFormatError,
    DigestError,
    FormatError,
    InputError,
    IntegrityError,
    LimitError,
    NoSpaceError,
    OutputError,
    UnsupportedModelError,
    VerifyError,
)
from .inspect import inspect
from .loader import load_model
from .reader import DecodedBlock, Reader, iter_stream
from .writer import Writer

__version__ = "1.2.0"

__all__ = [
    "BBFormatError",
    "DecodedBlock",
    "DigestError",
    "FormatError",
    "InexactWarning",
    "InputError",
    "IntegrityError",
    "LimitError",
    "NoSpaceError",
    "OutputError",
    "PackReport",
    "Reader",
    "UnsupportedModelError",
    "VerifyError",
    "Writer",
    "inspect",
    "iter_stream",
    "load_model",
    "open_container",
    "pack",
    "read_tensors",
    "unpack",
    "verify",
    "VerifyReport",
]

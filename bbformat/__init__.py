"""bbformat: bits-back coding of rotation-symmetric transformer weights (SliceGPT)."""
from __future__ import annotations

from .api import DeviceNote, InexactWarning, PackReport, VerifyReport, open_container, pack, read_tensors, unpack, verify
from .errors import (
    BBFormatError,
    DeviceError,
    DigestError,
    FormatError,
    InputError,
    IntegrityError,
    LimitError,
    NoSpaceError,
    OutputError,
    OutputExistsError,
    UnsupportedModelError,
    VerifyError,
)
from .summary import inspect
from .container.framing import Header
from .reader import DecodedBlock, Reader, StreamReader, iter_stream
from .writer import Writer

__version__ = "1.3.0"


def __getattr__(name: str) -> object:
    """load_model and load_file need torch (load_model also transformers): imported on first
    use, so that `import bbformat` (and the CLI's inspect and verify) does not load them."""
    if name == "load_model":
        from .loader import load_model

        return load_model
    if name == "load_file":
        from .loader import load_file

        return load_file
    raise AttributeError(f"module 'bbformat' has no attribute {name!r}")

__all__ = [
    "BBFormatError",
    "DecodedBlock",
    "DeviceError",
    "DeviceNote",
    "DigestError",
    "FormatError",
    "Header",
    "InexactWarning",
    "InputError",
    "IntegrityError",
    "LimitError",
    "NoSpaceError",
    "OutputError",
    "OutputExistsError",
    "PackReport",
    "Reader",
    "StreamReader",
    "UnsupportedModelError",
    "VerifyError",
    "Writer",
    "inspect",
    "iter_stream",
    "load_file",
    "load_model",
    "open_container",
    "pack",
    "read_tensors",
    "unpack",
    "verify",
    "VerifyReport",
]

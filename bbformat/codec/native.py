"""The compiled codec helpers (bbformat/codec/_exponent_native.c), loaded once for the modules
that use them: exponent.py (payload codec 3) and entropy.py (codec 2's top-plane
un-permutation). `compiled` is None where the extension was not built (no C compiler at
install), was built from another version of the C file, or the host is big-endian: every
caller then takes its numpy path, which gives the same bytes."""
from __future__ import annotations

import importlib
import sys
from types import ModuleType

ABI = 6  # the compiled module's functions and argument lists that the callers pass


def load(name: str, abi: int) -> ModuleType | None:
    """The compiled module bbformat.codec.NAME, or None where it was not built, was built from
    another version of its C file (its ABI differs from `abi`), or the host is big-endian (the
    compiled modules read and write native-order arrays as little-endian data)."""
    try:
        mod = importlib.import_module(f"{__package__}.{name}")
    except ImportError:  # pragma: no cover - numpy is used instead
        return None
    return mod if getattr(mod, "ABI", None) == abi and sys.byteorder == "little" else None


compiled = load("_exponent_native", ABI)

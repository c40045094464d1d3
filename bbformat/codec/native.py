"""The compiled codec helpers (bbformat/codec/_exponent_native.c), loaded once for the modules
that use them: exponent.py (payload codec 3) and entropy.py (codec 2's top-plane
un-permutation). `compiled` is None where the extension was not built (no C compiler at
install), was built from another version of the C file, or the host is big-endian: every
caller then takes its numpy path, which gives the same bytes."""
from __future__ import annotations

import sys
from types import ModuleType

ABI = 6  # the compiled module's functions and argument lists that the callers pass

compiled: ModuleType | None
try:
    from . import _exponent_native as compiled
except ImportError:  # pragma: no cover - numpy is used instead
    compiled = None
if compiled is not None and (getattr(compiled, "ABI", None) != ABI or sys.byteorder != "little"):
    compiled = None  # a stale build, or a big-endian host (tables and symbols are stored native)

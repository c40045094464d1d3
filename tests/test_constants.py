"""bbformat/constants.py is the one home of the format's numbers: it stands alone, and the
code and the exception classes agree with it."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from bbformat import constants as C
from bbformat import errors

ROOT = Path(__file__).resolve().parent.parent


def test_constants_import_nothing() -> None:
    """Loaded as a lone file, it needs neither numpy nor the rest of bbformat."""
    code = ("import importlib.util, sys; spec = importlib.util.spec_from_file_location('c', sys.argv[1]); "
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
            "assert not {'numpy', 'bbformat', 'zstandard'} & set(sys.modules), sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code, str(ROOT / "bbformat" / "constants.py")], check=True, timeout=60)


def test_every_error_code_has_its_exit_status() -> None:
    """Every code a check reports is in ERROR_CODES, with its exception class's exit status."""
    raised = set()
    for p in (ROOT / "bbformat").rglob("*.py"):
        raised |= set(re.findall(r'"(E_[A-Z_]+)"', p.read_text()))
    defaults = {cls.code for cls in vars(errors).values() if isinstance(cls, type) and issubclass(cls, errors.BBFormatError)}
    assert sorted(raised - defaults - {"E_CRC_", "E_LIMIT_"} - set(C.ERROR_CODES)) == []
    classes = [cls for cls in vars(errors).values() if isinstance(cls, type) and issubclass(cls, errors.BBFormatError)]
    for cls in classes:
        if cls.code in C.ERROR_CODES:
            assert C.ERROR_CODES[cls.code] == cls.exit_status, cls
    by_prefix = {"E_CRC_": errors.IntegrityError, "E_LIMIT_": errors.LimitError, "E_DIGEST": errors.DigestError}
    for code, status in C.ERROR_CODES.items():
        for prefix, cls in by_prefix.items():
            if code.startswith(prefix):
                assert status == cls.exit_status, code


def test_version_rule() -> None:
    """SPEC.md 4, Versions: the flags a writer sets and the minor they give."""
    assert [C.written_version(v, e) for v in C.FORMAT_VERSIONS for e in C.ENTROPY_MODES] == \
        ["1.4"] + ["1.5"] * 4 + ["1.4"] + ["1.5"] * 4 + ["1.4"] * 5 + ["1.2", "1.2", "1.2", "1.3", "1.3"] + ["1.2"] * 5 + ["1.0", "1.0", "1.1", "1.0", "1.1"]
    assert [C.written_version("1.5", e, sites=False) for e in C.ENTROPY_MODES] == ["1.2", "1.5", "1.5", "1.5", "1.5"]
    assert [C.written_version("1.4", e, sites=False) for e in C.ENTROPY_MODES] == ["1.2", "1.2", "1.2", "1.3", "1.3"]
    assert [C.written_version("1.6", e, sites=False, dtypes=True) for e in C.ENTROPY_MODES] == ["1.6"] * 5
    assert [C.written_version(v, "auto", dtypes=True) for v in C.FORMAT_VERSIONS[1:]] == ["1.5", "1.4", "1.3", "1.2", "1.1"]
    assert C.required_flags_for("1.6", "auto", dtypes=True) == C.REQUIRED_FLAGS_KNOWN
    assert C.required_flags_for("1.6", "auto") == C.required_flags_for("1.5", "auto")
    assert C.required_flags_for("1.5", "auto") == C.REQUIRED_FLAGS_KNOWN & ~C.RequiredFlag.DTYPES
    assert C.required_flags_for("1.5", "none") == C.RequiredFlag.DIGESTS | C.RequiredFlag.MIXED_CORRECTIONS | C.RequiredFlag.BANDS
    no_dtypes = C.REQUIRED_FLAGS_KNOWN & ~C.RequiredFlag.DTYPES
    assert C.required_flags_for("1.4", "auto") == no_dtypes & ~C.RequiredFlag.PARTS
    assert C.required_flags_for("1.3", "auto") == no_dtypes & ~C.RequiredFlag.BANDS & ~C.RequiredFlag.PARTS
    assert C.required_flags_for("1.2", "auto") == no_dtypes & ~C.RequiredFlag.EXPONENT & ~C.RequiredFlag.BANDS \
        & ~C.RequiredFlag.PARTS
    assert C.required_flags_for("1.2", "none") == C.RequiredFlag.DIGESTS | C.RequiredFlag.MIXED_CORRECTIONS
    assert C.required_flags_for("1.1", "auto") == C.RequiredFlag.PLANES
    assert C.minor_for(C.REQUIRED_FLAGS_KNOWN) == C.FORMAT_MINOR


def test_tables_match_the_spec() -> None:
    spec = (ROOT / "SPEC.md").read_text()
    for kind in C.SectionKind:
        assert f"| {int(kind)} | {C.SECTION_KIND_NAMES[kind]} |" in spec
    for dtype in C.Dtype:
        assert f"| {int(dtype)} | {C.DTYPE_NAMES[dtype]} " in spec
        assert f"| {C.DTYPE_BITS[C.DTYPE_NAMES[dtype]]} |" in spec
    for st_name, name in C.SAFETENSORS_DTYPES.items():  # SPEC.md 6.1: code | name | bits | safetensors
        code = C.DTYPE_CODES[name]
        assert f"| {int(code)} | {name} | {C.DTYPE_BITS[name]} | `{st_name}` |" in spec
    assert sorted(C.SAFETENSORS_DTYPES.values()) == sorted(C.DTYPE_CODES)
    assert C.EXTENDED_DTYPES == {n for n, c in C.DTYPE_CODES.items() if c >= 4}
    for name, code in C.SCHEME_CODES.items():
        assert f"{int(code)} = `{name}`" in spec
    assert C.MIN_FILE_SIZE == 84 and C.MIN_CHUNK_LENGTH == 36 and C.HEADER_MIN_SIZE == 36

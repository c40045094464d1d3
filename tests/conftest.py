from __future__ import annotations

import atexit
import io
import shutil
import tempfile

import numpy as np
import pytest
from hypothesis import settings
from hypothesis.configuration import set_hypothesis_home_dir

from bbformat.codec.dtypes import RawTensor
from bbformat.codec.encoder import encode_chunk
from bbformat.codec.layout import ChunkLayout, SiteSpec
from bbformat.container.program import AxisRef
from bbformat.writer import Writer

# Nothing of Hypothesis' in the repository (no example database; its caches in a temporary
# directory removed at exit): tests write only inside temporary directories.
settings.register_profile("bbformat", database=None)
settings.load_profile("bbformat")
_HYPOTHESIS_HOME = tempfile.mkdtemp(prefix="bbformat-hypothesis-")
set_hypothesis_home_dir(_HYPOTHESIS_HOME)
atexit.register(shutil.rmtree, _HYPOTHESIS_HOME, True)


DAMAGE = ("flip", "set", "cut", "insert")


def with_content_crc(data: bytes, chunk: int, value: int) -> bytes:
    """The container with one chunk's content_crc replaced; every CRC resealed."""
    from bbformat.container.rebuild import join, reseal_chunk, split

    parts = split(data)
    c = bytearray(parts.chunks[chunk])
    c[4:8] = value.to_bytes(4, "little")
    parts.chunks[chunk] = reseal_chunk(bytes(c))
    return join(parts)


def damage(data: bytearray, rng: np.random.Generator, how: str, start: int = 0) -> bytearray:
    """data damaged in place at a random position >= start: one bit flipped, one byte set,
    cut there, or 1 to 8 random bytes inserted (`how`, one of DAMAGE)."""
    at = int(rng.integers(start, len(data)))
    if how == "flip":
        data[at] ^= 1 << int(rng.integers(0, 8))
    elif how == "set":
        data[at] = int(rng.integers(0, 256))
    elif how == "cut":
        del data[at:]
    else:
        data[at:at] = bytes(rng.integers(0, 256, int(rng.integers(1, 9)), dtype=np.uint8))
    return data


def sample_container(scheme: str = "symmetric", tolerance: float = 0.0, seed: int = 7, dim: int = 24, entropy: str = "none",
                     format_version: str = "1.1", part_symbols: int | None = None) -> bytes:
    """Two chunks: a float16 chunk with one rotation site, and a float32 chunk without.
    format_version "1.1" (the default here: the container-rule tests edit its bytes, and the
    golden fixtures pin them) is the 1.1 encoder's file; "1.2" adds the band and digests."""
    rng = np.random.default_rng(seed)
    t0 = {
        "src": RawTensor.from_f64(rng.normal(0, 0.05, (30, dim)), "float16"),
        "anchor": RawTensor.from_f64(rng.normal(0, 0.05, (dim, 28)), "float16"),
        "follower": RawTensor.from_f64(rng.normal(0, 0.05, (3, dim)), "float16"),
    }
    l0 = ChunkLayout("block0", ("src", "anchor", "follower"), (SiteSpec("site0", dim, AxisRef("anchor", 0), (AxisRef("follower", 1),)),))
    t1 = {"bias": RawTensor.from_f64(rng.normal(0, 1, (3, 4)), "float32")}
    l1 = ChunkLayout("block1", ("bias",), ())
    buf = io.BytesIO()
    w = Writer(buf, scheme, 2, {"format": "bbformat", "scheme": scheme, "tolerance": tolerance}, entropy=entropy,
               format_version=format_version, **({} if part_symbols is None else {"part_symbols": part_symbols}))
    for lay, ts in ((l0, t0), (l1, t1)):
        enc = encode_chunk(lay, ts, {}, scheme, tolerance, band=format_version != "1.1", bands=format_version in ("1.4", "1.5", "1.6"))
        w.add_encoded(enc)
    w.close()
    return buf.getvalue()


def sample_tensors(format_version: str) -> dict[str, bytes]:
    """The decoded tensors of sample_container(format_version=...), by name: what every
    golden fixture of the same input must decode to."""
    from bbformat.reader import Reader

    with Reader(io.BytesIO(sample_container(format_version=format_version))) as r:
        return {n: t.tobytes() for b in r.iter_blocks() for n, t in b.tensors.items()}


def assert_refused_without(monkeypatch: pytest.MonkeyPatch, flag: int, data: bytes) -> None:
    """A reader that does not know required flag `flag` (an older version's) stops at the
    header with E_REQUIRED_FLAG."""
    from bbformat.container import framing
    from bbformat.errors import FormatError
    from bbformat.reader import Reader

    monkeypatch.setattr(framing, "REQUIRED_FLAGS_KNOWN", framing.REQUIRED_FLAGS_KNOWN & ~flag)
    with pytest.raises(FormatError) as ei:
        Reader(io.BytesIO(data))
    assert ei.value.code == "E_REQUIRED_FLAG"


@pytest.fixture
def sample_bytes() -> bytes:
    return sample_container()

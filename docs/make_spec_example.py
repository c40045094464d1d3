"""Reproduce the worked example of SPEC.md appendix A: python docs/make_spec_example.py"""
import io
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bbformat.codec.dtypes import RawTensor  # noqa: E402
from bbformat.codec.encoder import encode_chunk  # noqa: E402
from bbformat.codec.layout import ChunkLayout, SiteSpec  # noqa: E402
from bbformat.container.program import AxisRef  # noqa: E402
from bbformat.writer import Writer  # noqa: E402

rng = np.random.default_rng(2024)
tensors = {
    "src": RawTensor.from_f64(rng.normal(0, 0.05, (8, 8)), "float16"),
    "w": RawTensor.from_f64(rng.normal(0, 0.05, (8, 10)), "float16"),
}
layout = ChunkLayout("blk", ("src", "w"), (SiteSpec("s", 8, AxisRef("w", 0)),))
enc = encode_chunk(layout, tensors, {}, "symmetric", 0.01, band=False)  # a 1.0 file: no band, no digests
buf = io.BytesIO()
w = Writer(buf, "symmetric", 1, {"tolerance": 0.01}, format_version="1.1")
w.add_chunk(enc.program, enc.sections)
w.close()
data = buf.getvalue()
if __name__ == "__main__":
    for off in range(0, len(data), 16):
        row = data[off : off + 16]
        print(f"{off:06x}  {row.hex(' ')}")

"""The compiled parts, both optional: where no C compiler is found the package installs without
them and runs their numpy counterparts (the same symbols, bits and bytes, slower; `bbformat
--version` says which). _exponent_native: payload codec 3's coder (bbformat/codec/exponent.py).
_host_native: the host's per-value work of decoding and encoding (bbformat/codec/host_native.py).
Everything else is in pyproject.toml."""
from setuptools import Extension, setup

setup(ext_modules=[
    Extension("bbformat.codec._exponent_native", ["bbformat/codec/_exponent_native.c"], optional=True),
    Extension("bbformat.codec._host_native", ["bbformat/codec/_host_native.c"], optional=True),
])

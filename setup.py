"""The compiled coder (decoder and encoder) of payload codec 3 (bbformat/codec/_exponent_native.c). It is
optional: where no C compiler is found the package installs without it and codes in numpy
(the same symbols and bytes, slower; `bbformat --version` says which). Everything else is in pyproject.toml."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("bbformat.codec._exponent_native", ["bbformat/codec/_exponent_native.c"], optional=True)])

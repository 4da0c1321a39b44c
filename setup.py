"""Only the compiled read path's cffi module: everything else is in pyproject.toml."""

from setuptools import setup

setup(cffi_modules=["_build/fastread_ffi.py:ffi"])

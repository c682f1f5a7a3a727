"""Builds the native event layer (native/) as a plain shared library loaded with ctypes.

It is declared as a setuptools Extension only so that `pip install` (editable or not) compiles it
with the interpreter's toolchain at install time; it defines no Python module init and is never
imported, only opened with ctypes.CDLL (see skippyctl/native/library.py).
"""

from __future__ import annotations

import os
from glob import glob

from setuptools import Extension, setup

warning_flags = ["-Wall", "-Wextra", "-Wshadow", "-Wstrict-prototypes", "-Wmissing-prototypes"]
if os.environ.get("CI") or os.environ.get("SKIPPY_WERROR"):
    warning_flags.append("-Werror")

native = Extension(
    "skippyctl.native._skippy_native",
    sources=sorted(glob("native/src/*.c")),
    include_dirs=["native/include"],
    extra_compile_args=["-std=c11", "-O2", "-fvisibility=hidden", "-D_GNU_SOURCE", *warning_flags],
    extra_link_args=["-pthread"],
    libraries=["dl"],
)

setup(ext_modules=[native])

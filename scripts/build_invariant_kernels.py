"""Builds the ggml CPU library that engines without flash attention run on: the same ggml as the
venv's llama-cpp-python, built with the same options, but without llamafile's sgemm.

    .venv/bin/python scripts/build_invariant_kernels.py      (scripts/bootstrap.sh runs it)

Why: llamafile's sgemm takes a matrix product of two or more rows (a verify window, a prompt,
attention without flash attention) and ggml's own dot products take one row, and the two round
differently. Without it every product is ggml's per-row dot product, so a row's result does not
depend on the rows beside it: a greedy text is the same alone, beside other requests and under
speculation (docs/BENCHMARKS.md section 5, "Flash attention on the CPU"). The stock library stays
the default for everything else: llamafile's sgemm prefills F16, Q8_0 and Q4_0 weights about
twice as fast.

The source is the pinned `llama-cpp-python` source distribution (pip's HTTP cache answers the
download after the bootstrap); its `vendor/llama.cpp` is configured and only the `ggml-cpu`
target is built (under a minute on 2 cores). The result, `libggml-cpu.so.0` and its
links, goes to `skippyctl.engine.kernels.INVARIANT_KERNELS_DIR` with a stamp of the options; a
second run with the same options does nothing.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Final

from skippyctl.engine.kernels import INVARIANT_KERNELS_DIR, INVARIANT_KERNELS_LIBRARY

LLAMA_CPP_PYTHON_VERSION: Final = "0.3.36"
"""Must match scripts/bootstrap.sh and pyproject.toml (the peers' build reads it from here)."""
VENDORED: Final = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp/"
BOOTSTRAP_CMAKE_ARGS: Final = Path(sys.prefix) / "llama-cmake-args"
"""Written by scripts/bootstrap.sh into the venv: the CMAKE_ARGS it built llama-cpp-python with
(read here and by benchmarks/llama_server_build.py)."""
STAMP: Final = "options"


def _say(message: str) -> None:
    sys.stderr.write(f"build_invariant_kernels: {message}\n")
    sys.stderr.flush()


def cmake_options() -> list[str]:
    extra = BOOTSTRAP_CMAKE_ARGS.read_text().split() if BOOTSTRAP_CMAKE_ARGS.is_file() else []
    return [
        "-DCMAKE_BUILD_TYPE=Release",
        "-DBUILD_SHARED_LIBS=ON",
        *extra,
        "-DLLAMA_CURL=OFF",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_BUILD_SERVER=OFF",
        "-DGGML_LLAMAFILE=OFF",
    ]


def unpack_vendored_llama_cpp(root: Path) -> Path:
    """The pinned sdist's vendored llama.cpp, unpacked into ``root`` (also the peers' source:
    benchmarks/llama_server_build.py); returns ``root``."""
    with tempfile.TemporaryDirectory(prefix="skippy-sdist-") as download:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--no-binary",
                ":all:",
                f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}",
                "-d",
                download,
            ],
            check=True,
        )
        (archive,) = Path(download).glob("llama_cpp_python-*.tar.gz")
        with tarfile.open(archive) as tar:
            # The sdist's vendor/llama.cpp/.git is a submodule pointer to a directory it lacks.
            members = [
                m
                for m in tar.getmembers()
                if m.name.startswith(VENDORED) and m.name != VENDORED + ".git"
            ]
            for member in members:
                member.name = member.name[len(VENDORED) :]
            tar.extractall(root, members=[m for m in members if m.name], filter="data")
    return root


def build() -> Path:
    options = cmake_options()
    stamp = INVARIANT_KERNELS_DIR / STAMP
    library = INVARIANT_KERNELS_DIR / INVARIANT_KERNELS_LIBRARY
    if library.is_file() and stamp.is_file() and stamp.read_text() == " ".join(options):
        return library
    _say("building ggml's CPU library without llamafile's sgemm (under a minute on 2 cores)")
    with tempfile.TemporaryDirectory(prefix="skippy-kernels-") as scratch:
        source = unpack_vendored_llama_cpp(Path(scratch) / "llama.cpp")
        build_dir = Path(scratch) / "build"
        # Compiler output goes to stderr with the rest of this log (errors must be readable).
        subprocess.run(
            ["cmake", "-S", str(source), "-B", str(build_dir), *options],
            check=True,
            stdout=sys.stderr,
        )
        subprocess.run(
            ["cmake", "--build", str(build_dir), "--target", "ggml-cpu", "-j", "2"],
            check=True,
            stdout=sys.stderr,
        )
        built = sorted(build_dir.rglob("libggml-cpu.so*"))
        real = [p for p in built if not p.is_symlink()]
        if len(real) != 1 or ctypes.CDLL(str(real[0])).ggml_cpu_has_llamafile() != 0:
            raise SystemExit(f"build_invariant_kernels: unexpected build output {built}")
        if INVARIANT_KERNELS_DIR.exists():
            shutil.rmtree(INVARIANT_KERNELS_DIR)
        INVARIANT_KERNELS_DIR.mkdir(parents=True)
        for path in built:
            shutil.copy2(path, INVARIANT_KERNELS_DIR / path.name, follow_symlinks=False)
    stamp.write_text(" ".join(options))
    return library


def main() -> int:
    sys.stdout.write(f"{build()}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

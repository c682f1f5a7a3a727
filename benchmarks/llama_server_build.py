"""Builds llama.cpp's own `llama-server` and `ggml-rpc-server` — the peers an operator would pick —
from the llama.cpp that `llama-cpp-python` vendors, so they run the same engine code as ours.

    .venv/bin/python -m benchmarks.llama_server_build [--jobs N] [--print-path]

The source is the `llama-cpp-python` source distribution of the pinned version (the one
scripts/bootstrap.sh builds from; pip's HTTP cache answers the download after the bootstrap),
unpacked and built once into a cache outside the venv:
`$SKIPPY_PEER_CACHE` or `${XDG_CACHE_HOME:-~/.cache}/skippyctl/peers/llama.cpp-<version>-<key>/`,
where <key> hashes the CMake options. The CMake options are the ones the bootstrap's build gets:
scikit-build-core's Release build type, shared libraries, llama-cpp-python's forced
`LLAMA_CURL=OFF`, and the `CMAKE_ARGS` the bootstrap built with (it keeps them in
`.venv/llama-cmake-args`: `-DGGML_RPC=ON`, AMX kernels left out on x86-64, plus whatever the
environment added), with only the server and RPC targets added. A finished build is reused (a
stamp file records the options); an interrupted or failed one resumes. Prints the path of
`llama-server` on stdout.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Final

from scripts.build_invariant_kernels import (
    BOOTSTRAP_CMAKE_ARGS,
    LLAMA_CPP_PYTHON_VERSION,
    unpack_vendored_llama_cpp,
)

TARGETS: Final = ("llama-server", "ggml-rpc-server")
"""CMake targets (and binary names): the server, and ggml's RPC stage worker."""
_STAMP: Final = "skippy-build.stamp"


def cmake_options() -> list[str]:
    """The bootstrap's CMake options (see the module docstring), plus the peer targets."""
    if BOOTSTRAP_CMAKE_ARGS.is_file():
        extra = BOOTSTRAP_CMAKE_ARGS.read_text().split()
    else:  # a venv bootstrapped before the file existed
        extra = os.environ.get("CMAKE_ARGS", "").split()
    return [
        "-DCMAKE_BUILD_TYPE=Release",
        "-DBUILD_SHARED_LIBS=ON",
        "-DLLAMA_CURL=OFF",
        "-DLLAMA_BUILD_COMMON=ON",
        "-DGGML_RPC=ON",
        *extra,
        "-DLLAMA_BUILD_SERVER=ON",
        "-DLLAMA_BUILD_TOOLS=ON",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
    ]


def cache_dir() -> Path:
    options = " ".join(cmake_options())
    key = hashlib.sha256(options.encode()).hexdigest()[:12]
    override = os.environ.get("SKIPPY_PEER_CACHE")
    if override:
        base = Path(override)
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "skippyctl"
        base = base / "peers"
    return base / f"llama.cpp-{LLAMA_CPP_PYTHON_VERSION}-{key}"


def binary(name: str) -> Path:
    return cache_dir() / "build" / "bin" / name


def is_built() -> bool:
    stamp = cache_dir() / _STAMP
    return (
        stamp.is_file()
        and stamp.read_text() == " ".join(cmake_options())
        and all(binary(t).is_file() for t in TARGETS)
    )


def _log(message: str) -> None:
    sys.stderr.write(f"llama_server_build: {message}\n")
    sys.stderr.flush()


def _source(into: Path) -> Path:
    """Unpack the sdist's vendored llama.cpp into `into`; returns its root."""
    _log(f"downloading the llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} source distribution")
    return unpack_vendored_llama_cpp(into)


def build(jobs: int) -> Path:
    """Build (or reuse) the peers; returns the llama-server path. An interrupted or failed build
    resumes where it stopped (CMake's own incremental build over the unpacked source)."""
    root = cache_dir()
    if is_built():
        return binary("llama-server")
    source = root / "llama.cpp"
    if not (source / "CMakeLists.txt").is_file():
        if root.exists():
            shutil.rmtree(root)
        _source(source)
    build_dir = root / "build"
    options = cmake_options()
    _log(f"configuring {' '.join(options)}")
    # Compiler output goes to stderr with the rest of this log (errors must be readable).
    subprocess.run(
        ["cmake", "-S", str(source), "-B", str(build_dir), *options],
        check=True,
        stdout=sys.stderr,
    )
    _log(f"building {', '.join(TARGETS)} with {jobs} jobs (several minutes on 2 cores)")
    subprocess.run(
        ["cmake", "--build", str(build_dir), "--target", *TARGETS, "-j", str(jobs)],
        check=True,
        stdout=sys.stderr,
    )
    (root / _STAMP).write_text(" ".join(options))
    return binary("llama-server")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument(
        "--print-path", action="store_true", help="only print where llama-server is (or would be)"
    )
    args = parser.parse_args(argv)
    if args.print_path:
        sys.stdout.write(f"{binary('llama-server')}\n")
        return 0 if is_built() else 1
    sys.stdout.write(f"{build(args.jobs)}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

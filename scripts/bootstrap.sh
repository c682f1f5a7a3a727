#!/usr/bin/env bash
# Bootstraps a fresh clone: .venv, llama-cpp-python built from source with ggml RPC, the native
# event library and the dev tools. Idempotent: a second run only does what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_CPP_PYTHON_VERSION="0.3.36"
PYTHON="${PYTHON:-python3}"
VENV=".venv"

if [ ! -x "$VENV/bin/python" ]; then
  echo "bootstrap: creating $VENV" >&2
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip wheel setuptools
fi

# llama.cpp's AMX kernels, compiled in when -march=native finds AMX (Intel Sapphire Rapids and
# later), crash in ggml_backend_amx_mul_mat on Q8_0 weights and give wrong results on Q4_0/Q4_1
# (upstream: llama.cpp issue 20824, pull request 16315). __AMX_INT8__ gates them; an explicit
# -mno-amx-int8 wins over -march=native in any order. The other extra buffer types (CPU_REPACK)
# stay. The options are kept in the venv so benchmarks/llama_server_build.py builds the peer
# the same way.
LLAMA_CMAKE_ARGS="-DGGML_RPC=ON"
if [ "$(uname -m)" = x86_64 ]; then
  LLAMA_CMAKE_ARGS="$LLAMA_CMAKE_ARGS -DCMAKE_C_FLAGS=-mno-amx-int8 -DCMAKE_CXX_FLAGS=-mno-amx-int8"
fi
LLAMA_CMAKE_ARGS="$LLAMA_CMAKE_ARGS ${CMAKE_ARGS:-}"

llama_ok() {
  "$VENV/bin/python" - "$LLAMA_CPP_PYTHON_VERSION" <<'PY'
import pathlib, sys
try:
    import llama_cpp
except Exception:
    sys.exit(1)
if llama_cpp.__version__ != sys.argv[1]:
    sys.exit(1)
lib = pathlib.Path(llama_cpp.__file__).parent / "lib"
if not any(lib.glob("libggml-rpc*")):
    sys.exit(2)
# A build from before AMX was left out (see LLAMA_CMAKE_ARGS) is rebuilt.
cpu = b"".join(p.read_bytes() for p in lib.glob("libggml-cpu*.so*") if not p.is_symlink())
sys.exit(2 if b"ggml_backend_amx_buffer_type" in cpu else 0)
PY
}

status=0; llama_ok || status=$?
if [ "$status" != 0 ]; then
  echo "bootstrap: building llama-cpp-python $LLAMA_CPP_PYTHON_VERSION from source with ggml RPC (about 6 minutes on 2 cores)" >&2
  CMAKE_ARGS="$LLAMA_CMAKE_ARGS" "$VENV/bin/python" -m pip install --quiet \
    --no-binary llama-cpp-python "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
  status=0; llama_ok || status=$?
  if [ "$status" = 2 ]; then
    # pip reused a cached wheel built without RPC or with AMX: rebuild, bypassing the cache.
    echo "bootstrap: cached llama-cpp-python lacks ggml RPC or has AMX kernels; rebuilding without the wheel cache" >&2
    CMAKE_ARGS="$LLAMA_CMAKE_ARGS" "$VENV/bin/python" -m pip install --quiet \
      --no-cache-dir --force-reinstall --no-deps --no-binary llama-cpp-python \
      "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
    status=0; llama_ok || status=$?
  fi
  if [ "$status" != 0 ]; then
    echo "bootstrap: llama-cpp-python $LLAMA_CPP_PYTHON_VERSION does not import with ggml RPC" >&2
    exit 1
  fi
fi

echo "$LLAMA_CMAKE_ARGS" > "$VENV/llama-cmake-args"

echo "bootstrap: installing skippyctl (editable) with its native library and dev tools" >&2
"$VENV/bin/python" -m pip install --quiet -e ".[dev]"

# A second ggml CPU library, with batch-invariant matrix products, for engines that run without
# flash attention: their greedy texts then do not depend on the batch (skippyctl/engine/kernels.py).
"$VENV/bin/python" scripts/build_invariant_kernels.py >/dev/null

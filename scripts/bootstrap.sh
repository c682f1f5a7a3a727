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
sys.exit(0 if any(lib.glob("libggml-rpc*")) else 2)
PY
}

status=0; llama_ok || status=$?
if [ "$status" != 0 ]; then
  echo "bootstrap: building llama-cpp-python $LLAMA_CPP_PYTHON_VERSION from source with ggml RPC (about 6 minutes on 2 cores)" >&2
  CMAKE_ARGS="-DGGML_RPC=ON ${CMAKE_ARGS:-}" "$VENV/bin/python" -m pip install --quiet \
    --no-binary llama-cpp-python "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
  status=0; llama_ok || status=$?
  if [ "$status" = 2 ]; then
    # pip reused a cached wheel that was built without RPC: rebuild, bypassing the cache.
    echo "bootstrap: cached llama-cpp-python lacks ggml RPC; rebuilding without the wheel cache" >&2
    CMAKE_ARGS="-DGGML_RPC=ON ${CMAKE_ARGS:-}" "$VENV/bin/python" -m pip install --quiet \
      --no-cache-dir --force-reinstall --no-deps --no-binary llama-cpp-python \
      "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
    status=0; llama_ok || status=$?
  fi
  if [ "$status" != 0 ]; then
    echo "bootstrap: llama-cpp-python $LLAMA_CPP_PYTHON_VERSION does not import with ggml RPC" >&2
    exit 1
  fi
fi

echo "bootstrap: installing skippyctl (editable) with its native library and dev tools" >&2
"$VENV/bin/python" -m pip install --quiet -e ".[dev]"

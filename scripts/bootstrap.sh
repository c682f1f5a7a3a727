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
  cache_flag=()
  # A cached wheel built without RPC would be reused silently; refuse the cache in that case.
  [ "$status" = 2 ] && cache_flag=(--no-cache-dir)
  CMAKE_ARGS="-DGGML_RPC=ON ${CMAKE_ARGS:-}" "$VENV/bin/python" -m pip install --quiet \
    "${cache_flag[@]}" --no-binary llama-cpp-python --force-reinstall --no-deps \
    "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
  status=0; llama_ok || status=$?
  if [ "$status" != 0 ]; then
    echo "bootstrap: llama-cpp-python installed without ggml RPC; retrying without the wheel cache" >&2
    CMAKE_ARGS="-DGGML_RPC=ON ${CMAKE_ARGS:-}" "$VENV/bin/python" -m pip install --quiet \
      --no-cache-dir --no-binary llama-cpp-python --force-reinstall --no-deps \
      "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
    llama_ok
  fi
fi

echo "bootstrap: installing skippyctl (editable) with its native library and dev tools" >&2
"$VENV/bin/python" -m pip install --quiet -e ".[dev]"

"""Which ggml CPU kernels an engine computes with: the stock ones, or batch-invariant ones.

llama.cpp's stock CPU library takes a matrix product of two or more rows through llamafile's
sgemm and a product of one row through ggml's dot products, and the two round differently. So
without flash attention a row's attention depends on whether it is decoded alone or in a verify
window, and with F16, Q8_0 or Q4_0 weights so does every layer's product. The bootstrap builds a
second copy of the library without llamafile's sgemm (``scripts/build_invariant_kernels.py``):
every product is then per row, and a row's logits are bit for bit the same alone, beside other
lanes and in a window of any length — with flash attention off (its kernel has other paths for
long contexts and long batches). An engine whose load turns flash attention off maps that copy
before llama.cpp is imported (``EngineOptions.invariant_kernels``): the dynamic loader then links
llama.cpp's ggml to the library already mapped under the same name. Measured on which weight
types it holds: docs/BENCHMARKS.md section 5.
"""

from __future__ import annotations

import ctypes
import importlib.util
import sys
from pathlib import Path
from typing import Any, Final

INVARIANT_KERNELS_DIR: Final = Path(sys.prefix) / "lib" / "skippy-invariant-kernels"
"""Where the bootstrap puts the invariant library (inside the venv)."""
INVARIANT_KERNELS_LIBRARY: Final = "libggml-cpu.so.0"
"""The stock library's soname, which llama.cpp's ggml asks the dynamic loader for."""


def preload_invariant_kernels() -> str | None:
    """Map the invariant library; call before the first ``import llama_cpp``. Returns why it
    could not be (the engine then computes with the stock kernels and says so), else None."""
    if "llama_cpp" in sys.modules:
        return "llama.cpp was imported before the invariant kernels"
    library = INVARIANT_KERNELS_DIR / INVARIANT_KERNELS_LIBRARY
    if not library.is_file():
        return "the invariant kernels are not built (run scripts/bootstrap.sh)"
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return "llama-cpp-python is not installed"
    stock = Path(next(iter(spec.submodule_search_locations))) / "lib"
    try:
        # Its base library first, from llama-cpp-python's own directory: the one ggml that
        # llama.cpp links to as well (the invariant library's directory has none).
        ctypes.CDLL(str(stock / "libggml-base.so.0"), mode=ctypes.RTLD_GLOBAL)
        ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)
    except OSError as error:
        return f"the invariant kernels do not load: {error}"
    return None


def batch_invariant(llama: Any, flash_attention: bool | None) -> bool:
    """Whether this engine's contexts decode a row the same whatever is beside it: flash
    attention off and no llamafile sgemm in the ggml that llama.cpp linked to."""
    info = bytes(llama.llama_print_system_info())
    return flash_attention is False and b"LLAMAFILE = 1" not in info

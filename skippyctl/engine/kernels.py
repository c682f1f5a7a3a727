"""Which ggml CPU kernels an engine computes with: the stock ones, or batch-invariant ones.

llama.cpp's stock CPU library takes a matrix product of two or more rows through llamafile's
sgemm and a product of one row through ggml's dot products, and the two round differently. So
without flash attention a row's attention depends on whether it is decoded alone, beside other
lanes or in a verify window, and with F16, Q8_0 or Q4_0 weights so does every layer's product.
The bootstrap builds a second copy of the library (``scripts/build_invariant_kernels.py``) that
takes every product sgemm supports through sgemm, one row too (but where ggml's dot product
computes an element exactly as sgemm does), and products of Q4_1 weights through a kernel of
ours (``native/kernels/q4_1_q8_1_gemm.inc``); each computes an element the same way whatever
the tile, thread or row count, so a row's logits are bit for bit the same alone, beside other
lanes and in a window of any length — with flash attention off (its kernel
has other paths for long contexts and long batches), and for the weight types measured so (F32,
F16, Q4_0, Q4_1, Q5_0, Q8_0; not Q6_K or Q4_K, whose kernels take other paths for a batch). So a
context's claim is measured when it is made (:func:`probe`).

An engine whose load does not ask for flash attention (``auto``, off on a CPU, or ``off``)
maps that copy before llama.cpp is imported (``EngineOptions.invariant_kernels``): the dynamic
loader then links llama.cpp's ggml to the library already mapped under the same name.
Figures: docs/BENCHMARKS.md section 5.
"""

from __future__ import annotations

import ctypes
import importlib.util
import sys
import threading
from pathlib import Path
from typing import Any, Final

from skippyctl.config.load_options import MAX_DRAFT_TOKENS

INVARIANT_KERNELS_DIR: Final = Path(sys.prefix) / "lib" / "skippy-invariant-kernels"
"""Where the bootstrap puts the invariant library (inside the venv)."""
INVARIANT_KERNELS_LIBRARY: Final = "libggml-cpu.so.0"
"""The stock library's soname, which llama.cpp's ggml asks the dynamic loader for."""
INVARIANT_KERNELS_MARKER: Final = "skippy_batch_invariant_kernels"
"""A function only the invariant library exports."""


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


def batch_invariant(llama: Any, context: Any, n_vocab: int, flash_attention: bool | None) -> bool:
    """Whether this context decodes a row the same whatever is beside it: flash attention off,
    the invariant library mapped, and :func:`probe` agrees (some weight types take another path
    for a batch even then: Q6_K in a window, Q4_K's repacked layout beside other rows)."""
    if flash_attention is not False or not invariant_kernels_mapped():
        return False
    # On a thread of its own: llama.cpp's OpenMP team belongs to the thread that decodes, and
    # libgomp lets it go when that thread ends. A team left on the engine's control thread
    # stays beside the decode thread's, and libgomp, managing more threads than there are
    # cores, stops spinning at its barriers (decode measured 3.4x slower).
    found: list[bool] = []
    thread = threading.Thread(
        target=lambda: found.append(probe(llama, context, n_vocab)), name="skippy-probe"
    )
    thread.start()
    thread.join()
    return found == [True]


def invariant_kernels_mapped() -> bool:
    """Whether this process computes with the invariant library (mapped with global symbols by
    :func:`preload_invariant_kernels`)."""
    return hasattr(ctypes.CDLL(None), INVARIANT_KERNELS_MARKER)


PROBE_PROMPT: Final = 8
PROBE_STEPS: Final = 16
PROBE_WINDOW: Final = MAX_DRAFT_TOKENS + 1
"""A verify window's most rows: the lane's next token and up to ``spec_draft_tokens``
proposals."""
PROBE_BESIDE: Final = 4


def probe(llama: Any, context: Any, n_vocab: int) -> bool:
    """Decode a token pattern several ways and compare every row's logits bit for bit: 16 rows
    one at a time, as one window, 65 rows as windows of 16 and as one of 65, and (with two lanes
    or more) 4 rows beside a second lane's — fewer where a lane's context or a decode call
    holds fewer (a context too small to compare two rows is not claimed invariant). Leaves the
    context's memory empty. About 1 s on the real model here; only a load without flash
    attention pays it."""
    # llama.cpp aborts the process on a batch over n_batch; a lane holds n_ctx_seq positions.
    room = int(llama.llama_n_ctx_seq(context)) - PROBE_PROMPT
    width = min(PROBE_WINDOW, int(llama.llama_n_batch(context)), room)
    alone_rows = min(PROBE_STEPS, width)
    if alone_rows < 2:
        return False
    tokens = [(7 + 31 * i) % n_vocab for i in range(PROBE_PROMPT + width)]
    memory = llama.llama_get_memory(context)
    lanes = int(llama.llama_n_seq_max(context))
    batch = llama.llama_batch_init(width + 2, 0, 1)
    size = n_vocab * ctypes.sizeof(ctypes.c_float)
    steps = list(enumerate(tokens[PROBE_PROMPT:], start=PROBE_PROMPT))

    def decode(rows: list[tuple[int, int, int, bool]]) -> list[bytes]:
        """``rows``: (token, position, lane, wants logits); the logits asked for, in order."""
        for i, (token, position, lane, wanted) in enumerate(rows):
            batch.token[i] = token
            batch.pos[i] = position
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = lane
            batch.logits[i] = wanted
        batch.n_tokens = len(rows)
        if llama.llama_decode(context, batch) != 0:
            raise RuntimeError("llama_decode failed")
        return [
            ctypes.string_at(llama.llama_get_logits_ith(context, i), size)
            for i, row in enumerate(rows)
            if row[3]
        ]

    def fresh(*lanes_: int) -> None:
        llama.llama_memory_clear(memory, True)
        for lane in lanes_:
            decode([(t, i, lane, False) for i, t in enumerate(tokens[:PROBE_PROMPT])])

    def window(first: int, count: int) -> list[bytes]:
        return decode([(t, p, 0, True) for p, t in steps[first : first + count]])

    try:
        fresh(0)
        alone = [decode([(t, p, 0, True)])[0] for p, t in steps[:alone_rows]]
        fresh(0)
        if window(0, alone_rows) != alone:
            return False
        in_pieces = alone + [
            row
            for first in range(alone_rows, width, alone_rows)
            for row in window(first, alone_rows)
        ]
        fresh(0)
        if window(0, width) != in_pieces:
            return False
        if lanes >= 2:
            fresh(0, 1)
            paired = min(PROBE_BESIDE, alone_rows)
            beside = [decode([(t, p, 0, True), (t, p, 1, True)])[0] for p, t in steps[:paired]]
            return beside == alone[:paired]
        return True
    except RuntimeError:
        return False
    finally:
        llama.llama_memory_clear(memory, True)
        llama.llama_batch_free(batch)

"""The invariant library's Q4_1 kernel (native/kernels/q4_1_q8_1_gemm.inc) against ggml's own dot
product, element by element and bit for bit, on random blocks of every tile shape it has.

In a child process: the library is mapped as an engine maps it (``preload_invariant_kernels``),
without llama.cpp (which this test process has already linked to the stock library of the same
name)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from skippyctl.engine.kernels import INVARIANT_KERNELS_DIR, INVARIANT_KERNELS_LIBRARY

CHILD = textwrap.dedent(
    """
    import ctypes, sys
    import numpy as np
    from skippyctl.engine.kernels import preload_invariant_kernels

    problem = preload_invariant_kernels()  # as an engine maps it, without llama.cpp
    assert problem is None, problem
    lib = ctypes.CDLL(sys.argv[1])  # the library just mapped: its handle
    lib.ggml_cpu_init()  # fills ggml's fp16 table, which both sides read their scales through

    class Params(ctypes.Structure):  # ggml-cpu-impl.h, struct ggml_compute_params
        _fields_ = [("ith", ctypes.c_int), ("nth", ctypes.c_int), ("wsize", ctypes.c_size_t),
                    ("wdata", ctypes.c_void_p), ("threadpool", ctypes.c_void_p),
                    ("use_ref", ctypes.c_bool)]

    P = ctypes.c_void_p
    lib.skippy_q4_1_gemm.restype = ctypes.c_bool
    lib.skippy_q4_1_gemm.argtypes = [ctypes.POINTER(Params)] + [ctypes.c_int64] * 3 + [
        P, ctypes.c_int64, P, ctypes.c_int64, P, ctypes.c_int64]
    lib.ggml_vec_dot_q4_1_q8_1.argtypes = [ctypes.c_int, P, ctypes.c_size_t, P, ctypes.c_size_t,
                                           P, ctypes.c_size_t, ctypes.c_int]
    lib.quantize_row_q8_1.argtypes = [P, P, ctypes.c_int64]
    Q4_1, Q8_1 = 20, 36  # bytes per block of 32
    rng = np.random.default_rng(20261206)
    compared = 0
    for m, n, k in [(1, 1, 1), (4, 1, 18), (7, 2, 18), (8, 3, 5), (13, 4, 18), (9, 5, 48),
                    (4, 9, 3), (3, 1, 2)]:
        weights = np.empty((m, k, Q4_1), np.uint8)
        scales = rng.uniform(-0.05, 0.05, (m, k, 2)).astype(np.float16)
        weights[:, :, :4] = scales.view(np.uint8).reshape(m, k, 4)
        weights[:, :, 4:] = rng.integers(0, 256, (m, k, 16), dtype=np.uint8)
        rows = np.empty((n, k, Q8_1), np.uint8)
        for j in range(n):
            x = rng.standard_normal(32 * k).astype(np.float32)
            lib.quantize_row_q8_1(x.ctypes.data, rows[j].ctypes.data, 32 * k)
        out = np.full((n, m), np.nan, np.float32)
        params = Params(0, 1, 0, None, None, False)
        if not lib.skippy_q4_1_gemm(ctypes.byref(params), m, n, k, weights.ctypes.data, k,
                                    rows.ctypes.data, k, out.ctypes.data, m):
            print("no kernel")
            sys.exit(0)
        for j in range(n):
            for i in range(m):
                s = ctypes.c_float()
                lib.ggml_vec_dot_q4_1_q8_1(32 * k, ctypes.addressof(s), 0,
                                           weights[i].ctypes.data, 0, rows[j].ctypes.data, 0, 1)
                want = np.float32(s.value).view(np.uint32)
                got = out[j, i].view(np.uint32)
                assert got == want, (m, n, k, i, j, out[j, i], s.value)
                compared += 1
        assert np.count_nonzero(out) == out.size, (m, n, k)  # nothing compared as zero = zero
    print(f"equal {compared}")
    """
)


def _cpu_has_the_kernel() -> bool:
    """x86 with AVX2, FMA and F16C: the library is built for this machine (llama.cpp's
    default GGML_NATIVE), and the kernel compiles there, with VNNI's int8 products or AVX2's."""
    flags = Path("/proc/cpuinfo").read_text().split()
    return {"avx2", "fma", "f16c"} <= set(flags)


def test_every_element_is_ggml_s_own_dot_product_bit_for_bit() -> None:
    library = INVARIANT_KERNELS_DIR / INVARIANT_KERNELS_LIBRARY
    if not library.is_file():
        pytest.fail("the invariant kernels are not built: run scripts/bootstrap.sh")
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(library)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    if _cpu_has_the_kernel():
        # 8 shapes: every tile of 4 or 1 weight rows by 1 to 4 batch rows, and k of 1 to 48.
        assert done.stdout.split() == ["equal", "179"], done.stdout
    else:
        assert done.stdout.strip() == "no kernel"

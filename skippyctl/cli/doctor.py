"""`skippyctl doctor`: check the native layer, llama.cpp, devices and the runtime, and say how
to fix what is wrong. It never starts a runtime."""

from __future__ import annotations

import stat
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from skippyctl.cli.exit_codes import ExitCode
from skippyctl.cli.output import RECORD_SCHEMA_VERSION, emit_json
from skippyctl.cli.settings import runtime_settings
from skippyctl.config.runtime_settings import RuntimeSettings

Status = Literal["ok", "warning", "error"]
SYSTEM_INFO_CHARS: Final = 400
_STYLES: Final = {"ok": "green", "warning": "yellow", "error": "red"}


@dataclass(frozen=True, slots=True)
class Finding:
    check: str
    status: Status
    detail: str
    fix: str = ""

    def record(self) -> dict[str, Any]:
        return {
            "schema_version": RECORD_SCHEMA_VERSION,
            "record": "finding",
            "check": self.check,
            "status": self.status,
            "detail": self.detail,
            "fix": self.fix,
        }


def _native(settings: RuntimeSettings) -> tuple[list[Finding], Any]:
    from skippyctl.native.library import (
        NativeAbiIncompatible,
        NativeLibraryUnavailable,
        open_native_library,
    )

    try:
        library = open_native_library(settings.native_library, settings.native_disabled)
    except NativeLibraryUnavailable as error:
        return [
            Finding(
                "native_library",
                "warning",
                f"unavailable: {error.detail}; the runtime runs in legacy mode (fewer events)",
                "rebuild the package (pip install -e .) so _skippy_native is compiled",
            )
        ], None
    except NativeAbiIncompatible as error:
        return [
            Finding(
                "native_library",
                "error",
                f"incompatible: {error.detail}",
                "rebuild the native library from this checkout (pip install -e .)",
            )
        ], None
    capabilities = library.capabilities()
    features = [
        name
        for name in capabilities.__dataclass_fields__
        if name != "unknown_bits" and getattr(capabilities, name)
    ]
    detail = (
        f"{library.path.name}: abi v{library.abi_version}, ingress abi "
        f"v{library.ingress_abi_version}, features 0x{library.features:x} "
        f"({', '.join(features) or 'none'})"
    )
    if capabilities.unknown_bits:
        detail += f", unknown bits {list(capabilities.unknown_bits)}"
    findings = [Finding("native_library", "ok", detail)]
    for family, symbols in library.disabled_families.items():
        findings.append(
            Finding(
                "native_feature",
                "warning",
                f"{family.name.lower()} is off: the library lacks {', '.join(symbols)} "
                "(the other families serve)",
                "rebuild the native library from this checkout (pip install -e .)",
            )
        )
    return findings, library


def _llama_cpp() -> Finding:
    try:
        import llama_cpp
    except Exception as error:  # noqa: BLE001 - any import failure is the finding
        return Finding(
            "llama_cpp",
            "error",
            f"llama_cpp cannot be imported: {type(error).__name__}: {error}"[:300],
            "pip install llama-cpp-python (the version pinned in pyproject.toml)",
        )
    try:
        raw = llama_cpp.llama_print_system_info()
        info = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    except Exception as error:  # noqa: BLE001 - a broken build is reported, not raised
        info = f"system info unavailable ({type(error).__name__})"
    excerpt = " ".join(info.split())[:SYSTEM_INFO_CHARS]
    version = getattr(llama_cpp, "__version__", "?")
    return Finding("llama_cpp", "ok", f"llama-cpp-python {version}; {excerpt}")


def _devices(library: Any) -> list[Finding]:
    if library is None:
        return [
            Finding(
                "devices",
                "warning",
                "not checked: the native library is unavailable",
                "fix native_library first",
            )
        ]
    from skippyctl.native.devices import list_backends, list_devices, resolve_ggml, rpc_available

    try:
        status = resolve_ggml(library)
    except Exception as error:  # noqa: BLE001 - llama_cpp missing or its libraries unreadable
        return [
            Finding(
                "devices", "error", f"ggml cannot be resolved: {error}"[:300], "fix llama_cpp first"
            )
        ]
    if int(status) != 0:
        return [
            Finding(
                "devices",
                "error",
                f"ggml libraries not resolved ({status.name})",
                "reinstall llama-cpp-python; its lib/ directory must hold libggml*.so",
            )
        ]
    backends = list_backends(library)
    devices = list_devices(library)
    described = ", ".join(
        f"{d.name} ({d.description}, {d.memory_free // 2**20} MiB free of "
        f"{d.memory_total // 2**20} MiB)"
        for d in devices
    )
    findings = [
        Finding(
            "devices",
            "ok" if devices else "error",
            f"backends {', '.join(backends) or 'none'}; devices {described or 'none'}",
            "" if devices else "llama.cpp found no device; reinstall llama-cpp-python",
        )
    ]
    if rpc_available(library):
        findings.append(Finding("rpc", "ok", "ggml RPC backend available"))
    else:
        findings.append(
            Finding(
                "rpc",
                "warning",
                "ggml RPC backend not built: multi-stage topologies are unavailable",
                "build llama-cpp-python with CMAKE_ARGS=-DGGML_RPC=on",
            )
        )
    return findings


def _runtime(settings: RuntimeSettings) -> tuple[list[Finding], bool]:
    from skippyctl.client.discovery import DiscoveryProblem, discovery_path, read_discovery
    from skippyctl.client.http import RuntimeUnreachable
    from skippyctl.client.launch import runtime_client

    path = discovery_path(settings)
    try:
        discovery = read_discovery(settings)
    except DiscoveryProblem as problem:
        return [
            Finding(
                "discovery",
                "warning" if problem.reason == "stale" else "error",
                f"{problem.reason} discovery file: {problem}",
                "skippyctl runtime stop (removes it), then skippyctl runtime start",
            ),
            Finding("runtime", "warning", "no runtime is running", "skippyctl runtime start"),
        ], False
    if discovery is None:
        return [
            Finding("discovery", "ok", "no discovery file (no runtime running)"),
            Finding("runtime", "warning", "no runtime is running", "skippyctl runtime start"),
        ], False
    findings: list[Finding] = []
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        findings.append(
            Finding(
                "discovery",
                "error",
                f"discovery file is mode {mode:04o}: others can read the runtime's token",
                f"chmod 600 {path}",
            )
        )
    else:
        findings.append(Finding("discovery", "ok", f"mode {mode:04o}, pid {discovery.pid} alive"))
    try:
        client = runtime_client(discovery)
        try:
            code, health = client.health()
        finally:
            client.close()
    except RuntimeUnreachable as error:
        findings.append(
            Finding(
                "runtime",
                "error",
                f"pid {discovery.pid} is alive but {discovery.url} does not answer: {error}"[:300],
                "skippyctl runtime stop && skippyctl runtime start",
            )
        )
        return findings, False
    models = health.get("models") or {}
    findings.append(
        Finding(
            "runtime",
            "ok",
            f"{discovery.url} answers: {health.get('status')} (HTTP {code}), node "
            f"{health.get('node')}, version {health.get('version')}, {len(models)} model(s)",
        )
    )
    return findings, True


def run_checks(settings: RuntimeSettings) -> tuple[list[Finding], ExitCode]:
    """Every check, and the exit code `doctor` would end with."""
    native, library = _native(settings)
    findings = [*native, _llama_cpp(), *_devices(library)]
    runtime, reachable = _runtime(settings)
    findings.extend(runtime)
    if any(f.status == "error" for f in findings):
        code = ExitCode.FAILURE
    elif not reachable:
        code = ExitCode.RUNTIME_UNREACHABLE
    else:
        code = ExitCode.SUCCESS
    return findings, code


def doctor_records(findings: list[Finding], code: ExitCode) -> list[dict[str, Any]]:
    """What `doctor --json` prints: one record per finding, then the summary."""
    return [
        *(finding.record() for finding in findings),
        {
            "schema_version": RECORD_SCHEMA_VERSION,
            "record": "doctor_summary",
            "errors": sum(f.status == "error" for f in findings),
            "warnings": sum(f.status == "warning" for f in findings),
            "exit_code": int(code),
        },
    ]


def doctor_command(
    json_output: Annotated[
        bool, typer.Option("--json", help="One finding per line: {check,status,detail,fix}.")
    ] = False,
) -> None:
    """Check the installation and the runtime, with a fix for each problem.

    Checks the native library (ABI version, feature bits), llama.cpp's build, backends and
    devices, RPC, the discovery file and whether the runtime answers. Never starts a runtime.

    Exit 0 when nothing is an error (warnings allowed) and the runtime answers; 1 when any
    check is an error; 3 when no check is an error but no runtime is reachable. With --json
    the last line is a `{"record": "doctor_summary"}` with the counts and the exit code.

    Example:

        skippyctl doctor --json | jq -r 'select(.status != "ok") | "\\(.check): \\(.fix)"'
    """
    findings, code = run_checks(runtime_settings("doctor", json_output))
    errors = sum(f.status == "error" for f in findings)
    warnings = sum(f.status == "warning" for f in findings)
    if json_output:
        for record in doctor_records(findings, code):
            emit_json(record)
    else:
        table = Table("check", "status", "detail", "fix", box=None, header_style="bold")
        for finding in findings:
            style = _STYLES[finding.status]
            table.add_row(
                finding.check,
                f"[{style}]{finding.status}[/]",
                escape(finding.detail),
                escape(finding.fix),
            )
        Console(highlight=False).print(table)
        Console(stderr=True).print(f"{errors} error(s), {warnings} warning(s)")
    raise typer.Exit(int(code))

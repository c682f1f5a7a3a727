"""Launch or attach: how a command finds the runtime, or starts one in the background.

`connect()` reads the discovery file: a live runtime → attach; none (or a stale one) → start a
background `skippyctl runtime serve` and attach. `ServeOptions` is what a runtime is started
with (its command line, the environment's fallbacks resolved): the composition root
(`skippyctl.daemon.serve`) runs with them in the foreground, and `start_background` turns them
into that command line (credentials through the environment, never argv: a TLS key goes by its
file's path). Where the runtime directory is and which port a runtime launched on demand takes
come from the caller's `RuntimeSettings` (read once at its start); the background runtime
inherits this process's environment and reads its own. Errors surface as `RuntimeUnreachable`,
never as a raw traceback — also for an unusable runtime directory or a stale file that cannot
be replaced. Messages carry no absolute path (they may become JSON error records), except the
runtime log's, which the operator needs to read.

A runtime served over TLS advertises an https url and its certificate's path (`tls_cert`);
`runtime_client` verifies it against exactly that certificate, hostname checked.

This module starts a process; it imports nothing of the runtime itself.
"""

from __future__ import annotations

import ssl
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final

from skippyctl.client.discovery import (
    UNUSABLE_DIRECTORY,
    Discovery,
    DiscoveryProblem,
    discovery_path,
    ensure_runtime_dir,
    note_crashed_host,
    read_discovery,
    remove_if_stale,
    runtime_dir,
)
from skippyctl.client.http import RuntimeClient, RuntimeUnreachable
from skippyctl.config.runtime_settings import (
    DEFAULT_PORT,
    RuntimeSettings,
    inherited_environment,
    python_module_command,
)

LOOPBACK_HOSTS: Final = frozenset({"127.0.0.1", "localhost", "::1"})
START_TIMEOUT_S: Final = 60.0
STOP_TIMEOUT_S: Final = 15.0


class ServeError(Exception):
    """The server could not start; the message says why, `reason` is a stable token."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ServeOptions:
    """What `runtime serve` is asked for on its command line: each flag, or the setting it falls
    back to (`--port`: SKIPPY_PORT, `--api-key`: SKIPPY_API_KEY, `--debug-token-events`:
    SKIPPY_DEBUG_TOKEN_EVENTS) resolved by the CLI. The rest of the runtime's configuration is
    its `RuntimeSettings`."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    api_key: str | None = None
    model_root: Path | None = None
    max_queue: int = 64
    session_ttl_s: float = 600.0
    allow_remote: bool = False
    replay_records: int = 4096
    debug_token_events: bool = False
    """Opt-in debug evidence: one `generation_token_observed` per sampled token (no token ids or
    text), through the droppable debug lane (drops counted)."""
    plugins: tuple[str, ...] = ()
    """Serving plugins every model gets (``--plugin``: a C plugin's path or an entry-point
    name)."""
    models_dir: Path | None = None
    """A directory whose GGUFs requests may name to have them loaded on demand."""
    presets: Path | None = None
    """A TOML presets file: model ids and their loads, loaded on demand
    (config/model_presets.py)."""
    ttl_s: float = -1.0
    """Idle seconds before a model without its own ttl unloads; -1: never."""
    max_models: int | None = None
    """At most this many models loaded at once; None: no limit."""
    memory_budget: str = "auto"
    """What the loaded models may take in memory together: a size (``8G``), ``auto`` (a share
    of the memory available when the runtime starts) or ``off``."""
    tls_cert: Path | None = None
    """The API's certificate (PEM, chain after it); with `tls_key`, the API is served over
    TLS and advertised as https. Absolute: the discovery file names it for local clients."""
    tls_key: Path | None = None
    """The private key of `tls_cert` (PEM, unencrypted; its path only ever goes on a command
    line, never the key)."""


def check_tls(cert: Path | None, key: Path | None) -> None:
    """Refuse a TLS configuration the server could not use (ServeError): one of the two files
    without the other (`tls_incomplete`), files that cannot be read or do not load as a
    certificate and its private key (`tls_config_invalid`: an encrypted key is refused too, a
    background runtime could not be asked for its pass phrase). Neither given: plain http.
    Messages name the files without their directories."""
    if cert is None and key is None:
        return
    if cert is None or key is None:
        given, missing = ("--tls-cert", "--tls-key") if key is None else ("--tls-key", "--tls-cert")
        raise ServeError("tls_incomplete", f"{given} needs {missing} as well (TLS takes both)")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        # A pass phrase callback that gives none: OpenSSL would otherwise prompt on the terminal.
        context.load_cert_chain(cert, key, password=lambda: b"")
    except ssl.SSLError as error:
        raise ServeError(
            "tls_config_invalid",
            f"--tls-cert {cert.name} and --tls-key {key.name} do not load as a certificate and "
            f"its unencrypted private key ({error.reason or error.library or 'not PEM'})",
        ) from error
    except OSError as error:
        raise ServeError(
            "tls_config_invalid",
            f"--tls-cert {cert.name} or --tls-key {key.name} cannot be read "
            f"({error.strerror or type(error).__name__})",
        ) from error


def trust_only(certificate: Path | str) -> ssl.SSLContext:
    """A client context that trusts exactly the certificates in ``certificate`` (a PEM file;
    OSError or ssl.SSLError when it cannot be used), with hostnames checked. A server's own
    certificate is accepted as the anchor (partial chain): it need not be a CA's."""
    context = ssl.create_default_context(cafile=str(certificate))
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    return context


def runtime_client(discovery: Discovery, timeout_s: float = 30.0) -> RuntimeClient:
    """A client of the runtime ``discovery`` names; one served over TLS is verified against
    the certificate its file names. RuntimeUnreachable when that certificate cannot be read."""
    if discovery.tls_cert is None:
        return RuntimeClient(discovery, timeout_s=timeout_s)
    try:
        context = trust_only(discovery.tls_cert)
    except OSError as error:  # ssl.SSLError is one: a file that holds no certificate
        raise RuntimeUnreachable(
            f"the certificate of the runtime at {discovery.url} cannot be used "
            f"({Path(discovery.tls_cert).name}: {error.strerror or type(error).__name__})"
        ) from error
    return RuntimeClient(discovery, timeout_s=timeout_s, ssl_context=context)


def certificate_refused(client: RuntimeClient) -> str | None:
    """Why a runtime served over TLS is not reached: its certificate's verification failure
    (OpenSSL's message, e.g. that it is not valid for the url's address), else None (not TLS,
    or it answers, or it fails for another reason). A refused certificate is not transient:
    waiting for that runtime, or starting another, cannot help."""
    if client.discovery.tls_cert is None:
        return None
    try:
        client.health()
    except RuntimeUnreachable as error:
        cause: BaseException | None = error.__cause__
        while cause is not None:
            if isinstance(cause, ssl.SSLCertVerificationError):
                return cause.verify_message or str(cause)
            cause = cause.__cause__ or cause.__context__
    except ValueError:  # it answered, with something other than JSON: not refused
        pass
    return None


def _refused_message(discovery: Discovery, refused: str) -> str:
    return (
        f"the runtime at {discovery.url} presents a certificate that does not verify "
        f"({refused}); its certificate must name the address it listens on (--host)"
    )


def _remove_stale(problem: DiscoveryProblem, settings: RuntimeSettings) -> None:
    """Delete a stale/corrupt/untrusted discovery file so a new runtime can take its place."""
    if problem.reason == UNUSABLE_DIRECTORY:
        raise RuntimeUnreachable(str(problem))
    note_crashed_host(settings)  # the next host reports the crash the file was evidence of
    try:
        discovery_path(settings).unlink(missing_ok=True)
    except OSError as error:
        raise RuntimeUnreachable(
            f"{problem} ({problem.reason}), and it cannot be replaced: the runtime directory "
            f"is not writable ({error.strerror})"
        ) from error


def connect(
    settings: RuntimeSettings, autostart: bool = True, options: ServeOptions | None = None
) -> RuntimeClient:
    """A client of the running runtime; with ``autostart``, one is started in the background
    when none runs (``options``, else the defaults on ``settings.port``)."""
    try:
        discovery = read_discovery(settings)
    except DiscoveryProblem as problem:
        _remove_stale(problem, settings)
        discovery = None
    if discovery is not None:
        client = runtime_client(discovery)
        if client.reachable():
            return client
        refused = certificate_refused(client)
        client.close()
        if refused is not None:
            raise RuntimeUnreachable(_refused_message(discovery, refused))
        if not autostart:
            raise RuntimeUnreachable(f"the runtime at {discovery.url} does not answer")
    if not autostart:
        raise RuntimeUnreachable("no runtime is running (start one with `skippyctl runtime start`)")
    if options is None:
        options = ServeOptions(port=settings.port)
    return runtime_client(launch(options, settings, fall_back_to_any_port=True))


def launch(
    options: ServeOptions, settings: RuntimeSettings, fall_back_to_any_port: bool = False
) -> Discovery:
    """Start a background runtime and return its discovery; RuntimeUnreachable (never an
    OSError) when it cannot be started, e.g. the runtime directory is not writable."""
    try:
        ensure_runtime_dir(settings)
    except DiscoveryProblem as problem:
        raise RuntimeUnreachable(f"cannot start a runtime: {problem}") from problem
    try:
        try:
            return start_background(options, settings)
        except ServeError as error:
            if error.reason != "address_in_use" or not fall_back_to_any_port:
                raise RuntimeUnreachable(str(error)) from error
        try:
            return start_background(replace(options, port=0), settings)
        except ServeError as again:
            raise RuntimeUnreachable(str(again)) from again
    except OSError as error:
        raise RuntimeUnreachable(
            f"cannot start a runtime: {error.strerror or error} in the runtime directory"
        ) from error


def log_path(settings: RuntimeSettings) -> Path:
    return runtime_dir(settings) / "runtime.log"


def start_background(options: ServeOptions, settings: RuntimeSettings) -> Discovery:
    """Start `runtime serve` detached and wait until it answers; returns its discovery."""
    remove_if_stale(settings)
    directory = runtime_dir(settings)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    args = [
        *python_module_command("skippyctl"),
        "runtime",
        "serve",
        "--host",
        options.host,
        "--port",
        str(options.port),
        "--max-queue",
        str(options.max_queue),
    ]
    if options.model_root is not None:
        args += ["--model-root", str(options.model_root)]
    if options.allow_remote:
        args.append("--allow-remote")
    if options.debug_token_events:
        args.append("--debug-token-events")
    for plugin in options.plugins:
        args += ["--plugin", plugin]
    if options.models_dir is not None:
        args += ["--models-dir", str(options.models_dir)]
    if options.presets is not None:
        args += ["--presets", str(options.presets)]
    if options.ttl_s != -1.0:
        args += ["--ttl", repr(options.ttl_s)]
    if options.max_models is not None:
        args += ["--max-models", str(options.max_models)]
    if options.memory_budget != "auto":
        args += ["--memory-budget", options.memory_budget]
    if options.tls_cert is not None:
        args += ["--tls-cert", str(options.tls_cert)]
    if options.tls_key is not None:
        args += ["--tls-key", str(options.tls_key)]  # the key file's path, never the key
    env = inherited_environment()
    if options.api_key:
        env["SKIPPY_API_KEY"] = options.api_key
    log = log_path(settings)
    with open(log, "ab") as log_file:
        process = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=log_file,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServeError(
                "start_failed",
                f"the runtime exited at start (status {process.returncode}); see {log}",
            )
        try:
            discovery = read_discovery(settings)
        except DiscoveryProblem:
            discovery = None
        if discovery is not None and discovery.pid == process.pid:
            probe = runtime_client(discovery)
            try:
                if probe.reachable():
                    return discovery
                refused = certificate_refused(probe)
            finally:
                probe.close()
            if refused is not None:
                # It serves, but no local command could trust it: not a runtime to keep. SIGTERM
                # is its orderly stop (it removes its discovery file); SIGKILL if that hangs.
                process.terminate()
                try:
                    process.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
                raise ServeError("tls_verify_failed", _refused_message(discovery, refused))
        time.sleep(0.05)
    process.kill()
    raise ServeError("start_timeout", f"the runtime did not answer within {START_TIMEOUT_S:.0f} s")

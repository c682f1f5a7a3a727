"""The stage worker process: ``python -m skippyctl.stages.stage_worker --host A --port P
--threads N``.

It serves ggml's CPU device over llama.cpp's RPC protocol (``ggml_backend_rpc_start_server``),
which blocks for as long as it serves. Started and supervised by
``skippyctl.stages.stage_supervisor``; not meant to be run by hand.

Contract with the supervisor:

- Configuration is the command line; nothing comes through the environment.
- Status goes as JSON lines to the inherited file descriptor ``--status-fd`` (never stdout: ggml
  prints its banner there, and the supervisor sends this process's stdout to /dev/null):
  ``{"status": "serving", "device": "CPU", "memory_free_bytes": …, "memory_total_bytes": …}``
  right before the server starts; ``{"status": "refused", "reason": <reason code>, "detail": …}``
  when it will not start; ``{"status": "server_returned", "address_in_use": bool}`` when ggml's
  server returned (it could not bind, or stopped accepting) — the process then exits 4.
- The worker dies with its supervisor: ``PR_SET_PDEATHSIG`` (Linux) sends it SIGTERM when the
  supervisor goes, and it exits at once if the supervisor is already gone. SIGTERM and SIGINT
  keep their default action (terminate): while ggml's server blocks, no Python handler could
  run anyway.
- ``--mem-bytes`` is checked against what the device reports free (more is refused); ggml's API
  cannot cap what the device then allocates (see the supervisor's docstring).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import errno
import json
import os
import signal
import socket
import sys
from typing import Any, Final

EXIT_REFUSED: Final = 3
EXIT_SERVER_RETURNED: Final = 4
_PR_SET_PDEATHSIG: Final = 1


def _die_with_parent(parent_pid: int) -> None:
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    if parent_pid and os.getppid() != parent_pid:  # it died before prctl took effect
        os._exit(0)


def _report(fd: int, **fields: Any) -> None:
    if fd < 0:
        return
    # OSError: the supervisor is gone; PR_SET_PDEATHSIG ends this process.
    with contextlib.suppress(OSError):
        os.write(fd, json.dumps(fields, separators=(",", ":")).encode() + b"\n")


def _address_in_use(address: str, port: int) -> bool:
    """After ggml's server returned: is the port taken by a listener (what its bind hit)?"""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
            sock.listen(1)
        except OSError as error:
            return error.errno == errno.EADDRINUSE
    return False


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m skippyctl.stages.stage_worker")
    parser.add_argument("--host", required=True, help="IPv4 address to bind")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--mem-bytes", type=int, default=None)
    parser.add_argument("--status-fd", type=int, default=-1)
    parser.add_argument("--parent-pid", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    _die_with_parent(args.parent_pid)
    from skippyctl.native.rpc import GgmlRpc, RpcUnavailable

    try:
        rpc = GgmlRpc()
    except RpcUnavailable as error:
        _report(
            args.status_fd, status="refused", reason="unsupported_capability", detail=str(error)
        )
        return EXIT_REFUSED
    device = rpc.cpu_device()
    if device is None:
        _report(args.status_fd, status="refused", reason="device_unavailable", detail="no CPU")
        return EXIT_REFUSED
    memory = rpc.device_memory(device)
    name = rpc.device_name(device)
    if args.mem_bytes is not None and args.mem_bytes > memory.free_bytes:
        _report(
            args.status_fd,
            status="refused",
            reason="invalid_configuration",
            detail=f"--mem {args.mem_bytes // 2**20} MiB is more than the "
            f"{memory.free_bytes // 2**20} MiB {name} reports free",
        )
        return EXIT_REFUSED
    _report(
        args.status_fd,
        status="serving",
        device=name,
        memory_free_bytes=memory.free_bytes,
        memory_total_bytes=memory.total_bytes,
    )
    rpc.start_server(f"{args.host}:{args.port}", [device], args.threads)
    _report(
        args.status_fd,
        status="server_returned",
        address_in_use=_address_in_use(args.host, args.port),
    )
    return EXIT_SERVER_RETURNED


if __name__ == "__main__":
    sys.exit(main())

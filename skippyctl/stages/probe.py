"""Probe a stage from the runtime host: ggml's RPC HELLO and GET_DEVICE_MEMORY in plain Python.

ggml's own client (``ggml_backend_rpc_get_device_memory`` …) aborts the calling process when an
endpoint is unreachable, so the host never calls it; it speaks the two commands it needs itself.
The wire format (``ggml/src/ggml-rpc/ggml-rpc.cpp`` of the llama.cpp that llama-cpp-python 0.3.36
vendors, RPC protocol 7.0.0), all integers little-endian:

- request: ``| cmd: u8 | size: u64 | payload: size bytes |``; response: ``| size: u64 | payload |``
  (a response whose size is not the expected one is malformed).
- HELLO must be the first command of a connection (the server closes any other first command):
  cmd 14, payload ``conn_caps[24]`` (all zero: plain TCP, no RDMA upgrade); response 28 bytes
  ``major: u8, minor: u8, patch: u8, padding: u8, conn_caps[24]``. A client accepts a server
  whose major equals its own and whose minor is not newer (what ggml's ``negotiate_hello``
  checks).
- GET_DEVICE_MEMORY: cmd 11, payload ``device: u32`` (a device index; an index the server does
  not have makes it close the connection); response 16 bytes ``free: u64, total: u64``.

A stage serves one client connection at a time (its listen backlog is 1): a connection made
while another client holds it is accepted by the kernel but not answered until that client
leaves, so such a stage times out here (``StageUnreachable``, ``busy`` wording). ``probe``
always closes its connection before returning, so the engine can connect next.

Nothing here logs or returns the endpoint in an event: the caller names stages by opaque id.
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass
from typing import Final

RPC_CMD_GET_DEVICE_MEMORY: Final = 11
RPC_CMD_HELLO: Final = 14
RPC_CONN_CAPS_SIZE: Final = 24
RPC_PROTO_VERSION: Final = (7, 0, 0)
"""What this host speaks; the same as ``skippyctl.native.rpc.RPC_PROTO_VERSION`` (the engine's
ggml), restated here because this module must not import the native binding."""
PROBE_TIMEOUT_S: Final = 3.0

_HEADER: Final = struct.Struct("<BQ")
_SIZE: Final = struct.Struct("<Q")
_HELLO_RESPONSE: Final = struct.Struct(f"<BBBB{RPC_CONN_CAPS_SIZE}s")
_MEMORY_REQUEST: Final = struct.Struct("<I")
_MEMORY_RESPONSE: Final = struct.Struct("<QQ")


class StageUnreachable(OSError):
    """No usable answer within the timeout: refused, unroutable, closed, silent or malformed."""


class StageIncompatible(ValueError):
    """The stage answered HELLO with a protocol version this host's ggml refuses."""

    def __init__(self, version: tuple[int, int, int]) -> None:
        super().__init__(
            f"the stage speaks ggml RPC {'.'.join(map(str, version))}; this runtime speaks "
            f"{'.'.join(map(str, RPC_PROTO_VERSION))}"
        )
        self.version = version


@dataclass(frozen=True, slots=True)
class StageProbe:
    version: tuple[int, int, int]
    free_bytes: int
    total_bytes: int


def compatible(version: tuple[int, int, int]) -> bool:
    major, minor, _ = version
    return major == RPC_PROTO_VERSION[0] and minor <= RPC_PROTO_VERSION[1]


def _receive(sock: socket.socket, size: int, deadline: float) -> bytes:
    data = bytearray()
    while len(data) < size:
        left = deadline - time.monotonic()
        if left <= 0:
            raise StageUnreachable("the stage did not answer in time (down, or busy serving)")
        sock.settimeout(left)
        try:
            chunk = sock.recv(size - len(data))
        except TimeoutError as error:
            raise StageUnreachable(
                "the stage did not answer in time (down, or busy serving)"
            ) from error
        if not chunk:
            raise StageUnreachable("the stage closed the connection")
        data += chunk
    return bytes(data)


def _command(
    sock: socket.socket, cmd: int, payload: bytes, response_size: int, deadline: float
) -> bytes:
    sock.sendall(_HEADER.pack(cmd, len(payload)) + payload)
    (size,) = _SIZE.unpack(_receive(sock, _SIZE.size, deadline))
    if size != response_size:
        raise StageUnreachable(f"malformed answer to RPC command {cmd}")
    return _receive(sock, response_size, deadline)


def probe(host: str, port: int, timeout_s: float = PROBE_TIMEOUT_S, device: int = 0) -> StageProbe:
    """HELLO, then (when compatible) GET_DEVICE_MEMORY of ``device``, within ``timeout_s``
    altogether. Raises :class:`StageUnreachable` or :class:`StageIncompatible`; the connection
    is closed either way."""
    deadline = time.monotonic() + timeout_s
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            answer = _command(
                sock,
                RPC_CMD_HELLO,
                bytes(RPC_CONN_CAPS_SIZE),
                _HELLO_RESPONSE.size,
                deadline,
            )
            major, minor, patch, _pad, _caps = _HELLO_RESPONSE.unpack(answer)
            version = (major, minor, patch)
            if not compatible(version):
                raise StageIncompatible(version)
            memory = _command(
                sock,
                RPC_CMD_GET_DEVICE_MEMORY,
                _MEMORY_REQUEST.pack(device),
                _MEMORY_RESPONSE.size,
                deadline,
            )
            free, total = _MEMORY_RESPONSE.unpack(memory)
            return StageProbe(version, int(free), int(total))
    except StageUnreachable:
        raise
    except OSError as error:  # refused, unroutable, reset, connect timeout
        raise StageUnreachable(
            f"cannot reach the stage ({error.strerror or type(error).__name__})"
        ) from error

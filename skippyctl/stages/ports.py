"""Addresses and ports of a stage: validation, race-free reservation, readiness probes.

ggml's RPC server binds its port itself, so a free port cannot be handed to it as a socket.
``PortReservation`` closes the gap between "pick a free port" and "ggml binds it": it binds the
port (port 0: the kernel picks one) with ``SO_REUSEADDR`` and does **not** listen. On Linux a
second ``SO_REUSEADDR`` socket may bind a port no socket listens on, so ggml's own bind (which
sets ``SO_REUSEADDR``) succeeds, while any other process binding without it gets
``EADDRINUSE`` until the reservation is released (once the stage is ready). A port someone
already listens on cannot be reserved at all (``EADDRINUSE``): that is reported before any
process starts. The one case left — a stranger that binds with ``SO_REUSEADDR`` *and* listens
first — makes ggml's bind fail, which the worker reports; and ``listener_owned_by`` makes sure
a probe that connects is talking to the stage's process, not to that stranger.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import ipaddress
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from skippyctl.events.envelope import LogicalId

MAX_PORT: Final = 65535
_TCP_ESTABLISHED: Final = "01"
_TCP_LISTEN: Final = "0A"
_PROC_NET_TCP: Final = Path("/proc/net/tcp")


class AddressError(ValueError):
    """A host that is not an IPv4 address this machine can name (ggml's server is IPv4 only)."""


def resolve_ipv4(host: str) -> str:
    """The dotted IPv4 address for ``host`` (an IPv4 literal, or a name such as localhost)."""
    try:
        return str(ipaddress.IPv4Address(host))
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as error:
        raise AddressError(f"{host!r} is not an IPv4 address or a name of one") from error
    if not infos:
        raise AddressError(f"{host!r} has no IPv4 address")
    return str(infos[0][4][0])


def is_loopback(address: str) -> bool:
    return ipaddress.IPv4Address(address).is_loopback


def probe_address(address: str) -> str:
    """Where to connect to reach a server bound to ``address`` (a wildcard bind: loopback)."""
    return "127.0.0.1" if address == "0.0.0.0" else address


def stage_id_for(address: str, port: int) -> LogicalId:
    """The stage's opaque id: a hash of its endpoint (stable for the same address and port)."""
    digest = hashlib.sha256(f"{address}:{port}".encode()).hexdigest()[:16]
    return LogicalId(f"stage-{digest}")


class PortUnavailable(OSError):
    """The port cannot be reserved: in use (``in_use``) or not an address of this machine."""

    def __init__(self, address: str, port: int, error: OSError) -> None:
        super().__init__(error.errno, error.strerror)
        self.in_use = error.errno == errno.EADDRINUSE
        self.address = address
        self.port = port


@dataclass
class PortReservation:
    """A bound, non-listening ``SO_REUSEADDR`` socket holding ``port`` until ``release()``."""

    address: str
    port: int
    _sock: socket.socket | None

    @classmethod
    def take(cls, address: str, port: int) -> PortReservation:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
        except OSError as error:
            sock.close()
            raise PortUnavailable(address, port, error) from error
        return cls(address, int(sock.getsockname()[1]), sock)

    def release(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def accepts_connections(address: str, port: int, timeout_s: float) -> bool:
    """Whether a TCP connection to ``address:port`` is accepted (closed again at once; ggml's
    server then goes back to ``accept``)."""
    try:
        with socket.create_connection((probe_address(address), port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _listening_inodes(port: int) -> set[int] | None:
    return _inodes_in_state(port, _TCP_LISTEN)


def _inodes_in_state(port: int, tcp_state: str) -> set[int] | None:
    """Inodes of the IPv4 TCP sockets whose local port is ``port`` in ``tcp_state``."""
    try:
        lines = _PROC_NET_TCP.read_text().splitlines()[1:]
    except OSError:
        return None
    inodes: set[int] = set()
    for line in lines:
        fields = line.split()
        if len(fields) < 10 or fields[3] != tcp_state:
            continue
        _, _, local_port = fields[1].partition(":")
        with contextlib.suppress(ValueError):
            if int(local_port, 16) == port:
                inodes.add(int(fields[9]))
    return inodes


def _socket_inodes(pid: int) -> set[int] | None:
    directory = Path(f"/proc/{pid}/fd")
    try:
        names = os.listdir(directory)
    except OSError:
        return None
    inodes: set[int] = set()
    for name in names:
        try:
            target = os.readlink(directory / name)
        except OSError:
            continue  # closed since the listing
        if target.startswith("socket:[") and target.endswith("]"):
            with contextlib.suppress(ValueError):
                inodes.add(int(target[len("socket:[") : -1]))
    return inodes


def listener_owned_by(pid: int, port: int) -> bool | None:
    """Whether process ``pid`` holds a socket listening on TCP ``port`` (IPv4). None when this
    cannot be told (no /proc: not Linux, or /proc hidden)."""
    listening = _listening_inodes(port)
    owned = _socket_inodes(pid)
    if listening is None or owned is None:
        return None
    return bool(listening & owned)


def clients_connected(pid: int, port: int) -> int | None:
    """How many TCP connections process ``pid`` has accepted on ``port`` and holds open (its
    established sockets with that local port); None when this cannot be told (no /proc)."""
    established = _inodes_in_state(port, _TCP_ESTABLISHED)
    owned = _socket_inodes(pid)
    if established is None or owned is None:
        return None
    return len(established & owned)

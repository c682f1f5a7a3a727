"""Stage endpoints: ``HOST:PORT`` with a dotted IPv4 host (ggml's RPC client is IPv4 only) and a
port 1–65535; at most ``MAX_STAGES`` (``GGML_RPC_MAX_SERVERS``) per topology, no duplicates.

Pure parsing, shared by a load's options (``load_options``), the topology that probes the
stages (``runtime/topology.py``) and the layer plan (``stages/plan.py``)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Final

MAX_STAGES: Final = 16
"""``GGML_RPC_MAX_SERVERS`` in ggml-rpc.h."""
MAX_PORT: Final = 65535
_OCTET: Final = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_PORT: Final = (
    r"([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
)
ENDPOINT_PATTERN: Final = rf"^{_OCTET}(\.{_OCTET}){{3}}:{_PORT}$"
"""What :func:`parse_endpoint` accepts, as a JSON Schema pattern (the API documents it)."""


class EndpointError(ValueError):
    """An endpoint (or the list of them) is not acceptable; the message says why."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def parse_endpoint(text: str) -> Endpoint:
    host, sep, port_text = text.strip().rpartition(":")
    if not sep or not host:
        raise EndpointError(f"{text!r} is not HOST:PORT")
    try:
        address = ipaddress.IPv4Address(host)
    except ValueError as error:
        raise EndpointError(f"{host!r} is not an IPv4 address") from error
    # Decimal digits without a leading zero, as ENDPOINT_PATTERN documents.
    if not port_text.isascii() or not port_text.isdigit() or port_text.startswith("0"):
        raise EndpointError(f"port {port_text!r} is not 1-{MAX_PORT}")
    if not 1 <= int(port_text) <= MAX_PORT:
        raise EndpointError(f"port {port_text!r} is not 1-{MAX_PORT}")
    return Endpoint(str(address), int(port_text))


def parse_endpoints(texts: list[str] | tuple[str, ...]) -> tuple[Endpoint, ...]:
    """Every endpoint parsed; at most ``MAX_STAGES``, no duplicates (``EndpointError``)."""
    if len(texts) > MAX_STAGES:
        raise EndpointError(f"at most {MAX_STAGES} stages (GGML_RPC_MAX_SERVERS)")
    endpoints = tuple(parse_endpoint(t) for t in texts)
    if len(set(endpoints)) != len(endpoints):
        raise EndpointError("the same stage is listed twice")
    return endpoints

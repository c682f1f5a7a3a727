"""Helpers shared by the telemetry tests: a real OTLP/HTTP receiver on loopback, a closed port."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from tests.telemetry.otlp_receiver import Receiver


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    running = Receiver()
    try:
        yield running
    finally:
        running.close()


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])

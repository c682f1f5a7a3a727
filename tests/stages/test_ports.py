"""Port reservation, probes and option validation (no stage process)."""

from __future__ import annotations

import errno
import os
import socket

import pytest

from skippyctl.events.envelope import LogicalId
from skippyctl.events.reasons import ReasonCode
from skippyctl.stages import ports
from skippyctl.stages.stage_supervisor import StageOptions, StageRefused, validate


def _reuse_socket() -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    return sock


def test_a_reservation_keeps_strangers_out_but_lets_a_reuseaddr_server_listen() -> None:
    reservation = ports.PortReservation.take("127.0.0.1", 0)
    try:
        assert reservation.port > 0
        with socket.socket() as stranger, pytest.raises(OSError, match="in use") as refused:
            stranger.bind(("127.0.0.1", reservation.port))
        assert refused.value.errno == errno.EADDRINUSE
        with _reuse_socket() as server:  # what ggml's create_server does
            server.bind(("127.0.0.1", reservation.port))
            server.listen(1)
            assert ports.accepts_connections("127.0.0.1", reservation.port, 5.0)
            assert ports.listener_owned_by(os.getpid(), reservation.port) is True
    finally:
        reservation.release()
    assert not ports.accepts_connections("127.0.0.1", reservation.port, 5.0)
    assert ports.listener_owned_by(os.getpid(), reservation.port) is False


def test_a_port_with_a_listener_cannot_be_reserved() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        with pytest.raises(ports.PortUnavailable) as unavailable:
            ports.PortReservation.take("127.0.0.1", taken.getsockname()[1])
    assert unavailable.value.in_use


def test_stage_ids_are_opaque_and_stable() -> None:
    first = ports.stage_id_for("127.0.0.1", 50052)
    assert first == ports.stage_id_for("127.0.0.1", 50052)
    assert first != ports.stage_id_for("127.0.0.1", 50053)
    assert isinstance(first, LogicalId) and "50052" not in first and "127" not in first


def test_addresses_resolve_to_ipv4_and_wildcards_probe_loopback() -> None:
    assert ports.resolve_ipv4("localhost") == "127.0.0.1"
    assert ports.probe_address("0.0.0.0") == "127.0.0.1"
    assert ports.is_loopback("127.0.0.2") and not ports.is_loopback("0.0.0.0")


@pytest.mark.parametrize(
    ("options", "words"),
    [
        (StageOptions(host="0.0.0.0"), "--allow-remote"),
        (StageOptions(host="192.168.1.1"), "--allow-remote"),
        (StageOptions(host="::1"), "IPv4"),
        (StageOptions(port=65536), "--port"),
        (StageOptions(port=-1), "--port"),
        (StageOptions(threads=0), "--threads"),
        (StageOptions(memory_limit_mib=0), "--mem"),
    ],
)
def test_invalid_options_are_refused_as_invalid_configuration(
    options: StageOptions, words: str
) -> None:
    with pytest.raises(StageRefused) as refused:
        validate(options)
    assert refused.value.reason is ReasonCode.INVALID_CONFIGURATION
    assert words in refused.value.message


def test_allow_remote_accepts_a_wildcard() -> None:
    assert validate(StageOptions(host="0.0.0.0", allow_remote=True)) == "0.0.0.0"

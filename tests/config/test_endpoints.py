"""Stage endpoints: IPv4 HOST:PORT, at most GGML_RPC_MAX_SERVERS, no duplicates."""

from __future__ import annotations

import re

import pytest

from skippyctl.config.endpoints import (
    ENDPOINT_PATTERN,
    MAX_STAGES,
    Endpoint,
    EndpointError,
    parse_endpoint,
    parse_endpoints,
)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "localhost:50052",
        "127.0.0.1",
        "127.0.0.1:0",
        "127.0.0.1:65536",
        "::1:5",
        "1.2.3:4",
        "127.0.0.1:x",
    ],
)
def test_an_endpoint_that_is_not_ipv4_host_port_is_refused(text: str) -> None:
    with pytest.raises(EndpointError):
        parse_endpoint(text)


def test_endpoints_parse_and_refuse_duplicates_and_more_than_ggml_takes() -> None:
    assert parse_endpoints(["127.0.0.1:5", "10.0.0.2:50052"]) == (
        Endpoint("127.0.0.1", 5),
        Endpoint("10.0.0.2", 50052),
    )
    with pytest.raises(EndpointError, match="twice"):
        parse_endpoints(["127.0.0.1:5", "127.0.0.1:5"])
    with pytest.raises(EndpointError, match="at most 16"):
        parse_endpoints([f"127.0.0.1:{p}" for p in range(1, MAX_STAGES + 2)])


@pytest.mark.parametrize(
    "text",
    [
        "127.0.0.1:5",
        "10.0.0.2:50052",
        "255.255.255.255:65535",
        "0.0.0.0:1",
        "127.0.0.01:5",
        "256.0.0.1:5",
        "1.2.3.4:65536",
        "1.2.3.4:0",
        "1.2.3.4:05",
        "a.b.c.d:5",
    ],
)
def test_the_documented_pattern_accepts_exactly_what_the_parser_accepts(text: str) -> None:
    try:
        parse_endpoint(text)
        parsed = True
    except EndpointError:
        parsed = False
    assert bool(re.fullmatch(ENDPOINT_PATTERN, text)) == parsed

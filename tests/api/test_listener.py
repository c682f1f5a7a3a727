"""The API's listening socket: every accepted connection sends small writes at once.

Served the way uvicorn serves it (`loop.create_server(sock=…)`, which `runtime serve` hands the
bound socket to). With Nagle's algorithm on, a stream's first chunk waited for the client's
delayed ACK of the response headers (tens of ms of TTFT on every streamed request).
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from skippyctl.daemon.serve import bind_listener


async def _accepted_nodelay(host: str) -> int:
    listener = bind_listener(host, 0)
    accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    class Probe(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            sock = transport.get_extra_info("socket")
            accepted.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            transport.close()

    server = await asyncio.get_running_loop().create_server(Probe, sock=listener)
    try:
        port = listener.getsockname()[1]
        _, writer = await asyncio.open_connection(host, port)
        try:
            return await asyncio.wait_for(accepted, 10)
        finally:
            writer.close()
    finally:
        server.close()
        await server.wait_closed()


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_accepted_connections_have_nagle_off(host: str) -> None:
    if host == "::1" and not _has_ipv6_loopback():
        pytest.skip("no IPv6 loopback on this machine")
    assert asyncio.run(_accepted_nodelay(host)) != 0


def test_the_listener_is_tcp_and_listening() -> None:
    listener = bind_listener("127.0.0.1", 0)
    try:
        assert listener.proto == socket.IPPROTO_TCP
        assert listener.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
        assert listener.get_inheritable()
    finally:
        listener.close()

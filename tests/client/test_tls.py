"""The runtime's API over TLS (issue 30): `runtime serve|start --tls-cert PEM --tls-key PEM`
serve https only, advertise the certificate in the discovery file for local commands to verify
the runtime against, and refuse files that do not load before anything binds. Fleet entries
pin a node's certificate (its CA's or its own); a wrong one is `tls_verify_failed`.

Certificates come from a throwaway CA (trustme) for 127.0.0.1 and localhost; every runtime here
listens on loopback and is stopped by the test (or module) that started it."""

from __future__ import annotations

import os
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import trustme
from cryptography.hazmat.primitives import serialization

from skippyctl.client.discovery import DiscoveryProblem, parse_discovery
from skippyctl.client.fleet import instance_of, reason_of, remote_client
from skippyctl.client.http import RuntimeClient, RuntimeUnreachable
from skippyctl.client.launch import runtime_client
from skippyctl.config.fleet import FleetEntry
from tests.api.conftest import Server, start_server, stop_server
from tests.cli.conftest import stop_runtime
from tests.cli.helpers import CliResult, run_cli

KEY_ENV = "SKIPPY_TEST_TLS_NODE_KEY"


@dataclass(frozen=True)
class Pki:
    """PEM files: the CA, a server certificate for 127.0.0.1 and localhost and its key, another
    CA that signed nothing here, and a certificate that names localhost only."""

    ca: Path
    cert: Path
    key: Path
    other_ca: Path
    localhost_cert: Path
    localhost_key: Path
    directory: Path

    def trusting(self, cafile: Path) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(cafile))


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    ca, other = trustme.CA(), trustme.CA()
    ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    other.cert_pem.write_to_path(str(directory / "other-ca.pem"))
    for name, hosts in (("server", ("127.0.0.1", "localhost")), ("localhost", ("localhost",))):
        leaf = ca.issue_cert(*hosts)
        for index, pem in enumerate(leaf.cert_chain_pems):
            pem.write_to_path(str(directory / f"{name}.pem"), append=index > 0)
        leaf.private_key_pem.write_to_path(str(directory / f"{name}.key"))
    return Pki(
        ca=directory / "ca.pem",
        cert=directory / "server.pem",
        key=directory / "server.key",
        other_ca=directory / "other-ca.pem",
        localhost_cert=directory / "localhost.pem",
        localhost_key=directory / "localhost.key",
        directory=directory,
    )


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[Server]:
    """`runtime serve --tls-cert --tls-key` in the foreground (its own runtime directory)."""
    running = start_server(
        tmp_path_factory.mktemp("tls-runtime"),
        "--tls-cert",
        str(pki.cert),
        "--tls-key",
        str(pki.key),
    )
    try:
        yield running
    finally:
        stop_server(running)


@pytest.fixture
def runtime_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A runtime directory of the test's own for the CLI; any runtime left in it is stopped."""
    directory = tmp_path / "runtime"
    monkeypatch.setenv("SKIPPY_RUNTIME_DIR", str(directory))
    monkeypatch.setenv("SKIPPY_PORT", "0")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    yield directory
    stop_runtime(directory)


def _https(server: Server, verify: ssl.SSLContext) -> httpx.Client:
    return httpx.Client(
        base_url=server.url,
        headers=server.headers,
        verify=verify,
        timeout=60.0,
        trust_env=False,
    )


def _reason(result: CliResult) -> str:
    (record,) = (orjson.loads(line) for line in result.stdout.splitlines())
    reason: str = record["reason_code"]
    return reason


# -- a runtime served over TLS ---------------------------------------------------------------


def test_a_runtime_served_with_tls_answers_health_over_https(tls_server: Server, pki: Pki) -> None:
    assert tls_server.url.startswith("https://127.0.0.1:")
    # The discovery file names the certificate local clients verify the runtime against.
    assert tls_server.discovery.tls_cert == str(pki.cert)
    with _https(tls_server, pki.trusting(pki.ca)) as http:
        response = http.get("/health")
    assert response.status_code == 200
    assert response.json()["process_instance_id"] == tls_server.discovery.process_instance_id
    client = runtime_client(tls_server.discovery)  # pinned to the server's own certificate
    try:
        assert client.state()["record"] == "state"
    finally:
        client.close()


def test_ps_reaches_it_through_the_discovery_file(tls_server: Server) -> None:
    env = {"SKIPPY_RUNTIME_DIR": str(tls_server.directory)}
    result = run_cli("ps", "--json", env=env)
    assert result.code == 0, result.stderr
    assert orjson.loads(result.stdout)["record"] == "state"
    status = run_cli("runtime", "status", "--json", env=env)
    assert status.code == 0, status.stderr
    record = orjson.loads(status.stdout)
    assert record["url"] == tls_server.url and record["http_status"] == 200, record


def test_a_plain_http_client_cannot_talk_to_it(tls_server: Server) -> None:
    plain = tls_server.url.replace("https://", "http://")
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{plain}/health", headers=tls_server.headers, timeout=10.0, trust_env=False)
    client = RuntimeClient(replace(tls_server.discovery, url=plain, tls_cert=None), timeout_s=10)
    try:
        assert not client.reachable()
        with pytest.raises(RuntimeUnreachable):
            client.state()
    finally:
        client.close()


def test_a_client_pinned_to_another_certificate_fails_as_tls_verify_failed(
    tls_server: Server, pki: Pki
) -> None:
    for context in (pki.trusting(pki.other_ca), None):  # another CA; the system's store
        client = RuntimeClient(tls_server.discovery, timeout_s=10, ssl_context=context)
        try:
            assert not client.reachable()
            with pytest.raises(RuntimeUnreachable) as caught:
                client.health()
            assert reason_of(caught.value) == "tls_verify_failed"
            with pytest.raises(RuntimeUnreachable) as streamed:  # the event stream too
                next(iter(client.frames()))
            assert reason_of(streamed.value) == "tls_verify_failed"
        finally:
            client.close()
    entry = FleetEntry("wrong", tls_server.url, cert=pki.other_ca)
    with pytest.raises(RuntimeUnreachable) as caught:
        instance_of(remote_client(entry, timeout_s=10))
    assert reason_of(caught.value) == "tls_verify_failed"


@pytest.mark.parametrize("pinned", ["ca", "cert"])
def test_a_fleet_entry_pinning_its_ca_or_its_own_certificate_reaches_it(
    tls_server: Server, pki: Pki, monkeypatch: pytest.MonkeyPatch, pinned: str
) -> None:
    monkeypatch.setenv(KEY_ENV, tls_server.discovery.token)
    entry = FleetEntry("gpu1", tls_server.url, key_env=KEY_ENV, cert=getattr(pki, pinned))
    client = remote_client(entry, timeout_s=10)
    try:
        assert instance_of(client)[0] == tls_server.discovery.process_instance_id
        assert client.state()["record"] == "state"  # authenticated, with the entry's key
        first = next(iter(client.frames()))  # the live stream (httpx) verifies it the same way
        assert first.name == "runtime_state"
    finally:
        client.close()


def test_a_stream_over_tls_is_written_by_the_host_not_the_engine(
    tls_server: Server, pki: Pki, fixture_dir: Path
) -> None:
    """The engine writes a plain-text stream to the client's socket itself; a TLS connection's
    socket takes only TLS records, so such a stream stays on the host's path."""
    with _https(tls_server, pki.trusting(pki.ca)) as http:
        loaded = http.post(
            "/api/runtime/models/load", json={"model": str(fixture_dir / "tiny.gguf")}
        )
        assert loaded.status_code in (200, 202), loaded.text
        deadline = time.monotonic() + 60
        while http.get("/health").json()["models"].get("tiny") != "available":
            assert time.monotonic() < deadline, "tiny never became available"
            time.sleep(0.05)
        body: dict[str, Any] = {
            "model": "tiny",
            "prompt": "the quick brown",
            "max_tokens": 16,
            "temperature": 0,
            "logit_bias": {"2": -100, "1023": -100},  # tiny.gguf's end tokens
        }
        whole = http.post("/v1/completions", json=body).json()["choices"][0]["text"]
        with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
            assert response.status_code == 200
            request_id = response.headers["x-request-id"]
            lines = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
        assert lines[-1] == "[DONE]"
        text = "".join(orjson.loads(line)["choices"][0]["text"] for line in lines[:-1])
        assert text == whole
        receipt = http.get(f"/api/runtime/requests/{request_id}/receipt").json()
    assert receipt["written_by"] == "host"


# -- runtime start: every command reaches it; the key stays off argv ----------------------------


def test_runtime_start_with_tls_is_reached_by_every_command_and_keeps_the_key_off_argv(
    runtime_dir: Path, pki: Pki
) -> None:
    key = "s3cret-tls-test-key"
    tls = ("--tls-cert", str(pki.cert), "--tls-key", str(pki.key))
    started = run_cli("runtime", "start", "--api-key", key, *tls, "--json")
    assert started.code == 0, started.stderr
    status = orjson.loads(started.stdout)
    assert status["url"].startswith("https://127.0.0.1:") and status["http_status"] == 200, status
    written = orjson.loads((runtime_dir / "runtime.json").read_bytes())
    assert written["tls_cert"] == str(pki.cert)
    argv = Path(f"/proc/{status['pid']}/cmdline").read_bytes().split(b"\0")
    assert not any(key.encode() in arg for arg in argv)
    assert [b"--tls-cert", str(pki.cert).encode()] == argv[argv.index(b"--tls-cert") :][:2]
    assert [b"--tls-key", str(pki.key).encode()] == argv[argv.index(b"--tls-key") :][:2]
    ps = run_cli("ps", "--json")
    assert ps.code == 0, ps.stderr
    stopped = run_cli("runtime", "stop", "--json")
    assert stopped.code == 0, stopped.stderr
    assert orjson.loads(stopped.stdout)["via"] == "api"  # asked over https, not signalled


def test_a_certificate_that_does_not_name_the_address_is_refused_at_start(
    runtime_dir: Path, pki: Pki
) -> None:
    """No local command could verify it: `runtime start` says so at once and stops it."""
    tls = ("--tls-cert", str(pki.localhost_cert), "--tls-key", str(pki.localhost_key))
    result = run_cli("runtime", "start", "--host", "127.0.0.1", *tls, "--json")
    assert result.code == 3, result.stderr
    assert _reason(result) == "tls_verify_failed"
    assert "127.0.0.1" in orjson.loads(result.stdout)["message"]
    assert not (runtime_dir / "runtime.json").exists()  # stopped in order


def test_localhost_names_the_address_of_a_certificate_for_localhost(
    runtime_dir: Path, pki: Pki
) -> None:
    tls = ("--tls-cert", str(pki.localhost_cert), "--tls-key", str(pki.localhost_key))
    started = run_cli("runtime", "start", "--host", "localhost", *tls, "--json")
    assert started.code == 0, started.stderr
    assert orjson.loads(started.stdout)["url"].startswith("https://localhost:")


# -- refusals before anything binds -----------------------------------------------------------


@pytest.mark.parametrize("given", ["--tls-cert", "--tls-key"])
def test_one_file_without_the_other_is_tls_incomplete(
    runtime_dir: Path, pki: Pki, given: str
) -> None:
    path = str(pki.cert if given == "--tls-cert" else pki.key)
    served = run_cli("runtime", "serve", given, path)
    assert served.code == 10, served.stderr
    assert "tls_incomplete" in served.stderr and "Traceback" not in served.stderr
    started = run_cli("runtime", "start", given, path, "--json")
    assert started.code == 10, started.stderr
    assert _reason(started) == "tls_incomplete"
    assert not (runtime_dir / "runtime.json").exists()


def _encrypted(key: Path, into: Path) -> Path:
    private = serialization.load_pem_private_key(key.read_bytes(), password=None)
    into.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"pass phrase"),
        )
    )
    return into


@pytest.mark.parametrize(
    "problem", ["not_pem", "missing", "other_key", "key_as_cert", "encrypted_key"]
)
def test_files_that_do_not_load_are_tls_config_invalid(
    runtime_dir: Path, pki: Pki, tmp_path: Path, problem: str
) -> None:
    cert, key = pki.cert, pki.key
    if problem == "not_pem":
        cert = tmp_path / "garbage.pem"
        cert.write_text("not a certificate\n")
    elif problem == "missing":
        key = tmp_path / "absent.key"
    elif problem == "other_key":
        key = pki.localhost_key
    elif problem == "key_as_cert":
        cert = pki.key
    else:
        key = _encrypted(pki.key, tmp_path / "encrypted.key")
    tls = ("--tls-cert", str(cert), "--tls-key", str(key))
    served = run_cli("runtime", "serve", *tls)
    assert served.code == 10, served.stderr
    assert "tls_config_invalid" in served.stderr and "Traceback" not in served.stderr
    assert str(tmp_path) not in served.stderr and str(pki.directory) not in served.stderr
    started = run_cli("runtime", "start", *tls, "--json")
    assert started.code == 10, started.stderr
    assert _reason(started) == "tls_config_invalid"
    message = orjson.loads(started.stdout)["message"]
    assert str(tmp_path) not in message and str(pki.directory) not in message
    assert not (runtime_dir / "runtime.json").exists()


def test_a_non_loopback_host_still_needs_allow_remote_with_tls(runtime_dir: Path, pki: Pki) -> None:
    tls = ("--tls-cert", str(pki.cert), "--tls-key", str(pki.key))
    result = run_cli("runtime", "serve", "--host", "0.0.0.0", *tls)
    assert result.code == 10, result.stderr
    assert "remote_not_allowed" in result.stderr and "--allow-remote" in result.stderr
    assert not (runtime_dir / "runtime.json").exists()


# -- the discovery file -------------------------------------------------------------------------

FIELDS: dict[str, Any] = {
    "pid": os.getpid(),
    "url": "https://127.0.0.1:8750",
    "token": "t0ken",
    "version": "0",
    "process_instance_id": "x",
    "started_at": "then",
    "schema_version": 1,
}


def test_the_discovery_file_names_the_certificate_and_older_files_still_read() -> None:
    assert parse_discovery(orjson.dumps(FIELDS)).tls_cert is None  # a file of an older version
    named = parse_discovery(orjson.dumps({**FIELDS, "tls_cert": "/etc/skippy/cert.pem"}))
    assert named.tls_cert == "/etc/skippy/cert.pem"
    for wrong in ("cert.pem", "", 7):
        with pytest.raises(DiscoveryProblem) as caught:
            parse_discovery(orjson.dumps({**FIELDS, "tls_cert": wrong}))
        assert caught.value.reason == "corrupt"


def test_a_certificate_the_discovery_names_that_is_gone_is_unreachable(tmp_path: Path) -> None:
    discovery = parse_discovery(
        orjson.dumps({**FIELDS, "tls_cert": str(tmp_path / "gone" / "cert.pem")})
    )
    with pytest.raises(RuntimeUnreachable) as caught:
        runtime_client(discovery)
    assert "cert.pem" in str(caught.value) and str(tmp_path) not in str(caught.value)

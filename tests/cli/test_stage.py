"""`skippyctl stage serve`: real ggml RPC servers on loopback, every process cleaned up."""

from __future__ import annotations

import os
import signal
import socket

import pytest

from skippyctl.stages.ports import listener_owned_by
from tests.cli.helpers import run_cli
from tests.stages.helpers import free_port, stage_process, wait_gone

SERVE = ("--threads", "1", "--json")


def _no_path_or_pointer(records: list[dict[str, object]]) -> None:
    for record in records:
        text = str(record)
        assert "/" not in text and "0x" not in text, record


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_port_0_reports_the_real_port_when_ready_and_a_signal_stops_it_cleanly(
    signum: signal.Signals,
) -> None:
    with stage_process("--port", "0", *SERVE) as stage:
        before = stage.until("stage_ready")
        assert [r["event"] for r in before] == ["stage_starting", "stage_ready"]
        starting, ready = before
        port = ready["summaries"]["port"]
        assert port > 0 and starting["summaries"]["port"] == port
        assert starting["stage_id"] == ready["stage_id"]
        assert ready["device_id"] == "CPU" and ready["summaries"]["threads"] == 1
        assert ready["summary"].startswith(f"stage ready on port {port} (CPU, 1 threads")
        [worker] = stage.worker_pids
        assert listener_owned_by(worker, port) is True
        with socket.create_connection(("127.0.0.1", port), timeout=10):
            pass

        stage.process.send_signal(signum)
        after = stage.rest()
        assert stage.wait() == 0
        assert [r["event"] for r in after] == ["stage_stopping", "stage_stopped"]
        assert after[-1]["outcome"] == "success"
        assert all(r["stage_id"] == ready["stage_id"] for r in after)
        assert wait_gone(worker)
        _no_path_or_pointer(before + after)
        with socket.socket() as sock:  # the port is free again: nothing kept it
            sock.bind(("127.0.0.1", port))


@pytest.mark.parametrize("host", ["0.0.0.0", "10.255.255.1"])
def test_a_non_loopback_host_is_refused_before_anything_binds(host: str) -> None:
    # 10.255.255.1 is not an address of this machine: had the command tried to bind it, it
    # would have failed with resource_allocation_failure (17), not invalid_configuration (10).
    result = run_cli("stage", "serve", "--host", host, "--port", str(free_port()), *SERVE)
    assert result.code == 10, result.stderr
    [record] = result.records()
    assert record["record"] == "error" and record["reason_code"] == "invalid_configuration"
    assert "--allow-remote" in record["message"]
    assert "stage_starting" not in result.stdout


def test_allow_remote_lets_it_try_the_address() -> None:
    result = run_cli("stage", "serve", "--host", "10.255.255.1", "--allow-remote", *SERVE)
    assert result.code == 17, result.stderr
    assert [r["event"] for r in result.records()] == ["stage_failed"]
    assert result.records()[0]["reason_code"] == "resource_allocation_failure"
    assert "Security" in result.stderr


def test_a_port_in_use_is_stage_failed_with_a_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = run_cli("stage", "serve", "--port", str(port), *SERVE)
    assert result.code == 17, result.stderr
    [failed] = result.records()
    assert failed["event"] == "stage_failed"
    assert failed["reason_code"] == "resource_allocation_failure"
    assert failed["summaries"]["port"] == port
    assert f"port {port} on 127.0.0.1 is in use" in result.stderr


def test_a_worker_that_dies_is_stage_failed_process_crash() -> None:
    with stage_process("--port", "0", *SERVE) as stage:
        stage.until("stage_ready")
        [worker] = stage.worker_pids
        os.kill(worker, signal.SIGKILL)
        [failed] = stage.rest()
        assert stage.wait() == 21
        assert failed["event"] == "stage_failed"
        assert failed["reason_code"] == "process_crash"
        assert failed["summaries"]["exit_signal"] == signal.SIGKILL


def test_the_worker_dies_with_its_supervisor() -> None:
    with stage_process("--port", "0", *SERVE) as stage:
        stage.until("stage_ready")
        [worker] = stage.worker_pids
        stage.process.kill()  # no chance to clean up: PR_SET_PDEATHSIG must end the worker
        stage.wait()
        assert wait_gone(worker)


def test_mem_is_reported_and_more_than_the_device_has_is_refused() -> None:
    with stage_process("--port", "0", "--mem", "64", *SERVE) as stage:
        records = stage.until("stage_ready")
        assert all(r["summaries"]["memory_limit_bytes"] == 64 * 2**20 for r in records)
        stage.process.send_signal(signal.SIGTERM)
        stage.rest()
        assert stage.wait() == 0
    result = run_cli("stage", "serve", "--port", "0", "--mem", str(2**40), *SERVE)
    assert result.code == 10, result.stderr
    assert [r["event"] for r in result.records()] == ["stage_starting", "stage_failed"]
    assert result.records()[-1]["reason_code"] == "invalid_configuration"
    assert "reports free" in result.stderr


def test_without_json_people_get_stderr_and_stdout_gets_the_endpoint() -> None:
    with stage_process("--port", "0", "--threads", "1") as stage:
        assert stage.process.stdout is not None
        line = stage.lines.get(timeout=120)
        assert line is not None
        host, _, port = line.decode().strip().partition(":")
        assert host == "127.0.0.1" and int(port) > 0
        stage.process.send_signal(signal.SIGINT)
        assert stage.wait() == 0
        assert stage.lines.get(timeout=120) is None  # nothing else on stdout
        assert stage.process.stderr is not None
        err = stage.process.stderr.read().decode()
        assert "stage ready at 127.0.0.1:" in err and "stage stopped" in err


def test_help_warns_that_a_stage_runs_any_graph_and_shows_an_example() -> None:
    result = run_cli("stage", "serve", "--help")
    assert result.code == 0
    text = " ".join(result.stdout.split())
    assert "runs whatever graph any client that connects sends it" in text
    assert "--allow-remote" in text and "Example" in text


def test_the_stage_reports_its_client_connecting_going_and_coming_back() -> None:
    """The upstream connection as the stage sees it (from /proc, never ggml's output): a client
    that stays is established, its close is lost, the next one is recovered; a client gone
    before the settle time (a probe) is not reported."""
    with stage_process("--port", "0", *SERVE) as stage:
        port = stage.until("stage_ready")[-1]["summaries"]["port"]
        with socket.create_connection(("127.0.0.1", port), timeout=10):
            pass  # a probe's worth: connect and leave at once
        with socket.create_connection(("127.0.0.1", port), timeout=10):
            established = stage.next_record()
        lost = stage.next_record()
        with socket.create_connection(("127.0.0.1", port), timeout=10):
            recovered = stage.next_record()
        assert stage.next_record()["event"] == "upstream_connection_lost"
        stage.process.send_signal(signal.SIGTERM)
        rest = stage.rest()
        assert stage.wait() == 0
    assert [r["event"] for r in (established, lost, recovered)] == [
        "upstream_connection_established",
        "upstream_connection_lost",
        "upstream_connection_recovered",
    ]
    assert [r["outcome"] for r in (established, lost, recovered)] == [
        "success",
        "failure",
        "success",
    ]
    assert {r["stage_id"] for r in (established, lost, recovered)} == {rest[0]["stage_id"]}
    assert [r["event"] for r in rest] == ["stage_stopping", "stage_stopped"]
    _no_path_or_pointer([established, lost, recovered, *rest])
